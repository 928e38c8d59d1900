"""A .safetensors file whose tensors do not tile its data section (bytes after the last tensor, or between two): the
safetensors library refuses it, so the full read does; the header-only read (Prequant Info, ``verify`` without
``--verify-fingerprint``, the memory guard's declared size) refuses it too, naming the file, instead of calling it
VALID and leaving the refusal to the load. Core tier: no ComfyUI."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import BASE_ID, ROOT
from prequant_core import report
from prequant_core.errors import CorruptCheckpointError
from prequant_core.request import Request

REFUSAL = "The safetensors file holds bytes no tensor accounts for."


def _raw(path, entries: dict, data: bytes) -> str:
    """A safetensors file written byte by byte: ``entries`` {name: (offsets, shape)} of float32 tensors."""
    head = json.dumps({k: {"dtype": "F32", "shape": s, "data_offsets": o} for k, (o, s) in entries.items()}).encode()
    path.write_bytes(len(head).to_bytes(8, "little") + head + data)
    return str(path)


def _library_refuses(path: str) -> bool:
    from safetensors import safe_open
    try:
        with safe_open(path, framework="pt", device="cpu") as f:
            [f.get_tensor(k) for k in f.keys()]
    except Exception:  # noqa: BLE001 - whatever the library raises
        return True
    return False


def test_bytes_after_the_last_tensor_are_refused_by_info_and_verify_as_by_the_load(prequant_files, tmp_path):
    path = str(tmp_path / "Z-Image-Turbo-INT8-trailing.safetensors")
    shutil.copyfile(prequant_files("int8", "safetensors"), path)
    req = Request(scheme="int8", base_model_id=BASE_ID)
    assert report.info(path, req).valid and not _library_refuses(path)  # the file as built
    with open(path, "ab") as f:
        f.write(b"\0" * 16)
    assert _library_refuses(path)
    for fingerprint in (False, True):
        with pytest.raises(CorruptCheckpointError) as e:
            report.info(path, req, verify_fingerprint=fingerprint)
        assert e.value.message == REFUSAL and e.value.path == path, str(e.value)
        assert "its tensors end at" in str(e.value)
    p = subprocess.run([sys.executable, "-m", "prequant_core", "verify", path, "--scheme", "int8", "--base", BASE_ID],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 2 and REFUSAL in p.stderr and "Z-Image-Turbo-INT8-trailing" in p.stderr, p.stderr[-2000:]


def test_a_gap_between_two_tensors_is_refused_naming_the_tensor_after_it(tmp_path):
    gap = _raw(tmp_path / "gap.safetensors", {"a": ([0, 8], [2]), "b": ([16, 24], [2])}, bytes(24))
    tiled = _raw(tmp_path / "tiled.safetensors", {"a": ([0, 8], [2]), "b": ([8, 16], [2])}, bytes(16))
    assert _library_refuses(gap) and not _library_refuses(tiled)
    with pytest.raises(CorruptCheckpointError) as e:
        report.info(gap)
    assert e.value.message == REFUSAL and "tensor 'b' at bytes 16..24" in str(e.value), str(e.value)
    overlap = _raw(tmp_path / "overlap.safetensors", {"a": ([0, 8], [2]), "b": ([4, 12], [2])}, bytes(12))
    with pytest.raises(CorruptCheckpointError) as e:
        report.info(overlap)
    assert e.value.message == "Two tensors in the safetensors file overlap.", str(e.value)
    from safetensors.torch import load_file
    r = report.info(tiled)  # the tiled file passes: described (no family, no quantized weight), not refused
    assert not r.valid and not any("bytes" in x for x in r.reasons), r.reasons
    assert torch.equal(load_file(tiled)["b"], torch.zeros(2))
