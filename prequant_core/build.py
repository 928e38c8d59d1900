"""Building pre-quantized checkpoints from dense weights.

Inputs: a dense state dict (e.g. the weights of a ComfyUI MODEL), a single dense ``.safetensors`` file in ComfyUI or
diffusers key layout, or a diffusers folder (``transformer/config.json`` + ``*.safetensors``, possibly sharded with
an index json). Output keys are always diffusers names. ComfyUI-layout input is converted with ComfyUI's own key map,
which the caller passes in (this package never imports ComfyUI: the node passes ``comfy.utils.<map>``, the command
line imports it from ``--comfyui DIR``); families whose map is our own (``prequant_core.keymaps``) need no ComfyUI.

Streaming: dense tensors are read one at a time with plain ``readinto`` (not ``safe_open``: its memory map keeps
every page it touched resident, so reading a whole file through it costs the dense size in RSS), cast and quantized
in row blocks (``quantize_rows``: bit for bit ``schemes.quantize_weight`` behind ``schemes.LayerFilter``, the one
implementation load-time quantization uses too) and dropped; freed heap pages are handed back to the OS as it goes.
Only the quantized result (about half the dense size) is held; the ``.safetensors`` writer streams it to disk tensor
by tensor without a second copy. Peak memory: quantized size + about one layer's codes + a few MB.

Writes are atomic: a temp file ``.prequant-<host>-<pid>-<random>.partial`` beside the destination, fsync, then a
no-clobber link (or rename when overwriting). A build killed outright (SIGKILL, power loss) can leave its temp file;
the next build in that folder removes temps whose process is gone (``clean_stale_temps``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import sys
import time
from typing import Callable, Iterable, Iterator, Mapping

import torch

from . import families, fingerprint, qtensor, schemes
from .checkpoint import FORMAT_V1
from .errors import BuildError, CorruptCheckpointError
from .families import Family

ProgressFn = Callable[[int, int], None]  # (done, total): per tensor, used by quantize_tensors
BuildProgress = Callable[[str, int, int, str], None]  # (stage "quantize" | "write", done, total, key)
FreeSpaceFn = Callable[[str], int]  # folder -> free bytes

CONTAINERS = ("safetensors", "pt")
EXTENSIONS = {"safetensors": ".safetensors", "pt": ".pt"}
# Single-file checkpoints often keep the transformer under a prefix (a full ComfyUI checkpoint: model.diffusion_model.);
# the same list as the dense fallback's reader (prequant_core.dense.KNOWN_PREFIXES).
KNOWN_PREFIXES = ("model.diffusion_model.", "diffusion_model.", "transformer.")
INDEX_NAME = "diffusion_pytorch_model.safetensors.index.json"
TEMP_PREFIX = ".prequant-"
TEMP_SUFFIX = ".partial"
_TEMP_RE = re.compile(r"^\.prequant-([0-9a-f]{8})-(\d+)-[A-Za-z0-9_]+\.partial$")
_LEGACY_TEMP_RE = re.compile(r"^\.prequant-[A-Za-z0-9_]+\.partial$")  # first version: tempfile.mkstemp names
STALE_AFTER_S = 24 * 3600  # a temp file untouched this long is stale even if its pid is alive again (pid reuse)
HEADER_SLACK = 64 * 1024  # added to the output estimate: JSON header, metadata, zip overhead
QUANTIZED_MARKERS = ("._weight_qdata", ".weight_scale", ".comfy_quant", "scaled_fp8", ".scale_weight")

ST_DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.float64: "F64",
             torch.int8: "I8", torch.uint8: "U8", torch.int16: "I16", torch.int32: "I32", torch.int64: "I64",
             torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}
for _name, _st in (("uint16", "U16"), ("uint32", "U32"), ("uint64", "U64")):
    if hasattr(torch, _name):
        ST_DTYPES[getattr(torch, _name)] = _st
TORCH_DTYPES = {v: k for k, v in ST_DTYPES.items()}


# ----------------------------------------------------------------------------------------------------------------
# Quantization: one tensor at a time, shared with load-time quantization
# ----------------------------------------------------------------------------------------------------------------

def is_linear_weight(key: str, t) -> bool:
    """A Linear weight: a 2-D ``*.weight`` tensor (transformers here have no 2-D non-Linear weights)."""
    return key.endswith(".weight") and len(tuple(t.shape)) == 2


def linear_weight_keys(tensors: Mapping) -> list[str]:
    return [k for k, v in tensors.items() if is_linear_weight(k, v)]


QUANT_CHUNK_ELEMS = 1 << 20  # quantize big weights this many elements at a time (fp32 temporaries: 4 MB each)
_TRIM: list = []


def release_free_memory() -> None:
    """Hand freed heap pages back to the OS (glibc ``malloc_trim``; a no-op elsewhere).

    glibc serves the mid-size temporaries of quantization (float32 copies of a row block, a few MB) from its heap
    and keeps the freed pages: measured on a bf16 10240 x 3840 Linear (78 MB), ~320 MB of RSS growth while
    quantizing it without trimming whatever the block size, ~60 MB with trimming and 1 M-element blocks (its 39 MB
    of int8 codes included). Trimming changes no allocator setting, so it is safe inside ComfyUI too.
    """
    if not _TRIM:
        fn = None
        if sys.platform.startswith("linux"):
            try:
                import ctypes
                fn = ctypes.CDLL("libc.so.6").malloc_trim
                fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
            except (OSError, AttributeError):
                fn = None
        _TRIM.append(fn)
    if _TRIM[0] is not None:
        _TRIM[0](0)


def quantize_rows(weight: torch.Tensor, scheme: str, *, dtype: torch.dtype | None = None,
                  chunk_elems: int = QUANT_CHUNK_ELEMS):
    """``schemes.quantize_weight(weight.to(dtype))`` computed in row blocks: bit for bit the same tensor.

    Per-row quantization treats every row on its own (its scale comes from that row's amax alone), so quantizing
    row blocks into one preallocated code tensor is exact; it bounds the cast and torchao's float32 temporaries to
    one block (a whole 10240 x 3840 Linear would otherwise cost several times its size).
    """
    rows, cols = weight.shape
    step = max(1, chunk_elems // max(cols, 1))

    def block(i):
        b = weight[i:i + step]
        if dtype is not None and b.dtype != dtype:
            b = b.to(dtype)
        return schemes.quantize_weight(b.contiguous(), scheme)

    def whole():
        w = weight if dtype is None or weight.dtype == dtype else weight.to(dtype)
        return schemes.quantize_weight(w.contiguous(), scheme)

    if rows <= step:
        return whole()
    first = block(0)
    spec = _row_block_spec(first, cols)
    if spec is None:
        return whole()
    qdata = torch.empty((rows, cols), dtype=first.qdata.dtype)
    qdata[:first.qdata.shape[0]].copy_(first.qdata)
    scales, zps = [first.scale], [getattr(first, "zero_point", None)]
    del first
    for i in range(step, rows, step):
        part = block(i)
        if _row_block_spec(part, cols) != spec:
            return whole()
        qdata[i:i + part.qdata.shape[0]].copy_(part.qdata)
        scales.append(part.scale)
        zps.append(getattr(part, "zero_point", None))
        del part
        release_free_memory()
    return _assemble(spec, qdata, torch.cat(scales), None if zps[0] is None else torch.cat(zps), cols)


def _row_block_spec(t, cols: int):
    """The non-tensor attributes of a per-row quantized block (equal for every block of one weight), or None when
    the block holds something this does not know how to assemble."""
    from torchao.quantization.quantize_.workflows import Float8Tensor, Int8Tensor
    extra = [n for n in (getattr(t, "optional_tensor_data_names", None) or [])
             if n != "zero_point" and getattr(t, n, None) is not None]
    if extra or type(t) not in (Int8Tensor, Float8Tensor) or list(t.block_size) != [1, cols]:
        return None
    if isinstance(t, Int8Tensor):
        return (Int8Tensor, t.dtype, t.act_quant_kwargs, getattr(t, "reduce_range", False))
    return (Float8Tensor, t.dtype, t.act_quant_kwargs, t.mm_config, t.kernel_preference)


def _assemble(spec, qdata, scale, zero_point, cols):
    from torchao.quantization.quantize_.workflows import Int8Tensor
    if spec[0] is Int8Tensor:
        _, dtype, act, reduce_range = spec
        return Int8Tensor(qdata, scale, [1, cols], dtype, zero_point=zero_point, act_quant_kwargs=act,
                          reduce_range=reduce_range)
    cls, dtype, act, mm_config, kernel_preference = spec
    return cls(qdata, scale, [1, cols], mm_config=mm_config, act_quant_kwargs=act,
               kernel_preference=kernel_preference, dtype=dtype)


def quantize_one(key: str, v: torch.Tensor, flt: schemes.LayerFilter,
                 dtype: torch.dtype | None = torch.bfloat16, *, chunk_elems: int = QUANT_CHUNK_ELEMS) -> tuple[object, bool]:
    """(tensor to store, skipped) for one dense tensor: float tensors cast to ``dtype``; a Linear weight the filter
    admits quantized exactly as ``schemes.quantize_weight`` does. ``skipped`` is True for a Linear weight left dense."""
    cast = dtype is not None and v.is_floating_point() and v.dtype != dtype
    if is_linear_weight(key, v):
        probe = torch.empty(v.shape, dtype=dtype, device="meta") if cast else v
        if flt.reason_skipped(key[: -len(".weight")], probe) is None:
            return quantize_rows(v, flt.scheme, dtype=dtype if cast else None, chunk_elems=chunk_elems), False
        return (v.to(dtype) if cast else v), True
    return (v.to(dtype) if cast else v), False


def quantize_items(items: Iterable[tuple[str, torch.Tensor]], flt: schemes.LayerFilter, *, total: int,
                   dtype: torch.dtype | None = torch.bfloat16,
                   progress: ProgressFn | None = None) -> tuple[dict, list[str]]:
    """Quantize a stream of (key, dense tensor); each input tensor can be freed as soon as it is consumed."""
    out, skipped = {}, []
    with torch.no_grad():
        for i, (k, v) in enumerate(items):
            q, was_skipped = quantize_one(k, v, flt, dtype)
            del v
            release_free_memory()
            if was_skipped:
                skipped.append(k)
            out[k] = q
            if progress:
                progress(i + 1, total)
    return out, skipped


def quantize_tensors(tensors: Mapping, scheme: str, *, min_features: int = schemes.DEFAULT_MIN_FEATURES,
                     exclude: Iterable[str] = (), progress: ProgressFn | None = None,
                     dtype: torch.dtype | None = torch.bfloat16) -> tuple[dict, list[str]]:
    """Quantize every Linear weight the filter admits; cast other float tensors to ``dtype``.

    The in-memory form of what ``build`` writes: loading a built file gives these tensors bit for bit.
    """
    flt = schemes.LayerFilter(schemes.normalize(scheme), min_features, tuple(exclude))
    return quantize_items(tensors.items(), flt, total=len(tensors), dtype=dtype, progress=progress)


# ----------------------------------------------------------------------------------------------------------------
# Metadata
# ----------------------------------------------------------------------------------------------------------------

def _dist_version(name: str) -> str | None:
    # importlib.metadata, not ``import diffusers``: the builder never needs diffusers itself, and importing it costs s.
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return None
    try:
        return str(version(name))
    except PackageNotFoundError:
        return None


def make_metadata(*, family: Family, scheme: str, base_model_id: str, min_features: int, exclude: list[str],
                  tensors: Mapping, skipped: list[str]) -> dict:
    """Every FORMAT.md metadata field. Version fields are plain ``str`` (``torch.__version__`` would pickle as
    ``TorchVersion``, which strict ``weights_only`` readers may refuse)."""
    import torchao
    rule = schemes.rules(scheme)
    return {
        "base_model_id": str(base_model_id), "family": family.name, "scheme": rule.name, "component": "transformer",
        "min_features": int(min_features), "exclude_name_tokens": sorted(exclude),
        "require_bf16": rule.require_bf16, "require_divisible": rule.require_divisible,
        "fast_accum": rule.fast_accum, "fp8_granularity": rule.fp8_granularity,
        "fingerprint": fingerprint.compute(tensors, skipped), "torch_dtype": "bfloat16", "quant_backend": "torchao",
        "transformer_class": family.diffusers_class,
        "torch_version": str(torch.__version__), "torchao_version": str(torchao.__version__),
        "diffusers_version": _dist_version("diffusers"),
    }


# ----------------------------------------------------------------------------------------------------------------
# Dense sources, read lazily
# ----------------------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TensorInfo:
    shape: tuple
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * torch.empty((), dtype=self.dtype).element_size()


class Source:
    """Dense tensors in a fixed order, each read when iterated and not kept by the source."""
    path: str | None = None
    hints: dict  # {"transformer_class": ..., "family": ...} where the input names them

    def infos(self) -> dict[str, TensorInfo]:
        raise NotImplementedError

    def items(self) -> Iterator[tuple[str, torch.Tensor]]:
        raise NotImplementedError

    def describe(self) -> str:
        return self.path or "state dict"


class MemorySource(Source):
    """A state dict already in memory (e.g. a ComfyUI MODEL's weights); tensors are moved to the CPU one at a time."""

    def __init__(self, tensors: Mapping, *, hints: dict | None = None, path: str | None = None):
        self.tensors = tensors
        self.hints = dict(hints or {})
        self.path = path

    def infos(self):
        return {k: TensorInfo(tuple(v.shape), v.dtype) for k, v in self.tensors.items()}

    def items(self):
        for k, v in self.tensors.items():
            yield k, v.detach().to("cpu")


@dataclasses.dataclass(frozen=True)
class _Entry:
    file: int
    start: int  # absolute byte offset in the file
    length: int
    info: TensorInfo


class SafetensorsSource(Source):
    """One or more dense ``.safetensors`` files (diffusers shards), read tensor by tensor with ``readinto``.

    Headers are read and checked up front (offsets against file sizes, duplicates across shards); no tensor bytes
    are read until ``items()`` reaches them, in file order.
    """

    def __init__(self, files: list[str], *, path: str | None = None, hints: dict | None = None):
        from .formats.safetensors_container import read_header
        self.files = list(files)
        self.path = path or (files[0] if len(files) == 1 else os.path.dirname(files[0]))
        self.hints = dict(hints or {})
        self.entries: dict[str, _Entry] = {}
        self.file_meta: list[dict] = []
        for i, f in enumerate(self.files):
            index, meta, n = read_header(f)
            self.file_meta.append(meta)
            if "unsloth_format" in meta or "_quantization_metadata" in meta:
                raise BuildError("This file is already a quantized checkpoint; a build needs dense weights.", path=f,
                                 expected="a dense (bf16 / fp16 / fp32) transformer", found="a pre-quantized file",
                                 fix="Pick the dense model it was made from, or load this file directly.")
            for name, e in sorted(index.items(), key=lambda kv: kv[1]["data_offsets"][0]):
                if name in self.entries:
                    raise BuildError(f"Tensor '{name}' appears in two weight files.", path=f,
                                     found=f"{self.files[self.entries[name].file]} and {f}",
                                     fix="Remove the stray shard from the folder.")
                if e["dtype"] not in TORCH_DTYPES:
                    raise BuildError(f"Tensor '{name}' has a dtype this builder cannot read.", path=f,
                                     expected=", ".join(sorted(TORCH_DTYPES)), found=e["dtype"])
                a, b = e["data_offsets"]
                self.entries[name] = _Entry(i, 8 + n + a, b - a, TensorInfo(tuple(e["shape"]), TORCH_DTYPES[e["dtype"]]))
        if not self.entries:
            raise BuildError("The weight file holds no tensors.", path=self.path, fix="Pick the dense model file.")

    def strip_prefix(self, prefix: str) -> None:
        """Keep only ``prefix``-ed tensors, without the prefix (a full ComfyUI checkpoint's diffusion model)."""
        self.entries = {k[len(prefix):]: e for k, e in self.entries.items() if k.startswith(prefix)}

    def infos(self):
        return {k: e.info for k, e in self.entries.items()}

    def items(self):
        handles: dict[int, object] = {}
        try:
            for k, e in self.entries.items():
                f = handles.get(e.file)
                if f is None:
                    f = handles[e.file] = open(self.files[e.file], "rb", buffering=0)
                buf = torch.empty(e.length, dtype=torch.uint8)
                f.seek(e.start)
                got = f.readinto(buf.numpy()) if e.length else 0
                if got != e.length:
                    raise CorruptCheckpointError(f"Tensor '{k}' is cut short (file truncated while reading?).",
                                                 path=self.files[e.file], found=f"{got} of {e.length} bytes")
                yield k, buf.view(e.info.dtype).reshape(e.info.shape)
                del buf
        finally:
            for f in handles.values():
                f.close()


class RemappedSource(Source):
    """A ComfyUI-layout source seen in diffusers layout through a diffusers -> ComfyUI key map, in the form ComfyUI's
    own maps use: ``comfy_key``, ``(comfy_key, (0, row offset, rows))`` (a row slice of a fused weight such as
    ``qkv``) or ``(comfy_key, slice_or_None, row_permutation)`` (a function, e.g. ``comfy.utils.swap_scale_shift``,
    or a name in ``keymaps.ROW_PERMUTATIONS``; it must be its own inverse, which is checked).

    Each ComfyUI tensor is read once and split; ``keymap.to_diffusers`` does the same on a dict, all at once."""

    def __init__(self, base: Source, key_map: Mapping, *, ignore: Iterable[str] = ()):
        self.base, self.path, self.hints = base, base.path, base.hints
        base_infos = base.infos()
        self.plan: dict[str, list[tuple[str, tuple | None, Callable | None]]] = {}
        for dk, target in key_map.items():
            if isinstance(target, str):
                name, sl, perm = target, None, None
            else:
                name, sl = target[0], target[1]
                perm = target[2] if len(target) > 2 else None
                if sl is not None:
                    dim, offset, length = sl
                    if dim != 0:
                        raise BuildError(f"The key map fuses '{dk}' along dim {dim}; only row fusion is supported.")
                    sl = (offset, length)
            if name in base_infos:
                self.plan.setdefault(name, []).append((dk, sl, _row_permutation(dk, perm, base_infos[name], sl)))
        for parts in self.plan.values():
            parts.sort(key=lambda p: p[1][0] if p[1] else 0)
        check_unmapped(base_infos, set(self.plan), ignore, base.path)
        self._infos: dict[str, TensorInfo] = {}
        for name, info in base_infos.items():
            for dk, sl, _ in self.plan.get(name, ()):
                if sl is not None:
                    off, length = sl
                    if off + length > info.shape[0]:
                        raise BuildError(f"'{name}' has {info.shape[0]} rows, the key map takes rows "
                                         f"{off}..{off + length} for '{dk}'.", path=base.path,
                                         fix="The file does not match the model config it implies; check the family.")
                    self._infos[dk] = TensorInfo((length,) + tuple(info.shape[1:]), info.dtype)
                else:
                    self._infos[dk] = info

    def infos(self):
        return dict(self._infos)

    def items(self):
        for name, t in self.base.items():
            for dk, sl, perm in self.plan.get(name, ()):
                # a row slice is cloned so that a plain slice kept in the output does not pin the fused tensor
                v = t if sl is None else t.narrow(0, sl[0], sl[1]).clone()
                yield dk, (v if perm is None else perm(v))
            del t


def _row_permutation(dk: str, perm, info: TensorInfo, sl) -> Callable | None:
    """The map's row permutation as a function on dense tensors, checked to be its own inverse (the map says how
    diffusers rows become ComfyUI rows; a build goes the other way)."""
    if perm is None:
        return None
    fn = perm if callable(perm) else None
    if fn is None:
        from .keymaps import ROW_PERMUTATIONS
        fn = ROW_PERMUTATIONS.get(perm) if isinstance(perm, str) else None
    if fn is None:
        raise BuildError(f"The key map transforms '{dk}' with '{perm}', which is not a known row permutation.")
    rows = sl[1] if sl else info.shape[0]
    idx = torch.arange(rows)
    try:
        ok = torch.equal(fn(fn(idx)), idx)
    except Exception:  # noqa: BLE001 - whatever the function does with an index vector
        ok = False
    if not ok:
        raise BuildError(f"The key map's row transform for '{dk}' is not its own inverse; it cannot be undone "
                         "exactly.", fix="Build from the diffusers weights instead.")
    return fn


def check_unmapped(infos: Mapping, mapped: set, ignore: Iterable[str], path: str | None) -> None:
    ignore = set(ignore)
    left = sorted(k for k in infos if k not in mapped and k not in ignore)
    if left:
        raise BuildError(f"{len(left)} tensors have no diffusers name in ComfyUI's key map: "
                         f"{', '.join(left[:5])}{' ...' if len(left) > 5 else ''}", path=path,
                         fix="The model is not the family's standard architecture (or carries extra tensors); "
                             "pick the right family, or build from the original diffusers weights.")


# ----------------------------------------------------------------------------------------------------------------
# Opening an input: file, diffusers folder, state dict -> (source in diffusers layout, family)
# ----------------------------------------------------------------------------------------------------------------

KeyMapArg = Mapping | Callable[[Family, dict], Mapping] | None


def _diffusers_folder(path: str) -> tuple[str, dict] | None:
    """(transformer folder, config) when ``path`` is a diffusers model root or its transformer folder."""
    for cand in (os.path.join(path, "transformer"), path):
        cfg = os.path.join(cand, "config.json")
        if os.path.isfile(cfg):
            try:
                with open(cfg, encoding="utf-8") as f:
                    config = json.load(f)
            except (OSError, ValueError) as e:
                raise BuildError("The diffusers config.json cannot be read.", path=cfg,
                                 found=f"{type(e).__name__}: {e}") from None
            if not isinstance(config, dict):
                raise BuildError("The diffusers config.json is not a JSON object.", path=cfg)
            return cand, config
    return None


def _folder_weights(folder: str) -> list[str]:
    index = os.path.join(folder, INDEX_NAME)
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as f:
                wmap = json.load(f)["weight_map"]
            names = sorted(set(wmap.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise BuildError("The shard index cannot be read.", path=index, expected='{"weight_map": {key: file}}',
                             found=f"{type(e).__name__}: {e}") from None
        files = []
        for n in names:
            full = os.path.normpath(os.path.join(folder, n))
            if os.path.dirname(full) != os.path.normpath(folder) or not os.path.isfile(full):
                raise BuildError("A weight shard named in the index is missing.", path=full,
                                 expected=f"{len(names)} shards beside {INDEX_NAME}",
                                 fix="Download the missing shard(s) again.")
            files.append(full)
        return files
    files = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".safetensors"))
    if files:
        return files
    other = [f for f in os.listdir(folder) if f.endswith((".bin", ".pt", ".pth", ".ckpt"))]
    raise BuildError("The diffusers folder holds no .safetensors weights.", path=folder,
                     expected="diffusion_pytorch_model*.safetensors",
                     found=", ".join(sorted(other)[:4]) if other else "no weight files",
                     fix="Use safetensors weights (pickled .bin weights are not read, for safety).")


def file_source(path: str) -> SafetensorsSource:
    """A dense single .safetensors (a known diffusion-model prefix stripped), or the diffusers folder of a shard."""
    from .formats import sniff
    real = os.path.abspath(path)
    folder = os.path.dirname(real)
    # A shard picked from a list: build from the whole diffusers folder it belongs to.
    index = os.path.join(folder, INDEX_NAME)
    if os.path.isfile(index):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError, AttributeError):
            with open(index, encoding="utf-8") as f:
                if os.path.basename(real) in set(json.load(f)["weight_map"].values()):
                    return _folder_source(folder)
    if sniff(real) != "safetensors":
        raise BuildError("Dense input must be a .safetensors file or a diffusers folder.", path=real,
                         found="a torch.save archive", fix="Convert it to safetensors first (pickles are not read).")
    hints = {}
    cfg = _diffusers_folder(folder)
    if cfg and cfg[0] == folder:
        hints["transformer_class"] = cfg[1].get("_class_name")
    src = SafetensorsSource([real], path=real, hints=hints)
    keys = list(src.entries)
    for prefix in KNOWN_PREFIXES:
        if sum(k.startswith(prefix) for k in keys) > len(keys) // 2:
            src.strip_prefix(prefix)
            break
    return src


def _folder_source(path: str) -> SafetensorsSource:
    found = _diffusers_folder(path)
    if found is None:
        raise BuildError("This folder is not a diffusers model.", path=path,
                         expected="a folder with transformer/config.json (or config.json) and *.safetensors weights",
                         fix="Point at the model root or its transformer folder, or at a single .safetensors file.")
    folder, config = found
    return SafetensorsSource(_folder_weights(folder), path=folder,
                             hints={"transformer_class": config.get("_class_name")})


def _refuse_quantized(infos: Mapping, path: str | None) -> None:
    marked = [k for k in infos if any(m in k for m in QUANTIZED_MARKERS)]
    if marked:
        raise BuildError("The input is already quantized; a build needs dense weights.", path=path,
                         found=f"quantized entries such as '{marked[0]}'",
                         fix="Pick the dense model it was made from.")


def _marker_text(m) -> str:
    return f"'{m}'" if isinstance(m, str) else " + ".join(f"'{k}'" for k in m)


@dataclasses.dataclass
class Prepared:
    source: Source  # diffusers layout
    family: Family
    input_layout: str  # layout of the input before conversion


def open_input(input, *, family: str | Family | None = None, key_map: KeyMapArg = None,
               layout: str | None = None) -> Prepared:
    """Any supported input -> a diffusers-layout source and its family. ``layout`` None/"auto" detects it."""
    if isinstance(input, Source):
        src = input
    elif isinstance(input, Mapping):
        if any(qtensor.is_quantized(v) for v in input.values()):
            raise BuildError("The state dict already holds quantized weights; a build needs dense weights.",
                             fix="Build from the dense model (not from a model loaded pre-quantized).")
        src = MemorySource(input)
    else:
        path = os.fspath(input)
        if os.path.isdir(path):
            src = _folder_source(path)
        elif os.path.isfile(path):
            src = file_source(path)
        else:
            raise BuildError("The input does not exist.", path=path,
                             expected="a dense .safetensors file or a diffusers folder")
    infos = src.infos()
    _refuse_quantized(infos, src.path)
    keys = list(infos)
    if isinstance(family, Family):
        fam = family
    elif family and str(family).strip().lower() != "auto":
        fam = families.get(family)
    else:
        fam = families.detect(keys, src.hints, src.path)[0]
    found_layout = fam.layout_of(keys)
    if layout and layout != "auto":
        found_layout = layout
    if found_layout is None:
        raise BuildError(f"The input's tensor names do not look like {fam.title} in either key layout.", path=src.path,
                         expected="tensors such as " + " or ".join(_marker_text(m) for m in
                                                                   fam.diffusers_markers + fam.comfy_markers),
                         found=f"{len(keys)} tensors, e.g. {sorted(keys)[:3]}",
                         fix="Pick the right family, or 'auto'.")
    if found_layout == "comfyui":
        shapes = {k: i.shape for k, i in infos.items()}
        if key_map is None and callable(fam.comfy_key_map):  # our own map (prequant_core.keymaps): no ComfyUI needed
            key_map = fam.comfy_key_map(fam.comfy_unet_config(shapes, {}))
        elif key_map is None and fam.comfy_key_map is None:  # ComfyUI uses the diffusers names for this family
            key_map = {k: k for k in infos}
        elif callable(key_map):
            key_map = key_map(fam, shapes)
            if key_map is None:
                key_map = {k: k for k in infos}
        if key_map is None:
            raise BuildError("This input uses ComfyUI's key names; converting them to diffusers names needs "
                             "ComfyUI's own key map.", path=src.path,
                             expected=f"ComfyUI's comfy.utils.{fam.comfy_key_map}",
                             fix="Build it with the 'Build Prequant Checkpoint' node, or pass --comfyui "
                                 "/path/to/ComfyUI on the command line.")
        src = RemappedSource(src, key_map, ignore=set(fam.fill_missing))
    return Prepared(src, fam, found_layout)


# ----------------------------------------------------------------------------------------------------------------
# Size estimate and free-space check
# ----------------------------------------------------------------------------------------------------------------

def estimate_output_bytes(infos: Mapping[str, TensorInfo], flt: schemes.LayerFilter,
                          dtype: torch.dtype = torch.bfloat16) -> tuple[int, int]:
    """(upper bound of the output file size, number of weights that will be quantized), from shapes alone."""
    total, n_q = HEADER_SLACK, 0
    for k, info in infos.items():
        dt = dtype if info.dtype.is_floating_point else info.dtype
        if is_linear_weight(k, info) and flt.reason_skipped(k[: -len(".weight")],
                                                            torch.empty(info.shape, dtype=dt, device="meta")) is None:
            rows, cols = info.shape
            total += rows * cols + rows * 4 + rows  # codes, float32 per-row scale, int8 zero point (int8 only)
            n_q += 1
        else:
            total += TensorInfo(info.shape, dt).nbytes
        total += 1024  # header entry per tensor (torchao JSON, offsets, fingerprint line)
    return total, n_q


def default_free_space(folder: str) -> int:
    return shutil.disk_usage(folder).free


def check_free_space(folder: str, needed: int, free_space: FreeSpaceFn | None = None) -> int:
    free = (free_space or default_free_space)(folder)
    if free < needed:
        raise BuildError("Not enough free disk space for the output; nothing was written.", path=folder,
                         expected=f"at least {human_bytes(needed)} free (estimated output size)",
                         found=f"{human_bytes(free)} free",
                         fix="Free some space on that drive, or write the checkpoint to another folder.")
    return free


def human_bytes(n: int) -> str:
    for unit, div in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n} B"


