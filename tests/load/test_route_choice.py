"""prequant_core/load/route.py's ``choose`` on each policy's refusals and fallbacks, with a real dense file in an
allowlisted folder: an unknown policy; no pre-quantized file that could be located (``unavailable``), which
``prequant only`` raises as it is and ``prequant, else quantize dense`` records as the reason it quantizes the dense
file; no pre-quantized file given at all; no dense fallback either; the request's own min_features / exclude kept;
and the dense file looked for only in ``dense_dirs``. Core tier: no ComfyUI."""
from __future__ import annotations

import os

import pytest
import torch

from prequant_core import schemes
from prequant_core.errors import HubError, PathNotAllowedError, ValidationError
from prequant_core.load import route
from prequant_core.context import LoadContext
from prequant_core.load.metadata import Request


@pytest.fixture
def dense_file(tmp_path):
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(1)
    sd = {f"layers.0.attention.{p}.weight": torch.randn(512, 512, generator=g).bfloat16() for p in ("to_q", "to_k", "to_v")}
    sd["layers.0.attention_norm1.weight"] = torch.ones(512, dtype=torch.bfloat16)
    folder = tmp_path / "diffusion_models"
    folder.mkdir()
    path = str(folder / "dense.safetensors")
    save_file(sd, path)
    return path


def ctx(dense_file):
    return LoadContext.of(model_dirs=[os.path.dirname(dense_file)])


def test_an_unknown_policy_is_refused(dense_file):
    with pytest.raises(ValidationError) as ei:
        route.choose(None, Request(scheme="int8"), ctx(dense_file), fallback=route.Fallback("sometimes", dense_file))
    e = ei.value
    assert e.message == "Unknown load policy 'sometimes'." and e.found == "sometimes"
    assert e.expected == "prequant only, prequant, else quantize dense, quantize dense"


def test_prequant_only_raises_why_no_file_could_be_located(dense_file):
    offline = HubError("Offline mode is on and the repo has none of these files.", reasons=["a.safetensors: absent"])
    with pytest.raises(HubError) as ei:
        route.choose(None, Request(scheme="int8"), ctx(dense_file), unavailable=offline,
                     fallback=route.Fallback(route.PREQUANT_ONLY, dense_file))
    assert ei.value is offline


@pytest.mark.parametrize("reasons,skipped", [(["a.safetensors: absent"], ["a.safetensors: absent"]),
                                              (None, ["Offline mode is on."])])
def test_else_dense_quantizes_the_dense_file_and_says_why(dense_file, reasons, skipped):
    offline = HubError("Offline mode is on.", reasons=reasons)
    r = route.choose("/never/opened.safetensors", Request(scheme="INT8", family="z-image"), ctx(dense_file),
                     unavailable=offline, fallback=route.Fallback(route.PREQUANT_ELSE_DENSE, dense_file))
    assert (r.taken, r.dense_path, r.scheme, r.family.name, r.opened) == ("quantized at load", dense_file, "int8",
                                                                          "z-image", None)
    assert r.skipped_because == skipped
    assert r.min_features == schemes.DEFAULT_MIN_FEATURES and r.exclude == schemes.exclude_tokens("int8", ())


def test_else_dense_with_no_file_given_says_so_and_keeps_the_requests_filter(dense_file):
    r = route.choose(None, Request(scheme="fp8", family="z-image", min_features=256, exclude_tokens=["attention"]),
                     ctx(dense_file), fallback=route.Fallback(route.PREQUANT_ELSE_DENSE, dense_file))
    assert r.taken == "quantized at load" and r.skipped_because == ["no pre-quantized file was given"]
    assert (r.scheme, r.min_features, r.exclude) == ("fp8", 256, ["attention"])


def test_prequant_only_without_a_file_is_refused(dense_file):
    with pytest.raises(ValidationError) as ei:
        route.choose(None, Request(scheme="int8"), ctx(dense_file), fallback=route.Fallback(route.PREQUANT_ONLY))
    assert ei.value.message == "No pre-quantized checkpoint to load."
    assert ei.value.fix == "Pick a file, or allow the dense fallback."


def test_else_dense_without_a_dense_file_lists_the_reasons(dense_file):
    with pytest.raises(ValidationError) as ei:
        route.choose(None, Request(scheme="int8"), ctx(dense_file), fallback=route.Fallback(route.PREQUANT_ELSE_DENSE))
    e = ei.value
    assert e.message == "The pre-quantized file cannot be used and no dense fallback was given."
    assert e.reasons == ["no pre-quantized file was given"] and "dense_fallback" in e.fix


def test_the_dense_file_must_lie_in_dense_dirs(dense_file, tmp_path):
    other = tmp_path / "elsewhere"
    other.mkdir()
    with pytest.raises(PathNotAllowedError):
        route.choose(None, Request(scheme="int8", family="z-image"), ctx(dense_file), dense_dirs=[str(other)],
                     fallback=route.Fallback(route.DENSE_ONLY, dense_file))
    r = route.choose(None, Request(scheme="int8"), LoadContext.of(model_dirs=[str(other)]),
                     dense_dirs=[os.path.dirname(dense_file)], fallback=route.Fallback(route.DENSE_ONLY, dense_file))
    assert r.taken == "quantized at load" and r.family.name == "z-image"  # detected from the file's names
