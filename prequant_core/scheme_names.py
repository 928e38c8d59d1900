"""The one table of quantization schemes, as text, importable without torch: the command line checks ``--scheme``
with it before torch loads. Each row names a scheme, which is also its module in ``schemes/`` (that module's
``SCHEME`` record holds everything else about it), and whether files may record its weight-only variant.
``schemes/registry.py`` imports the modules from this table, in its order, and refuses a record that disagrees with
its row; adding a scheme is its module plus its row here (tests/schemes/test_scheme_registry.py)."""
from __future__ import annotations

WEIGHT_ONLY_TAIL = "-weight-only"
TABLE = (  # (scheme = its module in schemes/, has a weight-only variant), in the order the nodes list them
    ("int8", True),
    ("fp8", True),
    ("nvfp4", False),
    ("mxfp8", False),
)
# every name a file or a node input may use: the plain names first, then the weight-only variants
NAMES = (*(n for n, _ in TABLE), *(n + WEIGHT_ONLY_TAIL for n, wo in TABLE if wo))
DEFAULT = TABLE[0][0]  # what a build uses when no scheme is named
DEFAULT_MIN_FEATURES = 512


def spelling(text: str, plain) -> str:
    """A scheme name as a user may type it (``INT8``, ``int8_wo``, ``fp8-wo``) in the spelling files record;
    ``plain``: the names without the weight-only tail. The caller checks the result against its list."""
    s = str(text).strip().lower().replace("_", "-")
    if s.endswith("-wo") or s.endswith("wo") and s[:-2] in plain:
        s = s[:-2].rstrip("-") + WEIGHT_ONLY_TAIL
    return s
