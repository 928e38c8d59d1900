"""The Hub store under real use (issue 39 #4 and #9), the real ``huggingface_hub`` client against the loopback Hub,
downloads into a model folder as the loader makes them: each file stages in its own folder (a cancelled download's
bytes survive the next file's download, and resume with a Range request), two processes downloading two files of one
repo never delete each other's staging, two downloading one file transfer it once; revisions that differ only by
``/`` and ``--`` get their own folders, a 200-character revision stores and is found again, and a mirror's copy is
never labelled with a pinned commit it does not record."""
from __future__ import annotations

from prequant_core.context import LoadContext

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT
from loopback_hub import MiB, PRIMARY, REPO, cache_files, partials, sha256

FP8 = "Z-Image-Turbo-FP8.safetensors"
ORIGIN = os.path.join(*REPO.split("/"))
DOWNLOAD = ("import json, sys; sys.path.insert(0, sys.argv[1]); from prequant_core.hub import fetch as hub; "
            "from prequant_core.context import LoadContext; "
            "f = hub.download(sys.argv[2], [sys.argv[3]], LoadContext(download_dir=sys.argv[4])); "
            "print(json.dumps({'path': f.path, 'downloaded': f.downloaded}))")


pytestmark = pytest.mark.hub_chunk(64 * 1024)


def test_a_cancelled_partial_survives_another_files_download_and_resumes(hub, hf_env, hub_files, tmp_path):  # noqa: F811 - shared fixtures
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local

    class Interrupted(Exception):
        pass
    hub.commit(REPO, {PRIMARY: hub_files["int8.safetensors"], FP8: hub_files["int8.pt"]})
    size = os.path.getsize(hub_files["int8.safetensors"])
    dest = tmp_path / "prequant"
    hub.slow[(REPO, PRIMARY)] = 0.01

    def check():  # ComfyUI's Cancel, pressed once 5 MB have arrived
        if partials(dest) and os.path.getsize(dest / partials(dest)[0]) >= 5 * MiB:
            raise Interrupted()
    with pytest.raises(Interrupted):
        h.download(REPO, (PRIMARY,), LoadContext.of(download_dir=str(dest), cancel=check))
    time.sleep(0.5)
    (kept_name,) = partials(dest)
    kept = os.path.getsize(dest / kept_name)
    assert 0 < kept < size

    other = h.download(REPO, (FP8,), LoadContext.of(download_dir=str(dest)))  # the FP8 file of the same repo, meanwhile
    assert sha256(other.path) == sha256(hub_files["int8.pt"])
    assert partials(dest) == [kept_name] and os.path.getsize(dest / kept_name) == kept, "the INT8 bytes are kept"

    hub.slow.clear()
    f = h.download(REPO, (PRIMARY,), LoadContext.of(download_dir=str(dest)))
    last = hub.body_gets(PRIMARY)[-1]
    assert last["range_start"] == kept and last["sent"] == size - kept  # resumed, not from byte 0
    assert sha256(f.path) == sha256(hub_files["int8.safetensors"])
    assert partials(dest) == [] and sorted(os.listdir(dest)) == ["unsloth"], cache_files(dest)


def _start(repo, name, dest):
    return subprocess.Popen([sys.executable, "-c", DOWNLOAD, ROOT, repo, name, str(dest)], env=dict(os.environ),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc):
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    return json.loads(out.strip().splitlines()[-1])


def test_two_processes_downloading_two_files_of_one_repo_both_finish(hub, hf_env, hub_files, tmp_path):  # noqa: F811 - shared fixtures
    hub.commit(REPO, {PRIMARY: hub_files["int8.safetensors"], FP8: hub_files["int8.pt"]})
    dest = tmp_path / "prequant"
    hub.slow[(REPO, FP8)] = 0.002  # the FP8 file finishes last: the first to finish used to remove its staging
    a, b = _start(REPO, PRIMARY, dest), _start(REPO, FP8, dest)
    ra, rb = _finish(a), _finish(b)
    assert sha256(ra["path"]) == sha256(hub_files["int8.safetensors"]) and sha256(rb["path"]) == sha256(hub_files["int8.pt"])
    assert ra["downloaded"] and rb["downloaded"]
    assert len(hub.body_gets(PRIMARY)) == 1 and len(hub.body_gets(FP8)) == 1
    assert sorted(os.listdir(dest)) == ["unsloth"], cache_files(dest)  # staging gone once both are done


