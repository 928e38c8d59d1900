"""prequant_core/builder's refusals of what it is asked before it reads a weight: a component that is not a plain
name, an output name or container that does not fit (a ComfyUI-native file that is not .safetensors, an unknown
container, an extension of the other container), min_features that is not a whole number >= 1, an output folder that
does not exist, a filter no Linear layer passes (for both the pack's and the ComfyUI-native builder); the version of a
distribution that is not installed; and ``comfy_key_map_from`` on a folder that is not a ComfyUI, or for a family whose
ComfyUI uses the diffusers names. Real tensors and files. Core tier: no ComfyUI."""
from __future__ import annotations

import importlib.metadata
import os
import sys

import pytest
import torch

from prequant_core import builder, families
from prequant_core.errors import BuildError


def small_dense(cols=512):
    """A few real-width Linear weights under Z-Image's diffusers names (as tests/builder/test_build.py's small_dense)."""
    g = torch.Generator().manual_seed(1)
    sd = {f"layers.0.attention.{p}.weight": torch.randn(cols, cols, generator=g).bfloat16()
          for p in ("to_q", "to_k", "to_v")}
    sd["layers.0.attention_norm1.weight"] = torch.ones(cols, dtype=torch.bfloat16)
    return sd


ZIMAGE = "z-image"


def test_an_uninstalled_distribution_has_no_version():
    assert builder._dist_version("no-such-distribution-prequant-test") is None
    assert builder._dist_version("safetensors") == importlib.metadata.version("safetensors")


@pytest.mark.parametrize("bad", ["transformer 2", "../transformer", "t" * 65, "tränsformer", "a-b"])
def test_a_component_that_is_not_a_plain_name_is_refused(bad, tmp_path):
    with pytest.raises(BuildError) as ei:
        builder.check_component(bad)
    assert ei.value.message == "component must be a plain name such as transformer or transformer_2."
    assert ei.value.found == repr(bad)[:80]
    dest = tmp_path / "x.safetensors"
    with pytest.raises(BuildError, match="component must be a plain name"):  # the build refuses it first
        builder.build(small_dense(), builder.Target(str(dest)), builder.Recipe("int8", family=ZIMAGE, component=bad))
    assert os.listdir(tmp_path) == []


def test_empty_or_none_component_is_transformer():
    assert builder.check_component(None) == builder.check_component("  ") == "transformer"
    assert builder.check_component("transformer_2") == "transformer_2"


def test_a_comfyui_native_file_must_be_safetensors(tmp_path):
    dest = str(tmp_path / "model.pt")
    with pytest.raises(BuildError) as ei:
        builder.container_for(dest, builder.NATIVE, "fp8")
    e = ei.value
    assert e.message == "A ComfyUI-native file is a .safetensors file."
    assert (e.path, e.expected, e.found, e.fix) == (dest, ".safetensors", ".pt", "Name the file *.safetensors.")
    assert builder.container_for(str(tmp_path / "model.safetensors"), builder.NATIVE, "fp8") == builder.NATIVE
    assert builder.container_for(str(tmp_path / "model"), builder.NATIVE, "fp8") == builder.NATIVE


def test_an_unknown_container_is_refused(tmp_path):
    with pytest.raises(BuildError) as ei:
        builder.container_for(str(tmp_path / "model.safetensors"), "zip", "int8")
    assert ei.value.message == "Unknown output container 'zip'."
    assert (ei.value.expected, ei.value.found) == ("safetensors or pt", "zip")


@pytest.mark.parametrize("name,container,ext,other", [("m.pt", "safetensors", ".pt", "pt"),
                                                       ("m.safetensors", "pt", ".safetensors", "safetensors")])
def test_an_extension_of_the_other_container_is_refused(tmp_path, name, container, ext, other):
    dest = str(tmp_path / name)
    with pytest.raises(BuildError) as ei:
        builder.container_for(dest, container, "int8")
    e = ei.value
    assert e.message == "The output file name's extension does not match the container."
    assert (e.path, e.expected, e.found) == (dest, builder.EXTENSIONS[container], ext)
    assert e.fix == f"Name the file *{builder.EXTENSIONS[container]}, or pick the '{other}' container."
    # through build: refused before the input is read
    with pytest.raises(BuildError, match="extension does not match"):
        builder.build(small_dense(), builder.Target(dest, container=container), builder.Recipe("int8", family=ZIMAGE))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("value,message,found", [
    ("many", "min_features must be an integer.", "'many'"),
    (None, "min_features must be an integer.", "None"),
    (0, "min_features must be at least 1.", "0"),
    ("-3", "min_features must be at least 1.", "-3"),
])
def test_min_features_must_be_a_whole_number_of_at_least_one(tmp_path, value, message, found):
    with pytest.raises(BuildError) as ei:
        builder.build(small_dense(), builder.Target(str(tmp_path / "x.safetensors")),
                      builder.Recipe("int8", family=ZIMAGE, min_features=value))
    assert (ei.value.message, ei.value.found) == (message, found)
    assert os.listdir(tmp_path) == []


