"""Which ComfyUI the ComfyUI tier runs: scripts/test.sh runs it on 0.33.0 (.cache/comfyui-0.33), 0.3.75
(.comfyui) and 0.12.1 (.cache/comfyui-0.12) and names the version each leg must find in PREQUANT_EXPECT_COMFYUI."""
from __future__ import annotations

import os

from tools.comfy_server import ComfyServer

KNOWN = ("0.33.0", "0.3.75", "0.12.1")


def expected() -> str | None:
    return os.environ.get("PREQUANT_EXPECT_COMFYUI") or None


def test_in_process_comfyui_version(comfy):
    from tools import comfy_headless
    _, pack = comfy
    version = comfy_headless.comfyui_version()
    assert version == (expected() or version) and version in KNOWN, version
    # the pack reads the same version (its messages name it), from ComfyUI itself
    assert pack.nodes.comfy_model.comfy_version() == version
    import comfy.model_management as mm  # (0.3.75's ``comfy`` is a namespace package: no __file__ of its own)
    assert os.path.realpath(mm.__file__).startswith(os.path.realpath(comfy_headless.COMFY) + os.sep)


def test_server_comfyui_version(tmp_path):
    with ComfyServer(str(tmp_path / "server")) as srv:
        stats = srv.get("/system_stats")
        version = stats["system"]["comfyui_version"]
        assert version == (expected() or version) and version in KNOWN, version
        assert "PrequantLoadTransformer" in srv.get("/object_info/PrequantLoadTransformer")
