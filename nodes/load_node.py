"""Load Prequant Transformer."""
from __future__ import annotations

import logging
import os

import torch

from prequant_core import families, schemes
from prequant_core.load import companion_source, pipeline, route, sources
from prequant_core.errors import PrequantError, reading
from prequant_core.context import LoadContext
from prequant_core.request import Request
from prequant_core.safe_text import escape
from prequant_core.units import human_bytes

from . import describe, paths
from .status import NodeStatus
from .comfy_model import check_loadable, load_checkpoint_as_model
from .patcher import describe_class, stale_generation
from .quantize_at_load import load_quantized_at_load

log = logging.getLogger("prequant")
AUTO = "auto"


def _summary(opened, model_bytes: int) -> dict:
    ck = opened.checkpoint
    return {"file": os.path.basename(ck.path), "family": opened.family.name, "layout": opened.layout,
            "scheme": ck.metadata.get("scheme") or ",".join(sorted(ck.schemes_found())),
            "base_model_id": ck.metadata.get("base_model_id"), "container": ck.container,
            "quantized_layers": len(ck.quantized_keys), "size_bytes": model_bytes,
            "dense_bytes": ck.dense_nbytes(), "path": "pre-quantized", "notes": list(opened.verdict.notes),
            "location": ck.path}


def _dense_summary(p: route.LoadRoute, patcher) -> dict:
    from prequant_core.formats.dense_sources import dense_nbytes, open_dense
    quantized = sum(1 for m in patcher.model.diffusion_model.modules() if getattr(m, "prequant_spec", None))
    return {"file": os.path.basename(p.dense_path), "family": p.family.name, "layout": "dense",
            "scheme": p.scheme, "base_model_id": None, "container": "dense safetensors",
            "quantized_layers": quantized, "size_bytes": patcher.model_size(),
            "dense_bytes": dense_nbytes(open_dense(p.dense_path)),
            "path": "quantized at load", "why": p.skipped_because, "location": p.dense_path}


def summary_text(s: dict) -> str:
    text = (f"{s['family']} {s['scheme']} from {s['file']} ({s['container']}, {s['layout']} keys): "
            f"{s['quantized_layers']} quantized layers, {human_bytes(s['size_bytes'])} in memory "
            f"(dense {human_bytes(s['dense_bytes'])}); path: {s['path']}")
    if s.get("matmul"):
        text += f"; matmul: {s['matmul']}"
    if s.get("patcher"):
        text += f"; managed by ComfyUI's {s['patcher']}"
    if s.get("location"):
        text += f". File: {s['location']}"
    if s.get("source"):
        text += f" ({'downloaded' if s.get('downloaded') else 'earlier download'} from {s['source'][4:]})"
    if s.get("companion"):
        text += f"; with {s['companion']}"
    for note in s.get("notes") or []:
        text += f" Note: {note}"
    if s["path"] != "pre-quantized":
        why = "; ".join(s.get("why") or []) or "forced by policy"
        text += f" (pre-quantized file skipped: {why})"
    return escape(text)  # file names and reasons come from files: no control characters reach the UI or the log


def _interrupted() -> None:
    """ComfyUI's Cancel (/interrupt): raises its own exception, which stops a download at once."""
    import comfy.model_management as mm
    mm.throw_exception_if_processing_interrupted()


def _memory_guard():
    """The loader's memory check, told where ComfyUI will put the model and what it can unload first."""
    import comfy.model_management as mm
    from prequant_core.load import memory_check
    try:
        return memory_check.Guard(device=mm.get_torch_device(), lowvram=mm.vram_state != mm.VRAMState.HIGH_VRAM,
                            device_reclaimable=sum(m.model_loaded_memory() for m in mm.current_loaded_models))
    except AttributeError:  # a ComfyUI without these internals: the host check still applies
        return memory_check.Guard()


def load_context(status: NodeStatus, model_dirs, download_dir) -> LoadContext:
    """What ComfyUI gives a load, once per node run: its folders, the node's status lines and byte progress,
    its interrupt, and the memory guard told about its devices. The token is the client's own (HF_TOKEN or the
    stored login): a workflow never carries one."""
    return LoadContext.of(model_dirs=model_dirs, download_dir=download_dir, search_dirs=paths.prequant_dirs(),
                          progress=status.bytes, status=status.say, cancel=_interrupted, memory=_memory_guard())


