"""Where a checkpoint comes from: a pure planner (no I/O) plus a "usable source" filter.

``plan(Wanted(...))`` turns the loader's inputs into an ordered list of candidates:

1. an explicit local path (typed by the user, or picked from the model folder list);
2. a named Hub repo (``hub_repo``, or the repo of a chosen preset);
3. the family's hosted repo for the scheme (``families.FAMILIES[...].hosting.repos``; where a family hosts several
   repos, e.g. FLUX.1 schnell / dev / Krea-dev, the one whose model name matches ``variant`` or the tail of
   ``base_model_id``);
4. nothing (an empty plan).

Each Hub candidate carries the filename chain of docs/FORMAT.md section 5, tried in order:
``<Model>-<SCHEME>.safetensors``, ``<Model>-<SCHEME>.pt``, legacy ``transformer_<scheme>.pt``, where ``<Model>`` is
the repo name minus a ``-FP8`` / ``-INT8`` / ``-NVFP4`` / ``-MXFP8`` / ``-quantized`` suffix and SCHEME is upper case.

Weight-only schemes (``int8-weight-only``, ``fp8-weight-only``): Unsloth hosts int8 and fp8 files only and no legacy
name predates them, so (a) a family's hosted repo is never planned for them, and (b) a repo named explicitly is
searched for ``<Model>-INT8-WEIGHT-ONLY.safetensors`` then ``.pt`` (the normalized scheme name upper-cased, no
legacy name). Self-hosted weight-only files therefore follow the same pattern as everything else.

``usable(...)`` keeps the candidates that can be used right now: a local path only if the allowlist admits it and the
file exists; a Hub candidate if one of its names is in the local Hugging Face cache, or if we are not offline. The
cache check is passed in (``hub.is_cached``) so this module never imports the Hub client.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Callable, Iterable, Mapping

from . import allowlist
from .. import families, schemes
from ..errors import HubError, PrequantError
from ..families.hub_names import (TWIN_ENV, local_name, model_name, normalize_repo, normalize_revision,
                                  with_comfy_twins)
from ..request import PRESET_NONE, Candidate, Candidates, Preset, pick


def family_schemes(fam) -> tuple[str, ...]:
    """Every scheme some hosted repo of ``fam`` holds, in a stable order."""
    return tuple(dict.fromkeys(s for sch in fam.hosted.values() for s in sch))


def filenames(repo: str, scheme: str, component: str = "transformer", base_model_id: str | None = None) -> tuple[str, ...]:
    """The names to try in ``repo`` for ``scheme``, in Unsloth's current order (docs/FORMAT.md section 5): the ConvRot
    build where the repo hosts one and the scheme has one (its record's ``convrot_file``: int8,
    ``<Model>-INT8-ConvRot.safetensors``; Unsloth's resolver puts it ahead of everything), the names the hosting family declares (per base where it hosts one file per base), then ``<Model>-<SCHEME>.safetensors`` (the converted,
    pickle-free container first), ``.pt``, legacy ``transformer_<scheme>.pt``. Another component than
    ``transformer`` (an expert of a two-expert model) has its own names: ``<Model>-<component>-<SCHEME>``
    ``.safetensors`` / ``.pt``, then the early-release name ``<component>_<scheme>.pt``."""
    s = schemes.normalize(scheme)
    rec, weight_only = schemes.get(s)
    model = model_name(repo)
    declared = families.declared_filenames(repo, s, component, base_model_id)
    if component != "transformer":
        names = [*declared, f"{model}-{component}-{s.upper()}.safetensors", f"{model}-{component}-{s.upper()}.pt",
                 f"{component}_{s}.pt"]
    else:
        convrot = [f"{model}-{s.upper()}-ConvRot.safetensors"] \
            if rec.convrot_file and not weight_only and families.convrot_hosted(repo) else []
        names = [*convrot, *declared, f"{model}-{s.upper()}.safetensors", f"{model}-{s.upper()}.pt"]
        if rec.legacy_pt and not weight_only:  # old releases: transformer_<scheme>.pt
            names.append(f"transformer_{s}.pt")
    names = list(dict.fromkeys(names))
    twins = os.environ.get(TWIN_ENV, "").strip().lower() not in ("0", "off", "false", "no")
    if twins and not families.video_hosted(repo):
        names = with_comfy_twins(names, lead=rec.twin_leads and not weight_only)
    return tuple(names)


def schemes_for_repo(repo: str) -> tuple[str, ...]:
    """What scheme ``auto`` tries in a repo, in order: the scheme its name's suffix says first where the repo holds
    it, then the rest of what the family table says it holds (e.g. unsloth/Qwen-Image-FP8: fp8, then int8)."""
    held = families.hosted_schemes(repo)  # the family table: a repo's suffix does not say
    named = families.schemes_from_suffix(repo)[:1]
    return tuple(dict.fromkeys([*[s for s in named if s in held], *held]))


def _tail(s: str) -> str:
    return families.base_tail(s)  # backslashes count as slashes (a Windows folder as base_model_id)


def hosted_repo(family: str, *, variant: str | None = None, base_model_id: str | None = None,
                scheme: str | None = None) -> str | None:
    """The family's hosted repo (among those holding ``scheme``, when given). With several: the one whose
    ``<Model>`` equals ``variant`` (or ends with ``-<variant>``), else equals the tail of ``base_model_id``, else the
    one matching the family's first base repo, else the first listed. None if the family hosts nothing."""
    fam = families.get(family)
    repos = [r for r, sch in fam.hosted.items() if scheme is None or scheme in sch]
    if not repos:
        return None
    by_model: dict = {}
    for r in repos:  # the first listed wins (an -FP8 repo before its -NVFP4 twin when no scheme is given)
        by_model.setdefault(model_name(r).lower(), r)
    excluded = fam.excluded_base(base_model_id)
    if excluded and not variant and _tail(base_model_id) not in by_model:
        # a base listed as excluded (Tongyi-MAI/Z-Image vs Z-Image-Turbo) never gets its namesake's file; a variant
        # repo built from that very base (Qwen-Image-2.1-Turbo) is picked below
        raise HubError(f"Family '{fam.name}' hosts no file for base '{base_model_id}'.",
                       expected=f"a base the hosted repos were built from: {', '.join(fam.hosting.base_repos)}",
                       found=f"'{base_model_id}', listed as excluded ('{excluded}'): a different model",
                       fix="Build a pre-quantized file from that base with Build Prequant Checkpoint, or use the "
                           "dense fallback.")
    if len(repos) == 1 and not variant:
        return repos[0]
    if variant and variant.strip():
        v = _tail(variant)
        if v in by_model:
            return by_model[v]
        hits = [r for m, r in by_model.items() if m.endswith("-" + v)]
        if len(hits) == 1:
            return hits[0]
        raise HubError(f"Family '{fam.name}' has no hosted repo for variant '{variant}'.",
                       expected=", ".join(repos), found=str(variant),
                       fix="Pick one of the listed repos in hub_repo, or leave the variant empty.")
    if base_model_id and base_model_id.strip() and _tail(base_model_id) in by_model:
        return by_model[_tail(base_model_id)]
    for base in fam.hosting.base_repos:
        if _tail(base) in by_model:
            return by_model[_tail(base)]
    return repos[0]


