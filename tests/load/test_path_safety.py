"""Path safety: only what the model folders and the allowlist permit is read; odd names are just names.

Policy tested here (see also prequant_core/load/allowlist.py):

* A file is readable when its name lies in one of ComfyUI's model folders for this pack (``models/prequant``,
  ``models/diffusion_models``, their extra_model_paths entries), links followed as ComfyUI's own loaders follow them,
  or when its *real* path (every symlink resolved, '..' collapsed) lies there or inside a folder listed in
  ``PREQUANT_ALLOW_LOCAL_PATH`` / ``UNSLOTH_ALLOW_LOCAL_PREQUANT_PATH``. So '..' escapes (also through a linked
  folder), absolute paths elsewhere and prefix look-alikes (``models/prequant-evil``) are refused; linked files and
  folders in a model folder, and a model folder that is itself a symlink (models on another drive), work.
* Hard links are ordinary files of the folder they appear in: a hard link has no "outside" (all names of an inode
  are equal), and making one requires being able to write the model folder *and* (with the kernel's default
  ``fs.protected_hardlinks=1``) owning or being able to read and write the target. Whoever can do that can already
  copy the file there, so refusing ``st_nlink > 1`` would add no protection while breaking deduplicated model stores
  (``cp -al``, hard-linked download caches). Not refused.
* Names are data: spaces, unicode, newlines, quotes and shell metacharacters in file names are read as given and
  never reach a shell. Non-regular files (pipes, devices), symlink loops, NUL bytes and over-long names end in a
  clear ``PrequantError``, never a hang or a raw ``OSError``.
* The builder node writes only a plain name inside ``models/prequant`` (no folders, no '..', not hidden, no control
  characters); an existing name that is a symlink is never replaced (nor the file it points to).
"""
from __future__ import annotations

import os
import shutil
import signal

import pytest
import torch

from prequant_core.load import allowlist
from prequant_core import errors, formats
from prequant_core.builder import writers
from prequant_core.load.opening import open_checkpoint

NONE = "(none: use path or hub_repo)"
SECRET = b"TOP-SECRET-CONTENT do not leak\n"
ODD_NAMES = [
    "with space and \u00fcn\u00efc\u00f6d\u00e9 \u6a21\u578b INT8.safetensors",
    "$(touch PWNED1) `touch PWNED2`; touch PWNED3 | cat & INT8.safetensors",
    "new\nline INT8.safetensors",
    "quote ' \" INT8.safetensors",
    "-rf --help INT8.safetensors",
    "tab\tand\u200bzero-width INT8.pt",
]
MARKERS = ("PWNED1", "PWNED2", "PWNED3")


@pytest.fixture
def no_allowlist(monkeypatch):
    monkeypatch.delenv("PREQUANT_ALLOW_LOCAL_PATH", raising=False)
    monkeypatch.delenv("UNSLOTH_ALLOW_LOCAL_PREQUANT_PATH", raising=False)


@pytest.fixture(scope="module")
def layout(comfy, prequant_files, tmp_path_factory):
    """The headless ComfyUI's models/prequant with real checkpoints, and an 'outside' folder with a checkpoint and a
    secret that must never be read."""
    import folder_paths
    model_dir = folder_paths.get_folder_paths("prequant")[0]
    outside = tmp_path_factory.mktemp("outside")
    ckpt_st, ckpt_pt = prequant_files("int8", "safetensors"), prequant_files("int8", "pt")
    shutil.copy(ckpt_st, outside / "elsewhere.safetensors")
    (outside / "secret.safetensors").write_bytes(SECRET)
    created = []

    def place(name, src=ckpt_st, how="link"):
        p = os.path.join(model_dir, name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        if how == "link":  # same file system: a cheap second name for the session's checkpoint
            os.link(src, p)
        elif how == "symlink":
            os.symlink(src, p)
        else:
            shutil.copy(src, p)
        created.append(p)
        return p

    yield type("Layout", (), {"model_dir": model_dir, "outside": str(outside), "place": staticmethod(place),
                              "st": ckpt_st, "pt": ckpt_pt})
    for p in created:
        if os.path.lexists(p):
            os.unlink(p)


def info_node(comfy, checkpoint=NONE, path=""):
    nodes, _ = comfy
    with torch.inference_mode():
        return nodes.NODE_CLASS_MAPPINGS["PrequantInfo"]().inspect(checkpoint, path=path)


def load_node(comfy, checkpoint=NONE, path=""):
    nodes, _ = comfy
    with torch.inference_mode():
        return nodes.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]().load(checkpoint, path=path)


def assert_refused(exc_info):
    text = str(exc_info.value)
    assert SECRET.decode().strip()[:10] not in text, "the refusal leaked the file's content"
    assert "TOP-SECRET" not in repr(getattr(exc_info.value, "found", "")), "found= leaked content"


