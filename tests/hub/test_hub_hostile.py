"""Hostile and misbehaving Hub servers (tests/hub_server.py faults) against the real huggingface_hub client: every
wait ends, typed, within its limit, Cancel stops a transfer at once, a body of the wrong size is never kept, a file
larger than the free disk is refused before a byte is written, and downloads are kept by origin (a file from another
repo never stands in for the official one of the same name)."""
from __future__ import annotations

from prequant_core.context import LoadContext

import os
import time

import pytest

from hub_server import HubServer, free_port
from loopback_hub import PRIMARY, PT, REPO, cache_files, sha256

FAST = {"PREQUANT_HUB_STALL_S": "2", "PREQUANT_HUB_MIN_BPS": "4096"}


pytestmark = pytest.mark.hub_chunk(64 * 1024)


@pytest.fixture
def hub(hub, monkeypatch):
    """conftest's loopback Hub, with short limits (these tests provoke stalls and drips)."""
    for k, v in FAST.items():
        monkeypatch.setenv(k, v)
    return hub


def _timed(fn, *a, **kw):
    t = time.monotonic()
    try:
        return fn(*a, **kw), None, time.monotonic() - t
    except BaseException as e:  # noqa: BLE001
        return None, e, time.monotonic() - t


def _no_child_left():
    """No download child process of this test process is still running (each one is killed, never abandoned)."""
    import psutil
    kids = psutil.Process().children(recursive=True)
    return [k for k in kids if k.is_running() and k.status() != psutil.STATUS_ZOMBIE
            and "prequant_core.hub.child" in " ".join(k.cmdline())] == []


def test_a_stalled_body_ends_typed_and_the_next_run_resumes(hub, hf_env, hub_files, tmp_path):
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    dest = str(tmp_path / "prequant")
    hub.commit(REPO, {PRIMARY: hub_files["int8.safetensors"]})
    hub.fault(REPO, PRIMARY, method="GET", stall_after=25 * 2**20, times=1)  # the client writes 10 MB chunks
    _, e, secs = _timed(h.download, REPO, (PRIMARY,), LoadContext.of(download_dir=dest))
    assert isinstance(e, hub_errors.HubDownloadError), e
    assert "stopped at byte" in str(e) and "no byte for" in str(e) and hub.url in str(e) and secs < 20, (secs, e)
    assert _no_child_left()
    f = h.download(REPO, (PRIMARY,), LoadContext.of(download_dir=dest))  # resumes from the kept bytes
    starts = [r["range_start"] for r in hub.body_gets(PRIMARY)]
    assert starts[-1] and starts[-1] > 0, starts
    assert sha256(f.path) == sha256(hub_files["int8.safetensors"])
    assert f.path == os.path.join(dest, "unsloth", "Z-Image-Turbo-FP8", PRIMARY)


def test_a_dripping_server_is_stopped_by_the_speed_floor(hub, hf_env, hub_files, tmp_path):
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    hub.commit(REPO, {PRIMARY: hub_files["int8.safetensors"]})
    hub.fault(REPO, PRIMARY, method="GET", drip=0.0001, where="cdn")  # ~5 KB/s after the Python overheads
    _, e, secs = _timed(h.download, REPO, (PRIMARY,), LoadContext.of(download_dir=str(tmp_path / "d")))
    assert isinstance(e, hub_errors.HubDownloadError) and "stopped at byte" in str(e) and secs < 25, (secs, e)
    assert "bytes/s floor" in str(e) or "no byte for" in str(e)
    assert _no_child_left()


def test_a_server_that_never_answers_is_given_up_on(hub, hf_env, hub_files, tmp_path, monkeypatch):
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    monkeypatch.setenv("PREQUANT_HUB_ANSWER_S", "3")  # below the client's own 10 s timeout: this bound ends it
    hub.commit(REPO, {PRIMARY: hub_files["int8.safetensors"]})
    hub.fault(REPO, PRIMARY, hang=True, where="resolve")
    _, e, secs = _timed(h.download, REPO, (PRIMARY,), LoadContext.of(download_dir=str(tmp_path / "d")))
    assert isinstance(e, hub_errors.HubUnavailableError) and "gave no answer" in str(e) and secs < 15, (secs, e)


