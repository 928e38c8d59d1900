"""A contributor's clone made anywhere (issue 61): no ``../shared`` beside it, no origin to look beside. The README's
test command builds the main leg's ComfyUI 0.33.0 from a mirror served on the loopback (the sources this checkout's
own set-up verified and kept in .cache/comfyui-sources), checked before use; with no mirror and no network it stops
with one message that names the pinned version, the upstream address and the variable."""
from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import comfyui_sources  # noqa: E402 - the script under test, importable as a module

PIN = comfyui_sources.PINS["0.33.0"]


def _clone(dest) -> str:
    """The working tree as a fresh clone holds it: every tracked and not-ignored file, one commit, no remote. The
    development venv and ComfyUI 0.3.75 (the README's first set-up, 6 GB) are lent from this checkout: linked, never
    written through (ComfyUI's own files are links in a folder of the clone's)."""
    clone = os.path.join(dest, "ComfyUI-Prequant")
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for f in filter(None, files):
        src = os.path.join(ROOT, f)
        if os.path.isfile(src):
            os.makedirs(os.path.dirname(os.path.join(clone, f)), exist_ok=True)
            shutil.copy2(src, os.path.join(clone, f))
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=clone, check=True)
    subprocess.run([*git, "add", "-A"], cwd=clone, check=True)
    subprocess.run([*git, "commit", "-qm", "clone"], cwd=clone, check=True)
    os.symlink(os.path.join(ROOT, ".venv"), os.path.join(clone, ".venv"))
    subprocess.run(["cp", "-rs", os.path.join(ROOT, ".comfyui"), os.path.join(clone, ".comfyui")], check=True)
    return clone


def _env(**extra) -> dict:
    """A contributor's shell: none of this run's own settings (which ComfyUI, where the shared folder is)."""
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS",
            "PIP_CONSTRAINT", "PIP_CONFIG_FILE", "OMP_NUM_THREADS")
    return {**{k: os.environ[k] for k in keep if k in os.environ}, **extra}


@pytest.fixture(scope="module")
def mirror():
    """This checkout's verified sources (kept by its own set-up), served over HTTP on 127.0.0.1."""
    keep = os.path.join(ROOT, comfyui_sources.KEEP)
    if not os.path.isfile(os.path.join(keep, PIN.archive)) and not os.path.isdir(os.path.join(keep, PIN.shared + ".git")):
        scratch = os.path.join(os.environ.get("TMPDIR", "/tmp"), "sources-keep")
        comfyui_sources.fetch(PIN.version, scratch, ROOT)  # a tree built before sources were kept
        shutil.rmtree(scratch, ignore_errors=True)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=keep)
    handler.log_message = lambda *a: None
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/"
    if not os.path.isfile(os.path.join(keep, PIN.archive)):
        url += PIN.shared + ".git"  # fetched from upstream: a git mirror with the tag
    yield url
    srv.shutdown()


def test_the_test_command_runs_in_a_clone_with_only_a_loopback_mirror(tmp_path, mirror):
    clone = _clone(str(tmp_path))
    assert not os.path.exists(os.path.join(clone, "..", "shared"))
    r = subprocess.run(["scripts/test.sh", "tests/project/test_comfyui_version.py", "-q", "-p", "no:cacheprovider"],
                       cwd=clone, env=_env(PREQUANT_COMFYUI_MIRROR=mirror), capture_output=True, text=True,
                       timeout=1800)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert f"ComfyUI 0.33.0 sources from {mirror}" in out, out[-4000:]
    assert re.search(r"\b\d+ passed", out) and not re.search(r"\b\d+ (failed|error)", out), out[-2000:]
    version = os.path.join(clone, ".cache", "comfyui-0.33", PIN.folder, "comfyui_version.py")
    assert '__version__ = "0.33.0"' in open(version).read()
    # what was checked is kept: the clone's next build needs no mirror
    assert os.listdir(os.path.join(clone, comfyui_sources.KEEP))


def test_a_clone_with_no_mirror_offline_stops_with_one_message(tmp_path):
    clone = _clone(str(tmp_path))
    proxy = "http://127.0.0.1:9"  # a closed port: no network, whatever this machine can reach
    r = subprocess.run(["scripts/setup_comfyui033.sh"], cwd=clone, capture_output=True, text=True, timeout=600,
                       env=_env(https_proxy=proxy, HTTPS_PROXY=proxy, http_proxy=proxy, HTTP_PROXY=proxy))
    assert r.returncode != 0
    err = r.stderr
    assert "Traceback" not in err and "0.33.0" in err and PIN.upstream in err, err
    assert comfyui_sources.MIRROR_VAR in err and PIN.sha256[:16] in err, err
    assert not os.path.exists(os.path.join(clone, ".cache", "comfyui-0.33", PIN.folder)), "nothing half-built"


def test_a_mirror_that_is_not_the_pinned_comfyui_is_refused(tmp_path):
    """A git mirror whose tag is another commit, and an archive of another digest, are never unpacked."""
    fake = tmp_path / "fake"
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t", "-C", str(fake)]
    subprocess.run(["git", "init", "-q", str(fake)], check=True)
    (fake / "main.py").write_text("print('not ComfyUI')\n")
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    subprocess.run([*git, "tag", PIN.ref], check=True)
    other = tmp_path / "archive"
    other.mkdir()
    (other / PIN.archive).write_bytes(b"\x1f\x8b not the archive")
    for m in (str(fake), str(other)):
        r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "comfyui_sources.py"), PIN.version,
                            str(tmp_path / "dest")], env=_env(PREQUANT_COMFYUI_MIRROR=m), capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert ("not ComfyUI 0.33.0's" in r.stderr), r.stderr
        assert not os.path.exists(tmp_path / "dest" / PIN.folder)
