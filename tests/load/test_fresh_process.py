"""Every scheme's file, in both containers, read as a user's first action: by the CLI in a fresh interpreter, and as
the first load of a freshly started ComfyUI server. Nothing here may depend on what the test process imported
before: the files are made by the restated Unsloth builder (tests/unsloth_builder.py, never the pack's writer) in
this process, and every read happens in a new one.

Round 5 found NVFP4 / MXFP8 ``.pt`` files refused as "a pickle that could run code" in a fresh process, while they
loaded after an int8 file had been read in the same process: the suite's processes had imported torchao's
``mx_formats`` while building fixtures. ``test_pickled_classes_are_declared_by_their_codec`` holds the class of that
bug (every class a kind's pickle names is one its codec declares), the subprocess tests hold the behaviour.
"""
from __future__ import annotations

import io
import json
import os
import pickletools
import subprocess
import sys
import zipfile

import pytest
import torch

import unsloth_builder as ub
from conftest import ROOT

# (builder kind, containers): MXFP8 has only Unsloth's .pt form (its -MXFP8 repos hold no .safetensors)
FILES = [("int8", ".pt"), ("int8", ".safetensors"), ("fp8", ".pt"), ("fp8", ".safetensors"),
         ("nvfp4", ".pt"), ("nvfp4", ".safetensors"), ("mxfp8", ".pt")]
IDS = [f"{k}{c}" for k, c in FILES]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fresh")
    out = {}
    for kind in dict(FILES):
        stem = f"Z-Image-Turbo-{kind.upper()}"
        paths = [str(folder / (stem + c)) for k, c in FILES if k == kind]
        ub.build(ub.tiny_model("z-image"), "z-image", kind, paths)  # .pt first: the .safetensors is converted from it
        for p in paths:
            out[kind + os.path.splitext(p)[1]] = p
    return out


def _pickle_globals(data: bytes) -> set[str]:
    names, strings = set(), []
    for op, arg, _ in pickletools.genops(data):
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
            strings.append(arg)
        elif op.name == "STACK_GLOBAL":
            names.add(f"{strings[-2]}.{strings[-1]}")
        elif op.name == "GLOBAL":
            names.add(arg.replace(" ", "."))
    return names


def test_pickled_classes_are_declared_by_their_codec():
    """What torch.save writes for each registered scheme's weight names only torch's own types and the classes the
    scheme's codec lists in ``pickled`` (which the reader allows): a new kind, or a torchao that moves a class,
    fails here instead of in a user's first run."""
    from prequant_core.formats.containers import pt
    from prequant_core.schemes import registry
    allowed = {f"{c.__module__}.{c.__qualname__}" for c in pt._safe_globals()}
    for s in registry.all_schemes():
        w = s.quantize(torch.randn(64, 64, dtype=torch.bfloat16), s.config(False))
        buf = io.BytesIO()
        torch.save({"w": w}, buf)
        with zipfile.ZipFile(buf) as z:
            data = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
        theirs = {g for g in _pickle_globals(data) if not g.startswith(("torch.", "collections."))}
        assert theirs, s.name
        declared = {f"{c.__module__}.{c.__qualname__}" for c in s.codec.pickle_classes()}
        assert theirs <= declared, (s.name, theirs - declared)
        assert declared <= allowed, (s.name, declared - allowed)


def _fresh(*args, **kw):
    """``python -m prequant_core ARGS`` in a new interpreter: nothing imported but what the CLI imports."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, "-m", "prequant_core", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300, **kw)


@pytest.mark.parametrize("key", IDS)
def test_the_cli_reads_each_file_in_a_fresh_interpreter(made, key):
    kind = key.split(".")[0]
    r = _fresh("info", made[key], "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    text = json.dumps(report)
    assert "could run code" not in text
    assert kind in text
    scheme = ub.KINDS[kind]
    r = _fresh("verify", made[key], "--base", ub.FAMILIES["z-image"][1], "--scheme", scheme)
    assert r.returncode == 0 and "VALID" in r.stdout, r.stdout + r.stderr


def test_the_first_load_of_a_fresh_server_reads_each_file(made, tmp_path):
    """Each file is the first thing a newly started ComfyUI loads (one server per file; the sink takes the MODEL)."""
    import shutil
    from tools.comfy_server import ComfyServer, execution_error
    for key in IDS:
        base = tmp_path / key.replace(".", "-")
        (base / "models" / "prequant").mkdir(parents=True)
        name = os.path.basename(made[key])
        shutil.copy(made[key], base / "models" / "prequant" / name)
        graph = {"1": {"class_type": "PrequantLoadTransformer", "inputs": {"checkpoint": name}},
                 "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}}}
        with ComfyServer(str(base), env={"HF_HUB_OFFLINE": "1"}) as server:
            entry = server.run(graph, timeout=300)
            assert execution_error(entry) is None, (key, execution_error(entry))
            assert entry.get("status", {}).get("completed") is not False, (key, entry.get("status"))


def test_reading_a_pt_leaves_the_process_wide_safe_classes_as_they_were(tmp_path):
    """The reader allows its classes for its own read only, and never takes away one that other code registered for
    the whole process (torchao registers its tensor classes on import; torch's context removes what it was given)."""
    from prequant_core import formats
    path = str(tmp_path / "Z-Image-Turbo-INT8.pt")
    ub.build(ub.tiny_model("z-image"), "z-image", "int8", [path])
    before = set(torch.serialization.get_safe_globals())
    formats.read(path)
    assert set(torch.serialization.get_safe_globals()) == before
