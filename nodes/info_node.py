"""Prequant Info: what a checkpoint is (format, scheme, family, base, sizes, verdict) before loading it."""
from __future__ import annotations

import logging
import os

from prequant_core import schemes
from prequant_core.errors import PrequantError
from prequant_core.report import info
from prequant_core.request import Request

from . import describe, paths
from .status import NodeStatus

log = logging.getLogger("prequant")
ANY = "any"


class PrequantInfo:
    CATEGORY = "loaders/prequant"
    RETURN_TYPES = ("STRING",)
    RETURN_NAMES = ("report",)
    OUTPUT_TOOLTIPS = ("The same report as text (one line per field, the verdict first).",)
    FUNCTION = "inspect"
    OUTPUT_NODE = True
    SEARCH_ALIASES = [*describe.scheme_names(), "quantized", "pre-quantized", "prequant", "unsloth", "torchao",
                      "inspect",
                      "checkpoint info", "verify"]
    DESCRIPTION = (f"Shows what a pre-quantized ({describe.schemes_text()}; " + describe.containers_text() + ") "
                   "checkpoint is "
                   "without loading it: format, scheme, family, base model, quantized and dense sizes, the saving, "
                   "recorded versions, and whether it matches the base model and scheme you give, with the reasons "
                   "when it would not load. Reads the file's header / index (a ComfyUI-native file whole, to check "
                   "its scales).")

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "checkpoint": paths.checkpoint_input(none=paths.INFO_NONE_CHOICE),
            },
            "optional": {
                "base_model_id": ("STRING", {"default": "", "tooltip": "Judge the file against this base model "
                                             "(e.g. Tongyi-MAI/Z-Image-Turbo; the last path part is enough)."}),
                "scheme": ([ANY] + list(schemes.names()), {"default": ANY,
                                                           "tooltip": "Judge the file against this scheme."}),
                "verify_fingerprint": ("BOOLEAN", {"default": False, "tooltip": "Also hash every quantized weight "
                                                   "against the recorded fingerprint (reads the whole file)."}),
                # Expert input last (web/prequant.js maps workflows saved with the earlier order by name).
                "path": paths.path_input(" (e.g. the output of Build Prequant Checkpoint)"),
            },
            "hidden": {"unique_id": "UNIQUE_ID"},  # where the status line goes (nodes/status.py)
        }

    @classmethod
    def VALIDATE_INPUTS(cls, checkpoint):
        """ComfyUI's list check for ``checkpoint``, plus the loader's "(none: ...)" entry that workflows saved
        before Info had its own first entry still carry."""
        if checkpoint is None or checkpoint in paths.NONE_CHOICES:  # None: linked from another node
            return True
        if checkpoint in paths.choices(paths.INFO_NONE_CHOICE):
            return True
        return f"'{checkpoint}' is not in the checkpoint list (models/prequant, models/diffusion_models)"

    @classmethod
    def IS_CHANGED(cls, checkpoint, path="", **kw):
        target = (path or "").strip() or paths.resolve(checkpoint)
        try:
            st = os.stat(target)
            return f"{target}:{st.st_mtime_ns}:{st.st_size}"
        except (OSError, TypeError):
            return f"{target}"

    def inspect(self, checkpoint, path="", base_model_id="", scheme=ANY, verify_fingerprint=False, unique_id=None):
        target = (path or "").strip() or paths.resolve(checkpoint)
        if not target:
            raise PrequantError("No checkpoint chosen.", fix="Pick a file in 'checkpoint', or fill 'path'.")
        req = Request(scheme=None if scheme in (ANY, "", None) else scheme,
                      base_model_id=(base_model_id or "").strip() or None)
        NodeStatus(unique_id).say(
            f"verifying the fingerprint of {os.path.basename(target)} (reads every quantized weight)"
            if verify_fingerprint else f"reading the header of {os.path.basename(target)}")
        # the loader's own open and judge steps: allowlist, one handle, the memory guard, the same verdict
        report = info(target, None if req.scheme is None and req.base_model_id is None else req,
                      verify_fingerprint=bool(verify_fingerprint), model_dirs=paths.model_dirs())
        text = report.to_text()
        log.info("[prequant] %s", text)
        return {"ui": {"prequant_info": [report.to_dict()], "text": [text]}, "result": (text,)}
