"""What every family module shares: the ``Family`` record and the helpers configs read shapes with.

No ComfyUI and no other family here: the family modules import this, ``families/__init__.py`` imports them.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Callable, Mapping

from ..errors import CorruptCheckpointError

Shapes = Mapping[str, tuple]


def count_blocks(shapes: Shapes, prefix: str) -> int:
    pat = re.compile(re.escape(prefix) + r"(\d+)\.")
    idx = {int(m.group(1)) for k in shapes for m in [pat.match(k)] if m}
    return max(idx) + 1 if idx else 0


def blocks(shapes: Shapes, *prefixes: str) -> int:
    """Block count under the first prefix that has any (one prefix per key layout)."""
    for p in prefixes:
        n = count_blocks(shapes, p)
        if n:
            return n
    return 0


class ShapeRefused(ValueError):
    """A config's own refusal of one tensor's shape: which tensor, what the model needs, what the file holds.
    ``Family.config_from_shapes`` turns it into a CorruptCheckpointError naming the file and that tensor."""

    def __init__(self, tensor: str, expected: str, found: str):
        super().__init__(f"{tensor}: expected {expected}, found {found}")
        self.tensor, self.expected, self.found = tensor, expected, found


def first_named(shapes: Shapes, *keys: str) -> tuple[str, tuple]:
    """(key, shape) of the first key present, so that a refusal can name the tensor the file really has."""
    for k in keys:
        if k in shapes:
            return k, shapes[k]
    raise KeyError(keys[0])


def attention_heads(shapes: Shapes, q_keys: tuple[str, ...], k_keys: tuple[str, ...], v_keys: tuple[str, ...],
                    head: int) -> tuple[int, int]:
    """(heads, kv heads) from the q and k projections' rows at a fixed head width, as ComfyUI's detection reads them.
    Refused (ShapeRefused, naming the tensor) where the rows are not whole heads (fewer rows than one head made 0
    heads, a ZeroDivisionError in the model's constructor), where v is not as wide as k, or where the kv heads do not
    divide the q heads: grouped attention repeats each kv head heads / kv times, and a remainder samples a wrong image
    silently (diffusers refuses such weights)."""
    qk, qs = first_named(shapes, *q_keys)
    kk, ks = first_named(shapes, *k_keys)
    vk, vs = first_named(shapes, *v_keys)
    for key, shape in ((qk, qs), (kk, ks), (vk, vs)):
        if len(shape) != 2 or shape[0] < head or shape[0] % head:
            raise ShapeRefused(key, f"a 2-D projection of whole {head}-wide heads (rows a positive multiple of "
                                    f"{head})", f"shape {tuple(shape)}")
    if vs[0] != ks[0]:
        raise ShapeRefused(vk, f"as many rows as {kk} ({ks[0]}: one value per key head)", f"{vs[0]} rows")
    heads, kv = qs[0] // head, ks[0] // head
    if heads % kv:
        raise ShapeRefused(kk, f"a number of kv heads dividing the {heads} query heads of {qk}",
                           f"{kv} kv heads ({ks[0]} rows)")
    return heads, kv


def has_any(shapes: Shapes, *keys: str) -> bool:
    return any(k in shapes for k in keys)


def first(shapes: Shapes, *keys: str) -> tuple:
    """Shape of the first key present: configs are derived from files in either key layout."""
    for k in keys:
        if k in shapes:
            return shapes[k]
    raise KeyError(keys[0])


def schemes_from_suffix(repo: str) -> tuple[str, ...]:
    """What a repo no family describes probably holds, from its name's suffix (the scheme records' ``suffix`` and
    ``suffix_holds``: an Unsloth ``-FP8`` repo usually holds both fp8 and int8); empty when the name says nothing."""
    from ..schemes import registry
    s = registry.by_suffix(repo)
    return () if s is None else (s.suffix_holds or (s.name,))


def normalize_base(s: str) -> str:
    """Lower-case, backslashes as slashes, no trailing slash (Unsloth's rule: a Windows folder path such as
    ``C:\\models\\Z-Image-Turbo`` compares by its last part like a repo id)."""
    return str(s).strip().replace("\\", "/").rstrip("/").lower()


def base_tail(s: str) -> str:
    return normalize_base(s).rsplit("/", 1)[-1]


def base_matches(found: str, wanted: str) -> bool:
    """Exact match, or the same last path part (case-insensitive, either slash)."""
    if found == wanted or normalize_base(found) == normalize_base(wanted):
        return True
    return base_tail(found) == base_tail(wanted)


def _has(keys: set, marker) -> bool:
    return all(k in keys for k in ((marker,) if isinstance(marker, str) else marker))


@dataclasses.dataclass(frozen=True)
class ComfyRename:
    """A tensor rename a ComfyUI release made in a family's model: modules whose name matches ``module`` (a regular
    expression, searched) hold under ``.new`` from ComfyUI ``since`` on what older releases hold under ``.old``. A load
    whose names differ from the running ComfyUI's only by such renames is a version mismatch; any other difference is
    a damaged file (nodes/comfy_model.check_names_match)."""
    module: str
    old: str
    new: str
    since: str
    what: str  # in words, for the message

    def counterpart(self, module: str, attr: str) -> str | None:
        """The other name of ``module.attr`` across this rename, where the rename covers it; else None."""
        if attr not in (self.old, self.new) or not re.search(self.module, module):
            return None
        return self.new if attr == self.old else self.old


# ComfyUI 0.33 made the q/k norms of comfy.ldm.flux.layers.QKNorm (FLUX.1, FLUX.2, and the HunyuanVideo models built
# from the same layers) its common RMSNorm: ``norm.query_norm.scale`` became ``.weight`` (its process_unet_state_dict
# renames older files' ``.scale`` on load; an older ComfyUI knows only ``.scale``).
FLUX_QK_NORMS = ComfyRename(module=r"(^|\.)norm\.(query|key)_norm$", old="scale", new="weight", since="0.33.0",
                            what="the q/k norms' scales (query_norm / key_norm)")


@dataclasses.dataclass(frozen=True)
class HostedEncoder:
    """A pre-cast text encoder Unsloth hosts for a family (its ``te_prequant_repos`` entry), and how ComfyUI runs
    it: ``clip_type`` names a ``comfy.sd.CLIPType`` member; ``with_encoders`` the ComfyUI encoder files the family's
    CLIP takes besides it (FLUX.1: CLIP-L next to its T5-XXL), from ``models/text_encoders``."""
    component: str  # text_encoder, text_encoder_2, ... (HiDream's text_encoder_4)
    te_class: str  # the transformers class the file records (``prequant_core.encoders.kinds``)
    repo: str
    clip_type: str
    with_encoders: tuple[str, ...] = ()
    scheme: str = "fp8"  # fp8: the layerwise storage cast; int8: the int8 ConvRot form (Unsloth's TE_INT8_CONVROT_FILES)
    filename: str | None = None  # a name Unsloth declares for the file, asked before the derived fp8 names
    comfy_file: str = ""  # ComfyUI's own file of this encoder (named where the node cannot build the encoder)
    # the first ComfyUI whose CLIP type for this family runs the encoder, where it differs from the encoder kind's
    # (Krea 2's Qwen3-VL-4B: type krea2 in 0.33.0; Qwen-Image 2.1's Qwen3-VL-8B: 0.38.1)
    min_comfy: str | None = None


@dataclasses.dataclass(frozen=True)
class ComfyParamDefault:
    """A field of a family's ComfyUI model parameters that a newer ComfyUI requires and an older one refuses (0.12.1
    added FLUX's ``txt_ids_dims`` and HunyuanVideo's ``meanflow_sum``): ``nodes/comfy_model`` sets it to
    ``value(config)``, what ComfyUI's own detection gives the same weights, only where the running ComfyUI's
    parameter class (``params`` in ``module``) has the field and the config from shapes does not."""
    module: str  # comfy.ldm.flux.model
    params: str  # FluxParams: a dataclass whose fields are the parameters
    field: str
    value: Callable[[Mapping], object]  # the unet config -> the value


@dataclasses.dataclass(frozen=True)
class Companion:
    """Weights ComfyUI's model class holds that the family's transformer files do not: LTX-2.3's text connectors,
    which ComfyUI's LTXAV runs inside its diffusion model and diffusers keeps in the pipeline's ``connectors``
    component. Given (a companion's tensors merged under ``prefix``), the family's map places them; absent, the loader
    refuses naming them, never as a damaged file."""
    what: str  # in words, for the message
    prefix: str  # the companion's tensors, as merged into the checkpoint's ({prefix}video_connector....)
    comfy_prefixes: tuple[str, ...]  # where they go in ComfyUI's model
    where: str  # where a user finds them, for the message's fix
    repo_file: str  # the component's file in the family's base repo (fetched through the Hugging Face cache)
    keep: tuple[str, ...]  # the companion file's tensors the class takes (the rest belongs elsewhere: the encoder's)
    local_name: str  # a copy of it in models/prequant is used instead of the Hub's


@dataclasses.dataclass(frozen=True)
class HostedFile:
    """A file name a hosted repo declares, tried before the generic chain (``families.declared_filenames``). ``base``:
    one repo hosting a file per base (HunyuanVideo 1.5 480p / 720p): the requested base picks its file; without one
    every base's name is tried, in the order listed."""
    repo: str
    scheme: str
    filename: str
    component: str = "transformer"  # an expert's own file (Wan 2.2 A14B's transformer_2)
    base: str | None = None


@dataclasses.dataclass(frozen=True)
class KnownPolicy:
    """An NVFP4 layer policy Unsloth publishes: which base it was tuned for and how many layers of each format it
    gives (its loader refuses a file whose id, version or counts differ from the policy it resolves for the file's
    family and base; the v3 layer-policy check reads them through ``families.nvfp4_policies``)."""
    policy_id: str
    version: int
    base: str  # lower-case, as Unsloth keys its table
    counts: dict
    repo: str  # where the hosted file built with it lives
    replaces: tuple[str, ...] = ()  # ids Unsloth retired for this one (their hosted files were rebuilt with it)
    family: str = ""  # the family whose record lists it: filled in by the registry


@dataclasses.dataclass(frozen=True)
class Architecture:
    """What a family's transformer is: how a file of it is recognised, which classes run it (diffusers', ComfyUI's)
    and how its weights map between them. Nothing here depends on where a file comes from."""
    diffusers_class: str
    diffusers_markers: tuple  # keys only a diffusers-layout file of this family has (a key, or a tuple: all of them)
    comfy_markers: tuple  # the same for a ComfyUI-layout file; empty where both layouts are the same
    # Class name(s) in comfy.supported_models. Several: the first whose own ``unet_config`` matches the derived config
    # (ComfyUI's own rule), e.g. FLUX.1 dev (guidance embedder) vs schnell (none).
    comfy_model: str | tuple[str, ...]
    # diffusers -> ComfyUI key map, {diffusers key: comfy key | (comfy key, (0, offset, length)) | (.., .., permutation)}:
    # a str names a function in comfy.utils taking the unet config (ComfyUI's own map), a callable is our own map
    # (in the family's module), None means the diffusers names already are ComfyUI's.
    comfy_key_map: str | Callable[[Mapping], dict] | None
    # ComfyUI unet config from the file's shapes (either layout); call it through ``Family.config_from_shapes``. None:
    # no ComfyUI version this pack can test has the family's class, so the loader node refuses it naming ``min_comfy``
    # (Info, verify, build, Hub resolution and the diffusers loader still work).
    unet_config: Callable[[Shapes], dict] | None
    # Name tokens of layers an int8 build leaves dense, besides every scheme's own (``schemes.exclude_tokens``)
    int8_exclude_extra: tuple[str, ...] = ()
    # The model's transformers: one, or several experts (Wan 2.2 A14B: ``transformer`` for high noise,
    # ``transformer_2`` for low noise), each its own file whose metadata records its ``component``.
    components: tuple[str, ...] = ("transformer",)
    # Families sharing class and key names (Wan 2.2 TI2V-5B / A14B): which one a file without a ``family`` field is,
    # from its shapes (tried in registry order when ``detect`` is given shapes).
    shape_test: Callable[[Shapes], bool] | None = None
    # Skeleton entries a checkpoint may lack because ComfyUI's module has them but never uses them ("ones" / "zeros"),
    # or holds as a buffer a file does not carry (a function of shape and dtype: MiniMax-H3's rotary frequencies).
    fill_missing: Mapping[str, object] = dataclasses.field(default_factory=dict)
    # Tensor renames a ComfyUI release made in this family's model (ComfyRename): a load that differs from the running
    # ComfyUI's names only by these is a version mismatch, any other difference a damaged file.
    comfy_renames: tuple[ComfyRename, ...] = ()
    # Parameters a newer ComfyUI's model class requires and an older one's refuses (ComfyParamDefault)
    comfy_params: tuple[ComfyParamDefault, ...] = ()
    # Oldest ComfyUI that runs the family end to end (model class and the text encoder its workflow needs); named in
    # the error when the running ComfyUI lacks the class or key map (the loader refuses only then).
    min_comfy: str = "0.3.75"
    # Where a file's weights are another form of the diffusers class (MiniMax-H3's pruned adaLN): reshape a freshly
    # built skeleton to that form from the file's metadata before its tensors go in (True when it did), and the
    # metadata a build records for such weights, from their tensors.
    diffusers_prepare: Callable[[object, Mapping], bool] | None = None
    metadata_from_tensors: Callable[[Mapping], dict] | None = None
    # Weights ComfyUI's class needs that the transformer's files lack (LTX-2.3's text connectors)
    companion: Companion | None = None
    # True: an older ComfyUI has a class of that name in a form that cannot host this family (0.12.1's LTXAV is
    # LTX-2.0's: 6 modulation rows, no gated attention), so ``min_comfy`` decides, not the class's presence. (Not for
    # every family: FLUX.2 [klein]'s min_comfy is its text encoder's; 0.3.75's Flux2 class runs its transformer.)
    version_decides: bool = False


@dataclasses.dataclass(frozen=True)
class Hosting:
    """Where a family's models and Unsloth's pre-quantized files of them are published, and what they are named."""
    # The base models (diffusers repos) the family covers; the first is the builder's default ``base_model_id``
    base_repos: tuple[str, ...]
    # Unsloth's hosted repos and the schemes each really holds, in the order to try them (a repo's suffix does not
    # say: unsloth/Qwen-Image-FP8 holds an int8 transformer, unsloth/Z-Image-Turbo-FP8 int8 and fp8). A plain tuple
    # of repos takes the schemes from the suffixes (``-NVFP4``: nvfp4, ``-MXFP8``: mxfp8, else int8 and fp8).
    repos: Mapping[str, tuple[str, ...]] | tuple[str, ...] = ()
    # Hub file names the hosted repos declare (per scheme, component and base), tried before the generic chain
    files: tuple[HostedFile, ...] = ()
    # Bases that must never get this family's hosted files (another model of the same name family, e.g. the
    # non-Turbo Z-Image), compared exactly or by last path part, case-insensitively (newer Unsloth releases).
    excluded_bases: tuple[str, ...] = ()
    # Repos that also host an int8 ConvRot file (``<Model>-INT8-ConvRot.safetensors``), tried first for int8
    convrot_repos: tuple[str, ...] = ()
    # Pre-cast text encoders hosted for this family (Load Prequant Text Encoder)
    text_encoders: tuple[HostedEncoder, ...] = ()
    # Bases whose text-encoder weights are byte-identical (Unsloth compared every shard's sha256; its table as of its
    # 2026-08-25 re-check), by a label of the weights: {label: lower-case bases}. The bases under one label, in every
    # family, are one group: a pre-cast encoder file built for one of them serves them all
    # (families.encoder_groups, load/encoder_checks.same_base).
    shared_encoders: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    # NVFP4 layer policies Unsloth publishes for this family's bases, in Unsloth's order (KnownPolicy)
    nvfp4_policies: tuple[KnownPolicy, ...] = ()
    # A video model: Unsloth hosts no ComfyUI-format twin (``<stem>-ComfyUI.safetensors``) of its files
    video: bool = False

    @property
    def hosted(self) -> dict[str, tuple[str, ...]]:
        """{repo: schemes it holds, in the order tried}."""
        if isinstance(self.repos, Mapping):
            return {r: tuple(s) for r, s in self.repos.items()}
        return {r: schemes_from_suffix(r) for r in self.repos}

    def excluded_base(self, wanted: str | None) -> str | None:
        """The excluded base ``wanted`` names, else None."""
        if not wanted:
            return None
        for ex in self.excluded_bases:
            if normalize_base(ex) == normalize_base(wanted) or base_tail(ex) == base_tail(wanted):
                return ex
        return None


@dataclasses.dataclass(frozen=True)
class Family:
    """One model family: its names, its architecture and its hosting, all declared in its own module
    (``families/<family>.py``), which ``families.MODULES`` lists."""
    name: str
    title: str
    arch: Architecture
    hosting: Hosting
    aliases: tuple[str, ...] = ()  # other names it goes by (Unsloth's own), accepted wherever a family is named

    @property
    def hosted(self) -> dict[str, tuple[str, ...]]:
        """{repo: schemes it holds, in the order tried}."""
        return self.hosting.hosted

    def excluded_base(self, wanted: str | None) -> str | None:
        """The excluded base ``wanted`` names, else None."""
        return self.hosting.excluded_base(wanted)

    def config_from_shapes(self, shapes: Shapes, path: str | None = None) -> dict:
        """ComfyUI's unet config for a file of this family with these tensor shapes. A file that passed detection
        but lacks a key the config reads is refused as corrupt (truncated, or another model's file)."""
        if self.arch.unet_config is None:
            raise ValueError(f"{self.title} has no ComfyUI unet config in this pack")
        try:
            return self.arch.unet_config(shapes)
        except ShapeRefused as e:
            raise CorruptCheckpointError(
                f"This {self.title} checkpoint's tensor '{e.tensor}' does not have a shape a {self.title} transformer "
                "can have.", path=path, expected=e.expected, found=e.found,
                fix="Download the file again, or pick the file (or family) of the model you meant.") from None
        except (IndexError, TypeError, ValueError, ZeroDivisionError) as e:
            # a tensor of the wrong rank (a 3-D weight where a Linear's 2-D one belongs) or an impossible size
            raise CorruptCheckpointError(
                f"This {self.title} checkpoint's tensor shapes do not describe a {self.title} transformer.", path=path,
                expected=f"the shapes of a {self.title} transformer (family '{self.name}')",
                found=f"{type(e).__name__} while reading the shapes: {str(e)[:160]}",
                fix="Download the file again, or pick the file (or family) of the model you meant.") from None
        except KeyError as e:
            key = e.args[0] if e.args else "?"
            raise CorruptCheckpointError(
                f"This {self.title} checkpoint lacks the tensor '{key}' that the {self.title} model config is read "
                f"from: the file may be truncated or for another model.", path=path,
                expected=f"a complete {self.title} transformer (family '{self.name}') with '{key}'",
                found=f"{len(shapes)} tensors without '{key}'",
                fix="Download the file again, or pick the file (or family) of the model you meant.") from None

    @property
    def comfy_models(self) -> tuple[str, ...]:
        return (self.arch.comfy_model,) if isinstance(self.arch.comfy_model, str) else tuple(self.arch.comfy_model)

    def layout_of(self, keys) -> str | None:
        keys = set(keys)
        if any(_has(keys, m) for m in self.arch.diffusers_markers):
            return "diffusers"
        if any(_has(keys, m) for m in self.arch.comfy_markers):
            return "comfyui"
        return None
