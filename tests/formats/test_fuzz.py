"""Fuzzing every reader with real files: each case ends in success or a ``PrequantError``, never hangs, never runs code.

Readers and what is thrown at them (hypothesis, derandomized, no example database, bounded counts):

* ``.pt`` container: random bytes and random opcode streams as ``data.pkl`` inside a real ``torch.save`` zip,
  opcode-level mutations of a real container's pickle (ints -> huge / negative, strings, GLOBALs, deleted / duplicated
  / swapped / inserted opcodes; this is where huge declared storage sizes come from), code-executing payloads
  (GLOBAL / STACK_GLOBAL / INST / OBJ / NEWOBJ / NEWOBJ_EX / BUILD / EXT1 to ``os.system``, ``builtins.open``, ``exec``,
  ``subprocess``, ``shutil``, ``torch.save`` and a tripwire of this module), wrong types in ``format`` / ``metadata``
  / ``state_dict``, damaged zip bytes;
* ``.safetensors`` container: header length field (past the file, > 100 MB declared, 0), non-UTF-8 / non-JSON /
  deeply nested headers, tree mutations of the header JSON (offsets out of range or overlapping, dtype / shape
  mismatch, torchao JSON entries, ``tensor_names`` pointing nowhere, ``unsloth_metadata`` of every type), damaged
  tensor bytes, truncation;
* metadata of every wrong type through ``metadata.validate`` and ``report.info`` (and the report's text / JSON);
* legacy torchao-v1 ``.pt`` files (the restricted unpickler): a real file written by torchao 0.14.1 when it is
  installed (else a synthesized one), mutated like the container above;
* ComfyUI-native files: ``comfy_quant`` tensors, ``_quantization_metadata`` and ``scaled_fp8`` markings with random
  formats, dtypes, shapes and scales, plus header tree mutations.

Every case goes through ``formats.read``, ``report.info`` (some with fingerprint verification) and
``opening.open_checkpoint`` (memory guard included). A per-case SIGALRM guard turns a hang into a failure
(``faulthandler`` backs it up for hangs inside C code); after every case the marker folder must be empty: payloads
write there when they run. The per-reader counts are printed at the end of the module (``[fuzz] ...`` lines).
"""
from __future__ import annotations

import collections
import contextlib
import copy
import copyreg
import faulthandler
import json
import os
import pickle
import pickletools
import shutil
import signal
import struct
import subprocess
import sys
import tempfile

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import BASE_ID, ROOT
from hostile_corpus import rezip, torch_save_bytes, zip_entries
from prequant_core import builder, errors, families, formats, report, schemes
from prequant_core.load import opening, metadata
from prequant_core.builder import writers
from prequant_core.formats.checkpoint import FORMAT_V1, FORMAT_V2, FORMAT_V3, Checkpoint
from prequant_core.formats.containers import legacy_v1
from prequant_core.load.metadata import Request

CASE_TIMEOUT_S = 20  # one case; tiny files read in milliseconds
MODULE = __name__  # how pickles name this module's tripwire
MARK_DIR = tempfile.mkdtemp(prefix="prequant-fuzz-mark-")
EXT_CODE = 0xF1  # a copyreg extension code registered to the tripwire while this module runs
COUNTS: dict = collections.defaultdict(collections.Counter)  # reader -> outcome -> reader calls
CASES: collections.Counter = collections.Counter()  # reader -> inputs (files or in-memory checkpoints) tried
SCALE = float(os.environ.get("PREQUANT_FUZZ_SCALE", "1"))  # e.g. 10 for a longer run; counts stay deterministic


def fuzz_settings(n: int):
    return settings(max_examples=max(1, int(n * SCALE)), derandomize=True, database=None, deadline=None, print_blob=False,
                    suppress_health_check=list(HealthCheck))


# ---- tripwires: anything that calls, instantiates or sets state on these leaves a file in MARK_DIR --------------

def _tripwire(*args, **kwargs):
    with open(os.path.join(MARK_DIR, "tripwire-called"), "w") as f:
        f.write(repr(args)[:200])


class Tripwire:
    def __new__(cls, *args, **kwargs):
        _tripwire("new")
        return object.__new__(cls)

    def __init__(self, *args, **kwargs):
        _tripwire("init")

    def __setstate__(self, state):
        _tripwire("setstate")

    def __call__(self, *args, **kwargs):
        _tripwire("call")


@pytest.fixture(scope="module", autouse=True)
def _module_guards(request):
    copyreg.add_extension(MODULE, "_tripwire", EXT_CODE)
    faulthandler.dump_traceback_later(900, exit=True)  # a hang inside C code ends the run loudly, not silently
    yield
    faulthandler.cancel_dump_traceback_later()
    copyreg.remove_extension(MODULE, "_tripwire", EXT_CODE)
    shutil.rmtree(MARK_DIR, ignore_errors=True)
    lines = [f"[fuzz] {reader}: {CASES[reader]} cases, {sum(c.values())} reader calls -> "
             + ", ".join(f"{k} {v}" for k, v in c.most_common()) for reader, c in sorted(COUNTS.items())]
    lines.append(f"[fuzz] total: {sum(CASES.values())} cases, {sum(sum(c.values()) for c in COUNTS.values())} "
                 "reader calls")
    capman = request.config.pluginmanager.getplugin("capturemanager")
    with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
        print("\n" + "\n".join(lines), flush=True)


class CaseTimeout(BaseException):
    """BaseException: the code under test catching ``Exception`` cannot swallow it."""


@contextlib.contextmanager
def time_limit(seconds: float):
    def on_alarm(signum, frame):
        raise CaseTimeout(f"a fuzz case ran longer than {seconds} s")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def attempt(reader: str, fn, *args, **kwargs) -> str:
    """Run one reader call: success or a PrequantError; anything else propagates (hypothesis shrinks it)."""
    result = "ok"
    try:
        with time_limit(CASE_TIMEOUT_S):
            out = fn(*args, **kwargs)
            if isinstance(out, report.Report):  # the CLI and the node render every report: that must work too
                json.dumps(out.to_dict())
                out.to_text()
    except errors.PrequantError as e:
        result = type(e).__name__
        assert str(e), "an error without a message"
    COUNTS[reader][result] += 1
    left = os.listdir(MARK_DIR)
    assert not left, f"a payload ran: {left}"
    return result


