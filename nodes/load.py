"""Load Prequant Transformer."""
from __future__ import annotations

import logging
import os

import torch

from prequant_core import families, hub, plan as planning, schemes, sources
from prequant_core.errors import PrequantError
from prequant_core.metadata import Request
from prequant_core.units import human_bytes

from . import paths
from .comfy_model import load_checkpoint_as_model
from .quantize_at_load import load_quantized_at_load

log = logging.getLogger("prequant")
AUTO = "auto"


def _summary(opened, model_bytes: int) -> dict:
    ck = opened.checkpoint
    return {"file": os.path.basename(ck.path), "family": opened.family.name, "layout": opened.layout,
            "scheme": ck.metadata.get("scheme") or ",".join(sorted(ck.schemes_found())),
            "base_model_id": ck.metadata.get("base_model_id"), "container": ck.container,
            "quantized_layers": len(ck.quantized_keys), "size_bytes": model_bytes,
            "dense_bytes": ck.dense_nbytes(), "path": "pre-quantized", "notes": list(opened.verdict.notes)}


def _dense_summary(p: planning.Plan, patcher) -> dict:
    from prequant_core.dense import dense_nbytes, open_dense
    quantized = sum(1 for m in patcher.model.diffusion_model.modules() if getattr(m, "prequant_spec", None))
    return {"file": os.path.basename(p.dense_path), "family": p.family.name, "layout": "dense",
            "scheme": p.scheme, "base_model_id": None, "container": "dense safetensors",
            "quantized_layers": quantized, "size_bytes": patcher.model_size(),
            "dense_bytes": dense_nbytes(open_dense(p.dense_path)),
            "path": "quantized at load", "why": p.skipped_because}


def summary_text(s: dict) -> str:
    text = (f"{s['family']} {s['scheme']} from {s['file']} ({s['container']}, {s['layout']} keys): "
            f"{s['quantized_layers']} quantized layers, {human_bytes(s['size_bytes'])} in memory "
            f"(dense {human_bytes(s['dense_bytes'])}); path: {s['path']}")
    for note in s.get("notes") or []:
        text += f" Note: {note}"
    if s["path"] != "pre-quantized":
        why = "; ".join(s.get("why") or []) or "forced by policy"
        text += f" (pre-quantized file skipped: {why})"
    return text


def _progress_bar():
    """Download progress on the node (ComfyUI's own bar), created on the first report."""
    state = {}

    def report(done: int, total: int) -> None:
        import comfy.utils
        total = max(int(total), 1)
        if "bar" not in state:
            state["bar"] = comfy.utils.ProgressBar(total)
        state["bar"].update_absolute(min(int(done), total), total)

    return report


def _memory_guard():
    """The loader's memory check, told where ComfyUI will put the model and what it can unload first."""
    import comfy.model_management as mm
    from prequant_core import memory
    try:
        return memory.Guard(device=mm.get_torch_device(), lowvram=mm.vram_state != mm.VRAMState.HIGH_VRAM,
                            device_reclaimable=sum(m.model_loaded_memory() for m in mm.current_loaded_models))
    except AttributeError:  # a ComfyUI without these internals: the host check still applies
        return memory.Guard()


