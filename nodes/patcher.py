"""A ModelPatcher that lets stock LoRA nodes patch quantized Linears: dequantize -> ComfyUI's own
``calculate_weight`` -> requantize per row, with the original codes *and* scales backed up, so unpatching
restores the quantized weight exactly.

Memory while patching (issue 38): a layer is patched a block of rows at a time where its patches allow
(``lora_rows``), so the float32 working copies are a block's, not the layer's; the originals kept for the unpatch
cost nothing resident where they are the checkpoint file's own pages (given back, re-read on unpatch) or, for a
fused weight (``to_q/to_k/to_v`` -> ``qkv``), where the rows it was copied from are (the backup rebuilds it from them
when ComfyUI reads it)."""
from __future__ import annotations

import collections
import logging
import os

import torch

import comfy.model_patcher
import comfy.utils

from prequant_core.errors import UnsupportedFormatError
from prequant_core.families import pages
from prequant_core.schemes import qtensor, quantize

from . import lora_rows
from .ops import PART_NAMES, is_prequant_linear

_Backup = collections.namedtuple("Dimension", ["weight", "inplace_update"])
log = logging.getLogger("prequant")


def _digest(t: torch.Tensor) -> bytes:
    """A digest of a tensor's bytes, read in place (no copy): what a backup's file rows held when they were kept."""
    import hashlib
    return hashlib.blake2b(t.reshape(-1).view(torch.uint8).numpy(), digest_size=16).digest()


