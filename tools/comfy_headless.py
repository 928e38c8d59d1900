"""Import the real ComfyUI in-process (no server), with this pack loaded through ComfyUI's own loader.

Which ComfyUI: ``PREQUANT_COMFYUI`` names its root (default: the checkout's ``.comfyui``, ComfyUI 0.3.75, a source
tree started as ``main.py``). A root holding ``comfy_compatibility/`` is the pip-installable distribution of ComfyUI
0.12.1 (``scripts/setup_comfyui012.sh`` builds it in ``.cache/comfyui-0.12``): it is imported from its own venv, whose
python runs the tests (``PREQUANT_COMFYUI_PYTHON``, default ``sys.executable``, starts its servers).
"""
from __future__ import annotations

import asyncio
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMFY = os.path.abspath(os.environ.get("PREQUANT_COMFYUI", os.path.join(ROOT, ".comfyui")))
COMFY_PYTHON = os.environ.get("PREQUANT_COMFYUI_PYTHON", sys.executable)
PACK_MODULE = "ComfyUI-Prequant"
_state = {}


def is_package_layout(root: str = COMFY) -> bool:
    """True for the pip-installable distribution (0.12.1 here): ``comfy.cmd.main``, no top-level ``nodes.py``."""
    return os.path.isdir(os.path.join(root, "comfy_compatibility"))


def link_pack(base_dir: str) -> None:
    """This checkout as ``BASE/custom_nodes/ComfyUI-Prequant``, where ComfyUI looks for custom nodes."""
    os.makedirs(os.path.join(base_dir, "custom_nodes"), exist_ok=True)
    link = os.path.join(base_dir, "custom_nodes", PACK_MODULE)
    if os.path.islink(link) and os.path.realpath(link) != os.path.realpath(ROOT):
        os.remove(link)  # a kept folder (bench --keep) last served by another checkout: serve this one's code
    if not os.path.lexists(link):
        os.symlink(ROOT, link)


def _boot_package(base_dir: str | None, extra_args: tuple):
    """ComfyUI 0.12.1 (pip-installable layout): its own node import, custom nodes from BASE/custom_nodes."""
    import tempfile
    import types
    base_dir = os.path.abspath(base_dir or tempfile.mkdtemp(prefix="comfy_base_"))
    link_pack(base_dir)
    sys.argv = [sys.argv[0], "--cpu", "--base-directory", base_dir, "--disable-auto-launch", *extra_args]
    import comfy
    if not os.path.realpath(comfy.__file__).startswith(os.path.realpath(COMFY) + os.sep):
        raise RuntimeError(f"python imports comfy from {comfy.__file__}, not from {COMFY}: run this ComfyUI's venv")
    import comfy.cli_args  # noqa: F401  (parses sys.argv into the execution context's configuration)
    from comfy.nodes.package import import_all_nodes_in_workspace
    import logging
    root_logger = logging.getLogger()
    level = root_logger.level
    root_logger.setLevel(logging.ERROR)  # extras that need optional packages log tracebacks we do not use
    try:
        exported = import_all_nodes_in_workspace(raise_on_failure=False)
    finally:
        root_logger.setLevel(level)
    if PACK_MODULE not in sys.modules or not any(k.startswith("Prequant") for k in exported.NODE_CLASS_MAPPINGS):
        raise RuntimeError("ComfyUI failed to load the pack (see the log above)")
    # ComfyUI's ``nodes`` shim lists only the base nodes outside a prompt; the tests look nodes up by class name
    from comfy.nodes import base_nodes
    view = types.ModuleType("nodes")
    view.__dict__.update({k: getattr(base_nodes, k) for k in dir(base_nodes) if not k.startswith("__")})
    view.NODE_CLASS_MAPPINGS = exported.NODE_CLASS_MAPPINGS
    view.NODE_DISPLAY_NAME_MAPPINGS = exported.NODE_DISPLAY_NAME_MAPPINGS
    pack = sys.modules[PACK_MODULE]  # the module name this ComfyUI gives a custom-node folder
    _state.update(nodes=view, pack=pack)
    return view, pack


def comfyui_version() -> str:
    """The version string of the ComfyUI that boot() imported."""
    if is_package_layout():
        import comfy
        return comfy.__version__
    try:
        import comfyui_version as v
        return v.__version__
    except ImportError:  # not booted in this process (a test that only starts servers): read the tree's own file
        import re
        with open(os.path.join(COMFY, "comfyui_version.py"), encoding="utf-8") as f:
            return re.search(r'__version__\s*=\s*"([^"]+)"', f.read()).group(1)


def boot(base_dir: str | None = None, extra_args: tuple = ()):
    """Import ComfyUI headless on the CPU; returns (nodes module, pack module). Idempotent."""
    if "nodes" in _state:
        return _state["nodes"], _state["pack"]
    if os.environ.get("PREQUANT_NO_COMFYUI") == "1":  # the core test tier (tests/no_comfyui.py)
        raise RuntimeError("ComfyUI is absent in the core test tier: this test belongs to the ComfyUI tier")
    if is_package_layout():
        return _boot_package(base_dir, extra_args)
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