# ----------------------------------------------------------------------------------------------------------------
# Atomic output and stale temp files
# ----------------------------------------------------------------------------------------------------------------

def _host_tag() -> str:
    return hashlib.md5(socket.gethostname().encode("utf-8", "replace")).hexdigest()[:8]


def temp_name() -> str:
    return f"{TEMP_PREFIX}{_host_tag()}-{os.getpid()}-{secrets.token_hex(6)}{TEMP_SUFFIX}"


def _pid_alive(pid: int) -> bool:
    try:
        import psutil  # ComfyUI depends on it; the plain os.kill probe below would *terminate* the process on Windows
        return psutil.pid_exists(pid)
    except ImportError:
        pass
    if os.name == "nt":
        return True  # cannot tell safely: leave the temp to the age rule
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def clean_stale_temps(folder: str, *, now: float | None = None) -> list[str]:
    """Remove temp files left by builds that died (killed, crashed, power loss) in ``folder``.

    A temp is stale when the process that made it (same host, pid in the name) is gone, or when it has not been
    written for ``STALE_AFTER_S`` (pid reused, or another host). Temps of live builds are left alone.
    """
    now = time.time() if now is None else now
    host, me = _host_tag(), os.getpid()
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        m = _TEMP_RE.match(name)
        if not m and not _LEGACY_TEMP_RE.match(name):
            continue
        full = os.path.join(folder, name)
        try:
            age = now - os.stat(full).st_mtime
        except OSError:
            continue
        if m:
            same_host, pid = m.group(1) == host, int(m.group(2))
            if same_host and pid == me:
                continue
            stale = (same_host and not _pid_alive(pid)) or age > STALE_AFTER_S
        else:
            stale = age > 3600
        if stale:
            with contextlib.suppress(OSError):
                os.unlink(full)
                removed.append(full)
    return removed


