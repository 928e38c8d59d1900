"""The ComfyUI-side GPU check: one command, no downloads (generated weights), ComfyUI 0.33 servers on a CUDA device
with DynamicVRAM on (its default there), well under 8 minutes on one GPU.

    .cache/comfyui-0.33/venv/bin/python bench/gpu_check_comfy.py --out bench/RESULTS.md
    .cache/comfyui-0.33/venv/bin/python bench/gpu_check_comfy.py --device cpu     # smoke test of the script (CPU)

Measures, each method in a fresh server (bench/bench_vs_stock.py):
  1. which patcher manages the pack's MODEL (``ModelPatcherDynamic`` when DynamicVRAM is on) and whether ComfyUI
     enabled DynamicVRAM at all (its start-up line);
  2. this pack's loader vs ComfyUI's stock loader on the ComfyUI-native twin of the same weights, int8 / fp8 / NVFP4
     / MXFP8 (NVFP4 emulated off Blackwell): peak GPU memory, first prompt, step time, latent vs dense bf16;
  3. a model larger than a VRAM cap (``--reserve-vram`` leaves --cap-gib to ComfyUI): streamed by DynamicVRAM, the
     pack's int8 and the stock twin, step time and peak GPU memory against the uncapped run, latent equal to it.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import bench_vs_stock as vs  # noqa: E402


def _args(device: str, layers: int, latent: int, steps: int, schemes: str, server_args=()) -> argparse.Namespace:
    return vs.parser().parse_args(["--device", device, "--layers", str(layers), "--latent", str(latent),
                                   "--steps", str(steps), "--schemes", schemes, "--server-args", *server_args])


def total_gib() -> float | None:
    import torch
    return torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--layers", type=int, default=None, help="main layers for the comparison (cuda 4, cpu 1)")
    ap.add_argument("--stream-layers", type=int, default=None, help="main layers of the capped model (cuda 16)")
    ap.add_argument("--cap-gib", type=float, default=1.5, help="GPU memory left to ComfyUI in the capped run")
    ap.add_argument("--out", default=None, help="append the results (markdown) to this file")
    a = ap.parse_args(argv)
    gpu = a.device == "cuda"
    layers = a.layers or (4 if gpu else 1)
    stream_layers = a.stream_layers or (16 if gpu else 1)
    latent = 64 if gpu else 8
    t0 = time.time()
    lines = [f"Device: {a.device}" + (f", {total_gib():.0f} GiB" if gpu else " (smoke test of the script)")]

    cmp_ = vs.run(_args(a.device, layers, latent, 4, ",".join(vs.SCHEMES)))
    pre = [r for m, r in cmp_["results"].items() if m.startswith("prequant:")]
    classes = sorted({p for r in pre for p in r["patchers"]})
    dyn = [s for s in cmp_["summaries"].values() if "DynamicVRAM" in s]
    lines += ["", "### 1. The MODEL's patcher", "",
              f"- patcher class(es) of the pack's MODEL while loaded: {', '.join(classes) or 'none seen'}",
              f"- the node's text names DynamicVRAM: {'yes' if dyn else 'no'}"
              + ("" if dyn or not gpu else " (ComfyUI did not enable it: see its start-up log)"),
              "- quantized layers streamed through DynamicVRAM's VRAM bar / refused by its cast (then copied per "
              "call), per scheme: " + "; ".join(f"{m.split(':')[1]} {r['layers']['in_vram_bar']} of "
                                              f"{r['layers']['quantized']} / {r['layers']['bar_refused']}"
                                              for m, r in cmp_["results"].items() if m.startswith("prequant:")),
              "", f"### 2. This pack vs ComfyUI's stock loader (real-width Z-Image, {layers} layers, latent "
              f"{latent}x{latent}, 4-step second prompt)", "", cmp_["table"]]

    if gpu:
        reserve = max(0.0, total_gib() - a.cap_gib)
        runs = {}
        for cap in (False, True):
            extra = ["--reserve-vram", f"{reserve:.1f}"] if cap else []
            runs[cap] = vs.run(_args(a.device, stream_layers, latent, 2, "int8", extra))
        rows = ["| loader | peak GPU GiB, uncapped | capped | step s, uncapped | capped | latent capped vs uncapped |",
                "|---|---|---|---|---|---|"]
        for m in ("prequant:int8", "stock:int8"):
            u, c = runs[False]["results"].get(m), runs[True]["results"].get(m)
            if not u or not c:
                rows.append(f"| {m} | did not run | | | | |")
                continue
            rows.append(f"| {m} | {u['gpu_peak_gib']:.2f} | {c['gpu_peak_gib']:.2f} | {u['step_s']:.3f} | "
                        f"{c['step_s']:.3f} | {vs.rel_err(c.get('latent'), u.get('latent'))} |")
        lines += ["", f"### 3. Streamed under a VRAM cap ({stream_layers} layers, int8; ComfyUI given "
                  f"{a.cap_gib} GiB via --reserve-vram {reserve:.1f})", "", *rows]
    lines += ["", f"Total {time.time() - t0:.0f} s."]
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "a") as fh:
            fh.write(f"\n## ComfyUI 0.33 on the device ({time.strftime('%Y-%m-%d')}, bench/gpu_check_comfy.py)\n\n"
                     f"{text}\n")
    return 0 if not cmp_["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
