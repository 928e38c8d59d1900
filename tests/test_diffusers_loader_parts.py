"""The diffusers loader's own steps (prequant_core/diffusers_loader.py) with the pinned diffusers 0.38 classes, no
file loaded: the class passed as a class, the family a class and a family name give (a family for another class, a
class no family loads into, several families sharing a class and a base naming none of them), a base config that
diffusers cannot read (a damaged local config.json, a base that is neither a folder nor a repo id), what looks like a
Hub repo id, and a model left with a parameter on ``meta`` after its load. Core tier: no ComfyUI."""
from __future__ import annotations

import diffusers
import pytest
import torch

from prequant_core import diffusers_loader as dl
from prequant_core.errors import CheckpointNotFoundError, CorruptCheckpointError, UnknownFamilyError


def test_a_class_is_taken_as_it_is_and_a_name_is_looked_up():
    assert dl._transformer_class(diffusers.ZImageTransformer2DModel) is diffusers.ZImageTransformer2DModel
    assert dl._transformer_class("ZImageTransformer2DModel") is diffusers.ZImageTransformer2DModel


def test_a_named_family_must_load_into_the_class():
    assert dl._family_for(diffusers.ZImageTransformer2DModel, "z-image", "x/y").name == "z-image"
    with pytest.raises(UnknownFamilyError, match="loads into FluxTransformer2DModel, not ZImageTransformer2DModel"):
        dl._family_for(diffusers.ZImageTransformer2DModel, "flux.1", "x/y")


def test_a_class_no_family_loads_into_is_refused_with_the_classes_that_are():
    with pytest.raises(UnknownFamilyError, match="No registered family loads into SD3Transformer2DModel") as e:
        dl._family_for(diffusers.SD3Transformer2DModel, None, "stabilityai/sd3")
    assert "ZImageTransformer2DModel" in e.value.expected and "FluxTransformer2DModel" in e.value.expected


def test_families_sharing_a_class_are_told_apart_by_the_base():
    cls = diffusers.Flux2Transformer2DModel
    assert dl._family_for(cls, None, "black-forest-labs/FLUX.2-dev").name == "flux.2-dev"
    assert dl._family_for(cls, None, "black-forest-labs/FLUX.2-klein-4B").name == "flux.2-klein"
    # a base naming neither: the first family registered for the class
    first = [f for f in dl.families.FAMILIES.values() if f.arch.diffusers_class == cls.__name__][0]
    assert dl._family_for(cls, None, "someone/my-flux2-finetune") is first


def test_a_damaged_local_config_is_a_not_found_error(tmp_path):
    (tmp_path / "transformer").mkdir()
    (tmp_path / "transformer" / "config.json").write_text("{not json")
    with pytest.raises(CheckpointNotFoundError, match="Could not read the transformer config") as e:
        dl._config(diffusers.ZImageTransformer2DModel, str(tmp_path), "transformer", None, None)
    assert e.value.expected == "a folder with transformer/config.json"


def test_a_base_that_is_neither_a_folder_nor_a_repo_id_is_a_not_found_error(tmp_path):
    base = str(tmp_path / "no such folder" / "x y")  # not a folder; not a valid repo id, so nothing is downloaded
    with pytest.raises(CheckpointNotFoundError, match="Could not read the transformer config") as e:
        dl._config(diffusers.ZImageTransformer2DModel, base, "transformer", None, None)
    assert e.value.expected == "a Hub repo with transformer/config.json"


def test_what_looks_like_a_repo_id():
    assert dl._looks_like_repo("unsloth/Z-Image-Turbo-FP8")
    assert not dl._looks_like_repo("not a repo id")
    assert not dl._looks_like_repo("a/../b")


def test_a_parameter_left_on_meta_is_refused():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2, device="meta"))
    with pytest.raises(CorruptCheckpointError, match="2 model tensors are neither in the file") as e:
        dl._rebuild_non_persistent_buffers(model, "/m.safetensors")
    assert "1.weight, 1.bias" in str(e.value)
    dl._rebuild_non_persistent_buffers(torch.nn.Linear(2, 2), "/m.safetensors")  # nothing on meta: nothing said
