"""Each checkpoint is opened once per load: one load through Load Prequant Transformer on the real ComfyUI plus one
sampling step, traced with strace (open / openat of the checkpoint's path and of its descriptor's /proc/self/fd
name). Allowed: the pack's own handle, plus the two opens ``torch.load(mmap=True)`` (a .pt) or safetensors (its
reader and torch's mapping of the file) make by themselves; the zip index of a .pt is parsed once by the pack."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

OPEN = re.compile(r'^(\d+)\s+open(?:at)?\((?:AT_FDCWD, )?"([^"]+)".*\)\s+=\s+(-?\d+)')
CONTAINERS = ("safetensors", "pt")


def _opens(lines: list[str], i: int, real: str) -> list[str]:
    """The opens of ``real`` and of any /proc/self/fd/N whose N was returned for it, between load i's markers."""
    start = next(n for n, ln in enumerate(lines) if f"TRACE_START_{i}" in ln)
    end = next(n for n, ln in enumerate(lines) if f"TRACE_END_{i}" in ln)
    fds, hits = set(), []
    for ln in lines[start:end]:
        m = OPEN.match(ln)
        if not m:
            continue
        _, path, rc = m.groups()
        if path == real and int(rc) >= 0:
            fds.add(int(rc))
            hits.append(path)
        elif path.startswith("/proc/self/fd/") and int(path.rsplit("/", 1)[1]) in fds:
            hits.append(path)
    return hits


@pytest.fixture(scope="module")
def traced(prequant_files, tmp_path_factory):
    """One strace'd worker run: (the worker's results, strace's log lines, the models/prequant folder)."""
    tmp_path = tmp_path_factory.mktemp("trace")
    strace = shutil.which("strace")
    assert strace, "strace is missing: scripts/setup_test_extras.sh installs Debian's strace"
    base = tmp_path / "comfy"
    folder = base / "models" / "prequant"
    folder.mkdir(parents=True)
    names = [f"Z-Image-Turbo-INT8.{c}" for c in CONTAINERS]
    for c, name in zip(CONTAINERS, names):
        shutil.copyfile(prequant_files("int8", c), folder / name)
    log = tmp_path / "strace.log"
    r = subprocess.run([strace, "-f", "--seccomp-bpf", "-qq", "-e", "trace=open,openat", "-o", str(log), sys.executable,
                        os.path.join(ROOT, "tests", "load_trace_worker.py"), str(base), str(tmp_path), *names],
                       capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    results = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert [o["name"] for o in results] == names
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    return results, lines, folder


def test_one_load_opens_the_checkpoint_once(traced):
    results, lines, folder = traced
    names = [o["name"] for o in results]
    for i, (c, name, out) in enumerate(zip(CONTAINERS, names, results)):
        assert out["finite"] and name in out["status"], out
        real = os.path.realpath(folder / name)
        hits = _opens(lines, i, real)
        # by name once (the pack's handle); every other open goes through that handle's descriptor
        assert hits.count(real) == 1, (c, hits)
        assert 1 <= len(hits) <= 3, (c, hits)
        if c == "pt":  # the pack parses the zip index once; torch.load's own reader is torch's
            assert out["zipfile"] == 1 and out["torch_reader_outside_load"] == 0, out


# Leaf helpers every step may use; they call nothing back (the room count leaves them aside)
LEAVES = ("prequant_core/errors.py", "prequant_core/units.py", "prequant_core/safe_text.py",
          # the records a load passes down whole (what the host gives, what is asked): every step's, no step of its own
          "prequant_core/context.py", "prequant_core/request.py")
# The callbacks a caller hands down (status lines, progress, ComfyUI's interrupt): the only calls up the layers
CALLBACKS = {("nodes/status.py", "say"), ("nodes/status.py", "bytes"), ("nodes/status.py", "tensors"),
             ("nodes/load_node.py", "_interrupted")}


CORE_RANK = {"prequant_core/schemes": 0, "prequant_core/formats": 1, "prequant_core/families": 2,
             "prequant_core/load": 3}


def _room(mod: str) -> str:
    """A folder under prequant_core/ is one room; any other file is its own."""
    parts = mod.split(os.sep)
    return "/".join(parts[:2]) if parts[0] == "prequant_core" and len(parts) > 2 else mod


def test_the_leaves_import_nothing_of_the_pack_but_leaves():
    """What lets the room count leave them aside: a leaf reaches no step of the load."""
    import ast
    for leaf in LEAVES:
        tree = ast.parse(open(os.path.join(ROOT, leaf), encoding="utf-8").read())
        own = {f"prequant_core/{n.module.replace('.', '/')}.py" for n in ast.walk(tree)
               if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module}
        own |= {f"prequant_core/{a.name}.py" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                and n.level == 1 and not n.module for a in n.names}
        assert own <= set(LEAVES), (leaf, own - set(LEAVES))
        assert not any(isinstance(n, ast.ImportFrom) and n.level > 1 for n in ast.walk(tree)), leaf


def test_the_load_walk_goes_down_through_few_rooms(traced):
    """From the node's load() to the MODEL of a local int8 .pt (issue 34): at most 12 rooms, and no call from the
    core up into nodes/ but the status / progress / interrupt callbacks."""
    results, _, _ = traced
    out = next(o for o in results if o["name"].endswith(".pt"))
    rooms = list(dict.fromkeys(_room(v) for v in out["visits"] if v not in LEAVES))
    assert out["visits"][0] == "nodes/load_node.py", out["visits"][:3]
    assert len(rooms) <= 12, rooms
    up = [(a, b, f) for a, b, f in out["calls"] if a.startswith("prequant_core") and b.startswith("nodes")
          and (b, f) not in CALLBACKS]
    assert not up, up
    # inside the core every call goes down: the pipeline, then families, then formats, then schemes (shared types)
    against = sorted({(_room(a), _room(b), f) for a, b, f in out["calls"]
                      if _room(a) in CORE_RANK and _room(b) in CORE_RANK and CORE_RANK[_room(a)] < CORE_RANK[_room(b)]})
    assert not against, against
