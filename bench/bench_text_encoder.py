"""Text-encoder load benchmark: Load Prequant Text Encoder against ComfyUI's CLIPLoader, side by side in one run.

Methods (each in its own fresh ComfyUI process, so peak RSS is its own):
  pack         Load Prequant Text Encoder on Unsloth's pre-cast file (tests/unsloth_te_builder.py writes it)
  comfy-fp8    CLIPLoader on ComfyUI's layout of the same cast weights (float8 Linears, bf16 rest)
  comfy-dense  CLIPLoader on the dense bf16 encoder
Encoder: a full-size Gemma2-2B (Lumina Image 2.0's; or --encoder qwen3-4b, Z-Image's), deterministic stand-in values. Figures: peak RSS growth over
the booted process during load + one encode, load time, encode time, and whether the conditioning equals
comfy-fp8's (``torch.equal``).

    .venv/bin/python bench/bench_text_encoder.py [--encoder gemma2-2b|qwen3-4b] [--out bench/RESULTS-cpu.md]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

METHODS = ("pack", "comfy-fp8", "comfy-dense")
# encoder: (te_class, Unsloth's file, base, family, ComfyUI's fp8 / dense files, CLIPLoader type, tokenizer in the file)
ENCODERS = {
    "gemma2-2b": ("Gemma2Model", "Lumina-Image-2.0-text_encoder-FP8.safetensors", "Alpha-VLLM/Lumina-Image-2.0",
                  "lumina-2", "gemma_2_2b_cast_fp8_e4m3fn.safetensors", "gemma_2_2b_bf16.safetensors", "lumina2",
                  True),
    "qwen3-4b": ("Qwen3ForCausalLM", "Z-Image-Turbo-text_encoder-FP8.safetensors", "Tongyi-MAI/Z-Image-Turbo",
                 "z-image", "qwen_3_4b_cast_fp8_e4m3fn.safetensors", "qwen_3_4b_bf16.safetensors", "lumina2", False),
    # FLUX.1: the T5-XXL with ComfyUI's CLIP-L beside it (with_encoder / DualCLIPLoader); no dense run (19 GB)
    "t5-xxl": ("T5EncoderModel", "FLUX.1-schnell-text_encoder_2-FP8.safetensors", "black-forest-labs/FLUX.1-schnell",
               "flux.1", "t5xxl_cast_fp8_e4m3fn.safetensors", None, "flux", False),
}
CLIP_L = "clip_l.safetensors"
PROMPT = "a watercolor painting of a lighthouse at dawn, soft light"


def comfy_layout(te_class: str, sd: dict) -> dict:
    """ComfyUI's text-encoder file layout: ``model.``-prefixed language-model keys, no lm_head; T5's own names."""
    if te_class == "T5EncoderModel":
        return {k: v for k, v in sd.items() if k != "encoder.embed_tokens.weight"}
    out = {}
    for k, v in sd.items():
        if k == "lm_head.weight":
            continue
        out[k if k.startswith("model.") else "model." + k] = v
    return out


def make_files(base: str, encoder: str) -> None:
    import torch
    from safetensors.torch import save_file
    import unsloth_te_builder as b
    from test_text_encoder_comfy import spiece_model
    te_class, pack_file, base_id, family, fp8_file, dense_file, _, spiece = ENCODERS[encoder]
    extra = {"spiece_model": torch.frombuffer(bytearray(spiece_model()), dtype=torch.uint8)} if spiece else {}
    te = os.path.join(base, "models", "text_encoders")
    os.makedirs(te, exist_ok=True)
    os.makedirs(os.path.join(base, "models", "prequant"), exist_ok=True)
    if te_class == "T5EncoderModel":
        save_file(b.state_dict(b.full_size("CLIPTextModelWithProjection", seed=1)), os.path.join(te, CLIP_L))
    model = b.full_size(te_class)
    if dense_file:
        save_file({**comfy_layout(te_class, b.state_dict(model)), **extra}, os.path.join(te, dense_file))
    sd = b.state_dict(b.cast_layerwise(model))
    del model
    from prequant_core import families
    component = families.get(family).hosting.text_encoders[0].component  # FLUX.1's T5 is its text_encoder_2
    b.save_safetensors(os.path.join(base, "models", "prequant", pack_file), sd,
                       b.metadata(te_class=te_class, base_model_id=base_id, family=family, component=component))
    save_file({**comfy_layout(te_class, sd), **extra}, os.path.join(te, fp8_file))


def child(method: str, base: str, out: str, encoder: str) -> dict:
    import gc
    import torch
    from tools import comfy_headless
    from tools.rss_peak import RssPeak
    nodes, pack = comfy_headless.boot(base_dir=base)
    gc.collect()
    meter = RssPeak()
    t = time.perf_counter()
    _, pack_file, _, family, fp8_file, dense_file, clip_type, _ = ENCODERS[encoder]
    with_clip_l = clip_type == "flux"
    if method == "pack":
        clip = nodes.NODE_CLASS_MAPPINGS["PrequantLoadTextEncoder"]().load(
            pack_file, family=family, with_encoder=CLIP_L if with_clip_l else "none")["result"][0]
    elif with_clip_l:
        clip = nodes.DualCLIPLoader().load_clip(CLIP_L, fp8_file, type="flux")[0]
    else:
        clip = nodes.CLIPLoader().load_clip(fp8_file if method == "comfy-fp8" else dense_file, type=clip_type)[0]
    load_s = time.perf_counter() - t
    t = time.perf_counter()
    cond = clip.encode_from_tokens_scheduled(clip.tokenize(PROMPT))[0]
    cond = [cond[0], cond[1].get("pooled_output")]
    encode_s = time.perf_counter() - t
    peak = meter.stop()
    torch.save(cond, out)
    return {"method": method, "load_s": load_s, "encode_s": encode_s, "peak_mib": peak / 2**20,
            "model_mib": clip.patcher.model_size() / 2**20}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="append the results section to this markdown file")
    ap.add_argument("--encoder", choices=sorted(ENCODERS), default="gemma2-2b",
                    help="which full-size encoder (default: gemma2-2b, the smallest)")
    ap.add_argument("--child", nargs=4, metavar=("METHOD", "BASE", "OUT", "ENCODER"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print("RESULT " + json.dumps(child(*a.child)))
        return 0
    import torch
    base = tempfile.mkdtemp(prefix="bench_te_")
    try:
        t = time.perf_counter()
        make_files(base, a.encoder)
        te_class, pack_file, _, _, fp8_file, dense_file, _, _ = ENCODERS[a.encoder]
        print(f"files written in {time.perf_counter() - t:.0f} s", flush=True)
        results = {}
        methods = [m for m in METHODS if m != "comfy-dense" or dense_file]
        for m in methods:
            out = os.path.join(base, f"{m}.pt")
            p = subprocess.run([sys.executable, __file__, "--child", m, base, out, a.encoder], capture_output=True,
                               text=True, cwd=ROOT)
            line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
            if p.returncode or not line:
                print(p.stdout[-2000:], p.stderr[-4000:])
                return 1
            results[m] = json.loads(line[0][7:])
            results[m]["cond"] = torch.load(out)
            print(m, {k: round(v, 2) for k, v in results[m].items() if isinstance(v, float)}, flush=True)
        sizes = {m: os.path.getsize(os.path.join(base, "models", d, f)) / 2**20 for m, (d, f) in
                 {"pack": ("prequant", pack_file), "comfy-fp8": ("text_encoders", fp8_file),
                  "comfy-dense": ("text_encoders", dense_file)}.items() if f}
        a_, b_ = results["pack"]["cond"], results["comfy-fp8"]["cond"]
        same = torch.equal(a_[0], b_[0]) and ((a_[1] is None and b_[1] is None) or torch.equal(a_[1], b_[1]))
        dense = results.get("comfy-dense", results["comfy-fp8"])
        vs = "vs CLIPLoader dense" if "comfy-dense" in results else "vs CLIPLoader fp8"
        lines = [f"## Text encoder load: Load Prequant Text Encoder vs CLIPLoader, {a.encoder} "
                 f"({time.strftime('%Y-%m-%d')}, bench/bench_text_encoder.py --encoder {a.encoder})", "",
                 f"Full-size {a.encoder} ({te_class}, deterministic stand-in values), ComfyUI 0.3.75 in "
                 f"process on the CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores), each "
                 "loader in its own fresh process; peak RSS growth during load + one encode.", "",
                 f"| loader | file | peak RSS | {vs} | in memory | load | encode |",
                 "|---|---|---|---|---|---|---|"]
        for m in methods:
            r = results[m]
            lines.append(f"| {m} | {sizes[m]:.0f} MiB | {r['peak_mib']:.0f} MiB | "
                         f"{r['peak_mib'] / dense['peak_mib']:.2f}x | {r['model_mib']:.0f} MiB | {r['load_s']:.1f} s | "
                         f"{r['encode_s']:.1f} s |")
        lines += ["", ("CLIP-L (ComfyUI's layout, full size) beside the T5 in both: `with_encoder` / DualCLIPLoader; "
                       "no dense run (the bf16 T5-XXL needs ~19 GB loaded). " if a.encoder == "t5-xxl" else "") +
                  f"Conditioning (and pooled output) of `pack` equal to `comfy-fp8`'s (torch.equal): {same}. CLIPLoader holds the "
                      "float8 file's weights as bf16 in memory; this node keeps them float8.", ""]
        text = "\n".join(lines)
        print(text)
        if a.out:
            with open(a.out, "a", encoding="utf-8") as f:
                f.write("\n" + text)
        return 0 if same else 1
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
