"""Memory while serving, measured like a user's ComfyUI: a real ComfyUI server (tools/comfy_server.py), one prompt
that loads the transformer and runs one sampling step, peak resident memory of the server process over its idle
level, sampled from outside through /proc/PID/status (VmRSS = RssAnon + RssFile + RssShmem).

Methods, each in a fresh server (its own process, so its peak is its own):
  prequant  this pack's loader on the pre-quantized int8 file (`.pt`, diffusers keys: q/k/v fused into qkv at load)
  prequant-fp8  this pack's loader on the fp8 `.safetensors` of the same weights (weight-only matmul on a CPU: each
           layer decoded a block of rows at a time, prequant_core/schemes/cpu_weight_only.py)
  unet      ComfyUI's own "Load Diffusion Model" (UNETLoader) on the dense bf16 file of the same weights
  unet-fp8  ComfyUI's own "Load Diffusion Model" with weight_dtype fp8_e4m3fn on that dense file
Model: a real-width Z-Image (dim 3840, 30 heads), --layers main layers + 2+2 refiners, random weights made here.
The conditioning comes from a bench-only custom node (random text features of Z-Image's width, 2560) so that no
text encoder is loaded; the graph ends in SaveLatent. Ratios are to the model file's bytes.

    .venv/bin/python bench/bench_serving.py [--layers 1] [--latent 16] [--methods prequant,unet,unet-fp8] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

COND_NODE = '''
import torch


class BenchRandomConditioning:
    """Bench-only: random text features of a given width, in ComfyUI's CONDITIONING form."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"tokens": ("INT", {"default": 32}), "width": ("INT", {"default": 2560})}}
    RETURN_TYPES = ("CONDITIONING",)
    FUNCTION = "make"
    CATEGORY = "bench"

    def make(self, tokens, width):
        g = torch.Generator().manual_seed(1)
        return ([[torch.randn(1, tokens, width, generator=g), {}]],)


