"""Build Prequant Checkpoint: a dense MODEL (from any stock loader) or a dense file -> a pre-quantized file in
models/prequant, written with the same code as ``python -m prequant_core build``."""
from __future__ import annotations

import dataclasses
import logging
import os

import torch

import comfy.model_management as mm
import comfy.utils
import folder_paths

from prequant_core import builder as core
from prequant_core.formats import dense_sources
from prequant_core.builder import output_file
from prequant_core import families, schemes
from prequant_core.errors import BuildError, UnknownFamilyError
from prequant_core.families import Family, encoders

from . import describe, paths
from .comfy_model import key_map_for
from .ops import is_prequant_linear

log = logging.getLogger("prequant")
AUTO = "auto"
NO_FILE = "(none: use the model input)"
DENSE_EXTENSIONS = (".safetensors",)


def dense_file_choices() -> list[str]:
    try:
        names = folder_paths.get_filename_list("diffusion_models")
    except KeyError:
        names = []
    out = []
    for n in names:
        if not n.lower().endswith(DENSE_EXTENSIONS):
            continue
        full = folder_paths.get_full_path("diffusion_models", n)
        if full and paths._looks_prequant(full):  # pre-quantized files are the loader's, not dense inputs
            continue
        out.append(n)
    return [NO_FILE] + sorted(out)


def check_filename(filename: str, container: str, base_model_id: str, scheme: str,
                   component: str = "transformer") -> str:
    """A bare file name for models/prequant: no folders, no '..', extension matching the container."""
    name = (filename or "").strip()
    if not name:
        return core.default_filename(base_model_id, scheme, container, component)  # derived names pass the same check
    output_file.check_output_name(name)
    ext = os.path.splitext(name)[1].lower()
    if container == core.NATIVE:
        if ext in core.EXTENSIONS.values() and ext != ".safetensors":
            raise BuildError("A ComfyUI-native file is a .safetensors file.", found=name, expected=".safetensors",
                             fix="Name it *.safetensors.")
        return name if ext == ".safetensors" else name + ".safetensors"
    if ext in core.EXTENSIONS.values():
        if ext != core.EXTENSIONS[container]:
            raise BuildError("The filename's extension does not match the container.", found=name,
                             expected=core.EXTENSIONS[container],
                             fix=f"Name it *{core.EXTENSIONS[container]} or switch the container.")
        return name
    return name + core.EXTENSIONS[container]


def native_folder() -> str:
    folder = folder_paths.get_folder_paths("diffusion_models")[0]
    os.makedirs(folder, exist_ok=True)
    return folder


def refuse_shadowing(kind: str, name: str, dest: str) -> None:
    """A new file must not take the name of another model ComfyUI lists under ``kind``: ComfyUI resolves a name in
    its first folder that has it, so every loader would silently get the new file instead (overwrite or not)."""
    existing = folder_paths.get_full_path(kind, name)
    if existing and os.path.realpath(existing) != os.path.realpath(dest):
        raise BuildError(f"A model named '{name}' already exists in another of ComfyUI's {kind} folders; a new file "
                         "of the same name would shadow it for every loader.", path=existing,
                         found=f"would write {dest}",
                         fix="Give the new file another filename (the existing one is left as it is).")


def build_native(model, dense_file, target, recipe, progress):
    """A ComfyUI-native file from a MODEL (its state dict is ComfyUI's layout already) or a dense file (mapped to
    ComfyUI's names where it is in diffusers' layout); ``recipe.family``: the node's family input (``auto``)."""
    from .comfy_model import diffusers_to_comfy
    family = recipe.family
    if model is not None:
        fam = model_family(model, family)
        sd = model_state_dict(model)
        core.check_dense_input(sd, "the input model")
        return core.build_comfy_native(sd, target, dataclasses.replace(recipe, family=fam), progress=progress)
    src = folder_paths.get_full_path_or_raise("diffusion_models", dense_file)
    tensors, _, _ = core.read_native_input(src)
    fam, layout = families.detect(list(tensors), None, src) if family == AUTO else \
        (families.get(family), families.get(family).layout_of(tensors))
    if layout != "comfyui":
        shapes = {k: tuple(v.shape) for k, v in tensors.items()}
        tensors = diffusers_to_comfy(fam, tensors, fam.config_from_shapes(shapes, src), src)
    return core.build_comfy_native(tensors, target, dataclasses.replace(recipe, family=fam), progress=progress,
                                   input_layout=layout or "diffusers")


def output_folder() -> str:
    folder = folder_paths.get_folder_paths(paths.FOLDER)[0]
    os.makedirs(folder, exist_ok=True)
    return folder


