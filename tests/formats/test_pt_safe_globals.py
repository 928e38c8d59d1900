"""The ``.pt`` reader (prequant_core/formats/containers/pt.py) as the first thing a fresh process does: it leaves the
classes torchao registers as safe for the whole process registered. The first load used to import torchao only
inside its own ``safe_globals`` context, which then removed what torchao had just registered: a later plain
``torch.load(weights_only=True)`` of a torchao file (ComfyUI's, the user's) failed after the pack's first load."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from conftest import ROOT

PROBE = r"""
import json, sys, torch
path, first = sys.argv[1], sys.argv[2]
if first == "pack":
    from prequant_core.formats.containers.pt import load_weights_only
    load_weights_only(path)
else:
    import torchao.quantization  # what registering torchao's classes takes, without the pack
names = sorted(f"{c.__module__}.{c.__name__}" for c in torch.serialization.get_safe_globals() if hasattr(c, "__name__"))
try:
    torch.load(path, weights_only=True)
    plain = "ok"
except Exception as e:
    plain = type(e).__name__
print(json.dumps({"safe": names, "plain": plain}))
"""


def _probe(path: str, first: str) -> dict:
    p = subprocess.run([sys.executable, "-c", PROBE, path, first], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_the_packs_first_load_leaves_torchaos_own_safe_classes_registered(tmp_path):
    from prequant_core.schemes import quantize
    path = str(tmp_path / "int8.pt")
    q, _ = quantize.quantize_tensors({"layer.weight": torch.randn(64, 64).to(torch.bfloat16)}, "int8",
                                     min_features=1)
    torch.save({"layer.weight": q["layer.weight"]}, path)
    alone, after_pack = _probe(path, "torchao"), _probe(path, "pack")
    # every class torchao registers on import is still registered after the pack's load, which read the file
    assert set(alone["safe"]) <= set(after_pack["safe"]), sorted(set(alone["safe"]) - set(after_pack["safe"]))
    assert after_pack["plain"] == alone["plain"]
