"""NaN (and e5m2 infinite) float8 codes under a finite scale: refused naming the tensor and the row, in every float8
weight (Unsloth's fp8, MXFP8 elements; ComfyUI-native e4m3 / e5m2 in tests/formats/test_comfy_native.py). The scan reads
eight bytes at a time (prequant_core.schemes.codec.first_special_row) over the storage run the codes occupy, whatever
the layout (row-major, a ``.pt``'s transposed weight, an odd storage offset: issue 58): held here against the
byte-by-byte rule for every alignment, width and layout. Core tier: no ComfyUI."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

import unsloth_builder as ub
from prequant_core.formats.containers.pt import load_weights_only
from prequant_core import formats
from prequant_core.formats import validate_tensors
from prequant_core.errors import CorruptCheckpointError
from prequant_core.schemes import codec

DTYPES = [torch.float8_e4m3fn, torch.float8_e5m2]


def _naive(b: torch.Tensor, dtype) -> int | None:
    mask = 0x7F if dtype == torch.float8_e4m3fn else 0x7C
    bad = ((b & mask) == mask).any(dim=1).nonzero()
    return int(bad[0, 0]) if bad.numel() else None


def _finite_bytes(n: int, dtype, seed: int = 0) -> torch.Tensor:
    """Random float8 codes with the special ones cleared."""
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (n,), generator=g, dtype=torch.int32).to(torch.uint8)
    mask = 0x7F if dtype == torch.float8_e4m3fn else 0x7C
    raw[(raw & mask) == mask] ^= 0x04 if dtype == torch.float8_e4m3fn else 0x08
    return raw


def _view(raw: torch.Tensor, offset: int, rows: int, cols: int, transposed: bool) -> torch.Tensor:
    """(rows, cols) codes at ``offset`` in ``raw``: row-major, or as a ``.pt`` holding the transpose stores them
    (storage (cols, rows), the view ``.t()``)."""
    run = raw[offset:offset + rows * cols]
    return run.view(cols, rows).t() if transposed else run.view(rows, cols)


@settings(max_examples=300, deadline=None)
@given(rows=st.integers(1, 9), cols=st.integers(1, 40), offset=st.integers(0, 7), seed=st.integers(0, 2 ** 31),
       plant=st.lists(st.tuples(st.integers(0, 8), st.integers(0, 39), st.integers(0, 255)), max_size=3),
       e5m2=st.booleans(), transposed=st.booleans())
def test_the_word_scan_finds_exactly_the_rows_the_byte_rule_finds(rows, cols, offset, seed, plant, e5m2, transposed):
    dtype = DTYPES[e5m2]
    # finite codes, then a few planted bytes (special or not); a NaN code just outside the view on both sides, in
    # the same storage: never the view's, so never reported
    raw = _finite_bytes(offset + rows * cols + 1, dtype, seed)
    raw[-1] = 0xFF
    if offset:
        raw[offset - 1] = 0xFF
    b = _view(raw, offset, rows, cols, transposed)  # an address and a width of any alignment, either layout
    for r, c, v in plant:
        if r < rows and c < cols:
            b[r, c] = v
    got = codec.first_special_row(b, dtype)
    want = _naive(b, dtype)
    assert (got[0] if got else None) == want
    assert validate_tensors.fp8_all_finite(b.view(dtype)) == (want is None)


@pytest.mark.parametrize("transposed", [False, True], ids=["row-major", "transposed"])
@pytest.mark.parametrize("offset", [0, 1, 3, 7])
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_nan_code_is_found_in_every_layout_and_offset(monkeypatch, transposed, offset, where):
    """Issue 58: the scan reads the storage run (transposed codes) and an odd address as its unaligned head and
    tail bytes plus aligned words. A NaN in the first or last stored byte (the head / tail), or in the words
    between, is found in the right row, over several blocks."""
    monkeypatch.setattr(codec, "SCAN_ROWS_BYTES", 4096)
    rows, cols = 300, 130
    raw = _finite_bytes(offset + rows * cols, torch.float8_e4m3fn)
    b = _view(raw, offset, rows, cols, transposed)
    assert (b.data_ptr() % 8 != 0) == bool(offset) and b.is_contiguous() != transposed
    run = raw[offset:]
    at = {"first": 0, "middle": run.numel() // 2 + 3, "last": run.numel() - 1}[where]
    run[at] = 0xFF  # the stored byte, wherever the layout puts it in the view
    row = at % rows if transposed else at // cols
    assert codec.first_special_row(b, torch.float8_e4m3fn) == (row, 1)
    assert codec.first_special_row(b.view(torch.float8_e4m3fn), torch.float8_e4m3fn) == (row, 1)
    assert not validate_tensors.fp8_all_finite(b.view(torch.float8_e4m3fn))
    run[at] = 0
    assert codec.first_special_row(b, torch.float8_e4m3fn) is None


def test_the_first_row_and_its_block_count_are_the_row_rules_in_transposed_codes(monkeypatch):
    """A transposed weight's rows are found across the column blocks of its storage: the first bad row, and the bad
    rows in its block of rows, as the row-by-row pass counts them."""
    monkeypatch.setattr(codec, "SCAN_ROWS_BYTES", 4096)
    rows, cols = 1000, 640  # blocks of 6 rows
    b = _view(_finite_bytes(rows * cols, torch.float8_e5m2), 0, rows, cols, True)
    for r, c in ((999, 0), (998, 639), (997, 300), (500, 7)):
        b[r, c] = 0x7C  # e5m2 +inf
    assert codec.first_special_row(b, torch.float8_e5m2) == (500, 1)
    b[500, 7] = 0
    assert codec.first_special_row(b, torch.float8_e5m2) == (997, 3)


def test_a_transposed_view_is_scanned_as_its_storage_run_in_place():
    """The scan's pass over a transposed (or offset) view is its storage run, front to back, with no copy: the same
    memory, contiguous, exactly the view's bytes. A view with gaps or repeats has no such run and takes the row
    path (the layout rule refuses those before a scan)."""
    rows, cols = 64, 48
    raw = _finite_bytes(1 + rows * cols, torch.float8_e4m3fn)
    for b in (_view(raw, 1, rows, cols, True), _view(raw, 1, rows, cols, False)):
        run = codec.dense_run(b)
        assert run is not None and run.is_contiguous() and run.ndim == 1 and run.numel() == b.numel()
        assert run.data_ptr() == raw.data_ptr() + 1  # the view's first stored byte: no copy
        assert run.untyped_storage().data_ptr() == raw.untyped_storage().data_ptr()
        assert torch.equal(run.sort().values, b.reshape(-1).sort().values)
    gapped = raw[:rows * cols].view(rows, cols)[:, ::2]
    assert codec.dense_run(gapped) is None  # first_special_row then walks its logical rows
    gapped[5, 3] = 0x7F
    assert codec.first_special_row(gapped, torch.float8_e4m3fn) == (5, 1)


def test_a_large_weight_is_scanned_in_blocks_and_its_last_row_is_seen(monkeypatch):
    monkeypatch.setattr(codec, "SCAN_ROWS_BYTES", 4096)
    b = torch.zeros(1000, 640, dtype=torch.uint8)
    b[999, 639] = 0xFF
    assert codec.first_special_row(b, torch.float8_e4m3fn) == (999, 1)


def _stored_as(q: torch.Tensor, layout: str) -> torch.Tensor:
    """The same codes as a ``.pt`` may store them: its transpose's storage viewed back, or one byte into a storage."""
    if layout == "transposed":
        return q.t().contiguous().t()
    if layout == "odd offset":
        s = torch.zeros(q.numel() + 1, dtype=torch.uint8)
        s[1:] = q.contiguous().view(torch.uint8).reshape(-1)
        return s[1:].view(q.shape).view(q.dtype)
    return q


