"""The ``prequant`` model folder and the file list the loader offers."""
from __future__ import annotations

import os

import folder_paths

from prequant_core import schemes
from prequant_core.formats import containers

FOLDER = "prequant"
EXTENSIONS = containers.extensions()  # every container the readers know (prequant_core.formats.containers)
DIFFUSION_PREFIX = "diffusion_models/"
NONE_CHOICE = "(none: use path or hub_repo)"  # the loader's first entry
INFO_NONE_CHOICE = "(none: use path)"  # Prequant Info has no hub_repo
NONE_CHOICES = (NONE_CHOICE, INFO_NONE_CHOICE)  # either means "no listed file" to both nodes (older workflows)
# Name patterns of pre-quantized .pt files in diffusion_models (docs/FORMAT.md section 5: <Model>-<SCHEME>.pt and
# the legacy transformer_<scheme>.pt), one per scheme the pack reads; a .safetensors file is judged by its header.
def _name_tokens() -> tuple[str, ...]:
    # read from the scheme registry on each listing: a file named for any scheme is listed
    names = (s.name for s in schemes.registry.all_schemes())
    return tuple(dict.fromkeys(f"{sep}{n}" for n in names for sep in "-_")) + ("prequant",)
_header_cache: dict = {}


def register() -> None:
    default = os.path.join(folder_paths.models_dir, FOLDER)
    if FOLDER in folder_paths.folder_names_and_paths:
        paths, exts = folder_paths.folder_names_and_paths[FOLDER]
        # copies first: ComfyUI 0.12.1's pip-installable layout returns live views that re-assigning empties
        paths, exts = list(paths), set(exts)
        folder_paths.folder_names_and_paths[FOLDER] = (paths, exts | EXTENSIONS)
    else:
        # Extensions are given explicitly: an empty set means "no files" on some ComfyUI distributions.
        folder_paths.folder_names_and_paths[FOLDER] = ([default], set(EXTENSIONS))
    try:
        os.makedirs(default, exist_ok=True)
    except OSError:
        pass


def model_dirs() -> list[str]:
    dirs = []
    for name in (FOLDER, "diffusion_models"):
        try:
            dirs.extend(folder_paths.get_folder_paths(name))
        except (KeyError, AttributeError):
            pass
    return dirs


def _looks_prequant(full: str) -> bool:
    low = os.path.basename(full).lower()
    if full.endswith(".safetensors"):
        try:
            st = os.stat(full)
        except OSError:
            return False
        key = (full, st.st_mtime_ns, st.st_size)
        if key not in _header_cache:
            from prequant_core.formats.containers.safetensors_container import is_comfy_native, read_header
            try:
                index, meta, _ = read_header(full)
                # an Unsloth container, or ComfyUI's own quantized layout (this pack reads both)
                _header_cache[key] = "unsloth_format" in meta or is_comfy_native(index, meta)
            except Exception:  # noqa: BLE001 - an unreadable file is simply not offered
                _header_cache[key] = False
        return _header_cache[key]
    return low.endswith(".pt") and any(t in low for t in _name_tokens())


def download_dir() -> str:
    """Where Hub downloads go: the first folder ComfyUI lists for ``prequant`` (extra_model_paths.yaml honoured)."""
    try:
        dirs = folder_paths.get_folder_paths(FOLDER)
    except (KeyError, AttributeError):
        dirs = []
    d = dirs[0] if dirs else os.path.join(folder_paths.models_dir, FOLDER)
    os.makedirs(d, exist_ok=True)
    return d


def prequant_dirs() -> list[str]:
    try:
        return list(folder_paths.get_folder_paths(FOLDER))
    except (KeyError, AttributeError):
        return []


def _staging(f: str) -> bool:
    from prequant_core.hub.local import STAGING_DIR
    return f.replace("\\", "/").split("/", 1)[0] == STAGING_DIR


def choices(none: str = NONE_CHOICE) -> list[str]:
    own = sorted(f for f in folder_paths.get_filename_list(FOLDER)
                 if os.path.splitext(f)[1] in EXTENSIONS and not _staging(f))
    extra = []
    try:
        for f in folder_paths.get_filename_list("diffusion_models"):
            full = folder_paths.get_full_path("diffusion_models", f)
            if full and os.path.splitext(f)[1] in EXTENSIONS and _looks_prequant(full):
                extra.append(DIFFUSION_PREFIX + f)
    except KeyError:
        pass
    return [none] + own + sorted(extra)


NO_DENSE = "none"


def dense_choices() -> list[str]:
    """Dense fallback candidates: .safetensors in diffusion_models that are not pre-quantized."""
    out = []
    try:
        for f in folder_paths.get_filename_list("diffusion_models"):
            full = folder_paths.get_full_path("diffusion_models", f)
            if full and f.endswith(".safetensors") and not _looks_prequant(full):
                out.append(f)
    except KeyError:
        pass
    return [NO_DENSE] + sorted(out)