def presets() -> list[Preset]:
    """One preset per hosted repo and hosted scheme, e.g. ``Z-Image-Turbo / fp8``."""
    out = []
    for fam in families.FAMILIES.values():
        for repo, sch in fam.hosted.items():
            for s in sch:
                out.append(Preset(f"{model_name(repo)} / {s}", repo, s, fam.name))
    return out


def preset_labels() -> list[str]:
    return [PRESET_NONE] + [p.label for p in presets()]


def get_preset(label: str | None) -> Preset | None:
    return pick(label, presets(), "preset", "the list follows the families this pack supports")


def _clean(s: str | None) -> str | None:
    s = (s or "").strip()
    return s or None


@dataclasses.dataclass(frozen=True)
class Wanted:
    """What the loader's inputs ask for, as the user gave them (empty or "auto": not given): a local file, a Hub repo
    and revision, a preset; what the model is (family, scheme, base model, variant) and which component.

    ``scheme`` not chosen: a named repo takes the scheme its suffix names (``-FP8`` / ``-INT8``); the family step is
    skipped. ``preset`` supplies repo, scheme and family where those are not given, and only when neither a local file
    nor a hub_repo is given; a scheme that contradicts the preset is an error rather than a silent choice.
    ``component`` (``transformer``, or an expert such as ``transformer_2``) picks that component's file names in Hub
    repos."""
    path: str | None = None
    hub_repo: str | None = None
    family: str | None = None
    scheme: str | None = None
    variant: str | None = None
    base_model_id: str | None = None
    revision: str | None = None
    preset: str | None = None
    component: str = "transformer"


