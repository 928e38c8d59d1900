"""The names hosted files go by: a repo id and a revision as the Hub accepts them, ``<Model>`` of a repo, the name a
Hub file gets in a model folder, and Unsloth's ComfyUI-format twins (``<stem>-ComfyUI.safetensors``) in a chain of
names. No I/O: the load's planner (``load/sources.py``) and the Hub download (``hub/``) read the same rules."""
from __future__ import annotations

import re
from typing import Callable

from .. import schemes
from ..errors import HubError

OTHER_SUFFIXES = ("-quantized",)  # a repo-name suffix that names no scheme
MAX_REPO_ID = 96  # huggingface_hub's validate_repo_id
_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_URL_PREFIXES = ("https://huggingface.co/", "http://huggingface.co/", "huggingface.co/", "hf://", "hf.co/",
                 "https://hf.co/")


def normalize_repo(repo: str) -> str:
    """``owner/name`` from what a user may paste (also a huggingface.co URL); raises ``HubError`` if not a repo id."""
    r = str(repo).strip()
    for p in _URL_PREFIXES:
        if r.lower().startswith(p):
            r = r[len(p):]
            break
    r = r.strip("/")
    # fullmatch: "$" would also accept a trailing newline; the Hub takes ids of at most 96 characters
    if not _REPO_RE.fullmatch(r) or ".." in r or len(r) > MAX_REPO_ID:
        raise HubError(f"'{str(repo)[:120]}' is not a Hugging Face repo id.",
                       expected=f"owner/name of at most {MAX_REPO_ID} characters, e.g. unsloth/Z-Image-Turbo-FP8",
                       found=repr(str(repo)[:120]), fix="Type the repo id as shown on its Hugging Face page.")
    return r


_REV_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-/]{0,199}$")


def normalize_revision(revision: str | None) -> str | None:
    """A branch, tag or 40-hex commit as the Hub accepts it (``refs/pr/N`` included), else ``HubError``; None or empty
    means the default branch. No ``..``, no empty path part, no absolute path, no backslash: the client joins the
    revision into cache paths, so anything else could write outside its cache."""
    r = str(revision or "").strip()
    if not r:
        return None
    parts = r.split("/")
    if not _REV_RE.fullmatch(r) or ".." in r or any(p in ("", ".") for p in parts) or r.endswith((".lock", ".")) \
            or "@{" in r:
        raise HubError(f"'{r[:80]}' is not a revision the Hub accepts.",
                       expected="a branch or tag name (letters, digits, . _ - /, no '..'), or a 40-hex commit hash",
                       found=repr(r[:80]), fix="Leave revision empty for the default branch, or copy the branch, tag "
                                                "or commit from the repo's page.")
    return r


def model_name(repo: str) -> str:
    """``<Model>``: the repo name minus one quantization suffix (``unsloth/Z-Image-Turbo-FP8`` -> ``Z-Image-Turbo``)."""
    name = repo.rstrip("/").rsplit("/", 1)[-1]
    low = name.lower()
    # every scheme's suffix, longest first: ``-MXFP8`` is not ``-FP8``
    for suf in (*sorted((s.suffix for s in schemes.registry.all_schemes()), key=len, reverse=True), *OTHER_SUFFIXES):
        if low.endswith(suf.lower()) and len(name) > len(suf):
            return name[: -len(suf)]
    return name


def local_name(repo: str, filename: str) -> str:
    """The name a Hub file gets in a model folder: its own name, except the legacy ``transformer_<scheme>.pt`` that
    every repo shares, which gets the repo's ``<Model>-`` prefix so two repos' files never collide."""
    filename = filename.rsplit("/", 1)[-1]
    if filename.startswith("transformer_"):
        return f"{model_name(repo)}-{filename}"
    return filename


# Next to ``<stem>.safetensors`` / ``.pt`` Unsloth may host ``<stem>-ComfyUI.safetensors``: the same weights in
# ComfyUI's own quantized layout (read by formats/containers/comfy_native.py), for its image families. A twin that
# holds the artifact's weights bit for bit (its scheme record's ``twin_leads``: int8) leads the artifact's names (the
# one file stock ComfyUI loads too is the default download); an fp8 twin has one scale per tensor, a coarser rounding
# of the per-row file, so it trails.
TWIN_TAG = "-ComfyUI"
TWIN_SUFFIX = TWIN_TAG + ".safetensors"
TWIN_ENV = "UNSLOTH_DIFFUSION_PREQUANT_COMFY"  # 0 / off / false / no: never ask for a twin
_ARTIFACT_SUFFIXES = (".safetensors", ".pt", ".pth")


def is_comfy_twin(name: str) -> bool:
    return str(name).endswith(TWIN_SUFFIX)


def artifact_stem(name: str) -> str | None:
    """``<stem>`` of a hosted ``<stem>.safetensors`` / ``.pt`` / ``-ComfyUI.safetensors``; None for the legacy
    ``transformer_<scheme>.pt`` names (and the experts' ``transformer_2_<scheme>.pt``), which have no twin."""
    name = str(name)
    if "/" in name or name.startswith("transformer_"):
        return None
    if is_comfy_twin(name):
        return name[: -len(TWIN_SUFFIX)] or None
    for suffix in _ARTIFACT_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)] or None
    return None


def prefer_cached_twins(names: list[str], cached: Callable[[str], bool]) -> list[str]:
    """Never a second copy of one artifact: an uncached twin steps behind its artifact's cached container, and a
    cached twin ahead of its uncached containers (Unsloth's cached-file rule for twins)."""
    out = list(names)
    for twin in [n for n in out if is_comfy_twin(n)]:
        stem = artifact_stem(twin)
        others = [n for n in out if n != twin and artifact_stem(n) == stem]
        if not others:
            continue
        if cached(twin):
            if not any(cached(n) for n in others) and out.index(twin) > out.index(others[0]):
                out.remove(twin)
                out.insert(out.index(others[0]), twin)
        elif any(cached(n) for n in others) and out.index(twin) < out.index(others[-1]):
            out.remove(twin)
            out.insert(out.index(others[-1]) + 1, twin)
    return out


def with_comfy_twins(names: list[str], *, lead: bool) -> list[str]:
    """``names`` with each artifact's twin added: right before the artifact's first name (``lead``), else right
    after its last one. Order kept, no duplicates."""
    out: list[str] = []
    for i, name in enumerate(names):
        stem = artifact_stem(name)
        twin = None if stem is None or is_comfy_twin(name) else stem + TWIN_SUFFIX
        if twin and twin not in names and twin not in out:
            if lead:
                out.append(twin)
            elif not any(artifact_stem(n) == stem for n in names[i + 1:]):
                out.extend(n for n in (name, twin) if n not in out)
                continue
        if name not in out:
            out.append(name)
    return out
