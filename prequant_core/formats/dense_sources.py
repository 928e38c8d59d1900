"""Dense inputs read lazily: a state dict, one or more .safetensors files (plain ``readinto``, never a memory
map that stays resident), ComfyUI-layout files seen through a key map, and diffusers folders; for the builder and
for the loader's dense fallback (``open_dense`` / ``stream_quantized``)."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from typing import Callable, Iterable, Iterator, Mapping

import torch

from .. import families, schemes
from ..families import keymap
from ..schemes import qtensor
from .checkpoint import COMFY_PREFIX
from ..errors import BuildError, CheckpointNotFoundError, CorruptCheckpointError, UnsupportedFormatError
from .containers.safetensors_container import NAME_DTYPES
from ..families import Family
from ..schemes.quantize import quantize_items


# Single-file checkpoints often keep the transformer under a prefix (a full ComfyUI checkpoint: model.diffusion_model.).
KNOWN_PREFIXES = (COMFY_PREFIX, "diffusion_model.", "transformer.")
INDEX_NAME = "diffusion_pytorch_model.safetensors.index.json"
QUANTIZED_MARKERS = ("._weight_qdata", ".weight_scale", ".comfy_quant", "scaled_fp8", ".scale_weight")





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
    # names the consumer does not use (a ComfyUI skeleton entry the family leaves unfilled, e.g. Z-Image's
    # norm_final): skipped unread and unchecked, as a model built from a file holds whatever memory held there
    unused: frozenset = frozenset()

    def infos(self) -> dict[str, TensorInfo]:
        raise NotImplementedError

    def items(self) -> Iterator[tuple[str, torch.Tensor]]:
        raise NotImplementedError

    def describe(self) -> str:
        return self.path or "state dict"


def check_dense(key: str, t: torch.Tensor, path: str | None) -> None:
    """A dense input's tensor is a finite float as it is read (one pass, while it is in memory anyway): a NaN would
    be quantized into the output, an integer weight quantized as if its codes were values."""
    from .validate_tensors import check_plain_tensors
    if key.endswith(".weight") and t.ndim >= 1 and 0 in t.shape:
        # a weight with no rows or no columns builds a file no model can load (round 5: it was written)
        raise BuildError(f"Tensor '{key[:80]}' has no elements (shape {tuple(t.shape)}); nothing was written.",
                         path=path, expected="a complete dense model", found=f"{key[:80]}: {tuple(t.shape)}",
                         fix="Build from the complete model file (this one is truncated or cut down).")
    if t.is_floating_point() or key.endswith(".weight"):  # integer buffers (ids, counters) pass as they are
        check_plain_tensors({key: t}, path or "the input model")


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
            if k in self.unused:
                continue
            v = v.detach().to("cpu")
            check_dense(k, v, self.path)
            yield k, v


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
        from ..formats.containers.safetensors_container import read_header
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
                if e["dtype"] not in NAME_DTYPES:
                    raise BuildError(f"Tensor '{name}' has a dtype this builder cannot read.", path=f,
                                     expected=", ".join(sorted(NAME_DTYPES)), found=e["dtype"])
                a, b = e["data_offsets"]
                self.entries[name] = _Entry(i, 8 + n + a, b - a, TensorInfo(tuple(e["shape"]), NAME_DTYPES[e["dtype"]]))
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
                if k in self.unused:
                    continue
                f = handles.get(e.file)
                if f is None:
                    f = handles[e.file] = open(self.files[e.file], "rb", buffering=0)
                buf = torch.empty(e.length, dtype=torch.uint8)
                f.seek(e.start)
                got = f.readinto(buf.numpy()) if e.length else 0
                if got != e.length:
                    raise CorruptCheckpointError(f"Tensor '{k}' is cut short (file truncated while reading?).",
                                                 path=self.files[e.file], found=f"{got} of {e.length} bytes")
                t = buf.view(e.info.dtype).reshape(e.info.shape)
                check_dense(k, t, self.files[e.file])
                yield k, t
                del buf, t
        finally:
            for f in handles.values():
                f.close()


class RemappedSource(Source):
    """A ComfyUI-layout source seen in diffusers layout through a diffusers -> ComfyUI key map, in the form ComfyUI's
    own maps use: ``comfy_key``, ``(comfy_key, (0, row offset, rows))`` (a row slice of a fused weight such as
    ``qkv``) or ``(comfy_key, slice_or_None, row_permutation)`` (a function, e.g. ``comfy.utils.swap_scale_shift``,
    or a name in ``keymap.ROW_PERMUTATIONS``; it must be its own inverse, which is checked).

    Each ComfyUI tensor is read once and split, never the whole state dict at once."""

    def __init__(self, base: Source, key_map: Mapping, *, ignore: Iterable[str] = ()):
        self.base, self.path, self.hints = base, base.path, base.hints
        base_infos = base.infos()
        self.plan: dict[str, list[tuple[str, tuple | None, Callable | None]]] = {}
        for dk, target in key_map.items():
            try:
                t = keymap.parse_target(dk, target)
            except CorruptCheckpointError as e:  # a map that cannot be applied exactly: the build's error
                raise BuildError(e.message) from None
            name, sl, perm = t.name, t.rows, t.perm
            if name in base_infos:
                self.plan.setdefault(name, []).append((dk, sl, _row_permutation(dk, perm, base_infos[name], sl)))
        for parts in self.plan.values():
            parts.sort(key=lambda p: p[1][0] if p[1] else 0)
        check_unmapped(base_infos, set(self.plan), ignore, base.path)
        base.unused = frozenset(n for n in base_infos if n not in self.plan)  # only ignored names, checked above
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
        fn = keymap.ROW_PERMUTATIONS.get(perm) if isinstance(perm, str) else None
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
    from . import sniff
    real = os.path.abspath(path)
    folder = os.path.dirname(real)
    # A shard picked from a list: build from the whole diffusers folder it belongs to.
    index = os.path.join(folder, INDEX_NAME)
    if os.path.isfile(index):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError, AttributeError):
            with open(index, encoding="utf-8") as f:
                if os.path.basename(real) in set(json.load(f)["weight_map"].values()):
                    return _folder_source(folder)
    try:
        kind = sniff(real)
    except CorruptCheckpointError as e:  # the sniffer speaks of checkpoints: here the input is a dense model
        raise BuildError("The input is not a model file.", path=real,
                         expected="a dense (bf16) .safetensors transformer, or a diffusers folder", found=e.found,
                         fix="Pick the dense model's .safetensors file (or its diffusers folder).") from None
    if kind != "safetensors":
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
                             expected="a dense .safetensors file or a diffusers folder",
                             fix="Check the path given to --input (or the node's dense_file).")
    infos = src.infos()
    _refuse_quantized(infos, src.path)
    keys = list(infos)
    if isinstance(family, Family):
        fam = family
    elif family and str(family).strip().lower() != "auto":
        fam = families.get(family)
    else:
        fam = families.detect(keys, src.hints, src.path, shapes={k: tuple(i.shape) for k, i in infos.items()})[0]
    found_layout = fam.layout_of(keys)
    if layout and layout != "auto":
        found_layout = layout
    if found_layout is None:
        raise BuildError(f"The input's tensor names do not look like {fam.title} in either key layout.", path=src.path,
                         expected="tensors such as " + " or ".join(  # a marker: a name, or names found together
                             f"'{m}'" if isinstance(m, str) else " + ".join(f"'{k}'" for k in m)
                             for m in fam.arch.diffusers_markers + fam.arch.comfy_markers),
                         found=f"{len(keys)} tensors, e.g. {sorted(keys)[:3]}",
                         fix="Pick the right family, or 'auto'.")
    if found_layout == "comfyui":
        shapes = {k: i.shape for k, i in infos.items()}
        if key_map is None and callable(fam.arch.comfy_key_map):  # our own map (the family's module): no ComfyUI needed
            key_map = fam.arch.comfy_key_map(fam.config_from_shapes(shapes, src.path))
        elif key_map is None and fam.arch.comfy_key_map is None:  # ComfyUI uses the diffusers names for this family
            key_map = {k: k for k in infos}
        elif callable(key_map):
            key_map = key_map(fam, shapes)
            if key_map is None:
                key_map = {k: k for k in infos}
        if key_map is None:
            raise BuildError("This input uses ComfyUI's key names; converting them to diffusers names needs "
                             "ComfyUI's own key map.", path=src.path,
                             expected=f"ComfyUI's comfy.utils.{fam.arch.comfy_key_map}",
                             fix="Build it with the 'Build Prequant Checkpoint' node, or pass --comfyui "
                                 "/path/to/ComfyUI on the command line.")
        src = RemappedSource(src, key_map, ignore=set(fam.arch.fill_missing))
    return Prepared(src, fam, found_layout)


# ---- the dense fallback: a dense transformer file quantized while it is read (the builder's reader and quantizer,
# one implementation; tensors are read with plain file reads into private memory and freed as soon as they are
# quantized, so the dense model is never whole in memory and a memory-mapped dense file does not stay resident)

def open_dense(path: str) -> SafetensorsSource:
    if not os.path.isfile(path):
        raise CheckpointNotFoundError("Dense model file not found.", path=path,
                                      fix="Put the dense transformer into ComfyUI/models/diffusion_models/.")
    if not path.endswith(".safetensors"):
        raise UnsupportedFormatError("Dense fallback files must be .safetensors (pickled .ckpt/.pt/.bin files are "
                                     "not opened: they could run code).", path=path,
                                     fix="Use the .safetensors release of the model.")
    return file_source(path)


def dense_nbytes(source: SafetensorsSource) -> int:
    return sum(i.nbytes for i in source.infos().values())


def stream_quantized(source: SafetensorsSource, scheme: str, *, min_features: int, exclude, progress=None):
    """(tensors, skipped): the builder's quantize_items over the file, in file order."""
    flt = schemes.LayerFilter(schemes.normalize(scheme), min_features, tuple(exclude))
    return quantize_items(source.items(), flt, total=len(source.infos()), progress=progress)