def test_cancel_stops_the_transfer_at_once_and_keeps_its_bytes(hub, hf_env, hub_files, tmp_path):
    """ComfyUI's Cancel: its interrupt check raises on the next poll; the child is killed, nothing waits."""
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local

    class Interrupted(Exception):
        pass
    hub.commit(REPO, {PRIMARY: hub_files["int8.safetensors"]})
    hub.slow[(REPO, PRIMARY)] = 0.2  # 64 KiB per 0.2 s
    t0 = time.monotonic()

    def check():
        if time.monotonic() - t0 > 1.5:
            raise Interrupted()
    _, e, secs = _timed(h.download, REPO, (PRIMARY,), LoadContext.of(download_dir=str(tmp_path / "d"), cancel=check))
    assert isinstance(e, Interrupted) and secs < 4, (secs, e)
    assert _no_child_left()
    partial = [f for f in cache_files(tmp_path / "d") if f.endswith(".incomplete")]
    assert partial, "the received bytes are kept for the next run"


def test_a_file_larger_than_the_free_disk_is_refused_before_a_byte_is_written(hub, hf_env, hub_files, tmp_path):
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    hub.commit(REPO, {PRIMARY: hub_files["int8.safetensors"]})
    hub.fault(REPO, PRIMARY, declare_size=40 * 2**40, where="resolve")  # announces 40 TiB
    dest = tmp_path / "d"
    _, e, _ = _timed(h.download, REPO, (PRIMARY,), LoadContext.of(download_dir=str(dest)))
    assert isinstance(e, hub_errors.HubDownloadError) and "nothing was written" in str(e) and "free" in str(e), e
    assert hub.body_gets(PRIMARY) == []
    assert [f for f in cache_files(dest) if not f.endswith(".lock")] == []


def test_a_body_longer_than_announced_is_never_kept(hub, hf_env, hub_files, tmp_path):
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    hub.commit(REPO, {PRIMARY: hub_files["int8.safetensors"]})
    hub.fault(REPO, PRIMARY, method="GET", extra=100_000, where="cdn")
    dest = tmp_path / "d"
    _, e, _ = _timed(h.download, REPO, (PRIMARY,), LoadContext.of(download_dir=str(dest)))
    assert isinstance(e, hub_errors.HubError), e
    assert not os.path.exists(os.path.join(dest, "unsloth", "Z-Image-Turbo-FP8", PRIMARY))
    assert [f for f in cache_files(dest) if f.endswith((".safetensors", ".incomplete"))] == []


@pytest.mark.parametrize("revision", ["../../../../tmp/x", "/abs/path", "a//b", "main/..", "x\\y", "ref/"])
def test_a_revision_the_hub_would_not_accept_is_refused_before_any_request(hub, hf_env, revision):
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    from prequant_core.load import sources
    from prequant_core.errors import HubError
    with pytest.raises(HubError, match="not a revision the Hub accepts"):
        h.download(REPO, (PRIMARY,), revision=revision)
    with pytest.raises(HubError):
        sources.plan(sources.Wanted(None, REPO, None, "int8", revision=revision))
    assert hub.log == []


def test_downloads_are_kept_by_origin(hub, hf_env, hub_files, tmp_path):
    """attacker/Z-Image-Turbo-FP8 holds a file of the official name: it is stored under its own origin, and the
    official repo's download is never served from it."""
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    dest = str(tmp_path / "prequant")
    hub.commit("attacker/Z-Image-Turbo-FP8", {PRIMARY: hub_files["int8.pt"]})
    hub.commit(REPO, {PRIMARY: hub_files["int8.safetensors"]})
    bad = h.download("attacker/Z-Image-Turbo-FP8", (PRIMARY,), LoadContext.of(download_dir=dest))
    good = h.download(REPO, (PRIMARY,), LoadContext.of(download_dir=dest))
    assert bad.path == os.path.join(dest, "attacker", "Z-Image-Turbo-FP8", PRIMARY) and bad.downloaded
    assert good.path == os.path.join(dest, "unsloth", "Z-Image-Turbo-FP8", PRIMARY) and good.downloaded
    assert sha256(good.path) == sha256(hub_files["int8.safetensors"])
    pinned = h.download(REPO, (PRIMARY,), LoadContext.of(download_dir=dest), revision=hub.commit(REPO, {PRIMARY: hub_files["int8.pt"]},
                                                                                   ref="v2"))
    assert "@" in os.path.basename(os.path.dirname(pinned.path))  # another revision, another folder
    assert h.download(REPO, (PRIMARY,), LoadContext.of(download_dir=dest)).path == good.path  # found again, no new transfer


