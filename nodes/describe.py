"""What the nodes say they accept, made from the registries the code uses (schemes, containers, families, ComfyUI's
formats), so a description cannot go stale when one of them grows (tests/nodes/test_node_docs.py compares)."""
from __future__ import annotations

from prequant_core import schemes
from prequant_core.formats import comfy_layout, containers


def scheme_names() -> list[str]:
    """The quantization schemes, without their weight-only variants: int8, fp8, nvfp4, mxfp8."""
    return [s.name for s in schemes.registry.all_schemes()]


def schemes_text() -> str:
    return " / ".join(scheme_names())


def containers_text() -> str:
    exts = " and ".join(sorted({c.extension for c in containers.containers()}))
    return f"Unsloth's {exts} files and ComfyUI's own quantized files ({', '.join(comfy_layout.formats())})"