def test_two_processes_downloading_one_file_transfer_it_once(hub, hf_env, hub_files, tmp_path):  # noqa: F811 - shared fixtures
    hub.commit(REPO, {PRIMARY: hub_files["int8.safetensors"]})
    dest = tmp_path / "prequant"
    hub.slow[(REPO, PRIMARY)] = 0.002
    a = _start(REPO, PRIMARY, dest)
    deadline = time.time() + 60
    while not partials(dest) and time.time() < deadline:
        time.sleep(0.05)
    b = _start(REPO, PRIMARY, dest)  # while the first is mid-transfer
    ra, rb = _finish(a), _finish(b)
    assert ra["path"] == rb["path"] == str(dest / ORIGIN / PRIMARY)
    assert sha256(ra["path"]) == sha256(hub_files["int8.safetensors"])
    assert len(hub.body_gets(PRIMARY)) == 1, hub.body_gets(PRIMARY)  # the second waited and took the first's file
    assert sorted([ra["downloaded"], rb["downloaded"]]) == [False, True]
    assert sorted(os.listdir(dest)) == ["unsloth"], cache_files(dest)


def test_revisions_differing_by_slash_and_double_dash_keep_their_own_files(hub, hf_env, hub_files, tmp_path):  # noqa: F811 - shared fixtures
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    hub.commit(REPO, {PRIMARY: hub_files["int8.safetensors"]}, ref="feature/x")
    hub.commit(REPO, {PRIMARY: hub_files["int8.pt"]}, ref="feature--x")
    dest = str(tmp_path / "prequant")
    slash = h.download(REPO, (PRIMARY,), LoadContext.of(download_dir=dest), revision="feature/x")
    dash = h.download(REPO, (PRIMARY,), LoadContext.of(download_dir=dest), revision="feature--x")
    assert slash.path != dash.path and dash.downloaded, (slash.path, dash.path)
    assert sha256(slash.path) == sha256(hub_files["int8.safetensors"]) and sha256(dash.path) == sha256(hub_files["int8.pt"])
    gets = len(hub.body_gets())
    again = [h.download(REPO, (PRIMARY,), LoadContext.of(download_dir=dest), revision=r).path for r in ("feature/x", "feature--x")]
    assert again == [slash.path, dash.path] and len(hub.body_gets()) == gets  # found again, no request


def test_a_long_repo_and_revision_store_and_are_found_again(hub, hf_env, hub_files, tmp_path):  # noqa: F811 - shared fixtures
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    repo = "unsloth/" + "Z" * (96 - len("unsloth/"))
    rev = "r" * 200
    hub.commit(repo, {PRIMARY: hub_files["int8.safetensors"]}, ref=rev)
    dest = str(tmp_path / "prequant")
    f = h.download(repo, (PRIMARY,), LoadContext.of(download_dir=dest), revision=rev)  # was: "File name too long" after the transfer
    assert f.downloaded and sha256(f.path) == sha256(hub_files["int8.safetensors"])
    assert all(len(p.encode()) <= 255 for p in f.path.split(os.sep))
    gets = len(hub.body_gets())
    assert h.download(repo, (PRIMARY,), LoadContext.of(download_dir=dest), revision=rev).path == f.path
    assert len(hub.body_gets()) == gets
    assert partials(dest) == [] and sorted(os.listdir(dest)) == ["unsloth"]


def _mirror_copy(root, revision):
    """A mirror file as Unsloth's converter lays it out, recording the revision it came from (or none)."""
    import torch
    from safetensors.torch import save_file
    p = os.path.join(root, *REPO.split("/"), PRIMARY)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    src = {"file": PRIMARY, "repo": REPO, **({"revision": revision} if revision else {})}
    save_file({"x": torch.zeros(1)}, p, metadata={"unsloth_source": json.dumps(src)})
    return p