# ---- allowlist.check ------------------------------------------------------------------------------------------------

def test_dotdot_and_absolute_paths(layout, no_allowlist):
    md = layout.model_dir
    escape = os.path.join(md, *([".."] * md.count(os.sep)), layout.outside.lstrip(os.sep), "elsewhere.safetensors")
    assert os.path.exists(escape)
    for p in (escape, os.path.join(layout.outside, "elsewhere.safetensors"), "/etc/hostname", "/",
              os.path.join(md, "..", "prequant-evil", "x.safetensors")):
        with pytest.raises(errors.PathNotAllowedError):
            allowlist.check(p, [md])
    inside = layout.place("inside.safetensors")
    roundabout = os.path.join(md, "sub", "..", "inside.safetensors")
    assert allowlist.check(roundabout, [md]) == os.path.realpath(inside)


def test_prefix_lookalike_folder(tmp_path, no_allowlist):
    real = tmp_path / "models" / "prequant"
    evil = tmp_path / "models" / "prequant-evil"
    real.mkdir(parents=True)
    evil.mkdir()
    (evil / "x.safetensors").write_bytes(b"x")
    with pytest.raises(errors.PathNotAllowedError):
        allowlist.check(str(evil / "x.safetensors"), [str(real)])
    with pytest.raises(errors.PathNotAllowedError):
        allowlist.check(str(real) + "-evil/x.safetensors", [str(real)])


def test_allowlist_variable(layout, monkeypatch, tmp_path):
    target = os.path.join(layout.outside, "elsewhere.safetensors")
    monkeypatch.setenv("PREQUANT_ALLOW_LOCAL_PATH", os.pathsep.join(["relative/dir", "1", "", layout.outside]))
    monkeypatch.delenv("UNSLOTH_ALLOW_LOCAL_PREQUANT_PATH", raising=False)
    assert allowlist.check(target) == os.path.realpath(target)
    assert allowlist.allowed_roots() == [os.path.realpath(layout.outside)]  # relative and flag words ignored
    monkeypatch.chdir(tmp_path)
    (tmp_path / "relative" / "dir").mkdir(parents=True)
    (tmp_path / "relative" / "dir" / "f.safetensors").write_bytes(b"x")
    with pytest.raises(errors.PathNotAllowedError):
        allowlist.check("relative/dir/f.safetensors")


def test_symlinks(layout, no_allowlist, tmp_path):
    md = layout.model_dir
    # a file linked into the model folder from a shared store loads like a real file (ComfyUI's loaders follow links)
    target = os.path.join(layout.outside, "elsewhere.safetensors")
    out_link = layout.place("store-link INT8.safetensors", target, how="symlink")
    opened = open_checkpoint(out_link, model_dirs=[md])
    assert opened.verdict.ok
    # a link to something that is not a checkpoint is only data: refused as such, its content not shown
    secret_link = layout.place("secret-link.safetensors", os.path.join(layout.outside, "secret.safetensors"),
                               how="symlink")
    with pytest.raises(errors.CorruptCheckpointError) as e:
        open_checkpoint(secret_link, model_dirs=[md])
    assert_refused(e)
    # a linked folder works too; '..' after it climbs from its target, so such a name is judged by its real path
    dir_link = os.path.join(md, "linked-dir")
    os.symlink(layout.outside, dir_link)
    try:
        assert open_checkpoint(os.path.join(dir_link, "elsewhere.safetensors"), model_dirs=[md]).verdict.ok
        climb = os.path.join(dir_link, "..", os.path.basename(layout.outside), "elsewhere.safetensors")
        with pytest.raises(errors.PathNotAllowedError) as e:
            open_checkpoint(climb, model_dirs=[md])
        assert "resolves to" in str(e.value)
    finally:
        os.unlink(dir_link)
    # outside the model folders the real path still decides: a link elsewhere pointing at the same file is refused
    stray = tmp_path / "stray-link.safetensors"
    os.symlink(target, stray)
    with pytest.raises(errors.PathNotAllowedError):
        open_checkpoint(str(stray), model_dirs=[md])
    # a symlink that stays inside is fine
    inner = layout.place("inner-target INT8.safetensors")
    ok_link = layout.place("inner-link INT8.safetensors", inner, how="symlink")
    assert open_checkpoint(ok_link, model_dirs=[md]).verdict.ok
    # a model folder that is itself a symlink (models on another drive) works
    drive = tmp_path / "drive"
    drive.mkdir()
    os.link(layout.st, drive / "m.safetensors")
    linked_models = tmp_path / "models-link"
    os.symlink(drive, linked_models)
    assert open_checkpoint(str(linked_models / "m.safetensors"), model_dirs=[str(linked_models)]).verdict.ok