def read_all(reader: str, path: str, *, fingerprint: bool = False) -> list[str]:
    """Every entry point a stranger's file reaches: the full reader, the header-only report, the loader."""
    folder = os.path.dirname(path)
    CASES[reader] += 1
    out = [attempt(reader, formats.read, path),
           attempt(reader, report.info, path, None, fingerprint),
           attempt(reader, opening.open_checkpoint, path, Request(), model_dirs=[folder], strict=False)]
    return out


# ---- real tiny inputs ----------------------------------------------------------------------------------------------

def tiny_tensors(scheme: str) -> dict:
    """Z-Image key names (so family detection and validation run), real torchao tensors, tiny shapes."""
    g = torch.Generator().manual_seed(1)
    w = lambda r, c: torch.randn(r, c, generator=g).to(torch.bfloat16)  # noqa: E731
    return {
        "layers.0.attention.to_q.weight": schemes.quantize_weight(w(32, 32), scheme),
        "layers.0.feed_forward.w1.weight": schemes.quantize_weight(w(64, 32), scheme),
        "layers.0.attention.to_q.bias": torch.randn(32, generator=g).to(torch.bfloat16),
        "layers.0.attention_norm1.weight": torch.ones(32, dtype=torch.bfloat16),
        "x_pad_token": torch.zeros(1, 32, dtype=torch.bfloat16),
    }


def tiny_metadata(tensors: dict, scheme: str) -> dict:
    fam = families.get("z-image")
    return builder.make_metadata(builder.Recipe(scheme, family=fam, base_model_id=BASE_ID, min_features=32,
                                                exclude=schemes.exclude_tokens(scheme, fam.arch.int8_exclude_extra)),
                                 tensors)


def with_pickle(entries: list[tuple[str, bytes]], pkl: bytes) -> bytes:
    return rezip([(n, pkl if n.endswith("/data.pkl") else d) for n, d in entries])


def pickle_of(entries) -> bytes:
    return next(d for n, d in entries if n.endswith("/data.pkl"))


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


class Bases(dict):
    def __repr__(self):  # hypothesis prints fixtures with a falsifying example: keep that readable
        return "<bases>"


class Quiet(tuple):
    def __repr__(self):
        return f"<{self[-1]} legacy file>"


@pytest.fixture(scope="module")
def bases(work):
    """Real containers to mutate: .pt (int8, fp8) and .safetensors (int8, fp8), and their tensors."""
    out = Bases()
    for scheme in ("int8", "fp8"):
        t = tiny_tensors(scheme)
        m = tiny_metadata(t, scheme)
        out[f"pt-{scheme}"] = torch_save_bytes({"format": FORMAT_V1, "metadata": m, "state_dict": t})
        p = work / f"base-{scheme}.safetensors"
        writers.write_checkpoint(str(p), t, m, container="safetensors", overwrite=True)
        out[f"st-{scheme}"] = p.read_bytes()
        out[f"tensors-{scheme}"] = t
        out[f"meta-{scheme}"] = m
    # each base must itself load: otherwise every mutation would only test the error path
    for scheme in ("int8", "fp8"):
        for kind, ext in (("pt", "pt"), ("st", "safetensors")):
            p = work / f"check.{ext}"
            p.write_bytes(out[f"{kind}-{scheme}"])
            assert opening.open_checkpoint(str(p), model_dirs=[str(work)]).verdict.ok
    return out


# ---- pickle opcodes: decode, encode, mutate ------------------------------------------------------------------------

OPS = {op.name: op for op in pickletools.opcodes}


def _enc_arg(op, arg) -> bytes:
    kind = op.arg.name if op.arg else None
    if kind is None:
        return b""
    if kind == "uint1":
        return bytes([arg & 0xFF])
    if kind == "uint2":
        return struct.pack("<H", arg & 0xFFFF)
    if kind == "uint4":
        return struct.pack("<I", arg & 0xFFFFFFFF)
    if kind == "uint8":
        return struct.pack("<Q", arg & 0xFFFFFFFFFFFFFFFF)
    if kind == "int4":
        return struct.pack("<i", (arg + 2**31) % 2**32 - 2**31)
    if kind == "long1":
        b = pickle.encode_long(arg)
        return bytes([len(b)]) + b if len(b) < 256 else b"\x00"
    if kind == "long4":
        b = pickle.encode_long(arg)
        return struct.pack("<i", len(b)) + b
    if kind == "decimalnl_short":
        if arg is True or arg is False:
            return b"0" + (b"1" if arg else b"0") + b"\n"
        return str(int(arg)).encode() + b"\n"
    if kind == "decimalnl_long":
        return str(int(arg)).encode() + b"L\n"
    if kind == "floatnl":
        return repr(float(arg)).encode() + b"\n"
    if kind == "float8":
        return struct.pack(">d", float(arg))
    if kind == "stringnl":
        return repr(str(arg)).encode("ascii", "backslashreplace") + b"\n"
    if kind in ("string1", "string4"):
        b = str(arg).encode("latin-1", "replace")
        return (bytes([len(b) & 0xFF]) if kind == "string1" else struct.pack("<i", len(b))) + b
    if kind in ("bytes1", "bytes4", "bytes8", "bytearray8"):
        b = bytes(arg)
        n = {"bytes1": "<B", "bytes4": "<I", "bytes8": "<Q", "bytearray8": "<Q"}[kind]
        return struct.pack(n, len(b) & (0xFF if kind == "bytes1" else 0xFFFFFFFFFFFFFFFF)) + b
    if kind == "unicodestringnl":
        return str(arg).encode("raw-unicode-escape") + b"\n"
    if kind in ("unicodestring1", "unicodestring4", "unicodestring8"):
        b = str(arg).encode("utf-8", "surrogatepass")
        n = {"unicodestring1": "<B", "unicodestring4": "<I", "unicodestring8": "<Q"}[kind]
        return struct.pack(n, len(b) & (0xFF if kind == "unicodestring1" else 0xFFFFFFFFFFFFFFFF)) + b
    if kind == "stringnl_noescape_pair":
        mod, _, name = str(arg).partition(" ")
        return mod.encode("utf-8", "replace") + b"\n" + name.encode("utf-8", "replace") + b"\n"
    if kind == "stringnl_noescape":
        return str(arg).encode("utf-8", "replace") + b"\n"
    raise AssertionError(kind)


