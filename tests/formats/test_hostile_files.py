"""Hostile files: no crash, no memory blow-up, no hang, no raw escapes, no misleading words.

The crafted corpus (``hostile_corpus.py``: deep nesting, amplification, declared sizes that store nothing, malformed
JSON and metadata, escape sequences, non-finite scales) goes through every entry point (full read, Info with
fingerprint verification, verify, the loader with its memory guard, the declared-size estimate, the CLI's text and
``--json``) in a worker process, so a SIGSEGV or an OOM kill shows up as a failed assertion naming the file instead of
taking the test run down. Per file the worker measures wall time and peak resident memory growth; the limits below
are asserted, and the summary line printed at the end is the figure the README quotes.

The in-process tests after it cover what a corpus file cannot: a name swapped between the allowlist check and the
read, FIFOs, the memory guard counting what tensors declare, built file names and ``--overwrite``.
"""
from __future__ import annotations

import json
import os
import select
import stat
import subprocess
import sys
import threading
import time

import pytest
import torch

import hostile_corpus
from conftest import ROOT
from prequant_core.load import allowlist, opening, memory_check
from prequant_core import builder, errors, formats
from prequant_core.builder import output_file
from prequant_core.formats import pickle_guard
from prequant_core.load.metadata import Request

CASE_LIMIT_S = 30  # one file through every entry point; a hang is reported after this
PEAK_LIMIT_BYTES = 256 * 2**20  # resident growth for one file, whatever it declares
WORKER = os.path.join(ROOT, "tests", "hostile_worker.py")
ENTRY_POINTS = ("read", "info", "verify", "load")


class Worker:
    def __init__(self):
        self.r, w = os.pipe()
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "tests"))
        self.proc = subprocess.Popen([sys.executable, WORKER, str(w)], stdin=subprocess.PIPE, pass_fds=(w,),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True, env=env,
                                     cwd=ROOT)
        os.close(w)
        self.buf = b""
        assert json.loads(self.line(120))["ready"]

    def line(self, timeout: float) -> str | None:
        end = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = end - time.monotonic()
            if left <= 0 or not select.select([self.r], [], [], left)[0]:
                return None
            chunk = os.read(self.r, 1 << 16)
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()

    def run(self, path: str) -> dict:
        self.proc.stdin.write(path + "\n")
        self.proc.stdin.flush()
        line = self.line(CASE_LIMIT_S)
        if line is not None:
            return json.loads(line)
        hung = self.proc.poll() is None
        if hung:
            self.proc.kill()
        code = self.proc.wait()
        return {"file": os.path.basename(path), "crash": None if hung else code, "hang": hung}

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        os.close(self.r)


@pytest.fixture(scope="module")
def corpus_results(tmp_path_factory, request):
    folder = str(tmp_path_factory.mktemp("hostile"))
    cases = hostile_corpus.write_corpus(folder)
    results = {}
    worker = Worker()
    try:
        for name, cls in cases:
            rec = worker.run(os.path.join(folder, name))
            rec["class"] = cls
            results[name] = rec
            if "crash" in rec:  # the worker is gone: the rest of the corpus gets a new one
                worker = Worker()
    finally:
        worker.close()
    hostile = [r for r in results.values() if r["class"] != "control"]
    measured = [r for r in hostile if "seconds" in r]
    worst_mem = max(measured, key=lambda r: r["peak_growth_bytes"])
    worst_time = max(measured, key=lambda r: r["seconds"])
    crashes = sum(1 for r in hostile if r.get("crash") is not None or r.get("hang"))
    summary = (f"[hostile] {len(hostile)} files x {len(ENTRY_POINTS) + 3} entry points, crashes/hangs {crashes}; "
               f"worst peak memory growth {worst_mem['peak_growth_bytes'] / 2**20:.0f} MiB ({worst_mem['file']}), "
               f"worst time {worst_time['seconds']:.2f} s ({worst_time['file']})")
    capman = request.config.pluginmanager.getplugin("capturemanager")
    with capman.global_and_fixture_disabled():
        print("\n" + summary, flush=True)
    return results


def test_corpus_covers_every_attack_class(corpus_results):
    classes = {r["class"] for r in corpus_results.values()}
    assert {"deep nesting", "amplification", "declared size", "malformed JSON", "malformed metadata", "escapes",
            "non-finite scale", "wording", "control", "tensor attributes", "non-finite value", "wrong dtype"} <= classes
    assert len(corpus_results) >= 30


def test_no_file_crashes_or_hangs_the_reader(corpus_results):
    bad = {n: r for n, r in corpus_results.items() if "crash" in r}
    assert not bad, f"worker crashed or hung: {bad}"


