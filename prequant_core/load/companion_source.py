"""Weights a family's ComfyUI class holds that its transformer files do not (``families._base.Companion``: LTX-2.3's
text connectors): a file of the companion's local name in a model folder, else the base model's component on the Hub
through the Hugging Face cache (downloaded once, offline afterwards), as the tokenizer of a pre-cast encoder is found
(``tokenizer_source``). Only the companion's own tensors are read, memory-mapped, and given back under its prefix, so
that the family's map places them with the checkpoint's."""
from __future__ import annotations

import dataclasses
import os
from typing import Iterable

from ..errors import CorruptCheckpointError, HubError
from ..families import Family
from ..context import LoadContext


@dataclasses.dataclass
class Found:
    tensors: dict  # under the companion's prefix (``connectors.video_connector....``)
    path: str
    source: str  # in words, for the node's status and summary


def needed(family: Family | None, names: Iterable[str]) -> bool:
    """Whether a load of ``family`` from a file with these tensor names must find its companion: the file holds it
    neither as a companion's (``prefix``) nor where ComfyUI's class has it (a ComfyUI-layout file)."""
    c = family.arch.companion if family is not None else None
    return c is not None and not any(k.startswith((c.prefix, *c.comfy_prefixes)) for k in names)


def _local(family: Family, ctx: LoadContext) -> str | None:
    for d in (*ctx.model_dirs, *((ctx.download_dir,) if ctx.download_dir else ()), *ctx.search_dirs):
        p = os.path.join(d, family.arch.companion.local_name)
        if os.path.isfile(p):
            return p
    return None


def find(family: Family, ctx: LoadContext = LoadContext()) -> Found:
    """The companion's tensors: a local file named ``local_name`` in the load's folders, else ``repo_file`` of the
    family's base repo through the Hugging Face cache (``ctx``'s download folder keeps model files only)."""
    c = family.arch.companion
    path = _local(family, ctx)
    if path is not None:
        return Found(read(family, path), path, f"{os.path.basename(path)} (local)")
    from ..hub import fetch as hub
    repo = family.hosting.base_repos[0]
    ctx.say(f"fetching {c.what} ({repo}/{c.repo_file})")
    try:
        fetched = hub.download(repo, [c.repo_file], dataclasses.replace(ctx, download_dir=None))
    except HubError as e:  # the Hub's own reason, with where a copy of this one file is read from instead
        e.fix = (f"{e.fix} " if e.fix else "") + (f"A copy of {repo}/{c.repo_file} put into ComfyUI/models/prequant/ "
                                                  f"as {c.local_name} is used without the Hub.")
        e.args = (e.render(),)
        raise

    how = "downloaded" if fetched.downloaded else "cached"
    return Found(read(family, fetched.path), fetched.path, f"{repo}/{c.repo_file} ({how})")


def read(family: Family, path: str) -> dict:
    """The companion file's own tensors (``keep``), under the companion's prefix; a file without them, or one that
    cannot be read, is refused naming that file (never the transformer's)."""
    c = family.arch.companion
    fix = (f"Put {c.what} as {c.local_name} into ComfyUI/models/prequant/ (the {c.repo_file} of "
           f"{family.hosting.base_repos[0]}), or delete {path} so that it is fetched again.")
    from ..formats.containers.safetensors_container import read_header
    if not path.endswith(".safetensors"):
        raise CorruptCheckpointError(f"{c.what} must be a .safetensors file.", path=path,
                                     expected=".safetensors", found=os.path.basename(path), fix=fix)
    index, _, _ = read_header(path)
    kept = sorted(k for k in index if k.startswith(c.keep))
    absent = [p for p in c.keep if not any(k.startswith(p) for k in kept)]
    if absent:
        raise CorruptCheckpointError(f"This file does not hold {c.what}.", path=path,
                                     expected=f"tensors under {', '.join(c.keep)}",
                                     found=f"none under {', '.join(absent)} ({len(index)} tensors in all)", fix=fix)
    try:
        from safetensors import safe_open
        with safe_open(path, framework="pt", device="cpu") as f:
            return {c.prefix + k: f.get_tensor(k) for k in kept}
    except Exception as e:  # noqa: BLE001 - a stranger's file: whatever the reader raises, the file is named
        raise CorruptCheckpointError(f"{c.what} could not be read.", path=path,
                                     found=f"{type(e).__name__}: {str(e)[:200]}", fix=fix) from None
