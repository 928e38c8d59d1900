"""prequant_core/hub's download and its watched transfer on what the other Hub tests do not make the loopback Hub
(tests/hub_server.py) do: a Hub that answers with an error for a file already in the cache (the cached copy is served,
as the client's own rule says); a transfer broken mid-body with no resume attempt left (the typed error says how many
bytes are kept, and the next run resumes from them); a body longer than the size announced (stopped, nothing kept);
and the transfer's helpers: which client versions resume, what the log says of an earlier attempt's bytes, a staging
folder or lock file that is a symbolic link (never walked, removed itself, its target untouched). The real
huggingface_hub client in the pack's child process, real files. Core tier: no ComfyUI."""
from __future__ import annotations

import logging
import os

import pytest

from loopback_hub import MiB, cache_files, partials, sha256

REPO = "someone/Tiny-Model-INT8"
NAME, OTHER = "Tiny-Model-INT8.safetensors", "Tiny-Model-INT8.pt"


@pytest.fixture
def blob(tmp_path):
    """A 4 MiB file of seeded bytes (the download does not read what it holds)."""
    import random
    p = tmp_path / "served.bin"
    p.write_bytes(random.Random(7).randbytes(4 * MiB))
    return str(p)


def test_a_hub_error_for_a_file_already_cached_serves_the_cached_copy(hub, hf_env, blob, caplog):
    from prequant_core.hub import fetch
    hub.commit(REPO, {NAME: blob, OTHER: blob})
    first = fetch.download(REPO, (NAME, OTHER))
    assert first.downloaded and sha256(first.path) == sha256(blob)
    hub.fault(REPO, NAME, status=400, method="HEAD", where="resolve")  # the Hub now answers with an error
    caplog.set_level(logging.WARNING, logger="prequant")
    gets = len(hub.body_gets())
    again = fetch.download(REPO, (NAME, OTHER))
    assert (again.path, again.filename, again.downloaded, again.size) == (first.path, NAME, False, 4 * MiB)
    assert len(hub.body_gets()) == gets and not hub.requests(filename=OTHER)  # no bytes, never the other name
    assert [r["status"] for r in hub.requests("HEAD", NAME)][-1] == 400
    logged = " ".join(r.getMessage() for r in caplog.records if r.name == "prequant")
    assert "unreachable" in logged and f"using the cached {NAME}" in logged and "HTTP 400" in logged


def test_a_broken_transfer_with_no_resume_left_keeps_its_bytes_for_the_next_run(hub, hf_env, blob):
    from prequant_core.hub import errors as hub_errors, fetch
    hub.commit(REPO, {NAME: blob})
    hub.fault(REPO, NAME, drop_after=MiB + 1000, times=1, method="GET", where="cdn")
    with pytest.raises(hub_errors.HubDownloadError) as ei:
        fetch.download(REPO, (NAME,), resume_attempts=0)
    e = ei.value
    assert e.message.startswith(f"Downloading {NAME} from Hub repo {REPO} (revision main, ") and "was interrupted" in e.message
    (reason,) = e.reasons
    assert reason.startswith(f"{NAME}: interrupted at ") and reason.endswith(f" of {4 * MiB} bytes")
    kept = int(reason.split("interrupted at ")[1].split(" ")[0])
    assert 0 < kept <= MiB + 1000 and e.fix.startswith(f"Queue the prompt again: the {kept} bytes received are kept")
    (part,) = partials(hf_env)
    assert os.path.getsize(hf_env / part) == kept
    f = fetch.download(REPO, (NAME,), resume_attempts=0)  # the next run asks only for the rest
    last = hub.body_gets(NAME)[-1]
    assert (last["range_start"], last["sent"]) == (kept, 4 * MiB - kept)
    assert sha256(f.path) == sha256(blob) and partials(hf_env) == []


def test_a_body_longer_than_announced_is_stopped_and_not_kept(hub, hf_env, blob):
    from prequant_core.hub import errors as hub_errors, fetch
    hub.commit(REPO, {NAME: blob})
    hub.fault(REPO, NAME, declare_size=256 * 1024, where="resolve")  # the redirect announces 256 KiB
    hub.slow[(REPO, NAME)] = 0.05  # 4 MiB in ~0.8 s: the watch sees the file outgrow the announced size
    with pytest.raises(hub_errors.HubDownloadError) as ei:
        fetch.download(REPO, (NAME,))
    e = ei.value
    assert "the server sent more than the 262144 bytes it announced" in e.message and "it was not kept" in e.message
    assert partials(hf_env) == [] and not [p for p in cache_files(hf_env) if "/blobs/" in p]