def plan(wanted: Wanted) -> Candidates:
    """Ordered candidates for the loader's inputs. Pure: reads no file and no network."""
    variant, base_model_id, preset = wanted.variant, wanted.base_model_id, wanted.preset
    component = _clean(wanted.component) or "transformer"
    path, hub_repo, revision = _clean(wanted.path), _clean(wanted.hub_repo), normalize_revision(wanted.revision)
    family = None if _clean(wanted.family) in (None, "auto") else wanted.family.strip().lower()
    scheme = None if _clean(wanted.scheme) in (None, "auto") else schemes.normalize(wanted.scheme)
    notes: list[str] = []
    out: list[Candidate] = []
    chosen = get_preset(preset)
    origin = "hub_repo"
    if chosen and (path or hub_repo):
        # What the user named explicitly wins; the preset (a default source) must not re-interpret it.
        notes.append(f"preset '{chosen.label}' not used: a {'local file' if path else 'hub_repo'} is given")
        chosen = None
    if chosen:
        if scheme and scheme != chosen.scheme:
            raise HubError(f"The preset '{chosen.label}' is a {chosen.scheme} checkpoint but scheme is '{scheme}'.",
                           expected=chosen.scheme, found=scheme,
                           fix="Set scheme to auto (or to the preset's scheme), or pick the other preset.")
        if hub_repo is None:
            hub_repo, origin = chosen.repo, "preset"
        scheme = scheme or chosen.scheme
        family = family or chosen.family

    if path:
        out.append(Candidate("local", "path", scheme=scheme, path=path))

    if hub_repo:
        repo = normalize_repo(hub_repo)
        tried = (scheme,) if scheme else schemes_for_repo(repo)
        if not tried:
            ends = ", ".join(s.suffix for s in schemes.registry.all_schemes())
            raise HubError(f"Which scheme should be downloaded from {repo}?", expected=" / ".join(schemes.names()),
                           found="auto", fix="Set the node's scheme input (the repo is not one this pack knows and "
                                             f"its name does not end in {ends}).")
        # auto on a repo holding several schemes: every scheme's names, the file's own metadata says which it was
        names = tuple(dict.fromkeys(n for s in tried for n in filenames(repo, s, component, base_model_id)))
        out.append(Candidate("hub", origin, scheme=tried[0] if len(tried) == 1 else None, repo=repo,
                             revision=revision, filenames=names))

    if family:
        fam = families.get(family)
        if not scheme:
            notes.append(f"family '{fam.name}': no scheme chosen, so its hosted repo is not planned")
        elif scheme not in family_schemes(fam):
            notes.append(f"family '{fam.name}': hosted repos carry {' and '.join(family_schemes(fam))} only, "
                         f"not {scheme}")
        elif fam.excluded_base(base_model_id) and not variant and \
                _tail(base_model_id) not in {model_name(r).lower() for r in fam.hosted}:
            notes.append(f"family '{fam.name}': base '{base_model_id}' is listed as excluded "
                         f"('{fam.excluded_base(base_model_id)}', a different model), so no hosted repo is planned")
        else:
            repo = hosted_repo(fam.name, variant=variant, base_model_id=base_model_id, scheme=scheme)
            if repo is None:
                notes.append(f"family '{fam.name}' has no hosted repo")
            elif not any(c.place == "hub" and c.repo == repo and c.scheme == scheme for c in out):
                out.append(Candidate("hub", "family", scheme=scheme, repo=repo, revision=revision,
                                     filenames=filenames(repo, scheme, component, base_model_id)))
    return Candidates(tuple(out), tuple(notes), family, scheme)


@dataclasses.dataclass(frozen=True)
class Usable:
    usable: tuple[Candidate, ...]
    rejected: tuple[tuple[Candidate, str], ...]  # (candidate, why it cannot be used now)


def usable(candidates: Iterable[Candidate], *, model_dirs: Iterable[str] = (), offline: bool = False,
           is_cached: Callable[[Candidate], bool] | None = None, exists: Callable[[str], bool] = os.path.isfile,
           env: Mapping[str, str] | None = None) -> Usable:
    """Split candidates into usable now / rejected (with the reason), keeping the plan's order."""
    model_dirs = list(model_dirs)
    ok, bad = [], []
    for c in candidates:
        if c.place == "local":
            if not allowlist.is_allowed(c.path, model_dirs, env):
                bad.append((c, "outside the model folders and the allowlist"))
            elif not exists(os.path.realpath(os.path.expanduser(c.path))):
                bad.append((c, "no such file"))
            else:
                ok.append(c)
        else:
            cached = bool(is_cached and is_cached(c))
            if cached or not offline:
                ok.append(c)
            else:
                bad.append((c, "offline (HF_HUB_OFFLINE) and none of its files is in the local cache"))
    return Usable(tuple(ok), tuple(bad))


