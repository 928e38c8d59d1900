"""The memory guard (prequant_core/memory_check.py): refuse before reading when the declared size cannot fit.

No memory pressure is faked by mocking: budgets are injected through ``memory_check.Guard(available=..., device_free=...)``
(the module's documented test seam), and the end-to-end cases use tiny files whose indexes *declare* more bytes than
this machine has (RAM + swap, read from psutil), so the real default budget refuses them.
"""
from __future__ import annotations

import io
import math
import os
import struct
import zipfile

import psutil
import pytest
import torch

from prequant_core import errors, formats
from prequant_core.load import memory_check
from prequant_core.load.opening import open_checkpoint
from prequant_core.units import human_bytes

FAKE_RECORD = 0xFFFFFFF0  # what each patched storage record claims (just under 4 GiB, no zip64 needed)


def declare_huge(src: bytes, *, at_least: int) -> bytes:
    """A copy of a torch.save archive whose central directory claims ~4 GiB per storage record, with enough records
    to exceed ``at_least`` bytes in total. The bytes themselves stay tiny (nothing else changes)."""
    z = zipfile.ZipFile(io.BytesIO(src))
    data_records = [i for i in z.infolist() if "/data/" in i.filename]
    assert data_records
    need = math.ceil(at_least / FAKE_RECORD) + 1
    if need > len(data_records):
        raise ValueError(f"need {need} storage records, the archive has {len(data_records)}")
    targets = {i.filename for i in data_records[:need]}
    buf = bytearray(src)
    pos = buf.find(b"PK\x01\x02")
    while pos != -1:
        name_len, extra_len, comment_len = struct.unpack_from("<HHH", buf, pos + 28)
        name = bytes(buf[pos + 46: pos + 46 + name_len]).decode()
        if name in targets:
            struct.pack_into("<I", buf, pos + 24, FAKE_RECORD)
        pos = buf.find(b"PK\x01\x02", pos + 46 + name_len + extra_len + comment_len)
    return bytes(buf)


def machine_budget() -> int:
    return psutil.virtual_memory().available + psutil.swap_memory().free


def many_storages_pt(n: int) -> bytes:
    from prequant_core import schemes
    from prequant_core.formats.checkpoint import FORMAT_V1
    sd = {"layers.0.attention.to_q.weight": schemes.quantize_weight(torch.randn(32, 32).bfloat16(), "int8")}
    sd.update({f"layers.{i}.attention_norm1.weight": torch.ones(4) for i in range(n)})
    buf = io.BytesIO()
    torch.save({"format": FORMAT_V1, "metadata": {"family": "z-image"}, "state_dict": sd}, buf)
    return buf.getvalue()


@pytest.fixture
def folder(tmp_path):
    return tmp_path