def _refuse_existing(dest: str, overwrite: bool) -> None:
    if os.path.isdir(dest):
        raise BuildError("The output path is a folder.", path=dest, fix="Give a file name.")
    if os.path.lexists(dest) and not overwrite:
        raise BuildError("The output file already exists; it was left untouched.", path=dest,
                         fix="Choose another filename, or allow overwriting.")


@contextlib.contextmanager
def atomic_output(dest: str, *, overwrite: bool = False):
    """Yield a temp path beside ``dest``; on success fsync + move onto ``dest``, on any failure remove it.

    Without ``overwrite`` the final move is a hard link, which fails if ``dest`` appeared meanwhile (no clobbering a
    file another process wrote); filesystems without hard links fall back to a checked rename.
    """
    dest = os.path.abspath(dest)
    folder = os.path.dirname(dest)
    _refuse_existing(dest, overwrite)
    if not os.path.isdir(folder):
        raise BuildError("The output folder does not exist.", path=folder, fix="Create it or pick another folder.")
    clean_stale_temps(folder)
    tmp = os.path.join(folder, temp_name())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        if overwrite:
            os.replace(tmp, dest)
        else:
            try:
                os.link(tmp, dest)
            except FileExistsError:
                raise BuildError("The output file appeared while building; it was left untouched.", path=dest,
                                 fix="Choose another filename, or allow overwriting.") from None
            except OSError:
                _refuse_existing(dest, overwrite)
                os.replace(tmp, dest)
            else:
                os.unlink(tmp)
        with contextlib.suppress(OSError):
            dfd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# ----------------------------------------------------------------------------------------------------------------