def model_family(patcher, family: str) -> Family:
    """The family of a ComfyUI MODEL: named, else from ComfyUI's model config class, else from its tensor names."""
    if family and family != AUTO:
        return families.get(family)
    cfg_name = type(getattr(patcher.model, "model_config", None)).__name__
    candidates = [f for f in families.FAMILIES.values() if cfg_name in f.comfy_models]
    if len(candidates) == 1:
        return candidates[0]
    sd = patcher.model.diffusion_model.state_dict()
    try:
        fam = families.detect(list(sd), shapes={k: tuple(v.shape) for k, v in sd.items()})[0]
        return fam if not candidates or fam in candidates else candidates[0]
    except UnknownFamilyError as e:
        if candidates:
            return candidates[0]
        raise UnknownFamilyError("Could not tell which model family this MODEL is.",
                                 expected=e.expected, found=f"ComfyUI model config '{cfg_name}'",
                                 fix="Pick the family on the node.") from None


def unpatched(patcher, what: str, fix: str) -> None:
    """Refuse a ModelPatcher that carries weight patches (a LoRA the build would silently drop), and put back the
    pristine weights where another clone of the same model applied its patches in place (ComfyUI patches the shared
    module): the build reads what the input really is, whichever branch of the graph ran before."""
    if getattr(patcher, "patches", None):
        raise BuildError(f"This {what} carries {len(patcher.patches)} weight patches (e.g. a LoRA); the build reads "
                         "the base weights and would silently drop them.", fix=fix)
    applied = getattr(patcher.model, "current_weight_patches_uuid", None)
    if applied is not None and applied != getattr(patcher, "patches_uuid", None):
        # Another clone of this model (e.g. with a LoRA) is loaded with its patches applied in place: unloading
        # restores the pristine weights before they are read.
        mm.unload_all_models()


def model_state_dict(patcher) -> dict:
    """The MODEL's dense diffusion-model weights in ComfyUI layout, refusing what would build the wrong thing."""
    model = patcher.model
    dm = getattr(model, "diffusion_model", None)
    if dm is None:
        raise BuildError("This MODEL has no diffusion model to build from.", found=type(model).__name__)
    if any(is_prequant_linear(m) for m in dm.modules()):
        raise BuildError("This MODEL is already pre-quantized (it came from Load Prequant Transformer); building "
                         "from it would quantize quantized weights.", expected="a dense MODEL, e.g. from Load "
                         "Diffusion Model", found="quantized Linear layers",
                         fix="Connect the dense model, or use the checkpoint you loaded it from.")
    unpatched(patcher, "MODEL", "Connect the MODEL straight from its loader (before LoRA nodes).")
    return dm.state_dict()


