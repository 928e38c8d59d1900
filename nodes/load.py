"""Load Prequant Transformer."""
from __future__ import annotations

import logging
import os

import torch

from prequant_core import families, hub, schemes, sources
from prequant_core.errors import PrequantError
from prequant_core.loader import open_checkpoint
from prequant_core.metadata import Request

from . import paths
from .comfy_model import load_checkpoint_as_model

log = logging.getLogger("prequant")
AUTO = "auto"


def _summary(opened, model_bytes: int) -> dict:
    ck = opened.checkpoint
    return {"file": os.path.basename(ck.path), "family": opened.family.name, "layout": opened.layout,
            "scheme": ck.metadata.get("scheme") or ",".join(sorted(ck.schemes_found())),
            "base_model_id": ck.metadata.get("base_model_id"), "container": ck.container,
            "quantized_layers": len(ck.quantized_keys), "size_bytes": model_bytes,
            "dense_bytes": ck.dense_nbytes(), "path": "pre-quantized"}


def summary_text(s: dict) -> str:
    gib = lambda b: f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.1f} MiB"  # noqa: E731
    return (f"{s['family']} {s['scheme']} from {s['file']} ({s['container']}, {s['layout']} keys): "
            f"{s['quantized_layers']} quantized layers, {gib(s['size_bytes'])} in memory "
            f"(dense {gib(s['dense_bytes'])})")


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
                "checkpoint": (paths.choices(), {"tooltip": "A file from models/prequant (or a pre-quantized file "
                                                            "in models/diffusion_models)."}),
            },
            "optional": {
                "path": ("STRING", {"default": "", "tooltip": "Explicit file path instead of the list. Outside the "
                                    "model folders it must lie under PREQUANT_ALLOW_LOCAL_PATH."}),
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
             preset=sources.PRESET_NONE, revision="", hf_token=""):
        # Order: typed path, listed file, hub_repo / preset, the family's hosted repo (prequant_core.sources).
        plan = sources.plan(path.strip() or paths.resolve(checkpoint), hub_repo, family, scheme,
                            base_model_id=base_model_id, revision=revision, preset=preset)
        located = hub.locate(plan, model_dirs=paths.model_dirs(), token=hf_token, progress=_progress_bar())
        req = Request(scheme=located.candidate.scheme or plan.scheme, base_model_id=base_model_id.strip() or None,
                      family=plan.family)
        # Tensors made under ComfyUI's inference mode could not later be moved or swapped outside it.
        with torch.inference_mode(False), torch.no_grad():
            # The Hugging Face cache is an allowed folder only for the file the Hub step resolved (located.model_dirs).
            opened = open_checkpoint(located.path, req, model_dirs=located.model_dirs)
            patcher = load_checkpoint_as_model(opened.checkpoint, opened.family, opened.layout)
        s = _summary(opened, patcher.model_size())
        if located.fetched:
            f = located.fetched
            s.update(file=f.filename, source=f"hub:{f.repo}@{f.revision}", downloaded=f.downloaded)
        log.info("[prequant] %s", summary_text(s))
        return {"ui": {"prequant": [s], "text": [summary_text(s)]}, "result": (patcher,)}
