"""Loads through Load Prequant Transformer on the real ComfyUI (in-process, ComfyUI's own node import) each plus
one sampling step, between marker files that tests/load/test_load_trace.py finds in strace's log. Also counts, from
inside, how often the archive's zip index is parsed by anything but torch.load itself (zipfile, torch's zip reader).

argv: ComfyUI base folder, the marker folder, then the checkpoints' names in its models/prequant, loaded one after
the other between markers TRACE_START_<i> / TRACE_END_<i>. Prints one JSON line per checkpoint."""
from __future__ import annotations

import json
import os
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tools import comfy_headless  # noqa: E402

base, marks, names = sys.argv[1], sys.argv[2], sys.argv[3:]
nodes, pack = comfy_headless.boot(base_dir=base)
pack.nodes.paths.register()

import torch  # noqa: E402

counts = {"zipfile": 0, "torch_reader_outside_load": 0}
in_load = [0]
_zip_init = zipfile.ZipFile.__init__
_reader = torch._C.PyTorchFileReader
_load = torch.load


def _counting_zip(self, *a, **k):
    counts["zipfile"] += 1
    return _zip_init(self, *a, **k)


def _counting_reader(*a, **k):
    if not in_load[0]:
        counts["torch_reader_outside_load"] += 1
    return _reader(*a, **k)


def _marked_load(*a, **k):
    in_load[0] += 1
    try:
        return _load(*a, **k)
    finally:
        in_load[0] -= 1


zipfile.ZipFile.__init__ = _counting_zip
torch._C.PyTorchFileReader = _counting_reader
torch.load = _marked_load

import comfy.sample  # noqa: E402

PACK = os.path.realpath(ROOT) + os.sep
OWN = (PACK + "prequant_core" + os.sep, PACK + "nodes" + os.sep)
visits: list[str] = []
calls: set = set()  # (caller's file, callee's file, callee's function) for calls between two of the pack's files


def _own(code) -> str | None:
    f = os.path.realpath(code.co_filename)
    return os.path.relpath(f, PACK) if f.startswith(OWN) else None


def _profile(frame, event, arg):
    # the pack's modules entered from the node's load() to the MODEL, in call order (consecutive repeats folded)
    if event == "call":
        mod = _own(frame.f_code)
        if mod:
            if not visits or visits[-1] != mod:
                visits.append(mod)
            caller = _own(frame.f_back.f_code) if frame.f_back is not None else None
            if caller and caller != mod:
                calls.add((caller, mod, frame.f_code.co_name))


loader = pack.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]()
for i, name in enumerate(names):
    for k in counts:
        counts[k] = 0
    open(os.path.join(marks, f"TRACE_START_{i}"), "w").close()
    visits.clear()
    calls.clear()
    sys.setprofile(_profile)
    out = loader.load(checkpoint=name, scheme="int8", base_model_id="Tongyi-MAI/Z-Image-Turbo")
    sys.setprofile(None)
    patcher = out["result"][0]
    g = torch.Generator().manual_seed(0)
    cond = [[torch.randn(1, 12, 768, generator=g), {}]]  # the tiny Z-Image's caption width (tools/tiny_models.py)
    with torch.inference_mode():
        latent = comfy.sample.sample(patcher, torch.randn(1, 16, 32, 32, generator=g), 1, 1.0, "euler", "simple",
                                     cond, cond, torch.zeros(1, 16, 32, 32), seed=0, disable_pbar=True)
    open(os.path.join(marks, f"TRACE_END_{i}"), "w").close()
    print(json.dumps({"name": name, **counts, "visits": list(visits), "calls": sorted(calls), "finite": bool(torch.isfinite(latent).all()),
                      "status": out["ui"]["text"][0]}), flush=True)