def encode(ops) -> bytes:
    return b"".join(OPS[name].code.encode("latin-1") + _enc_arg(OPS[name], arg) for name, arg in ops)


def decode(data: bytes) -> list[tuple[str, object]]:
    return [(op.name, arg) for op, arg, _ in pickletools.genops(data)]


INT_OPS = ("BININT", "BININT1", "BININT2", "LONG1", "INT", "LONG")
STR_OPS = ("BINUNICODE", "SHORT_BINUNICODE", "UNICODE", "BINUNICODE8")


def global_names():
    """(module, name) pairs a hostile pickle may ask for: code execution, file writes, imports, and tripwires."""
    danger = [("os", "system"), ("posix", "system"), ("builtins", "open"), ("io", "open"), ("builtins", "exec"),
              ("builtins", "eval"), ("builtins", "__import__"), ("subprocess", "call"), ("subprocess", "Popen"),
              ("shutil", "copyfile"), ("torch", "save"), ("torch.serialization", "save"), ("pathlib", "Path"),
              ("codecs", "open"), ("os", "mkdir"), ("builtins", "getattr"), ("operator", "attrgetter"),
              ("torch", "load"), ("numpy", "save"), ("pickle", "loads"), ("builtins", "setattr"),
              (MODULE, "_tripwire"), (MODULE, "Tripwire"), ("torch._utils", "_rebuild_tensor_v2"),
              ("collections", "OrderedDict"), ("torch", "Tensor"), ("torch", "FloatStorage"),
              ("torchao.dtypes.affine_quantized_tensor", "AffineQuantizedTensor"),
              ("torchao.quantization.quant_api", "_int8_symm_per_token_reduced_range_quant"),
              ("torch.torch_version", "TorchVersion"), ("copyreg", "_reconstructor"), ("builtins", "object")]
    return st.one_of(st.sampled_from(danger),
                     st.tuples(st.text("abcdefghijklmnopqrstuvwxyz._", min_size=1, max_size=12),
                               st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12)))


huge_ints = st.one_of(st.integers(-3, 300), st.integers(-2**70, 2**70),
                      st.sampled_from([2**31 - 1, 2**31, 2**32, 2**62, 2**63 - 1, 2**63, 2**64, -2**63, 10**15]))
short_text = st.text(max_size=24)


def random_op():
    def arg_for(name):
        kind = OPS[name].arg.name if OPS[name].arg else None
        if kind is None:
            return st.none()
        if kind in ("uint1",):
            return st.integers(0, 255)
        if kind in ("uint2",):
            return st.integers(0, 2**16 - 1)
        if kind in ("uint4", "int4", "uint8"):
            return st.integers(0, 2**20)
        if kind in ("long1", "long4", "decimalnl_short", "decimalnl_long"):
            return huge_ints
        if kind in ("floatnl", "float8"):
            return st.floats(allow_nan=True)
        if kind in ("bytes1", "bytes4", "bytes8", "bytearray8"):
            return st.binary(max_size=16)
        if kind == "stringnl_noescape_pair":
            return global_names().map(lambda mn: f"{mn[0]} {mn[1]}")
        return short_text.filter(lambda s: "\n" not in s)
    names = sorted(n for n in OPS if n not in ("FRAME",))
    return st.sampled_from(names).flatmap(lambda n: arg_for(n).map(lambda a: (n, a)))


mutation = st.one_of(
    st.tuples(st.just("int"), st.integers(0, 10**6), huge_ints),
    st.tuples(st.just("str"), st.integers(0, 10**6), short_text),
    st.tuples(st.just("global"), st.integers(0, 10**6), global_names()),
    st.tuples(st.just("delete"), st.integers(0, 10**6), st.none()),
    st.tuples(st.just("dup"), st.integers(0, 10**6), st.none()),
    st.tuples(st.just("swap"), st.integers(0, 10**6), st.none()),
    st.tuples(st.just("insert"), st.integers(0, 10**6), random_op()),
)


def mutate_ops(ops: list, muts) -> list:
    ops = list(ops)
    for kind, i, val in muts:
        if not ops:
            break
        if kind == "int":
            idx = [j for j, (n, _) in enumerate(ops) if n in INT_OPS]
            if idx:
                ops[idx[i % len(idx)]] = ("LONG1", val)
        elif kind == "str":
            idx = [j for j, (n, _) in enumerate(ops) if n in STR_OPS]
            if idx:
                ops[idx[i % len(idx)]] = ("BINUNICODE", val)
        elif kind == "global":
            idx = [j for j, (n, _) in enumerate(ops) if n in ("GLOBAL", "INST")]
            if idx:
                j = idx[i % len(idx)]
                ops[j] = (ops[j][0], f"{val[0]} {val[1]}")
        elif kind == "delete":
            del ops[i % len(ops)]
        elif kind == "dup":
            j = i % len(ops)
            ops.insert(j, ops[j])
        elif kind == "swap" and len(ops) > 1:
            j = i % (len(ops) - 1)
            ops[j], ops[j + 1] = ops[j + 1], ops[j]
        elif kind == "insert":
            ops.insert(i % (len(ops) + 1), val)
    return ops


def body(value) -> bytes:
    """Opcodes that push ``value`` (protocol 2, no header, no STOP)."""
    return pickle.dumps(value, protocol=2)[2:-1]


def global_op(mod, name, style):
    if style == "stack":
        return body(mod) + body(name) + b"\x93"
    return b"c" + mod.encode() + b"\n" + name.encode() + b"\n"