class PrequantLoadTransformer:
    CATEGORY = "loaders/prequant"
    RETURN_TYPES = ("MODEL",)
    RETURN_NAMES = ("model",)
    FUNCTION = "load"
    DESCRIPTION = ("Loads a pre-quantized (torchao int8 / fp8) diffusion transformer into ComfyUI's own model class "
                   "without ever materialising the dense model.")

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "checkpoint": paths.checkpoint_input(),
            },
            "optional": {
                "path": paths.path_input(),
                "base_model_id": ("STRING", {"default": "", "tooltip": "Refuse the file unless it was built from this "
                                             "base (e.g. Tongyi-MAI/Z-Image-Turbo; the last path part is enough)."}),
                "scheme": ([AUTO] + list(schemes.SCHEMES), {"default": AUTO}),
                "family": ([AUTO] + sorted(families.FAMILIES), {"default": AUTO}),
                # Hub inputs come last so workflows saved before they existed keep their widget order.
                "hub_repo": ("STRING", {"default": "", "tooltip": "Download from this Hugging Face repo when no local "
                             "file is chosen, e.g. unsloth/Z-Image-Turbo-FP8 (uses 'scheme'; auto takes the "
                             "repo's -FP8/-INT8 suffix). Files go to the standard Hugging Face cache."}),
                "preset": (sources.preset_labels(), {"default": sources.PRESET_NONE, "tooltip": "A hosted "
                           "pre-quantized model: fills hub_repo, scheme and family when those are left empty/auto."}),
                "revision": ("STRING", {"default": "", "tooltip": "Branch, tag or commit to download (empty: the "
                             "default branch). A commit hash already downloaded needs no network."}),
                "hf_token": ("STRING", {"default": "", "tooltip": "Only for gated/private repos. Prefer the HF_TOKEN "
                             "environment variable or `hf auth login`: a token typed here is saved in the workflow."}),
                "min_features": ("INT", {"default": schemes.DEFAULT_MIN_FEATURES, "min": 0, "max": 65536,
                                         "tooltip": "Only Linears with in and out features >= this are quantized. A "
                                         "pre-quantized file built with another value is refused; the dense "
                                         "fallback quantizes with it."}),
                "policy": (list(planning.POLICIES), {"default": planning.PREQUANT_ONLY, "tooltip": "What to do "
                           "when the pre-quantized file is missing or refused: fail with the reasons, or quantize "
                           "the dense fallback at load time (same scheme and rules, same output), or always do that."}),
                "dense_fallback": (paths.dense_choices(), {"default": paths.NO_DENSE, "tooltip": "A dense (bf16) "
                                   "transformer .safetensors from models/diffusion_models, quantized while it is read "
                                   "(never whole in memory) when the policy allows."}),
            },
        }

    @classmethod
    def IS_CHANGED(cls, checkpoint, path="", **kw):
        target = path.strip() or paths.resolve(checkpoint)
        if not target:  # Hub source: same inputs, same file (the token is deliberately not part of the key)
            return "hub:" + "|".join(str(kw.get(k, "")) for k in ("hub_repo", "preset", "revision", "scheme",
                                                                  "family", "base_model_id"))
        try:
            st = os.stat(target)
            return f"{target}:{st.st_mtime_ns}:{st.st_size}"
        except (OSError, TypeError):
            return f"{target}"

    def load(self, checkpoint, path="", base_model_id="", scheme=AUTO, family=AUTO, hub_repo="",
             preset=sources.PRESET_NONE, revision="", hf_token="", min_features=schemes.DEFAULT_MIN_FEATURES,
             policy=planning.PREQUANT_ONLY, dense_fallback=paths.NO_DENSE):
        # The whole plan (which file, which path) is decided before anything is loaded, so a refused file never
        # costs the user the model that is resident now.
        src = sources.plan(path.strip() or paths.resolve(checkpoint), hub_repo, family, scheme,
                           base_model_id=base_model_id, revision=revision, preset=preset)
        located, unavailable = None, None
        if policy != planning.DENSE_ONLY:
            try:
                # Order: typed path, listed file, hub_repo / preset, the family's hosted repo.
                located = hub.locate(src, model_dirs=paths.model_dirs(), token=hf_token, progress=_progress_bar())
            except PrequantError as e:
                unavailable = e
        req = Request(scheme=(located.candidate.scheme if located else None) or src.scheme,
                      base_model_id=base_model_id.strip() or None, family=src.family, min_features=min_features)
        # Tensors made under ComfyUI's inference mode could not later be moved or swapped outside it.
        with torch.inference_mode(False), torch.no_grad():
            # The Hugging Face cache is an allowed folder only for the file the Hub step resolved (located.model_dirs).
            p = planning.make_plan(located.path if located else None, req, policy=policy,
                                   dense_path=paths.resolve_dense(dense_fallback),
                                   model_dirs=located.model_dirs if located else paths.model_dirs(),
                                   dense_model_dirs=paths.model_dirs(), unavailable=unavailable,
                                   memory_guard=_memory_guard())
            if p.path == "pre-quantized":
                patcher = load_checkpoint_as_model(p.opened.checkpoint, p.opened.family, p.opened.layout)
                s = _summary(p.opened, patcher.model_size())
            else:
                patcher = load_quantized_at_load(p, progress=_progress_bar())
                s = _dense_summary(p, patcher)
        if located and located.fetched and p.path == "pre-quantized":
            f = located.fetched
            s.update(file=f.filename, source=f"hub:{f.repo}@{f.revision}", downloaded=f.downloaded)
        log.info("[prequant] %s", summary_text(s))
        return {"ui": {"prequant": [s], "text": [summary_text(s)]}, "result": (patcher,)}
