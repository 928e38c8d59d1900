"""The small gatekeepers between a file's values and the pack: formats/plain_data.py (metadata reduced to plain JSON
values: too many values, a non-finite number, values nested too deep, torch's dtype / device / size objects kept as
their names), formats/tensor_fields.py on a plain tensor, schemes/json_values.py's booleans, the scheme registry's
lookups of a kind or code dtype no scheme has, schemes.LayerFilter's reasons for a weight it does not quantize, and
rotation.hadamard's refusal of a group size. Core tier: no ComfyUI."""
from __future__ import annotations

import pytest
import torch

from prequant_core import schemes
from prequant_core.errors import CorruptCheckpointError
from prequant_core.formats import plain_data, tensor_fields
from prequant_core.schemes import json_values, registry, rotation

PATH = "/m/file.pt"


def refused(value):
    with pytest.raises(CorruptCheckpointError) as ei:
        plain_data.plain(value, PATH)
    e = ei.value
    assert (e.message, e.path, e.fix) == ("The checkpoint's metadata is malformed.", PATH,
                                          "Download or build the file again.")
    return e.found


def test_metadata_with_too_many_values_is_refused():
    assert refused({"fingerprint": [0] * plain_data.MAX_NODES}) == "more than 1,000,000 values"


@pytest.mark.parametrize("x", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_number_is_refused(x):
    assert refused({"scale": [1.0, x]}) == f"a non-finite number ({x})"


def test_values_nested_too_deep_are_refused():
    v: list = []
    for _ in range(plain_data.MAX_DEPTH + 1):
        v = [v]
    assert refused({"a": v}) == "values nested deeper than 32 levels"
    ok: list = []
    for _ in range(plain_data.MAX_DEPTH - 2):
        ok = [ok]
    assert plain_data.plain({"a": ok}, PATH) == {"a": ok}


def test_torchs_dtype_device_and_size_are_kept_as_their_names():
    got = plain_data.plain({"torch_dtype": torch.bfloat16, "device": torch.device("cpu"),
                            "shape": torch.Size([2, 3]), "n": 3, "x": 0.5}, PATH)
    assert got == {"torch_dtype": "torch.bfloat16", "device": "cpu", "shape": "torch.Size([2, 3])", "n": 3, "x": 0.5}
    assert all(type(v) in (str, int, float) for v in got.values())


def test_a_plain_tensor_carries_no_quantized_fields_to_check():
    t = torch.ones(2, 2)
    t.anything = "extra"  # a plain tensor is no codec's: its attributes are not the quantized boundary's business
    assert tensor_fields.check_fields("a.weight", t, PATH) is None


def test_json_booleans_default_when_absent_and_are_strict_otherwise():
    assert json_values._bool(None, "flag") is False and json_values._bool(None, "flag", default=True) is True
    assert json_values._bool(True, "flag") is True
    with pytest.raises(json_values.DecodeError, match="flag must be true/false"):
        json_values._bool(1, "flag")


def test_a_kind_or_code_dtype_no_scheme_has_is_a_key_error():
    assert registry.by_kind(schemes.get("int8")[0].kind).name == "int8"
    with pytest.raises(KeyError, match="int4"):
        registry.by_kind("int4")
    assert registry.by_codes(torch.int8).name == "int8"
    with pytest.raises(KeyError):
        registry.by_codes(torch.int32)


def test_why_a_weight_is_not_quantized():
    fp8 = schemes.LayerFilter("fp8", 16, ("norm",))
    assert fp8.reason_skipped("blocks.0.conv", torch.ones(32, 32, 3, 3, dtype=torch.bfloat16)) == "not a Linear weight"
    assert fp8.reason_skipped("blocks.0.ff", torch.ones(32, 32, dtype=torch.float16)) == \
        "torch.float16 weight (scheme needs bfloat16)"
    assert fp8.reason_skipped("blocks.0.ff", torch.ones(32, 32, dtype=torch.bfloat16)) is None
    assert schemes.LayerFilter("int8", 16, ()).reason_skipped("blocks.0.ff", torch.ones(32, 32)) is None


@pytest.mark.parametrize("group", [2, 8, 0, -4, True, 16.0, 4 ** 10])
def test_a_rotation_group_that_is_no_power_of_four_is_refused(group):
    with pytest.raises(ValueError, match=f"rotation group {group!r} is not a power of 4 up to"):
        rotation.hadamard(group)