DOWNLOAD_TO_MODELS = "models/prequant"
DOWNLOAD_TO_HF_CACHE = "Hugging Face cache"
# Inputs in the order the UI stores their values (widgets_values). Earlier layouts, which web/prequant.js maps to
# this one by name when an old workflow is opened: checkpoint, path, base_model_id, scheme, family [, hub_repo,
# preset, revision, hf_token [, min_features, policy, dense_fallback]]. hf_token is gone: tokens come from HF_TOKEN
# or `hf auth login` only, so none is ever saved in a workflow, the history or an image.
ALIASES = [*describe.scheme_names(), "quantized", "pre-quantized", "prequant", "unsloth", "torchao",
           "load diffusion model",
           "transformer", "unet"]


def _find_local(checkpoint: str, path: str) -> tuple[str | None, str | None]:
    """(file to open, name of a listed file that is missing). A typed path always wins."""
    if (path or "").strip():
        return path.strip(), None
    found = paths.find(checkpoint)
    if found or not checkpoint or checkpoint in paths.NONE_CHOICES:
        return found, None
    return None, checkpoint


class PrequantLoadTransformer:
    CATEGORY = "loaders/prequant"
    RETURN_TYPES = ("MODEL",)
    RETURN_NAMES = ("model",)
    OUTPUT_TOOLTIPS = (f"The diffusion model in ComfyUI's own model class for its family, with {describe.schemes_text()} "
                       "weights kept quantized: connect it where Load Diffusion Model's MODEL would go (KSampler, LoRA "
                       "loaders, shift nodes).",)
    FUNCTION = "load"
    SEARCH_ALIASES = ALIASES
    DESCRIPTION = (f"Loads a pre-quantized ({describe.schemes_text()}) diffusion transformer into ComfyUI's own model "
                   "class without ever materialising the dense model: " + describe.containers_text() + ". Families: "
                   + ", ".join(dict.fromkeys(f.title for f in families.FAMILIES.values())) + ". Takes a file from models/prequant, or downloads the one "
                   "a preset / hub_repo / family + scheme names into models/prequant. Aliases: int8, fp8, nvfp4, "
                   "quantized, unsloth.")

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "checkpoint": paths.checkpoint_input(
                    "A pre-quantized file from models/prequant (or one in models/diffusion_models). A workflow may "
                    "name a file you do not have yet: when its preset, hub_repo or family + scheme serve a file of "
                    "exactly that name, it is downloaded on the first run and used from models/prequant afterwards."),
            },
            "optional": {
                "preset": (sources.preset_labels(), {"default": sources.PRESET_NONE, "tooltip": "A hosted "
                           "pre-quantized model (Unsloth's repos on the Hugging Face Hub): used when no local file "
                           "is chosen; fills hub_repo, scheme and family where those are empty / auto."}),
                "hub_repo": ("STRING", {"default": "", "tooltip": "Download from this Hugging Face repo when no local "
                             "file is chosen, e.g. unsloth/Z-Image-Turbo-FP8 (uses 'scheme'; auto takes the repo's "
                             "-FP8 / -INT8 suffix). Gated or private repos: set HF_TOKEN or run `hf auth login` "
                             "before starting ComfyUI; no token is ever stored in the workflow."}),
                "scheme": ([AUTO] + list(schemes.names()), {"default": AUTO, "tooltip": "Refuse a file of another "
                           "scheme, and pick which file a Hub repo or family serves (auto: whatever the file or "
                           "repo name says). int8 / fp8 use quantized matmuls; -weight-only variants dequantize "
                           "rows at matmul time."}),
                "family": ([AUTO] + sorted(families.FAMILIES), {"default": AUTO, "tooltip": "The model family "
                           "(auto: read from the file). With a scheme and no file or repo, downloads the family's "
                           "hosted file.", "advanced": True}),
                "base_model_id": ("STRING", {"default": "", "tooltip": "Refuse the file unless it was built from this "
                                  "base (e.g. Tongyi-MAI/Z-Image-Turbo; the last path part is enough). For a family "
                                  "with several hosted repos it also picks the variant to download.", "advanced": True}),
                "policy": (list(route.POLICIES), {"default": route.PREQUANT_ONLY, "tooltip": "What to do "
                           "when the pre-quantized file is missing or refused: fail with the reasons, or quantize "
                           "the dense fallback at load time (same scheme and rules, same output), or always do that.",
                           "advanced": True}),
                "dense_fallback": (paths.dense_choices(), {"default": paths.NO_DENSE, "tooltip": "A dense (bf16) "
                                   "transformer .safetensors from models/diffusion_models, quantized while it is read "
                                   "(never whole in memory) when the policy allows.", "advanced": True}),
                # Folded as advanced inputs (the front end's "Show Advanced"); kept in this order, so workflows
                # saved with every value shown still load.
                "download_to": ([DOWNLOAD_TO_MODELS, DOWNLOAD_TO_HF_CACHE], {"default": DOWNLOAD_TO_MODELS,
                                "tooltip": "Where a Hub download is stored: models/prequant (the first folder "
                                "ComfyUI lists for it, so extra_model_paths.yaml is honoured; the file then shows in "
                                "the checkpoint list and later runs need no network), or the shared Hugging Face "
                                "cache (HF_HOME / HF_HUB_CACHE), reused by other tools.", "advanced": True}),
                "revision": ("STRING", {"default": "", "tooltip": "Branch, tag or commit to download (empty: the "
                             "default branch). Applies when the file is downloaded; a file already in models/prequant "
                             "is used as it is.", "advanced": True}),
                "min_features": ("INT", {"default": schemes.DEFAULT_MIN_FEATURES, "min": 0, "max": 65536,
                                         "tooltip": "Only Linears with in and out features >= this are quantized. A "
                                         "pre-quantized file built with another value is refused; the dense "
                                         "fallback quantizes with it.", "advanced": True}),
                "path": paths.path_input(),
                "component": (list(families.all_components()), {"default": "transformer", "tooltip": "Which "
                              "transformer of the model: transformer, or the second expert of a two-expert model "
                              "(Wan 2.2 A14B: transformer = high noise, transformer_2 = low noise). Picks that "
                              "expert's file from a Hub repo, and a file recording another component is refused.",
                              "advanced": True}),
            },
            "hidden": {"unique_id": "UNIQUE_ID"},  # where the status lines go (nodes/status.py)
        }

    @classmethod
    def VALIDATE_INPUTS(cls, checkpoint):
        """Takes the place of ComfyUI's list check for ``checkpoint`` only, so that a shared workflow naming a file
        this user does not have yet reaches ``load``, which downloads it when the node's preset / hub_repo / family
        serve exactly that file and otherwise fails naming the file and where to get it."""
        if checkpoint is None:  # linked from another node: judged when it runs
            return True
        if not isinstance(checkpoint, str):
            return f"checkpoint must be a file name, got {type(checkpoint).__name__}"
        if checkpoint in paths.NONE_CHOICES or checkpoint in paths.choices():
            return True
        if os.path.splitext(checkpoint)[1].lower() not in paths.EXTENSIONS:
            return f"'{checkpoint}' is not a .safetensors or .pt file name"
        return True

    @classmethod
    def IS_CHANGED(cls, checkpoint, path="", **kw):
        target, _ = _find_local(checkpoint, path)
        if not target:  # Hub source: same inputs, same file
            return "hub:" + "|".join(str(kw.get(k, "")) for k in ("hub_repo", "preset", "revision", "scheme",
                                                                  "family", "base_model_id", "download_to",
                                                                  "component")) + \
                f"|{checkpoint}|{stale_generation()}"
        # stale_generation: a model of this file was dropped (the file changed under a LoRA): load it again
        try:
            st = os.stat(target)
            return f"{target}:{st.st_mtime_ns}:{st.st_size}:{stale_generation(target)}"
        except (OSError, TypeError):
            return f"{target}"

    def load(self, checkpoint, preset=sources.PRESET_NONE, hub_repo="", scheme=AUTO, family=AUTO, base_model_id="",
             policy=route.PREQUANT_ONLY, dense_fallback=paths.NO_DENSE, download_to=DOWNLOAD_TO_MODELS,
             revision="", min_features=schemes.DEFAULT_MIN_FEATURES, path="", component="transformer", unique_id=None,
             **removed):
        if removed:  # e.g. hf_token from an API-format prompt made before it was removed: never read, never logged
            log.warning("[prequant] ignoring removed input(s) %s; set HF_TOKEN or run `hf auth login` for gated "
                        "repos", ", ".join(sorted(removed)))
        # The whole plan (which file, which path) is decided before anything is loaded, so a refused file never
        # costs the user the model that is resident now.
        status = NodeStatus(unique_id)
        local, missing = _find_local(checkpoint, path)
        component = (component or "").strip() or "transformer"
        src = sources.plan(sources.Wanted(local, hub_repo, family, scheme, base_model_id=base_model_id,
                                          revision=revision, preset=preset, component=component))
        if src.family and policy != route.DENSE_ONLY:  # a family this ComfyUI cannot build: say so before a download
            check_loadable(families.get(src.family))
        unavailable = None
        if missing and policy != route.DENSE_ONLY:  # a listed name this user does not have: only its Hub source
            try:
                src = sources.for_missing_file(missing, src, paths.searched_folders(missing))
            except PrequantError as e:
                unavailable = e
        req = Request(scheme=src.scheme, base_model_id=base_model_id.strip() or None, family=src.family,
                      min_features=min_features, component=component)
        # Tensors made under ComfyUI's inference mode could not later be moved or swapped outside it.
        with torch.inference_mode(False), torch.no_grad():
            # Order: typed path, listed file, hub_repo / preset, the family's hosted repo.
            ctx = load_context(status, paths.model_dirs(),
                               paths.download_dir() if download_to != DOWNLOAD_TO_HF_CACHE else None)
            routed = pipeline.run(src, req, ctx, fallback=route.Fallback(policy, paths.resolve_dense(dense_fallback)),
                                  unavailable=unavailable)
            p, located = routed.route, routed.located
            if p.taken == "pre-quantized":
                # weights the family's class holds beside the file's (LTX-2.3's text connectors): found before
                # anything is built, so a missing one costs nothing resident; never for a family this ComfyUI
                # cannot build (a local file names its family only once read)
                check_loadable(p.opened.family)
                extra = companion_source.find(p.opened.family, ctx) \
                    if companion_source.needed(p.opened.family, p.opened.checkpoint.tensors) else None
                status.say(f"loading {os.path.basename(p.opened.checkpoint.path)} into ComfyUI's "
                           f"{p.opened.family.name} model")
                # the file was read and judged already: a raw error here is typed by what happened (errors.reading)
                with reading(p.opened.checkpoint.path, "loaded", parsing=False):
                    patcher = load_checkpoint_as_model(p.opened.checkpoint, p.opened.family, p.opened.layout,
                                                       request=req, companion=extra)
                s = _summary(p.opened, patcher.model_size())
                if extra is not None:
                    s["companion"] = extra.source
            else:
                status.say(f"quantizing {os.path.basename(p.dense_path)} while reading it")
                patcher = load_quantized_at_load(p, progress=status.tensors, ctx=ctx)
                s = _dense_summary(p, patcher)
        if located and located.fetched and p.taken == "pre-quantized":
            f = located.fetched
            s.update(file=os.path.basename(f.path), source=f"hub:{f.repo}@{f.revision}", downloaded=f.downloaded,
                     repo_file=f.filename, location=f.path)
        s["matmul"] = getattr(patcher, "prequant_matmul", None)  # chosen at load for the load device
        s["patcher"] = describe_class(patcher)  # ComfyUI's own class (CoreModelPatcher), DynamicVRAM where it is on
        log.info("[prequant] %s", summary_text(s))
        return {"ui": {"prequant": [s], "text": [summary_text(s)]}, "result": (patcher,)}
