"""prequant_core/report.py's helpers on a real quantized safetensors file written by the pack's own writer: the
streamed weights fingerprint verification reads (their count, a weight read back, a stored part that is not in
the file refused as corruption), the scale-checked view's count, a Report with no dense equivalent (saving 0 %), its
JSON form of a non-finite number and of an object JSON has no type for, and no request giving no request dict. Core
tier: no ComfyUI."""
from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from safetensors import safe_open

from prequant_core import report, schemes
from prequant_core.errors import CorruptCheckpointError
from prequant_core.formats import file_handle
from prequant_core.formats.containers import READ_HEADER, safetensors_container
from prequant_core.schemes import qtensor


@pytest.fixture
def quantized_file(tmp_path):
    g = torch.Generator().manual_seed(0)
    w = {f"blocks.{i}.attn.to_q.weight": schemes.quantize_weight(torch.randn(16, 32, generator=g)
                                                                .to(torch.bfloat16), "int8") for i in range(2)}
    tensors = {**w, "blocks.0.norm.weight": torch.ones(32, dtype=torch.bfloat16)}
    path = str(tmp_path / "m.safetensors")
    safetensors_container.write(path, tensors, {"scheme": "int8"})
    return path, tensors


def test_streamed_weights_are_counted_read_back_and_a_missing_part_is_corruption(quantized_file):
    path, tensors = quantized_file
    with file_handle.open_file(path) as fh:
        light = safetensors_container.read_light(fh)
    assert light.read_mode == READ_HEADER and len(light.quantized_parts) == 2
    with safe_open(path, framework="pt", device="cpu") as f:
        streamed = report._StreamedWeights(f, light.quantized_parts, path)
        assert len(streamed) == 2 and sorted(streamed) == sorted(k for k in tensors if "to_q" in k)
        checked = report._ScalesChecked(streamed, path)
        assert len(checked) == 2
        got = checked["blocks.1.attn.to_q.weight"]
        want = tensors["blocks.1.attn.to_q.weight"]
        assert torch.equal(got.qdata, want.qdata) and torch.equal(got.scale, want.scale)
        entry, stored = light.quantized_parts["blocks.0.attn.to_q.weight"]
        broken = report._StreamedWeights(f, {"w": (entry, {**stored, "scale": "no.such.tensor"})}, path)
        with pytest.raises(CorruptCheckpointError, match="Quantized tensor 'w' could not be read") as e:
            broken["w"]
        assert e.value.path == path and e.value.found.split(":")[0] in ("SafetensorError", "KeyError")


def make_report(**changes) -> report.Report:
    fields = {f.name: None for f in dataclasses.fields(report.Report) if f.default is dataclasses.MISSING}
    fields.update(path="/models/m.safetensors", file_size=100, container="safetensors", read_mode=READ_HEADER,
                  schemes_found=[], quantized_count=0, quantized_bytes=0, dense_count=0, dense_bytes=0,
                  dense_equivalent_bytes=0, fingerprint_present=False, fingerprint_reasons=[], valid=True,
                  reasons=[], notes=[])
    fields.update(changes)
    return report.Report(**fields)


def test_a_report_with_nothing_dense_saves_nothing_and_its_dict_is_strict_json():
    r = make_report(min_features=math.nan, torch_version=torch.device("cpu"), exclude_tokens=[math.inf, "x"])
    assert r.saving_pct == 0.0
    d = r.to_dict()
    assert d["saving_pct"] == 0.0
    assert d["min_features"] == "nan" and d["torch_version"] == "cpu" and d["exclude_tokens"] == ["inf", "x"]
    json.dumps(d, allow_nan=False)  # strict JSON: would raise on a NaN left in
    assert make_report(dense_equivalent_bytes=200, quantized_bytes=50).saving_pct == 75.0


def test_no_request_gives_no_request_dict():
    assert report._request_dict(None) is None
    assert make_report().to_dict()["verdict"]["requested"] is None