@pytest.mark.parametrize("kind,ext,layout", [("fp8", ".pt", "row-major"), ("fp8", ".safetensors", "row-major"),
                                             ("mxfp8", ".pt", "row-major"), ("fp8", ".pt", "transposed"),
                                             ("fp8", ".pt", "odd offset")])
def test_an_unsloth_file_with_nan_codes_is_refused_naming_the_tensor_and_row(tmp_path, kind, ext, layout):
    model = ub.tiny_model("z-image")
    ub.quantize(model, ub.KINDS[kind], ub.make_filter(ub.MIN_FEATURES, ub.exclude_tokens(ub.KINDS[kind], "z-image"),
                                                      True, ub.DIVISIBLE[ub.KINDS[kind]]))
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    key = next(k for k, v in sd.items() if hasattr(v, "qdata"))
    sd[key].qdata = _stored_as(sd[key].qdata, layout)
    sd[key].qdata.view(torch.uint8)[4, 3] = 0x7F  # in place: the tensor subclass keeps its other fields
    meta = ub.metadata(family="z-image", scheme=ub.KINDS[kind], sd=sd, base_model_id=ub.FAMILIES["z-image"][1])
    path = str(tmp_path / ("poisoned" + ext))
    if ext == ".pt":
        ub.save_pt(path, sd, meta)
    else:
        pt = ub.save_pt(str(tmp_path / "src.pt"), sd, meta)
        ub.save_safetensors(path, sd, meta, converted_from=pt)
    with pytest.raises(CorruptCheckpointError) as e:
        formats.read(path)
    msg = str(e.value)
    assert key[:-len(".weight")] in msg and "Row 4" in msg and "NaN" in msg and path in msg, msg
    if layout != "row-major":  # the file really stored that layout, and without the NaN it reads
        stored = load_weights_only(path, mmap=False)["state_dict"][key].qdata  # the pack's safe reader, no code
        odd = layout == "odd offset"
        assert stored.is_contiguous() == odd and (stored.storage_offset() == 1) == odd
        sd[key].qdata.view(torch.uint8)[4, 3] = 0
        ub.save_pt(path, sd, meta)
        formats.read(path)
