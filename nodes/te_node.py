"""Load Prequant Text Encoder: a pre-cast (fp8 layerwise) text encoder -> ComfyUI's own CLIP, through the same load
pipeline as the transformer loader (plan -> locate -> open and judge -> build)."""
from __future__ import annotations

import dataclasses
import logging
import os

import torch

from prequant_core import families
from prequant_core.errors import ComfyVersionError, ValidationError, reading
from prequant_core.families import encoders
from prequant_core.load import pipeline
from prequant_core.text_encoders import checks as encoder_checks, sources as encoder_sources, tokenizer as tokenizer_source
from prequant_core.context import LoadContext
from prequant_core.request import Request
from prequant_core.safe_text import escape
from prequant_core.units import human_bytes

from . import paths
from .comfy_clip import build_clip
from .comfy_model import _older_than, comfy_version
from .load_node import load_context
from .status import NodeStatus

log = logging.getLogger("prequant")
AUTO = "auto"
ALIASES = ["text encoder", "clip", "fp8", "quantized", "pre-quantized", "prequant", "unsloth", "t5", "gemma", "qwen", "llama"]


def _hosted(family, kind: encoders.EncoderKind, component: str):
    """The family's entry for this encoder (its ComfyUI type, the files it goes with); without a family, the first
    family hosting this encoder model."""
    fams = [families.get(family)] if family else list(families.FAMILIES.values())
    for fam in fams:
        for e in fam.hosting.text_encoders:
            if e.te_class in kind.te_classes and (family is None or e.component == component):
                return fam, e
    raise ValidationError(f"No family this pack knows runs a {kind.name} as its {component}.",
                          expected=", ".join(f"{f.title}: {e.component}" for f in fams
                                             for e in f.hosting.text_encoders) or
                          "a family with a hosted text encoder", found=f"{kind.name} ({component})",
                          fix="Set the node's family to the model this encoder belongs to.")


def _refuse_unhostable(kind: encoders.EncoderKind, title: str, path: str | None = None, hosted=None):
    """An encoder whose ComfyUI class this pack has no key map for (Qwen3-VL: Krea 2's, ComfyUI 0.33.0, and Qwen-Image
    2.1's, 0.38.1; FLUX.2 [dev]'s Mistral-Small-24B; LTX-2's Gemma 3 12B): the ComfyUI that runs it, else ComfyUI's
    own file of it with Load CLIP."""
    comfy_file = hosted.comfy_file if hosted is not None else ""
    need = kind.needs_comfy(hosted)
    own = f"ComfyUI's own {comfy_file or kind.comfy_file_hint} with Load CLIP"
    if _older_than(comfy_version(), need or "0"):
        raise ComfyVersionError(f"{title}'s {kind.name} text encoder runs in ComfyUI {need}'s encoder class; "
                                f"this ComfyUI is {comfy_version()}.", path=path,
                                expected=f"ComfyUI >= {need}", found=f"ComfyUI {comfy_version()}",
                                fix=f"Update ComfyUI to {need} or newer and use {own} (this node does not "
                                    f"build a {kind.name} yet; Prequant Info describes the file).")
    raise ValidationError(f"Load Prequant Text Encoder does not build ComfyUI's {kind.name} encoder yet.", path=path,
                          expected=", ".join(k.name for k in encoders.KINDS if k.hostable),
                          found=kind.name, fix=f"Use {own}; Prequant Info describes this file.")


def _tokenizer(kind: encoders.EncoderKind, ck, ctx: LoadContext):
    found = tokenizer_source.from_comfy_files(kind, paths.encoder_dirs())
    if found is not None:
        return found
    base = ck.metadata.get("base_model_id")
    if not base:
        raise ValidationError(f"The {kind.name} tokenizer is not in the file, and the file names no base model to "
                              "take it from.", path=ck.path, expected=f"base_model_id in the file, or a ComfyUI "
                              f"{kind.comfy_file_hint} in models/text_encoders", found="neither",
                              fix=f"Put ComfyUI's {kind.comfy_file_hint} into models/text_encoders (its tokenizer is "
                                  "used), or use the file hosted by Unsloth.")
    ctx.say(f"fetching the {kind.name} tokenizer ({kind.tokenizer_file}) from {base}")
    # the load's own context: its status lines and cancel (no byte bar for a tokenizer; into the HF cache: from_hub)
    return tokenizer_source.from_hub(kind, base, dataclasses.replace(ctx, progress=None))