def test_refused_connection_and_server_errors_are_typed(hf_env, monkeypatch, tmp_path, hub_files, caplog):
    """Also issue 39 #5: a password in HF_ENDPOINT (http://user:password@host) is shown as http://***@host in every
    message and log line."""
    import logging
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    secret = "s3cret-pw"
    caplog.set_level(logging.INFO)
    monkeypatch.setenv("HF_ENDPOINT", f"http://someone:{secret}@127.0.0.1:{free_port()}")
    for k, v in FAST.items():
        monkeypatch.setenv(k, v)
    _, e, secs = _timed(h.download, REPO, (PRIMARY,), LoadContext.of(download_dir=str(tmp_path / "d")))
    assert isinstance(e, hub_errors.HubUnavailableError) and "Could not reach" in str(e) and secs < 60, (secs, e)
    assert "http://***@127.0.0.1" in str(e), e
    with HubServer() as s:
        monkeypatch.setenv("HF_ENDPOINT", s.url.replace("://", f"://someone:{secret}@"))
        s.commit(REPO, {PRIMARY: hub_files["int8.safetensors"]})
        s.fault(REPO, PRIMARY, status=503, where="resolve")
        _, e2, _ = _timed(h.download, REPO, (PRIMARY, PT), LoadContext.of(download_dir=str(tmp_path / "d")))
        assert isinstance(e2, hub_errors.HubUnavailableError) and "503" in str(e2)
        assert [r["filename"] for r in s.requests(route="resolve")].count(PT) == 0  # no other name tried
    for text in (str(e), repr(e.reasons), str(e2), repr(e2.reasons), caplog.text):
        assert secret not in text and "someone:" not in text, text


def test_the_client_librarys_own_errors_are_sorted_requests_and_httpx_alike():
    from prequant_core.hub.errors import classify
    import requests
    assert classify(requests.exceptions.ConnectionError("refused"))[0] == "network"
    assert classify(requests.exceptions.ChunkedEncodingError("short"))[0] == "network"
    # huggingface_hub 1.x / 2.x raise httpx's errors; sorted by name where httpx is not installed here
    for name in ("ConnectError", "RemoteProtocolError", "ReadTimeout"):
        exc = type(name, (Exception,), {})("boom")
        assert classify(exc)[0] == "network", name
    assert classify(ValueError("File is too large, please install hf_xet"))[0] == "xet"
    assert classify(OSError("Consistency check failed: file should be of size 10 but has size 5"))[0] == "corrupt"


@pytest.mark.parametrize("where", ["elsewhere", "itself"])
def test_a_redirect_to_nowhere_or_to_itself_ends_typed(hub, hf_env, hub_files, tmp_path, where):
    from prequant_core.hub import cache as hub_cache, errors as hub_errors, fetch as h, local as hub_local
    hub.commit(REPO, {PRIMARY: hub_files["int8.safetensors"]})
    target = f"http://127.0.0.1:{free_port()}/nothing" if where == "elsewhere" else \
        f"{hub.url}/{REPO}/resolve/main/{PRIMARY}"
    hub.fault(REPO, PRIMARY, redirect_to=target, where="resolve")
    _, e, secs = _timed(h.download, REPO, (PRIMARY,), LoadContext.of(download_dir=str(tmp_path / "d")))
    assert isinstance(e, hub_errors.HubError) and secs < 60, (secs, e)
    assert not os.path.exists(os.path.join(tmp_path, "d", "unsloth", "Z-Image-Turbo-FP8", PRIMARY))

