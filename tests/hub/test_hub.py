"""Hub sources: the pure planner, and real downloads by the real huggingface_hub client from a loopback Hub
(tests/hub_server.py) serving real tiny pre-quantized files; then the loader node and a real ComfyUI server."""
from __future__ import annotations

from prequant_core.context import LoadContext
from prequant_core.families import hub_names

import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import time

import pytest

from conftest import ROOT
from hub_server import free_port
from loopback_hub import LEGACY, MiB, PRIMARY, PT, REPO, cache_files, partials, sha256

NONE_CHOICE = "(none: use path or hub_repo)"
HF_CACHE = "Hugging Face cache"  # the loader's download_to option that keeps the shared cache


# --- the pure planner ---------------------------------------------------------------------------------------------

def test_filename_chain_and_model_name(monkeypatch):
    monkeypatch.setenv("UNSLOTH_DIFFUSION_PREQUANT_COMFY", "0")  # the artifact chain alone; twins: test_comfy_twins.py
    from prequant_core.load import sources
    assert sources.filenames(REPO, "int8") == (PRIMARY, PT, LEGACY)
    assert sources.filenames(REPO, "FP8") == ("Z-Image-Turbo-FP8.safetensors", "Z-Image-Turbo-FP8.pt",
                                              "transformer_fp8.pt")
    for repo, model in [("unsloth/FLUX.1-dev-FP8", "FLUX.1-dev"), ("a/Qwen-Image-2512-int8", "Qwen-Image-2512"),
                        ("a/Foo-NVFP4", "Foo"), ("a/Foo-MXFP8", "Foo"), ("a/Foo-quantized", "Foo"),
                        ("a/Plain", "Plain"), ("a/FP8", "FP8")]:
        assert hub_names.model_name(repo) == model, repo
    # weight-only: upper-cased normalized scheme, no legacy name (documented in sources.py)
    assert sources.filenames(REPO, "int8_wo") == ("Z-Image-Turbo-INT8-WEIGHT-ONLY.safetensors",
                                                  "Z-Image-Turbo-INT8-WEIGHT-ONLY.pt")


def test_plan_order_and_inputs():
    from prequant_core.load import sources
    from prequant_core.errors import HubError
    p = sources.plan(sources.Wanted("/m/x.safetensors", "https://huggingface.co/" + REPO + "/", "z-image", "int8",
                                    revision=" v1 "))
    assert [(c.place, c.origin) for c in p] == [("local", "path"), ("hub", "hub_repo")]
    assert p.candidates[1].repo == REPO and p.candidates[1].revision == "v1"  # the family repo is the same: not twice
    origins = [c.origin for c in sources.plan(sources.Wanted(None, "me/Other-FP8", "z-image", "fp8"))]
    assert origins == ["hub_repo", "family"]
    assert list(sources.plan(sources.Wanted(None, None, "auto", "auto"))) == []
    fam_only = sources.plan(sources.Wanted(None, None, "z-image", None))
    assert list(fam_only) == [] and "no scheme chosen" in fam_only.notes[0]
    assert list(sources.plan(sources.Wanted(None, None, "z-image", "int8-weight-only"))) == []
    # the repo holds fp8 and int8: both, fp8 first
    auto = sources.plan(sources.Wanted(None, REPO, None, None)).candidates[0]
    assert auto.scheme is None and auto.filenames == sources.filenames(REPO, "fp8") + sources.filenames(REPO, "int8")
    with pytest.raises(HubError, match="scheme"):
        sources.plan(sources.Wanted(None, "me/NoSuffix", None, "auto"))
    with pytest.raises(HubError, match="not a Hugging Face repo id"):
        sources.plan(sources.Wanted(None, "../etc/passwd", None, "int8"))
    # presets come from the family registry; a preset fills repo, scheme and family, and refuses a contradiction
    labels = sources.preset_labels()
    assert labels[0] == "none" and "Z-Image-Turbo / int8" in labels and "Z-Image-Turbo / fp8" in labels
    pp = sources.plan(sources.Wanted(None, None, None, None, preset="Z-Image-Turbo / fp8"))
    assert (pp.candidates[0].repo, pp.candidates[0].origin, pp.scheme, pp.family) == (REPO, "preset", "fp8", "z-image")
    with pytest.raises(HubError, match="preset"):
        sources.plan(sources.Wanted(None, None, None, "int8", preset="Z-Image-Turbo / fp8"))
    # what the user names explicitly wins over the preset (which is only a default source)
    local = sources.plan(sources.Wanted("/some/file.safetensors", None, None, "int8", preset="Z-Image-Turbo / fp8"))
    assert [c.place for c in local.candidates] == ["local"] and local.candidates[0].scheme == "int8"
    named = sources.plan(sources.Wanted(None, "someone/Other-INT8", None, None, preset="Z-Image-Turbo / fp8"))
    assert named.candidates[0].repo == "someone/Other-INT8" and named.candidates[0].scheme == "int8"