class PrequantBuildCheckpoint:
    CATEGORY = "loaders/prequant"
    RETURN_TYPES = ("STRING",)
    RETURN_NAMES = ("path",)
    OUTPUT_TOOLTIPS = ("The full path of the written pre-quantized file (feed it to Prequant Info's path, or pick "
                       "the file in Load Prequant Transformer's list).",)
    FUNCTION = "build"
    OUTPUT_NODE = True
    SEARCH_ALIASES = [*describe.scheme_names(), "quantized", "quantize", "pre-quantized", "prequant", "unsloth",
                      "torchao",
                      "save quantized model"]
    DESCRIPTION = (f"Quantizes a dense diffusion transformer ({describe.schemes_text()}) and writes a pre-quantized "
                   "checkpoint into models/prequant, in the same format as Unsloth's quantized files ("
                   + " / ".join(core.CONTAINERS) + "), or in ComfyUI's own quantized layout (comfyui-native, into "
                   "models/diffusion_models: the stock Load Diffusion Model loads it). Connect a MODEL from any stock "
                   "loader, or pick a dense file from diffusion_models. Or connect a CLIP (a dense text encoder from "
                   "Load CLIP): it writes Unsloth's pre-cast fp8 text encoder, which Load Prequant Text Encoder "
                   "loads. Returns the written path (feed it to Prequant Info).")

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "dense_file": (dense_file_choices(), {"tooltip": "A dense .safetensors in models/diffusion_models "
                               "(diffusers or ComfyUI keys; a shard of a diffusers folder builds the whole folder). "
                               "Leave on '(none)' to build from the model input."}),
                "scheme": (list(schemes.names()), {"default": schemes.DEFAULT, "tooltip": "int8 / fp8 quantize weights and "
                           "activations; the weight-only variants keep activations in bf16. nvfp4 (4-bit) / mxfp8: "
                           "per-block formats, written as .pt (set container to pt); they run natively on Blackwell "
                           "GPUs and dequantize at matmul time elsewhere."}),
                "base_model_id": ("STRING", {"default": "", "tooltip": "Recorded in the file so loaders can check it "
                                  "(e.g. Tongyi-MAI/Z-Image-Turbo). Empty: the family's base model.", "advanced": True}),
                "family": ([AUTO] + sorted(families.FAMILIES), {"default": AUTO, "tooltip": "The model family "
                           "(auto: detected from the weights' keys and shapes).", "advanced": True}),
                "filename": ("STRING", {"default": "", "tooltip": "File name inside models/prequant. Empty: "
                             "<Model>-<SCHEME>.<ext> from base_model_id."}),
                # Expert inputs last and folded as advanced (web/prequant.js maps workflows saved with the earlier
                # order by name).
                "min_features": ("INT", {"default": schemes.DEFAULT_MIN_FEATURES, "min": 1, "max": 65536,
                                         "tooltip": "Only Linear layers with in and out features >= this are "
                                                    "quantized.", "advanced": True}),
                "container": (list(core.OUTPUTS), {"default": "safetensors", "tooltip": "safetensors: no pickle, "
                              "safe to share. pt: torch.save container. comfyui-native: ComfyUI's own quantized "
                              "layout, written to models/diffusion_models: the stock Load Diffusion Model loads it "
                              "(fp8 from ComfyUI 0.3.68, nvfp4 from 0.8.0, mxfp8 from 0.18.0, int8 from 0.27.0), no "
                              "custom node needed."}),
                "overwrite": ("BOOLEAN", {"default": False, "tooltip": "Replace a file of the same name in "
                              "models/prequant (off: an existing file is kept and the build stops)."}),
            },
            "optional": {
                "model": ("MODEL", {"tooltip": "A dense MODEL from any loader (not one loaded pre-quantized)."}),
                "clip": ("CLIP", {"tooltip": "A dense text encoder (Load CLIP's CLIP): writes Unsloth's pre-cast "
                         "fp8 text encoder (<Model>-<component>-FP8) instead; scheme, min_features and component are "
                         "not used, family picks the model it is recorded for (auto: the first hosting this "
                         "encoder)."}),
                "component": ("STRING", {"default": "transformer", "tooltip": "Which transformer of the model this "
                              "is, recorded in the file and checked by the loader: transformer, or transformer_2 for "
                              "the low-noise expert of Wan 2.2 A14B (the default file name then gets -transformer_2).",
                              "advanced": True}),
            },
        }

    @classmethod
    def IS_CHANGED(cls, dense_file=NO_FILE, **kw):
        if dense_file and dense_file != NO_FILE:
            full = folder_paths.get_full_path("diffusion_models", dense_file)
            try:
                st = os.stat(full)
                return f"{full}:{st.st_mtime_ns}:{st.st_size}"
            except (OSError, TypeError):
                return str(full)
        return ""

    def build(self, dense_file, scheme, min_features, base_model_id, family, filename, container, overwrite,
              model=None, component="transformer", clip=None):
        use_file = bool(dense_file) and dense_file != NO_FILE
        if clip is not None:
            if use_file or model is not None:
                raise BuildError("A CLIP and a model input (or a dense_file) are set; the node builds from one.",
                                 fix="Disconnect the model / set dense_file to '(none)', or disconnect the CLIP.")
            return build_encoder(clip, family, base_model_id.strip(), filename, container, overwrite)
        if use_file and model is not None:
            raise BuildError("Both a model input and a dense_file are set; the node builds from one.",
                             fix="Disconnect the model, or set dense_file to '(none)'.")
        if not use_file and model is None:
            raise BuildError("Nothing to build from.", fix="Connect a MODEL, or pick a dense_file.")
        fam_arg = None if family == AUTO else family
        base = base_model_id.strip()
        if not base:
            fam_for_name = families.get(fam_arg) if fam_arg else None
            if fam_for_name is None and model is not None:
                fam_for_name = model_family(model, family)
            if fam_for_name is None:
                fam_for_name = dense_sources.open_input(
                    folder_paths.get_full_path_or_raise("diffusion_models", dense_file),
                    key_map=file_key_map).family
            base = fam_for_name.hosting.base_repos[0]
        component = core.check_component(component, fam_arg)
        name = check_filename(filename, container, base, scheme, component)
        native = container == core.NATIVE
        # a ComfyUI-native file is for ComfyUI's own Load Diffusion Model, which lists models/diffusion_models
        dest = os.path.join(native_folder() if native else output_folder(), name)
        refuse_shadowing("diffusion_models" if native else paths.FOLDER, name, dest)

        pbar = comfy.utils.ProgressBar(1000)

        def progress(stage, done, total, key):
            frac = done / max(total, 1)
            pbar.update_absolute(int(1000 * (frac * 0.9 if stage == "quantize" else 0.9 + 0.1 * frac)), 1000)

        with torch.no_grad():
            if native:
                res = build_native(model, dense_file if use_file else None, core.Target(dest, overwrite=overwrite),
                                   core.Recipe(scheme, family=family, base_model_id=base, min_features=min_features),
                                   progress)
            elif use_file:
                src_path = folder_paths.get_full_path_or_raise("diffusion_models", dense_file)
                res = core.build(src_path, core.Target(dest, container=container, overwrite=overwrite),
                                 core.Recipe(scheme, family=fam_arg, base_model_id=base, min_features=min_features,
                                             component=component),
                                 key_map=file_key_map, progress=progress)
            else:
                fam = model_family(model, family)
                sd = model_state_dict(model)
                # ComfyUI's own map for the config ComfyUI built this model from; None: the names are diffusers'
                key_map = key_map_for(fam, dict(model.model.model_config.unet_config),
                                      model_config=model.model.model_config)  # its names, this ComfyUI's
                res = core.build(sd, core.Target(dest, container=container, overwrite=overwrite),
                                 core.Recipe(scheme, family=fam, base_model_id=base, min_features=min_features,
                                             component=component),
                                 key_map=key_map, layout="comfyui" if key_map is not None else "diffusers",
                                 progress=progress)
        log.info("[prequant] %s", res.summary())
        info = {"file": os.path.basename(res.path), "path": res.path, "family": res.family, "scheme": res.scheme,
                "container": res.container, "quantized_layers": res.quantized, "size_bytes": res.file_bytes,
                "dense_bytes": res.dense_bytes, "input_layout": res.input_layout}
        return {"ui": {"text": [res.summary()], "prequant_build": [info]}, "result": (res.path,)}