class _FileState(tuple):
    """Which file a backup's rows are mapped from and how long it was when they were found equal: ``os.stat``'s
    (path, device, inode, size)."""
    __slots__ = ()

    @classmethod
    def of(cls, path: str):
        try:
            st = os.stat(path)
        except (OSError, TypeError):
            return None
        return tuple.__new__(cls, (path, st.st_dev, st.st_ino, st.st_size))

    def truncated(self) -> bool:
        """Whether the mapped file itself (same inode) is now shorter than it was: its pages past the new end are
        gone, and touching them would end the process with SIGBUS. A file replaced under its name is another inode:
        the mapping keeps the old one alive, whole."""
        path, dev, ino, size = self
        try:
            st = os.stat(path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == (dev, ino) and st.st_size < size


# Files whose loaded model could not be restored from them after a LoRA (changed on disk meanwhile), with how many
# times: the loader's IS_CHANGED reads it, so ComfyUI runs the loader again (the file re-read and judged) on the
# next prompt instead of reusing the dropped model.
_STALE: collections.Counter = collections.Counter()


def stale_generation(path: str | None = None) -> int:
    """How often a model loaded from ``path`` (any file: None) was dropped because its file changed under it."""
    if path is None:
        return sum(_STALE.values())
    return _STALE[os.path.realpath(path)]


def _drop(op, state: _FileState | None, what: str) -> None:
    """The file under ``op``'s backup changed: the layer keeps what it holds and refuses to run
    (``ops.stale_error``), the loader re-reads the file on the next prompt, and the user is told once per file."""
    path = state[0] if state else None
    if getattr(op, "prequant_stale", None) is None:
        op.prequant_stale = path or "the checkpoint file"
    key = os.path.realpath(path) if path else ""
    if _STALE[key] == 0:
        log.warning("[prequant] %s changed on disk while its model was loaded with a LoRA (%s): the patched layers "
                    "cannot be restored from it, so that model is dropped; the next prompt loads the file again.",
                    path or "The checkpoint file", what)
    _STALE[key] += 1


class _RebuiltFromFile:
    """A backup entry as ComfyUI reads it (``.weight``, ``.inplace_update``) whose weight is concatenated from the
    memory-mapped rows it was fused from when it is read, then those pages are given back again. The rows' digests,
    taken when they were found equal to the weight, are checked again then, and the file's length first (a truncated
    mapping ends the process on the first touch): a file changed between patch and unpatch is never restored. Never
    raises: ComfyUI reads backups inside its unpatch, where an exception would leave the model half unpatched (and,
    from its prompt worker's unload, stop the worker); the layer is dropped instead (``_drop``)."""
    __slots__ = ("rows", "dtype", "digests", "op", "part", "file")

    def __init__(self, rows: list, dtype: torch.dtype, digests: list, op, part: int, file):
        self.rows, self.dtype, self.digests = tuple(rows), dtype, tuple(digests)
        self.op, self.part, self.file = op, part, file

    @property
    def weight(self) -> torch.Tensor:
        if self.file is not None and self.file.truncated():
            _drop(self.op, self.file, "the file is shorter than when the LoRA was applied")
            return self.op.prequant_parts()[self.part]
        changed = sum(_digest(r) != d for r, d in zip(self.rows, self.digests))
        if changed:
            pages.release(self.rows)
            _drop(self.op, self.file, f"{changed} of {len(self.rows)} fused parts' rows differ")
            return self.op.prequant_parts()[self.part]
        out = torch.cat([r.view(torch.uint8) if r.element_size() == 1 else r for r in self.rows])
        pages.release(self.rows)
        return out.view(self.dtype)

    @property
    def inplace_update(self) -> bool:
        return False


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.element_size() == 1 and b.element_size() == 1:  # fp8 codes may be held as bytes (and may hold NaN)
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def _file_backups(op, originals) -> list | None:
    """Per part, the file's rows that ``originals`` (a fused weight's parts) were copied from, if they still hold
    exactly those bytes (checked, then the pages read are given back); else None: the originals are kept as they are."""
    sources = op.prequant_fused_from
    if not sources or any(t.device.type != "cpu" for t in originals):
        return None
    split = [qtensor.parts(s)[0] if qtensor.is_quantized(s) else None for s in sources]
    if any(sp is None or len(sp) != len(originals) for sp in split):
        return None
    out, maps = [], pages.file_mappings()
    state = _FileState.of(getattr(op, "prequant_fused_file", None))
    for i, orig in enumerate(originals):
        rows, pos, digests = [sp[i] for sp in split], 0, []
        for r in rows:
            n = r.shape[0] if r.ndim else 0
            same = r.ndim == orig.ndim and _same_bytes(orig[pos:pos + n], r)
            if same:
                digests.append(_digest(r))
            pages.release([r], maps)
            if not same:
                return None
            pos += n
        if pos != orig.shape[0]:
            return None
        out.append(_RebuiltFromFile(rows, orig.dtype, digests, op, i, state))
    return out


class PrequantPatching:
    """The pack's hooks, mixed into whichever patcher class ComfyUI's own loaders build (``patcher_for``)."""

    def _prequant_op(self, key):
        mod_name, _, attr = key.rpartition(".")
        if attr != "weight" or not mod_name:
            return None
        try:
            op = comfy.utils.get_attr(self.model, mod_name)
        except AttributeError:
            return None
        return op if is_prequant_linear(op) else None

    def clone(self, *args, **kwargs):
        n = super().clone(*args, **kwargs)
        if not isinstance(n, PrequantPatching):  # ComfyUI builds a non-dynamic delegate as a plain ModelPatcher
            n.__class__ = patcher_class(type(n))
        return n

    def patch_weight_to_device(self, key, device_to=None, inplace_update=False, **kwargs):
        # kwargs: what newer ComfyUIs pass (return_weight for a model save, force_cast for DynamicVRAM's pre-load)
        op = self._prequant_op(key) if key in self.patches else None
        if op is None:
            return super().patch_weight_to_device(key, device_to=device_to, inplace_update=inplace_update, **kwargs)
        if kwargs.get("return_weight"):
            # a save would write the patched codes beside the unpatched scales (another key): a wrong file, refused
            raise UnsupportedFormatError(
                "Saving a pre-quantized model with a LoRA applied is not supported: its codes and scales are patched "
                "together, a save reads them one by one.", expected="a MODEL without LoRA patches",
                found=f"LoRA patches on '{key}'",
                fix="Save without the LoRA node, or keep the LoRA as a separate file applied at load.")
        # Tensors made here outlive this call's inference mode (unpatch may run outside it): make them normal.
        with torch.inference_mode(False), torch.no_grad():
            fresh = key not in self.backup
            originals = op.prequant_parts()
            if fresh:
                # every part under its own name (weight, weight_scale, weight_scale_2): unpatch restores them all
                kept = _file_backups(op, originals) or [_Backup(t, False) for t in originals]
                for name, b in zip(PART_NAMES, kept):
                    self.backup[key[:-len("weight")] + name] = b
            # the originals now live only in the backup: where they are the checkpoint file's own pages, the patch
            # gives those back as it goes (re-read from the file, byte for byte, when unpatch puts them back in use)
            new = lora_rows.patched_parts(op, originals, self.patches[key], key, device_to)
            op.prequant_assign(new, op.prequant_spec)
            del originals, new
            quantize.release_free_memory()  # the blocks' temporaries, which glibc's heap would keep


_CLASSES: dict = {}


def patcher_class(base: type) -> type:
    """``base`` with the pack's hooks (one class per base, so ``clone()``'s ``self.__class__`` stays the same)."""
    cls = _CLASSES.get(base)
    if cls is None:
        cls = _CLASSES[base] = type(f"Prequant{base.__name__}", (PrequantPatching, base), {"__module__": __name__})
    return cls


def core_class() -> type:
    """The class ComfyUI's own loaders build, read at each load: ``main.py`` points ``CoreModelPatcher`` at
    ``ModelPatcherDynamic`` (DynamicVRAM) after this pack may have been imported. ComfyUIs before it: ModelPatcher."""
    mp = comfy.model_patcher
    return getattr(mp, "CoreModelPatcher", mp.ModelPatcher)


def patcher_for(model, *, load_device, offload_device, size: int, plain: bool = False):
    """A patcher around ``model`` of ComfyUI's core class (``plain``: ModelPatcher, what ComfyUI asks of a reload with
    ``disable_dynamic``) with the pack's hooks. A core class may hand back another class for this device
    (``ModelPatcherDynamic`` builds a plain ModelPatcher on a CPU): then that class, hooked."""
    kw = dict(load_device=load_device, offload_device=offload_device, size=size)
    p = patcher_class(comfy.model_patcher.ModelPatcher if plain else core_class())(model, **kw)
    if not isinstance(p, PrequantPatching):
        p = patcher_class(type(p))(model, **kw)
    return p


def describe_class(patcher) -> str:
    """The ComfyUI class managing the MODEL, for the node's text (DynamicVRAM named where it is on)."""
    base = next(c for c in type(patcher).__mro__[1:] if c is not PrequantPatching)
    dynamic = getattr(patcher, "is_dynamic", lambda: False)()
    return f"{base.__name__}{' (DynamicVRAM)' if dynamic else ''}"