def test_family_with_several_hosted_repos_picks_by_variant_or_base(monkeypatch):
    monkeypatch.setenv("UNSLOTH_DIFFUSION_PREQUANT_COMFY", "0")  # the artifact chain alone; twins: test_comfy_twins.py
    from prequant_core import families
    from prequant_core.load import sources
    from prequant_core.errors import HubError
    zimg = families.get("z-image")
    fam = dataclasses.replace(zimg, name="multi", hosting=dataclasses.replace(
        zimg.hosting, base_repos=("org/Thing-schnell", "org/Thing-dev"),
        repos=("u/Thing-schnell-FP8", "u/Thing-dev-FP8", "u/Thing-Krea-dev-FP8")))
    monkeypatch.setitem(families.FAMILIES, "multi", fam)
    pick = lambda **kw: sources.plan(sources.Wanted(None, None, "multi", "fp8", **kw)).candidates[0].repo  # noqa: E731
    assert pick() == "u/Thing-schnell-FP8"  # the family's first base repo
    assert pick(base_model_id="org/Thing-dev") == "u/Thing-dev-FP8"
    assert pick(base_model_id="someone/thing-krea-dev") == "u/Thing-Krea-dev-FP8"  # tail, case-insensitive
    assert pick(variant="Krea-dev") == "u/Thing-Krea-dev-FP8"
    with pytest.raises(HubError, match="variant"):
        pick(variant="pro")
    first = sources.plan(sources.Wanted(None, None, "multi", "int8")).candidates[0].filenames[0]
    assert first == "Thing-schnell-INT8.safetensors"
    assert "Thing-dev / int8" in sources.preset_labels()


def test_a_repos_schemes_come_from_unsloths_table_not_its_suffix(monkeypatch):
    """unsloth/Qwen-Image-FP8 holds an int8 transformer (released Unsloth: only that); -MXFP8 / -NVFP4 repos resolve
    with scheme auto; a repo no family knows falls back to its suffix."""
    monkeypatch.setenv("UNSLOTH_DIFFUSION_PREQUANT_COMFY", "0")  # the artifact chain alone; twins: test_comfy_twins.py
    from prequant_core import families
    from prequant_core.load import sources
    assert families.hosted_schemes("unsloth/Qwen-Image-FP8") == ("int8", "fp8")
    assert families.hosted_schemes("unsloth/Z-Image-Turbo-NVFP4") == ("nvfp4",)
    assert "Qwen-Image / int8" in sources.preset_labels() and "Wan2.2-TI2V-5B / nvfp4" in sources.preset_labels()
    q = sources.plan(sources.Wanted(None, "unsloth/Qwen-Image-FP8", None, None)).candidates[0]
    assert q.scheme is None and "Qwen-Image-INT8.safetensors" in q.filenames and "transformer_int8.pt" in q.filenames
    for repo, scheme, first in [("someone/Thing-MXFP8", "mxfp8", "Thing-MXFP8.safetensors"),
                                ("unsloth/Wan2.2-TI2V-5B-NVFP4", "nvfp4", "Wan2.2-TI2V-5B-NVFP4.pt"),
                                ("someone/Thing-NVFP4", "nvfp4", "Thing-NVFP4.safetensors")]:
        c = sources.plan(sources.Wanted(None, repo, None, "auto")).candidates[0]
        assert (c.scheme, c.filenames[0]) == (scheme, first), repo
    # a family plans only the repos that really hold the scheme
    assert sources.hosted_repo("qwen-image", scheme="int8") == "unsloth/Qwen-Image-FP8"
    assert sources.hosted_repo("z-image", scheme="nvfp4") == "unsloth/Z-Image-Turbo-NVFP4"
    assert sources.hosted_repo("wan2.2-ti2v-5b", scheme="fp8") is None
    # the name chain in Unsloth's order: ConvRot build where hosted, declared, converted safetensors, pickle, legacy
    assert sources.filenames("unsloth/Qwen-Image-2.1-FP8", "int8")[0] == "Qwen-Image-2.1-INT8-ConvRot.safetensors"
    assert all(not n.endswith("ConvRot.safetensors") for n in sources.filenames("unsloth/Qwen-Image-2.1-FP8", "fp8"))
    assert families.convrot_hosted("unsloth/Z-Image-Turbo-FP8") is False
    assert sources.filenames("unsloth/Wan2.2-T2V-A14B-NVFP4", "nvfp4", component="transformer_2") == (
        "Wan2.2-T2V-A14B-transformer_2-NVFP4.pt", "Wan2.2-T2V-A14B-transformer_2-NVFP4.safetensors",
        "transformer_2_nvfp4.pt")