def payload(style: str, mod: str, name: str, args: tuple) -> bytes:
    """Opcodes that would call / instantiate ``mod.name`` with ``args``; the stack grows by one."""
    if style in ("global", "stack"):
        return global_op(mod, name, style) + body(args) + b"R"
    if style == "inst":
        return b"(" + b"".join(body(a) for a in args) + b"i" + mod.encode() + b"\n" + name.encode() + b"\n"
    if style == "obj":
        return b"(" + global_op(mod, name, "global") + b"".join(body(a) for a in args) + b"o"
    if style == "newobj":
        return global_op(mod, name, "global") + body(args) + b"\x81"
    if style == "newobj_ex":
        return global_op(mod, name, "global") + body(args) + b"}\x92"
    if style == "build":
        return global_op(mod, name, "global") + b")\x81" + body({"state": args}) + b"b"
    if style == "ext":
        return b"\x82" + bytes([EXT_CODE]) + body(args) + b"R"
    raise AssertionError(style)


def hostile_calls(marker: str):
    return [("builtins", "open", (marker, "w")), ("io", "open", (marker, "w")), ("codecs", "open", (marker, "w")),
            ("os", "system", (f"touch {marker}",)), ("posix", "system", (f"touch {marker}",)),
            ("subprocess", "call", (["touch", marker],)), ("builtins", "exec", (f"open({marker!r}, 'w').close()",)),
            ("builtins", "eval", (f"open({marker!r}, 'w').close()",)), ("os", "mkdir", (marker,)),
            ("shutil", "copyfile", (__file__, marker)), ("torch", "save", ({}, marker)),
            (MODULE, "_tripwire", (marker,)), (MODULE, "Tripwire", (marker,))]


PAYLOAD_STYLES = ("global", "stack", "inst", "obj", "newobj", "newobj_ex", "build", "ext")


def test_payloads_are_live():
    """Control: Python's own unpickler runs every payload style (so 'no marker' below means something)."""
    for style in PAYLOAD_STYLES:
        ran = []
        for mod, name, args in hostile_calls(os.path.join(MARK_DIR, f"live-{style}")):
            if mod in ("os", "posix", "subprocess", "shutil", "torch"):
                continue  # no shell or torch needed to prove the point
            with contextlib.suppress(Exception):
                pickle.loads(b"\x80\x02" + payload(style, mod, name, args) + b".")
            if os.listdir(MARK_DIR):
                ran.append(f"{mod}.{name}")
            for f in os.listdir(MARK_DIR):
                p = os.path.join(MARK_DIR, f)
                shutil.rmtree(p) if os.path.isdir(p) else os.unlink(p)
        assert ran, f"no payload of style {style} runs under pickle.loads: the fuzz payloads would prove nothing"


def op_boundaries(data: bytes) -> list[int]:
    return [pos for _, _, pos in pickletools.genops(data)]


# ---- .pt container -------------------------------------------------------------------------------------------------

def _pt_case(work, name: str, data: bytes, reader: str = "pt") -> list[str]:
    p = work / name
    p.write_bytes(data)
    return read_all(reader, str(p), fingerprint=True)


@fuzz_settings(500)
@given(kind=st.sampled_from(["pt-int8", "pt-fp8"]),
       pkl=st.one_of(st.binary(max_size=200),
                     st.lists(random_op(), max_size=25).map(lambda ops: b"\x80\x02" + encode(ops) + b".")))
def test_pt_random_pickles(bases, work, kind, pkl):
    _pt_case(work, "random.pt", with_pickle(zip_entries(bases[kind]), pkl))


@fuzz_settings(700)
@given(kind=st.sampled_from(["pt-int8", "pt-fp8"]), muts=st.lists(mutation, min_size=1, max_size=4))
def test_pt_mutated_real_pickle(bases, work, kind, muts):
    entries = zip_entries(bases[kind])
    ops = mutate_ops(decode(pickle_of(entries)), muts)
    _pt_case(work, "mutated.pt", with_pickle(entries, encode(ops)))


@fuzz_settings(300)
@given(kind=st.sampled_from(["pt-int8", "pt-fp8"]), style=st.sampled_from(PAYLOAD_STYLES),
       which=st.integers(0, 100), where=st.integers(0, 10**6), alone=st.booleans())
def test_pt_code_execution_payloads(bases, work, kind, style, which, where, alone):
    marker = os.path.join(MARK_DIR, "pwned")
    mod, name, args = hostile_calls(marker)[which % len(hostile_calls(marker))]
    evil = payload(style, mod, name, args)
    entries = zip_entries(bases[kind])
    if alone:
        pkl = b"\x80\x02" + evil + b"."
    else:  # stack-neutral (payload, POP) at an opcode boundary of the real container pickle
        real = pickle_of(entries)
        cut = op_boundaries(real)[1:-1]
        at = cut[where % len(cut)]
        pkl = real[:at] + evil + b"0" + real[at:]
    results = _pt_case(work, "evil.pt", with_pickle(entries, pkl))
    assert "ok" not in results, f"a pickle calling {mod}.{name} via {style} was accepted"


def declare_storage_sizes(ops, sizes) -> list:
    """Every storage reference ('storage', type, key, location, numel) -> BINPERSID gets the next of ``sizes`` as its
    numel: tiny archives that declare huge (or negative, or off-by-one) storages."""
    ops = list(ops)
    memo_ops = ("BINPUT", "LONG_BINPUT", "MEMOIZE", "PUT")
    refs = []
    for j, (n, _) in enumerate(ops):
        if n != "BINPERSID":
            continue
        t = j - 1
        while t > 0 and ops[t][0] in memo_ops:
            t -= 1
        if ops[t][0] == "TUPLE" and ops[t - 1][0] in INT_OPS:
            refs.append(t - 1)
    for k, j in enumerate(refs):
        ops[j] = ("LONG1", sizes[k % len(sizes)])
    assert refs, "no storage reference found in the real pickle"
    return ops


storage_sizes = st.lists(st.one_of(st.sampled_from([2**40, 2**62, 2**63 - 1, 2**63, 2**64 + 1, -1, 0]),
                                   st.integers(-2**70, 2**70)), min_size=1, max_size=4)