# --- downloads into a model folder, and workflows that name a file the user does not have yet ------------------------

def hub_origin(path: str, scheme: str | None, component: str | None = None,
               base_model_id: str | None = None) -> dict | None:
    """Where a file the loader stored came from, read off its folders (no I/O): a model folder's origin folder
    (``<owner>/<repo>[@<revision>]/<file>``) or the Hugging Face cache (``models--<owner>--<repo>/snapshots/<commit>/
    <file>``); with the names the loader asks that repo for the file's scheme, in order, and the one this file is:
    ``{"repo", "revision", "names", "served"}``. None for a file elsewhere, or one not among those names."""
    parts = os.path.abspath(str(path)).replace("\\", "/").split("/")
    if len(parts) < 4:
        return None
    if parts[-3] == "snapshots" and parts[-4].startswith("models--"):
        owner, _, name = parts[-4][len("models--"):].partition("--")
        revision = parts[-2]
    else:
        owner, (name, _, revision) = parts[-3], parts[-2].partition("@")
    try:
        repo = normalize_repo(f"{owner}/{name}")
        s = schemes.normalize(scheme) if scheme else None
    except (HubError, ValueError, PrequantError):
        return None
    if not s:
        return None
    names = filenames(repo, s, component or "transformer", base_model_id)
    served = [n for n in names if local_name(repo, n) == parts[-1]]
    if not served:
        return None
    return {"repo": repo, "revision": revision or None, "names": list(names), "served": served[0]}


def local_names(candidate: Candidate) -> tuple[str, ...]:
    return tuple(local_name(candidate.repo, fn) for fn in candidate.filenames) if candidate.place == "hub" else ()


def provider(p: Candidates, name: str) -> Candidate | None:
    """The Hub candidate of ``p`` whose download would be the file ``name`` (a workflow's checkpoint the user does not
    have yet), else None. Only an exact file name counts: another file is never fetched in place of the one named."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    for c in p:
        if c.place == "hub" and base in local_names(c):
            return c
    return None


def hosted_source(name: str) -> Preset | None:
    """The preset whose hosted repo serves a file of this name (for telling a user where to get it)."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    for pr in presets():
        for comp in families.get(pr.family).arch.components:
            c = Candidate("hub", "preset", scheme=pr.scheme, repo=pr.repo,
                          filenames=filenames(pr.repo, pr.scheme, comp))
            if base in local_names(c):
                return pr
    return None


def for_missing_file(name: str, p: Candidates, folders: Iterable[str], *,
                     hub_url: str = "https://huggingface.co") -> Candidates:
    """A plan for a listed checkpoint ``name`` that is in none of ``folders``: the one Hub candidate that provides
    exactly that file. Raises ``CheckpointNotFoundError`` naming the file, the folders searched and where to get it."""
    from ..errors import CheckpointNotFoundError
    c = provider(p, name)
    if c is not None:
        return Candidates((c,), p.notes + (f"'{name}' is not in {', '.join(folders) or 'the model folders'}: "
                                           f"downloading it from {c.repo}",), p.family, p.scheme)
    folders = list(folders)
    first = folders[0] if folders else "ComfyUI/models/prequant"
    hosted = hosted_source(name)
    if hosted:
        where = (f"It is hosted at {hub_url}/{hosted.repo}: pick the preset '{hosted.label}' (or type {hosted.repo} "
                 f"in hub_repo) and it is downloaded into {first}, or download it by hand into {first}.")
    else:
        where = (f"Put the file into {first}, or choose a preset / hub_repo / family + scheme whose hosted file has "
                 "this name, or pick another file in the list.")
    offered = [f"{c.repo} ({', '.join(local_names(c))})" for c in p if c.place == "hub"]
    raise CheckpointNotFoundError(
        f"The workflow names the checkpoint '{name}', which is not in {', '.join(folders) or 'the model folders'}.",
        expected=f"{name} in one of those folders", found="no such file" + (
            f"; the Hub sources this node names provide other files: {'; '.join(offered)}" if offered else ""),
        fix=where)
