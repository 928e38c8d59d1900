"""The .pt bounds of prequant_core/formats/pickle_guard.py on crafted archives: a zip end record that lists too many
entries, an entry name stored twice, an archive without data.pkl (both the pack's own index read and torch's
reader), a data.pkl whose local header is damaged, an empty archive torch's reader refuses, a data.pkl over the size
bound read through torch's reader, and scan's own bounds (pickle size, opcode count on a container opcode, a marked
opcode with too few values below its MARK). Core tier: no ComfyUI."""
from __future__ import annotations

import pickle
import struct
import zipfile

import pytest
import torch

from prequant_core.errors import CorruptCheckpointError
from prequant_core.formats import file_handle, pickle_guard


def stored_zip(path, entries: list[tuple[str, bytes]]) -> str:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        for name, data in entries:
            z.writestr(name, data)
    return str(path)


def test_an_end_record_listing_too_many_entries_is_refused_before_any_entry_is_parsed(tmp_path):
    n = pickle_guard.MAX_ARCHIVE_ENTRIES + 1  # past the classic end record's 16 bits: a zip64 end record says it
    z64 = struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, n, n, 0, 0)
    loc = struct.pack("<4sLQL", b"PK\x06\x07", 0, 0, 1)
    eocd = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    p = tmp_path / "many.pt"
    p.write_bytes(z64 + loc + eocd)  # the end records alone: no entry exists to be parsed
    with open(p, "rb") as f, pytest.raises(CorruptCheckpointError, match="too many entries") as e:
        pickle_guard.check_zip_index(f, str(p))
    assert e.value.found == f"{n} entries (limit {pickle_guard.MAX_ARCHIVE_ENTRIES})"


def test_an_entry_name_stored_twice_is_refused(tmp_path):
    with pytest.warns(UserWarning, match="Duplicate name"):
        p = stored_zip(tmp_path / "dup.pt", [("archive/data.pkl", b"a"), ("archive/data.pkl", b"b")])
    with open(p, "rb") as f, pytest.raises(CorruptCheckpointError, match="appears twice") as e:
        pickle_guard.check_zip_index(f, p)
    assert e.value.found == "'archive/data.pkl'"


def test_an_archive_without_data_pkl_is_refused_by_both_readers(tmp_path):
    p = stored_zip(tmp_path / "nopkl.pt", [("archive/version", b"3\n"), ("archive/other", b"x")])
    with file_handle.open_file(p) as fh:
        with pytest.raises(CorruptCheckpointError, match="has no data.pkl"):
            pickle_guard.checked_pickle(fh)
        with pytest.raises(CorruptCheckpointError, match="has no data.pkl"):
            pickle_guard.open_checked(fh)


def test_a_damaged_local_header_is_refused(tmp_path):
    p = stored_zip(tmp_path / "hdr.pt", [("archive/data.pkl", pickle.dumps({"a": 1}, protocol=2))])
    with open(p, "r+b") as f:
        raw = f.read()
        at = raw.index(b"PK\x03\x04")
        f.seek(at)
        f.write(b"XX\x03\x04")
    with file_handle.open_file(p) as fh, pytest.raises(CorruptCheckpointError, match="data.pkl cannot be read") as e:
        pickle_guard.checked_pickle(fh)
    assert e.value.found == f"a damaged local header at byte {at}"


def test_checked_pickle_returns_a_real_torch_save_pickle(tmp_path):
    p = str(tmp_path / "real.pt")
    torch.save({"w": torch.ones(2)}, p)
    with file_handle.open_file(p) as fh:
        data = pickle_guard.checked_pickle(fh)
        reader, data2 = pickle_guard.open_checked(fh)
    assert data == data2 and data.startswith(b"\x80") and reader.has_record("data.pkl")


def test_an_empty_archive_is_refused_by_torchs_reader(tmp_path):
    p = stored_zip(tmp_path / "empty.pt", [])
    with file_handle.open_file(p) as fh, pytest.raises(CorruptCheckpointError, match="torch cannot open") as e:
        pickle_guard.open_checked(fh)
    assert "does not contain any files" in e.value.found


def test_a_pickle_over_the_size_bound_is_refused_through_torchs_reader(tmp_path):
    big = b"\x80\x02N." + b"\0" * (pickle_guard.MAX_PICKLE_BYTES + 1 - 4)
    p = stored_zip(tmp_path / "big.pt", [("archive/data.pkl", big), ("archive/version", b"3\n")])
    with file_handle.open_file(p) as fh, pytest.raises(CorruptCheckpointError, match="larger than any") as e:
        pickle_guard.open_checked(fh)
    assert e.value.found.startswith("data.pkl of ")


def test_scan_refuses_an_oversized_pickle():
    with pytest.raises(CorruptCheckpointError, match="larger than any checkpoint"):
        pickle_guard.scan(b"N" * (pickle_guard.MAX_PICKLE_BYTES + 1), "x.pt")


def test_scan_stops_at_the_opcode_bound_on_a_container_opcode():
    # PROTO, then empty lists (a container opcode, not a leaf): the bound is crossed on one of them
    data = b"\x80\x02" + b"]" * pickle_guard.MAX_OPCODES + b"."
    with pytest.raises(CorruptCheckpointError, match="more opcodes than any") as e:
        pickle_guard.scan(data, "x.pt")
    assert f"{pickle_guard.MAX_OPCODES:,}" in e.value.found
    # one below the bound passes and is counted
    ok = b"\x80\x02" + b"]" * 1000 + b"."
    assert pickle_guard.scan(ok, "x.pt") == {"opcodes": 1002, "depth": 0}


def test_scan_refuses_a_marked_opcode_with_nothing_below_its_mark():
    # MARK on an empty stack, then SETITEMS (it needs the dict below the MARK)
    with pytest.raises(CorruptCheckpointError, match="malformed") as e:
        pickle_guard.scan(b"\x80\x02(u.", "x.pt")
    assert e.value.found == "ValueError: SETITEMS on a too short stack"
