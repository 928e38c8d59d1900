"""The ``torch.save`` container: {"format", "metadata", "state_dict"}, read with ``weights_only=True`` only."""
from __future__ import annotations

import pickle
import pickletools
import re

import torch

from ..checkpoint import Checkpoint
from ...errors import CorruptCheckpointError, UnsafeCheckpointError
from .. import pickle_guard, plain_data
from ..file_handle import opened
from . import READ_MMAP, Container, Light
from ..validate_tensors import check_state_dict

LEGACY_V1_MARKERS = ("LinearActivationQuantizedTensor", "AffineQuantizedTensor", "PlainAQTTensorImpl")


def _safe_globals():
    """What torch's weights-only reader may rebuild besides its own types: every class each registered scheme's
    tensors pickle (``Codec.pickled``), so a file of any scheme reads the same in a fresh process as after other
    code imported torchao's modules (which register some classes as safe on import, others not)."""
    from torch.torch_version import TorchVersion
    from ...schemes import registry
    out = [TorchVersion]
    for codec in registry.codecs():
        try:
            out += [c for c in codec.pickle_classes() if c not in out]
        except ImportError:  # an older torchao without this kind's classes: its files are refused by name below
            continue
    return out


def _needs_torchao(global_name: str, path: str) -> Exception | None:
    """A class a registered kind pickles, which this torchao could not import: say so instead of "unsafe"."""
    from ...errors import DependencyError
    from ...schemes import registry
    for codec in registry.codecs():
        for ref in codec.pickled:
            if global_name.split(".")[-1] == ref.partition(":")[2] and global_name.startswith("torchao."):
                try:
                    codec.pickle_classes()
                except ImportError as e:
                    import torchao
                    return DependencyError(
                        f"The file holds torchao's {ref.partition(':')[2]} ({codec.kind} weights), which this "
                        "torchao cannot import.", path=path, expected=f"a torchao that has {ref.replace(':', '.')}",
                        found=f"torchao {getattr(torchao, '__version__', '?')}: {e}",
                        fix="pip install -U torchao in ComfyUI's Python environment.")
    return None


def load_weights_only(src, *, mmap: bool = True):
    """``torch.load`` that never executes code, after the archive passed ``pickle_guard``'s bounds, with errors
    mapped to our types. ``src``: a path or an ``OpenedFile`` (then this very file is read)."""
    with opened(src) as f:
        path = f.path
        pickle_guard.checked_pickle(f)
        try:
            # only what is not allowed already: torch's context removes every class it was given on exit, and a
            # class torchao registered for the whole process must stay allowed for other code (ComfyUI, the user's).
            # The classes are imported first: importing torchao is what registers them, so a list of what is
            # allowed taken before would hand them to the context, which then took them away from the process.
            wanted = _safe_globals()
            already = set(torch.serialization.get_safe_globals())
            with torch.serialization.safe_globals([c for c in wanted if c not in already]):
                return torch.load(f.io_path, map_location="cpu", weights_only=True, mmap=mmap)
        except pickle.UnpicklingError as e:
            raise _translate(str(e), path) from None
        except Exception as e:  # noqa: BLE001 - torch.load on a stranger's bytes fails in many ways (zipfile, struct,
            # RuntimeError from the zip reader, ...); every one of them means the same thing to the user
            raise CorruptCheckpointError("The .pt file is damaged or truncated.", path=path,
                                         found=f"{type(e).__name__}: {_first_line(str(e))}",
                                         fix="Download or build the file again.") from None


# torch's message wraps the reason in advice to reload with the weights-only guard turned off; that advice is never
# shown here.
_TORCH_BOILERPLATE = re.compile(r"Weights only load failed\..*?trusted source\.|Please file an issue.*?WeightsUnpickler "
                                r"error:|Check the documentation of torch\.load.*$", re.S)
_GLOBAL = re.compile(r"(?:unsupported GLOBAL|Unsupported global: GLOBAL)\s+([\w.]+)", re.I)
_OPERAND = re.compile(r"Unsupported operand (\d+)")


def _reason(msg: str) -> str:
    return " ".join(_TORCH_BOILERPLATE.sub(" ", msg).split())[:300]


