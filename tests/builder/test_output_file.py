"""Where a built file goes (``prequant_core/builder/output_file.py``), in the cases the builder tests do not reach:
the owner check of a temp left by another build without psutil (``_pid_alive``), the clean-up's skips (its own temp,
an old first-version temp, a temp gone between listing and stat, a folder that cannot be listed), and
``atomic_output``'s refusals (a folder as output, a path that cannot be checked, a missing folder, a file appearing
while building) and its fallback to a checked rename where hard links fail.

Real files in a temp folder and real processes; an OS call is made to fail (``os.kill``'s EPERM, ``os.link``'s
EPERM) only where this machine cannot produce the failure (root may signal any process; its file systems link).
Core tier: no ComfyUI.
"""
from __future__ import annotations

import errno
import os
import subprocess
import sys
import time

import pytest

from prequant_core.builder import output_file as of
from prequant_core.errors import BuildError


@pytest.fixture
def no_psutil(monkeypatch):
    """The process as on a host without psutil (the command line outside ComfyUI): its import fails."""
    monkeypatch.setitem(sys.modules, "psutil", None)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_without_psutil_the_owner_check_probes_the_pid_with_signal_0(no_psutil, monkeypatch):
    with pytest.raises(ImportError):
        import psutil  # noqa: F401
    assert of._pid_alive(os.getpid()) is True
    dead = _dead_pid()
    assert of._pid_alive(dead) is False
    # a process the caller may not signal (EPERM) is alive: its temp waits for the age rule

    def refused(pid, sig):
        raise PermissionError(errno.EPERM, "Operation not permitted")
    monkeypatch.setattr(os, "kill", refused)
    assert of._pid_alive(dead) is True


def _temp(folder, pid: int, *, host: str | None = None, age: float = 0.0) -> str:
    path = os.path.join(folder, f"{of.TEMP_PREFIX}{host or of._host_tag()}-{pid}-abc123{of.TEMP_SUFFIX}")
    with open(path, "wb") as f:
        f.write(b"partial")
    if age:
        t = time.time() - age
        os.utime(path, (t, t))
    return path


def test_clean_up_without_psutil_removes_a_dead_builds_temp_and_keeps_its_own(no_psutil, tmp_path):
    folder = str(tmp_path)
    mine = _temp(folder, os.getpid())
    dead = _temp(folder, _dead_pid())
    other_host = _temp(folder, _dead_pid(), host="0badc0de")  # another machine's pid says nothing here
    old_legacy = os.path.join(folder, ".prequant-tmpab12cd.partial")  # the first version's mkstemp name
    young_legacy = os.path.join(folder, ".prequant-tmpef34gh.partial")
    for p in (old_legacy, young_legacy):
        open(p, "wb").close()
    t = time.time() - 7200
    os.utime(old_legacy, (t, t))
    unrelated = tmp_path / "model.safetensors"
    unrelated.write_bytes(b"x")
    removed = of.clean_stale_temps(folder)
    assert sorted(removed) == sorted([dead, old_legacy])
    assert os.path.exists(mine) and os.path.exists(other_host) and os.path.exists(young_legacy)
    assert unrelated.exists()


def test_clean_up_skips_a_temp_gone_before_its_stat_and_a_folder_it_cannot_list(tmp_path):
    dangling = tmp_path / f"{of.TEMP_PREFIX}{of._host_tag()}-1-abc{of.TEMP_SUFFIX}"
    dangling.symlink_to(tmp_path / "vanished")  # listed, but stat finds nothing
    assert of.clean_stale_temps(str(tmp_path)) == []
    assert os.path.islink(dangling)
    assert of.clean_stale_temps(str(tmp_path / "missing")) == []
    f = tmp_path / "a-file"
    f.write_bytes(b"")
    assert of.clean_stale_temps(str(f)) == []  # listing a file: NotADirectoryError


def test_check_writable_leaves_a_missing_folder_to_the_write_itself(tmp_path):
    assert of.check_writable(str(tmp_path / "missing")) is None
    assert of.check_writable(str(tmp_path)) is None
    with pytest.raises(BuildError, match="Nothing can be written in the output folder"):
        of.check_writable("/proc")  # control: a virtual file system is refused


@pytest.mark.parametrize("name", ["", "   "])
def test_an_empty_output_name_is_refused(name):
    with pytest.raises(BuildError, match="not a plain file name: it is empty"):
        of.check_output_name(name)


def test_atomic_output_refuses_a_folder_a_path_it_cannot_check_and_a_missing_folder(tmp_path):
    (tmp_path / "out.safetensors").mkdir()
    with pytest.raises(BuildError, match="The output path is a folder"):
        with of.atomic_output(str(tmp_path / "out.safetensors")):
            pass
    blocker = tmp_path / "plain-file"
    blocker.write_bytes(b"x")
    with pytest.raises(BuildError) as e:  # a file where a folder of the path should be: ENOTDIR
        with of.atomic_output(str(blocker / "out.safetensors")):
            pass
    assert "The output path cannot be checked" in str(e.value) and "NotADirectoryError" in str(e.value)
    with pytest.raises(BuildError, match="The output folder does not exist"):
        with of.atomic_output(str(tmp_path / "no-such-folder" / "out.safetensors")):
            pass
    assert sorted(os.listdir(tmp_path)) == ["out.safetensors", "plain-file"]


def test_a_file_appearing_while_building_is_left_untouched_and_the_temp_removed(tmp_path):
    dest = tmp_path / "out.safetensors"
    with pytest.raises(BuildError, match="The output file appeared while building; it was left untouched"):
        with of.atomic_output(str(dest)) as tmp:
            with open(tmp, "wb") as f:
                f.write(b"built")
            dest.write_bytes(b"someone else's")
    assert dest.read_bytes() == b"someone else's"
    assert os.listdir(tmp_path) == ["out.safetensors"]


def test_without_hard_links_the_move_is_a_checked_rename(tmp_path, monkeypatch):
    def no_links(src, dst, *a, **kw):
        raise PermissionError(errno.EPERM, "Operation not permitted")  # e.g. FAT / exFAT, some network mounts
    monkeypatch.setattr(os, "link", no_links)
    dest = tmp_path / "out.safetensors"
    with of.atomic_output(str(dest)) as tmp:
        with open(tmp, "wb") as f:
            f.write(b"built")
    assert dest.read_bytes() == b"built" and os.listdir(tmp_path) == ["out.safetensors"]
