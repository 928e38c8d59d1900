"""A LoRA on a pre-quantized model, measured like a user's ComfyUI (issue 38): a real ComfyUI server
(tools/comfy_server.py), stock LoraLoaderModelOnly, peak resident memory of the server process over its idle level
sampled from outside (bench_serving.OutsidePeak).

Per method, in a fresh server, four prompts in a row (seed and graph fixed):
  1. load + one step, no LoRA         -> the serving peak
  2. one step, no LoRA (warm)         -> a warm step
  3. one step with the LoRA (first)   -> patch time = this prompt's wall - a warm step; peak with LoRA
  4. one step with the LoRA (again)   -> a warm step with the LoRA (patched weights: nothing per step)
Methods: prequant (this pack, the int8 `.pt`), unet (ComfyUI's UNETLoader on the dense bf16 file of the same
weights), prequant-lowvram (this pack's model loaded the way ComfyUI's low-VRAM mode loads a model that does not fit:
every Linear streamed, a LoRA applied per call through ``weight_function``; a bench-only node caps the memory ComfyUI
may load into, since on a CPU ComfyUI never loads partially by itself; the patch-time column is then the cost the
LoRA adds to a step). Model: a real-width Z-Image (dim 3840, 30 heads), --layers main layers + 2+2 refiners; the
LoRA: rank --rank on every attention and feed-forward Linear of every layer and refiner (qkv, out, w1, w2, w3), as
ComfyUI's own key names (``diffusion_model.<module>.lora_up / lora_down / alpha``). Ratios are to the model file's bytes and
to the dense method in the same run.

    .venv/bin/python bench/bench_lora.py [--layers 1] [--rank 32] [--latent 16] [--methods prequant,unet,prequant-lowvram]
                                         [--out F] [--keep DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import bench_serving as bs  # noqa: E402

LORA_NAME = "bench_rank_lora.safetensors"
TARGETS = (".attention.qkv.weight", ".attention.out.weight", ".feed_forward.w1.weight", ".feed_forward.w2.weight",
           ".feed_forward.w3.weight")


def make_lora(dense_file: str, dest: str, rank: int) -> int:
    """A rank-``rank`` LoRA on every attention / feed-forward Linear of the dense file, ComfyUI's key names."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(7)
    out = {}
    with safe_open(dense_file, "pt") as f:
        for k in f.keys():
            if not k.endswith(TARGETS):
                continue
            n, m = f.get_slice(k).get_shape()
            base = "diffusion_model." + k[: -len(".weight")]
            out[base + ".lora_up.weight"] = (torch.randn(n, rank, generator=g) * 0.02).to(torch.bfloat16)
            out[base + ".lora_down.weight"] = (torch.randn(rank, m, generator=g) / m ** 0.5).to(torch.bfloat16)
            out[base + ".alpha"] = torch.tensor(float(rank))
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    save_file(out, dest)
    return len(out) // 3


def largest_layer_mib(dense_file: str) -> float:
    """The float32 size of the largest Linear weight the LoRA patches (the dense file has ComfyUI's keys: the fused
    qkv, 11520 x 3840)."""
    from safetensors import safe_open
    with safe_open(dense_file, "pt") as f:
        shapes = [f.get_slice(k).get_shape() for k in f.keys() if k.endswith(TARGETS)]
    return max(n * m for n, m in shapes) * 4 / 2**20


LOWVRAM_NODE = '''
class BenchLowVram:
    """Bench-only: the model as ComfyUI loads it when the device has no room for it (low-VRAM mode): each Linear
    streamed per call, a LoRA applied per call (weight_function) instead of merged."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",)}}
    RETURN_TYPES = ("MODEL",)
    FUNCTION = "go"
    CATEGORY = "bench"

    def go(self, model):
        m = model.clone()
        load = m.partially_load

        def no_room(device_to, extra_memory=0, force_patch_weights=False):
            return load(device_to, 1, force_patch_weights=force_patch_weights)
        m.partially_load = no_room
        return (m,)


NODE_CLASS_MAPPINGS = {"BenchLowVram": BenchLowVram}
'''


