"""Sampling step time of the matmul paths against ComfyUI's dense model, side by side in one process and one run.

Methods (real-width Z-Image as in bench_load.py, the same files, loaded through the real ComfyUI):
  dense            ComfyUI's own "Load Diffusion Model" on the dense bf16 file (ComfyUI computes in fp32 on a CPU)
  <scheme> <path>  this pack's loader on the pre-quantized file, with the matmul path the loader chose for this device
                   (marked "default") or forced with PREQUANT_MATMUL

Every method is loaded once; then, for each latent size, rounds run every method one after the other. Each method's
step time is divided by the dense step of the same round, and the median of those per-round ratios is reported (the
machine is shared: load drifts between rounds, much less within one).

    .venv/bin/python bench/bench_matmul.py [--latents 16,64] [--rounds 5] [--methods dense,fp8,int8] [--out FILE]

``--methods``: ``dense``, ``fp8``, ``int8``, ``nvfp4``, ``mxfp8`` (the loader's choice) and ``fp8:quantized``,
``int8:weight-only`` ... (forced). ``int8:pieces`` is the quantized int8 path with its integer sums taken in exact
float32 pieces instead of ``torch._int_mm`` (``prequant_core/schemes/int8_cpu.py``: the CPU path before 2026-12-04,
and where ``_int_mm`` is not exact); its output is compared with ``int8``'s, bit for bit. The file sizes of every
scheme are printed side by side with the step times. ``fp8:whole``, ``nvfp4:whole``, ``mxfp8:whole`` run the
float32 weight-only path as it was before 2026-12-04 (the whole weight dequantized per call, one ``F.linear``) instead
of ``prequant_core/schemes/cpu_weight_only.py``'s row blocks; their outputs are compared with the loader's choice's,
bit for bit.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


PIECES = "pieces"
WHOLE = "whole"
BEFORE = (PIECES, WHOLE)  # forced variants: the path before, measured against the loader's choice of the same scheme


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--latents", default="16,64", help="latent sides; image tokens = (side/2)^2, plus 32 text tokens")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--skip-emulated-above", type=int, default=32, help="run fp8 'quantized' (emulated on a CPU, "
                    "~5x dense) only at latents up to this side, to keep the run short")
    ap.add_argument("--methods", default="dense,fp8,fp8:quantized,int8,int8:weight-only")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    latents = [int(x) for x in args.latents.split(",")]
    wanted = [m.strip() for m in args.methods.split(",")]
    methods = [(m.split(":")[0], m.split(":")[1] if ":" in m else None,
                "default" if m in ("fp8", "int8", "nvfp4", "mxfp8") else None) for m in wanted]
    assert methods[0][0] == "dense", "the first method must be dense (the reference)"
    base = tempfile.mkdtemp(prefix="prequant-bench-matmul-")
    try:
        import torch
        from tools import comfy_headless
        nodes, pack = comfy_headless.boot(base_dir=base)
        import comfy.sample
        import bench_load
        from prequant_core.schemes import cpu_weight_only, devices, int8_cpu
        blocks = cpu_weight_only.applies
        t = time.time()
        made = sorted({s for s, _, _ in methods if s != "dense"} | {"fp8"})
        files = bench_load.make_files(os.path.join(base, "models"), args.layers, made)
        sizes = {s: os.path.getsize(p) for s, p in files.items()}
        print(f"files made in {time.time() - t:.0f}s: " + ", ".join(f"{s} {sizes[s] / 2**20:.0f} MiB" for s in sizes),
              flush=True)
        models, texts = {}, {}
        with torch.inference_mode():
            for scheme, force, _ in methods:
                key = (scheme, force)
                if scheme == "dense":
                    models[key] = nodes.NODE_CLASS_MAPPINGS["UNETLoader"]().load_unet(
                        "zimage_dense_bf16.safetensors", "default")[0]
                    continue
                os.environ.pop(devices.ENV, None)
                if force and force not in BEFORE:
                    os.environ[devices.ENV] = force
                res = nodes.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]().load(bench_load.prequant_name(scheme))
                os.environ.pop(devices.ENV, None)
                models[key] = res["result"][0]
                texts[key] = res["ui"]["prequant"][0].get("matmul") or "?"
                print(f"{scheme} {force or 'default'}: {texts[key]}", flush=True)

        def step(key, latent):
            model = models[key]
            int8_cpu._chosen[torch._int_mm] = False if key[1] == PIECES else native
            cpu_weight_only.applies = (lambda *a: False) if key[1] == WHOLE else blocks
            g = torch.Generator().manual_seed(1)
            cond = [[torch.randn(1, 32, 2560, generator=g), {}]]
            lat = torch.zeros(1, 16, latent, latent)
            noise = torch.randn(lat.shape, generator=torch.Generator().manual_seed(2))
            with torch.inference_mode():
                t0 = time.perf_counter()
                out = comfy.sample.sample(model, noise, 1, 1.0, "euler", "simple", cond, cond, lat, seed=0,
                                          disable_pbar=True)
                return time.perf_counter() - t0, out

        native = int8_cpu.native_chosen()
        print(f"torch._int_mm exact on this CPU: {int8_cpu.native_exact()}; chosen: {native}", flush=True)

        results, same = {}, {}
        for latent in latents:
            keys = [(s, f) for s, f, _ in methods
                    if not (s == "fp8" and f == "quantized" and latent > args.skip_emulated_above)]
            outs = {k: step(k, latent)[1] for k in keys}  # warm-up (and the outputs compared below)
            times = {k: [] for k in keys}
            for r in range(args.rounds):
                for k in keys:
                    times[k].append(step(k, latent)[0])
                print(f"latent {latent} round {r + 1}: " + ", ".join(f"{k[0]}/{k[1] or 'default'} {times[k][-1]:.2f}s"
                                                                       for k in keys), flush=True)
            for k in keys:
                if k[1] in BEFORE and (k[0], None) in outs:
                    same[(latent, k)] = torch.equal(outs[(k[0], None)], outs[k])
            d = outs[("dense", None)]
            dense_t = times[("dense", None)]
            for k in keys:
                o = outs[k]
                ratios = [t / dt for t, dt in zip(times[k], dense_t)]
                results[(latent, k)] = {"step_s": statistics.median(times[k]), "ratio": statistics.median(ratios),
                                        "ratios": ratios, "rel_err": ((o - d).norm() / d.norm()).item()}
        lines = ["| latent (tokens) | method | matmul path (node text) | step s (median) | step / dense (median of"
                 " rounds) | per round | rel err vs dense |", "|---|---|---|---|---|---|---|"]
        summary = []
        for latent in latents:
            for scheme, force, mark in methods:
                r = results.get((latent, (scheme, force)))
                if r is None:
                    continue
                name = "ComfyUI dense bf16" if scheme == "dense" else f"prequant {scheme}, " + (
                    "integer sums in float32 pieces" if force == PIECES else
                    "whole weight dequantized per call (before)" if force == WHOLE else
                    f"{devices.ENV}={force}" if force else "loader's choice")
                path = "-" if scheme == "dense" else texts[(scheme, force)].split(" (")[0]
                lines.append(f"| {latent} ({(latent // 2) ** 2}+32) | {name} | {path} | {r['step_s']:.2f} | "
                             f"{r['ratio']:.2f} | {' '.join(f'{x:.2f}' for x in r['ratios'])} | {r['rel_err']:.4f} |")
                if mark == "default":
                    summary.append(f"- latent {latent}: {scheme} (loader's choice: {path}) step / dense = "
                                   f"{r['ratio']:.2f} (median of rounds; lowest {min(r['ratios']):.2f})")
        for (latent, k), equal in same.items():
            a, b = results[(latent, (k[0], None))], results[(latent, k)]
            summary.append(f"- latent {latent}: {k[0]} loader's choice / {k[0]}:{k[1]} = "
                           f"{statistics.median(x / y for x, y in zip(a['ratios'], b['ratios'])):.2f} (median of "
                           f"rounds); outputs equal (torch.equal): {equal}")
        summary.append("- file sizes: " + ", ".join(f"{s} {sizes[s] / 2**20:.0f} MiB" for s in sizes) + "; " + ", ".join(
            f"{s} / fp8 = {sizes[s] / sizes['fp8']:.2f}" for s in sizes if s not in ("dense", "fp8")))
        table = "\n".join(lines + [""] + summary)
        print(table)
        if args.out:
            import platform
            import torchao
            with open(args.out, "w") as fh:
                fh.write(f"# CPU matmul paths ({time.strftime('%Y-%m-%d')}, bench/bench_matmul.py)\n\n"
                         f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores (shared); "
                         f"torch {torch.__version__}, torchao {torchao.__version__}; real-width Z-Image, "
                         f"{args.layers} layer(s) + 2+2 refiners; one euler step, batch 1, {args.rounds} interleaved "
                         f"rounds.\n\nLoader's choice on this CPU: " + "; ".join(
                             f"{k[0]} -> {v}" for k, v in texts.items() if k[1] is None) + f".\n\n{table}\n")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
