"""Build benchmark: peak memory of building a pre-quantized checkpoint from a dense file, as a ratio to its size.

Model: a real-width Z-Image transformer (dim 3840, 30 heads, cap_feat_dim 2560) with one main layer and one refiner
layer of each kind, random bf16 weights generated on the spot (about 1.1 GB), written as a dense diffusers-layout
.safetensors in a temp folder that is deleted afterwards.

Each case runs in its own fresh process, so its peak RSS is its own; reported: the peak (``ru_maxrss``, and a 5 ms
psutil sampler), the level after imports (torch alone is a large part of a small process), and the growth.

Cases:
  stream  this pack's builder (``prequant_core.builder.build``): tensors read one at a time, quantized result kept,
          streamed to disk
  naive   the obvious way, for contrast: ``safetensors.torch.load_file`` (whole dense dict) + ``quantize_tensors`` +
          ``safetensors.torch.save_file`` of torchao's flattened dict

    .venv/bin/python bench/bench_build.py [--schemes int8,fp8] [--containers safetensors,pt] [--naive] [--keep DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
DIM, HEADS, CAP = 3840, 30, 2560


def make_dense(path: str, seed: int = 0) -> int:
    """Random bf16 weights with the exact shapes of diffusers' ZImageTransformer2DModel (built on meta)."""
    import torch
    from diffusers import ZImageTransformer2DModel
    from safetensors.torch import save_file
    with torch.device("meta"):
        m = ZImageTransformer2DModel(dim=DIM, n_layers=1, n_refiner_layers=1, n_heads=HEADS, n_kv_heads=HEADS,
                                     axes_dims=[32, 48, 48], cap_feat_dim=CAP)
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for k, v in m.state_dict().items():
        t = torch.randn(tuple(v.shape), generator=g, dtype=torch.float32)
        if v.ndim == 2:
            t /= v.shape[1] ** 0.5
        sd[k] = t.to(torch.bfloat16)
        del t
    save_file(sd, path)
    return os.path.getsize(path)


def child(case: str, dense: str, out: str, scheme: str, container: str) -> None:
    import resource
    import threading

    import psutil
    import torch  # noqa: F401
    import torchao  # noqa: F401
    from prequant_core import builder, schemes
    from prequant_core.schemes import quantize

    proc = psutil.Process()
    base = proc.memory_info().rss
    peak = [base]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            stop.wait(0.005)
    th = threading.Thread(target=sample, daemon=True)
    th.start()
    t0 = time.perf_counter()
    if case == "stream":
        res = builder.build(dense, builder.Target(out, container=container, overwrite=True), builder.Recipe(scheme))
        quantized = res.quantized
    else:
        from safetensors.torch import load_file, save_file
        from prequant_core.formats.checkpoint import FORMAT_V1
        from prequant_core.formats.containers.safetensors_container import flatten
        sd = load_file(dense)
        q, skipped = quantize.quantize_tensors(sd, scheme, exclude=schemes.exclude_tokens(scheme))
        del sd
        flat, header = flatten(q, format_tag=FORMAT_V1, metadata={"scheme": scheme})
        save_file(flat, out, metadata=header)
        quantized = sum(1 for v in q.values() if type(v).__name__.endswith("Tensor") and hasattr(v, "qdata"))
    secs = time.perf_counter() - t0
    stop.set()
    th.join()
    peak[0] = max(peak[0], proc.memory_info().rss)
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    print(json.dumps({"base": base, "peak_sampled": peak[0], "maxrss": maxrss, "seconds": secs,
                      "out_bytes": os.path.getsize(out), "quantized": quantized}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schemes", default="int8,fp8")
    ap.add_argument("--containers", default="safetensors,pt")
    ap.add_argument("--naive", action="store_true", help="also run the load-all + save_file contrast (int8)")
    ap.add_argument("--keep", default=None, help="folder for the files (default: a temp folder, deleted after)")
    ap.add_argument("--child", nargs=5, metavar=("CASE", "DENSE", "OUT", "SCHEME", "CONTAINER"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return 0
    work = args.keep or tempfile.mkdtemp(prefix="prequant-bench-build-")
    os.makedirs(work, exist_ok=True)
    try:
        dense = os.path.join(work, "dense.safetensors")
        t = time.perf_counter()
        gen = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {ROOT!r}); "
                              f"from bench.bench_build import make_dense; print(make_dense({dense!r}))"],
                             capture_output=True, text=True, cwd=ROOT)
        if gen.returncode:
            print(gen.stderr[-3000:], file=sys.stderr)
            return 1
        dense_bytes = int(gen.stdout.strip().splitlines()[-1])
        print(f"dense file: {dense_bytes / 1e9:.3f} GB (dim {DIM}, {HEADS} heads, 1 layer + 1+1 refiners), "
              f"made in {time.perf_counter() - t:.0f} s")
        cases = [("stream", s, c) for s in args.schemes.split(",") for c in args.containers.split(",")]
        if args.naive:
            cases.append(("naive", "int8", "safetensors"))
        rows = []
        for case, scheme, container in cases:
            out = os.path.join(work, f"out-{case}-{scheme}.{'pt' if container == 'pt' else 'safetensors'}")
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", case, dense, out, scheme,
                                container], capture_output=True, text=True, cwd=ROOT)
            if r.returncode:
                print(r.stderr[-3000:], file=sys.stderr)
                return 1
            m = json.loads(r.stdout.strip().splitlines()[-1])
            peak = max(m["maxrss"], m["peak_sampled"])
            rows.append((case, scheme, container, m["base"], peak, m["out_bytes"], m["seconds"]))
            with __import__("contextlib").suppress(OSError):
                os.remove(out)
        gb = lambda b: f"{b / 1e9:.2f}"  # noqa: E731
        print()
        print("| case | scheme | container | after imports GB | peak RSS GB | growth GB | peak / dense | "
              "growth / dense | output GB | s |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for case, scheme, container, base, peak, outb, secs in rows:
            print(f"| {case} | {scheme} | {container} | {gb(base)} | {gb(peak)} | {gb(peak - base)} | "
                  f"{peak / dense_bytes:.2f} | {(peak - base) / dense_bytes:.2f} | {gb(outb)} | {secs:.0f} |")
        print(f"\ndense file {gb(dense_bytes)} GB; target: peak / dense <= 1.3")
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