# Writers
# ----------------------------------------------------------------------------------------------------------------

def _flat_parts(key: str, t) -> tuple[str | None, list[tuple[str, torch.Tensor]]]:
    """(torchao header JSON or None, [(flat name, tensor)]) exactly as the container's ``flatten`` lays them out,
    without cloning the tensor data."""
    from .formats.safetensors_container import ROOT_PREFIX
    if "." not in key:
        if qtensor.is_quantized(t):
            raise BuildError(f"Root-level tensor '{key}' cannot be quantized.")
        return None, [(ROOT_PREFIX + key, t)]
    if not qtensor.is_quantized(t):
        return json.dumps({"_type": torch.Tensor.__name__}), [(key, t)]
    from torchao.prototype.safetensors.safetensors_utils import TensorSubclassAttributeJSONEncoder
    mod, attr = key.rsplit(".", 1)
    names = list(t.tensor_data_names) + list(getattr(t, "optional_tensor_data_names", None) or [])
    parts = [(f"{mod}._{attr}_{n}", getattr(t, n)) for n in names if getattr(t, n) is not None]
    return json.dumps(t, cls=TensorSubclassAttributeJSONEncoder), parts


def safetensors_layout(tensors: Mapping, metadata: dict) -> tuple[dict, list[tuple[str, str, torch.Tensor]]]:
    """(``__metadata__`` header dict, [(key, flat name, tensor)]) for the safetensors container."""
    header: dict = {}
    dotted, roots, flat = [], [], []
    for k, v in tensors.items():
        entry, parts = _flat_parts(k, v)
        if entry is None:
            roots.append(k)
        else:
            dotted.append(k)
            header[k] = entry
        flat.extend((k, n, p) for n, p in parts)
    header["tensor_names"] = json.dumps(dotted)
    header["unsloth_format"] = FORMAT_V1
    header["unsloth_metadata"] = json.dumps(metadata, sort_keys=True, default=str)
    header["unsloth_root_tensors"] = json.dumps(sorted(roots))
    return header, flat