def test_an_output_folder_that_does_not_exist_is_refused(tmp_path):
    folder = tmp_path / "not-made"
    with pytest.raises(BuildError) as ei:
        builder.build(small_dense(), builder.Target(str(folder / "x.safetensors")), builder.Recipe("int8", family=ZIMAGE))
    e = ei.value
    assert (e.message, e.path, e.fix) == ("The output folder does not exist.", str(folder),
                                          "Create it or pick another folder.")
    assert not folder.exists()


def test_a_filter_no_layer_passes_is_refused_before_anything_is_written(tmp_path):
    dense_file = tmp_path / "dense.safetensors"
    from safetensors.torch import save_file
    save_file(small_dense(), str(dense_file))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(BuildError) as ei:
        builder.build(str(dense_file), builder.Target(str(out / "x.safetensors")),
                      builder.Recipe("int8", family=ZIMAGE, min_features=1024))
    e = ei.value
    assert e.message == "No Linear layer passes the filter, so nothing would be quantized."
    assert e.path == str(dense_file) and e.fix == "Lower min_features."
    assert e.expected == "Linear layers with in and out features >= min_features (1024)"
    assert os.listdir(out) == []
    # the same input with the filter met builds: three quantized layers, the norm kept as it is
    res = builder.build(str(dense_file), builder.Target(str(out / "x.safetensors")),
                        builder.Recipe("int8", family=ZIMAGE, min_features=512))
    assert (res.quantized, res.tensors, res.family, res.container) == (3, 4, ZIMAGE, "safetensors")


def test_a_comfyui_native_build_no_layer_passes_is_refused(tmp_path):
    g = torch.Generator().manual_seed(2)
    tensors = {"layers.0.attention.qkv.weight": torch.randn(3 * 512, 512, generator=g).bfloat16(),
               "layers.0.attention_norm1.weight": torch.ones(512, dtype=torch.bfloat16)}
    dest = str(tmp_path / "native.safetensors")
    with pytest.raises(BuildError) as ei:
        builder.build_comfy_native(tensors, builder.Target(dest),
                                   builder.Recipe("fp8", family=families.get(ZIMAGE), min_features=4096))
    e = ei.value
    assert e.message == ("No Linear layer of the transformer's blocks passes the filter, so nothing would be "
                         "quantized.")
    assert (e.path, e.fix) == (dest, "Lower min_features.")
    assert os.listdir(tmp_path) == []


def test_comfy_key_map_from_a_folder_that_is_not_comfyui(tmp_path):
    with pytest.raises(BuildError) as ei:
        builder.comfy_key_map_from(str(tmp_path))
    e = ei.value
    assert e.message == "This is not a ComfyUI folder." and e.path == str(tmp_path)
    assert e.expected == "a folder containing comfy/utils.py" and "--comfyui" in e.fix


def test_comfy_key_map_for_a_family_comfyui_names_as_diffusers_does(tmp_path, monkeypatch):
    """Qwen-Image's ComfyUI keys are diffusers' (no map): the provider answers None without importing ComfyUI, and
    the build then takes the names as they are."""
    monkeypatch.setattr(sys, "path", list(sys.path))  # the provider puts the folder on sys.path: undone after
    (tmp_path / "comfy").mkdir()
    (tmp_path / "comfy" / "utils.py").write_text("raise ImportError('ComfyUI must not be imported here')\n")
    provider = builder.comfy_key_map_from(str(tmp_path))
    fam = families.get("qwen-image")
    assert fam.arch.comfy_key_map is None
    assert provider(fam, {"transformer_blocks.0.attn.to_q.weight": (3072, 3072)}) is None
    assert sys.path[0] == str(tmp_path) and "comfy.utils" not in sys.modules
