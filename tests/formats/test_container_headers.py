"""prequant_core/formats' first look at a file and its safetensors writer's refusals, on real files on disk: what a file
that is no checkpoint looks like (JSON text, a GGUF file, a Git LFS pointer), said without its bytes; a safetensors
header that runs past the end of the file, that is not a JSON object, or that declares an empty tensor with a huge
dimension; an unknown container name; a quantized root-level tensor, two tensors flattening to the same name and a
dtype safetensors cannot store, each refused with nothing left on disk; and the opened-file handle (its name for other
libraries, its repr, its reader's seek refusals). Core tier: no ComfyUI."""
from __future__ import annotations

import io
import json
import os

import pytest
import torch

from prequant_core import formats, schemes
from prequant_core.builder.writers import write_checkpoint
from prequant_core.errors import BuildError, CorruptCheckpointError
from prequant_core.formats import containers, file_handle
from prequant_core.formats.containers import safetensors_container as sc


def int8(rows=8, cols=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return schemes.quantize_weight(torch.randn(rows, cols, generator=g).bfloat16(), "int8")


@pytest.mark.parametrize("head,looks", [
    (b'{"error": "Repository not found", "detail": "x"}\n' * 3, "JSON text"),
    (b"GGUF\x03\x00\x00\x00" + bytes(range(200)), "a GGUF file (ComfyUI-GGUF's format)"),
    # what a clone without git-lfs leaves in place of the file (it used to read as "plain text": only 16 bytes
    # were looked at, fewer than the mark)
    (b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"0" * 64 + b"\nsize 12345678\n",
     "a Git LFS pointer (the file itself was not downloaded)"),
])
def test_a_file_that_is_no_checkpoint_is_described_not_quoted(tmp_path, head, looks):
    p = tmp_path / "model.safetensors"
    p.write_bytes(head)
    with pytest.raises(CorruptCheckpointError) as ei:
        formats.read(str(p))
    e = ei.value
    assert e.message == "Not a pre-quantized checkpoint: the file is neither a torch.save archive nor a safetensors file."
    assert e.found == f"{len(head)} bytes, {looks}" and e.path == str(p)
    assert "oid sha256" not in str(e) and "Repository not found" not in str(e)


def test_an_unknown_container_name_is_a_key_error():
    assert containers.by_name("pt").extension == ".pt"
    with pytest.raises(KeyError, match="zip"):
        containers.by_name("zip")


def write_raw(path, header, data=b"", declared=None):
    blob = json.dumps(header).encode() if not isinstance(header, bytes) else header
    n = len(blob) if declared is None else declared
    with open(path, "wb") as f:
        f.write(n.to_bytes(8, "little") + blob + data)
    return str(path)


def test_a_header_running_past_the_end_is_refused(tmp_path):
    p = write_raw(tmp_path / "cut.safetensors", {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},
                  declared=4000)
    with pytest.raises(CorruptCheckpointError) as ei:
        sc.read_header(p)
    e = ei.value
    size = os.path.getsize(p)
    assert e.message == "The safetensors header runs past the end of the file (truncated)."
    assert e.found == f"header 4000 bytes, file {size} bytes" and e.fix == "Download or build the file again."


def test_a_header_that_is_not_a_json_object_is_refused(tmp_path):
    p = write_raw(tmp_path / "list.safetensors", [1, 2, 3])
    with pytest.raises(CorruptCheckpointError) as ei:
        sc.read_header(p)
    assert ei.value.message == "The safetensors header is not a JSON object." and ei.value.path == p


def test_an_empty_tensor_with_a_huge_dimension_is_refused(tmp_path):
    p = write_raw(tmp_path / "huge.safetensors",
                  {"ok": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                   "x.weight": {"dtype": "F32", "shape": [0, 2**33], "data_offsets": [8, 8]}}, data=bytes(8))
    with pytest.raises(CorruptCheckpointError) as ei:
        sc.read_header(p)
    e = ei.value
    assert e.message == "Tensor 'x.weight' declares an empty shape with a huge dimension."
    assert e.found == f"F32 [0, {2**33}]"
    # an empty tensor of ordinary dimensions is fine
    p2 = write_raw(tmp_path / "empty.safetensors", {"x.weight": {"dtype": "F32", "shape": [0, 4096],
                                                                 "data_offsets": [0, 0]}})
    header, meta, _ = sc.read_header(p2)
    assert header["x.weight"]["shape"] == [0, 4096] and meta == {}


META = {"scheme": "int8"}


def test_a_quantized_root_level_tensor_is_refused_and_nothing_is_written(tmp_path):
    dest = str(tmp_path / "root.safetensors")
    with pytest.raises(BuildError) as ei:
        write_checkpoint(dest, {"a.weight": int8(), "proj": int8(seed=1)}, META)
    assert ei.value.message == "Root-level tensor 'proj' cannot be quantized."
    assert os.listdir(tmp_path) == []
    with pytest.raises(ValueError, match="root-level tensor 'proj' cannot be quantized"):  # the in-memory layout
        sc.flatten({"a.weight": int8(), "proj": int8(seed=1)}, format_tag="x", metadata={})


def test_two_tensors_flattening_to_one_name_are_refused(tmp_path):
    dest = str(tmp_path / "clash.safetensors")
    with pytest.raises(BuildError) as ei:
        write_checkpoint(dest, {"a.weight": int8(), "a._weight_qdata": torch.zeros(8, 32, dtype=torch.int8)}, META)
    assert ei.value.message == "Two tensors flatten to the same name 'a._weight_qdata'."
    assert os.listdir(tmp_path) == []


def test_a_dtype_safetensors_cannot_store_is_refused(tmp_path):
    dest = str(tmp_path / "complex.safetensors")
    with pytest.raises(BuildError) as ei:
        write_checkpoint(dest, {"a.weight": int8(), "b.freqs": torch.zeros(4, dtype=torch.complex64)}, META)
    assert ei.value.message == "Tensor 'b.freqs' has dtype torch.complex64, which safetensors cannot store."
    assert os.listdir(tmp_path) == []


def test_an_unknown_container_to_write_is_refused(tmp_path):
    with pytest.raises(BuildError) as ei:
        write_checkpoint(str(tmp_path / "x.gguf"), {"a.weight": int8()}, META, container="gguf")
    assert ei.value.message == "Unknown output container 'gguf'."
    assert (ei.value.expected, ei.value.found) == ("pt or safetensors", "gguf")
    assert os.listdir(tmp_path) == []


def test_the_opened_file_is_reached_by_its_handle_whatever_happens_to_its_name(tmp_path):
    p = tmp_path / "a.bin"
    p.write_bytes(bytes(range(100)))
    with file_handle.open_file(str(p)) as f:
        assert repr(f) == f"OpenedFile({str(p)!r})"
        io_name = os.fspath(f)
        assert io_name == f"/proc/self/fd/{f.fd}"
        os.rename(p, tmp_path / "b.bin")
        p.write_bytes(b"another file under the old name")
        with open(f, "rb") as again:  # a library that takes a name reads the file that was opened
            assert again.read() == bytes(range(100))
        r = f.reader()
        assert r.seek(-10, io.SEEK_END) == 90 and r.read() == bytes(range(90, 100))
        with pytest.raises(OSError) as neg:
            r.seek(-1)
        assert "negative seek position" in str(neg.value)
        with pytest.raises(ValueError, match="invalid whence 7"):
            r.raw.seek(0, 7)
        assert r.seek(5) == 5 and r.read(3) == bytes([5, 6, 7])


def test_a_git_lfs_pointer_is_named_so_by_the_command_line_in_a_fresh_process(tmp_path):
    """What a user meets first: ``python -m prequant_core info`` on the pointer a clone without git-lfs leaves, in a
    process of its own (nothing imported before the reader)."""
    import subprocess
    import sys
    from conftest import ROOT
    p = tmp_path / "Z-Image-Turbo-FP8.safetensors"
    p.write_bytes(b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"0" * 64 + b"\nsize 12345678\n")
    r = subprocess.run([sys.executable, "-m", "prequant_core", "info", str(p)], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert f"File: {p}" in r.stderr and "a Git LFS pointer (the file itself was not downloaded)" in r.stderr, r.stderr
