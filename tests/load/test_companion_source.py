"""A family's companion (prequant_core/load/companion_source.py: LTX-2.3's text connectors, which ComfyUI's LTXAV holds
and Unsloth's transformer files do not), found as a user meets it: from the base repo on a loopback Hub through the
Hugging Face cache (once; offline afterwards), or a file of its local name in a model folder; a file that is not the
companion is refused naming that file."""
from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import save_file

from prequant_core import families
from prequant_core.errors import CorruptCheckpointError, HubError
from prequant_core.load import companion_source
from prequant_core.context import LoadContext

FAM = families.get("ltx-2")
C = FAM.arch.companion
REPO = FAM.hosting.base_repos[0]


def _component(path: str, *, sides=("video", "audio")) -> str:
    """A connectors component as diffusers saves it: both connectors and the text projections beside them."""
    g = torch.Generator().manual_seed(0)
    t = {"video_text_proj_in.weight": torch.randn(16, 32, generator=g).to(torch.bfloat16),
         "audio_text_proj_in.weight": torch.randn(16, 32, generator=g).to(torch.bfloat16)}
    for side in sides:
        t[f"{side}_connector.learnable_registers"] = torch.randn(4, 16, generator=g).to(torch.bfloat16)
        t[f"{side}_connector.transformer_blocks.0.attn1.to_q.weight"] = torch.randn(16, 16, generator=g)
    save_file(t, path)
    return path


def test_a_file_without_the_companion_needs_it_and_one_with_it_does_not():
    assert companion_source.needed(FAM, {"proj_in.weight": None})
    assert not companion_source.needed(FAM, {"proj_in.weight": None, C.prefix + "video_connector.x": None})
    # a ComfyUI-layout file holds them where ComfyUI's class has them
    assert not companion_source.needed(FAM, {"patchify_proj.weight": None, C.comfy_prefixes[0] + "x": None})
    assert not companion_source.needed(families.get("krea-2"), {"img_in.weight": None})
    assert not companion_source.needed(None, {})


def test_fetched_from_the_base_repo_once_then_read_offline(hub, hf_env, tmp_path):
    hub.commit(REPO, {C.repo_file: _component(str(tmp_path / "connectors.safetensors"))})
    said = []
    found = companion_source.find(FAM, LoadContext(status=said.append))
    assert found.source == f"{REPO}/{C.repo_file} (downloaded)" and str(hf_env) in found.path
    assert any(C.repo_file in s for s in said), said
    # only the connectors, under the prefix the family's map reads; the text projections are the encoder's
    assert sorted(found.tensors) == sorted(C.prefix + k for k in (
        "video_connector.learnable_registers", "video_connector.transformer_blocks.0.attn1.to_q.weight",
        "audio_connector.learnable_registers", "audio_connector.transformer_blocks.0.attn1.to_q.weight"))
    gets = len(hub.body_gets(C.repo_file))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        again = companion_source.find(FAM, LoadContext())
    assert again.source.endswith("(cached)") and len(hub.body_gets(C.repo_file)) == gets
    assert all(torch.equal(again.tensors[k], found.tensors[k]) for k in found.tensors)


def test_a_local_copy_is_used_without_asking_the_hub(hub, hf_env, tmp_path):
    folder = tmp_path / "prequant"
    folder.mkdir()
    _component(str(folder / C.local_name))
    found = companion_source.find(FAM, LoadContext.of(model_dirs=[str(folder)]))
    assert found.source == f"{C.local_name} (local)" and not hub.requests()


def test_offline_without_it_names_the_repo_file(hf_env, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubError) as e:
        companion_source.find(FAM, LoadContext())
    assert REPO in str(e.value) and C.repo_file in str(e.value)
    assert f"ComfyUI/models/prequant/ as {C.local_name}" in str(e.value)  # where a copy is read without the Hub


@pytest.mark.parametrize("case", ["one-connector", "not-safetensors", "garbage"])
def test_a_file_that_is_not_the_companion_is_refused_naming_it(tmp_path, case):
    folder = tmp_path / "prequant"
    folder.mkdir()
    path = str(folder / C.local_name)
    if case == "one-connector":  # a connectors file from which the audio connector was left out
        _component(path, sides=("video",))
    elif case == "garbage":
        with open(path, "wb") as f:
            f.write(b"\xff" * 64)
    else:
        path = str(folder / "connectors.pt")
        with open(path, "wb") as f:
            f.write(b"PK\x03\x04")
    with pytest.raises(CorruptCheckpointError) as e:
        companion_source.read(FAM, path)
    msg = str(e.value)
    assert path in msg and C.local_name in msg, msg  # the file at fault, and what to put where
    if case == "one-connector":
        assert "audio_connector." in msg
    if case != "not-safetensors":  # found through the model folder, the same refusal
        with pytest.raises(CorruptCheckpointError):
            companion_source.find(FAM, LoadContext.of(model_dirs=[str(folder)]))
    assert os.path.exists(path)  # a refused file is left where the user put it
