"""Builder faults on real filesystem conditions: disk full, no permission, a process killed mid-write.

In every case the destination is untouched (an existing file keeps its bytes, a new one does not appear) and no
temp file stays behind (a SIGKILLed build's temp is removed by the next build in that folder, as builder.py
documents). Conditions are real: a 20 MB tmpfs (``mount``; root), a read-only remount, ``chattr +i``, an
unprivileged uid (``setuid`` in a child), ``RLIMIT_FSIZE`` (EFBIG) in a child, and SIGKILL. Where mounting is not
permitted those cases skip with the reason; the RLIMIT and SIGKILL cases need no privilege.
"""
from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from conftest import BASE_ID, ROOT
from prequant_core import builder, errors, families, formats
from prequant_core.builder import output_file, writers
from prequant_core.schemes import quantize

FAM = families.get("z-image")
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def temps(folder) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.startswith(output_file.TEMP_PREFIX))


def digest(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@contextlib.contextmanager
def tmpfs(path, size="20m"):
    """A real tmpfs of ``size`` at ``path``; skips the test when this process may not mount."""
    os.makedirs(path, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                       text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or r.returncode}); the RLIMIT_FSIZE case covers "
                    "failing writes without privileges")
    try:
        yield str(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def remount_ro(path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)


@pytest.fixture(scope="module")
def quantized(zimage_dense):
    """The tiny Z-Image quantized once (int8; about 95 MB written), with the metadata build would write."""
    q, skipped = quantize.quantize_tensors(zimage_dense, "int8")
    meta = builder.make_metadata(builder.Recipe("int8", family=FAM, base_model_id=BASE_ID, min_features=512,
                                                exclude=builder.schemes.exclude_tokens("int8")),
                                 q)
    return q, meta


@pytest.fixture(scope="module")
def dense_file(zimage_dense, tmp_path_factory):
    from tools import tiny_models
    return tiny_models.save_dense_safetensors(zimage_dense, str(tmp_path_factory.mktemp("dense") / "dense.safetensors"))


@pytest.fixture(scope="module")
def small_ckpt():
    """A world-readable folder with a small pre-quantized checkpoint (child processes, other uids)."""
    d = tempfile.mkdtemp(prefix="prequant-faults-")
    os.chmod(d, 0o755)
    import torch
    from prequant_core import schemes
    g = torch.Generator().manual_seed(0)
    t = {"layers.0.attention.to_q.weight": schemes.quantize_weight(torch.randn(256, 512, generator=g).bfloat16(), "int8"),
         "layers.0.attention.to_q.bias": torch.randn(256, generator=g).bfloat16(),
         "x_pad_token": torch.zeros(1, 512).bfloat16()}
    p = os.path.join(d, "small.safetensors")
    writers.write_checkpoint(p, t, {"family": "z-image", "scheme": "int8"})
    os.chmod(p, 0o644)
    yield p
    shutil.rmtree(d, ignore_errors=True)


EXISTING = b"an existing checkpoint the failed build must not touch\n" * 1000


def assert_untouched(folder, dest, before: str | None):
    if before is None:
        assert not os.path.lexists(dest), "a failed build left a destination file"
    else:
        assert digest(dest) == before, "a failed build changed the existing destination"
    assert temps(folder) == [], f"temp files left behind: {temps(folder)}"


# ---- disk full (tmpfs) ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("container", ["safetensors", "pt"])
def test_disk_full_new_file(quantized, tmp_path, container):
    q, meta = quantized
    with tmpfs(tmp_path / "small") as mnt:
        dest = os.path.join(mnt, f"Z-Image-Turbo-INT8.{container}")
        with pytest.raises(errors.BuildError) as e:
            writers.write_checkpoint(dest, q, meta, container=container)
        assert "disk filled up" in str(e.value) and e.value.fix
        assert_untouched(mnt, dest, None)
        # torch.save's writer (pt) keeps its descriptor of the unlinked temp until the exception is dropped
        del e
        gc.collect()
        assert shutil.disk_usage(mnt).used < 1 << 20, "the partial file's blocks were not released"


@pytest.mark.parametrize("container", ["safetensors", "pt"])
def test_disk_full_existing_file_keeps_its_bytes(quantized, tmp_path, container):
    q, meta = quantized
    with tmpfs(tmp_path / "small") as mnt:
        dest = os.path.join(mnt, f"existing.{container}")
        with open(dest, "wb") as f:
            f.write(EXISTING)
        before = digest(dest)
        with pytest.raises(errors.BuildError):
            writers.write_checkpoint(dest, q, meta, container=container, overwrite=True)
        assert_untouched(mnt, dest, before)


def test_build_refuses_up_front_when_the_disk_is_too_small(dense_file, tmp_path):
    """build() estimates the output from shapes and refuses before quantizing or writing anything."""
    with tmpfs(tmp_path / "small") as mnt:
        dest = os.path.join(mnt, "out.safetensors")
        t0 = time.time()
        with pytest.raises(errors.BuildError) as e:
            builder.build(dense_file, builder.Target(dest), builder.Recipe("int8"))
        assert "Not enough free disk space" in str(e.value) and time.time() - t0 < 30
        assert_untouched(mnt, dest, None)
        # the same through the command line: exit status 2, the message on stderr, nothing written
        r = subprocess.run([sys.executable, "-m", "prequant_core", "build", "-i", dense_file, "-o", dest, "-q"],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert r.returncode == 2, r.stderr[-2000:]
        assert "Not enough free disk space" in r.stderr and "Traceback" not in r.stderr
        assert_untouched(mnt, dest, None)


# ---- permission denied ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("container", ["safetensors", "pt"])
def test_read_only_filesystem(quantized, tmp_path, container):
    q, meta = quantized
    with tmpfs(tmp_path / "ro", size="200m") as mnt:
        existing = os.path.join(mnt, f"existing.{container}")
        with open(existing, "wb") as f:
            f.write(EXISTING)
        before = digest(existing)
        remount_ro(mnt)
        for dest, overwrite, prior in ((os.path.join(mnt, f"new.{container}"), False, None),
                                       (existing, True, before)):
            with pytest.raises(errors.BuildError) as e:
                writers.write_checkpoint(dest, q, meta, container=container, overwrite=overwrite)
            assert "read-only" in str(e.value).lower() or "permission" in str(e.value).lower(), str(e.value)
            assert e.value.fix
            assert_untouched(mnt, dest, prior)


def test_immutable_destination(small_ckpt, tmp_path):
    """chattr +i: even root cannot replace the file; the finished temp must be removed, the file kept."""
    ck = formats.read(small_ckpt)
    dest = tmp_path / "locked.safetensors"
    dest.write_bytes(EXISTING)
    before = digest(dest)
    if subprocess.run(["chattr", "+i", str(dest)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not supported on this filesystem / for this user")
    try:
        with pytest.raises(errors.BuildError) as e:
            writers.write_checkpoint(str(dest), ck.tensors, ck.metadata, overwrite=True)
        assert e.value.fix
        assert_untouched(str(tmp_path), str(dest), before)
    finally:
        subprocess.run(["chattr", "-i", str(dest)], check=False)


CHILD = textwrap.dedent("""
    import json, os, resource, signal, sys
    sys.path.insert(0, {root!r})
    from prequant_core import errors, formats
    from prequant_core.builder import writers
    cfg = json.loads(sys.argv[1])
    ck = formats.read(cfg["src"])
    # every lazy import of the writers happens now, before privileges or limits change
    warm = os.path.join(cfg["warm"], "warm.safetensors")
    for c in ("safetensors", "pt"):
        w = warm[: -len(".safetensors")] + "." + c
        writers.write_checkpoint(w, ck.tensors, ck.metadata, container=c, overwrite=True)
        os.unlink(w)
    if cfg.get("fsize"):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write then fails with EFBIG instead of killing us
        resource.setrlimit(resource.RLIMIT_FSIZE, (cfg["fsize"], cfg["fsize"]))
    if cfg.get("uid") is not None:
        os.setgroups([])
        os.setgid(cfg["uid"])
        os.setuid(cfg["uid"])
    out = []
    for case in cfg["cases"]:
        try:
            writers.write_checkpoint(case["dest"], ck.tensors, ck.metadata, container=case["container"],
                                     overwrite=case["overwrite"])
            out.append({{"ok": True}})
        except errors.PrequantError as e:
            out.append({{"ok": False, "prequant": True, "type": type(e).__name__, "msg": str(e)}})
        except BaseException as e:
            out.append({{"ok": False, "prequant": False, "type": type(e).__name__, "msg": str(e)}})
    print("RESULT " + json.dumps(out))
""")


def run_child(cfg: dict) -> list[dict]:
    r = subprocess.run([sys.executable, "-c", CHILD.format(root=ROOT), json.dumps(cfg)], capture_output=True,
                       text=True, timeout=300)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and lines, r.stdout[-1500:] + r.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


def _world_dir(mode: int) -> str:
    d = tempfile.mkdtemp(prefix="prequant-faults-")
    os.chmod(d, mode)
    return d


@pytest.mark.skipif(not IS_ROOT, reason="needs root to switch to an unprivileged uid")
def test_unprivileged_user_cannot_write(small_ckpt):
    """A build running as 'nobody' into a root-owned folder (0755) and over a root-owned file (0644): EACCES."""
    folder, warm = _world_dir(0o755), _world_dir(0o777)
    try:
        existing = os.path.join(folder, "existing.pt")
        with open(existing, "wb") as f:
            f.write(EXISTING)
        os.chmod(existing, 0o666)  # writable file, but the folder is not: replacing it still needs the folder
        before = digest(existing)
        cases = [{"dest": os.path.join(folder, "new.safetensors"), "container": "safetensors", "overwrite": False},
                 {"dest": existing, "container": "pt", "overwrite": True}]
        results = run_child({"src": small_ckpt, "warm": warm, "uid": 65534, "cases": cases})
        for case, res in zip(cases, results):
            assert not res["ok"] and res["prequant"], res
            assert "permission" in res["msg"].lower(), res
        assert_untouched(folder, cases[0]["dest"], None)
        assert_untouched(folder, existing, before)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(warm, ignore_errors=True)


def test_file_size_limit_efbig(small_ckpt):
    """RLIMIT_FSIZE makes the kernel fail the write with EFBIG mid-file (no privileges needed)."""
    folder = _world_dir(0o755)
    try:
        existing = os.path.join(folder, "existing.safetensors")
        with open(existing, "wb") as f:
            f.write(EXISTING[:1000])
        before = digest(existing)
        cases = [{"dest": os.path.join(folder, "new.safetensors"), "container": "safetensors", "overwrite": False},
                 {"dest": os.path.join(folder, "new.pt"), "container": "pt", "overwrite": False},
                 {"dest": existing, "container": "safetensors", "overwrite": True}]
        size = os.path.getsize(small_ckpt)
        results = run_child({"src": small_ckpt, "warm": folder, "fsize": size // 3, "cases": cases})
        for case, res in zip(cases, results):
            assert not res["ok"] and res["prequant"], res
        assert_untouched(folder, cases[0]["dest"], None)
        assert_untouched(folder, cases[1]["dest"], None)
        assert_untouched(folder, existing, before)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# ---- killed mid-write ----------------------------------------------------------------------------------------------

KILL_CHILD = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {root!r})
    from prequant_core import builder
    dense, dest, ready, container, overwrite = sys.argv[1:6]

    def progress(stage, done, total, key):
        if stage == "write" and done >= 1 and not os.path.exists(ready):
            open(ready, "w").close()
            time.sleep(600)  # parked mid-write until the parent kills us

    builder.build(dense, builder.Target(dest, container=container, overwrite=overwrite == "1"), builder.Recipe("int8"),
                progress=progress)
""")


def _kill_mid_write(dense_file, folder, dest, container, overwrite):
    ready = os.path.join(os.path.dirname(folder), f"ready-{os.path.basename(dest)}")
    p = subprocess.Popen([sys.executable, "-c", KILL_CHILD.format(root=ROOT), dense_file, dest, ready, container,
                          "1" if overwrite else "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 300
        while not os.path.exists(ready):
            assert p.poll() is None, p.stderr.read().decode()[-3000:]
            assert time.time() < deadline, "the build never reached the write stage"
            time.sleep(0.05)
        left = temps(folder)
        assert len(left) == 1, left
        if container == "safetensors":
            assert os.path.getsize(os.path.join(folder, left[0])) > 0, "killed before writing anything"
        os.kill(p.pid, signal.SIGKILL)
        p.wait(30)
        assert p.returncode == -signal.SIGKILL
        return left[0]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stdout.close()
        p.stderr.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(ready)


@pytest.mark.parametrize("container,overwrite", [("safetensors", False), ("safetensors", True), ("pt", True)])
def test_sigkill_mid_write(dense_file, small_ckpt, tmp_path, container, overwrite):
    folder = tmp_path / "out"
    folder.mkdir()
    dest = str(folder / f"Z-Image-Turbo-INT8.{container}")
    before = None
    if overwrite:
        with open(dest, "wb") as f:
            f.write(EXISTING)
        before = digest(dest)
    temp = _kill_mid_write(dense_file, str(folder), dest, container, overwrite)
    # the destination is exactly as it was; the killed process's temp is still there (nothing can run at SIGKILL)
    if before is None:
        assert not os.path.lexists(dest)
    else:
        assert digest(dest) == before
    assert temps(str(folder)) == [temp]
    # the next build in that folder removes it (its pid is gone), and its own temp too once done
    ck = formats.read(small_ckpt)
    other = str(folder / "next.safetensors")
    writers.write_checkpoint(other, ck.tensors, ck.metadata)
    assert temps(str(folder)) == []
    assert formats.read(other).quantized_keys
    if before is None:
        assert not os.path.lexists(dest)
    else:
        assert digest(dest) == before


def test_sigkill_cli_at_an_arbitrary_moment(dense_file, tmp_path):
    """``python -m prequant_core build`` killed as soon as it reports writing: the destination is absent or whole
    (never partial), and at most the dead process's temp remains until the next build cleans it."""
    folder = tmp_path / "cli"
    folder.mkdir()
    dest = str(folder / "out.safetensors")
    p = subprocess.Popen([sys.executable, "-m", "prequant_core", "build", "-i", dense_file, "-o", dest],
                         cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for line in p.stderr:
            if line.startswith("quantizing "):  # piped, each stage prints one line when done: writing begins
                os.kill(p.pid, signal.SIGKILL)
                break
        p.wait(60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stderr.close()
    assert p.returncode == -signal.SIGKILL
    if os.path.lexists(dest):  # the write finished before the signal landed: then it must be complete
        assert formats.read(dest).quantized_keys
    assert len(temps(str(folder))) <= 1
    assert output_file.clean_stale_temps(str(folder)) or temps(str(folder)) == []
    assert temps(str(folder)) == []


# ---- a build trusts no input (issue 39 #2) --------------------------------------------------------------------------

def _small_dense(path, poison=None):
    import torch
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(1)
    t = {"layers.0.attention.to_q.weight": torch.randn(512, 512, generator=g).bfloat16(),
         "layers.0.attention.to_q.bias": torch.randn(512, generator=g).bfloat16(),
         "layers.0.attention_norm1.weight": torch.ones(512).bfloat16()}
    if poison:
        poison(t)
    save_file(t, path)
    return path


def _nan_weight(t):
    t["layers.0.attention.to_q.weight"][7, 3] = float("nan")


def _inf_bias(t):
    t["layers.0.attention.to_q.bias"][0] = float("inf")


def _int8_weight(t):
    import torch
    t["layers.0.attention.to_q.weight"] = torch.randint(-127, 127, (512, 512), dtype=torch.int8)


@pytest.mark.parametrize("container,poison,says", [
    ("safetensors", _nan_weight, "NaN or infinite"), ("comfyui-native", _nan_weight, "NaN or infinite"),
    ("safetensors", _inf_bias, "NaN or infinite"), ("comfyui-native", _int8_weight, "not a floating-point weight")],
    ids=["nan-weight", "nan-weight-native", "inf-bias", "int8-dense-weight-native"])
def test_a_dense_input_that_would_compute_nan_builds_nothing(tmp_path, container, poison, says):
    src = _small_dense(str(tmp_path / "dense.safetensors"), poison)
    dest = str(tmp_path / "out" / "out.safetensors")
    os.makedirs(os.path.dirname(dest))
    r = subprocess.run([sys.executable, "-m", "prequant_core", "build", "-i", src, "-o", dest, "-q", "--family",
                        "z-image", "--scheme", "int8", "--min-features", "256", "--container", container],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert says in r.stderr and "layers.0.attention.to_q" in r.stderr and "dense.safetensors" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "unexpected" not in r.stderr
    assert_untouched(os.path.dirname(dest), dest, None)


def test_a_native_build_never_falls_back_to_an_unchecked_read(tmp_path):
    """A pre-quantized input the readers refuse (here a NaN scale) is refused as the loader refuses it."""
    import torch
    from safetensors.torch import save_file
    q = builder.schemes.quantize_weight(torch.randn(512, 512).bfloat16(), "int8")
    src = str(tmp_path / "refused.safetensors")
    writers.write_checkpoint(src, {"layers.0.attention.to_q.weight": q,
                                   "layers.0.attention_norm1.weight": torch.ones(512).bfloat16()},
                             {"family": "z-image", "scheme": "int8"})
    from safetensors import safe_open
    with safe_open(src, "pt") as f:
        sd, meta = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    key = next(k for k in sd if k.endswith("_weight_scale"))
    sd[key] = torch.full_like(sd[key], float("nan"))
    save_file(sd, src, metadata=meta)
    dest = str(tmp_path / "out" / "native.safetensors")
    os.makedirs(os.path.dirname(dest))
    r = subprocess.run([sys.executable, "-m", "prequant_core", "build", "-i", src, "-o", dest, "-q", "--family",
                        "z-image", "--container", "comfyui-native"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and "not finite" in r.stderr and "refused.safetensors" in r.stderr, r.stderr[-2000:]
    assert_untouched(os.path.dirname(dest), dest, None)


def test_a_native_build_hitting_the_file_size_limit_says_so(tmp_path):
    """Issue 39 #7: the ComfyUI-native writer's EFBIG ended as rc 3 "unexpected SafetensorError ... please report";
    it is the same plain refusal as the other writers', and nothing is left behind."""
    import resource
    import torch
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(2)
    dense_file = str(tmp_path / "qwen-dense.safetensors")  # Qwen-Image: ComfyUI uses diffusers' names
    save_file({f"transformer_blocks.0.attn.to_{p}.weight": torch.randn(1024, 1024, generator=g).bfloat16()
               for p in "qkv"}, dense_file)
    dest = str(tmp_path / "out" / "native.safetensors")
    os.makedirs(os.path.dirname(dest))
    limit = 2**20  # below the 3 MiB output, above anything else the command writes

    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write then fails with EFBIG instead of killing it
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    r = subprocess.run([sys.executable, "-B", "-m", "prequant_core", "build", "-i", dense_file, "-o", dest, "-q",
                        "--container", "comfyui-native", "--scheme", "int8", "--family", "qwen-image",
                        "--min-features", "256"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, preexec_fn=limited)
    assert r.returncode == 2 and "file size limit" in r.stderr and "unexpected" not in r.stderr, r.stderr[-2000:]
    assert_untouched(os.path.dirname(dest), dest, None)