def test_usable_sources(tmp_path, monkeypatch):
    from prequant_core.load import sources
    monkeypatch.delenv("PREQUANT_ALLOW_LOCAL_PATH", raising=False)
    monkeypatch.delenv("UNSLOTH_ALLOW_LOCAL_PREQUANT_PATH", raising=False)
    inside = tmp_path / "models" / "a.safetensors"
    inside.parent.mkdir()
    inside.write_bytes(b"x")
    outside = tmp_path / "b.safetensors"
    outside.write_bytes(b"x")
    c_in = sources.Candidate("local", "path", path=str(inside))
    c_missing = sources.Candidate("local", "path", path=str(inside.parent / "missing.pt"))
    c_out = sources.Candidate("local", "path", path=str(outside))
    c_hub = sources.plan(sources.Wanted(None, REPO, None, "int8")).candidates[0]
    dirs = [str(inside.parent)]
    u = sources.usable([c_out, c_missing, c_in, c_hub], model_dirs=dirs)
    assert u.usable == (c_in, c_hub)
    assert [why for _, why in u.rejected] == ["outside the model folders and the allowlist", "no such file"]
    off = sources.usable([c_hub], model_dirs=dirs, offline=True, is_cached=lambda c: False)
    assert off.usable == () and "offline" in off.rejected[0][1]
    assert sources.usable([c_hub], offline=True, is_cached=lambda c: True).usable == (c_hub,)
    monkeypatch.setenv("PREQUANT_ALLOW_LOCAL_PATH", str(tmp_path))
    assert c_out in sources.usable([c_out]).usable


# --- downloads from the loopback Hub ------------------------------------------------------------------------------

def blobs(home) -> list[str]:
    return [f for f in cache_files(home) if "/blobs/" in f and not f.endswith(".incomplete")]


def test_primary_name_is_downloaded_into_the_standard_cache_and_loads(hub, hf_env, hub_files):
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    from prequant_core.errors import PathNotAllowedError
    from prequant_core.load.opening import open_checkpoint
    from prequant_core.load.metadata import Request
    hub.commit(REPO, {PRIMARY: hub_files["int8.safetensors"], PT: hub_files["int8.pt"], LEGACY: hub_files["int8.pt"]})
    f = h.download(REPO, (PRIMARY, PT, LEGACY))
    assert (f.filename, f.revision, f.downloaded, f.tried) == (PRIMARY, "main", True, [])
    assert f.path.startswith(str(hf_env / "hub" / "models--unsloth--Z-Image-Turbo-FP8" / "snapshots"))
    assert sha256(f.path) == sha256(hub_files["int8.safetensors"])
    assert len(blobs(hf_env)) == 1 and partials(hf_env) == []  # the client's own layout, one copy
    assert {r["filename"] for r in hub.log} == {PRIMARY}  # later names never asked for
    assert len(hub.body_gets()) == 1
    opened = open_checkpoint(f.path, Request(scheme="int8", family="z-image"), model_dirs=[f.storage_folder])
    assert opened.checkpoint.container == "safetensors" and opened.checkpoint.quantized_keys
    with pytest.raises(PathNotAllowedError):  # the cache is not a model folder unless the Hub step resolved it
        open_checkpoint(f.path, Request(), model_dirs=[])


@pytest.mark.parametrize("present,expected_tried", [
    ({PT: "int8.pt"}, [PRIMARY]),
    ({LEGACY: "int8.pt"}, [PRIMARY, PT]),
])
def test_fallback_names_on_entry_not_found(hub, hf_env, hub_files, present, expected_tried):
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    hub.commit(REPO, {name: hub_files[key] for name, key in present.items()})
    (name,) = present
    f = h.download(REPO, (PRIMARY, PT, LEGACY))
    assert f.filename == name and [t[0] for t in f.tried] == expected_tried
    assert all("EntryNotFound" in t[1] for t in f.tried)
    assert sha256(f.path) == sha256(hub_files[present[name]])
    order = [r["filename"] for r in hub.requests(route="resolve")]
    assert order[: len(expected_tried)] == expected_tried and set(order[len(expected_tried):]) == {name}
    assert [r["status"] for r in hub.requests(route="resolve")][: len(expected_tried)] == [404] * len(expected_tried)


def test_no_name_present_lists_every_name(hub, hf_env, hub_files):
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    hub.commit(REPO, {"README.md": hub_files["int8.pt"]})
    with pytest.raises(hub_errors.HubNotFoundError) as ei:
        h.download(REPO, (PRIMARY, PT, LEGACY))
    msg = str(ei.value)
    for needle in (REPO, "revision main", PRIMARY, PT, LEGACY, "Fix:", f"{REPO}/tree/main"):
        assert needle in msg, needle
    assert hub.requests("GET") == [] and blobs(hf_env) == []


