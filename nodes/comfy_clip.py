"""A pre-cast text encoder -> ComfyUI's own CLIP: ComfyUI picks its encoder class and tokenizer from the keys (as
CLIPLoader does), builds it on ``meta``, and the file's tensors are assigned into it, so the float8 weights stay
float8 in memory; ComfyUI's manual-cast Linear upcasts each one to the compute dtype as it runs, exactly as it runs
the same weights loaded by CLIPLoader."""
from __future__ import annotations

import re
import warnings

import torch

import comfy.model_management as mm
import comfy.sd
import folder_paths

from prequant_core.errors import ComfyVersionError, CorruptCheckpointError
from prequant_core.load import placement

from .comfy_model import comfy_version

TOKENIZER_KEYS = ("spiece_model", "tekken_model")  # tokenizer data ComfyUI reads from a state dict, not weights


def clip_type(name: str):
    t = getattr(comfy.sd.CLIPType, name, None)
    if t is None:
        raise ComfyVersionError(f"This ComfyUI ({comfy_version()}) has no '{name.lower()}' text-encoder type.",
                                expected=f"comfy.sd.CLIPType.{name}", found=f"ComfyUI {comfy_version()}",
                                fix="Update ComfyUI.")
    return t


def _prefix(model: torch.nn.Module, names: set, sd: dict) -> str:
    """Where ComfyUI loads ``sd`` inside the CLIP model (e.g. ``gemma2_2b.transformer.``): the prefix under which
    most of its keys exist."""
    best, hits = "", -1
    probe = [k for k in sd if "." in k][:64]
    prefixes = {n[: len(n) - len(k)] for k in probe[:8] for n in names if n.endswith(k) and
                (len(n) == len(k) or n[len(n) - len(k) - 1] == ".")}
    for p in prefixes:
        n = sum(1 for k in probe if p + k in names)
        if n > hits:
            best, hits = p, n
    return best


def _fill_unprovided(model: torch.nn.Module, prefix: str) -> None:
    """What a ComfyUI encoder file does not provide under ``prefix`` (e.g. a CLIP-L file without text_projection):
    CLIPLoader leaves those tensors as allocated, so they are allocated here too (zeros rather than whatever memory
    held)."""
    for name, t in list(model.state_dict(keep_vars=True).items()):
        if name.startswith(prefix) and t.is_meta:
            mod_name, _, attr = name.rpartition(".")
            sub = model.get_submodule(mod_name) if mod_name else model
            real = torch.zeros(t.shape, dtype=t.dtype)
            if attr in sub._parameters:
                sub._parameters[attr] = torch.nn.Parameter(real, requires_grad=False)
            else:
                sub._buffers[attr] = real


SIZE_MISMATCH = re.compile(r"size mismatch for ([^:\s]+): copying a param with shape torch\.Size\(\[([^\]]*)\]\) "
                           r"from checkpoint, the shape in current model is torch\.Size\(\[([^\]]*)\]\)")


def _assign(model: torch.nn.Module, sd: dict, path: str | None, strict: bool) -> None:
    entries = dict(model.state_dict(keep_vars=True))
    names = set(entries)
    prefix = _prefix(model, names, sd)
    tensors = {k: v for k, v in sd.items() if k not in TOKENIZER_KEYS and isinstance(v, torch.Tensor)}
    owned = {n[len(prefix):] for n in names if n.startswith(prefix)}
    if strict:
        unexpected = sorted(k for k in tensors if k not in owned)
        if unexpected:
            raise CorruptCheckpointError("The text encoder's tensors do not match ComfyUI's class for it.", path=path,
                                         found=f"{len(unexpected)} unexpected: {', '.join(unexpected[:5])}",
                                         fix="Check the family / component; the file may be another encoder's.")
    for k, v in tensors.items():
        if k not in owned:
            continue  # what ComfyUI's own load_sd ignores too (strict=False)
        ref = entries[prefix + k]
        if tuple(v.shape) != tuple(ref.shape):
            raise CorruptCheckpointError(f"Tensor '{k[:80]}' has shape {tuple(v.shape)}, ComfyUI's encoder expects "
                                         f"{tuple(ref.shape)}.", path=path,
                                         fix="The file is for another encoder size.")
        mod_name, _, attr = (prefix + k).rpartition(".")
        sub = model.get_submodule(mod_name) if mod_name else model
        if attr in sub._parameters:
            # float8 storage kept: ComfyUI's manual cast upcasts per call; plain weights take the model's dtype
            keep = v.dtype == torch.float8_e4m3fn or v.dtype == ref.dtype
            sub._parameters[attr] = torch.nn.Parameter(v if keep else v.to(ref.dtype), requires_grad=False)
        else:
            sub._buffers[attr] = v
    if not strict:
        _fill_unprovided(model, prefix)


def build_clip(state_dicts: list[dict], clip_type_name: str, *, strict: list[bool], path: str | None = None):
    """``state_dicts`` in ComfyUI's key layout (the pre-cast encoder's, plus any ComfyUI encoder files loaded with
    it); ``strict``: per state dict, whether every tensor must land (the pre-cast file) or extra ones are ignored as
    CLIPLoader ignores them (ComfyUI's own files)."""
    sds = [dict(sd) for sd in state_dicts]  # ComfyUI pops and converts entries in place
    with warnings.catch_warnings():  # ComfyUI's own load_sd copies into the meta skeleton: a no-op, by design here
        warnings.filterwarnings("ignore", message=".*copying from a non-meta parameter.*")
        try:
            clip = comfy.sd.load_text_encoder_state_dicts(
                sds, embedding_directory=folder_paths.get_folder_paths("embeddings"),
                clip_type=clip_type(clip_type_name), model_options={"initial_device": torch.device("meta")})
        except RuntimeError as e:
            # torch's load_state_dict inside ComfyUI lists every mismatch: the first one, in words
            m = SIZE_MISMATCH.search(str(e))
            if m is None:
                raise
            raise CorruptCheckpointError(f"Tensor '{m.group(1)[:80]}' has shape ({m.group(2)}), ComfyUI's encoder "
                                         f"expects ({m.group(3)}): the file holds another size of this encoder.",
                                         path=path, expected=f"({m.group(3)})", found=f"({m.group(2)})",
                                         fix="Pick the file hosted for this family (the node's preset), or check "
                                             "the family / component.") from None
    model = clip.cond_stage_model
    for sd, is_strict in zip(sds, strict):
        _assign(model, sd, path, is_strict)
    placement.check_complete(model, path)
    archive = getattr(mm, "archive_model_dtypes", None)
    if archive is not None:  # a newer ComfyUI records each weight's dtype for its own casts: the stored ones now
        archive(model)
    clip.patcher.size = 0  # measured again from the tensors now in place (float8 bytes, not bf16)
    return clip