def test_which_clients_resume_and_what_the_log_says_of_an_earlier_attempt():
    from prequant_core.hub import transfer
    assert transfer.client_resumes("0.36.0") is True and transfer.client_resumes("1.1.2") is False
    assert transfer.client_resumes("") is None and transfer.client_resumes("dev") is None
    assert transfer._earlier_note(100, "0.36.0", True) == ("; an earlier attempt left 100 bytes: huggingface_hub "
                                                           "0.36.0 continues from there")
    assert transfer._earlier_note(100, "1.1.2", False) == ("; an earlier attempt left 100 bytes, not reused: "
                                                           "huggingface_hub 1.1.2 starts every download from byte 0")
    assert transfer._earlier_note(100, "", None) == ("; an earlier attempt left 100 bytes, reused if this "
                                                     "huggingface_hub continues partial files")


def test_a_staging_folder_that_is_a_link_is_never_walked(tmp_path):
    from prequant_core.hub import transfer
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    victim = elsewhere / "model.oldetag.incomplete"  # another version's partial: removed were the folder walked
    victim.write_bytes(b"x" * 10)
    staging = tmp_path / "staging"
    staging.symlink_to(elsewhere, target_is_directory=True)
    p = transfer._Partials(str(staging), "newetag", own=True)
    assert p() is None and p.earlier == {} and victim.read_bytes() == b"x" * 10


def test_a_lock_file_that_is_a_link_is_removed_itself(tmp_path, caplog):
    from prequant_core.hub import transfer
    dest = tmp_path / "prequant"
    staging = dest / ".staging" / "someone" / "repo" / "file"
    staging.mkdir(parents=True)
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    lock = str(staging) + ".lock"
    os.symlink(target, lock)
    caplog.set_level(logging.WARNING, logger="prequant")
    assert transfer.remove_staging_links(str(dest), str(staging)) == [lock]
    assert not os.path.lexists(lock) and target.read_text() == "keep me"
    assert f"removed the symbolic link {lock} (-> {target})" in caplog.text


def test_a_file_removed_between_the_two_requests_is_skipped_for_the_next_name(hub, hf_env, blob):
    """The child's own metadata request found the first name, then the client's request for it got 404
    EntryNotFound (the file removed from the repo in between): the same rule as a 404 on the first request, the next
    name is downloaded and the first is listed as tried. It used to end as a failed download of the first name, with
    a fix about disk space."""
    from prequant_core.hub import fetch
    hub.commit(REPO, {NAME: blob, OTHER: blob})
    hub.fault(REPO, NAME, status=404, code="EntryNotFound", method="HEAD", where="resolve", after=1)
    got = fetch.download(REPO, (NAME, OTHER))
    assert (got.filename, got.downloaded) == (OTHER, True) and sha256(got.path) == sha256(blob)
    assert [name for name, _ in got.tried] == [NAME] and "404" in got.tried[0][1]
    assert [r["status"] for r in hub.requests("HEAD", NAME, route="resolve")][-1] == 404
    assert not hub.body_gets(NAME), "no byte of the removed file was asked for"



def test_a_mirror_file_says_its_revision_only_through_a_well_formed_source_record(tmp_path):
    """``hub.local.mirror_revision``: the revision a converted mirror file records in its ``unsloth_source`` header
    entry (what a pinned revision is checked against); any other file, or a record that does not say one, proves
    nothing (None), never an error."""
    import json as json_
    from safetensors.torch import save_file
    import torch
    from prequant_core.hub import local
    t = {"w": torch.zeros(2, 2)}

    def mirror(name, meta):
        p = str(tmp_path / name)
        save_file(t, p, metadata=meta)
        return p
    rec = {"file": "X.pt", "sha256": "0" * 64, "bytes": 1, "repo": REPO, "revision": "a1b2c3"}
    assert local.mirror_revision(mirror("ok.safetensors", {local.SOURCE_KEY: json_.dumps(rec)})) == "a1b2c3"
    assert local.mirror_revision(str(tmp_path / "copy.pt")) is None  # a .pt copy records nothing
    for name, meta in [("none.safetensors", {}), ("garbage.safetensors", {local.SOURCE_KEY: "{not json"}),
                       ("list.safetensors", {local.SOURCE_KEY: "[1, 2]"}),
                       ("empty.safetensors", {local.SOURCE_KEY: json_.dumps({**rec, "revision": ""})}),
                       ("number.safetensors", {local.SOURCE_KEY: json_.dumps({**rec, "revision": 7})})]:
        assert local.mirror_revision(mirror(name, meta)) is None, name
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"\xff" * 8 + b"{")  # a header length past the end: unreadable
    assert local.mirror_revision(str(broken)) is None
