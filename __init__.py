"""ComfyUI-Prequant: load pre-quantized (torchao int8 / fp8) diffusion transformers in ComfyUI."""
import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
# prequant_core is a standalone package (command line, other tools); make it importable by its own name.
# Appended, not prepended: this folder's nodes/ must never shadow ComfyUI's own top-level nodes module.
if _here not in sys.path:
    sys.path.append(_here)

WEB_DIRECTORY = "./web"

if importlib.util.find_spec("folder_paths") is not None:
    from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS
else:  # imported outside ComfyUI (e.g. by a test runner collecting this folder): nothing to register
    NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = {}, {}

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "WEB_DIRECTORY"]