def test_a_mirror_copy_is_never_labelled_with_a_pinned_commit_it_does_not_record(hub, hf_env, hub_files, tmp_path,  # noqa: F811 - shared fixtures
                                                                                   monkeypatch):
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    old = hub.commit(REPO, {PRIMARY: hub_files["int8.pt"]}, ref=None)
    new = hub.commit(REPO, {PRIMARY: hub_files["int8.safetensors"]})
    dest = str(tmp_path / "prequant")
    root = str(tmp_path / "mirror")
    mirror = _mirror_copy(root, old)
    monkeypatch.setenv("UNSLOTH_DIFFUSION_PREQUANT_MIRROR", root)

    assert h.download(REPO, (PRIMARY,), LoadContext.of(download_dir=dest)).path == mirror  # the default branch: the mirror, as before
    pinned_old = h.download(REPO, (PRIMARY,), LoadContext.of(download_dir=dest), revision=old)
    assert pinned_old.path == mirror and pinned_old.revision == old  # the commit it records
    assert hub.body_gets() == []

    pinned_new = h.download(REPO, (PRIMARY,), LoadContext.of(download_dir=dest), revision=new)  # a commit the mirror's copy is not
    assert pinned_new.path != mirror and pinned_new.downloaded and pinned_new.commit == new
    assert sha256(pinned_new.path) == sha256(hub_files["int8.safetensors"])

    _mirror_copy(root, None)  # a copy that records no revision proves none
    other = h.download(REPO, (PRIMARY,), LoadContext.of(download_dir=str(tmp_path / "other")), revision=old)
    assert other.path != mirror and other.downloaded and sha256(other.path) == sha256(hub_files["int8.pt"])


HF24 = os.path.join(ROOT, ".cache", "hf24")  # huggingface_hub 2.4 (scripts/setup_test_extras.sh)


@pytest.fixture(params=["0.36", "2.4"])
def client(request, monkeypatch):
    """The huggingface_hub the download child runs: the pinned one, or 2.4 (what a ComfyUI with transformers 5 has:
    every attempt writes a fresh partial file, none is resumed). The test process keeps the pinned one."""
    if request.param == "2.4":
        assert os.path.isfile(os.path.join(HF24, "huggingface_hub", "__init__.py")), \
            "huggingface_hub 2.4 is missing from .cache/hf24: run scripts/setup_test_extras.sh"
        monkeypatch.setenv("PYTHONPATH", HF24)  # the child's path (transfer._child_env keeps it)
    return request.param


@pytest.fixture
def blob(tmp_path):
    """8 MiB of random bytes: a transfer of seconds on the slowed loopback Hub."""
    p = tmp_path / "blob.safetensors"
    p.write_bytes(os.urandom(8 * MiB))
    return str(p)


def _cancel_at(h, dest, nbytes):
    class Interrupted(Exception):
        pass

    def check():  # ComfyUI's Cancel, pressed once nbytes have arrived
        if any(os.path.getsize(dest / p) >= nbytes for p in partials(dest) if os.path.exists(dest / p)):
            raise Interrupted()
    with pytest.raises(Interrupted):
        h.download(REPO, (PRIMARY,), LoadContext.of(download_dir=str(dest), cancel=check))
    time.sleep(0.5)


def test_a_retry_after_a_cancel_is_watched_on_the_file_the_client_writes(hub, hf_env, blob, tmp_path, client,
                                                                         monkeypatch, caplog):  # noqa: F811
    """Round 5: with huggingface_hub 2.4 the retry's client writes a new file from byte 0; the watcher followed the
    earlier attempt's (larger, idle) partial, logged "resuming", and killed the retry as stalled before it passed that
    size; each failed retry left another partial. Now the watcher follows the file the client writes: the pinned client
    resumes with a Range request, 2.4 starts over (said in the log) and the earlier partial goes; none is left."""
    import logging
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    hub.commit(REPO, {PRIMARY: blob})
    size = os.path.getsize(blob)
    dest = tmp_path / "prequant"
    hub.slow[(REPO, PRIMARY)] = 0.02
    _cancel_at(h, dest, 4 * MiB)
    (kept_name,) = partials(dest)
    kept = os.path.getsize(dest / kept_name)
    assert 4 * MiB <= kept < size
    hub.slow[(REPO, PRIMARY)] = 0.06  # the retry needs ~4 s to pass the earlier partial's size: over the stall limit
    monkeypatch.setenv("PREQUANT_HUB_STALL_S", "2")
    with caplog.at_level(logging.INFO, logger="prequant"):
        f = h.download(REPO, (PRIMARY,), LoadContext.of(download_dir=str(dest)))
    assert sha256(f.path) == sha256(blob)
    last = hub.body_gets(PRIMARY)[-1]
    assert f"hf_hub/{client}" in last["agent"], last["agent"]
    said = [r.getMessage() for r in caplog.records]
    if client == "2.4":
        assert not last["range_start"] and last["sent"] == size  # this client never resumes
        assert "starts every download from byte 0" in caplog.text
        # issue 58 #8: and the log never says it does (it said "resumed where the client resumes" first)
        assert not [m for m in said if re.search(r"resumed|resuming|continues from", m)], said
        assert any(f"left {kept} bytes, not reused" in m for m in said), said
    else:
        assert last["range_start"] == kept and last["sent"] == size - kept
        assert any(f"left {kept} bytes: huggingface_hub 0.36" in m and "continues from there" in m for m in said), said
        assert any(f"resumed from {kept}" in m for m in said), said
    assert partials(dest) == [] and sorted(os.listdir(dest)) == ["unsloth"], cache_files(dest)


