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


ST_TORCH = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
            "I8": torch.int8, "U8": torch.uint8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64,
            "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}


class LazySafetensors(Mapping):
    """A read-only mapping over a .safetensors file; every access reads that tensor (and only it).

    Tensors are read with plain ``pread`` into private memory rather than through a memory map: a mapped dense
    file stays resident (and counted) as it is touched, while a read tensor is freed as soon as it is quantized.
    """

    def __init__(self, path: str, prefix: str = ""):
        from .formats.safetensors_container import read_header
        index, meta, header_len = read_header(path)  # every offset is checked against the file size
        if "unsloth_format" in meta or any(k.endswith("._weight_qdata") for k in index):
            raise UnsupportedFormatError("This file is already pre-quantized; it cannot serve as the dense model.",
                                         path=path, fix="Pick the dense (bf16) transformer file as the fallback.")
        unknown = sorted({v["dtype"] for v in index.values()} - set(ST_TORCH))
        if unknown:
            raise UnsupportedFormatError(f"Dense file holds tensors of type {unknown}.", path=path)
        self.path = path
        self.prefix = prefix
        self._data_start = 8 + header_len
        self._index = {k[len(prefix):]: v for k, v in index.items() if k.startswith(prefix)}
        self._keys = sorted(self._index, key=lambda k: self._index[k]["data_offsets"][0])  # file order
        self.shapes = {k: tuple(v["shape"]) for k, v in self._index.items()}
        self.dtypes = {k: v["dtype"] for k, v in self._index.items()}

    def __getitem__(self, key):
        info = self._index[key]
        a, b = info["data_offsets"]
        buf = bytearray(b - a)
        try:
            with open(self.path, "rb", buffering=0) as f:
                f.seek(self._data_start + a)
                n = f.readinto(buf)
        except OSError as e:
            raise CorruptCheckpointError(f"Tensor '{key}' could not be read.", path=self.path,
                                         found=f"{type(e).__name__}: {e}") from None
        if n != len(buf):
            raise CorruptCheckpointError(f"Tensor '{key}' is cut short (truncated file).", path=self.path)
        dtype = ST_TORCH[info["dtype"]]
        if not buf:
            return torch.empty(info["shape"], dtype=dtype)
        return torch.frombuffer(buf, dtype=dtype).reshape(info["shape"])

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
    """Open a dense single-file transformer, finding the diffusion model under a known prefix if needed."""
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