@fuzz_settings(200)
@given(kind=st.sampled_from(["pt-int8", "pt-fp8"]), sizes=storage_sizes)
def test_pt_huge_declared_storage(bases, work, kind, sizes):
    entries = zip_entries(bases[kind])
    ops = declare_storage_sizes(decode(pickle_of(entries)), sizes)
    _pt_case(work, "huge.pt", with_pickle(entries, encode(ops)))


py_leaf = st.one_of(st.none(), st.booleans(), huge_ints, st.floats(allow_nan=True), short_text, st.binary(max_size=8),
                    st.just(torch.zeros(2, dtype=torch.int8)), st.just(torch.ones(3, 2)))
py_value = st.recursive(py_leaf, lambda kids: st.one_of(
    st.lists(kids, max_size=4), st.lists(kids, max_size=3).map(tuple),
    st.dictionaries(st.one_of(short_text, st.integers()), kids, max_size=4),
    st.dictionaries(short_text, kids, max_size=3).map(collections.OrderedDict)), max_leaves=8)


@fuzz_settings(500)
@given(scheme=st.sampled_from(["int8", "fp8"]), data=st.data())
def test_pt_container_wrong_types(bases, work, scheme, data):
    t, m = bases[f"tensors-{scheme}"], bases[f"meta-{scheme}"]
    field = data.draw(st.sampled_from(["format", "metadata", "metadata-field", "state_dict", "state_dict-entry",
                                       "top", "extra-key"]))
    obj = {"format": FORMAT_V1, "metadata": dict(m), "state_dict": dict(t)}
    if field == "format":
        obj["format"] = data.draw(st.one_of(py_value, st.sampled_from([FORMAT_V2, FORMAT_V3, "", FORMAT_V1 + " "])))
    elif field == "metadata":
        obj["metadata"] = data.draw(py_value)
    elif field == "metadata-field":
        obj["metadata"][data.draw(st.sampled_from(metadata.FIELDS + ("", "unknown")))] = data.draw(py_value)
    elif field == "state_dict":
        obj["state_dict"] = data.draw(py_value)
    elif field == "state_dict-entry":
        obj["state_dict"][data.draw(st.one_of(st.sampled_from(sorted(t)), short_text, st.integers()))] = \
            data.draw(py_value)
    elif field == "top":
        obj = data.draw(py_value)
    else:
        obj[data.draw(short_text)] = data.draw(py_value)
    _pt_case(work, "types.pt", torch_save_bytes(obj))


@fuzz_settings(300)
@given(kind=st.sampled_from(["pt-int8", "pt-fp8"]), data=st.data())
def test_pt_damaged_archive(bases, work, kind, data):
    raw = bytearray(bases[kind])
    op = data.draw(st.sampled_from(["truncate", "flip", "drop-record", "resize-record", "byteorder"]))
    if op == "truncate":
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    elif op == "flip":
        for _ in range(data.draw(st.integers(1, 8))):
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] = data.draw(st.integers(0, 255))
    else:
        entries = zip_entries(bytes(raw))
        recs = [i for i, (n, _) in enumerate(entries) if "/data/" in n]
        j = recs[data.draw(st.integers(0, len(recs) - 1))]
        if op == "drop-record":
            del entries[j]
        elif op == "resize-record":
            n, d = entries[j]
            entries[j] = (n, data.draw(st.binary(max_size=len(d) * 2 + 8)))
        else:
            entries = [(n, data.draw(st.sampled_from([b"big", b"", b"middle", b"\xff\xfe"])) if n.endswith("byteorder")
                        else d) for n, d in entries]
        raw = bytearray(rezip(entries))
    _pt_case(work, "damaged.pt", bytes(raw))


# ---- .safetensors container ----------------------------------------------------------------------------------------

def split_st(data: bytes) -> tuple[dict, bytes]:
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + n]), data[8 + n:]


def join_st(header, rest: bytes, *, raw_header: bytes | None = None, declared: int | None = None) -> bytes:
    blob = raw_header if raw_header is not None else json.dumps(header, separators=(",", ":")).encode("utf-8")
    return (len(blob) if declared is None else declared).to_bytes(8, "little") + blob + rest


JSON_IN = "\0json"  # wraps a __metadata__ string that holds JSON, so mutations reach inside it


def explode(header: dict) -> dict:
    h = copy.deepcopy(header)
    for k, v in list(h.get("__metadata__", {}).items()):
        try:
            parsed = json.loads(v)
        except (TypeError, ValueError):
            continue
        if isinstance(parsed, (dict, list)):
            h["__metadata__"][k] = {JSON_IN: parsed}
    return h


def implode(node):
    if isinstance(node, dict):
        if set(node) == {JSON_IN}:
            return json.dumps(implode(node[JSON_IN]))
        return {k: implode(v) for k, v in node.items()}
    if isinstance(node, list):
        return [implode(v) for v in node]
    return node


