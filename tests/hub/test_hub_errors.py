"""The Hub client's exceptions sorted into this pack's kinds (``prequant_core/hub/errors.py`` ``classify``,
``status``, ``server_message``) and the user's message for the kinds no loopback-Hub test raises (``raise_for``:
xet, a failed transfer).

Every exception here is the installed client library's own class (huggingface_hub's typed errors carrying a real
``requests.Response``; requests', urllib3's and httpx's transport errors), built as the client builds them; the
download path that raises them against a loopback Hub runs in tests/hub/. Core tier: no ComfyUI.
"""
from __future__ import annotations

import httpx
import pytest
import requests
import urllib3
from huggingface_hub import errors as E

from prequant_core.hub import errors as hub_errors
from prequant_core.hub.errors import HubDownloadError, classify


def _response(code: int) -> requests.Response:
    r = requests.Response()
    r.status_code = code
    r.url = "http://127.0.0.1:1/api/models/o/r"
    return r


def test_a_local_cache_miss_is_not_cached_and_its_cause_decides_when_it_has_one():
    assert classify(E.LocalEntryNotFoundError("no file in cache")) == ("not-cached", "not in the local cache")
    # the client wraps the network failure that sent it to the cache: that failure is what the user is told
    miss = E.LocalEntryNotFoundError("cannot find the requested files in the disk cache")
    miss.__cause__ = requests.exceptions.ConnectionError("connection refused")
    kind, detail = classify(miss)
    assert kind == "network" and detail == "ConnectionError: connection refused"


@pytest.mark.parametrize("exc,want", [
    (E.RevisionNotFoundError("404 Client Error. Revision Not Found", _response(404)),
     ("revision", "revision not found")),
    (E.GatedRepoError("403 Client Error. Cannot access gated repo", _response(403)),
     ("auth", "gated repo, HTTP 403")),
    (E.RepositoryNotFoundError("401 Client Error. Repository Not Found", _response(401)),
     ("repo", "repo not found or private, HTTP 401")),
    # raised without a response: no status to name (a user read "HTTP None")
    (E.RepositoryNotFoundError("Repository Not Found", None), ("repo", "repo not found or private")),
    (E.GatedRepoError("Cannot access gated repo", None), ("auth", "gated repo")),
    (E.HfHubHTTPError("Client Error", None, server_message="slow down"),
     ("http", "HTTP error without a status: (slow down)")),
    (E.OfflineModeIsEnabled("Cannot reach https://huggingface.co: offline mode is enabled."),
     ("offline", "offline mode is enabled")),
    (E.FileMetadataError("Distant resource does not have an ETag"),
     ("metadata", "Distant resource does not have an ETag")),
    (PermissionError(13, "Permission denied"), ("disk", "PermissionError: [Errno 13] Permission denied")),
    (RuntimeError("something  else\n  entirely"), ("other", "RuntimeError: something else entirely")),
])
def test_each_typed_client_error_has_its_kind(exc, want):
    assert classify(exc) == want


def test_http_errors_by_status_code_with_the_servers_own_message():
    refused = E.HfHubHTTPError("401 Client Error", _response(401),
                               server_message="  Invalid credentials in Authorization header ")
    assert classify(refused) == ("auth", "HTTP 401 (Invalid credentials in Authorization header)")
    assert classify(E.HfHubHTTPError("403 Client Error", _response(403)))[0] == "auth"
    down = E.HfHubHTTPError("500 Server Error", _response(500), server_message="x" * 300)
    kind, detail = classify(down)
    assert kind == "http" and detail == f"HTTP 500 ({'x' * 200})"  # the server's text is cut at 200 characters
    assert classify(E.HfHubHTTPError("502 Server Error", _response(502))) == ("http", "HTTP 502")
    # an httpx status error (huggingface_hub 1.x raises these) carries its response the same way
    req = httpx.Request("GET", "http://127.0.0.1:1/x")
    err = httpx.HTTPStatusError("Server error '503 Service Unavailable'", request=req,
                                response=httpx.Response(503, request=req))
    assert classify(err) == ("http", "HTTP 503")


def test_a_transport_error_named_http_without_a_status_is_a_network_failure():
    # urllib3's and httpx's transport errors derive from a class named HTTPError but carry no response
    aborted = urllib3.exceptions.ProtocolError("Connection aborted.")
    assert classify(aborted) == ("network", "ProtocolError: Connection aborted.")
    read = httpx.ReadError("peer closed connection")
    assert classify(read) == ("network", "ReadError: peer closed connection")
    # the same HTTPError name with no response and no transport name stays an HTTP error with no code
    assert classify(requests.exceptions.HTTPError("bad"))[0] == "http"


def test_status_and_server_message_read_only_what_is_there():
    assert hub_errors.status(ValueError("x")) is None
    assert hub_errors.status(E.HfHubHTTPError("e", _response(429))) == 429
    assert hub_errors.server_message(ValueError("x")) == ""
    assert hub_errors.server_message(E.HfHubHTTPError("e", None, server_message="   ")) == ""
    assert hub_errors.server_message(E.HfHubHTTPError("e", None, server_message=" busy ")) == "(busy)"


def test_a_missing_xet_client_and_a_failed_transfer_are_download_errors_naming_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.setenv("HF_ENDPOINT", "http://user:secret@127.0.0.1:9")
    cause = ValueError("File is too large, please install hf_xet")
    kind, detail = classify(cause)
    assert kind == "xet"
    tried = [("model.pt", "not in the repo (404 EntryNotFound)")]
    with pytest.raises(HubDownloadError) as e:
        hub_errors.raise_for((kind, detail), cause, repo="o/r", revision="main", fn="model.safetensors", tried=tried)
    assert e.value.__cause__ is cause
    msg = str(e.value)
    assert "needs the hf_xet package" in msg and "pip install hf_xet" in msg and "secret" not in msg
    assert e.value.reasons == ["model.pt: not in the repo (404 EntryNotFound)", f"model.safetensors: {detail}"]

    cause = OSError(28, "No space left on device")
    kind, detail = classify(cause)
    assert kind == "disk"
    with pytest.raises(HubDownloadError) as e:
        hub_errors.raise_for((kind, detail), cause, repo="o/r", revision="v1", fn="model.safetensors", tried=[])
    msg = str(e.value)
    assert "Downloading model.safetensors from Hub repo o/r (revision v1" in msg
    assert "No space left on device" in msg and str(tmp_path / "hub-cache") in msg
