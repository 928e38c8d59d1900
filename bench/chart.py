"""The README's chart: peak memory added while serving and first-prompt time, this pack against ComfyUI's own
loaders and a peer, from ``bench/results/serving-cpu.json`` (written by ``bench/bench_serving.py --json``). One command:

    .venv/bin/python bench/chart.py          # -> docs/images/serving-cpu.png
"""
from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv: list[str]) -> int:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    src = argv[0] if argv else os.path.join(ROOT, "bench", "results", "serving-cpu.json")
    out = argv[1] if len(argv) > 1 else os.path.join(ROOT, "docs", "images", "serving-cpu.png")
    data = json.load(open(src, encoding="utf-8"))
    methods = data["methods"]
    labels = [m["label"] for m in methods]
    colors = ["#2f7d32" if i == 0 else "#7a7a7a" for i in range(len(methods))]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.4), gridspec_kw={"width_ratios": [1.3, 1]})
    mem = [m["added_peak_mib"] / 1024 for m in methods]
    a.barh(labels, mem, color=colors)
    for y, v in enumerate(mem):
        a.text(v, y, f" {v:.2f}", va="center", fontsize=9)
    a.set_xlabel("peak memory added while loading + one step (GiB, lower is better)")
    a.invert_yaxis()
    a.set_xlim(0, max(mem) * 1.18)
    times = [m["prompt_s"] for m in methods]
    b.barh(labels, [t or 0 for t in times], color=colors)
    for y, t in enumerate(times):
        b.text(t or 0, y, f" {t:.1f}" if t else " not measured", va="center", fontsize=9)
    b.set_xlabel("first prompt, load + one step (s)")
    b.set_yticklabels([])
    b.invert_yaxis()
    b.set_xlim(0, max(t for t in times if t) * 1.35)
    import textwrap
    fig.suptitle("\n".join(textwrap.wrap(f"Measured {data['date']}: {data['machine']}", 150)), fontsize=8.5)
    fig.tight_layout()
    os.makedirs(os.path.dirname(out), exist_ok=True)
    fig.savefig(out, dpi=110)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
