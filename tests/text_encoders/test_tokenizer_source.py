"""Tokenizer donors (prequant_core/text_encoders/tokenizer.py) on real files: folders that cannot be listed, files
whose header cannot be read, a spiece_model of another dtype and no donor at all (None); a header entry whose size
cannot be read, a donor safetensors itself cannot open, and empty bytes refused before SentencePiece sees them.
Core tier: no ComfyUI."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from prequant_core.errors import CorruptCheckpointError
from prequant_core.families import encoders
from prequant_core.text_encoders import tokenizer as ts

KIND = encoders.for_class("Gemma2Model")


def test_no_usable_donor_means_none(tmp_path):
    folder = tmp_path / "text_encoders"
    folder.mkdir()
    (folder / "broken.safetensors").write_bytes(b"\xff" * 64)  # its header cannot be read: skipped
    (folder / "dir.safetensors").mkdir()  # not a file: skipped
    sd = {k: torch.zeros(8, dtype=torch.bfloat16) for k in KIND.markers}
    sd["spiece_model"] = torch.zeros(16, dtype=torch.float32)  # not the uint8 bytes ComfyUI stores
    save_file(sd, str(folder / "gemma_f32_spiece.safetensors"))
    sd2 = {k: torch.zeros(8, dtype=torch.bfloat16) for k in KIND.markers}  # the encoder, without a tokenizer
    save_file(sd2, str(folder / "gemma_no_spiece.safetensors"))
    assert ts.from_comfy_files(KIND, [str(tmp_path / "no such folder"), str(folder)]) is None


@pytest.mark.parametrize("entry", [{"shape": ["x"], "data_offsets": [0, 4]}, {"data_offsets": [0, 4]},
                                   {"shape": None, "data_offsets": [0, 4]}])
def test_a_header_entry_whose_size_cannot_be_read_is_refused_naming_the_donor(tmp_path, entry):
    donor = str(tmp_path / "gemma.safetensors")
    with pytest.raises(CorruptCheckpointError, match="declares a spiece_model of -1 bytes") as e:
        ts._donor_bytes(donor, entry)
    assert e.value.path == donor and "not at fault" in e.value.fix


def test_a_donor_safetensors_cannot_open_is_refused_naming_it(tmp_path):
    donor = tmp_path / "gemma.safetensors"
    donor.write_bytes(b"\x00" * 64)
    with pytest.raises(CorruptCheckpointError, match="tokenizer donor gemma.safetensors could not be read") as e:
        ts._donor_bytes(str(donor), {"shape": [4], "data_offsets": [0, 4], "dtype": "U8"})
    assert e.value.path == str(donor) and "Remove or replace gemma.safetensors" in e.value.fix


def test_empty_bytes_are_no_sentencepiece_model():
    with pytest.raises(CorruptCheckpointError, match="is 0 bytes, not a SentencePiece model") as e:
        ts._checked(b"", "/models/te.safetensors", "The tokenizer", "Fix it.")
    assert e.value.found == "0 bytes" and e.value.fix == "Fix it."