def file_key_map(fam: Family, shapes: dict):
    """ComfyUI's own diffusers -> ComfyUI key map for a ComfyUI-layout file (config derived from its shapes)."""
    return key_map_for(fam, fam.config_from_shapes(shapes))


def build_encoder(clip, family: str, base: str, filename: str, container: str, overwrite: bool) -> dict:
    """Unsloth's pre-cast fp8 text encoder from a CLIP's weights (ComfyUI's names under the CLIP's own prefix)."""
    from prequant_core.builder import text_encoder
    if container == core.NATIVE:
        raise BuildError("A text encoder is written in Unsloth's format (safetensors or pt), not comfyui-native.",
                         found=container, expected="safetensors / pt", fix="Set container to safetensors.")
    unpatched(clip.patcher, "CLIP", "Connect the CLIP straight from its loader (before LoRA nodes).")
    sd = clip.cond_stage_model.state_dict()
    found = text_encoder.detect_comfy_encoder(sd)
    if found is None:
        raise BuildError("The CLIP holds no text encoder this pack writes.", found=f"{len(sd)} tensors",
                         expected=", ".join(k.name for k in encoders.KINDS if k.hostable),
                         fix="Connect the CLIP of one of these encoders (e.g. Load CLIP on qwen_3_4b.safetensors).")
    kind, prefix = found
    fam = family if family != AUTO else text_encoder.family_for_kind(kind)
    tensors = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}
    name = (filename or "").strip() or text_encoder.default_filename(fam, None, container)
    name = check_filename(name, container, base or fam, "fp8")
    dest = os.path.join(output_folder(), name)
    refuse_shadowing(paths.FOLDER, name, dest)
    pbar = comfy.utils.ProgressBar(1000)

    def progress(stage, done, total, key):
        pbar.update_absolute(int(1000 * done / max(total, 1)), 1000)

    with torch.no_grad():
        path = text_encoder.build_text_encoder_from(
            dense_sources.MemorySource(tensors, path="the CLIP input"), core.Target(dest, container, overwrite),
            family=fam, base_model_id=base or None, progress=progress)
    text = f"{kind.name} text encoder ({fam}) written as Unsloth's pre-cast fp8 file: {path}"
    log.info("[prequant] %s", text)
    info = {"file": os.path.basename(path), "path": path, "family": fam, "scheme": "fp8", "container": container,
            "encoder": kind.name, "size_bytes": os.path.getsize(path)}
    return {"ui": {"text": [text], "prequant_build": [info]}, "result": (path,)}
