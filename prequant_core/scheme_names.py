"""Scheme names as text, importable without torch: the command line checks ``--scheme`` with them before torch
loads. The records in ``schemes/`` are the registry; ``NAMES`` restates their names in its order, and
tests/test_cli.py fails until a scheme added there is named here too."""
from __future__ import annotations

WEIGHT_ONLY_TAIL = "-weight-only"
NAMES = ("int8", "fp8", "nvfp4", "mxfp8", "int8" + WEIGHT_ONLY_TAIL, "fp8" + WEIGHT_ONLY_TAIL)
DEFAULT_MIN_FEATURES = 512


def spelling(text: str, plain) -> str:
    """A scheme name as a user may type it (``INT8``, ``int8_wo``, ``fp8-wo``) in the spelling files record;
    ``plain``: the names without the weight-only tail. The caller checks the result against its list."""
    s = str(text).strip().lower().replace("_", "-")
    if s.endswith("-wo") or s.endswith("wo") and s[:-2] in plain:
        s = s[:-2].rstrip("-") + WEIGHT_ONLY_TAIL
    return s