def write_safetensors(path: str, tensors: Mapping, metadata: dict, *, progress: BuildProgress | None = None) -> None:
    """Stream the container to ``path``: header first, then each tensor's bytes straight from its storage.

    ``safetensors.save_file`` would need every flattened tensor at once (torchao's flatten clones them; older
    safetensors versions also copy every tensor to ``bytes``); this writer never holds more than the input.
    Tensors are ordered by element size (largest first), so every tensor starts aligned to its element size.
    """
    meta_header, flat = safetensors_layout(tensors, metadata)
    seen = set()
    for _, name, _ in flat:
        if name in seen:
            raise BuildError(f"Two tensors flatten to the same name '{name}'.")
        seen.add(name)
    order = sorted(range(len(flat)), key=lambda i: (-flat[i][2].element_size(), i))
    header: dict = {"__metadata__": meta_header}
    offset = 0
    for i in order:
        _, name, t = flat[i]
        if t.dtype not in ST_DTYPES:
            raise BuildError(f"Tensor '{name}' has dtype {t.dtype}, which safetensors cannot store.")
        n = t.numel() * t.element_size()
        header[name] = {"dtype": ST_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    blob += b" " * (-(8 + len(blob)) % 8)
    total = len(order)
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for done, i in enumerate(order, 1):
            key, name, t = flat[i]
            t = t.detach()
            if t.device.type != "cpu":
                t = t.cpu()
            t = t.contiguous()
            if t.numel():
                f.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
            if progress:
                progress("write", done, total, name)


def write_pt(path: str, tensors: Mapping, metadata: dict, *, progress: BuildProgress | None = None) -> None:
    sd = {k: (v if qtensor.is_quantized(v) else v.contiguous()) for k, v in tensors.items()}
    if progress:
        progress("write", 0, 1, os.path.basename(path))
    torch.save({"format": FORMAT_V1, "metadata": metadata, "state_dict": sd}, path)
    if progress:
        progress("write", 1, 1, os.path.basename(path))


def write_checkpoint(dest: str, tensors: Mapping, metadata: dict, *, container: str = "safetensors",
                     overwrite: bool = False, progress: BuildProgress | None = None) -> str:
    if container not in CONTAINERS:
        raise BuildError(f"Unknown output container '{container}'.", expected=" or ".join(CONTAINERS))
    writer = write_safetensors if container == "safetensors" else write_pt
    try:
        with atomic_output(dest, overwrite=overwrite) as tmp:
            writer(tmp, tensors, metadata, progress=progress)
    except OSError as e:
        err = _write_error(e, dest)
        if err is None:
            raise
        raise err from None
    except RuntimeError as e:
        if container != "pt":
            raise
        # torch.save reports a failed write as RuntimeError ("PytorchStreamWriter failed writing file ...") and
        # drops the errno: a full disk or a file size limit are the usual causes; a disk with less room than the
        # tensors (the temp is gone by now) was the full one
        try:
            full = shutil.disk_usage(os.path.dirname(os.path.abspath(dest))).free < \
                sum(qtensor.nbytes(v) for v in tensors.values())
        except OSError:
            full = False
        if full:
            raise _write_error(OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} ({str(e).strip()[:200]})"),
                               dest) from None
        raise BuildError("Writing the .pt file failed; the partial file was removed and nothing was written.",
                         path=dest, found=str(e).strip().splitlines()[0][:300] if str(e).strip() else "RuntimeError",
                         fix="Check the free space and the file size limit of that drive, or write the checkpoint "
                             "to another folder.") from None
    return os.path.abspath(dest)


