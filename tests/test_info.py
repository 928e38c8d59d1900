"""Prequant Info: the report (core), the command line (info / verify) and the node, on real files.

Reads are measured, not assumed: ``/proc/self/io`` rchar counts every byte the process read through read(2), and
the page cache residency of the file (mincore(2) after dropping its cached pages) counts what was paged in by any
means, memory maps included (safetensors and torch.load(mmap=True) read through maps, which rchar does not see).
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import mmap
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import BASE_ID, ROOT
from prequant_core import cli, errors, formats, schemes
from prequant_core.formats.checkpoint import FORMAT_V1, FORMAT_V2, FORMAT_V3
from prequant_core.formats.containers import safetensors_container as sc
from prequant_core.report import READ_FULL, READ_HEADER, READ_MMAP, info
from prequant_core.load.metadata import Request
from tools import tiny_models

NONE = "(none: use path or hub_repo)"
MiB = 2**20


# ---- measuring reads -------------------------------------------------------------------------------------------

def rchar() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


def drop_cache(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages cannot be dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def resident_bytes(path) -> int:
    """Bytes of ``path`` in the page cache (mapping it to ask does not fault anything in)."""
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = ctypes.create_string_buffer(pages)
        try:
            assert _libc.mincore(addr, size, vec) == 0, ctypes.get_errno()
        finally:
            _libc.munmap(addr, size)
        return sum(b & 1 for b in vec.raw) * mmap.PAGESIZE
    finally:
        os.close(fd)


def measured(fn, path):
    """(result, bytes read via read(2), bytes of the file paged in) for one call, starting from a cold cache."""
    drop_cache(path)
    before = resident_bytes(path)
    r0 = rchar()
    out = fn()
    r1 = rchar()
    return out, r1 - r0, max(0, resident_bytes(path) - before)


# ---- files -----------------------------------------------------------------------------------------------------

def rewrite_header(src, dst, edit) -> str:
    """Copy a safetensors file with its header JSON changed by ``edit(header)`` (tensor bytes unchanged)."""
    with open(src, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    edit(header)
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(dst, "wb") as f:
        f.write(len(blob).to_bytes(8, "little") + blob + data)
    return str(dst)


def tensor_bytes_from_reader(ck) -> tuple[int, int, int]:
    """(quantized stored bytes, dense bytes, dense-equivalent bytes) from fully read tensors."""
    q = d = 0
    for t in ck.tensors.values():
        if hasattr(t, "qdata"):
            parts = [t.qdata, t.scale] + ([t.zero_point] if getattr(t, "zero_point", None) is not None else [])
            q += sum(p.numel() * p.element_size() for p in parts)
        else:
            d += t.numel() * t.element_size()
    return q, d, ck.dense_nbytes()


# ---- the report on every kind ----------------------------------------------------------------------------------

@pytest.mark.parametrize("container", ["safetensors", "pt"])
@pytest.mark.parametrize("scheme", ["int8", "fp8"])
def test_report_of_every_kind(prequant_files, scheme, container):
    import diffusers
    import torchao
    path = prequant_files(scheme, container)
    r = info(path)
    full = formats.read(path)  # the real reader, every byte: the report must agree with it exactly

    assert r.container == container and r.read_mode == (READ_HEADER if container == "safetensors" else READ_MMAP)
    assert r.format_tag == FORMAT_V1 and r.scheme == scheme and r.schemes_found == [scheme]
    assert (r.family, r.layout, r.transformer_class) == ("z-image", "diffusers", "ZImageTransformer2DModel")
    assert r.base_model_id == BASE_ID and r.component == "transformer"
    assert r.quantized_count == len(full.quantized_keys) > 0
    assert r.dense_count == len(full.tensors) - len(full.quantized_keys) > 0
    assert (r.quantized_bytes, r.dense_bytes, r.dense_equivalent_bytes) == tensor_bytes_from_reader(full)
    assert r.total_bytes < r.dense_equivalent_bytes
    assert r.saving_pct == round(100 * (1 - r.total_bytes / r.dense_equivalent_bytes), 1)
    assert 40 < r.saving_pct < 50  # int8/fp8 codes are half of bf16; scales and dense tensors eat a little
    if container == "safetensors":
        _, _, header_len = sc.read_header(path)
        assert r.total_bytes == os.path.getsize(path) - 8 - header_len  # every stored byte accounted for
    assert (r.torch_version, r.torchao_version, r.diffusers_version) == (
        str(torch.__version__), str(torchao.__version__), str(diffusers.__version__))
    assert r.min_features == schemes.DEFAULT_MIN_FEATURES
    assert r.exclude_tokens == schemes.exclude_tokens(scheme)
    assert r.fingerprint_present and r.fingerprint_algo == "md5-packed-v1"
    assert r.fingerprint_count == r.quantized_count and r.fingerprint_verified is None
    assert r.valid and r.reasons == [] and r.request is None

    d = json.loads(json.dumps(r.to_dict()))  # JSON-able, and the same numbers
    assert d["verdict"] == {"ok": True, "reasons": [], "requested": None, "summary": r.verdict_line()}
    assert d["total_bytes"] == r.total_bytes and d["saving_pct"] == r.saving_pct and d["file"] == os.path.basename(path)
    text = r.to_text()
    assert re.search(rf"\n  Scheme +{scheme}\n", text), text
    for needle in (FORMAT_V1, BASE_ID, "z-image (diffusers keys)",
                   f"{r.quantized_count} tensors", f"{r.saving_pct:.1f} %", f"torchao {torchao.__version__}",
                   "not verified", "VALID"):
        assert needle in text, (needle, text)
    assert [row[0] for row in d["rows"]] == ["File", "Format", "Scheme", "Family", "Base model", "Component",
                                             "Quantized tensors", "Unquantized tensors", "Tensor bytes",
                                             "Dense model", "Versions", "min_features", "Excluded names",
                                             "Fingerprint"]
    rows = dict(d["rows"])
    # the terms say which is which: the quantized / unquantized tensors of this file vs the whole dense model, and
    # what the file holds beyond its tensors
    assert rows["Quantized tensors"].startswith(f"{r.quantized_count} tensors, ")
    assert rows["Unquantized tensors"].startswith(f"{r.dense_count} tensors, ")
    assert "quantized + unquantized" in rows["Tensor bytes"] and "header / index" in rows["Tensor bytes"]
    assert r.file_size > r.total_bytes and "on disk" in rows["File"]
    assert "every tensor unquantized" in rows["Dense model"] and f"{r.saving_pct:.1f} %" in rows["Dense model"]
    # what was read, and how to ask for the fingerprint check (by the toggle's name)
    assert ("header only" if container == "safetensors" else "index only") in rows["Format"]
    assert "full read" not in rows["Format"]
    assert any("verify_fingerprint" in n and "--verify-fingerprint" in n for n in r.notes), r.notes


def test_report_of_comfyui_key_layout(comfy, prequant_files):
    r = info(prequant_files("int8", "safetensors", "comfyui"))
    assert r.layout == "comfyui" and r.family == "z-image" and r.valid and r.read_mode == READ_HEADER
    assert any("attention.qkv" in k for k in formats.read(r.path).quantized_keys)


def test_comfyui_native_twin_goes_through_its_full_reader(comfy, zimage_dense, tmp_path):
    """A kind the header path does not understand is handed to the reader that does, and says so."""
    from safetensors.torch import save_file
    dense = tiny_models.zimage_comfy_layout(zimage_dense)
    sd = {k: v.contiguous() for k, v in dense.items()}
    layers = [k[: -len(".weight")] for k, v in dense.items() if k.endswith(".weight") and v.ndim == 2
              and min(v.shape) >= 512 and not any(t in k for t in schemes.int8.BASE_EXCLUDE)]
    assert layers
    for layer in layers:
        w = dense[layer + ".weight"].float()
        s = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0
        sd[layer + ".weight"] = torch.round(w / s).clamp(-127, 127).to(torch.int8)
        sd[layer + ".weight_scale"] = s
        sd[layer + ".comfy_quant"] = torch.tensor(list(b'{"format": "int8_tensorwise"}'), dtype=torch.uint8)
    path = str(tmp_path / "Z-Image-Turbo-INT8-ComfyUI.safetensors")
    save_file(sd, path)
    r = info(path)
    assert (r.container, r.read_mode, r.layout, r.scheme) == ("comfyui-native", READ_FULL, "comfyui", "int8")
    assert r.quantized_count == len(layers) and r.format_tag is None
    assert r.to_dict()["container"] == "comfyui-native" and "full read" in r.to_text()


# ---- verdicts --------------------------------------------------------------------------------------------------

def test_verdicts_against_a_request(prequant_files):
    path = prequant_files("int8", "safetensors")
    ok = info(path, Request(base_model_id="z-image-turbo", scheme="int8", family="z-image", min_features=512))
    assert ok.valid and ok.reasons == []
    assert ok.request == {"base_model_id": "z-image-turbo", "scheme": "int8", "family": "z-image", "min_features": 512}
    assert ok.verdict_line().startswith("VALID for base_model_id 'z-image-turbo', scheme 'int8'")

    bad = info(path, {"base_model_id": "black-forest-labs/FLUX.1-dev", "scheme": "fp8", "min_features": 256})
    assert not bad.valid and len(bad.reasons) == 3, bad.reasons  # every mismatch at once
    assert any("scheme is 'int8', requested 'fp8'" in r for r in bad.reasons)
    assert any("requested 'black-forest-labs/FLUX.1-dev'" in r for r in bad.reasons)
    assert any("min_features is 512, requested 256" in r for r in bad.reasons)
    text = bad.to_text()
    assert "INVALID for" in text and all(f"- {r}" in text for r in bad.reasons)
    d = bad.to_dict()
    assert d["verdict"]["ok"] is False and d["verdict"]["reasons"] == bad.reasons
    assert d["verdict"]["requested"]["scheme"] == "fp8"

    with pytest.raises(errors.UnknownFamilyError):
        info(path, Request(family="not-a-family"))
    with pytest.raises(errors.ValidationError, match="Unknown quantization scheme"):
        info(path, Request(scheme="int3"))


def test_dense_checkpoint(zimage_dense, tmp_path):
    path = tiny_models.save_dense_safetensors(zimage_dense, str(tmp_path / "dense.safetensors"))
    r = info(path)
    assert not r.valid and any("no quantized weights" in x for x in r.reasons)
    assert r.quantized_count == 0 and r.dense_count == len(zimage_dense) and r.saving_pct == 0.0
    assert r.format_tag is None and r.family == "z-image" and r.scheme is None and not r.fingerprint_present
    assert r.dense_bytes == sum(v.numel() * v.element_size() for v in zimage_dense.values())


@pytest.mark.parametrize("tag,feature,container", [(FORMAT_V2, "activation_rotation", "safetensors"),
                                                   (FORMAT_V3, "nvfp4_policy", "pt")])
def test_refused_format_tags_are_an_invalid_verdict(prequant_files, tmp_path, tag, feature, container):
    src = prequant_files("int8", container)
    dst = tmp_path / f"tagged.{container}"
    if container == "safetensors":
        rewrite_header(src, dst, lambda h: h["__metadata__"].update(unsloth_format=tag))
    else:
        from prequant_core.formats.containers.pt import load_weights_only
        obj = load_weights_only(src, mmap=True)
        obj["format"] = tag
        torch.save(obj, dst)
    r = info(dst)
    assert r.format_tag == tag and not r.valid and r.quantized_count > 0
    assert any(feature in x for x in r.reasons), r.reasons
    assert r.read_mode in (READ_HEADER, READ_MMAP)


def _truncate(src, dst, keep):
    with open(src, "rb") as f:
        data = f.read(keep)
    with open(dst, "wb") as f:
        f.write(data)
    return str(dst)


@pytest.mark.parametrize("case", ["st-data", "st-header", "pt-half", "empty", "garbage", "missing"])
def test_broken_files_raise_typed_errors(prequant_files, tmp_path, case):
    st, pt = prequant_files("int8", "safetensors"), prequant_files("int8", "pt")
    dst = tmp_path / "broken.bin"
    expected = errors.CorruptCheckpointError
    if case == "st-data":
        _truncate(st, dst, os.path.getsize(st) // 2)
    elif case == "st-header":
        _truncate(st, dst, 200)
    elif case == "pt-half":
        _truncate(pt, dst, os.path.getsize(pt) // 2)
    elif case == "empty":
        dst.write_bytes(b"")
    elif case == "garbage":
        dst.write_bytes(b"<html>404 Not Found</html>" * 40)
    else:
        expected = errors.CheckpointNotFoundError
    with pytest.raises(expected) as e:
        info(dst)
    assert isinstance(e.value, errors.PrequantError) and str(dst) in str(e.value)


# ---- fingerprint verification reads the data, only when asked ----------------------------------------------------

@pytest.mark.parametrize("container", ["safetensors", "pt"])
def test_fingerprint_verification(prequant_files, tmp_path, container):
    path = prequant_files("fp8", container)
    r = info(path, verify_fingerprint=True)
    assert r.fingerprint_verified is True and r.valid and r.fingerprint_reasons == []
    assert "verified" in dict(r.rows())["Fingerprint"]
    # the Format row says the weights were read too, and why
    assert "full read" in dict(r.rows())["Format"] and "verify_fingerprint" in dict(r.rows())["Format"]
    assert not any("not verified" in n for n in r.notes)
    if container != "safetensors":
        return
    # flip bytes inside one quantized weight's codes; the header stays as it was
    index, _, n = sc.read_header(path)
    key = sorted(k for k in index if k.endswith("._weight_qdata"))[0]
    start = 8 + n + index[key]["data_offsets"][0]
    bad = tmp_path / "tampered.safetensors"
    shutil.copy(path, bad)
    with open(bad, "r+b") as f:
        f.seek(start + 100)
        chunk = f.read(64)
        f.seek(start + 100)
        f.write(bytes(b ^ 0x55 for b in chunk))
    assert info(bad).valid  # the header alone cannot tell
    v = info(bad, verify_fingerprint=True)
    assert v.fingerprint_verified is False and not v.valid
    layer = key[: -len("._weight_qdata")] + ".weight"
    assert any("1 weights differ" in x and layer in x for x in v.reasons), v.reasons
    assert "MISMATCH" in v.to_text()


# ---- what is read ------------------------------------------------------------------------------------------------

def _big_prequant_file(path, n=16384, layers=4) -> tuple[str, dict]:
    """A real pre-quantized int8 safetensors of ~1 GiB: the header our builder writes, sparse zero data.

    The fingerprint is the true one for all-zero weights, so verification has something real to confirm.
    """
    proto = schemes.quantize_weight(torch.randn(64, 32, dtype=torch.bfloat16), "int8")
    _, hdr = sc.flatten({"x.weight": proto}, format_tag=FORMAT_V1, metadata={})
    entry = json.loads(hdr["x.weight"])
    entry["_data"]["block_size"] = [1, n]
    h = hashlib.md5()  # Unsloth's md5-packed-v1 of an Int8Tensor: each part's name, then its bytes
    zeros = bytes(16 * MiB)
    h.update(b"qdata")
    for _ in range(n * n // len(zeros)):
        h.update(zeros)
    h.update(b"scale")
    h.update(bytes(n * 4))  # float32 scales, all zero
    h.update(b"zero_point")
    h.update(bytes(n))  # int8 zero points
    header, meta, names, off = {}, {}, [], 0
    for i in range(layers):
        fqn = f"layers.{i}.attention.to_q"
        names.append(fqn + ".weight")
        meta[fqn + ".weight"] = json.dumps(entry)
        for part, dtype, shape, size in (("qdata", "I8", [n, n], n * n), ("scale", "F32", [n, 1], 4 * n),
                                         ("zero_point", "I8", [n, 1], n)):
            header[f"{fqn}._weight_{part}"] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + size]}
            off += size
    meta.update(tensor_names=json.dumps(names), unsloth_format=FORMAT_V1, unsloth_root_tensors="[]",
                unsloth_metadata=json.dumps({
                    "scheme": "int8", "base_model_id": BASE_ID, "family": "z-image", "component": "transformer",
                    "fingerprint": {"algo": "md5-packed-v1", "count": layers,
                                    "modules": {k: h.hexdigest() for k in names}, "skipped": []}}))
    header["__metadata__"] = meta
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little") + blob)
        f.truncate(8 + len(blob) + off)  # sparse: written in milliseconds, no disk used
    return str(path), header


def test_one_gigabyte_safetensors_reads_under_one_megabyte(tmp_path):
    path, _ = _big_prequant_file(tmp_path / "Big-INT8.safetensors")
    try:
        size = os.path.getsize(path)
        assert size > 2**30
        info(path)  # warm-up: lazy imports read .py files, which would count
        r, read, paged = measured(lambda: info(path, {"base_model_id": BASE_ID, "scheme": "int8"}), path)
        print(f"\n[info] {size} byte file: {read} bytes read(2), {paged} bytes paged in")
        assert read < MiB and paged < MiB, (read, paged)
        assert r.valid and r.read_mode == READ_HEADER and r.quantized_count == 4 and r.total_bytes > 2**30
        assert r.dense_equivalent_bytes == 4 * 16384 * 16384 * 2

        # the measurement sees reads through memory maps: verification pages in the whole file, and confirms it
        v, read_v, paged_v = measured(lambda: info(path, verify_fingerprint=True), path)
        print(f"[verify] {read_v} bytes read(2), {paged_v} bytes paged in")
        assert paged_v >= 2**30 and v.fingerprint_verified is True and v.valid
    finally:
        os.unlink(path)


def test_pt_reads_only_its_index(prequant_files):
    path = prequant_files("int8", "pt")
    info(path)
    r, read, paged = measured(lambda: info(path), path)
    size = os.path.getsize(path)
    print(f"\n[info .pt] {size} byte file: {read} bytes read(2), {paged} bytes paged in")
    assert r.read_mode == READ_MMAP and r.quantized_count > 0
    assert read < MiB and paged < size // 20, (read, paged, size)


# ---- command line ------------------------------------------------------------------------------------------------

def test_cli_info_json_runs_as_a_module(prequant_files):
    path = prequant_files("int8", "safetensors")
    p = subprocess.run([sys.executable, "-m", "prequant_core", "info", path, "--json"], cwd=ROOT,
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-2000:]
    d = json.loads(p.stdout)
    assert d == json.loads(json.dumps(info(path).to_dict()))
    assert d["scheme"] == "int8" and d["container"] == "safetensors" and d["verdict"]["ok"] is True


def test_cli_info_and_verify(prequant_files, capsys, tmp_path):
    path = prequant_files("fp8", "pt")
    assert cli.main(["info", path]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Prequant Info: ") and re.search(r"\n  Scheme +fp8\n", out)

    assert cli.main(["info", path, "--verify-fingerprint"]) == 0
    assert "fp8" in capsys.readouterr().out

    assert cli.main(["verify", path, "--base", BASE_ID, "--scheme", "fp8", "--min-features", "512",
                     "--family", "z-image"]) == 0
    assert "VALID for" in capsys.readouterr().out

    assert cli.main(["verify", path, "--base", "Qwen/Qwen-Image", "--scheme", "int8"]) == 1
    out = capsys.readouterr().out
    assert "INVALID for" in out and "requested 'int8'" in out and "requested 'Qwen/Qwen-Image'" in out

    assert cli.main(["verify", str(tmp_path / "missing.pt"), "--base", BASE_ID, "--scheme", "fp8"]) == 2
    assert "error: Checkpoint file not found" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # an argument error, answered before anything is read
        cli.main(["verify", path, "--base", BASE_ID, "--scheme", "int3"])
    assert e.value.code == 2 and "unknown quantization scheme 'int3'" in capsys.readouterr().err

    for cmd, options in (("info", ["FILE", "--json", "--verify-fingerprint"]),
                         ("verify", ["FILE", "--base", "--scheme", "--min-features", "--family",
                                     "--verify-fingerprint", "--json"])):
        with pytest.raises(SystemExit) as e:
            cli.main([cmd, "--help"])
        assert e.value.code == 0
        help_text = capsys.readouterr().out
        assert all(o in help_text for o in options), help_text
    with pytest.raises(SystemExit) as e:  # --base and --scheme are required
        cli.main(["verify", path])
    assert e.value.code == 2


# ---- the node on the real ComfyUI --------------------------------------------------------------------------------

def test_info_node(comfy, models_dir, prequant_files, allow_dir, tmp_path, monkeypatch):
    nodes, _ = comfy
    assert nodes.NODE_DISPLAY_NAME_MAPPINGS["PrequantInfo"] == "Prequant Info"
    cls = nodes.NODE_CLASS_MAPPINGS["PrequantInfo"]
    assert cls.OUTPUT_NODE is True and cls.CATEGORY == "loaders/prequant" and cls.RETURN_TYPES == ("STRING",)
    src = prequant_files("int8", "safetensors")
    name = "Info-Test-INT8.safetensors"
    dest = os.path.join(models_dir, "prequant", name)
    shutil.copy(src, dest)
    try:
        spec = cls.INPUT_TYPES()
        assert name in spec["required"]["checkpoint"][0]
        assert {"path", "base_model_id", "scheme", "verify_fingerprint"} <= set(spec["optional"])
        # Info's texts name only inputs Info has: its list starts with its own "(none: use path)", and no
        # tooltip, description or choice mentions the loader's hub_repo / preset
        assert spec["required"]["checkpoint"][0][0] == "(none: use path)"
        own = set(spec["required"]) | set(spec["optional"])
        texts = json.dumps([cls.DESCRIPTION, spec])
        for other in ("hub_repo", "preset", "download_to", "dense_fallback"):
            assert other not in own and other not in texts, other
        # an earlier workflow's "(none: use path or hub_repo)" still passes the node's list check
        assert cls.VALIDATE_INPUTS(NONE) is True and cls.VALIDATE_INPUTS("(none: use path)") is True
        assert cls.VALIDATE_INPUTS(name) is True and cls.VALIDATE_INPUTS("nope.safetensors") is not True
        with torch.inference_mode():  # as ComfyUI runs every node
            out = cls().inspect(name, base_model_id=BASE_ID, scheme="int8")
        ui = json.loads(json.dumps(out["ui"]))  # what the server sends the browser must be JSON
        report, text = ui["prequant_info"][0], ui["text"][0]
        assert out["result"] == (text,) and text == info(dest, Request(base_model_id=BASE_ID, scheme="int8")).to_text()
        assert report["verdict"]["ok"] is True and report["scheme"] == "int8" and report["file"] == name

        wrong = cls().inspect(name, base_model_id="Qwen/Qwen-Image", scheme="fp8")["ui"]["prequant_info"][0]
        assert wrong["verdict"]["ok"] is False and len(wrong["verdict"]["reasons"]) == 2

        # an explicit path obeys the loader's allowlist
        outside = tmp_path / "elsewhere"
        outside.mkdir()
        shutil.copy(src, outside / "x.safetensors")
        monkeypatch.delenv("PREQUANT_ALLOW_LOCAL_PATH", raising=False)
        monkeypatch.delenv("UNSLOTH_ALLOW_LOCAL_PREQUANT_PATH", raising=False)
        with pytest.raises(errors.PathNotAllowedError):
            cls().inspect(NONE, path=str(outside / "x.safetensors"))
        allow_dir(outside)
        ok = cls().inspect(NONE, path=str(outside / "x.safetensors"))
        assert ok["ui"]["prequant_info"][0]["verdict"]["ok"] is True
        with pytest.raises(errors.PrequantError, match="No checkpoint chosen"):
            cls().inspect(NONE)
        with pytest.raises(errors.PrequantError, match="No checkpoint chosen"):
            cls().inspect("(none: use path)")
    finally:
        os.unlink(dest)