class PrequantLoadTextEncoder:
    CATEGORY = "loaders/prequant"
    RETURN_TYPES = ("CLIP",)
    RETURN_NAMES = ("clip",)
    OUTPUT_TOOLTIPS = ("The text encoder in ComfyUI's own class for it, float8 weights kept float8: connect it where "
                       "Load CLIP's CLIP would go (CLIP Text Encode, LoRA loaders).",)
    FUNCTION = "load"
    SEARCH_ALIASES = ALIASES
    DESCRIPTION = ("Loads a pre-cast (pre-quantized) fp8 text encoder (Unsloth's *-text_encoder*-FP8 files, .safetensors or .pt) into "
                   "ComfyUI's own encoder class without the dense download or a dense copy in memory: about half the "
                   "memory of the bf16 encoder, the same conditioning as Load CLIP on the same cast weights. "
                   "Encoders: " + ", ".join(k.name for k in encoders.KINDS if k.hostable) + ". Takes a file from models/prequant or "
                   "models/text_encoders, or downloads the one a preset / hub_repo / family names into "
                   "models/prequant.")

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "text_encoder": (paths.encoder_choices(), {"tooltip": "A pre-cast text encoder from models/prequant "
                                 "or models/text_encoders. None: the preset / hub_repo / family download it into "
                                 "models/prequant on the first run."}),
            },
            "optional": {
                "preset": (encoder_sources.preset_labels(), {"default": "none", "tooltip": "A family's hosted "
                           "text encoder (Unsloth's repos on the Hugging Face Hub), used when no file is chosen."}),
                "with_encoder": (paths.comfy_encoder_choices(), {"default": paths.NO_ENCODER, "tooltip": "The "
                                 "ComfyUI encoder file the family's CLIP takes besides this one, from "
                                 "models/text_encoders (FLUX.1: clip_l.safetensors next to its T5-XXL), as "
                                 "DualCLIPLoader takes it."}),
                "family": ([AUTO] + sorted(n for n, f in families.FAMILIES.items() if f.hosting.text_encoders),
                           {"default": AUTO, "tooltip": "The model family (auto: what the file or preset says). With "
                            "no file or repo, downloads the family's hosted encoder; picks ComfyUI's text-encoder "
                            "type for it."}),
                "hub_repo": ("STRING", {"default": "", "tooltip": "Download from this Hugging Face repo instead "
                             "(Unsloth's names: <Model>-<component>-FP8.safetensors, then .pt).",
                             "advanced": True}),
                "component": ([AUTO, *encoder_checks.COMPONENTS], {"default": AUTO, "tooltip": "Which encoder "
                              "of the model (auto: the family's hosted one, else what the file records); a file "
                              "recording another is refused.", "advanced": True}),
                "base_model_id": ("STRING", {"default": "", "tooltip": "Refuse the file unless it was built from "
                                  "this base, or one with the same encoder bytes (Z-Image and Z-Image-Turbo; every "
                                  "FLUX.1; Qwen-Image and HunyuanImage 2.1).", "advanced": True}),
                "revision": ("STRING", {"default": "", "tooltip": "Branch, tag or commit to download (empty: the "
                             "default branch).", "advanced": True}),
                "path": ("STRING", {"default": "", "tooltip": "Explicit file path instead of the list. Outside the "
                         "model folders it must lie under PREQUANT_ALLOW_LOCAL_PATH.", "advanced": True}),
            },
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    @classmethod
    def VALIDATE_INPUTS(cls, text_encoder):
        """Replaces ComfyUI's list check for ``text_encoder`` only: a shared workflow may name a file this user does
        not have yet, which ``load`` downloads when the node's preset / hub_repo / family serve that very name."""
        if text_encoder is None or text_encoder in paths.NONE_CHOICES or text_encoder in paths.encoder_choices():
            return True
        if not isinstance(text_encoder, str) or os.path.splitext(text_encoder)[1].lower() not in paths.EXTENSIONS:
            return f"'{str(text_encoder)[:80]}' is not a .safetensors or .pt file name"
        return True

    @classmethod
    def IS_CHANGED(cls, text_encoder, path="", **kw):
        target = (path or "").strip() or paths.find_encoder(text_encoder)
        if not target:
            return "hub:" + "|".join(str(kw.get(k, "")) for k in ("preset", "hub_repo", "family", "component",
                                                                  "base_model_id", "revision", "with_encoder"))
        try:
            st = os.stat(target)
            return f"{target}:{st.st_mtime_ns}:{st.st_size}|{kw.get('with_encoder', '')}"
        except OSError:
            return target

    def load(self, text_encoder, preset="none", with_encoder=paths.NO_ENCODER, family=AUTO, hub_repo="",
             component=AUTO, base_model_id="", revision="", path="", unique_id=None):
        status = NodeStatus(unique_id)
        local = (path or "").strip() or paths.find_encoder(text_encoder)
        missing = None if local or not text_encoder or text_encoder in paths.NONE_CHOICES else text_encoder
        src = encoder_sources.plan(local, hub_repo, family, component, revision=revision, preset=preset)
        if missing:  # a listed name this user does not have: only a source serving that very file may stand in
            want = os.path.basename(missing.replace("\\", "/"))
            served = [c for c in src if c.place == "hub" and want in c.filenames]
            if not served:
                raise ValidationError(f"The text encoder '{missing}' is not in models/prequant or "
                                      "models/text_encoders, and nothing the node names serves that file.",
                                      expected="a listed file, or a preset / hub_repo / family hosting it",
                                      found=missing, fix="Put the file into ComfyUI/models/prequant/, or set the "
                                                         "preset of the family it belongs to.")
            src = dataclasses.replace(src, candidates=tuple(dataclasses.replace(c, filenames=(want,))
                                                            for c in served))
        comp = encoder_sources.component_for(src.family, component) or encoder_checks.ANY_COMPONENT
        hosted = encoder_checks.hosted_for(src.family, None if comp == encoder_checks.ANY_COMPONENT else comp)
        hosted_kind = encoders.for_class(hosted.te_class) if hosted is not None else None
        if hosted_kind is not None and not hosted_kind.hostable:  # before any download
            _refuse_unhostable(hosted_kind, families.get(src.family).title, hosted=hosted)
        req = Request(scheme="auto", base_model_id=(base_model_id or "").strip() or None, family=src.family,
                      component=comp)
        with torch.inference_mode(False), torch.no_grad():
            ctx = load_context(status, paths.encoder_dirs(), paths.download_dir())
            routed = pipeline.run(src, req, ctx)
            opened = routed.route.opened
            ck, kind = opened.checkpoint, opened.encoder
            comp = ck.metadata["component"]
            if not kind.hostable:
                known = encoder_checks.hosted_for(opened.family.name, comp) if opened.family else None
                _refuse_unhostable(kind, opened.family.title if opened.family else "This file", ck.path, hosted=known)
            fam, hosted = _hosted(opened.family.name if opened.family else None, kind, comp)
            tensors = kind.to_comfy(ck.tensors)
            missing = kind.missing_markers(tensors)
            if missing:
                raise ValidationError(f"ComfyUI would not recognise this {kind.name}: its keys lack what ComfyUI's "
                                      "detection reads.", path=ck.path, expected=", ".join(missing),
                                      found=f"{len(tensors)} tensors without them",
                                      fix="The file is truncated or of another encoder size; download it again.")
            tok = None
            if kind.tokenizer == encoders.TOKENIZER_SPIECE:
                tok = _tokenizer(kind, ck, ctx)
                tensors[tokenizer_source.SPIECE_KEY] = tok.data
            extra = []
            if hosted.with_encoders:  # one input, one file: read once, whatever the family names it
                name = " / ".join(hosted.with_encoders)
                extra_path = paths.resolve_comfy_encoder(with_encoder)
                if extra_path is None:
                    raise ValidationError(f"{fam.title}'s CLIP takes a {name} encoder next to this {kind.name}.",
                                          path=ck.path, expected=f"a {name} file in with_encoder (from models/text_encoders)",
                                          found="none", fix=f"Pick ComfyUI's {name}.safetensors in with_encoder, as "
                                                            "DualCLIPLoader takes it.")
                import comfy.utils
                extra.append(comfy.utils.load_torch_file(extra_path, safe_load=True))
            status.say(f"building ComfyUI's {kind.name} encoder ({fam.title}, {comp})")
            with reading(ck.path, "loaded", parsing=False):
                clip = build_clip([tensors, *extra], hosted.clip_type, strict=[True] + [False] * len(extra),
                                  path=ck.path)
        n8, b8, n, b = encoder_checks.fp8_share(tensors)
        s = {"file": os.path.basename(ck.path), "encoder": kind.name, "family": fam.name, "component": comp,
             "container": ck.container, "fp8_tensors": n8, "size_bytes": clip.patcher.model_size(),
             "dense_bytes": 2 * b8 + b, "tokenizer": tok.source if tok else "shipped with ComfyUI",
             "notes": list(opened.notes), "location": ck.path}
        f = routed.located.fetched if routed.located else None
        if f is not None:
            s.update(source=f"hub:{f.repo}@{f.revision}", downloaded=f.downloaded, location=f.path,
                     file=os.path.basename(f.path))
        text = summary_text(s)
        log.info("[prequant] %s", text)
        return {"ui": {"prequant": [s], "text": [text]}, "result": (clip,)}


def summary_text(s: dict) -> str:
    text = (f"{s['encoder']} fp8 ({s['family']} {s['component']}) from {s['file']} ({s['container']}): "
            f"{s['fp8_tensors']} float8 weights, {human_bytes(s['size_bytes'])} in memory (dense bf16 "
            f"{human_bytes(s['dense_bytes'])}); tokenizer: {s['tokenizer']}. File: {s['location']}")
    if s.get("source"):
        text += f" ({'downloaded' if s.get('downloaded') else 'earlier download'} from {s['source'][4:]})"
    for note in s.get("notes") or []:
        text += f" Note: {note}"
    return escape(text)