def test_a_smaller_new_version_of_a_file_downloads_despite_an_old_partial(hub, hf_env, blob, tmp_path, client):  # noqa: F811
    """Round 5: a partial of the file's earlier version (another etag), larger than the new version, made the next
    download fail once with "the server sent more than the N bytes it announced". An older version's bytes are never
    resumed: they are removed before the new version's transfer starts."""
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    hub.commit(REPO, {PRIMARY: blob})
    dest = tmp_path / "prequant"
    hub.slow[(REPO, PRIMARY)] = 0.02
    _cancel_at(h, dest, 4 * MiB)
    small = tmp_path / "small.safetensors"
    small.write_bytes(os.urandom(MiB))
    hub.commit(REPO, {PRIMARY: str(small)})  # the repo's new version: another etag, a quarter of the partial's size
    hub.slow[(REPO, PRIMARY)] = 0.1  # watched for a while (a fast transfer ends before the first look)
    f = h.download(REPO, (PRIMARY,), LoadContext.of(download_dir=str(dest)))
    assert sha256(f.path) == sha256(str(small)) and f.downloaded
    assert partials(dest) == [], cache_files(dest)


def test_a_download_into_the_hf_cache_is_watched_on_the_file_the_client_writes(hub, hf_env, blob, client,
                                                                               monkeypatch):  # noqa: F811
    """The node's download_to "HF cache": huggingface_hub 2.4 writes '<etag>.<attempt id>.incomplete' in the cache's
    blobs, not the '<etag>.incomplete' the watcher looked at, so a transfer longer than the stall limit was killed
    with "no byte for N s" while bytes were arriving."""
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    hub.commit(REPO, {PRIMARY: blob})
    hub.slow[(REPO, PRIMARY)] = 0.04  # ~5 s: longer than the stall limit
    monkeypatch.setenv("PREQUANT_HUB_STALL_S", "1.5")
    f = h.download(REPO, (PRIMARY,))
    assert sha256(f.path) == sha256(blob) and f.downloaded
    assert f"hf_hub/{client}" in hub.body_gets(PRIMARY)[-1]["agent"]
    assert not [p for p in cache_files(hf_env) if p.endswith(".incomplete")]


