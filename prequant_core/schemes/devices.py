"""Which matmul a quantized Linear runs on a device, decided once at load (docs/FORMAT.md section 8).

Two paths, same file, same weights:

* ``quantized``: torchao's matmul with dynamic activation quantization, what ``quantize_`` with the scheme's config
  computes. fp8 needs a CUDA GPU of compute capability >= 8.9 (``_scaled_mm`` on fp8 tensor cores); int8 needs
  int8 GEMM support, which CUDA GPUs have from compute capability 7.5 (``torch._int_mm``); on a CPU the same
  integer sums come from ``torch._int_mm`` where it is exact there, else from exact float32 pieces (``int8_cpu``:
  torchao's result either way, without torchao's own CPU path, an int32 matmul without BLAS).
* ``weight-only``: each Linear's rows are dequantized (``codes * scale``) to the compute dtype at matmul time and a
  dense ``F.linear`` runs. Works on every device torch runs on. Where a device has no float8 dtype at all (Apple
  MPS, and other non-CUDA accelerators to be safe), fp8 codes are kept as their raw bytes (uint8) and decoded through
  a 256-entry table: exact, since every e4m3 value is one table entry.

``choose`` is a pure function of what the weight is and what the device is; ``describe`` reads the device once.
Nothing here imports ComfyUI.
"""
from __future__ import annotations

import dataclasses
import os

from .. import schemes
from ..errors import ValidationError

QUANTIZED = "quantized"
WEIGHT_ONLY = "weight-only"
AUTO = "auto"
PATHS = (QUANTIZED, WEIGHT_ONLY)
ENV = "PREQUANT_MATMUL"

FP8_STORAGE_TYPES = ("cpu", "cuda")  # device types whose torch kernels take float8 tensors (copies, casts)
# The compute capability each scheme's quantized matmul needs is its record's ``min_capability`` (schemes/): int8
# 7.5 (Turing's int8 tensor cores behind torch._int_mm), fp8 8.9 (Ada / Hopper: what torchao's fp8 config asserts),
# nvfp4 / mxfp8 10.0 (Blackwell's block-scaled tensor cores behind torchao's kernels).


@dataclasses.dataclass(frozen=True)
class Device:
    """What the decision needs to know about the device the model computes on."""
    type: str  # torch device type: "cuda", "cpu", "mps", "xpu", ...
    capability: tuple[int, int] | None = None  # CUDA compute capability (NVIDIA only)
    hip: bool = False  # a ROCm build: AMD GPUs also report the device type "cuda"
    name: str = ""

    def holds_float8(self) -> bool:
        return self.type in FP8_STORAGE_TYPES

    def label(self) -> str:
        if self.type == "cuda" and self.hip:
            return f"AMD GPU{' ' + self.name if self.name else ''} (ROCm)"
        if self.type == "cuda":
            cap = f", compute capability {self.capability[0]}.{self.capability[1]}" if self.capability else ""
            return f"NVIDIA GPU{' ' + self.name if self.name else ''}{cap}"
        return {"cpu": "CPU", "mps": "Apple GPU (MPS)", "xpu": "Intel GPU (XPU)"}.get(self.type, self.type)


@dataclasses.dataclass(frozen=True)
class MatmulChoice:
    path: str  # QUANTIZED | WEIGHT_ONLY
    kind: str  # "int8" | "float8"
    dynamic: bool  # the weight carries dynamic activation quantization (int8 / fp8 schemes)
    reason: str
    codes_as_bytes: bool = False  # fp8 codes stored as uint8 (the device has no float8 dtype)

    def text(self) -> str:
        extra = "; fp8 codes kept as bytes, decoded by table" if self.codes_as_bytes else ""
        return f"{self.path} matmul ({self.reason}{extra})"


