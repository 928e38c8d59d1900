"""What refusing NaN float8 codes costs at load (issue 49), and whether that cost depends on how the file lays the
codes out (issue 58): the reader's one pass over every float8 code (``codec.first_special_row``, eight bytes at a
time) and the plain-tensor check (``validate_tensors.fp8_all_finite``) against what any load does with the same bytes
anyway (reading them: a sum of 8-byte words; copying them once), and against the byte-at-a-time rule, on real-width
Z-Image fp8 layers (10240 x 3840 feed-forward, 11520 x 3840 fused qkv), side by side in one process, interleaved
rounds.

Layouts (each the same codes, each allowed by the layout rule): ``row-major``; ``transposed`` (a ``.pt`` storing the
weight's transpose: storage (cols, rows), the view ``.t()``); ``odd offset`` (row-major at storage offset 1, so the
codes start at an odd address).

    .venv/bin/python bench/bench_nan_scan.py [--gib 1.0] [--rounds 5]

Prints a table of milliseconds per GiB (median and best of the rounds), each path's ratio to a plain read of the
row-major bytes, and each scan's spread across layouts (slowest / fastest layout).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from prequant_core.formats import validate_tensors  # noqa: E402
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


def transposed(w: torch.Tensor) -> torch.Tensor:
    """The same codes as a ``.pt`` holding the transpose stores them: storage (cols, rows), the view (rows, cols)."""
    return w.t().contiguous().t()


def odd_offset(w: torch.Tensor) -> torch.Tensor:
    """The same codes, row-major, one byte into their storage (an odd address)."""
    s = torch.empty(w.numel() + 1, dtype=torch.uint8)
    s[1:] = w.view(torch.uint8).reshape(-1)
    return s[1:].view(w.shape).view(torch.float8_e4m3fn)


LAYOUTS = {"row-major": lambda w: w, "transposed": transposed, "odd offset": odd_offset}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=1.0, help="GiB of codes per layout (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    base_ws = layers(args.gib)
    nbytes = sum(w.numel() for w in base_ws)
    ws = {name: [make(w) for w in base_ws] for name, make in LAYOUTS.items()}
    for name, ls in ws.items():  # the layouts really are what they say
        assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(ls, base_ws)), name
    assert all(not w.is_contiguous() for w in ws["transposed"])
    assert all(w.data_ptr() % 2 == 1 for w in ws["odd offset"])
    scans = {
        "scan, 8 bytes at a time (first_special_row)": lambda w: codec.first_special_row(w, torch.float8_e4m3fn),
        "plain float8 check (fp8_all_finite)": validate_tensors.fp8_all_finite,
    }
    paths = {
        ("row-major", "read (a sum of 8-byte words)"):
            lambda w: int(w.view(torch.uint8).reshape(-1).view(torch.int64).sum()),
        ("row-major", "copy once"): lambda w: w.view(torch.uint8).clone(),
        ("row-major", "scan, byte at a time"): lambda w: bool(((w.view(torch.uint8) & 0x7F) == 0x7F).any()),
        **{(layout, name): fn for name, fn in scans.items() for layout in LAYOUTS},
    }
    for (layout, name), fn in paths.items():  # every layout's codes are finite: each scan says so
        if name in scans:
            assert all((fn(w) is None) if "first_special_row" in name else fn(w) for w in ws[layout]), (layout, name)
    times = {k: [] for k in paths}
    for _ in range(args.rounds):
        for (layout, name), fn in paths.items():
            t0 = time.perf_counter()
            for w in ws[layout]:
                fn(w)
            times[(layout, name)].append(time.perf_counter() - t0)
    gib = nbytes / (1 << 30)
    base = statistics.median(times[("row-major", "read (a sum of 8-byte words)")])
    print(f"{gib:.2f} GiB of e4m3 codes per layout in {len(base_ws)} real-width layers, {args.rounds} interleaved "
          f"rounds, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| layout | path | ms / GiB (median) | ms / GiB (best round) | / read |")
    print("|---|---|---|---|---|")
    for (layout, name), ts in times.items():
        m = statistics.median(ts)
        print(f"| {layout} | {name} | {1000 * m / gib:.0f} | {1000 * min(ts) / gib:.0f} | {m / base:.2f} |")
    # the best round as well: on a shared machine another process's burst lands in some rounds, never in fewer
    for name in scans:
        ms = [statistics.median(times[(layout, name)]) for layout in LAYOUTS]
        best = [min(times[(layout, name)]) for layout in LAYOUTS]
        print(f"{name}: slowest / fastest layout = {max(ms) / min(ms):.2f}x (medians), "
              f"{max(best) / min(best):.2f}x (best rounds)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