def _translate(msg: str, path: str) -> Exception:
    if any(m in msg for m in LEGACY_V1_MARKERS):
        return _LegacyV1(msg)
    g = _GLOBAL.search(msg)
    too_old = _needs_torchao(g.group(1), path) if g else None
    if too_old is not None:
        return too_old
    if g:
        return UnsafeCheckpointError(
            "Refused to load: the file asks Python to import something that is not a tensor type (a pickle that "
            "could run code). Nothing from it was executed.",
            path=path, expected="only tensors, torchao quantized tensors and plain containers",
            found=f"the pickle names '{g.group(1)[:120]}'",
            fix="Only load checkpoints from sources you trust; prefer .safetensors.")
    op = _OPERAND.search(msg)
    if op:
        code = int(op.group(1))
        info = pickletools.code2op.get(chr(code)) if code < 256 else None
        name = info.name if info else f"byte {code}"
        # FRAME and the other protocol-4+ opcodes: torch.save writes them only when asked for a newer pickle
        # protocol, and torch's own safe loader refuses them too (the message once said torch.save never writes them)
        return CorruptCheckpointError(
            "The .pt file uses a pickle opcode torch's safe loader does not read; nothing from it was loaded.",
            path=path, expected="a pickle in torch.save's default protocol (2)", found=f"opcode {name}",
            fix="Save it again with torch.save's default pickle protocol, use its .safetensors form, or download or "
                "build the file again.")
    return CorruptCheckpointError("The .pt file could not be unpickled safely.", path=path,
                                  found=_reason(msg) or "an unreadable pickle", fix="Download or build the file again.")


class _LegacyV1(Exception):
    pass


def _first_line(s: str) -> str:
    s = _reason(s).strip().splitlines()
    return s[0][:300] if s else ""


def read_pt(src, *, mmap: bool = True) -> Checkpoint:
    with opened(src) as f:
        try:
            obj = load_weights_only(f, mmap=mmap)
        except _LegacyV1:
            from .legacy_v1 import read_legacy_v1
            return read_legacy_v1(f, mmap=mmap)
        return container(obj, f.path)


def container(obj, path: str, *, read_data: bool = True) -> Checkpoint:
    """The unpickled object -> Checkpoint, after checking it is the container (see check_state_dict for
    ``read_data``)."""
    if not isinstance(obj, dict) or "state_dict" not in obj:
        found = type(obj).__name__ if not isinstance(obj, dict) else f"dict with keys {sorted(map(str, obj))[:8]}"
        raise CorruptCheckpointError(
            "This .pt file is not a pre-quantized transformer container.", path=path,
            expected="a dict with 'format', 'metadata' and 'state_dict'", found=found,
            fix="Use a file written by Build Prequant Checkpoint or an Unsloth *-FP8 repo; a plain dense "
                "checkpoint belongs in 'Load Diffusion Model' (or use the dense fallback).")
    tag = obj.get("format")
    meta = obj.get("metadata") if obj.get("metadata") is not None else {}
    if tag is not None and not isinstance(tag, str):
        raise CorruptCheckpointError("The container's 'format' entry is not a string.", path=path,
                                     found=type(tag).__name__)
    if not isinstance(meta, dict):
        raise CorruptCheckpointError("The container's 'metadata' entry is not a dict.", path=path,
                                     found=type(meta).__name__)
    meta = plain_data.plain(meta, path)
    sd = check_state_dict(obj["state_dict"], path, read_data=read_data)
    return Checkpoint(path=path, container="pt", format_tag=tag, metadata=meta, tensors=sd)


ZIP_MAGIC = b"PK\x03\x04"
_DATA_RECORD = re.compile(r"(^|/)data/[^/]+$")


def read_light(f) -> Light | None:
    """``torch.load(mmap=True, weights_only=True)``: the container checked as ``read_pt`` does, no tensor byte
    touched. None: a legacy torchao-v1 file (only the full reader converts those)."""
    try:
        obj = load_weights_only(f, mmap=True)
    except _LegacyV1:
        return None
    return Light(container(obj, f.path, read_data=False), READ_MMAP)


def declared_bytes(f) -> int | None:
    """The stored tensor records' sizes, from the zip index (after ``pickle_guard``'s bounds on it)."""
    try:
        infos = pickle_guard.zip_index(f)  # bounds the entry count before listing them; kept for the reader
        return sum(i.file_size for i in infos if _DATA_RECORD.search(i.filename))
    except Exception:  # noqa: BLE001 - a damaged zip index: no estimate; the reader names what is wrong
        return None


def write(path: str, tensors, metadata: dict, *, progress=None) -> None:
    """``torch.save`` of the container; the format tag follows what the metadata declares (v1 / v2 / v3)."""
    import os
    from ...schemes import qtensor
    from ..layer_policy import expected_tag
    sd = {k: (v if qtensor.is_quantized(v) else v.contiguous()) for k, v in tensors.items()}
    if progress:
        progress("write", 0, 1, os.path.basename(path))
    torch.save({"format": expected_tag(metadata), "metadata": metadata, "state_dict": sd}, path)
    if progress:
        progress("write", 1, 1, os.path.basename(path))


CONTAINER = Container(
    name="pt", description="a torch.save archive", extensions=(".pt",),
    recognise=lambda head, size: head.startswith(ZIP_MAGIC),
    read=lambda f, mmap=True: read_pt(f, mmap=mmap), read_light=read_light, declared_bytes=declared_bytes,
    write=write)