def test_every_entry_point_ends_in_a_result_or_a_typed_error(corpus_results):
    uncaught = {(n, ep): out for n, r in corpus_results.items() for ep, out in r["outcomes"].items()
                if out.startswith("UNCAUGHT")}
    assert not uncaught, json.dumps(uncaught, indent=1)[:4000]


def test_hostile_files_are_refused_and_controls_load(corpus_results):
    for name, r in corpus_results.items():
        outs = [r["outcomes"][ep] for ep in ENTRY_POINTS]
        if r["class"] == "control":
            assert outs == ["ok"] * len(outs), (name, r["outcomes"])
        elif r["class"] in ("tensor attributes", "wrong dtype"):
            # checked from the tensors' fields and dtypes, no weight byte needed: every entry point refuses
            assert all(o != "ok" for o in outs), (name, r["outcomes"])
        elif r["class"] == "non-finite value":
            # weight values: the reader and the loader refuse; the header-only verify cannot see them
            assert all(r["outcomes"][ep] != "ok" for ep in ("read", "load")), (name, r["outcomes"])
        elif r["class"] == "non-finite scale":
            # scales are weight bytes: the header-only verify leaves them unread; loading and fingerprinting refuse
            assert all(r["outcomes"][ep] != "ok" for ep in ("read", "info", "load")), (name, r["outcomes"])
        elif r["class"] == "lying declaration":
            # well-formed tensors whose metadata lies (a policy naming 100k layers, counting 10^12): read in bounded
            # time, and judged invalid rather than loaded
            assert "INVALID" in r["text"] and "nvfp4_policy" in r["text"], (name, r["text"][:500])
        elif r["class"] != "escapes":
            assert all(o != "ok" for o in outs), (name, r["outcomes"])


def test_memory_and_time_per_file_are_bounded(corpus_results):
    for name, r in corpus_results.items():
        assert r["peak_growth_bytes"] <= PEAK_LIMIT_BYTES, (name, r["peak_growth_bytes"])
        assert r["seconds"] < CASE_LIMIT_S, (name, r["seconds"])


def test_printed_text_never_carries_escapes_and_json_is_strict(corpus_results):
    for name, r in corpus_results.items():
        assert not r["escape_in_text"] and not r["surrogate_in_text"], (name, r["text"])
        assert r["json_strict"], name
    esc = corpus_results["ansi-metadata.safetensors"]
    assert esc["outcomes"]["info"] == "ok" and "\\x1b[2J" in esc["text"], esc["text"]


def test_refusals_name_what_was_found_without_unsafe_advice(tmp_path):
    folder = str(tmp_path)
    hostile_corpus.write_corpus(folder)
    with pytest.raises(errors.UnsafeCheckpointError) as g:
        formats.read(os.path.join(folder, "global-os-system.pt"))
    with pytest.raises(errors.CorruptCheckpointError) as op:
        formats.read(os.path.join(folder, "text-int-opcode.pt"))
    assert "os.system" in str(g.value)
    assert "opcode INT" in str(op.value) and "could run code" not in str(op.value)
    for e in (g.value, op.value):
        assert "weights_only" not in str(e) and "likely succeed" not in str(e)
    with pytest.raises(errors.CorruptCheckpointError, match="deeper than 64 levels"):
        formats.read(os.path.join(folder, "deep-tuple-key-300000.pt"))
    with pytest.raises(errors.CorruptCheckpointError, match="compressed"):
        formats.read(os.path.join(folder, "zip-bomb-data-pkl.pt"))
    with pytest.raises(errors.CorruptCheckpointError, match="not stored densely"):
        formats.read(os.path.join(folder, "stride0-quantized.pt"))
    with pytest.raises(errors.CorruptCheckpointError, match="not finite"):
        formats.read(os.path.join(folder, "nan-scale.safetensors"))
    with pytest.raises(errors.CorruptCheckpointError, match="contains itself"):
        formats.read(os.path.join(folder, "self-containing-metadata.pt"))


def test_pickle_bounds_sit_far_above_real_checkpoints(prequant_files):
    for scheme in ("int8", "fp8"):
        path = prequant_files(scheme, "pt")
        reader = torch._C.PyTorchFileReader(path)
        counts = pickle_guard.scan(pickle_guard.read_pickle_record(reader, path), path)
        assert counts["depth"] <= pickle_guard.MAX_DEPTH // 4, counts
        assert counts["opcodes"] * 20 < pickle_guard.MAX_OPCODES, counts


# ---- check-then-open: the handle is what gets judged and read ---------------------------------------------------