def test_declared_bytes_match_the_index(prequant_files):
    for container in ("safetensors", "pt"):
        path = prequant_files("int8", container)
        declared = memory_check.declared_bytes(path)
        ck = formats.read(path)
        # codes + scales + plain tensors (+ int8's zero points): at least what the model holds, at most the file
        assert ck.nbytes() <= declared <= os.path.getsize(path), (container, declared, ck.nbytes())
        assert declared - ck.nbytes() < 0.05 * declared
    st = prequant_files("int8", "safetensors")
    with open(st, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
    assert memory_check.declared_bytes(st) == os.path.getsize(st) - 8 - header_len  # our writer leaves no gaps


def test_host_budget_boundary(prequant_files):
    path = prequant_files("int8", "safetensors")
    declared = memory_check.declared_bytes(path)
    needed = declared + memory_check.Guard().headroom
    ok = open_checkpoint(path, model_dirs=[os.path.dirname(path)],
                         memory=memory_check.Guard(available=lambda: needed))
    assert ok.family.name == "z-image"
    with pytest.raises(errors.MemoryBudgetError) as e:
        open_checkpoint(path, model_dirs=[os.path.dirname(path)],
                        memory=memory_check.Guard(available=lambda: needed - 1))
    err = e.value
    assert err.where == "host" and err.needed == needed and err.available == needed - 1
    text = str(err)
    assert os.path.basename(path) in text and human_bytes(needed) in text and human_bytes(needed - 1) in text
    assert "Free memory" in err.fix and "smaller" in err.fix and memory_check.ENV_VAR in err.fix


def test_refused_before_any_tensor_is_read(prequant_files, folder):
    """The guard runs on the index alone: a file whose tensor bytes are garbage is refused for memory, not corrupt."""
    src = open(prequant_files("fp8", "safetensors"), "rb").read()
    n = int.from_bytes(src[:8], "little")
    bad = folder / "garbage-data.safetensors"
    bad.write_bytes(src[: 8 + n] + b"\xff" * (len(src) - 8 - n))
    with pytest.raises(errors.MemoryBudgetError):
        open_checkpoint(str(bad), model_dirs=[str(folder)], memory=memory_check.Guard(available=lambda: 1))


def test_opt_out(prequant_files, monkeypatch):
    path = prequant_files("int8", "pt")
    tiny = memory_check.Guard(available=lambda: 1)
    with pytest.raises(errors.MemoryBudgetError):
        open_checkpoint(path, model_dirs=[os.path.dirname(path)], memory=tiny)
    assert open_checkpoint(path, model_dirs=[os.path.dirname(path)], memory=None).verdict.ok
    monkeypatch.setenv(memory_check.ENV_VAR, "0")
    assert open_checkpoint(path, model_dirs=[os.path.dirname(path)], memory=tiny).verdict.ok
    assert memory_check.check_file(path, tiny) is None


def test_device_rule(prequant_files):
    path = prequant_files("fp8", "safetensors")
    declared = memory_check.declared_bytes(path)
    plenty = lambda: 2**50  # noqa: E731

    def never(_device):
        raise AssertionError("the device budget was consulted for a CPU load")
    assert memory_check.check(path, declared, memory_check.Guard(device="cpu", available=plenty, device_free=never)).device is None
    assert memory_check.check(path, declared, memory_check.Guard(device=None, available=plenty, device_free=never))

    short = memory_check.Guard(device="cuda:0", available=plenty, device_free=lambda d: declared - 1)
    with pytest.raises(errors.MemoryBudgetError) as e:
        memory_check.check(path, declared, short)
    assert e.value.where == "device" and "cuda:0" in str(e.value) and "low-VRAM" in e.value.fix
    # streamed weights (ComfyUI's low-VRAM / normal modes): only the host must hold the model
    assert memory_check.check(path, declared, memory_check.Guard(device="cuda:0", lowvram=True, available=plenty,
                                                     device_free=lambda d: 0)).device is None
    # memory the caller frees first (other models it unloads) counts
    b = memory_check.check(path, declared, memory_check.Guard(device=torch.device("cuda", 0), available=plenty,
                                                  device_free=lambda d: declared - 10, device_reclaimable=10))
    assert b.device_needed == declared and b.device_available == declared
    # the host rule still applies to GPU loads (the offload copy lives in host memory)
    with pytest.raises(errors.MemoryBudgetError) as e:
        memory_check.check(path, declared, memory_check.Guard(device="cuda:0", available=lambda: 0, device_free=lambda d: 2**50))
    assert e.value.where == "host"


def test_default_budget_is_the_real_machine(prequant_files):
    b = memory_check.check_file(prequant_files("int8", "safetensors"))
    assert b is not None and b.host_available > b.host_needed
    now = machine_budget()  # same source a moment later (other processes on the machine move it a little)
    assert abs(b.host_available - now) < max(2**31, now // 4)


def test_tiny_file_declaring_more_than_the_machine_has(folder):
    """Real psutil, no injection: a few-KB .pt whose archive index claims more than RAM + swap is refused."""
    src = many_storages_pt(int(machine_budget() / FAKE_RECORD) + 8)
    huge = folder / "claims-terabytes.pt"
    huge.write_bytes(declare_huge(src, at_least=machine_budget() + 2**30))
    assert os.path.getsize(huge) < 2**20
    with pytest.raises(errors.MemoryBudgetError) as e:
        open_checkpoint(str(huge), model_dirs=[str(folder)])
    assert "claims-terabytes.pt" in str(e.value) and e.value.needed > machine_budget()
    # without the guard the reader reads the same file as the damaged archive it is: still a clear error
    with pytest.raises(errors.PrequantError) as e2:
        open_checkpoint(str(huge), model_dirs=[str(folder)], memory=None)
    assert not isinstance(e2.value, errors.MemoryBudgetError)


def test_safetensors_cannot_declare_more_than_it_holds(folder):
    """safetensors offsets are checked against the file size before the guard uses them: a tiny file claiming a
    10 TB tensor is corrupt, not a memory question."""
    import json
    header = json.dumps({"w": {"dtype": "F32", "shape": [2**40, 10], "data_offsets": [0, 2**42 * 10]}}).encode()
    p = folder / "claims.safetensors"
    p.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 64)
    with pytest.raises(errors.CorruptCheckpointError):
        open_checkpoint(str(p), model_dirs=[str(folder)])


def test_loader_node_refuses_with_the_real_budget(comfy, folder):
    """The node path (plan -> open_checkpoint -> guard) with the machine's real memory: refused, nothing loaded."""
    import folder_paths
    nodes, _ = comfy
    target = folder_paths.get_folder_paths("prequant")[0]
    src = many_storages_pt(int(machine_budget() / FAKE_RECORD) + 8)
    name = "claims-more-than-ram-INT8.pt"
    path = os.path.join(target, name)
    with open(path, "wb") as f:
        f.write(declare_huge(src, at_least=machine_budget() + 2**30))
    try:
        with torch.inference_mode(), pytest.raises(errors.MemoryBudgetError) as e:
            nodes.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]().load(name)
        assert name in str(e.value) and "Fix:" in str(e.value)
    finally:
        os.unlink(path)
