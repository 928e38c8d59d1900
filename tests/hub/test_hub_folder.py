"""Hub downloads into a model folder (the loader's default: models/prequant), with the real ``huggingface_hub`` client
against the loopback Hub: resumable, never half-written under the final name, reused without any request, and the
first folder ComfyUI lists for ``prequant`` (extra_model_paths.yaml) is where they land."""
from __future__ import annotations

from prequant_core.context import LoadContext

import os
import subprocess
import sys
import time

import pytest

from conftest import ROOT
from loopback_hub import LEGACY, PRIMARY, PT, REPO, cache_files, sha256  # noqa: F401

MiB = 2**20
NAMES = (PRIMARY, PT, LEGACY)
ORIGIN = os.path.join(*REPO.split("/"))  # downloads are kept under where they came from: <owner>/<repo>/


tree = cache_files  # every file under a folder, relative, sorted


def model_files(d) -> list[str]:
    """What a model list would offer: .safetensors / .pt anywhere under the folder, hidden folders included
    (ComfyUI's own listing skips only .git)."""
    return [f for f in tree(d) if f.endswith((".safetensors", ".pt"))]


def test_download_lands_in_the_folder_and_is_reused_without_a_request(hub, hf_env, hub_files, tmp_path):
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    dest = tmp_path / "prequant"
    dest.mkdir()
    hub.commit(REPO, {PRIMARY: hub_files["int8.safetensors"]})
    f = h.download(REPO, NAMES, LoadContext.of(download_dir=str(dest)))
    assert f.path == str(dest / ORIGIN / PRIMARY) and f.downloaded and f.storage_folder == str(dest / ORIGIN)
    assert sha256(f.path) == sha256(hub_files["int8.safetensors"])
    assert model_files(dest) == [os.path.join(ORIGIN, PRIMARY)], tree(dest)  # staging emptied, nothing else offered
    assert os.listdir(dest) == ["unsloth"], "the hidden staging folder is gone after a completed download"
    assert not any("/snapshots/" in p for p in tree(hf_env)), "nothing goes to the Hugging Face cache"
    n = len(hub.log)
    again = h.download(REPO, NAMES, LoadContext.of(download_dir=str(dest)))
    assert again.path == f.path and not again.downloaded and len(hub.log) == n  # no request at all
    # a second prequant folder (extra_model_paths) holding the file counts too
    other = tmp_path / "other"
    other.mkdir()
    third = h.download(REPO, NAMES, LoadContext.of(download_dir=str(other), search_dirs=[str(dest)]))
    assert third.path == f.path and len(hub.log) == n and model_files(other) == []


def test_offline_uses_the_folder(hub, hf_env, hub_files, tmp_path, monkeypatch):
    from huggingface_hub import constants
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    from prequant_core.load import locate, sources
    dest = tmp_path / "prequant"
    dest.mkdir()
    hub.commit(REPO, {PRIMARY: hub_files["int8.safetensors"]})
    h.download(REPO, NAMES, LoadContext.of(download_dir=str(dest)))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    hub.stop()  # no server at all
    plan = sources.plan(sources.Wanted(None, REPO, None, "int8"))
    loc = locate.locate(plan, LoadContext.of(model_dirs=[str(dest)], download_dir=str(dest)))
    assert loc.path == str(dest / ORIGIN / PRIMARY) and not loc.fetched.downloaded


def test_legacy_name_gets_the_repo_prefix(hub, hf_env, hub_files, tmp_path):
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    dest = tmp_path / "prequant"
    dest.mkdir()
    hub.commit(REPO, {LEGACY: hub_files["int8.pt"]})
    f = h.download(REPO, NAMES, LoadContext.of(download_dir=str(dest)))
    assert os.path.basename(f.path) == "Z-Image-Turbo-transformer_int8.pt" and f.filename == LEGACY
    assert model_files(dest) == [os.path.join(ORIGIN, "Z-Image-Turbo-transformer_int8.pt")]