def paths_of(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from paths_of(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from paths_of(v, prefix + (i,))


json_leaf = st.one_of(st.none(), st.booleans(), huge_ints, st.floats(allow_nan=True, allow_infinity=True),
                      short_text, st.sampled_from(["F32", "BF16", "I8", "F8_E4M3", "U8", "Int8Tensor",
                                                   "Float8Tensor", "torch.dtype", "PerRow", FORMAT_V1]))
json_value = st.recursive(json_leaf, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                            st.dictionaries(short_text, kids, max_size=4)),
                          max_leaves=10)


def mutate_tree(data, tree):
    """One mutation at a random node of a JSON tree (in place): replace, delete, add, tweak numbers."""
    all_paths = list(paths_of(tree))
    path = data.draw(st.sampled_from(all_paths))
    parent, key = None, None
    node = tree
    for k in path:
        parent, key, node = node, k, node[k]
    op = data.draw(st.sampled_from(["replace", "delete", "add", "number", "overlap", "grow"]))
    if op == "replace" and parent is not None:
        parent[key] = data.draw(json_value)
    elif op == "delete" and parent is not None:
        del parent[key]
    elif op == "add" and isinstance(node, (dict, list)):
        if isinstance(node, dict):
            node[data.draw(short_text)] = data.draw(json_value)
        else:
            node.append(data.draw(json_value))
    elif op == "number" and parent is not None and isinstance(node, int) and not isinstance(node, bool):
        parent[key] = node + data.draw(st.one_of(st.integers(-64, 64), huge_ints))
    elif op == "overlap":
        entries = [v for k, v in tree.items() if isinstance(v, dict) and "data_offsets" in v]
        if len(entries) >= 2:
            a, b = data.draw(st.permutations(entries))[:2]
            a["data_offsets"] = list(b["data_offsets"])
    elif op == "grow":
        entries = [v for k, v in tree.items() if isinstance(v, dict) and isinstance(v.get("shape"), list)]
        if entries:
            e = data.draw(st.sampled_from(entries))
            e["shape"] = data.draw(st.lists(st.one_of(st.integers(0, 70), huge_ints), max_size=4))


def _st_case(work, reader: str, name: str, data: bytes) -> list[str]:
    p = work / name
    p.write_bytes(data)
    return read_all(reader, str(p), fingerprint=True)


@fuzz_settings(400)
@given(kind=st.sampled_from(["st-int8", "st-fp8"]), data=st.data())
def test_safetensors_header_bytes(bases, work, kind, data):
    header, rest = split_st(bases[kind])
    blob = json.dumps(header).encode()
    op = data.draw(st.sampled_from(["declared", "past-end", "over-limit", "random", "not-utf8", "not-json",
                                    "not-object", "deep", "truncate", "data-bytes"]))
    if op == "declared":
        out = join_st(header, rest, declared=data.draw(st.integers(0, 2**64 - 1)))
    elif op == "past-end":
        out = join_st(header, rest, declared=len(blob) + len(rest) + data.draw(st.integers(1, 2**20)))
    elif op == "over-limit":  # a tiny file declaring a > 100 MB header
        out = join_st(header, b"", declared=100 * 2**20 + data.draw(st.integers(1, 2**40)))
    elif op == "random":
        out = join_st(None, rest, raw_header=data.draw(st.binary(max_size=300)))
    elif op == "not-utf8":
        out = join_st(None, rest, raw_header=b"{\"a\xff\xfe\": 1}")
    elif op == "not-json":
        out = join_st(None, rest, raw_header=b"{" + data.draw(st.text(max_size=40)).encode() + b"}")
    elif op == "not-object":
        out = join_st(None, rest, raw_header=json.dumps(data.draw(json_value)).encode())
    elif op == "deep":
        depth = data.draw(st.sampled_from([100, 10_000, 200_000]))
        out = join_st(None, rest, raw_header=b'{"a":' + b"[" * depth + b"]" * depth + b"}")
    elif op == "truncate":
        full = join_st(header, rest)
        out = full[: data.draw(st.integers(0, len(full) - 1))]
    else:
        raw = bytearray(rest)
        for _ in range(data.draw(st.integers(1, 16))):
            raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
        out = join_st(header, bytes(raw))
    _st_case(work, "safetensors-bytes", "bytes.safetensors", out)


@fuzz_settings(900)
@given(kind=st.sampled_from(["st-int8", "st-fp8"]), n=st.integers(1, 3), data=st.data())
def test_safetensors_header_tree(bases, work, kind, n, data):
    header, rest = split_st(bases[kind])
    tree = explode(header)
    for _ in range(n):
        mutate_tree(data, tree)
    _st_case(work, "safetensors-header", "tree.safetensors", join_st(implode(tree), rest))


@fuzz_settings(240)
@given(kind=st.sampled_from(["st-int8", "st-fp8"]), names=st.lists(st.one_of(
    short_text, st.sampled_from(["layers.0.attention.to_q.weight", "nowhere.weight", "x_pad_token", "a.b.c",
                                 "layers.0.attention.to_q._weight_qdata", "tensor_names", "__metadata__"])),
    max_size=5), keep=st.booleans())
def test_safetensors_tensor_names_pointing_nowhere(bases, work, kind, names, keep):
    header, rest = split_st(bases[kind])
    listed = json.loads(header["__metadata__"]["tensor_names"])
    header["__metadata__"]["tensor_names"] = json.dumps((listed if keep else []) + names)
    _st_case(work, "safetensors-header", "names.safetensors", join_st(header, rest))


# ---- metadata of every wrong type ----------------------------------------------------------------------------------

meta_dict = st.dictionaries(st.sampled_from(metadata.FIELDS + ("", "family", "scheme", "unknown")),
                            st.one_of(json_value, st.sampled_from(["int8", "fp8", "nvfp4", "z-image", "flux.1", BASE_ID,
                                                                   "per_tensor", "per_row", "torchao"])), max_size=8)
py_meta_dict = st.dictionaries(st.sampled_from(metadata.FIELDS + ("unknown",)), py_value, max_size=6)
requests = st.builds(Request, scheme=st.one_of(st.none(), st.sampled_from(list(schemes.names()) + ["nvfp4", "INT8",
                                                                                                   "int8_wo", ""]),
                                               short_text),
                     base_model_id=st.one_of(st.none(), short_text, st.just(BASE_ID)),
                     min_features=st.one_of(st.none(), st.integers(-5, 4096)),
                     exclude_tokens=st.one_of(st.none(), st.lists(short_text, max_size=3)),
                     family=st.one_of(st.none(), st.sampled_from(sorted(families.FAMILIES)), short_text))


def _validate(ck, req):
    fam = None
    try:
        fam = families.detect(ck.tensors.keys(), ck.metadata, ck.path)[0]
    except errors.UnknownFamilyError:
        pass
    v = metadata.validate(ck, req, family=fam)
    assert isinstance(v.ok, bool) and all(isinstance(r, str) for r in v.reasons)
    assert v.ok == (not v.reasons)
    return v


@fuzz_settings(800)
@given(scheme=st.sampled_from(["int8", "fp8"]), md=st.one_of(meta_dict, py_meta_dict),
       container=st.sampled_from(["pt", "safetensors", "legacy-pt", "comfyui-native"]),
       tag=st.one_of(st.none(), st.sampled_from([FORMAT_V1, FORMAT_V2, FORMAT_V3, "x"]), short_text),
       req=requests, dense_only=st.booleans())
def test_metadata_validate_every_type(bases, scheme, md, container, tag, req, dense_only):
    tensors = dict(bases[f"tensors-{scheme}"])
    if dense_only:
        tensors = {k: v for k, v in tensors.items() if k.endswith("bias")}
    ck = Checkpoint(path="fuzz.pt", container=container, format_tag=tag, metadata={**bases[f"meta-{scheme}"], **md},
                    tensors=tensors)
    CASES["metadata.validate"] += 1
    attempt("metadata.validate", _validate, ck, req)


@fuzz_settings(600)
@given(kind=st.sampled_from(["st-int8", "st-fp8"]), md=st.one_of(meta_dict, json_value), req=st.one_of(st.none(), requests),
       merge=st.booleans())
def test_metadata_through_info(bases, work, kind, md, req, merge):
    header, rest = split_st(bases[kind])
    base = json.loads(header["__metadata__"]["unsloth_metadata"])
    header["__metadata__"]["unsloth_metadata"] = json.dumps({**base, **md} if merge and isinstance(md, dict) else md)
    p = work / "meta.safetensors"
    p.write_bytes(join_st(header, rest))
    CASES["metadata.info"] += 1
    attempt("metadata.info", report.info, str(p), req, True)
    attempt("metadata.info", report.info, str(p), req, False)


# ---- legacy torchao-v1 .pt -----------------------------------------------------------------------------------------

V1_LAQT = ("torchao.quantization.linear_activation_quantized_tensor", "LinearActivationQuantizedTensor")


@pytest.fixture(scope="module")
def legacy_base(work):
    """A real legacy int8 file from torchao 0.14.1 (tools/make_legacy_int8.py) on a tiny dense model; without that
    torchao, the container pickle prefixed with a v1 class reference (enough to route it to the legacy reader)."""
    tao014 = os.path.join(ROOT, ".cache", "torchao014")
    out = work / "legacy.pt"
    if os.path.isfile(os.path.join(tao014, "torchao", "__init__.py")):
        from safetensors.torch import save_file
        g = torch.Generator().manual_seed(2)
        dense = {"layers.0.attention.to_q.weight": torch.randn(32, 32, generator=g).bfloat16(),
                 "layers.0.feed_forward.w1.weight": torch.randn(64, 32, generator=g).bfloat16(),
                 "layers.0.attention.to_q.bias": torch.randn(32, generator=g).bfloat16(),
                 "x_pad_token": torch.zeros(1, 32).bfloat16()}
        save_file(dense, str(work / "legacy-dense.safetensors"))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([tao014, ROOT])}
        r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_legacy_int8.py"),
                            str(work / "legacy-dense.safetensors"), str(out), "--min-features", "32"],
                           env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        ck = formats.read(str(out))
        assert ck.container == "legacy-pt" and len(ck.quantized_keys) == 2
        return Quiet((out.read_bytes(), "torchao 0.14.1"))
    entries = zip_entries(torch_save_bytes({"format": FORMAT_V1, "metadata": {}, "state_dict": tiny_tensors("int8")}))
    real = pickle_of(entries)
    pkl = real[:2] + global_op(*V1_LAQT, "global") + b"0" + real[2:]
    return Quiet((with_pickle(entries, pkl), "synthesized"))


