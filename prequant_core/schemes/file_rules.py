"""What a scheme's own file rules are: a metadata block its files may declare about their layers (Unsloth's v3 NVFP4
layer policy, ``nvfp4_policy.py``), with the checks the scheme module gives it. ``formats/layer_policy.py`` finds the
rules through the registry (``Scheme.file_rules``) and hands each the facts of the file (``FileFacts``, with the
family registry for the tables family records hold): a rule imports nothing above schemes/."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable


@dataclasses.dataclass(frozen=True)
class FileRule:
    field: str  # the metadata field holding the block ("nvfp4_policy")
    title: str  # what the block is, in words ("NVFP4 policy")
    reasons: Callable  # (block, FileFacts, the file's scheme or None) -> [reason]: why the block and file disagree
    notes: Callable  # (block, FileFacts) -> [note]: accepted, but worth showing (Prequant Info)
    summary: Callable  # (block) -> one line for Info, or None
    # a layer policy: a file declaring it carries the v3 format tag, and a file mixing block kinds with others needs
    # one (docs/FORMAT.md section 9)
    layer_policy: bool = False


@dataclasses.dataclass(frozen=True)
class FileFacts:
    """What a rule may read about the file being judged (plain data, and the family registry)."""
    metadata: dict
    kinds: dict  # {weight kind: quantized weights of it}
    layer_kinds: dict  # {layer (no ``.weight``): its quantized weight's kind}
    plain_weights: int  # how many plain 2-D ``.weight`` tensors the file holds
    scheme_kinds: dict  # {scheme name: its weight kind}, every registered scheme
    families: Any  # the family registry (prequant_core.families): family records' tables (Unsloth's policies)


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def layer_names(v, field: str, reasons: list[str]) -> list[str] | None:
    """A metadata list of layer names, checked (non-empty strings, each once); None with a reason added if not."""
    if not isinstance(v, (list, tuple)) or not v:
        reasons.append(f"metadata '{field}' must be a non-empty list of layer names, found {type(v).__name__} "
                       f"{str(v)[:60]!r}")
        return None
    bad = [x for x in v if not isinstance(x, str) or not x]
    if bad:
        reasons.append(f"metadata '{field}' must hold non-empty layer names, found {str(bad[0])[:60]!r}")
        return None
    seen: set = set()
    dup = sorted({x for x in v if x in seen or seen.add(x)})  # one pass: a hostile list may hold millions
    if dup:
        reasons.append(f"metadata '{field}' names layers more than once: {', '.join(dup[:3])}")
        return None
    return list(v)
