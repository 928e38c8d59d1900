"""The load pipeline's open, judge and locate steps at their edges (``prequant_core/load/opening.py``,
``prequant_core/load/locate.py``): Info's lenient judgement of a file whose family no metadata or tensor name tells
while the request names one (noted, judged as the family asked for); a text-encoder judgement asked for a family this
pack does not register (refused by name, as a transformer's is); Info given a file the caller already opened (the
handle is used as it is, its allowlist already judged); and, offline, a Hub candidate without a cached file skipped
with a warning naming it and the candidate used instead (real files served once by the loopback Hub to the real
huggingface_hub client, then read from its cache). Core tier: no ComfyUI."""
from __future__ import annotations

import logging
import os

import pytest
import torch
from safetensors.torch import save_file

import unsloth_te_builder as te_builder
from conftest import BASE_ID
from loopback_hub import PRIMARY, REPO
from prequant_core import formats, report
from prequant_core.errors import PrequantError, UnknownFamilyError
from prequant_core.request import Request


def test_info_notes_an_unrecognised_family_and_judges_it_as_the_family_asked_for(tmp_path):
    path = str(tmp_path / "mystery.safetensors")
    save_file({"encoder.block.0.proj.weight": torch.randn(64, 64).bfloat16(),
               "encoder.norm.weight": torch.ones(64).bfloat16()}, path)
    r = report.info(path, Request(family="z-image", scheme="int8", base_model_id=BASE_ID))
    assert r.notes == ["model family not recognised from the metadata or the tensor names"]
    # no family recognises these names, the requested one included: no layout is claimed for them
    assert r.layout is None and r.family is None
    assert r.request == {"base_model_id": BASE_ID, "scheme": "int8", "family": "z-image"}
    assert not r.valid and "INVALID for base_model_id" in r.verdict_line() and "family 'z-image'" in r.verdict_line()
    assert any("no quantized weights" in why for why in r.reasons)
    assert any("records no base_model_id" in why for why in r.reasons)


def _encoder(tmp_path, family):
    path = str(tmp_path / "encoder.safetensors")
    te_builder.build_file(path, "Qwen3ForCausalLM", base_model_id=BASE_ID, family=family)
    return path


def test_a_text_encoder_judged_for_a_family_this_pack_does_not_register_is_refused_by_name(tmp_path):
    path = _encoder(tmp_path, "sd15")
    with pytest.raises(UnknownFamilyError) as e:
        report.info(path, Request(family="sd15", component="text_encoder"))
    assert "Unknown model family 'sd15'" in str(e.value) and "z-image" in str(e.value)
    # the same file without a family asked for: the unknown family it records is a note, not a refusal
    r = report.info(path)
    assert "family 'sd15' is not one this pack registers" in r.notes and r.family == "sd15"


def test_info_reads_through_a_handle_the_caller_opened(tmp_path, prequant_files):
    import shutil
    path = str(tmp_path / "mine.safetensors")
    shutil.copyfile(prequant_files("int8", "safetensors"), path)
    elsewhere = tmp_path / "models"
    elsewhere.mkdir()
    # by name, the allowlist judges it against the folders given: refused
    with pytest.raises(PrequantError) as e:
        report.info(path, model_dirs=[str(elsewhere)])
    assert "mine.safetensors" in str(e.value)
    # a handle the caller opened (and judged) is read as it is
    with formats.open_file(path) as f:
        os.rename(path, tmp_path / "renamed.safetensors")  # the handle, not the name, is read
        r = report.info(f, Request(scheme="int8", base_model_id=BASE_ID), model_dirs=[str(elsewhere)])
    assert r.valid, r.reasons
    assert r.path == path and r.scheme == "int8" and r.family == "z-image" and r.quantized_count > 0
    assert r.read_mode == "header"


def test_offline_a_hub_candidate_without_a_cached_file_is_skipped_with_a_warning(hub, hf_env, hub_files,
                                                                                  monkeypatch, caplog):
    from huggingface_hub import constants
    from prequant_core.context import LoadContext
    from prequant_core.hub import fetch
    from prequant_core.load import locate
    from prequant_core.request import Candidate
    hub.commit(REPO, {PRIMARY: hub_files["int8.safetensors"]})
    online = fetch.download(REPO, (PRIMARY,))
    assert online.downloaded
    missing = Candidate("hub", "preset", scheme="int8", repo="unsloth/Z-Image-Turbo-NVFP4",
                        filenames=("Z-Image-Turbo-NVFP4.safetensors",))
    cached = Candidate("hub", "preset", scheme="int8", repo=REPO, filenames=(PRIMARY,))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    n = len(hub.log)
    with caplog.at_level(logging.WARNING, logger="prequant"):
        loc = locate.locate([missing, cached], LoadContext())
    assert loc.candidate is cached and loc.path == online.path and not loc.fetched.downloaded
    assert len(hub.log) == n, "offline: not a single request"
    warnings = [r.getMessage() for r in caplog.records if r.name == "prequant" and r.levelno == logging.WARNING]
    assert warnings == [f"[prequant] skipping Hub repo unsloth/Z-Image-Turbo-NVFP4 "
                        f"(Z-Image-Turbo-NVFP4.safetensors): offline (HF_HUB_OFFLINE) and none of its files is in the "
                        f"local cache; using Hub repo {REPO} ({PRIMARY})"], warnings