def choose(kind: str, dynamic: bool, device: Device, override: str | None = None) -> MatmulChoice:
    """The matmul for weights of ``kind`` ("int8" / "float8") on ``device``.

    ``dynamic``: the weight was made with dynamic activation quantization (the ``int8`` / ``fp8`` schemes); weight-only
    schemes always run weight-only. ``override`` ("quantized" / "weight-only" / "auto" or None) is the user's
    ``PREQUANT_MATMUL``; forcing "quantized" where the device lacks the kernels is the user's call and is said so.
    """
    if kind not in schemes.registry.kinds():
        raise ValueError(f"unknown quantized weight kind {kind!r}")
    s = schemes.registry.by_kind(kind)
    scheme = s.label(weight_only=not dynamic and s.weight_only) if dynamic or s.weight_only \
        else f"{s.name} (weights only)"
    where = device.label()
    # per-block kinds (nvfp4, mxfp8) dequantize by table on any device: their weight-only path is said as such
    wo = ": dequantized at matmul" if s.block_size else ""
    if schemes.registry.codec(kind).float8_codes and not device.holds_float8():  # nothing fp8 can run or sit there
        return MatmulChoice(WEIGHT_ONLY, kind, dynamic, f"{scheme} on {where}: no float8 dtype on {device.type}",
                            codes_as_bytes=True)
    if not dynamic:
        return MatmulChoice(WEIGHT_ONLY, kind, dynamic, f"{scheme} on {where}{wo}" if wo else
                            f"{scheme} file: weights only, on {where}")
    if override == WEIGHT_ONLY:
        return MatmulChoice(WEIGHT_ONLY, kind, dynamic, f"{ENV}=weight-only, {scheme} on {where}{wo}")
    if override == QUANTIZED:
        return MatmulChoice(QUANTIZED, kind, dynamic, f"{ENV}=quantized, {scheme} on {where}")
    ok, why = _supported(kind, device)
    return MatmulChoice(QUANTIZED if ok else WEIGHT_ONLY, kind, dynamic, f"{scheme} on {where}: {why}")


def _supported(kind: str, device: Device) -> tuple[bool, str]:
    s = schemes.registry.by_kind(kind)
    need = s.min_capability or (99, 0)  # a scheme without a known kernel never runs quantized on a GPU
    if s.block_size:  # torchao's native NVFP4 / MX matmuls: Blackwell; elsewhere decoded by table
        cap = tuple(device.capability or (0, 0))
        if device.type == "cuda" and not device.hip and cap >= need:
            return True, f"native {kind} matmul (compute capability {cap[0]}.{cap[1]} >= {need[0]}.{need[1]})"
        return False, (f"dequantized at matmul (native {kind} needs an NVIDIA GPU of compute capability >= "
                       f"{need[0]}.{need[1]})")
    what = s.name
    if device.type == "cuda" and not device.hip:
        cap = device.capability or (0, 0)
        have = f"{cap[0]}.{cap[1]}"
        if tuple(cap) >= need:
            return True, f"{what} matmul supported (compute capability {have} >= {need[0]}.{need[1]})"
        return False, f"{what} matmul needs compute capability >= {need[0]}.{need[1]}, this GPU has {have}"
    if device.type == "cpu":
        if s.codec.cpu_matmul:
            return True, s.codec.cpu_matmul
        return False, f"CPUs have no {what} matmul (torchao would emulate it)"
    if device.type == "cuda" and device.hip:
        return False, "torchao's per-row int8/fp8 matmuls are not used on ROCm"
    return False, f"no torchao {what} matmul on {device.type}"


def override_from_env(environ=None) -> str | None:
    """``PREQUANT_MATMUL`` (auto / quantized / weight-only), or None when unset or auto."""
    raw = (environ if environ is not None else os.environ).get(ENV, "")
    v = raw.strip().lower().replace("_", "-")
    if v in ("", AUTO):
        return None
    if v in PATHS:
        return v
    raise ValidationError(f"{ENV} has a value this pack does not know.", expected="auto, quantized or weight-only",
                          found=raw, fix=f"Set {ENV} to one of the expected values, or unset it.")


def describe(torch_device) -> Device:
    """Read what ``choose`` needs from a torch device (the only function here that asks torch about hardware)."""
    import torch
    dev = torch.device(torch_device)
    if dev.type != "cuda":
        return Device(dev.type)
    hip = bool(getattr(torch.version, "hip", None))
    try:
        cap = tuple(torch.cuda.get_device_capability(dev))
        name = torch.cuda.get_device_name(dev)
    except Exception:  # noqa: BLE001 - a driver that cannot answer: treat as the oldest GPU (weight-only)
        cap, name = None, ""
    return Device("cuda", capability=cap, hip=hip, name=name)
