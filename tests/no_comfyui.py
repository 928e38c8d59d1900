"""pytest plugin (``-p no_comfyui``): the core tier, run as if ComfyUI were not installed.

``prequant_core`` must work without ComfyUI (the command line, the diffusers loader, other hosts). The dev venv
has no ComfyUI package: the tests reach the checkout's ``.comfyui`` only through ``tools.comfy_headless`` /
``tools.comfy_server``. This plugin takes ``.comfyui`` off ``sys.path`` and sets ``PREQUANT_NO_COMFYUI=1``, which
makes those two refuse to start ComfyUI: a core module that imported ComfyUI, or a core-tier test that needed it,
fails here instead of passing because the checkout happens to have ComfyUI.
"""
from __future__ import annotations

import os
import sys

ENV = "PREQUANT_NO_COMFYUI"


def pytest_configure(config):
    os.environ[ENV] = "1"
    sys.path[:] = [p for p in sys.path if ".comfyui" not in p]
