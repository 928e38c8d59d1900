"""The lines of the product no test ran, by function, from coverage.py's JSON report (``scripts/test.sh --coverage``).

    python tools/coverage_gaps.py COVERAGE_JSON ROOT > gaps.md

Prints line and branch coverage of ``prequant_core/`` and ``nodes/`` (each, and together), then every function with
lines no test ran: its file, its name, how many lines and which. The list is what docs/DEVELOPING.md sorts by why
(CUDA only, a torch or ComfyUI version not installed here, or a test to add) and what the GPU run must exercise.
"""
from __future__ import annotations

import json
import os
import sys

PARTS = ("prequant_core", "nodes")


def _spans(lines: list[int]) -> str:
    """[3, 4, 5, 9] -> '3-5, 9'."""
    out, start, prev = [], None, None
    for n in sorted(lines):
        if start is None:
            start = prev = n
        elif n == prev + 1:
            prev = n
        else:
            out.append(f"{start}-{prev}" if prev != start else f"{start}")
            start = prev = n
    if start is not None:
        out.append(f"{start}-{prev}" if prev != start else f"{start}")
    return ", ".join(out)


def _pct(hit: int, total: int) -> str:
    return f"{100.0 * hit / total:.1f}%" if total else "n/a"


def summary(files: dict, root: str) -> list[str]:
    rows = []
    totals = {p: [0, 0, 0, 0] for p in (*PARTS, "both")}  # statements, run, branches, branches taken
    for path, f in files.items():
        rel = os.path.relpath(path, root)
        part = rel.split(os.sep)[0]
        if part not in PARTS:
            continue
        s = f["summary"]
        for key in (part, "both"):
            t = totals[key]
            t[0] += s["num_statements"]
            t[1] += s["covered_lines"]
            t[2] += s.get("num_branches", 0)
            t[3] += s.get("covered_branches", 0)
    for key, (st, run, br, taken) in totals.items():
        rows.append(f"| {key + '/' if key in PARTS else 'both'} | {run} / {st} lines ({_pct(run, st)}) | "
                    f"{taken} / {br} branches ({_pct(taken, br)}) |")
    return ["| part | lines | branches |", "|---|---|---|", *rows]


def gaps(files: dict, root: str) -> list[str]:
    out = []
    for path in sorted(files):
        rel = os.path.relpath(path, root)
        if rel.split(os.sep)[0] not in PARTS:
            continue
        f = files[path]
        functions = f.get("functions") or {"(module)": {"missing_lines": f["missing_lines"]}}
        for name, fn in sorted(functions.items(), key=lambda kv: min(kv[1]["missing_lines"] or [0])):
            missing = fn["missing_lines"]
            if missing:
                out.append(f"- `{rel}` {name or '(module level)'}: {len(missing)} line(s): {_spans(missing)}")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0]) as fh:
        files = json.load(fh)["files"]
    root = os.path.realpath(argv[1])
    files = {os.path.realpath(os.path.join(root, p)): f for p, f in files.items()}
    lines = ["[test] coverage of the product (line and branch), every leg merged:", "", *summary(files, root), "",
             "## Lines no test ran, by function", "", *gaps(files, root)]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
