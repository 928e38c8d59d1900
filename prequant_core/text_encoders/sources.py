"""Where a pre-cast text encoder may come from (Load Prequant Text Encoder): a local file, a Hub repo, or the
family's hosted repo, with Unsloth's names (``<Model>-<component>-FP8.safetensors``, then ``.pt``; ``<Model>`` is
the repo name minus its suffix). Pure, like ``sources.plan``: no file and no network is touched."""
from __future__ import annotations

from .. import families
from ..errors import HubError
from ..families.hub_names import model_name, normalize_repo, normalize_revision
from ..request import PRESET_NONE, Candidate, Candidates, Preset, pick
from .checks import COMPONENTS


def filenames(repo: str, component: str, scheme: str | None = None) -> tuple[str, ...]:
    """Unsloth's names, in the order its resolver asks: a file the family declares (Qwen-Image 2.1's int8 ConvRot
    encoder), then ``<Model>-<component>-FP8.safetensors`` and ``.pt`` (a miss of the declared file takes fp8 rather
    than the dense shards). ``scheme``: only that scheme's names."""
    model = model_name(repo)
    # the hosted encoders a family declares for this repo and component (Unsloth's TE_INT8_CONVROT_FILES)
    declared = [e.filename for fam in families.FAMILIES.values() for e in fam.hosting.text_encoders
                if e.repo.lower() == repo.strip().lower() and e.component == component and e.filename
                and scheme in (None, e.scheme)]
    derived = [f"{model}-{component}-FP8{ext}" for ext in (".safetensors", ".pt")] if scheme in (None, "fp8") else []
    return tuple(dict.fromkeys(declared + derived))


def presets() -> list[Preset]:
    """One per family hosting an encoder, e.g. ``Z-Image / text_encoder`` (HunyuanImage 2.1's is Qwen-Image's
    file)."""
    return [Preset(f"{fam.title} / {e.component}", e.repo, e.scheme, fam.name)
            for fam in families.FAMILIES.values() for e in fam.hosting.text_encoders]


def preset_labels() -> list[str]:
    return [PRESET_NONE] + [p.label for p in presets()]


def get_preset(label: str | None) -> Preset | None:
    return pick(label, presets(), "text-encoder preset", "one per family with a hosted text encoder")


def component_for(family: str | None, component: str | None) -> str | None:
    """The component asked for; ``auto``: the family's hosted encoder's (None without a family: the file says)."""
    c = (component or "").strip()
    if c and c != "auto":
        if c not in COMPONENTS:
            raise HubError(f"'{c[:40]}' is not a text-encoder component.", expected=", ".join(COMPONENTS),
                           found=c[:40], fix="Pick a component from the list, or auto.")
        return c
    if family:
        hosted = families.get(family).hosting.text_encoders
        if hosted:
            return hosted[0].component
    return None


def plan(path: str | None = None, hub_repo: str | None = None, family: str | None = None, component: str | None = None,
         *, revision: str | None = None, preset: str | None = None) -> Candidates:
    """Ordered candidates: the local file, the named repo, the preset's or the family's hosted repo."""
    path = (path or "").strip() or None
    hub_repo = (hub_repo or "").strip() or None
    family = None if (family or "").strip().lower() in ("", "auto") else family.strip().lower()
    revision = normalize_revision(revision)
    notes: list[str] = []
    chosen = get_preset(preset)
    if chosen and (path or hub_repo):
        notes.append(f"preset '{chosen.label}' not used: a {'local file' if path else 'hub_repo'} is given")
        chosen = None
    family = family or (chosen.family if chosen else None)
    if family:
        families.get(family)  # an unknown family is an error here, not a silent skip
    comp = component_for(family, component or (chosen.label.rsplit(" / ", 1)[1] if chosen else None))
    out: list[Candidate] = []
    # a candidate's scheme is the one its file must hold; None where it may be either (a local file; a chain holding
    # Qwen-Image 2.1's int8 file and then the fp8 names, which serve when the int8 file is missing)
    if path:
        out.append(Candidate("local", "path", scheme=None, path=path))
    repo_origin = [(hub_repo, "hub_repo")] if hub_repo else [(chosen.repo, "preset")] if chosen else []
    if not repo_origin and family and not path:
        hosted = [e for e in families.get(family).hosting.text_encoders if comp in (None, e.component)]
        if hosted:
            repo_origin = [(hosted[0].repo, "family")]
        else:
            notes.append(f"family '{family}' has no hosted text encoder"
                         + (f" named {comp}" if comp else ""))
    for repo, origin in repo_origin:
        repo = normalize_repo(repo)
        if comp is None:
            raise HubError(f"Which text encoder of {repo} should be downloaded?", expected=", ".join(COMPONENTS),
                           found="auto", fix="Set the node's component (or its family) so the file name is known.")
        names = filenames(repo, comp)
        out.append(Candidate("hub", origin, scheme="fp8" if names == filenames(repo, comp, "fp8") else None,
                             repo=repo, revision=revision, filenames=names))
    return Candidates(tuple(out), tuple(notes), family, out[-1].scheme if out else None)
