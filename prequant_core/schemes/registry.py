"""The quantization schemes this pack knows: one module per scheme, each ending in its ``SCHEME`` record, listed once
in ``scheme_names.TABLE`` (torch-free, so the command line reads the same list). Everything that depends on a scheme
(names, repo suffixes, rules, torchao configs, containers, ComfyUI-native layouts both ways, activation settings,
file rules, matmul kinds) is read from these records at call time, so a scheme added to the table is known
everywhere, and a test's toy scheme added to ``SCHEMES`` too (tests/schemes/test_scheme_registry.py)."""
from __future__ import annotations

import importlib

from .. import scheme_names
from .record import WEIGHT_ONLY_TAIL, Scheme


def _load() -> tuple[Scheme, ...]:
    out = []
    for name, weight_only in scheme_names.TABLE:
        s = importlib.import_module(f"{__package__}.{name}").SCHEME
        if (s.name, s.weight_only) != (name, weight_only):
            raise RuntimeError(f"schemes/{name}.py's record is '{s.name}' (weight-only variant: {s.weight_only}); "
                               f"scheme_names.TABLE lists ('{name}', {weight_only})")
        out.append(s)
    return tuple(out)


SCHEMES: tuple[Scheme, ...] = _load()


def all_schemes() -> tuple[Scheme, ...]:
    return SCHEMES


def names() -> tuple[str, ...]:
    """Every name a file or a node input may use, the plain names first (int8, fp8, ..., then the weight-only
    variants): the order the nodes list them."""
    return (*(s.name for s in SCHEMES), *(n for s in SCHEMES for n in s.names()[1:]))


def lookup(name: str) -> tuple[Scheme, bool] | None:
    """``name`` (already normalized) -> (its scheme, weight-only?), or None."""
    for s in SCHEMES:
        if name == s.name:
            return s, False
        if s.weight_only and name == s.name + WEIGHT_ONLY_TAIL:
            return s, True
    return None


def by_kind(kind: str) -> Scheme:
    """The scheme whose weights are of ``kind`` (the first listed, where several share one)."""
    for s in SCHEMES:
        if s.kind == kind:
            return s
    raise KeyError(kind)


def by_suffix(repo_or_file: str) -> Scheme | None:
    """The scheme a repo name's suffix names (``unsloth/Z-Image-Turbo-FP8`` -> fp8), longest suffix first so that
    ``-MXFP8`` is never read as ``-FP8``."""
    low = str(repo_or_file).strip().lower()
    for s in sorted(SCHEMES, key=lambda s: -len(s.suffix)):
        if low.endswith(s.suffix.lower()):
            return s
    return None


def kinds() -> tuple[str, ...]:
    return tuple(dict.fromkeys(s.kind for s in SCHEMES))


def codecs() -> tuple:
    """Every weight kind's codec, once each, in the schemes' order."""
    return tuple({s.kind: s.codec for s in SCHEMES}.values())


def codec(kind: str):
    """The codec of weights of ``kind``."""
    return by_kind(kind).codec


def codec_of(t):
    """The codec whose tensor class ``t`` is, or None (a plain tensor, or a class no scheme has)."""
    for s in SCHEMES:  # per tensor on every read: no dict of codecs built per call
        if s.codec.owns(t):
            return s.codec
    return None


def by_codes(dtype) -> Scheme:
    """The first per-row scheme whose codes have ``dtype`` (readers of bare codes and scales: torchao v1's int8)."""
    for s in SCHEMES:
        if not s.codec.block and dtype in s.codec.code_dtypes:
            return s
    raise KeyError(dtype)


def codec_named(type_name: str):
    """The codec whose class is named ``type_name`` (a pickle's or torchao JSON's ``_type``), or None."""
    for c in codecs():
        if c.type_name == type_name:
            return c
    return None


def in_container(container: str) -> tuple[str, ...]:
    """The scheme names the builder writes to ``container``."""
    return tuple(n for s in SCHEMES if s.containers is None or container in s.containers for n in s.names())
