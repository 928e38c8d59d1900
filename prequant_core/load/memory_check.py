"""Memory guard: refuse a checkpoint that cannot fit, with a clear error, before any weight is read.

Loading a model bigger than the memory left ends in the kernel's OOM killer (the whole ComfyUI server dies, every
queued prompt with it) or a CUDA out-of-memory error half-way through placement. This module compares what the
checkpoint declares with what is free and raises ``MemoryBudgetError`` (file, bytes needed, bytes free, the fix)
instead. It is a guard against a load that *cannot* succeed, not a promise that sampling will fit: activations,
text encoders and VAEs come on top and are ComfyUI's business.

The rule
--------
``declared`` is read from the file's index, never from its tensors:

* ``.safetensors``: the sum of the tensors' byte ranges in the header (each range already checked against the file
  size by ``read_header``). In a full ComfyUI checkpoint (keys under ``model.diffusion_model.``) only the diffusion
  model counts: text encoders and VAE in the same file are not loaded by this pack.
* ``.pt`` (current and legacy torchao-v1): the sum of the uncompressed sizes of the archive's ``data/*`` storage
  records, from the zip central directory (no unpickling). A record that declares more than it holds is counted as
  declared: an archive that claims terabytes is refused here rather than trusted further.

Host memory. Files are memory-mapped, so reading does not add a second copy: the host needs what the model holds
once placed, which is ``declared`` (quantized codes and scales as stored; plain tensors are never widened, only
narrowed to bf16). That holds for a GPU load device too: ComfyUI keeps the model on its offload device (the CPU)
whenever it is not on the GPU. The budget is ``psutil.virtual_memory().available`` (free RAM plus reclaimable page
cache, which includes the file's own cached pages) plus free swap: a model that fits only with swapping is slow,
not a crash, so it is not refused. Refused when ``declared + HOST_HEADROOM > budget``.

Device memory. Checked only when the caller names a CUDA load device and the model must sit on it whole
(``lowvram=False``). In ComfyUI's normal, low and no-VRAM modes a model that does not fit is loaded partially and
its remaining weights are streamed per layer, so the caller passes ``lowvram=True`` there and only the host rule
applies; with ``--highvram`` / ``--gpu-only`` the whole model goes to the device. The budget is the driver's free
memory (``torch.cuda.mem_get_info``) plus ``device_reclaimable``: what the caller can release first (ComfyUI unloads
other models before loading a new one). Refused when ``declared > budget``.

Not covered: a container's memory limit (cgroups) is not read; ``psutil`` reports the host's memory there.

Opting out: ``open_checkpoint(..., memory=None)`` (``LoadContext(memory=None)``), or ``PREQUANT_MEMORY_CHECK=0`` in the environment.
Testing without real memory pressure: pass ``Guard(available=lambda: n, device_free=lambda dev: n)``.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Mapping

from ..context import Guard
from ..errors import MemoryBudgetError
from ..units import human_bytes

ENV_VAR = "PREQUANT_MEMORY_CHECK"
_OFF_WORDS = {"0", "false", "no", "off", "n"}


def host_available() -> int:
    """Bytes the host can still give a new model: available RAM (incl. reclaimable cache) plus free swap."""
    import psutil
    return int(psutil.virtual_memory().available) + int(psutil.swap_memory().free)


def cuda_free(device) -> int:
    import torch
    free, _total = torch.cuda.mem_get_info(torch.device(device))
    return int(free)


def enabled(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return env.get(ENV_VAR, "").strip().lower() not in _OFF_WORDS


@dataclasses.dataclass
class Budget:
    path: str
    declared: int
    host_needed: int
    host_available: int
    device: str | None = None
    device_needed: int | None = None
    device_available: int | None = None


def declared_bytes(src) -> int | None:
    """Bytes of tensor data the checkpoint declares, from its index only; None when the index cannot be read
    cheaply (the reader then reports what is wrong with the file). ``src``: a path or an ``OpenedFile``."""
    from ..formats import opened, containers
    with opened(src) as f:
        # missing / empty / not a checkpoint: the same errors the reader raises
        return containers.recognise(f).declared_bytes(f)


def logical_bytes(ckpt) -> int:
    """What the read checkpoint's tensors declare (shape x dtype, scales as used). Views that share storage
    count once per view: moving the model to a device or copying it materialises every view."""
    from ..schemes import qtensor
    total = 0
    for t in ckpt.tensors.values():
        if qtensor.is_quantized(t):
            q, s = t.qdata, t.scale
            total += q.numel() * q.element_size() + max(s.numel(), q.shape[0] if q.ndim else 1) * 4
        else:
            total += t.numel() * t.element_size()
    return total


def check(path: str, declared: int, guard: Guard | None = None) -> Budget:
    """Raise ``MemoryBudgetError`` when ``declared`` bytes cannot be placed; else the figures used."""
    guard = guard or Guard()
    name = os.path.basename(path)
    host_needed = int(declared) + int(guard.headroom)
    host_free = int((guard.available or host_available)())
    budget = Budget(path, int(declared), host_needed, host_free)
    if host_needed > host_free:
        err = MemoryBudgetError(
            f"Not enough free memory to load '{name}': it was not loaded (this check prevents an out-of-memory "
            "crash of the whole server).", path=path,
            expected=f"{human_bytes(host_needed)} of host memory ({human_bytes(declared)} of weights + {human_bytes(guard.headroom)} "
                     "headroom)",
            found=f"{human_bytes(host_free)} free (available RAM + free swap)",
            fix="Free memory (close other programs, or unload models: ComfyUI's 'Unload Models' button / POST /free), "
                "pick a smaller checkpoint (a smaller scheme or model), or add swap. "
                f"{ENV_VAR}=0 skips this check.")
        err.where, err.needed, err.available = "host", host_needed, host_free
        raise err
    if str(getattr(guard.device, "type", guard.device)).split(":")[0] == "cuda" and not guard.lowvram:
        dev_free = int((guard.device_free or cuda_free)(guard.device)) + int(guard.device_reclaimable)
        budget.device, budget.device_needed, budget.device_available = str(guard.device), int(declared), dev_free
        if declared > dev_free:
            err = MemoryBudgetError(
                f"Not enough free memory on {guard.device} to load '{name}' whole: it was not loaded.", path=path,
                expected=f"{human_bytes(declared)} of device memory for the weights",
                found=f"{human_bytes(dev_free)} free on {guard.device}",
                fix="Free device memory (unload other models, close other GPU programs), pick a smaller scheme "
                    "(fp8 / int8 file, or a smaller model), or use the low-VRAM mode (start ComfyUI without "
                    f"--highvram / --gpu-only, or with --lowvram) so weights stream to the GPU. {ENV_VAR}=0 skips "
                    "this check.")
            err.where, err.needed, err.available = "device", int(declared), dev_free
            raise err
    return budget


def check_file(src, guard: Guard | None = None, env: Mapping[str, str] | None = None) -> Budget | None:
    """``check`` with the file's declared bytes. None: check disabled, or the index unreadable (left to the reader)."""
    if not enabled(env):
        return None
    declared = declared_bytes(src)
    if declared is None:
        return None
    return check(getattr(src, "path", src), declared, guard)


def check_declared(ckpt, guard: Guard | None = None, env: Mapping[str, str] | None = None) -> Budget | None:
    """``check`` with what the read tensors declare (``logical_bytes``), before any of their bytes is used: a
    ``.pt`` index counts stored bytes, and views can declare more than is stored."""
    if not enabled(env):
        return None
    return check(ckpt.path, logical_bytes(ckpt), guard)