def test_broken_transfer_resumes_with_a_range_request(hub, hf_env, hub_files, tmp_path):
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    dest = tmp_path / "prequant"
    dest.mkdir()
    hub.commit(REPO, {PRIMARY: hub_files["int8.safetensors"]})
    size = os.path.getsize(hub_files["int8.safetensors"])
    hub.fault(REPO, PRIMARY, drop_after=20 * MiB, times=1, method="GET", where="cdn")
    f = h.download(REPO, NAMES, LoadContext.of(download_dir=str(dest)))
    gets = hub.body_gets(PRIMARY)
    assert len(gets) == 2 and gets[0]["range_start"] is None and 0 < gets[1]["range_start"] <= 20 * MiB
    assert gets[1]["sent"] == size - gets[1]["range_start"]
    assert sha256(f.path) == sha256(hub_files["int8.safetensors"]) and model_files(dest) == [os.path.join(ORIGIN, PRIMARY)]
    assert not [p for p in tree(dest) if p.endswith(".incomplete")]


def test_killed_download_leaves_no_file_under_the_final_name_and_resumes(hub, hf_env, hub_files, tmp_path):
    """ComfyUI closed mid-download: the bytes stay in a hidden staging folder under a name no model list offers,
    the final name never exists half-written, and the next run continues from the bytes kept."""
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    dest = tmp_path / "prequant"
    dest.mkdir()
    hub.commit(REPO, {PRIMARY: hub_files["int8.safetensors"]})
    size = os.path.getsize(hub_files["int8.safetensors"])
    hub.slow[(REPO, PRIMARY)] = 0.01  # 256 KiB per 10 ms
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from prequant_core.hub import fetch as hub; "
            "from prequant_core.context import LoadContext; "
            "hub.download(sys.argv[2], [sys.argv[3]], LoadContext(download_dir=sys.argv[4]))")
    proc = subprocess.Popen([sys.executable, "-c", code, ROOT, REPO, PRIMARY, str(dest)], env=dict(os.environ),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 90
        while time.time() < deadline:
            part = [p for p in tree(dest) if p.endswith(".incomplete")]
            if part and os.path.getsize(dest / part[0]) >= 10 * MiB:
                break
            assert not (dest / ORIGIN / PRIMARY).exists(), "the final name appeared before the download finished"
            time.sleep(0.05)
        else:
            pytest.fail("the first download never got going")
    finally:
        proc.kill()
        proc.wait(10)
    # its download helper process sees its parent gone (stdin closed) and exits: wait for the bytes to settle
    last_size, settled = -1, time.time() + 20
    while time.time() < settled:
        part = [p for p in tree(dest) if p.endswith(".incomplete")]
        size_now = os.path.getsize(dest / part[0]) if part else 0
        if size_now == last_size:
            break
        last_size = size_now
        time.sleep(0.5)
    part = [p for p in tree(dest) if p.endswith(".incomplete")]
    assert len(part) == 1 and part[0].startswith(hub_local.STAGING_DIR + os.sep)
    kept = os.path.getsize(dest / part[0])
    assert 0 < kept < size
    assert model_files(dest) == [] and not (dest / ORIGIN / PRIMARY).exists()
    hub.slow.clear()
    f = h.download(REPO, NAMES, LoadContext.of(download_dir=str(dest)))
    last = hub.body_gets(PRIMARY)[-1]
    assert last["range_start"] == kept and last["sent"] == size - kept
    assert sha256(f.path) == sha256(hub_files["int8.safetensors"]) and model_files(dest) == [os.path.join(ORIGIN, PRIMARY)]


def test_downloads_go_to_the_first_prequant_folder_comfyui_lists(comfy, tmp_path):
    """extra_model_paths.yaml entries marked default come first in ComfyUI's list: downloads follow them."""
    import folder_paths
    _, pack = comfy
    paths = pack.nodes.paths
    saved = folder_paths.folder_names_and_paths["prequant"]
    before = (list(saved[0]), set(saved[1]))
    extra = tmp_path / "shared_models" / "prequant"
    try:
        folder_paths.add_model_folder_path("prequant", str(extra), is_default=True)
        assert paths.download_dir() == str(extra) and extra.is_dir()
        assert str(extra) in paths.prequant_dirs()
    finally:
        folder_paths.folder_names_and_paths["prequant"] = before
    assert paths.download_dir() == before[0][0] != str(extra)