def test_hard_links_are_ordinary_files(layout, no_allowlist):
    """Policy: a hard link inside the model folder is read like any file there (see the module docstring)."""
    outside_copy = os.path.join(layout.outside, "hard-target.safetensors")
    shutil.copy(layout.st, outside_copy)
    hard = os.path.join(layout.model_dir, "hard-link INT8.safetensors")
    os.link(outside_copy, hard)
    try:
        assert os.stat(hard).st_nlink == 2
        opened = open_checkpoint(hard, model_dirs=[layout.model_dir])
        assert opened.verdict.ok and opened.checkpoint.path == os.path.realpath(hard)
        # the other name of the same inode, outside every allowed folder, stays refused
        with pytest.raises(errors.PathNotAllowedError):
            open_checkpoint(outside_copy, model_dirs=[layout.model_dir])
    finally:
        os.unlink(hard)


def test_special_files_never_hang(layout, no_allowlist, tmp_path):
    md = layout.model_dir
    fifo = os.path.join(md, "pipe INT8.safetensors")
    os.mkfifo(fifo)
    loop_a, loop_b = os.path.join(md, "loop-a.safetensors"), os.path.join(md, "loop-b.safetensors")
    os.symlink(loop_b, loop_a)
    os.symlink(loop_a, loop_b)
    folder = os.path.join(md, "a-folder.safetensors")
    os.mkdir(folder)
    def on_alarm(signum, frame):
        raise TimeoutError("opening a special file hung")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(20)
    try:
        for p in (fifo, loop_a, folder, os.path.join(md, "n" * 5000 + ".safetensors")):
            with pytest.raises(errors.PrequantError) as e:
                open_checkpoint(p, model_dirs=[md])
            assert not isinstance(e.value, errors.PathNotAllowedError) or p == loop_a, (p, e.value)
        with pytest.raises(errors.PathNotAllowedError):
            open_checkpoint(os.path.join(md, "nul\x00byte.safetensors"), model_dirs=[md])
        with pytest.raises(errors.PrequantError):
            formats.read(os.path.join(md, "nul\x00byte.safetensors"))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        os.unlink(fifo)
        os.unlink(loop_a)
        os.unlink(loop_b)
        os.rmdir(folder)


# ---- the nodes ------------------------------------------------------------------------------------------------------

def test_nodes_list_and_load_a_linked_model_file(layout, comfy, no_allowlist):
    """A checkpoint linked into models/prequant from a shared store is offered in the list and loads through both
    nodes, picked or typed; the same file typed by its own outside path stays refused."""
    nodes, pack = comfy
    target = os.path.join(layout.outside, "elsewhere.safetensors")
    layout.place("shared-store INT8.safetensors", target, how="symlink")
    assert "shared-store INT8.safetensors" in pack.nodes.paths.choices()
    out = load_node(comfy, "shared-store INT8.safetensors")
    assert out["ui"]["prequant"][0]["scheme"] == "int8"
    assert "VALID" in info_node(comfy, path=os.path.join(layout.model_dir, "shared-store INT8.safetensors"))["result"][0]
    with pytest.raises(errors.PathNotAllowedError):
        load_node(comfy, path=target)


def test_nodes_refuse_paths_outside(layout, comfy, no_allowlist):
    md = layout.model_dir
    secret = os.path.join(layout.outside, "secret.safetensors")
    escape = os.path.join(md, *([".."] * md.count(os.sep)), secret.lstrip(os.sep))
    for p in (secret, escape, os.path.relpath(secret), "~/" + os.path.relpath(secret, os.path.expanduser("~"))):
        for call in (info_node, load_node):
            with pytest.raises(errors.PathNotAllowedError) as e:
                call(comfy, path=p)
            assert_refused(e)


def test_node_choice_cannot_climb_out(layout, comfy, no_allowlist):
    """A ``checkpoint`` value is a name inside the folder: ComfyUI's own lookup drops '..' and leading '/'."""
    from importlib import import_module
    _, pack = comfy
    paths = pack.nodes.paths
    rel_secret = os.path.relpath(os.path.join(layout.outside, "secret.safetensors"), layout.model_dir)
    for choice in (rel_secret, "/" + os.path.join(layout.outside, "secret.safetensors").lstrip("/"),
                   "diffusion_models/" + rel_secret, "../../../../etc/hostname"):
        try:
            resolved = paths.resolve(choice)
        except (FileNotFoundError, errors.PrequantError):
            resolved = None
        if resolved is not None:
            assert allowlist.is_allowed(resolved, paths.model_dirs()), resolved
        for call in (info_node, load_node):
            with pytest.raises(Exception) as e:  # noqa: PT011 - ComfyUI's own FileNotFoundError or ours
                call(comfy, checkpoint=choice)
            assert "TOP-SECRET" not in str(e.value)
    assert import_module("folder_paths").get_full_path("prequant", rel_secret) is None


