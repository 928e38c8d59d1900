"""Building pre-quantized checkpoints from dense weights: quantize with the scheme's filter, record every
metadata field, write atomically (temp file in the same folder, fsync, rename)."""
from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Callable, Iterable, Mapping

import torch

from . import fingerprint, qtensor, schemes
from .checkpoint import FORMAT_V1
from .errors import BuildError
from .families import Family

ProgressFn = Callable[[int, int], None]


def linear_weight_keys(tensors: Mapping) -> list[str]:
    """Keys that are Linear weights: 2-D ``*.weight`` tensors (transformers here have no 2-D non-Linear weights)."""
    return [k for k, v in tensors.items() if k.endswith(".weight") and getattr(v, "ndim", 0) == 2]


def quantize_tensors(tensors: Mapping, scheme: str, *, min_features: int = schemes.DEFAULT_MIN_FEATURES,
                     exclude: Iterable[str] = (), progress: ProgressFn | None = None,
                     dtype: torch.dtype | None = torch.bfloat16) -> tuple[dict, list[str]]:
    """Quantize every Linear weight the filter admits; cast other float tensors to ``dtype``.

    Works one tensor at a time, so peak memory is the input plus one layer.
    """
    flt = schemes.LayerFilter(schemes.normalize(scheme), min_features, tuple(exclude))
    linear = set(linear_weight_keys(tensors))
    out, skipped = {}, []
    total = len(tensors)
    for i, (k, v) in enumerate(tensors.items()):
        if dtype is not None and v.is_floating_point() and v.dtype != dtype:
            v = v.to(dtype)
        if k in linear:
            why = flt.reason_skipped(k[: -len(".weight")], v)
            if why is None:
                v = schemes.quantize_weight(v.contiguous(), flt.scheme)
            else:
                skipped.append(k)
        out[k] = v
        if progress:
            progress(i + 1, total)
    return out, skipped


def make_metadata(*, family: Family, scheme: str, base_model_id: str, min_features: int, exclude: list[str],
                  tensors: Mapping, skipped: list[str]) -> dict:
    import torchao
    rule = schemes.rules(scheme)
    try:
        import diffusers
        diffusers_version = str(diffusers.__version__)
    except ImportError:
        diffusers_version = None
    return {
        "base_model_id": base_model_id, "family": family.name, "scheme": rule.name, "component": "transformer",
        "min_features": int(min_features), "exclude_name_tokens": sorted(exclude),
        "require_bf16": rule.require_bf16, "require_divisible": rule.require_divisible,
        "fast_accum": rule.fast_accum, "fp8_granularity": rule.fp8_granularity,
        "fingerprint": fingerprint.compute(tensors, skipped), "torch_dtype": "bfloat16", "quant_backend": "torchao",
        "transformer_class": family.diffusers_class,
        # plain str: torch.__version__ pickles as TorchVersion, which strict readers may refuse
        "torch_version": str(torch.__version__), "torchao_version": str(torchao.__version__),
        "diffusers_version": diffusers_version,
    }


@contextlib.contextmanager
def atomic_output(dest: str, *, overwrite: bool = False):
    """Yield a temp path beside ``dest``; on success fsync + rename onto ``dest``, on any failure remove it."""
    dest = os.path.abspath(dest)
    folder = os.path.dirname(dest)
    if os.path.exists(dest) and not overwrite:
        raise BuildError("The output file already exists; it was left untouched.", path=dest,
                         fix="Choose another filename, or allow overwriting.")
    if not os.path.isdir(folder):
        raise BuildError("The output folder does not exist.", path=folder, fix="Create it or pick another folder.")
    fd, tmp = tempfile.mkstemp(prefix=".prequant-", suffix=".partial", dir=folder)
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, dest)
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


def write_checkpoint(dest: str, tensors: Mapping, metadata: dict, *, container: str = "safetensors",
                     overwrite: bool = False) -> str:
    tensors = dict(tensors)
    with atomic_output(dest, overwrite=overwrite) as tmp:
        if container == "safetensors":
            from safetensors.torch import save_file
            from .formats.safetensors_container import flatten
            flat, header = flatten(tensors, format_tag=FORMAT_V1, metadata=metadata)
            save_file(flat, tmp, metadata=header)
        elif container == "pt":
            torch.save({"format": FORMAT_V1, "metadata": metadata,
                        "state_dict": {k: (v if qtensor.is_quantized(v) else v.contiguous()) for k, v in tensors.items()}},
                       tmp)
        else:
            raise BuildError(f"Unknown output container '{container}'.", expected="safetensors or pt")
    return os.path.abspath(dest)


def build_from_tensors(dest: str, dense: Mapping, *, family: Family, scheme: str, base_model_id: str,
                       min_features: int = schemes.DEFAULT_MIN_FEATURES, container: str = "safetensors",
                       overwrite: bool = False, progress: ProgressFn | None = None) -> str:
    """Dense state dict (diffusers layout) -> pre-quantized checkpoint file."""
    scheme = schemes.normalize(scheme)
    exclude = schemes.exclude_tokens(scheme, family.int8_exclude_extra)
    q, skipped = quantize_tensors(dense, scheme, min_features=min_features, exclude=exclude, progress=progress)
    meta = make_metadata(family=family, scheme=scheme, base_model_id=base_model_id, min_features=min_features,
                         exclude=exclude, tensors=q, skipped=skipped)
    return write_checkpoint(dest, q, meta, container=container, overwrite=overwrite)