def test_server_error_stops_without_trying_other_names(hub, hf_env, hub_files):
    """HTTP 500 on the first name: the client retries that request with back-off (~23 s), then a clear error; the
    .pt that does exist is never asked for, and nothing lands in the cache."""
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    hub.commit(REPO, {PRIMARY: hub_files["int8.safetensors"], PT: hub_files["int8.pt"]})
    hub.fault(REPO, PRIMARY, status=500, where="resolve")
    with pytest.raises(hub_errors.HubUnavailableError) as ei:
        h.download(REPO, (PRIMARY, PT, LEGACY))
    msg = str(ei.value)
    assert "HTTP 500" in msg and REPO in msg and PRIMARY in msg and "no other file name was tried" in msg
    assert {r["filename"] for r in hub.log} == {PRIMARY}
    assert len(hub.requests("HEAD", PRIMARY)) == 6  # 1 + the client's 5 retries
    assert blobs(hf_env) == [] and partials(hf_env) == []


def test_connection_refused(hf_env, monkeypatch, caplog):
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    caplog.set_level(logging.WARNING, logger="prequant")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(hub_errors.HubUnavailableError) as ei:
        h.download(REPO, (PRIMARY, PT, LEGACY))
    msg = str(ei.value)
    assert "Could not reach" in msg and PRIMARY in msg and PT not in msg and "HF_HUB_OFFLINE=1" in msg
    assert blobs(hf_env) == [] and partials(hf_env) == []
    # one plain sentence and the fix; the client's raw exception only in the log
    lines = msg.splitlines()
    assert len(lines) == 2 and lines[0].startswith("Could not reach") and lines[1].startswith("Fix: "), msg
    for raw in ("MaxRetryError", "ConnectionError", "ConnectionPool", "Errno", "\\'"):
        assert raw not in msg, (raw, msg)
    logged = " ".join(r.getMessage() for r in caplog.records if r.name == "prequant")
    assert "could not reach" in logged and ("ConnectionError" in logged or "Errno" in logged), logged


def test_short_body_leaves_no_partial_and_no_fallback(hub, hf_env, hub_files):
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    hub.commit(REPO, {PRIMARY: hub_files["int8.safetensors"], PT: hub_files["int8.pt"]})
    hub.fault(REPO, PRIMARY, short_by=1000, where="cdn")  # HEAD says N bytes, GET delivers N - 1000
    with pytest.raises(hub_errors.HubDownloadError) as ei:
        h.download(REPO, (PRIMARY, PT, LEGACY))
    assert "size mismatch" in str(ei.value) and PRIMARY in str(ei.value)
    assert hub.body_gets(PRIMARY) and not hub.requests(filename=PT)
    assert blobs(hf_env) == [] and partials(hf_env) == []
    assert not [p for p in cache_files(hf_env) if "/snapshots/" in p]


def test_unauthorised_asks_for_a_token_and_a_token_works(hub, hf_env, hub_files, monkeypatch, caplog):
    import logging
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    caplog.set_level(logging.DEBUG)  # the client's request logging included
    hub.commit(REPO, {PRIMARY: hub_files["int8.safetensors"], PT: hub_files["int8.pt"]})
    hub.require_token(REPO, "hf_good_token")
    for token in (None, "hf_wrong_token"):
        with pytest.raises(hub_errors.HubAuthError) as ei:
            h.download(REPO, (PRIMARY, PT, LEGACY), LoadContext.of(token=token))
        msg = str(ei.value)
        assert "HTTP 401" in msg and "HF_TOKEN" in msg and "hf auth login" in msg and REPO in msg
        assert "hf_wrong_token" not in msg
    assert not hub.requests(filename=PT) and blobs(hf_env) == []
    f = h.download(REPO, (PRIMARY, PT, LEGACY), LoadContext.of(token="hf_good_token"))  # an explicit token (library use)
    assert f.filename == PRIMARY and hub.requests("HEAD")[-1]["auth"]
    monkeypatch.setenv("HF_TOKEN", "hf_good_token")  # the client's default when no token is passed
    assert h.download(REPO, (PRIMARY, PT, LEGACY)).downloaded is False
    assert "hf_good_token" not in caplog.text and "hf_wrong_token" not in caplog.text


def test_offline_mode_serves_the_cache_or_names_every_file(hub, hf_env, hub_files, monkeypatch):
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    from prequant_core.load import sources
    hub.commit(REPO, {LEGACY: hub_files["int8.pt"]})
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(hub_errors.HubOfflineError) as ei:
        h.download(REPO, (PRIMARY, PT, LEGACY))
    for needle in (PRIMARY, PT, LEGACY, "HF_HUB_OFFLINE", str(hf_env / "hub")):
        assert needle in str(ei.value), needle
    assert hub.log == []
    cand = sources.plan(sources.Wanted(None, REPO, None, "int8")).candidates[0]
    assert hub_cache.is_cached(cand) is False
    monkeypatch.delenv("HF_HUB_OFFLINE")
    online = h.download(REPO, (PRIMARY, PT, LEGACY))
    n = len(hub.log)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub_cache.is_cached(cand) and sources.usable([cand], offline=True, is_cached=hub_cache.is_cached).usable == (cand,)
    off = h.download(REPO, (PRIMARY, PT, LEGACY))
    assert (off.filename, off.path, off.downloaded) == (LEGACY, online.path, False)
    assert len(hub.log) == n  # not a single request