def test_odd_names_are_only_names(layout, comfy, no_allowlist, tmp_path):
    _, pack = comfy
    paths = pack.nodes.paths
    placed = {}
    for name in ODD_NAMES:
        src = layout.pt if name.endswith(".pt") else layout.st
        placed[name] = layout.place(name, src)
    choices = paths.choices()
    for name, full in placed.items():
        assert name in choices, name
        assert paths.resolve(name) == full
        report = info_node(comfy, checkpoint=name)["result"][0]
        assert "VALID" in report and "INVALID" not in report, report
    # a full load through the node, by the most hostile-looking name
    patcher = load_node(comfy, checkpoint=ODD_NAMES[1])["result"][0]
    assert patcher.model_size() > 0
    for where in (os.getcwd(), layout.model_dir, os.path.dirname(layout.model_dir), str(tmp_path)):
        for m in MARKERS:
            assert not os.path.exists(os.path.join(where, m)), f"a file name ran as a command ({where}/{m})"


def test_builder_filename_input(layout, comfy, no_allowlist, zimage_dense, tmp_path):
    import folder_paths
    from tools import tiny_models
    nodes, pack = comfy
    check = pack.nodes.build_node.check_filename
    refused = ["../escape.safetensors", "sub/dir.safetensors", "..", "a..b.safetensors", "/abs.safetensors",
               "C:evil.safetensors", ".hidden.safetensors", "back\\slash.safetensors", "nul\x00.safetensors",
               "new\nline.safetensors", "tab\t.safetensors", "esc\x1b[31m.safetensors",
               os.path.join(layout.outside, "x.safetensors")]
    for name in refused:
        with pytest.raises(errors.BuildError):
            check(name, "safetensors", "Tongyi-MAI/Z-Image-Turbo", "int8")
    assert check(" spaced \u6a21\u578b $(x) ", "pt", "b/Z", "int8") == "spaced \u6a21\u578b $(x).pt"
    with pytest.raises(errors.BuildError):
        check("x.pt", "safetensors", "b/Z", "int8")

    # a real build through the node with a hostile-looking (but plain) name: written exactly there, nothing ran
    dense_dir = folder_paths.get_folder_paths("diffusion_models")[0]
    os.makedirs(dense_dir, exist_ok=True)
    dense = tiny_models.save_dense_safetensors(zimage_dense, os.path.join(dense_dir, "tiny-dense.safetensors"))
    name = "$(touch PWNED1); `touch PWNED2` \u6a21\u578b"
    before = set(os.listdir(layout.model_dir))
    try:
        node = nodes.NODE_CLASS_MAPPINGS["PrequantBuildCheckpoint"]()
        with torch.inference_mode():
            out = node.build("tiny-dense.safetensors", "int8", 512, "Tongyi-MAI/Z-Image-Turbo", "z-image", name,
                             "safetensors", False)["result"][0]
        assert out == os.path.join(os.path.realpath(layout.model_dir), name + ".safetensors") or \
            os.path.realpath(out) == os.path.realpath(os.path.join(layout.model_dir, name + ".safetensors"))
        assert set(os.listdir(layout.model_dir)) - before == {name + ".safetensors"}
        assert formats.read(out).quantized_keys
        for where in (os.getcwd(), layout.model_dir, dense_dir):
            for m in MARKERS:
                assert not os.path.exists(os.path.join(where, m))
    finally:
        os.unlink(dense)
        for n in set(os.listdir(layout.model_dir)) - before:
            os.unlink(os.path.join(layout.model_dir, n))


def test_overwriting_a_symlinked_name_is_refused_and_leaves_link_and_target(layout, no_allowlist):
    victim = os.path.join(layout.outside, "victim.bin")
    with open(victim, "wb") as f:
        f.write(SECRET)
    link = os.path.join(layout.model_dir, "victim-link.safetensors")
    os.symlink(victim, link)
    ck = formats.read(layout.st)
    small = {k: v for k, v in list(ck.tensors.items())[:3]}
    try:
        with pytest.raises(errors.BuildError):  # without overwrite: refused, both untouched
            writers.write_checkpoint(link, small, {"family": "z-image"})
        assert os.path.islink(link) and open(victim, "rb").read() == SECRET
        with pytest.raises(errors.BuildError, match="symbolic link"):  # overwrite replaces regular files only
            writers.write_checkpoint(link, small, {"family": "z-image"}, overwrite=True)
        assert os.path.islink(link) and open(victim, "rb").read() == SECRET
    finally:
        os.unlink(link)