def _write_error(e: OSError, dest: str) -> BuildError | None:
    """A clear BuildError for the file system refusing the output (nothing was written); None: not one of those."""
    if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        return BuildError("The disk filled up while writing; the partial file was removed and nothing was "
                          "written.", path=dest, found=str(e),
                          fix="Free some space on that drive, or write the checkpoint to another folder.")
    if e.errno == errno.EFBIG:
        return BuildError("The output is larger than this system lets one file be (file size limit); the partial "
                          "file was removed and nothing was written.", path=dest, found=str(e),
                          fix="Raise the file size limit (ulimit -f), or write to another file system.")
    if e.errno == errno.EROFS:
        return BuildError("The output folder is on a read-only file system; nothing was written.", path=dest,
                          found=str(e), fix="Write the checkpoint to a writable folder.")
    if e.errno in (errno.EACCES, errno.EPERM):
        return BuildError("No permission to write the output (permission denied); nothing was written.", path=dest,
                          found=str(e), fix="Write to a folder you may write to, fix its permissions, or clear an "
                                            "immutable flag on the existing file (chattr -i).")
    return None


# ----------------------------------------------------------------------------------------------------------------
# The build
# ----------------------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class BuildResult:
    path: str
    container: str
    family: str
    scheme: str
    base_model_id: str
    input_layout: str
    tensors: int
    quantized: int
    skipped: list[str]
    file_bytes: int
    dense_bytes: int
    estimated_bytes: int
    fingerprint: dict
    metadata: dict
    seconds: float

    def summary(self) -> str:
        return (f"Wrote {self.path}: {self.family} {self.scheme} ({self.container}), {self.quantized} quantized layers, "
                f"{len(self.skipped)} Linear layers kept dense, {human_bytes(self.file_bytes)} "
                f"(dense {human_bytes(self.dense_bytes)}), {self.seconds:.1f} s")