def _legacy_case(work, data: bytes):
    p = work / "legacy-case.pt"
    p.write_bytes(data)
    read_all("legacy-v1", str(p))
    attempt("legacy-v1", legacy_v1.read_legacy_v1, str(p))
    attempt("legacy-v1", legacy_v1.read_legacy_v1, str(p), mmap=False)


def test_legacy_base_is_read_by_the_restricted_unpickler(legacy_base, work):
    data, origin = legacy_base
    p = work / "legacy-ok.pt"
    p.write_bytes(data)
    ck = legacy_v1.read_legacy_v1(str(p))
    assert ck.container == "legacy-pt", origin


@fuzz_settings(700)
@given(muts=st.lists(mutation, min_size=1, max_size=4))
def test_legacy_mutated_pickle(legacy_base, work, muts):
    entries = zip_entries(legacy_base[0])
    ops = mutate_ops(decode(pickle_of(entries)), muts)
    _legacy_case(work, with_pickle(entries, encode(ops)))


@fuzz_settings(150)
@given(sizes=storage_sizes)
def test_legacy_huge_declared_storage(legacy_base, work, sizes):
    entries = zip_entries(legacy_base[0])
    _legacy_case(work, with_pickle(entries, encode(declare_storage_sizes(decode(pickle_of(entries)), sizes))))


@fuzz_settings(240)
@given(style=st.sampled_from(PAYLOAD_STYLES), which=st.integers(0, 100), where=st.integers(0, 10**6))
def test_legacy_code_execution_payloads(legacy_base, work, style, which, where):
    marker = os.path.join(MARK_DIR, "pwned")
    calls = hostile_calls(marker)
    mod, name, args = calls[which % len(calls)]
    entries = zip_entries(legacy_base[0])
    real = pickle_of(entries)
    # after the first v1 class reference: torch.load hands the file to the legacy unpickler, which meets the payload
    first_v1 = next(pos for op, arg, pos in pickletools.genops(real) if op.name == "GLOBAL" and "torchao" in str(arg))
    cut = [b for b in op_boundaries(real) if b > first_v1][:-1]
    at = cut[where % len(cut)]
    data = with_pickle(entries, real[:at] + payload(style, mod, name, args) + b"0" + real[at:])
    p = work / "legacy-evil.pt"
    p.write_bytes(data)
    results = read_all("legacy-v1", str(p)) + [attempt("legacy-v1", legacy_v1.read_legacy_v1, str(p))]
    assert "ok" not in results, f"a legacy pickle calling {mod}.{name} via {style} was accepted"


