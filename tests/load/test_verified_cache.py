"""The remembered-fingerprint cache as a stranger with write access to it would try it (issue 39 #6), through the
loaders' open step (``opening.open_checkpoint``, what Load Prequant Transformer runs before placing a weight), in a
fresh process each time as a ComfyUI start would be.

The cache only ever says "this very file was hashed already"; whatever sits at its paths (a FIFO, a link to
/dev/zero, a 2 GB sparse file, a link planted at the stamp's name) costs a re-hash and nothing more: no hang, no
MemoryError that turns into "corrupt", no file written through a link. A file swapped for another of the same size,
its mtime put back, is hashed again (the stamp holds the inode and ctime) and refused."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import unsloth_builder as ub
from conftest import ROOT
from prequant_core.formats import fingerprint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    d = tmp_path_factory.mktemp("verified_cache")
    path = str(d / "Z-Image-Turbo-INT8.safetensors")
    ub.build_file("z-image", "int8", [str(d / "Z-Image-Turbo-INT8.pt"), path])
    return path


LOAD = r"""
import os, sys
from prequant_core.errors import PrequantError
from prequant_core.formats import fingerprint
from prequant_core.load import metadata, opening
calls = []
real_verify = fingerprint.verify
fingerprint.verify = lambda *a, **k: calls.append(1) or real_verify(*a, **k)
try:
    o = opening.open_checkpoint(sys.argv[1], metadata.Request(), model_dirs=[os.path.dirname(sys.argv[1])])
    print("VALID" if o.verdict.ok else "INVALID", "hashed" if calls else "remembered")
except PrequantError as e:
    print(type(e).__name__, e)
    sys.exit(1)
"""


def _verify(path, cache, timeout=120):
    env = dict(os.environ, PREQUANT_VERIFIED_DIR=str(cache), PREQUANT_FINGERPRINT="full")
    return subprocess.run([sys.executable, "-c", LOAD, path], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


def _marker(cache, path):
    return fingerprint._marker(str(cache), os.path.realpath(path))


def _stamps(cache):
    return [n for n in os.listdir(cache) if n.endswith(".json")]


def test_a_pass_is_remembered_once_as_a_small_file_of_its_own(checkpoint, tmp_path):
    cache = tmp_path / "cache"
    p = _verify(checkpoint, cache)
    assert p.returncode == 0 and "VALID hashed" in p.stdout, p.stdout + p.stderr
    assert "VALID remembered" in _verify(checkpoint, cache).stdout  # the point of the cache: hashed once
    assert _stamps(cache) == [os.path.basename(_marker(cache, checkpoint))]
    stamp = json.load(open(_marker(cache, checkpoint)))
    st = os.stat(checkpoint)
    assert (stamp["ino"], stamp["ctime_ns"], stamp["size"]) == (st.st_ino, st.st_ctime_ns, st.st_size)
    assert os.listdir(cache) == _stamps(cache)  # no temp file left behind


@pytest.mark.parametrize("plant", ["fifo", "dev-zero", "sparse-2g", "garbage"])
def test_whatever_sits_at_the_stamps_path_costs_a_rehash_only(checkpoint, tmp_path, plant):
    cache = tmp_path / "cache"
    cache.mkdir()
    m = _marker(cache, checkpoint)
    if plant == "fifo":
        os.mkfifo(m)  # opening it for reading would block the prompt worker for good
    elif plant == "dev-zero":
        os.symlink("/dev/zero", m)
    elif plant == "sparse-2g":
        with open(m, "wb") as f:
            f.truncate(2 << 30)
    else:
        with open(m, "wb") as f:
            f.write(b"\xff{not json" * 10)
    p = _verify(checkpoint, cache, timeout=60)  # subprocess.TimeoutExpired here is the hang
    assert p.returncode == 0, p.stdout + p.stderr
    assert "VALID hashed" in p.stdout and "corrupt" not in (p.stdout + p.stderr).lower(), p.stdout + p.stderr
    # the planted thing was replaced by a real stamp, not written through
    assert os.path.isfile(m) and not os.path.islink(m) and os.path.getsize(m) < fingerprint.MARKER_MAX_BYTES


def test_a_link_planted_at_the_stamps_names_is_never_written_through(checkpoint, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's own file\n")
    m = _marker(cache, checkpoint)
    # the stamp's own name, and the temp names an older release used (<marker>.<pid>.tmp) for the next pids
    os.symlink(victim, m)
    for pid in range(os.getpid(), os.getpid() + 400):
        os.symlink(victim, f"{m}.{pid}.tmp")
    p = _verify(checkpoint, cache)
    assert p.returncode == 0, p.stdout + p.stderr
    assert victim.read_text() == "the user's own file\n"
    assert os.path.isfile(m) and not os.path.islink(m)
    # and in-process, where the old temp name (this pid's) is planted for sure
    st = os.stat(checkpoint)
    os.unlink(m)
    assert os.path.islink(f"{m}.{os.getpid()}.tmp")
    fingerprint.remember(os.path.realpath(checkpoint), st, {"modules": {}}, folder=str(cache))
    assert victim.read_text() == "the user's own file\n"


def _data_offset(path):
    """Where the first weight's bytes start (safetensors: 8-byte header length, the JSON header, then the data)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    key = sorted(k for k in header if k.endswith(".weight._weight_qdata") or k.endswith("weight_qdata"))[0]
    return 8 + n + header[key]["data_offsets"][0]


@pytest.mark.parametrize("how", ["in-place", "renamed-over"])
def test_a_same_size_swap_with_its_mtime_put_back_is_hashed_again(checkpoint, tmp_path, how):
    cache = tmp_path / "cache"
    path = str(tmp_path / os.path.basename(checkpoint))
    with open(checkpoint, "rb") as src, open(path, "wb") as dst:
        dst.write(src.read())
    assert "VALID hashed" in _verify(path, cache).stdout
    st = os.stat(path)
    off = _data_offset(path)
    if how == "in-place":
        with open(path, "r+b") as f:
            f.seek(off)
            b = f.read(1)
            f.seek(off)
            f.write(bytes([b[0] ^ 0x55]))
    else:
        other = path + ".other"
        with open(path, "rb") as f:
            data = bytearray(f.read())
        data[off] ^= 0x55
        with open(other, "wb") as f:
            f.write(data)
        os.replace(other, path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    st2 = os.stat(path)
    assert (st2.st_size, st2.st_mtime_ns) == (st.st_size, st.st_mtime_ns)  # what the old stamp compared
    p = _verify(path, cache)
    assert p.returncode == 1 and "ValidationError" in p.stdout and "fingerprint" in p.stdout, p.stdout + p.stderr
