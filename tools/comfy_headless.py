"""Import the real ComfyUI in-process (no server), with this pack loaded through ComfyUI's own loader."""
from __future__ import annotations

import asyncio
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMFY = os.environ.get("PREQUANT_COMFYUI", os.path.join(ROOT, ".comfyui"))
PACK_MODULE = "ComfyUI-Prequant"
_state = {}


def boot(base_dir: str | None = None, extra_args: tuple = ()):
    """Import ComfyUI headless on the CPU; returns (nodes module, pack module). Idempotent."""
    if "nodes" in _state:
        return _state["nodes"], _state["pack"]
    if os.environ.get("PREQUANT_NO_COMFYUI") == "1":  # the core test tier (tests/no_comfyui.py)
        raise RuntimeError("ComfyUI is absent in the core test tier: this test belongs to the ComfyUI tier")
    if not os.path.isfile(os.path.join(COMFY, "comfyui_version.py")):
        raise RuntimeError(f"No ComfyUI at {COMFY}: run scripts/setup_dev.sh first")
    if COMFY not in sys.path:
        sys.path.insert(0, COMFY)
    sys.argv = [sys.argv[0], "--cpu", *(["--base-directory", base_dir] if base_dir else []), *extra_args]
    import comfy.options
    comfy.options.enable_args_parsing()
    import comfy.cli_args  # noqa: F401
    import utils.extra_config  # noqa: F401  (before nodes: nodes.py puts comfy/ first on sys.path)
    import nodes
    pack_dir = os.path.join(COMFY, "custom_nodes", PACK_MODULE)
    if not os.path.isdir(pack_dir):
        pack_dir = ROOT
    ok = nodes.load_custom_node(pack_dir, module_parent="custom_nodes")
    if asyncio.iscoroutine(ok):
        ok = asyncio.run(ok)
    if not ok:
        raise RuntimeError("ComfyUI failed to load the pack (see the log above)")
    import logging
    root_logger = logging.getLogger()
    level = root_logger.level
    root_logger.setLevel(logging.ERROR)  # extras that need torchaudio & co. log tracebacks we do not use
    try:
        init = nodes.init_extra_nodes(init_custom_nodes=False)
        if asyncio.iscoroutine(init):
            asyncio.run(init)
    except TypeError:
        pass
    finally:
        root_logger.setLevel(level)
    pack = sys.modules[pack_dir.replace(".", "_x_")]  # the module name ComfyUI gives a custom-node folder
    _state.update(nodes=nodes, pack=pack)
    return nodes, pack