@fuzz_settings(200)
@given(data=st.data())
def test_legacy_damaged_records(legacy_base, work, data):
    entries = zip_entries(legacy_base[0])
    recs = [i for i, (n, _) in enumerate(entries) if "/data/" in n or n.endswith("byteorder")]
    j = recs[data.draw(st.integers(0, len(recs) - 1))]
    n, d = entries[j]
    op = data.draw(st.sampled_from(["drop", "resize", "random"]))
    if op == "drop":
        del entries[j]
    elif op == "resize":
        entries[j] = (n, d[: data.draw(st.integers(0, max(len(d) - 1, 0)))] + data.draw(st.binary(max_size=16)))
    else:
        entries[j] = (n, data.draw(st.binary(min_size=len(d), max_size=len(d))))
    _legacy_case(work, rezip(entries))


# ---- ComfyUI-native ------------------------------------------------------------------------------------------------

CN_FORMATS = ["int8_tensorwise", "float8_e4m3fn", "float8_e5m2", "nvfp4", "mxfp8", "svdquant", "bogus", ""]
CN_DTYPES = [torch.int8, torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16, torch.uint8, torch.float32]
CN_SHAPES = [(64, 32), (64,), (2, 4, 4), (0, 32), (1, 1)]
SCALE_SHAPES = [(), (1,), (64, 1), (64,), (32, 1), (2, 32), (0,)]


def _tensor(dtype, shape, fill=None):
    t = torch.zeros(shape, dtype=torch.float32)
    if fill is not None:
        t = t.fill_(fill)
    elif t.numel():
        t = torch.randn(shape, generator=torch.Generator().manual_seed(3)) * 8
    return t.to(dtype)


@st.composite
def comfy_native_file(draw):
    prefix = draw(st.sampled_from(["", "model.diffusion_model."]))
    tensors, header = {}, {}
    layers = {}
    style = draw(st.sampled_from(["comfy_quant", "_quantization_metadata", "scaled_fp8", "mixed"]))
    for layer in ("layers.0.attention.qkv", "layers.0.feed_forward.w1"):
        fmt = draw(st.one_of(st.sampled_from(CN_FORMATS), short_text))
        layers[layer] = fmt
        wd = draw(st.sampled_from(CN_DTYPES))
        tensors[prefix + layer + ".weight"] = _tensor(wd, draw(st.sampled_from(CN_SHAPES)))
        if draw(st.booleans()):
            sd = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.int8, torch.float8_e4m3fn]))
            fill = draw(st.sampled_from([None, 0.5, float("nan"), float("inf"), 0.0]))
            key = draw(st.sampled_from([".weight_scale", ".scale_weight"]))
            tensors[prefix + layer + key] = _tensor(sd, draw(st.sampled_from(SCALE_SHAPES)), fill)
        if draw(st.booleans()):
            tensors[prefix + layer + ".input_scale"] = torch.ones(())
        if style in ("comfy_quant", "mixed"):
            cq = draw(st.one_of(
                st.builds(lambda f, c, x: {"format": f, **({"convrot": c} if c else {}), **x}, st.just(fmt),
                          st.booleans(), st.dictionaries(short_text, json_leaf, max_size=2)),
                json_value))
            raw = draw(st.one_of(st.just(json.dumps(cq).encode()), st.binary(max_size=40)))
            cq_dtype = draw(st.sampled_from([torch.uint8, torch.uint8, torch.int8, torch.float32]))
            t = torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone() if raw else torch.zeros(0, dtype=torch.uint8)
            tensors[prefix + layer + ".comfy_quant"] = t.to(cq_dtype)
    if style in ("_quantization_metadata", "mixed"):
        qm = draw(st.one_of(st.just({"format_version": "1.0", "layers": layers}), json_value))
        header["_quantization_metadata"] = draw(st.one_of(st.just(json.dumps(qm)), short_text))
    if style == "scaled_fp8":
        tensors[prefix + "scaled_fp8"] = torch.zeros(0, dtype=draw(st.sampled_from(CN_DTYPES)))
    tensors[prefix + "layers.0.attention_norm1.weight"] = torch.ones(32, dtype=torch.bfloat16)
    if prefix:
        tensors["text_encoders.clip_l.weight"] = torch.ones(4, dtype=torch.float16)
    return tensors, header


@fuzz_settings(700)
@given(case=comfy_native_file())
def test_comfy_native_markings(work, case):
    from safetensors.torch import save_file
    tensors, header = case
    p = work / "native.safetensors"
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(p), metadata=header or None)
    read_all("comfy-native", str(p))


@pytest.fixture(scope="module")
def comfy_native_base(work):
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(4)
    w8 = (torch.randn(64, 32, generator=g) * 40).clamp(-127, 127).to(torch.int8)
    wf = torch.randn(64, 32, generator=g).to(torch.float8_e4m3fn)
    t = {"layers.0.attention.qkv.weight": w8, "layers.0.attention.qkv.weight_scale": torch.full((64, 1), 0.01),
         "layers.0.attention.qkv.comfy_quant": torch.tensor(list(b'{"format": "int8_tensorwise"}'), dtype=torch.uint8),
         "layers.0.feed_forward.w1.weight": wf, "layers.0.feed_forward.w1.weight_scale": torch.tensor(0.02),
         "layers.0.feed_forward.w1.comfy_quant": torch.tensor(list(b'{"format": "float8_e4m3fn"}'), dtype=torch.uint8),
         "layers.0.attention_norm1.weight": torch.ones(32, dtype=torch.bfloat16)}
    p = work / "native-base.safetensors"
    save_file(t, str(p))
    ck = formats.read(str(p))
    assert ck.container == "comfyui-native" and len(ck.quantized_keys) == 2
    return p.read_bytes()


@fuzz_settings(400)
@given(n=st.integers(1, 3), data=st.data())
def test_comfy_native_header_tree(comfy_native_base, work, n, data):
    header, rest = split_st(comfy_native_base)
    tree = explode(header)
    for _ in range(n):
        mutate_tree(data, tree)
    _st_case(work, "comfy-native", "native-tree.safetensors", join_st(implode(tree), rest))
