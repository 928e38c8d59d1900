"""What the command line offers, importable without torch, so that ``--help`` and argument errors answer at once
(importing torch and torchao takes seconds). Family names come from the family registry itself (torch-free); the
container and component lists restate ``formats/containers`` and ``text_encoders/checks.py``, and tests/cli/test_cli.py
fails until a name added there is named here too."""
from __future__ import annotations

import argparse

from ..scheme_names import DEFAULT, DEFAULT_MIN_FEATURES, NAMES as SCHEMES, WEIGHT_ONLY_TAIL, spelling  # noqa: F401

NATIVE = "comfyui-native"
BUILD_CONTAINERS = ("safetensors", "pt", NATIVE)
ENCODER_CONTAINERS = ("safetensors", "pt")
ENCODER_COMPONENTS = ("text_encoder", "text_encoder_2", "text_encoder_3", "text_encoder_4")


def scheme(text: str) -> str:
    """argparse ``type=`` of every ``--scheme``: ``verify`` and ``build`` answer a bad one alike."""
    s = spelling(text, tuple(n for n in SCHEMES if WEIGHT_ONLY_TAIL not in n))
    if s not in SCHEMES:
        raise argparse.ArgumentTypeError(f"unknown quantization scheme '{text}'; pick one of: {', '.join(SCHEMES)}")
    return s


def families() -> list[str]:
    from .. import families as registry
    return sorted(registry.FAMILIES)


def accepted_families() -> list[str]:
    """The families and the other names they go by (``ltx-2.3`` for ``ltx-2``), for argument checking."""
    from .. import families as registry
    return sorted([*registry.FAMILIES, *registry.aliases()])


def encoder_families() -> list[str]:
    from .. import families as registry
    return sorted(n for n, f in registry.FAMILIES.items() if f.hosting.text_encoders)
