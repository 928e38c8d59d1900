"""ComfyUI-native files (prequant_core/formats/containers/comfy_native.py): convrot settings ComfyUI nests under a
layer's "params", a quantized layer whose weight tensor is missing (a real file read through formats.read), and
Unsloth's conversion record when it is not JSON, not an object, holds a non-string field or names a scheme this pack
does not know. Core tier: no ComfyUI."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from prequant_core import formats
from prequant_core.errors import CorruptCheckpointError
from prequant_core.formats import comfy_layout
from prequant_core.formats.containers import comfy_native as cn

PATH = "/models/x-ComfyUI.safetensors"


def test_convrot_settings_under_params_are_read_and_the_layers_own_win():
    got = cn._config_of({"format": "int8_tensorwise", "params": {"convrot": True, "convrot_groupsize": 64,
                                                                 "other": 1}}, "blocks.0", PATH)
    assert got["convrot"] is True and got["convrot_groupsize"] == 64 and "other" not in got
    own = cn._config_of({"format": "int8_tensorwise", "convrot": False, "params": {"convrot": True}}, "b", PATH)
    assert own["convrot"] is False


def test_a_quantized_layer_without_its_weight_is_corrupt(tmp_path):
    fmt = next(iter(comfy_layout.formats()))
    quant = torch.frombuffer(bytearray(json.dumps({"format": fmt}).encode()), dtype=torch.uint8)
    path = str(tmp_path / "m-ComfyUI.safetensors")
    save_file({"blocks.0.comfy_quant": quant, "blocks.1.weight": torch.ones(4, 4, dtype=torch.bfloat16)}, path)
    with pytest.raises(CorruptCheckpointError, match="Quantized layer 'blocks.0' has no weight tensor") as e:
        formats.read(path)
    assert e.value.path == path


@pytest.mark.parametrize("raw", ["{not json", json.dumps([1, 2]), 7])
def test_a_conversion_record_that_is_not_a_json_object_is_refused(raw):
    with pytest.raises(CorruptCheckpointError, match="record is not a JSON object"):
        cn._conversion_record({cn.CONVERSION_RECORD: raw}, "fp8", PATH)


def test_a_conversion_record_field_that_is_not_a_string_is_refused():
    with pytest.raises(CorruptCheckpointError, match="record's 'family' is not a string") as e:
        cn._conversion_record({cn.CONVERSION_RECORD: json.dumps({"family": ["z-image"]})}, "fp8", PATH)
    assert e.value.found == "list"


def test_a_conversion_record_naming_an_unknown_scheme_is_not_judged_by_it():
    rec = json.dumps({"base_model_id": "Tongyi-MAI/Z-Image-Turbo", "scheme": "q3-mystery"})
    assert cn._conversion_record({cn.CONVERSION_RECORD: rec}, "fp8", PATH) == \
        {"base_model_id": "Tongyi-MAI/Z-Image-Turbo", "comfy_conversion_record": True}
    with pytest.raises(CorruptCheckpointError, match="record says 'int8', but its layers hold fp8"):
        cn._conversion_record({cn.CONVERSION_RECORD: json.dumps({"scheme": "int8"})}, "fp8", PATH)