def container_for(dest: str, container: str | None) -> str:
    ext = os.path.splitext(dest)[1].lower()
    by_ext = {v: k for k, v in EXTENSIONS.items()}.get(ext)
    if container is None or container == "auto":
        return by_ext or "safetensors"
    if container not in CONTAINERS:
        raise BuildError(f"Unknown output container '{container}'.", expected=" or ".join(CONTAINERS), found=container)
    if by_ext and by_ext != container:
        raise BuildError("The output file name's extension does not match the container.", path=dest,
                         expected=EXTENSIONS[container], found=ext,
                         fix=f"Name the file *{EXTENSIONS[container]}, or pick the '{by_ext}' container.")
    return container


def default_filename(base_model_id: str, scheme: str, container: str) -> str:
    """``<Model>-<SCHEME>.<ext>`` (FORMAT.md section 3), Model = last part of the base model id."""
    model = str(base_model_id).rstrip("/").rsplit("/", 1)[-1] or "model"
    return f"{model}-{schemes.normalize(scheme).upper()}{EXTENSIONS[container]}"


def build(input, dest: str, *, scheme: str, family: str | Family | None = None, base_model_id: str | None = None,
          min_features: int = schemes.DEFAULT_MIN_FEATURES, container: str | None = None, overwrite: bool = False,
          key_map: KeyMapArg = None, layout: str | None = None, progress: BuildProgress | None = None,
          free_space: FreeSpaceFn | None = None) -> BuildResult:
    """Dense model -> pre-quantized checkpoint at ``dest`` (diffusers key names, every FORMAT.md metadata field).

    ``input``: a state dict, a ``Source``, a dense ``.safetensors`` path or a diffusers folder.
    ``key_map``: ComfyUI's diffusers -> ComfyUI map (or ``fn(family, shapes) -> map``), needed for ComfyUI-layout
    input only. ``free_space(folder) -> bytes`` defaults to ``shutil.disk_usage``.
    Refuses (``BuildError``) before reading any weight: existing output, unknown family, too little disk space.
    """
    t0 = time.time()
    scheme = schemes.normalize(scheme)
    dest = os.path.abspath(os.fspath(dest))
    container = container_for(dest, container)
    try:
        min_features = int(min_features)
    except (TypeError, ValueError):
        raise BuildError("min_features must be an integer.", found=repr(min_features)) from None
    if min_features < 1:
        raise BuildError("min_features must be at least 1.", found=str(min_features))
    _refuse_existing(dest, overwrite)
    folder = os.path.dirname(dest)
    if not os.path.isdir(folder):
        raise BuildError("The output folder does not exist.", path=folder, fix="Create it or pick another folder.")

    prep = open_input(input, family=family, key_map=key_map, layout=layout)
    fam, src = prep.family, prep.source
    base_model_id = (base_model_id or "").strip() or fam.base_repos[0]
    exclude = schemes.exclude_tokens(scheme, fam.int8_exclude_extra)
    flt = schemes.LayerFilter(scheme, min_features, tuple(exclude))
    infos = src.infos()
    estimate, n_q = estimate_output_bytes(infos, flt)
    if n_q == 0:
        raise BuildError("No Linear layer passes the filter, so nothing would be quantized.", path=src.path,
                         expected=f"Linear layers with in and out features >= min_features ({min_features})",
                         fix="Lower min_features.")
    check_free_space(folder, estimate, free_space)

    total = len(infos)
    qprog = (lambda done, tot: progress("quantize", done, tot, "")) if progress else None
    q, skipped = quantize_items(src.items(), flt, total=total, progress=qprog)
    meta = make_metadata(family=fam, scheme=scheme, base_model_id=base_model_id, min_features=min_features,
                         exclude=exclude, tensors=q, skipped=skipped)
    path = write_checkpoint(dest, q, meta, container=container, overwrite=overwrite, progress=progress)
    return BuildResult(path=path, container=container, family=fam.name, scheme=scheme, base_model_id=base_model_id,
                       input_layout=prep.input_layout, tensors=len(q),
                       quantized=sum(1 for v in q.values() if qtensor.is_quantized(v)), skipped=sorted(skipped),
                       file_bytes=os.path.getsize(path), dense_bytes=sum(i.nbytes for i in infos.values()),
                       estimated_bytes=estimate, fingerprint=meta["fingerprint"], metadata=meta,
                       seconds=time.time() - t0)


