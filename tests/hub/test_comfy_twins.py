"""Unsloth's ComfyUI-format twins in the Hub name chain (issue 36): ``<stem>-ComfyUI.safetensors`` asked where
Unsloth's resolver asks for it (int8: before its artifact's names; fp8: after them, before the legacy name; image
families only; ``UNSLOTH_DIFFUSION_PREQUANT_COMFY`` off drops every twin), and a twin from a loopback Hub loaded
through the ComfyUI-native reader with its ``unsloth_comfy_conversion`` record judged. The twin is written by the
restated ComfyUI quantizer (tests/comfy_quantizer.py) from a tiny real Qwen-Image, whose ComfyUI layout is diffusers'
own key names."""
from __future__ import annotations

from prequant_core.context import LoadContext

import json

import pytest
import torch

import comfy_quantizer as cq
import unsloth_builder as ub
from prequant_core import report
from prequant_core.errors import CorruptCheckpointError, ValidationError
from prequant_core.load import pipeline, sources
from prequant_core.hub.errors import HubNotFoundError
from prequant_core.load.metadata import Request
from prequant_core.families import hub_names

REPO = "unsloth/Qwen-Image-FP8"
BASE = "Qwen/Qwen-Image"


def test_the_chain_asks_for_twins_where_unsloth_does(monkeypatch):
    monkeypatch.delenv(hub_names.TWIN_ENV, raising=False)
    assert sources.filenames("unsloth/Z-Image-Turbo-FP8", "int8") == (
        "Z-Image-Turbo-INT8-ComfyUI.safetensors", "Z-Image-Turbo-INT8.safetensors", "Z-Image-Turbo-INT8.pt",
        "transformer_int8.pt")
    assert sources.filenames("unsloth/Z-Image-Turbo-FP8", "fp8") == (
        "Z-Image-Turbo-FP8.safetensors", "Z-Image-Turbo-FP8.pt", "Z-Image-Turbo-FP8-ComfyUI.safetensors",
        "transformer_fp8.pt")
    # every artifact gets its twin: the ConvRot build too, each ahead of its own names
    assert sources.filenames("unsloth/Qwen-Image-2.1-FP8", "int8")[:4] == (
        "Qwen-Image-2.1-INT8-ConvRot-ComfyUI.safetensors", "Qwen-Image-2.1-INT8-ConvRot.safetensors",
        "Qwen-Image-2.1-INT8-ComfyUI.safetensors", "Qwen-Image-2.1-INT8.safetensors")
    # video families: none (Unsloth loads their experts otherwise); legacy names never have one
    for repo, scheme in (("unsloth/Wan2.2-TI2V-5B-NVFP4", "nvfp4"),):
        assert not any(hub_names.is_comfy_twin(n) for n in sources.filenames(repo, scheme))
    assert hub_names.artifact_stem("transformer_fp8.pt") is None
    for off in ("0", "off", "False", " no "):
        monkeypatch.setenv(hub_names.TWIN_ENV, off)
        assert not any(hub_names.is_comfy_twin(n) for s in ("int8", "fp8")
                       for n in sources.filenames("unsloth/Z-Image-Turbo-FP8", s)), off
    monkeypatch.setenv(hub_names.TWIN_ENV, "1")
    assert sources.filenames("unsloth/Z-Image-Turbo-FP8", "int8")[0].endswith("-ComfyUI.safetensors")


