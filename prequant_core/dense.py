"""Dense (bf16 / fp16 / fp32) transformer files, read lazily one tensor at a time.

Used by load-time quantization (the fallback) and by the builder, so that the dense model is never whole in
memory: each tensor is read from the memory-mapped file, quantized, and its dense copy dropped.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

import torch

from .errors import CorruptCheckpointError, UnsupportedFormatError

# Single-file checkpoints often carry the diffusion model under a prefix.
KNOWN_PREFIXES = ("model.diffusion_model.", "diffusion_model.", "transformer.")


class LazySafetensors(Mapping):
    """A read-only mapping over a .safetensors file; every access reads that tensor (and only it)."""

    def __init__(self, path: str, prefix: str = ""):
        from safetensors import safe_open
        from .formats.safetensors_container import read_header
        index, meta, _ = read_header(path)  # bounds-checked before the library maps the file
        if "unsloth_format" in meta or any(k.endswith("._weight_qdata") for k in index):
            raise UnsupportedFormatError("This file is already pre-quantized; it cannot serve as the dense model.",
                                         path=path, fix="Pick the dense (bf16) transformer file as the fallback.")
        self.path = path
        self._f = safe_open(path, framework="pt", device="cpu")
        self.prefix = prefix
        self._keys = [k[len(prefix):] for k in self._f.keys() if k.startswith(prefix)]
        self.shapes = {k[len(prefix):]: tuple(v["shape"]) for k, v in index.items() if k.startswith(prefix)}
        self.dtypes = {k[len(prefix):]: v["dtype"] for k, v in index.items() if k.startswith(prefix)}

    def __getitem__(self, key):
        try:
            return self._f.get_tensor(self.prefix + key)
        except Exception as e:  # noqa: BLE001 - the library's own error types
            raise CorruptCheckpointError(f"Tensor '{key}' could not be read.", path=self.path,
                                         found=f"{type(e).__name__}: {str(e)[:200]}") from None

    def __iter__(self):
        return iter(self._keys)

    def __len__(self):
        return len(self._keys)

    def nbytes(self) -> int:
        sizes = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I8": 1, "U8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
                 "I16": 2, "I32": 4, "I64": 8, "BOOL": 1}
        total = 0
        for k, shape in self.shapes.items():
            n = 1
            for d in shape:
                n *= d
            total += n * sizes.get(self.dtypes[k], 4)
        return total


def open_dense(path: str) -> LazySafetensors:
    if not os.path.isfile(path):
        from .errors import CheckpointNotFoundError
        raise CheckpointNotFoundError("Dense model file not found.", path=path,
                                      fix="Put the dense transformer into ComfyUI/models/diffusion_models/.")
    if not path.endswith(".safetensors"):
        raise UnsupportedFormatError("Dense fallback files must be .safetensors (pickled .ckpt/.pt/.bin files are "
                                     "not opened: they could run code).", path=path,
                                     fix="Use the .safetensors release of the model.")
    probe = LazySafetensors(path)
    keys = list(probe)
    for p in KNOWN_PREFIXES:
        if keys and sum(k.startswith(p) for k in keys) > len(keys) // 2:
            return LazySafetensors(path, prefix=p)
    return probe


def stream_quantized(dense: Mapping, scheme: str, *, min_features: int, exclude, progress=None,
                     dtype: torch.dtype | None = torch.bfloat16) -> tuple[dict, list[str]]:
    """Quantize while reading: the same filter and configs as the builder (build.quantize_tensors)."""
    from .build import quantize_tensors
    return quantize_tensors(dense, scheme, min_features=min_features, exclude=exclude, progress=progress,
                            dtype=dtype)
