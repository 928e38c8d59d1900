"""What refusing NaN float8 codes costs at load (issue 49): the reader's one pass over every float8 code
(``codec.first_special_row``, eight bytes at a time) against what any load does with the same bytes anyway (reading
them: a sum of 8-byte words; copying them once), and against the byte-at-a-time rule it replaces, on real-width Z-Image fp8
layers (10240 x 3840 feed-forward, 11520 x 3840 fused qkv), side by side in one process, interleaved rounds.

    .venv/bin/python bench/bench_nan_scan.py [--gib 1.0] [--rounds 5]

Prints a table of milliseconds per GiB (median of the rounds) and each path's ratio to a plain read of the bytes.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from prequant_core.schemes import codec  # noqa: E402


def layers(gib: float) -> list[torch.Tensor]:
    """Finite e4m3 codes (random bytes, NaN codes cleared) in real Z-Image layer shapes, about ``gib`` GiB."""
    g = torch.Generator().manual_seed(0)
    shapes = [(10240, 3840), (3840, 10240), (11520, 3840), (3840, 3840)]
    out, total, i = [], 0, 0
    while total < gib * (1 << 30):
        r, c = shapes[i % len(shapes)]
        b = torch.randint(0, 256, (r, c), generator=g, dtype=torch.int32).to(torch.uint8)
        b[(b & 0x7F) == 0x7F] = 0
        out.append(b.view(torch.float8_e4m3fn))
        total += r * c
        i += 1
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=1.0, help="GiB of codes (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    ws = layers(args.gib)
    nbytes = sum(w.numel() for w in ws)
    paths = {
        "read (a sum of 8-byte words)": lambda w: int(w.view(torch.uint8).reshape(-1).view(torch.int64).sum()),
        "copy once": lambda w: w.view(torch.uint8).clone(),
        "scan, 8 bytes at a time (this pack)": lambda w: codec.first_special_row(w, torch.float8_e4m3fn),
        "scan, byte at a time": lambda w: bool(((w.view(torch.uint8) & 0x7F) == 0x7F).any()),
    }
    times = {k: [] for k in paths}
    for _ in range(args.rounds):
        for name, fn in paths.items():
            t0 = time.perf_counter()
            for w in ws:
                fn(w)
            times[name].append(time.perf_counter() - t0)
    gib = nbytes / (1 << 30)
    base = statistics.median(times["read (a sum of 8-byte words)"])
    print(f"{gib:.2f} GiB of e4m3 codes in {len(ws)} real-width layers, {args.rounds} interleaved rounds, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| path | ms / GiB (median) | / read |")
    print("|---|---|---|")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"| {name} | {1000 * m / gib:.0f} | {m / base:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