def graph(method: str, files: dict, latent: int, lora: bool, tag: str, seed: int) -> dict:
    lowvram = method.endswith("-lowvram")
    g = bs.graph(method.removesuffix("-lowvram"), files, latent)
    g["5"]["inputs"]["filename_prefix"] = f"bench_{method}_{tag}"
    g["4"]["inputs"]["seed"] = seed  # a new seed each prompt: ComfyUI re-runs the sampler instead of its cached result
    if lora:
        g["6"] = {"class_type": "LoraLoaderModelOnly", "inputs": {"model": ["1", 0], "lora_name": LORA_NAME,
                                                                  "strength_model": 1.0}}
        g["4"]["inputs"]["model"] = ["6", 0]
    if lowvram:
        g["7"] = {"class_type": "BenchLowVram", "inputs": {"model": g["4"]["inputs"]["model"]}}
        g["4"]["inputs"]["model"] = ["7", 0]
    return g


def run_one(method: str, base: str, files: dict, latent: int) -> dict:
    from bench_load import drop_file_cache
    from tools.comfy_server import ComfyServer, execution_error
    res = {}
    with ComfyServer(base) as srv:
        time.sleep(3)
        drop_file_cache(files["int8"], files["dense"])
        for i, (name, lora) in enumerate((("serve", False), ("warm", False), ("lora", True), ("lora_warm", True))):
            meter = bs.OutsidePeak(srv.proc.pid)
            if i == 0:
                idle = meter.idle
            else:  # every peak over the server's idle level before the first prompt
                meter.idle = idle
            t = time.perf_counter()
            entry = srv.run(graph(method, files, latent, lora, name, seed=i), timeout=1800)
            wall = time.perf_counter() - t
            peak = meter.stop()
            err = execution_error(entry)
            if err:
                raise RuntimeError(f"{method}/{name}: {err}\n{srv.log_tail()}")
            res[name] = {"s": wall, "peak_mib": peak["added_mib"], "anon_mib": peak["anon_mib"]}
    out_dir = os.path.join(base, "output")
    outs = [os.path.join(out_dir, n) for n in os.listdir(out_dir)
            if n.startswith(f"bench_{method}_lora_") and not n.startswith(f"bench_{method}_lora_warm_")]
    # this run's file: with --keep, earlier runs' files are in the same folder
    res["latent_file"] = max(outs, key=os.path.getmtime) if outs else None
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--latent", type=int, default=16)
    ap.add_argument("--methods", default="prequant,unet,prequant-lowvram")
    ap.add_argument("--out", default=None, help="append the table (markdown) to this file")
    ap.add_argument("--keep", default=None, help="reuse / keep the generated files in this folder")
    args = ap.parse_args()
    base = args.keep or tempfile.mkdtemp(prefix="prequant-lora-")
    try:
        files = {"dense": os.path.join(base, "models", "diffusion_models", "zimage_dense_bf16.safetensors"),
                 "int8": os.path.join(base, "models", "prequant", "Z-Image-Turbo-INT8.pt")}
        if not all(os.path.isfile(f) for f in files.values()):
            files = bs.make_files(base, args.layers)
        lora_path = os.path.join(base, "models", "loras", LORA_NAME)
        n_lora = make_lora(files["dense"], lora_path, args.rank)
        cn = os.path.join(base, "custom_nodes")
        os.makedirs(cn, exist_ok=True)
        with open(os.path.join(cn, "bench_conditioning.py"), "w") as f:
            f.write(bs.COND_NODE)
        with open(os.path.join(cn, "bench_lowvram.py"), "w") as f:
            f.write(LOWVRAM_NODE)
        sizes = {k: os.path.getsize(v) / 2**20 for k, v in files.items()}
        print(f"files: dense {sizes['dense']:.0f} MiB, int8 {sizes['int8']:.0f} MiB; LoRA rank {args.rank} on "
              f"{n_lora} Linears ({os.path.getsize(lora_path) / 2**20:.0f} MiB)", flush=True)
        res = {}
        for m in args.methods.split(","):
            res[m] = run_one(m, base, files, args.latent)
            print(f"{m}: {json.dumps(res[m])}", flush=True)
        label = {"prequant": ("this pack, int8 `.pt`", "int8"), "unet": ("ComfyUI dense bf16 (UNETLoader)", "dense"),
                 "prequant-lowvram": ("this pack, int8 `.pt`, low-VRAM load (LoRA per call)", "int8")}
        lines = ["| loader | file MiB | peak RSS added, load + 1 step MiB | / file | warm step s | LoRA patch s | "
                 "step with LoRA s | peak with LoRA MiB | peak with LoRA - serving peak MiB |",
                 "|---|---|---|---|---|---|---|---|---|"]
        for m, r in res.items():
            name, f = label[m]
            patch = r["lora"]["s"] - r["warm"]["s"]
            lines.append(f"| {name} | {sizes[f]:.0f} | {r['serve']['peak_mib']:.0f} | "
                         f"{r['serve']['peak_mib'] / sizes[f]:.2f} | {r['warm']['s']:.2f} | {patch:.1f} | "
                         f"{r['lora_warm']['s']:.2f} | {r['lora']['peak_mib']:.0f} | "
                         f"{r['lora']['peak_mib'] - r['serve']['peak_mib']:.0f} |")
        largest = largest_layer_mib(files["dense"])
        if "prequant" in res:
            p = res["prequant"]
            over = p["lora"]["peak_mib"] - p["serve"]["peak_mib"]
            lines += ["", f"- this pack: peak with LoRA - serving peak = {over:.0f} MiB, the largest layer's float32 copy "
                      f"{largest:.0f} MiB: {over / largest:.2f}x (issue 38's goal: <= 1x)"]
        if "prequant" in res and "prequant-lowvram" in res:
            p, lv = res["prequant"], res["prequant-lowvram"]
            lines.append(f"- low-VRAM load, LoRA per call: step with LoRA / merged LoRA step = "
                         f"{lv['lora_warm']['s'] / p['lora_warm']['s']:.2f}x; peak with LoRA "
                         f"{lv['lora']['peak_mib']:.0f} MiB vs merged {p['lora']['peak_mib']:.0f} MiB")
            if p["latent_file"] and lv["latent_file"]:
                import torch
                from safetensors.torch import load_file
                a = load_file(lv["latent_file"])["latent_tensor"].float()
                b = load_file(p["latent_file"])["latent_tensor"].float()
                lines.append(f"- one-step latent with the LoRA, low-VRAM (patched per call) vs merged: equal "
                             f"(torch.equal): {torch.equal(a, b)}, rel err {((a - b).norm() / b.norm()).item():.4f}")
        if "prequant" in res and "unet" in res:
            p, d = res["prequant"], res["unet"]
            lines += ["", f"- LoRA patch time, this pack / dense: {(p['lora']['s'] - p['warm']['s']) / (d['lora']['s'] - d['warm']['s']):.2f}x"]
            if p["latent_file"] and d["latent_file"]:
                from safetensors.torch import load_file
                a = load_file(p["latent_file"])["latent_tensor"].float()
                b = load_file(d["latent_file"])["latent_tensor"].float()
                lines.append(f"- one-step latent with the LoRA, this pack vs dense: rel err "
                             f"{((a - b).norm() / b.norm()).item():.4f}")
        table = "\n".join(lines)
        print(table)
        if args.out:
            bs.append_results(args.out, "LoRA on a pre-quantized model", "bench/bench_lora.py",
                              f"real-width Z-Image, {args.layers} layer(s) + 2+2 refiners; a rank-{args.rank} LoRA on "
                              f"every attention and feed-forward Linear ({n_lora}) through stock LoraLoaderModelOnly; "
                              f"latent {args.latent}x{args.latent}, one euler step per prompt. Peak VmRSS of the "
                              f"server over its idle level (before the first prompt), sampled every 5 ms from outside; "
                              f"patch time = the first LoRA prompt's wall time - a warm step's.", table)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
