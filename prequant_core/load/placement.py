"""Meta-init placement: a model skeleton built on the ``meta`` device gets the checkpoint's tensors assigned
(never copied into a dense allocation), leftovers are checked, and the module is moved and put in eval mode."""
from __future__ import annotations

from typing import Mapping

import torch

from ..errors import CorruptCheckpointError


def expected_entries(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and persistent buffers: what a strict state dict must provide."""
    return dict(module.state_dict(keep_vars=True))


def assign(module: torch.nn.Module, tensors: Mapping, *, path: str | None = None,
           fill_missing: Mapping[str, str] | None = None, hold_quantized: bool = False,
           cast_plain: torch.dtype | None = None) -> list[tuple[torch.nn.Module, str, object]]:
    """Strictly assign ``tensors`` into ``module`` (shapes checked), then refuse if anything stays on ``meta``.

    Quantized weights become the Parameter themselves, as ``load_state_dict(assign=True)`` does; with
    ``hold_quantized`` they are returned instead as ``(submodule, attr, tensor)`` for the host to store its own way
    (ComfyUI keeps plain tensors: nodes/comfy_model), which then calls ``check_complete``. The host is never called
    from here: the core stays below it. ``fill_missing`` names skeleton entries a file may lack, with how to fill
    them ("ones"/"zeros", or a function of the skeleton entry's shape and dtype).
    """
    from ..schemes import qtensor
    fill_missing = dict(fill_missing or {})
    expected = expected_entries(module)
    missing = [k for k in expected if k not in tensors and k not in fill_missing]
    unexpected = [k for k in tensors if k not in expected]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)}: {', '.join(sorted(missing)[:5])}{' ...' if len(missing) > 5 else ''}")
        if unexpected:
            parts.append(f"unexpected {len(unexpected)}: {', '.join(sorted(unexpected)[:5])}"
                         f"{' ...' if len(unexpected) > 5 else ''}")
        raise CorruptCheckpointError("The checkpoint's tensors do not match the model it describes.", path=path,
                                     found="; ".join(parts),
                                     fix="Check the family / base model; the file may be for another model size.")
    for k, ref in expected.items():
        v = tensors.get(k)
        if v is not None and tuple(v.shape) != tuple(ref.shape):
            raise CorruptCheckpointError(f"Tensor '{k}' has shape {tuple(v.shape)}, the model expects "
                                         f"{tuple(ref.shape)}.", path=path,
                                         fix="The file is for another model size or family.")
    held = []
    for k, ref in expected.items():
        mod_name, _, attr = k.rpartition(".")
        sub = module.get_submodule(mod_name) if mod_name else module
        v = tensors.get(k)
        if v is None:
            how = fill_missing[k]
            if callable(how):  # a value the family computes (MiniMax-H3's rotary frequencies), in the skeleton's dtype
                v = how(ref.shape, ref.dtype)
            else:
                v = (torch.ones if how == "ones" else torch.zeros)(ref.shape, dtype=cast_plain or ref.dtype)
        if qtensor.is_quantized(v):
            if hold_quantized:
                held.append((sub, attr, v))
            else:
                sub._parameters[attr] = torch.nn.Parameter(v, requires_grad=False)
            continue
        # the model's float32 islands (a module ComfyUI declares float32: MiniMax-H3's patch projections, output heads
        # and curve table) stay float32, as ComfyUI's own loader keeps them; the rest takes the load's dtype
        want = ref.dtype if ref.dtype == torch.float32 and cast_plain is not None and ref.dtype != cast_plain \
            else cast_plain
        if want is not None and v.is_floating_point() and v.dtype != want:
            v = v.to(want)
        if attr in sub._parameters:
            sub._parameters[attr] = torch.nn.Parameter(v, requires_grad=False)
        else:
            sub._buffers[attr] = v
    if not hold_quantized:
        check_complete(module, path)
    return held


def check_complete(module: torch.nn.Module, path: str | None = None) -> None:
    """Refuse a module that still has a tensor on ``meta`` (nothing in the file provided it)."""
    leftover = [n for n, t in list(module.named_parameters()) + list(module.named_buffers()) if t.is_meta]
    if leftover:
        raise CorruptCheckpointError(f"{len(leftover)} model tensors were not provided by the file and cannot be "
                                     f"rebuilt: {', '.join(leftover[:5])}", path=path)


def place(module: torch.nn.Module, tensors: Mapping, device="cpu", **kw) -> torch.nn.Module:
    """``assign`` + move + eval, for plain torch modules such as a diffusers skeleton built on ``meta``.

    Build skeletons so that non-persistent buffers are computed on a real device (ComfyUI's ops take ``device=``
    per layer and leave other tensors real); ``assign`` refuses anything still on ``meta``.
    """
    assign(module, tensors, **kw)
    return module.to(device).eval()
