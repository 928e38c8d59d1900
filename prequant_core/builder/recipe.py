"""What a build makes and where it writes: the two small records the builders take (the transformer's and the
ComfyUI-native one take both, the text encoder's the target), instead of the same loose settings down each."""
from __future__ import annotations

import dataclasses

from .. import schemes
from ..families import Family


@dataclasses.dataclass(frozen=True)
class Recipe:
    """What a build makes, said once for every builder: the scheme; the family (a ``Family``, its name, or None:
    detected from the input by ``build``); what the file is of (``base_model_id``, default the family's first base
    repo; ``component``: ``transformer``, or ``transformer_2`` for Wan 2.2 A14B's second expert); which Linear layers
    are quantized (in and out features >= ``min_features``, minus ``exclude`` tokens: None takes the scheme's own for
    the family)."""
    scheme: str
    family: Family | str | None = None
    base_model_id: str | None = None
    min_features: int = schemes.DEFAULT_MIN_FEATURES
    component: str = "transformer"
    exclude: tuple[str, ...] | list[str] | None = None

    def excluded(self, family: Family) -> list[str]:
        if self.exclude is not None:
            return list(self.exclude)
        return schemes.exclude_tokens(schemes.normalize(self.scheme), family.arch.int8_exclude_extra)

    def base(self, family: Family) -> str:
        return (self.base_model_id or "").strip() or family.hosting.base_repos[0]


@dataclasses.dataclass(frozen=True)
class Target:
    """Where a build writes: the file, its container (None: from the file name, or the scheme's own), and whether
    an existing file there may be replaced."""
    dest: str
    container: str | None = None
    overwrite: bool = False