def test_a_name_swapped_after_opening_does_not_redirect_the_read(tmp_path, prequant_files):
    """An allowlisted folder (PREQUANT_ALLOW_LOCAL_PATH) is judged by real paths: the check and every read apply to
    the opened handle, so a name swapped for a link to an outside file after the check reads nothing of it."""
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    allowed.mkdir(), outside.mkdir()
    env = {allowlist.ENV_VARS[0]: str(allowed)}
    good = allowed / "a.safetensors"
    good.write_bytes(open(prequant_files("fp8", "safetensors"), "rb").read())
    other = outside / "b.safetensors"
    other.write_bytes(open(prequant_files("int8", "safetensors"), "rb").read())
    with formats.open_file(str(good)) as f:
        allowlist.check_opened(f, [], env)
        os.replace(good, allowed / "moved.safetensors")
        os.symlink(other, good)  # the name now leads outside the allowed folder
        ck = formats.read(f)
    assert ck.metadata["scheme"] == "fp8"  # the opened file's bytes, not the outside file's
    with formats.open_file(str(good)) as f:  # opened through the swapped name: judged by where it leads
        with pytest.raises(errors.PathNotAllowedError):
            allowlist.check_opened(f, [], env)


def test_a_fifo_is_refused_at_once(tmp_path):
    fifo = tmp_path / "x.safetensors"
    os.mkfifo(fifo)
    done = {}

    def go():
        for fn in (formats.read, memory_check.declared_bytes):
            try:
                fn(str(fifo))
            except errors.PrequantError as e:
                done[fn.__name__] = str(e)
    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "reading a FIFO blocked"
    assert all("not a regular file" in m for m in done.values()) and len(done) == 2, done


# ---- the memory guard counts what the tensors declare -----------------------------------------------------------

def test_views_sharing_one_storage_count_at_their_declared_size(tmp_path):
    base = torch.zeros(1024, 1024, dtype=torch.bfloat16)  # 2 MiB stored once
    sd = {f"layers.{i}.attention_norm1.weight": base[:] for i in range(64)}  # 64 views: 128 MiB declared
    path = tmp_path / "views.pt"
    torch.save({"format": "unsloth_prequant_transformer_state_dict_v1", "metadata": {}, "state_dict": sd}, path)
    stored = memory_check.declared_bytes(str(path))
    assert stored <= 3 * 2**20
    guard = memory_check.Guard(available=lambda: 64 * 2**20, headroom=0)
    with pytest.raises(errors.MemoryBudgetError) as e:
        opening.open_checkpoint(str(path), Request(), model_dirs=[str(tmp_path)], strict=False, memory=guard)
    assert "128.00 MiB" in str(e.value)


# ---- built file names and --overwrite ----------------------------------------------------------------------------

@pytest.mark.parametrize("base_id", ["org/..", "org/.hidden", "org/name\x1b[2J", "org/a:b",
                                     "org/" + "x" * 300])
def test_names_derived_from_base_model_id_pass_the_filename_check(base_id):
    with pytest.raises(errors.BuildError, match="not a plain file name"):
        builder.default_filename(base_id, "fp8", "safetensors")


@pytest.mark.parametrize("name", ["CON.safetensors", "nul", "a.safetensors.", "a\u202eb.pt", "a/../b.pt", ".x.pt"])
def test_typed_names_pass_the_same_check(name):
    with pytest.raises(errors.BuildError, match="not a plain file name"):
        output_file.check_output_name(name)


def test_windows_paths_give_their_last_part():
    assert builder.default_filename("C:\\models\\Z-Image-Turbo", "int8", "pt") == "Z-Image-Turbo-INT8.pt"


def test_overwrite_replaces_only_regular_files(tmp_path, zimage_dense):
    fifo = tmp_path / "out.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(errors.BuildError, match="not a regular file"):
        builder.build(zimage_dense, builder.Target(str(fifo), overwrite=True),
                      builder.Recipe("fp8", family="z-image", base_model_id="x/y"))
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    link = tmp_path / "link.safetensors"
    target = tmp_path / "target.bin"
    target.write_bytes(b"keep")
    os.symlink(target, link)
    with pytest.raises(errors.BuildError, match="symbolic link"):
        builder.build(zimage_dense, builder.Target(str(link), overwrite=True),
                      builder.Recipe("fp8", family="z-image", base_model_id="x/y"))
    assert target.read_bytes() == b"keep" and os.path.islink(link)



def test_reads_through_the_handle_without_pread(tmp_path, monkeypatch):
    """Windows has no os.pread: the handle seeks its own descriptor instead, with the same bytes."""
    from prequant_core.formats import file_handle
    data = bytes(range(256)) * 1000
    p = tmp_path / "x.bin"
    p.write_bytes(data)
    with file_handle.open_file(str(p)) as f:
        with_pread = (f.read_at(3, 100), f.read_at(250_000, 10_000))
        monkeypatch.setattr(file_handle, "_PREAD", None)
        assert (f.read_at(3, 100), f.read_at(250_000, 10_000)) == with_pread == (data[3:103], data[250_000:])