def test_where_a_stored_file_came_from_is_read_off_its_folders():
    o = sources.hub_origin("/m/prequant/unsloth/Qwen-Image-FP8@v2/Qwen-Image-FP8-transformer_fp8.pt", "fp8")
    assert o is None  # not a name the chain has (the legacy name's local form is <Model>-transformer_fp8.pt)
    o = sources.hub_origin("/m/prequant/unsloth/Qwen-Image-FP8@v2/Qwen-Image-transformer_fp8.pt", "fp8")
    assert o["repo"] == REPO and o["revision"] == "v2" and o["served"] == "transformer_fp8.pt"
    cache = "/h/hub/models--unsloth--Qwen-Image-FP8/snapshots/" + "a" * 40 + "/Qwen-Image-FP8.pt"
    assert sources.hub_origin(cache, "fp8")["served"] == "Qwen-Image-FP8.pt"
    assert sources.hub_origin(cache, "fp8")["revision"] == "a" * 40
    assert sources.hub_origin("/anywhere/else/Qwen-Image-FP8.pt", "int8") is None
    assert sources.hub_origin("/m/prequant/my/own/Qwen-Image-FP8.pt", None) is None


def test_a_cached_container_is_never_downloaded_twice():
    chain = ["M-INT8-ComfyUI.safetensors", "M-INT8.safetensors", "M-INT8.pt", "transformer_int8.pt"]
    # the artifact's .pt is cached: the uncached twin steps behind it
    assert hub_names.prefer_cached_twins(chain, lambda n: n == "M-INT8.pt") == [
        "M-INT8.safetensors", "M-INT8.pt", "M-INT8-ComfyUI.safetensors", "transformer_int8.pt"]
    fp8 = ["M-FP8.safetensors", "M-FP8.pt", "M-FP8-ComfyUI.safetensors", "transformer_fp8.pt"]
    # a cached fp8 twin goes first when no container of its artifact is cached
    assert hub_names.prefer_cached_twins(fp8, lambda n: n == "M-FP8-ComfyUI.safetensors")[0] == fp8[2]
    assert hub_names.prefer_cached_twins(fp8, lambda n: False) == fp8
    assert hub_names.prefer_cached_twins(chain, lambda n: False) == chain