def build_from_tensors(dest: str, dense: Mapping, *, family: Family, scheme: str, base_model_id: str,
                       min_features: int = schemes.DEFAULT_MIN_FEATURES, container: str = "safetensors",
                       overwrite: bool = False, progress: ProgressFn | None = None) -> str:
    """Dense state dict -> checkpoint file with the keys exactly as given (either layout; tests build ComfyUI-layout
    files this way). ``build`` is the user-facing entry that always writes diffusers names."""
    scheme = schemes.normalize(scheme)
    exclude = schemes.exclude_tokens(scheme, family.int8_exclude_extra)
    q, skipped = quantize_tensors(dense, scheme, min_features=min_features, exclude=exclude, progress=progress)
    meta = make_metadata(family=family, scheme=scheme, base_model_id=base_model_id, min_features=min_features,
                         exclude=exclude, tensors=q, skipped=skipped)
    return write_checkpoint(dest, q, meta, container=container, overwrite=overwrite)


# ----------------------------------------------------------------------------------------------------------------
# Command line: python -m prequant_core build
# ----------------------------------------------------------------------------------------------------------------

def comfy_key_map_from(comfy_dir: str) -> Callable[[Family, dict], Mapping]:
    """Key-map provider backed by a ComfyUI checkout's ``comfy.utils`` (imported from ``comfy_dir``)."""
    comfy_dir = os.path.abspath(comfy_dir)
    if not os.path.isfile(os.path.join(comfy_dir, "comfy", "utils.py")):
        raise BuildError("This is not a ComfyUI folder.", path=comfy_dir, expected="a folder containing comfy/utils.py",
                         fix="Point --comfyui at your ComfyUI installation.")

    def provider(fam: Family, shapes: dict) -> Mapping:
        if comfy_dir not in sys.path:
            sys.path.insert(0, comfy_dir)
        if fam.comfy_key_map is None or callable(fam.comfy_key_map):
            return None if fam.comfy_key_map is None else fam.comfy_key_map(fam.comfy_unet_config(shapes, {}))
        import comfy.utils
        fn = getattr(comfy.utils, fam.comfy_key_map, None)
        if fn is None:
            raise BuildError(f"This ComfyUI has no key map for {fam.title} (comfy.utils.{fam.comfy_key_map}).",
                             path=comfy_dir, fix="Update ComfyUI.")
        return fn(fam.comfy_unet_config(shapes, {}))
    return provider


class TerminalProgress:
    """One line per step when piped; a single updating line on a terminal."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def __call__(self, stage: str, done: int, total: int, key: str) -> None:
        line = f"[{stage} {done}/{total}] {key}".rstrip()
        if self.tty:
            width = shutil.get_terminal_size((100, 20)).columns - 1
            self.stream.write("\r" + line[:width].ljust(width))
            if done == total:
                self.stream.write("\n")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def _cli_build(args) -> int:
    family = None if args.family == "auto" else args.family
    output = args.output
    container = args.container
    if output is None or os.path.isdir(output):
        folder = output or os.getcwd()
        if family:
            fam = families.get(family)
        else:
            fam = open_input(args.input, key_map=None if not args.comfyui else comfy_key_map_from(args.comfyui)).family
        c = container if container in CONTAINERS else "safetensors"
        output = os.path.join(folder, default_filename(args.base_model_id or fam.base_repos[0], args.scheme, c))
    res = build(args.input, output, scheme=args.scheme, family=family, base_model_id=args.base_model_id,
                min_features=args.min_features, container=None if container == "auto" else container,
                overwrite=args.overwrite, key_map=comfy_key_map_from(args.comfyui) if args.comfyui else None,
                progress=None if args.quiet else TerminalProgress())
    print(res.summary())
    print(res.path)
    return 0


def add_cli(subparsers) -> None:
    p = subparsers.add_parser(
        "build", help="make a pre-quantized checkpoint from a dense model",
        description="Quantize a dense diffusion transformer (torchao int8 / fp8, per-row) and write a pre-quantized "
                    "checkpoint with diffusers key names and full metadata. Reads one tensor at a time (peak memory "
                    "about the quantized size plus one layer) and writes atomically. Exit status: 0 written, 2 refused "
                    "(nothing written).")
    p.add_argument("--input", "-i", required=True, metavar="PATH",
                   help="dense weights: a .safetensors file (diffusers or ComfyUI key layout) or a diffusers folder "
                        "(model root with transformer/config.json, or the transformer folder; sharded weights with "
                        "an index json are fine)")
    p.add_argument("--output", "-o", metavar="PATH", default=None,
                   help="output file, or an existing folder to write <Model>-<SCHEME>.<ext> into "
                        "(default: that name in the current folder)")
    p.add_argument("--scheme", choices=schemes.SCHEMES, default="int8", help="quantization scheme (default: %(default)s)")
    p.add_argument("--min-features", type=int, default=schemes.DEFAULT_MIN_FEATURES, metavar="N",
                   help="quantize only Linear layers whose in and out features are both >= N (default: %(default)s)")
    p.add_argument("--base-model-id", default=None, metavar="REPO",
                   help="base model recorded in the metadata (default: the family's base repo, e.g. "
                        "Tongyi-MAI/Z-Image-Turbo)")
    p.add_argument("--family", choices=["auto"] + sorted(families.FAMILIES), default="auto",
                   help="model family (default: %(default)s, from config.json or the tensor names)")
    p.add_argument("--container", choices=["auto"] + list(CONTAINERS), default="auto",
                   help="file format: safetensors (safe, no pickle) or pt (torch.save); default auto: from the "
                        "output extension, else safetensors")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    p.add_argument("--comfyui", metavar="DIR", default=None,
                   help="a ComfyUI folder whose key map converts ComfyUI-layout input to diffusers names "
                        "(only needed for ComfyUI-layout files)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines")
    p.set_defaults(func=_cli_build)