NODE_CLASS_MAPPINGS = {"BenchRandomConditioning": BenchRandomConditioning}
'''

FIELDS = ("VmRSS", "RssAnon", "RssFile", "RssShmem")


def status_kib(pid: int) -> dict:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in FIELDS:
                out[k] = int(v.split()[0])
    return out


class OutsidePeak:
    """Peak of VmRSS (and the anonymous / file-backed split at that moment) of another process."""

    def __init__(self, pid: int, interval_s: float = 0.005):
        self.pid = pid
        self.idle = status_kib(pid)
        self.peak = dict(self.idle)
        self.peak_anon = self.idle["RssAnon"]
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                s = status_kib(self.pid)
            except OSError:
                return
            if s["VmRSS"] > self.peak["VmRSS"]:
                self.peak = s
            self.peak_anon = max(self.peak_anon, s["RssAnon"])
            self._stop.wait(0.005)

    def stop(self) -> dict:
        self._stop.set()
        self._t.join()
        mib = lambda kib: kib / 1024  # noqa: E731
        return {"added_mib": mib(self.peak["VmRSS"] - self.idle["VmRSS"]),
                "anon_mib": mib(self.peak["RssAnon"] - self.idle["RssAnon"]),
                "file_mib": mib(self.peak["RssFile"] + self.peak["RssShmem"] - self.idle["RssFile"] - self.idle["RssShmem"]),
                "peak_anon_mib": mib(self.peak_anon - self.idle["RssAnon"]),
                "idle_mib": mib(self.idle["VmRSS"])}


def append_results(path: str, title: str, script: str, what: str, table: str) -> None:
    """A dated section of RESULTS-cpu.md: the machine, what was measured, the table."""
    import platform
    import torch
    import torchao
    with open(path, "a") as fh:
        fh.write(f"\n## {title} ({time.strftime('%Y-%m-%d')}, {script})\n\nMachine: {platform.machine()}, "
                 f"{os.cpu_count()} cores (shared); torch {torch.__version__}, torchao {torchao.__version__}; a real "
                 f"ComfyUI server; {what}\n\n{table}\n")


def make_files(base: str, layers: int) -> dict:
    """The dense bf16 ComfyUI-layout file (what UNETLoader detects) and the int8 `.pt` built from the same weights."""
    import bench_load
    from tools import comfy_headless
    comfy_headless.boot()
    import torch
    from prequant_core import builder, families
    folder = os.path.join(base, "models")
    files = bench_load.make_files(folder, layers, [])  # dense only; the .pt is built below from the same tensors
    from safetensors.torch import load_file
    import comfy.utils
    from tools.tiny_models import comfy_to_diffusers
    fam = families.get("z-image")
    comfy_sd = load_file(files["dense"])
    cfg = fam.config_from_shapes({k: tuple(v.shape) for k, v in comfy_sd.items()})
    dense = comfy_to_diffusers(comfy_sd, comfy.utils.z_image_to_diffusers(cfg))
    del comfy_sd
    os.makedirs(os.path.join(folder, "prequant"), exist_ok=True)
    files["int8"] = os.path.join(folder, "prequant", "Z-Image-Turbo-INT8.pt")
    builder.build_from_tensors(dense, builder.Target(files["int8"], container="pt"),
                               builder.Recipe("int8", family=fam, base_model_id="Tongyi-MAI/Z-Image-Turbo"))
    files["fp8"] = os.path.join(folder, "prequant", "Z-Image-Turbo-FP8.safetensors")
    builder.build_from_tensors(dense, builder.Target(files["fp8"], container="safetensors"),
                               builder.Recipe("fp8", family=fam, base_model_id="Tongyi-MAI/Z-Image-Turbo"))
    del dense
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return files


PREQUANT = {"prequant": "int8", "prequant-fp8": "fp8"}  # method -> the file (scheme) it loads


def graph(method: str, files: dict, latent: int) -> dict:
    if method in PREQUANT:
        scheme = PREQUANT[method]
        loader = {"class_type": "PrequantLoadTransformer",
                  "inputs": {"checkpoint": os.path.basename(files[scheme]), "scheme": scheme}}
    else:
        loader = {"class_type": "UNETLoader", "inputs": {"unet_name": os.path.basename(files["dense"]),
                  "weight_dtype": "fp8_e4m3fn" if method == "unet-fp8" else "default"}}
    return {
        "1": loader,
        "2": {"class_type": "BenchRandomConditioning", "inputs": {"tokens": 32, "width": 2560}},
        "3": {"class_type": "EmptySD3LatentImage", "inputs": {"width": latent * 8, "height": latent * 8, "batch_size": 1}},
        "4": {"class_type": "KSampler", "inputs": {"model": ["1", 0], "positive": ["2", 0], "negative": ["2", 0],
                                                    "latent_image": ["3", 0], "seed": 0, "steps": 1, "cfg": 1.0,
                                                    "sampler_name": "euler", "scheduler": "simple", "denoise": 1.0}},
        "5": {"class_type": "SaveLatent", "inputs": {"samples": ["4", 0], "filename_prefix": f"bench_{method}"}},
    }


def run_one(method: str, base: str, files: dict, latent: int) -> dict:
    from bench_load import drop_file_cache
    from tools.comfy_server import ComfyServer, execution_error
    with ComfyServer(base) as srv:
        time.sleep(3)  # idle: start-up work (node imports, the front end's routes) settles
        drop_file_cache(*files.values())
        meter = OutsidePeak(srv.proc.pid)
        t = time.perf_counter()
        entry = srv.run(graph(method, files, latent), timeout=1800)
        wall = time.perf_counter() - t
        res = meter.stop()
        err = execution_error(entry)
        if err:
            raise RuntimeError(f"{method}: {err}\n{srv.log_tail()}")
        res["prompt_s"] = wall
    outs = [os.path.join(base, "output", n) for n in os.listdir(os.path.join(base, "output"))
            if n.startswith(f"bench_{method}_")]
    res["latent_file"] = sorted(outs)[-1] if outs else None
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--latent", type=int, default=16)
    ap.add_argument("--methods", default="prequant,unet,unet-fp8")
    ap.add_argument("--out", default=None, help="append the table (markdown) to this file")
    ap.add_argument("--keep", default=None, help="reuse / keep the generated files in this folder")
    ap.add_argument("--json", default=None, help="write the measurements to this JSON file (bench/chart.py draws "
                                                 "bench/results/serving-cpu.json)")
    args = ap.parse_args()
    base = args.keep or tempfile.mkdtemp(prefix="prequant-serving-")
    try:
        files = {"dense": os.path.join(base, "models", "diffusion_models", "zimage_dense_bf16.safetensors"),
                 "int8": os.path.join(base, "models", "prequant", "Z-Image-Turbo-INT8.pt"),
                 "fp8": os.path.join(base, "models", "prequant", "Z-Image-Turbo-FP8.safetensors")}
        if not all(os.path.isfile(f) for f in files.values()):
            t = time.time()
            files = make_files(base, args.layers)
            print(f"files made in {time.time() - t:.0f}s", flush=True)
        cn = os.path.join(base, "custom_nodes")
        os.makedirs(cn, exist_ok=True)
        with open(os.path.join(cn, "bench_conditioning.py"), "w") as f:
            f.write(COND_NODE)
        sizes = {k: os.path.getsize(v) / 2**20 for k, v in files.items()}
        print("files: " + ", ".join(f"{k} {v:.0f} MiB" for k, v in sizes.items()), flush=True)
        res = {}
        for m in args.methods.split(","):
            res[m] = run_one(m, base, files, args.latent)
            print(f"{m}: {json.dumps(res[m])}", flush=True)
        names = {"prequant": ("this pack's loader, int8 `.pt`", "int8"),
                 "prequant-fp8": ("this pack's loader, fp8 `.safetensors` (weight-only matmul)", "fp8"),
                 "unet": ("ComfyUI's UNETLoader, dense bf16 file", "dense"),
                 "unet-fp8": ("ComfyUI's UNETLoader, weight_dtype fp8_e4m3fn", "dense")}
        lines = ["| method | file MiB | added peak RSS MiB | / file bytes | anonymous MiB | file-backed MiB | "
                 "prompt s |", "|---|---|---|---|---|---|---|"]
        for m, r in res.items():
            label, f = names[m]
            lines.append(f"| {label} | {sizes[f]:.0f} | {r['added_mib']:.0f} | {r['added_mib'] / sizes[f]:.2f} | "
                         f"{r['anon_mib']:.0f} | {r['file_mib']:.0f} | {r['prompt_s']:.1f} |")
        if "prequant" in res and "unet" in res and res["prequant"]["latent_file"] and res["unet"]["latent_file"]:
            import torch
            from safetensors.torch import load_file
            a = load_file(res["prequant"]["latent_file"])["latent_tensor"].float()
            d = load_file(res["unet"]["latent_file"])["latent_tensor"].float()
            lines += ["", f"- one-step latent, prequant int8 vs dense: rel err {((a - d).norm() / d.norm()).item():.4f}"]
        table = "\n".join(lines)
        print(table)
        if args.json:
            import platform
            import torch
            with open(args.json, "w") as fh:
                json.dump({"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} CPU "
                           f"cores, no GPU; torch {torch.__version__}; ComfyUI 0.3.75 server; real-width Z-Image, "
                           f"{args.layers} layer + 2+2 refiners, one euler step at {args.latent}x{args.latent}",
                           "methods": [{"label": names[m][0], "file_mib": sizes[names[m][1]],
                                        "added_peak_mib": r["added_mib"], "prompt_s": r["prompt_s"]}
                                       for m, r in res.items()]}, fh, indent=1)
        if args.out:
            append_results(args.out, "Memory while serving", "bench/bench_serving.py",
                           f"real-width Z-Image, {args.layers} layer(s) + 2+2 refiners; latent {args.latent}x"
                           f"{args.latent}, one euler step. Peak VmRSS of the server over its idle level, sampled "
                           f"every 5 ms from outside (/proc/PID/status); anonymous / file-backed: RssAnon / "
                           f"RssFile+RssShmem at that peak, over idle.", table)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