def _snapshot(folder) -> dict:
    """Every entry under ``folder`` (links not followed): relative path -> (kind, size, sha256 of a file's bytes)."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for n in dirs + files:
            p = os.path.join(root, n)
            kind = "link" if os.path.islink(p) else "dir" if os.path.isdir(p) else "file"
            out[os.path.relpath(p, folder)] = (kind, os.lstat(p).st_size, sha256(p) if kind == "file" else None)
    return out


def _stored_inside(path, dest) -> None:
    """The stored model is a regular file (not a link) whose real path lies inside the download folder."""
    import stat
    assert stat.S_ISREG(os.lstat(path).st_mode), f"{path} is not a regular file"
    real, root = os.path.realpath(path), os.path.realpath(dest)
    assert os.path.commonpath([real, root]) == root, (real, root)


LINKS = ["staging folder", "partial", "client folder", "model file"]


@pytest.mark.parametrize("link", LINKS)
def test_a_symlink_in_the_staging_folder_is_never_followed(hub, hf_env, blob, tmp_path, client, link, caplog):  # noqa: F811
    """Issue 58 #7: the staging folder is the pack's own; a link placed there (by anyone with write access to the
    models folder) made the watcher delete every other-etag partial of the folder it points to, subfolders included
    (a linked staging folder), and made huggingface_hub 0.36 append the download to a file outside the models folder
    (a linked partial) and the pack store a link to that file as the model. Now each link there is removed itself
    (never followed) before the transfer: nothing outside is deleted, written or grows, and the stored model is a
    regular file inside the download folder, with both clients."""
    import logging
    from huggingface_hub._local_folder import get_local_download_paths
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    from prequant_core.hub.local import staging_dir
    hub.commit(REPO, {PRIMARY: blob})
    dest = tmp_path / "prequant"
    outside = tmp_path / "outside"  # another folder on the machine, with another download's partials in it
    (outside / "sub").mkdir(parents=True)
    victim = outside / "victim.bin"
    victim.write_bytes(os.urandom(4096))
    (outside / "a.0123456789abcdef.incomplete").write_bytes(b"x" * 1000)
    (outside / "sub" / "b.fedcba9876543210.incomplete").write_bytes(b"y" * 1000)
    staging = staging_dir(str(dest), REPO, "main", PRIMARY)
    if link == "staging folder":
        os.makedirs(os.path.dirname(staging))
        os.symlink(outside, staging)
    else:
        # where huggingface_hub keeps this file's partial in a local folder (0.36: resumed by appending to it)
        paths = get_local_download_paths(Path(staging), PRIMARY)
        if link == "partial":
            os.symlink(victim, paths.incomplete_path(sha256(blob)))
        elif link == "client folder":
            import shutil
            shutil.rmtree(paths.metadata_path.parent)
            os.symlink(outside, paths.metadata_path.parent)
        else:
            os.symlink(victim, paths.file_path)
    before = _snapshot(outside)
    with caplog.at_level(logging.WARNING, logger="prequant"):
        f = h.download(REPO, (PRIMARY,), LoadContext.of(download_dir=str(dest)))
    assert _snapshot(outside) == before, "nothing outside the download folder is deleted, written or grows"
    assert f.path == str(dest / ORIGIN / PRIMARY) and f.downloaded
    _stored_inside(f.path, dest)
    assert sha256(f.path) == sha256(blob)
    assert "symbolic link" in caplog.text and staging in caplog.text, caplog.text  # the removal is said
    assert partials(dest) == [] and sorted(os.listdir(dest)) == ["unsloth"], cache_files(dest)


def test_an_origin_folder_linked_outside_the_download_folder_is_refused_before_a_byte(hub, hf_env, blob, tmp_path):  # noqa: F811
    """The folder a download is stored in must lie inside the download folder: one linked elsewhere is refused,
    typed and naming it, before the transfer (no body request, nothing written there)."""
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    hub.commit(REPO, {PRIMARY: blob})
    dest = tmp_path / "prequant"
    outside = tmp_path / "outside"
    outside.mkdir()
    dest.mkdir()
    os.symlink(outside, dest / REPO.split("/")[0])
    with pytest.raises(hub_errors.HubDownloadError) as e:
        h.download(REPO, (PRIMARY,), LoadContext.of(download_dir=str(dest)))
    msg = str(e.value)
    assert str(dest / ORIGIN) in msg and os.path.realpath(outside) in msg and "Fix:" in msg, msg
    assert hub.body_gets(PRIMARY) == [] and os.listdir(outside) == []


def test_a_stored_file_that_is_a_link_or_lies_outside_is_refused_and_the_link_removed(tmp_path):
    """The check after every transfer into a model folder (a link made while the client ran): lstat, never
    followed; a link is removed itself, its target untouched; a regular file inside passes."""
    from prequant_core.hub.errors import HubDownloadError
    from prequant_core.hub.transfer import check_stored
    dest, outside = tmp_path / "prequant", tmp_path / "outside"
    dest.mkdir()
    outside.mkdir()
    target = outside / "victim.bin"
    target.write_bytes(b"z" * 4096)
    good = dest / "model.safetensors"
    good.write_bytes(b"m")
    check_stored(str(good), str(dest))
    linked = dest / "linked.safetensors"
    os.symlink(target, linked)
    with pytest.raises(HubDownloadError) as e:
        check_stored(str(linked), str(dest))
    assert str(linked) in str(e.value) and "symbolic link" in str(e.value) and str(target) in str(e.value)
    assert not os.path.lexists(linked) and target.read_bytes() == b"z" * 4096
    os.symlink(outside, dest / "far")
    with pytest.raises(HubDownloadError) as e:
        check_stored(str(dest / "far" / "victim.bin"), str(dest))
    assert "outside" in str(e.value) and target.read_bytes() == b"z" * 4096