def resolve_dense(choice: str) -> str | None:
    if not choice or choice == NO_DENSE:
        return None
    return folder_paths.get_full_path_or_raise("diffusion_models", choice)


def _listed(choice: str, prefix: str, folder: str, get) -> str | None:
    """A listed choice's full path by ``get`` (ComfyUI's lookup, read at call time): ``prefix`` + a name in
    ``folder``, else a name in models/prequant; None for "(none)"."""
    if not choice or choice in NONE_CHOICES:
        return None
    return get(folder, choice[len(prefix):]) if choice.startswith(prefix) else get(FOLDER, choice)


def resolve(choice: str) -> str | None:
    return _listed(choice, DIFFUSION_PREFIX, "diffusion_models", folder_paths.get_full_path_or_raise)


def find(choice: str) -> str | None:
    """The listed file's full path; None for "(none)" and for a name that is in none of the folders (a workflow
    naming a file this user does not have yet: the loader may still download it)."""
    return _listed(choice, DIFFUSION_PREFIX, "diffusion_models", folder_paths.get_full_path)


def searched_folders(choice: str) -> list[str]:
    name = "diffusion_models" if choice.startswith(DIFFUSION_PREFIX) else FOLDER
    try:
        return list(folder_paths.get_folder_paths(name))
    except (KeyError, AttributeError):
        return []


def checkpoint_input(tooltip: str = "", none: str = NONE_CHOICE) -> tuple:
    """The file list both the loader and Prequant Info offer (``none``: the first entry, naming only inputs the node
    has)."""
    return (choices(none), {"tooltip": tooltip or "A pre-quantized file from models/prequant (or a pre-quantized file in "
                                              "models/diffusion_models)."})


def path_input(use: str = "", advanced: bool = True) -> tuple:
    return ("STRING", {"default": "", "tooltip": f"Explicit file path instead of the list{use}. Outside the model "
                                                 "folders it must lie under PREQUANT_ALLOW_LOCAL_PATH.",
                       "advanced": advanced})


# --- Load Prequant Text Encoder -------------------------------------------------------------------------------------
TE_FOLDER = "text_encoders"
TE_PREFIX = "text_encoders/"
NO_ENCODER = "none"


def _te_folder_files(name: str = TE_FOLDER) -> list[str]:
    try:
        return list(folder_paths.get_filename_list(name))
    except KeyError:
        return []


def _is_precast(full: str) -> bool:
    """A text_encoders file the pack's loader reads: an Unsloth pre-cast encoder (its header says), or a .pt named
    like one (``<Model>-<component>-FP8.pt``)."""
    if full.endswith(".safetensors"):
        from prequant_core.formats.containers.safetensors_container import read_header
        from prequant_core.text_encoders.checks import FORMATS
        try:
            st = os.stat(full)
            key = ("te", full, st.st_mtime_ns, st.st_size)
            if key not in _header_cache:
                _header_cache[key] = read_header(full)[1].get("unsloth_format") in FORMATS
            return _header_cache[key]
        except Exception:  # noqa: BLE001 - an unreadable file is simply not offered
            return False
    return full.endswith(".pt") and "text_encoder" in os.path.basename(full).lower()


def encoder_choices(none: str = NONE_CHOICE) -> list[str]:
    """models/prequant's files, then the pre-cast encoders in models/text_encoders."""
    own = [f for f in choices(none)[1:] if not f.startswith(DIFFUSION_PREFIX)]
    extra = []
    for f in _te_folder_files():
        full = folder_paths.get_full_path(TE_FOLDER, f)
        if full and os.path.splitext(f)[1] in EXTENSIONS and _is_precast(full):
            extra.append(TE_PREFIX + f)
    return [none] + own + sorted(extra)


def find_encoder(choice: str) -> str | None:
    return _listed(choice, TE_PREFIX, TE_FOLDER, folder_paths.get_full_path)


def encoder_dirs() -> list[str]:
    """Where a pre-cast encoder may be read from: models/prequant and models/text_encoders."""
    dirs = prequant_dirs()
    try:
        dirs += list(folder_paths.get_folder_paths(TE_FOLDER))
    except (KeyError, AttributeError):
        pass
    return dirs


def comfy_encoder_choices() -> list[str]:
    """ComfyUI's own encoder files (CLIP-L next to FLUX.1's T5), as CLIPLoader lists them."""
    return [NO_ENCODER] + sorted(f for f in _te_folder_files() if not _is_precast(
        folder_paths.get_full_path(TE_FOLDER, f) or ""))


def resolve_comfy_encoder(choice: str) -> str | None:
    if not choice or choice == NO_ENCODER:
        return None
    return folder_paths.get_full_path_or_raise(TE_FOLDER, choice)
