"""prequant_core/load/sources.py's pure planning helpers against the shipped family table: how a candidate
describes itself (local file, Hub repo with and without a revision), artifact stems of names that are no artifact,
a twin with no sibling left in place, a hosted repo picked by a variant that is a model name, an unknown preset,
and hub_origin for a stored file with no scheme or too few folders. Core tier: no ComfyUI; no file or network is touched."""
from __future__ import annotations

import pytest

from prequant_core.errors import HubError
from prequant_core.load import sources
from prequant_core.families import hub_names


def test_candidates_describe_themselves():
    assert sources.Candidate("local", "path", path="/m/x.safetensors").describe() == "local file /m/x.safetensors"
    hub = sources.Candidate("hub", "hub_repo", repo="unsloth/Z-Image-Turbo-FP8",
                            filenames=("a.safetensors", "b.pt"))
    assert hub.describe() == "Hub repo unsloth/Z-Image-Turbo-FP8 (a.safetensors, b.pt)"
    pinned = sources.Candidate("hub", "hub_repo", repo="unsloth/Z-Image-Turbo-FP8", filenames=("a.safetensors",),
                               revision="0123abc")
    assert pinned.describe() == "Hub repo unsloth/Z-Image-Turbo-FP8@0123abc (a.safetensors)"
    # a plan's own candidates say the same
    (c,) = sources.plan(sources.Wanted(hub_repo="unsloth/Z-Image-Turbo-FP8", scheme="fp8", revision="main")).candidates
    assert c.describe().startswith("Hub repo unsloth/Z-Image-Turbo-FP8@main (")


def test_names_that_are_no_artifact_have_no_stem():
    assert hub_names.artifact_stem("README.md") is None
    assert hub_names.artifact_stem("model.bin") is None
    assert hub_names.artifact_stem("Z-Image-Turbo-FP8.safetensors") == "Z-Image-Turbo-FP8"


def test_a_twin_without_a_sibling_stays_where_it_is():
    names = ["A-FP8-ComfyUI.safetensors", "B-FP8.safetensors"]
    for cached in (lambda n: True, lambda n: False):
        assert hub_names.prefer_cached_twins(names, cached) == names


def test_a_variant_naming_a_hosted_model_picks_its_repo():
    assert sources.hosted_repo("flux.1", variant="FLUX.1-dev") == "unsloth/FLUX.1-dev-FP8"
    assert sources.hosted_repo("flux.1", variant="FLUX.1-Krea-dev", scheme="int8") == "unsloth/FLUX.1-Krea-dev-FP8"


def test_an_unknown_preset_is_refused_with_the_list():
    with pytest.raises(HubError, match="Unknown preset 'No Such Model / fp8'") as e:
        sources.get_preset("No Such Model / fp8")
    assert "Z-Image-Turbo / fp8" in e.value.expected and e.value.expected.startswith("none, ")
    assert e.value.fix == "Pick a preset from the list (the list follows the families this pack supports)."
    # the text-encoder loader's presets: the same refusal, its own list and words
    from prequant_core.text_encoders import sources as encoder_sources
    assert encoder_sources.get_preset("none") is None
    with pytest.raises(HubError, match="Unknown text-encoder preset 'Z-Image-Turbo / fp8'") as e:
        encoder_sources.get_preset("Z-Image-Turbo / fp8")
    assert "Z-Image / text_encoder" in e.value.expected and "Z-Image-Turbo / fp8" not in e.value.expected
    assert e.value.fix == "Pick a preset from the list (one per family with a hosted text encoder)."


def test_hub_origin_needs_a_scheme_and_an_origin_folder():
    assert sources.hub_origin("/unsloth/Z-Image-Turbo-FP8.safetensors", "fp8") is None  # too few folders for one
    path = "/models/prequant/unsloth/Z-Image-Turbo-FP8/Z-Image-Turbo-FP8.safetensors"
    assert sources.hub_origin(path, None) is None
    assert sources.hub_origin(path, "") is None
    got = sources.hub_origin(path, "fp8")
    assert got["repo"] == "unsloth/Z-Image-Turbo-FP8" and got["served"] == "Z-Image-Turbo-FP8.safetensors"