def _twin(path, scheme: str, record: dict | None = None):
    """A Qwen-Image twin as ComfyUI's quantizer writes it: its Linears int8_tensorwise / float8_e4m3fn."""
    sd = {k: v.to(torch.bfloat16) for k, v in ub.tiny_model("qwen-image").state_dict().items()}
    fmt = "int8_tensorwise" if scheme == "int8" else "float8_e4m3fn"
    layers = {k[: -len(".weight")]: (fmt, {}) for k, v in sd.items()
              if k.startswith("transformer_blocks.") and k.endswith(".weight") and v.ndim == 2
              and "norm" not in k and "mod" not in k}
    cq.write(str(path), sd, layers)
    if record is not None:
        from safetensors import safe_open
        from safetensors.torch import save_file
        with safe_open(str(path), "pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
            meta = dict(f.metadata() or {})
        meta["unsloth_comfy_conversion"] = json.dumps(record)
        save_file(tensors, str(path), metadata=meta)
    return len(layers)


pytestmark = pytest.mark.hub_chunk(64 * 1024)


@pytest.fixture
def hub(hub, monkeypatch):
    """conftest's loopback Hub, with the twin setting from the developer's environment removed."""
    monkeypatch.delenv(hub_names.TWIN_ENV, raising=False)
    return hub


def _load(tmp_path, scheme: str, base: str = BASE, preset: str | None = None):
    dest = tmp_path / "prequant"
    dest.mkdir(exist_ok=True)
    wanted = sources.Wanted(preset=preset) if preset else sources.Wanted(hub_repo=REPO, scheme=scheme)
    plan = sources.plan(wanted)
    return pipeline.run(plan, Request(scheme=scheme, base_model_id=base), LoadContext.of(download_dir=str(dest), model_dirs=[str(dest)]))


def test_a_repo_holding_only_the_twin_loads_it(hub, tmp_path):
    twin = tmp_path / "Qwen-Image-INT8-ComfyUI.safetensors"
    n = _twin(twin, "int8", {"base_model_id": BASE, "scheme": "int8", "family": "qwen-image"})
    hub.commit(REPO, {twin.name: str(twin)})
    routed = _load(tmp_path, "int8")
    assert routed.located.fetched.filename == twin.name
    ck = routed.route.opened.checkpoint
    assert ck.container == "comfyui-native" and len(ck.quantized_keys) == n
    assert ck.metadata["base_model_id"] == BASE and routed.route.opened.family.name == "qwen-image"
    asked = [r["filename"] for r in hub.requests("HEAD")]
    assert asked[0] == twin.name, asked  # int8: the twin leads the chain
    # Info on the stored file: the repo it came from, the names asked in order, and which one this is
    r = report.info(routed.located.path, {"scheme": "int8", "base_model_id": BASE})
    chain = list(sources.filenames(REPO, "int8"))
    assert r.valid and r.hub == {"repo": REPO, "revision": None, "names": chain, "served": twin.name}, r.hub
    row = dict(r.rows())["Hub source"]
    assert row.startswith(f"{REPO}, where the loader asks for int8 in this order: {twin.name} (this file) → "), row
    assert row.endswith("transformer_int8.pt") and r.to_dict()["hub"]["served"] == twin.name


def test_a_repo_holding_only_the_twin_loads_through_the_preset(hub, tmp_path):
    twin = tmp_path / "Qwen-Image-INT8-ComfyUI.safetensors"
    _twin(twin, "int8", {"base_model_id": BASE, "scheme": "int8", "family": "qwen-image"})
    hub.commit(REPO, {twin.name: str(twin)})
    assert "Qwen-Image / int8" in sources.preset_labels()
    routed = _load(tmp_path, "int8", preset="Qwen-Image / int8")
    assert routed.located.fetched.repo == REPO and routed.located.fetched.filename == twin.name
    assert routed.route.opened.checkpoint.container == "comfyui-native"


def test_fp8_asks_for_the_artifact_first_and_the_twin_after(hub, tmp_path):
    twin = tmp_path / "Qwen-Image-FP8-ComfyUI.safetensors"
    _twin(twin, "fp8")
    hub.commit(REPO, {twin.name: str(twin)})
    routed = _load(tmp_path, "fp8")
    asked = [r["filename"] for r in hub.requests("HEAD")]
    assert routed.located.fetched.filename == twin.name
    assert asked.index("Qwen-Image-FP8.safetensors") < asked.index("Qwen-Image-FP8.pt") < asked.index(twin.name)
    assert "transformer_fp8.pt" not in asked  # found before the legacy name


def test_the_switch_off_never_asks_for_a_twin(hub, tmp_path, monkeypatch):
    twin = tmp_path / "Qwen-Image-INT8-ComfyUI.safetensors"
    _twin(twin, "int8")
    hub.commit(REPO, {twin.name: str(twin)})
    monkeypatch.setenv(hub_names.TWIN_ENV, "0")
    with pytest.raises(HubNotFoundError):
        _load(tmp_path, "int8")
    assert twin.name not in [r["filename"] for r in hub.requests("HEAD")]


def test_the_conversion_record_is_judged(hub, tmp_path):
    twin = tmp_path / "Qwen-Image-INT8-ComfyUI.safetensors"
    _twin(twin, "int8", {"base_model_id": "Tongyi-MAI/Z-Image-Turbo", "scheme": "int8"})
    hub.commit(REPO, {twin.name: str(twin)})
    with pytest.raises(ValidationError) as e:  # built from another base than the one asked for
        _load(tmp_path, "int8")
    assert "Qwen/Qwen-Image" in str(e.value) and "Z-Image-Turbo" in str(e.value)
    bad = tmp_path / "bad" / "Qwen-Image-INT8-ComfyUI.safetensors"
    bad.parent.mkdir()
    _twin(bad, "int8", {"base_model_id": BASE, "scheme": "fp8"})
    from prequant_core import formats
    with pytest.raises(CorruptCheckpointError, match="record says 'fp8', but its layers hold int8"):
        formats.read(str(bad))