def test_auto_on_a_repo_that_holds_only_int8_gets_the_int8_file(hub, hf_env, hub_files, monkeypatch):
    monkeypatch.setenv("UNSLOTH_DIFFUSION_PREQUANT_COMFY", "0")  # the artifact chain alone; twins: test_comfy_twins.py
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    from prequant_core.load import sources
    repo = "unsloth/Qwen-Image-FP8"
    hub.commit(repo, {"Qwen-Image-INT8.safetensors": hub_files["int8.safetensors"]})
    c = sources.plan(sources.Wanted(None, repo, None, None)).candidates[0]
    f = h.download(c.repo, c.filenames)
    assert f.filename == "Qwen-Image-INT8.safetensors"
    assert [t[0] for t in f.tried] == list(sources.filenames(repo, "fp8"))  # every fp8 name answered 404 first


def test_recorded_404s_in_the_cache_count_as_absent(hub, hf_env, hub_files, monkeypatch):
    """Another tool (Unsloth) recorded in the shared cache that the first names are not in the repo (``.no_exist``):
    offline they are skipped like any absent name and the cached one is served, with no request."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    from prequant_core.load import sources
    hub.commit(REPO, {LEGACY: hub_files["int8.pt"]})
    for fn in (PRIMARY, PT):
        with pytest.raises(EntryNotFoundError):
            hf_hub_download(REPO, fn, cache_dir=hub_cache.cache_dir(), endpoint=hub_cache.endpoint())
    hf_hub_download(REPO, LEGACY, cache_dir=hub_cache.cache_dir(), endpoint=hub_cache.endpoint())
    assert any(".no_exist" in f for f in cache_files(hf_env))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    n = len(hub.log)
    cand = sources.plan(sources.Wanted(None, REPO, None, "int8")).candidates[0]
    assert hub_cache.is_cached(cand)
    f = h.download(REPO, (PRIMARY, PT, LEGACY))
    assert f.filename == LEGACY and not f.downloaded and len(hub.log) == n


def test_operator_mirror_is_searched_before_the_hub(hub, hf_env, hub_files, tmp_path, monkeypatch):
    """UNSLOTH_DIFFUSION_PREQUANT_MIRROR: roots (os.pathsep), <root>/<owner>/<repo>/<file>; for a .pt name its
    converted .safetensors sibling first; never a path outside the root."""
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    empty, root = tmp_path / "empty-mirror", tmp_path / "mirror"
    (root / "unsloth" / "Z-Image-Turbo-FP8").mkdir(parents=True)
    empty.mkdir()
    shutil.copy(hub_files["int8.safetensors"], root / "unsloth" / "Z-Image-Turbo-FP8" / PRIMARY)
    monkeypatch.setenv(hub_local.MIRROR_ENV, os.pathsep.join([str(empty), str(root)]))
    f = h.download(REPO, (PT, LEGACY, PRIMARY))  # .pt asked first: its safetensors sibling is the mirror's hit
    assert f.filename == PRIMARY and f.path == str(root / "unsloth" / "Z-Image-Turbo-FP8" / PRIMARY)
    assert hub.log == [] and not f.downloaded
    assert hub_local.mirror_file(REPO, ("../Z-Image-Turbo-FP8/" + PRIMARY,)) is None
    outside = tmp_path / "outside.safetensors"
    shutil.copy(hub_files["int8.safetensors"], outside)
    os.symlink(outside, root / "unsloth" / "Z-Image-Turbo-FP8" / "link.safetensors")
    assert hub_local.mirror_file(REPO, ("link.safetensors",)) is None  # a link out of the mirror is not followed
    monkeypatch.setenv(hub_local.MIRROR_ENV, str(empty))
    hub.commit(REPO, {PRIMARY: hub_files["int8.safetensors"]})
    assert h.download(REPO, (PRIMARY,)).downloaded  # not in any mirror: the Hub as before


def test_second_load_does_not_download_again_and_a_pinned_commit_needs_no_request(hub, hf_env, hub_files):
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    commit = hub.commit(REPO, {PRIMARY: hub_files["int8.safetensors"]})
    first = h.download(REPO, (PRIMARY, PT, LEGACY))
    second = h.download(REPO, (PRIMARY, PT, LEGACY))
    assert first.downloaded and not second.downloaded and first.path == second.path
    assert len(hub.body_gets()) == 1  # the second load only asked for metadata
    n = len(hub.log)
    third = h.download(REPO, (PRIMARY, PT, LEGACY), revision=commit)
    assert third.path == first.path and len(hub.log) == n  # served by the client's commit-hash shortcut


def test_revision_pinning(hub, hf_env, hub_files):
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    old = hub.commit(REPO, {PT: hub_files["int8.pt"]}, ref="v1")
    hub.commit(REPO, {PRIMARY: hub_files["int8.safetensors"]})
    assert h.download(REPO, (PRIMARY, PT, LEGACY)).filename == PRIMARY
    for rev in ("v1", old):
        f = h.download(REPO, (PRIMARY, PT, LEGACY), revision=rev)
        assert f.filename == PT and f"/snapshots/{old}/" in f.path and sha256(f.path) == sha256(hub_files["int8.pt"])
    assert any(r["revision"] == "v1" for r in hub.log)
    n = len(hub.log)
    with pytest.raises(hub_errors.HubNotFoundError) as ei:
        h.download(REPO, (PRIMARY, PT, LEGACY), revision="no-such-branch")
    assert "revision 'no-such-branch' does not exist" in str(ei.value)
    assert len(hub.log) == n + 1  # one answer, no other names tried


def test_a_pinned_commit_skips_a_name_the_cache_records_as_absent_without_a_request(hub, hf_env, hub_files):
    """A commit's files never change: a name the client's cache records as absent at that commit (``.no_exist``,
    written by the client itself on a 404) is passed over offline, and the next cached name is served."""
    import huggingface_hub
    from huggingface_hub.errors import EntryNotFoundError
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h
    commit = hub.commit(REPO, {PT: hub_files["int8.pt"]})
    assert h.download(REPO, (PT,), revision=commit).filename == PT
    with pytest.raises(EntryNotFoundError):  # the real client records the miss in its cache
        huggingface_hub.hf_hub_download(REPO, PRIMARY, revision=commit, cache_dir=hub_cache.cache_dir(),
                                        endpoint=hub_cache.endpoint())
    n = len(hub.log)
    f = h.download(REPO, (PRIMARY, PT, LEGACY), revision=commit)
    assert f.filename == PT and not f.downloaded and len(hub.log) == n  # no request at all
    assert f.tried == [(PRIMARY, "not in the repo (recorded in the cache)")]
    # every name recorded as absent: the cache cannot answer, so the Hub is asked, and says the same
    with pytest.raises(hub_errors.HubNotFoundError):
        h.download(REPO, (PRIMARY,), revision=commit)
    assert len(hub.log) > n


def test_interrupted_transfer_resumes_with_a_range_request(hub, hf_env, hub_files):
    """The server drops the connection mid-body once; the next request asks only for the missing bytes."""
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    hub.commit(REPO, {PRIMARY: hub_files["int8.safetensors"]})
    size = os.path.getsize(hub_files["int8.safetensors"])
    hub.fault(REPO, PRIMARY, drop_after=45 * MiB, times=1, method="GET", where="cdn")
    f = h.download(REPO, (PRIMARY, PT, LEGACY))
    gets = hub.body_gets(PRIMARY)
    assert [g["range_start"] for g in gets][0] is None and len(gets) == 2
    resumed_at = gets[1]["range_start"]
    assert 0 < resumed_at <= 45 * MiB and gets[1]["sent"] == size - resumed_at
    assert gets[0]["sent"] + gets[1]["sent"] < 2 * size
    assert sha256(f.path) == sha256(hub_files["int8.safetensors"]) and partials(hf_env) == []
    print(f"\n[measured] {size} B file, dropped after {gets[0]['sent']} B, resumed at byte {resumed_at}, "
          f"second request sent {gets[1]['sent']} B")


def test_download_killed_mid_way_resumes_on_the_next_run(hub, hf_env, hub_files):
    """A process killed while downloading (ComfyUI closed) leaves the client's .incomplete file; the next run
    continues from it instead of starting over."""
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    hub.commit(REPO, {PRIMARY: hub_files["int8.safetensors"]})
    size = os.path.getsize(hub_files["int8.safetensors"])
    hub.slow[(REPO, PRIMARY)] = 0.01  # 256 KiB per 10 ms
    code = ("import sys; from huggingface_hub import hf_hub_download; "
            "hf_hub_download(sys.argv[1], sys.argv[2], endpoint=sys.argv[3])")
    proc = subprocess.Popen([sys.executable, "-c", code, REPO, PRIMARY, hub.url], env=dict(os.environ),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            part = partials(hf_env)
            if part and os.path.getsize(hf_env / part[0]) >= 20 * MiB:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the first download never got going")
    finally:
        proc.kill()
        proc.wait(10)
    kept = os.path.getsize(hf_env / partials(hf_env)[0])
    assert 0 < kept < size
    hub.slow.clear()
    f = h.download(REPO, (PRIMARY, PT, LEGACY))
    last = hub.body_gets(PRIMARY)[-1]
    assert last["range_start"] == kept and last["sent"] == size - kept
    assert sha256(f.path) == sha256(hub_files["int8.safetensors"]) and partials(hf_env) == []
    print(f"\n[measured] killed with {kept} B on disk; the next run fetched {last['sent']} B of {size}")


def test_progress_reports_bytes(hub, hf_env, hub_files):
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    hub.commit(REPO, {PRIMARY: hub_files["int8.safetensors"]})
    size = os.path.getsize(hub_files["int8.safetensors"])
    hub.slow[(REPO, PRIMARY)] = 0.005
    seen = []
    h.download(REPO, (PRIMARY,), LoadContext.of(progress=lambda d, t: seen.append((d, t))))
    assert seen[-1] == (size, size) and {t for _, t in seen} == {size}
    done = [d for d, _ in seen]
    assert done == sorted(done) and len({d for d in done if 0 < d < size}) >= 2, seen


def test_status_says_what_is_happening(hub, hf_env, hub_files):
    """Each stage of a wait is announced before it starts: connecting (per name tried), then downloading."""
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    hub.commit(REPO, {PT: hub_files["int8.pt"]})
    said = []
    h.download(REPO, (PRIMARY, PT), LoadContext.of(status=said.append))
    ep = hub_cache.endpoint()
    assert said == [f"connecting to {ep} for {REPO}/{PRIMARY}", f"connecting to {ep} for {REPO}/{PT}",
                    f"downloading {PT} from {REPO}"], said
    said.clear()
    h.download(REPO, (PRIMARY, PT), LoadContext.of(status=said.append, download_dir=str(hf_env / "models")))
    assert said[-1] == f"downloading {PT} from {REPO}", said


# --- the loader node (ComfyUI in-process) and a real ComfyUI server ---------------------------------------------

def test_node_downloads_shows_progress_loads_and_samples(comfy, hub, hf_env, hub_files, allow_dir, monkeypatch):
    _, pack = comfy
    import comfy.utils as comfy_utils
    import torch
    from conftest import sample
    from prequant_core.errors import PathNotAllowedError
    Loader = pack.nodes.load_node.PrequantLoadTransformer
    hub.commit(REPO, {PRIMARY: hub_files["int8.safetensors"]})
    hub.slow[(REPO, PRIMARY)] = 0.003
    seen = []
    # ComfyUI's own hook API (what its server installs to send progress to the browser)
    previous = comfy_utils.PROGRESS_BAR_HOOK
    comfy_utils.set_progress_bar_global_hook(lambda v, t, preview, node_id=None: seen.append((v, t)))
    try:
        out = Loader().load(NONE_CHOICE, hub_repo=REPO, scheme="int8", download_to=HF_CACHE)
    finally:
        comfy_utils.set_progress_bar_global_hook(previous)
    size = os.path.getsize(hub_files["int8.safetensors"])
    assert seen and seen[-1] == (size, size) and len(seen) >= 3, seen
    s = out["ui"]["prequant"][0]
    assert (s["file"], s["source"], s["downloaded"], s["scheme"]) == (PRIMARY, f"hub:{REPO}@main", True, "int8")
    from_hub = sample(out["result"][0])
    # the same file from a local folder gives the same model: bit-identical sampling
    allow_dir(os.path.dirname(hub_files["int8.safetensors"]))
    local = Loader().load(NONE_CHOICE, path=hub_files["int8.safetensors"])
    assert torch.equal(from_hub, sample(local["result"][0])) and torch.isfinite(from_hub).all()
    # a preset alone resolves the same repo; a second load reuses the cache
    again = Loader().load(NONE_CHOICE, preset="Z-Image-Turbo / int8", download_to=HF_CACHE)
    assert again["ui"]["prequant"][0]["downloaded"] is False and len(hub.body_gets()) == 1
    # the HF cache is allowed only for what the Hub step resolved, never for a typed path
    monkeypatch.delenv("PREQUANT_ALLOW_LOCAL_PATH")
    cached = next(str(hf_env / p) for p in cache_files(hf_env) if "/snapshots/" in p)
    n = len(hub.log)
    with pytest.raises(PathNotAllowedError):
        Loader().load(NONE_CHOICE, path=cached)
    with pytest.raises(PathNotAllowedError):  # a refused typed path is an error, never a silent download instead
        Loader().load(NONE_CHOICE, path=cached, hub_repo=REPO, scheme="int8")
    assert len(hub.log) == n
    assert "hf_secret_value" not in Loader.IS_CHANGED(NONE_CHOICE, hub_repo=REPO, hf_token="hf_secret_value")


def test_workflow_with_only_hub_repo_and_scheme_runs_on_a_real_comfyui_server(hub, tmp_path, hub_files, comfy):
    from tools import tiny_assets
    hub.commit(REPO, {PRIMARY: hub_files["int8.safetensors"], PT: hub_files["int8.pt"]})
    hub.slow[(REPO, PRIMARY)] = 0.003  # about a second, so the bar moves
    base = tmp_path / "server"
    tiny_assets.install(str(base / "models"))
    env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf_server"), "HF_HUB_OFFLINE": "0", "HF_TOKEN": "",
           "PREQUANT_ALLOW_LOCAL_PATH": ""}
    try:
        _run_hub_workflow(hub, base, env)
    finally:
        shutil.rmtree(base / "models", ignore_errors=True)  # the tiny CLIP alone is 250 MB
        shutil.rmtree(tmp_path / "hf_server", ignore_errors=True)


class WsListener:
    """Collects the JSON messages ComfyUI sends one client over its websocket (what the browser sees)."""

    def __init__(self, url):
        import threading
        self.url, self.messages, self._stop = url, [], threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        import asyncio
        import aiohttp

        async def main():
            async with aiohttp.ClientSession() as session, session.ws_connect(self.url) as ws:
                self._ready.set()
                while not self._stop.is_set():
                    try:
                        msg = await ws.receive(timeout=0.2)
                    except asyncio.TimeoutError:
                        continue
                    if msg.type == aiohttp.WSMsgType.TEXT:
                        self.messages.append(json.loads(msg.data))
                    elif msg.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                        break
        try:
            asyncio.run(main())
        finally:
            self._ready.set()

    def __enter__(self):
        self._thread.start()
        assert self._ready.wait(30)
        return self

    def __exit__(self, *exc):
        time.sleep(0.3)  # let the last messages arrive
        self._stop.set()
        self._thread.join(10)


def _run_hub_workflow(hub, base, env):
    from tools import tiny_assets
    from tools.comfy_server import ComfyServer, execution_error
    from tools.workflow import to_api
    with ComfyServer(str(base), env=env) as server:
        info = server.get("/object_info")["PrequantLoadTransformer"]["input"]
        assert {"hub_repo", "preset", "revision", "download_to"} <= set(info["optional"])
        assert "hf_token" not in info["optional"]
        assert "Z-Image-Turbo / int8" in info["optional"]["preset"][0]
        none_choice = info["required"]["checkpoint"][0][0]
        with open(os.path.join(ROOT, "example_workflows", "z_image_turbo_prequant.json")) as fh:
            wf = json.load(fh)
        prompt = to_api(wf, server.get("/object_info"), {
            "Load Prequant Transformer": {"checkpoint": none_choice, "hub_repo": REPO, "scheme": "int8",
                                          "base_model_id": "", "family": "auto"},
            "PrequantLoadTextEncoder": tiny_assets.text_encoder_stand_in(),
            "VAELoader": {"vae_name": tiny_assets.VAE_NAME},
            "EmptySD3LatentImage": {"width": 128, "height": 128},
            "KSampler": {"steps": 2},
        })
        loader_id = next(k for k, v in prompt.items() if v["class_type"] == "PrequantLoadTransformer")
        with WsListener(server.url.replace("http", "ws") + "/ws?clientId=prequant-tests") as ws:
            entry = server.run(prompt, timeout=300)
        assert execution_error(entry) is None, execution_error(entry) or server.log_tail()
        size = os.path.getsize(hub.repos[REPO]["commits"][hub.repos[REPO]["refs"]["main"]][PRIMARY].path)
        bar = [(m["data"]["value"], m["data"]["max"]) for m in ws.messages
               if m.get("type") == "progress" and m["data"].get("node") == loader_id]
        assert bar and bar[-1] == (size, size) and len(bar) >= 2, bar  # the download bar on the loader node
        loader_ui = [o["prequant"][0] for o in entry["outputs"].values() if "prequant" in o]
        assert loader_ui[0]["source"] == f"hub:{REPO}@main" and loader_ui[0]["file"] == PRIMARY
        images = [i for o in entry["outputs"].values() for i in o.get("images", [])]
        assert len(images) == 1
        assert os.path.getsize(os.path.join(base, "output", images[0].get("subfolder", ""), images[0]["filename"]))
    assert len(hub.body_gets(PRIMARY)) == 1 and not hub.requests(filename=PT)
    # stored in models/prequant (the default), not in the Hugging Face cache
    assert os.path.getsize(os.path.join(base, "models", "prequant", *REPO.split("/"), PRIMARY)) == size
    assert not any("/snapshots/" in p for p in cache_files(env["HF_HOME"]))
    staging = os.path.join(base, "models", "prequant", ".prequant-download")
    assert not os.path.isdir(staging) or os.listdir(staging) == [], "the staging folder is emptied after the move"
