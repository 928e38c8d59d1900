"""Building pre-quantized checkpoints from dense weights.

Inputs: a dense state dict (e.g. the weights of a ComfyUI MODEL), a single dense ``.safetensors`` file in ComfyUI or
diffusers key layout, or a diffusers folder (``transformer/config.json`` + ``*.safetensors``, possibly sharded with
an index json). Output keys are always diffusers names. ComfyUI-layout input is converted with ComfyUI's own key map,
which the caller passes in (this package never imports ComfyUI: the node passes ``comfy.utils.<map>``, the command
line imports it from ``--comfyui DIR``); families whose map is our own (in its module under ``prequant_core.families``) need no ComfyUI.

Streaming: dense tensors are read one at a time with plain ``readinto`` (not ``safe_open``: its memory map keeps
every page it touched resident, so reading a whole file through it costs the dense size in RSS), cast and quantized
in row blocks (``quantize_rows``: bit for bit ``schemes.quantize_weight`` behind ``schemes.LayerFilter``, the one
implementation load-time quantization uses too) and dropped; freed heap pages are handed back to the OS as it goes.
Only the quantized result (about half the dense size) is held; the ``.safetensors`` writer streams it to disk tensor
by tensor without a second copy. Peak memory: quantized size + about one layer's codes + a few MB.

Writes are atomic: a temp file ``.prequant-<host>-<pid>-<random>.partial`` beside the destination, fsync, then a
no-clobber link (or rename when overwriting). A build killed outright (SIGKILL, power loss) can leave its temp file;
the next build in that folder removes temps whose process is gone (``clean_stale_temps``).
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Callable, Mapping

import torch

from .. import families, schemes
from ..formats import fingerprint
from ..schemes import qtensor
from ..formats import containers
from ..errors import BuildError
from ..formats.checkpoint import WRITE_ORDER
from ..families import Family

# the writable containers of the registry (docs/FORMAT.md sections 1 and 2), in the order the node offers them
CONTAINERS = tuple(c.name for c in sorted(containers.writable(), key=lambda c: c.name != "safetensors"))
EXTENSIONS = {c.name: c.extension for c in containers.writable()}

# The pieces live in their own modules (dense_sources, quantize, output_file, writers); callers import them from there.
from ..formats.dense_sources import KeyMapArg, check_dense, open_input  # noqa: E402
from .output_file import (_refuse_existing, atomic_output, check_free_space, check_output_name,
                          estimate_output_bytes, human_bytes)  # noqa: E402
from ..schemes.quantize import ProgressFn, quantize_items, quantize_tensors  # noqa: E402
from .writers import BuildProgress, write_checkpoint, write_error  # noqa: E402
from .recipe import Recipe, Target  # noqa: E402

# ----------------------------------------------------------------------------------------------------------------
# Metadata
# ----------------------------------------------------------------------------------------------------------------

def _dist_version(name: str) -> str | None:
    # importlib.metadata, not ``import diffusers``: the builder never needs diffusers itself, and importing it costs s.
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return None
    try:
        return str(version(name))
    except PackageNotFoundError:
        return None


def make_metadata(recipe: Recipe, tensors: Mapping) -> dict:
    """Every docs/FORMAT.md metadata field, in the order Unsloth's current builder writes them (``fp8_granularity``
    only for fp8, last), for ``recipe`` (its family a ``Family``). Version fields are plain ``str``
    (``torch.__version__`` would pickle as ``TorchVersion``, which strict ``weights_only`` readers may refuse)."""
    import torchao
    family = recipe.family
    rule = schemes.rules(recipe.scheme)
    values = {
        "base_model_id": str(recipe.base(family)), "family": family.name, "scheme": rule.name,
        "component": str(recipe.component), "min_features": int(recipe.min_features),
        "exclude_name_tokens": recipe.excluded(family),
        "require_bf16": rule.require_bf16, "require_divisible": rule.require_divisible,
        "fingerprint": fingerprint.compute(tensors), "fast_accum": rule.fast_accum,
        "torch_dtype": "bfloat16", "quant_backend": "torchao", "transformer_class": family.arch.diffusers_class,
        "torch_version": str(torch.__version__), "torchao_version": str(torchao.__version__),
        "diffusers_version": _dist_version("diffusers"),
    }
    if rule.fp8_granularity:
        values["fp8_granularity"] = rule.fp8_granularity
    out = {k: values[k] for k in WRITE_ORDER if k in values}
    if family.arch.metadata_from_tensors is not None:  # the form the weights are in (MiniMax-H3's pruned adaLN), last
        out.update(family.arch.metadata_from_tensors(tensors))
    return out


def check_component(component, family=None) -> str:
    """The component name to record: a plain identifier (``transformer``, ``transformer_2``); with a family given
    by name or object, one of its components."""
    c = str(component if component is not None else "transformer").strip() or "transformer"
    if not c.replace("_", "").isalnum() or not c.isascii() or len(c) > 64:
        raise BuildError("component must be a plain name such as transformer or transformer_2.", found=repr(c)[:80])
    fam = families.get(family) if isinstance(family, str) and family != "auto" else family
    if isinstance(fam, Family) and c not in fam.arch.components:
        raise BuildError(f"{fam.title} has no component '{c}'.", expected=" or ".join(fam.arch.components), found=c,
                         fix="Pick one of the family's components.")
    return c


# ----------------------------------------------------------------------------------------------------------------
# The build
# ----------------------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class BuildResult:
    path: str
    container: str
    family: str
    scheme: str
    base_model_id: str
    input_layout: str
    tensors: int
    quantized: int
    skipped: list[str]
    file_bytes: int
    dense_bytes: int
    estimated_bytes: int
    fingerprint: dict
    metadata: dict
    seconds: float

    def summary(self) -> str:
        return (f"Wrote {self.path}: {self.family} {self.scheme} ({self.container}), {self.quantized} quantized layers, "
                f"{len(self.skipped)} Linear layers kept dense, {human_bytes(self.file_bytes)} "
                f"(dense {human_bytes(self.dense_bytes)}), {self.seconds:.1f} s")


NATIVE = "comfyui-native"  # ComfyUI's own quantized layout: stock Load Diffusion Model loads it (no custom node)
OUTPUTS = CONTAINERS + (NATIVE,)  # what the Build node and the command line offer


def container_for(dest: str, container: str | None, scheme: str | None = None) -> str:
    ext = os.path.splitext(dest)[1].lower()
    if container == NATIVE:
        if ext and ext != ".safetensors":
            raise BuildError("A ComfyUI-native file is a .safetensors file.", path=dest, expected=".safetensors",
                             found=ext, fix="Name the file *.safetensors.")
        return NATIVE
    by_ext = {v: k for k, v in EXTENSIONS.items()}.get(ext)
    holds = [c for c in CONTAINERS if scheme is None or scheme in containers.writes_schemes(containers.by_name(c))]
    if container is None or container == "auto":
        container = by_ext or ("safetensors" if "safetensors" in holds else holds[0])
    if container in CONTAINERS and container not in holds:
        raise BuildError(f"{scheme} checkpoints are written as {' / '.join(EXTENSIONS[c] for c in holds)} only (the "
                         f"container Unsloth's {scheme} files use; this pack's {container} layout holds "
                         f"{' / '.join(containers.writes_schemes(containers.by_name(container)))} weights).", path=dest,
                         expected=f"the '{holds[0]}' container, a *{EXTENSIONS[holds[0]]} file name", found=container,
                         fix=f"Pick the '{holds[0]}' container and name the file *{EXTENSIONS[holds[0]]}.")
    if container not in CONTAINERS:
        raise BuildError(f"Unknown output container '{container}'.", expected=" or ".join(CONTAINERS), found=container)
    if by_ext and by_ext != container:
        raise BuildError("The output file name's extension does not match the container.", path=dest,
                         expected=EXTENSIONS[container], found=ext,
                         fix=f"Name the file *{EXTENSIONS[container]}, or pick the '{by_ext}' container.")
    return container


def default_filename(base_model_id: str, scheme: str, container: str, component: str = "transformer") -> str:
    """``<Model>-<SCHEME>.<ext>`` (docs/FORMAT.md section 5), Model = last part of the base model id; another
    component than ``transformer`` gets ``<Model>-<component>-<SCHEME>.<ext>`` (Unsloth's expert files)."""
    model = str(base_model_id).replace("\\", "/").rstrip("/").rsplit("/", 1)[-1] or "model"
    if component and component != "transformer":
        model = f"{model}-{component}"
    if container == NATIVE:  # Unsloth's name for the ComfyUI-native twin
        return check_output_name(f"{model}-{schemes.normalize(scheme).upper()}-ComfyUI.safetensors",
                                 origin=f"base_model_id '{str(base_model_id)[:80]}'")
    return check_output_name(f"{model}-{schemes.normalize(scheme).upper()}{EXTENSIONS[container]}",
                             origin=f"base_model_id '{str(base_model_id)[:80]}'")


def build(input, target: Target, recipe: Recipe, *, key_map: KeyMapArg = None, layout: str | None = None,
          progress: BuildProgress | None = None) -> BuildResult:
    """Dense model -> pre-quantized checkpoint at ``target`` (diffusers key names, every docs/FORMAT.md metadata
    field), made as ``recipe`` says (its component recorded in the metadata and checked by loaders).

    The builder's one entry for every client (the node, the command line, a script): the input, where and what, then
    how the input is read (``key_map``: ComfyUI's diffusers -> ComfyUI map, or ``fn(family, shapes) -> map``, for
    ComfyUI-layout input only; ``layout`` forces one) and the host's progress.
    ``input``: a state dict, a ``Source``, a dense ``.safetensors`` path or a diffusers folder.
    Refuses (``BuildError``) before reading any weight: existing output, unknown family, too little disk space.
    """
    t0 = time.time()
    scheme = schemes.normalize(recipe.scheme)
    component = check_component(recipe.component, recipe.family)
    dest = os.path.abspath(os.fspath(target.dest))
    container = container_for(dest, target.container, scheme)
    try:
        min_features = int(recipe.min_features)
    except (TypeError, ValueError):
        raise BuildError("min_features must be an integer.", found=repr(recipe.min_features)) from None
    if min_features < 1:
        raise BuildError("min_features must be at least 1.", found=str(min_features))
    _refuse_existing(dest, target.overwrite)
    folder = os.path.dirname(dest)
    if not os.path.isdir(folder):
        raise BuildError("The output folder does not exist.", path=folder, fix="Create it or pick another folder.")

    prep = open_input(input, family=recipe.family, key_map=key_map, layout=layout)
    fam, src = prep.family, prep.source
    component = check_component(component, fam)
    made = dataclasses.replace(recipe, scheme=scheme, family=fam, base_model_id=recipe.base(fam),
                               min_features=min_features, component=component, exclude=recipe.excluded(fam))
    base_model_id = made.base_model_id
    flt = schemes.LayerFilter(scheme, min_features, tuple(made.exclude))
    infos = src.infos()
    estimate, n_q = estimate_output_bytes(infos, flt)
    if n_q == 0:
        raise BuildError("No Linear layer passes the filter, so nothing would be quantized.", path=src.path,
                         expected=f"Linear layers with in and out features >= min_features ({min_features})",
                         fix="Lower min_features.")
    check_free_space(folder, estimate)

    total = len(infos)
    qprog = (lambda done, tot: progress("quantize", done, tot, "")) if progress else None
    q, skipped = quantize_items(src.items(), flt, total=total, progress=qprog)
    meta = make_metadata(made, q)
    path = write_checkpoint(dest, q, meta, container=container, overwrite=target.overwrite, progress=progress)
    return BuildResult(path=path, container=container, family=fam.name, scheme=scheme, base_model_id=base_model_id,
                       input_layout=prep.input_layout, tensors=len(q),
                       quantized=sum(1 for v in q.values() if qtensor.is_quantized(v)), skipped=sorted(skipped),
                       file_bytes=os.path.getsize(path), dense_bytes=sum(i.nbytes for i in infos.values()),
                       estimated_bytes=estimate, fingerprint=meta["fingerprint"], metadata=meta,
                       seconds=time.time() - t0)


def check_dense_input(tensors: Mapping, where: str) -> None:
    """A build's unquantized inputs pass the dense-input rule (``dense_sources.check_dense``), quantized ones pass."""
    for k, v in tensors.items():
        if not qtensor.is_quantized(v):
            check_dense(k, v, where)


def read_native_input(path: str) -> tuple[dict, dict, str | None]:
    """(tensors, metadata, the scheme it records) of a ComfyUI-native build's input file: read by the pack's own
    readers, which refuse what they refuse (never a fallback to an unchecked read), then checked as a dense input."""
    from .. import formats
    ck = formats.read(path)
    check_dense_input(ck.tensors, ck.path)
    return ck.tensors, ck.metadata, ck.metadata.get("scheme")


def build_comfy_native(tensors: Mapping, target: Target, recipe: Recipe, *, progress: BuildProgress | None = None,
                       input_layout: str = "comfyui") -> BuildResult:
    """ComfyUI-layout tensors (dense, or already quantized: an Unsloth file's weights mapped to ComfyUI names) ->
    a ComfyUI-native file (docs/FORMAT.md section 6) that ComfyUI's own Load Diffusion Model reads where that ComfyUI
    knows the format (float8_e4m3fn: 0.3.68+, nvfp4: 0.8.0+, mxfp8: 0.18.0+, int8_tensorwise: 0.27.0+). Written
    atomically. Holds the input in memory (the ComfyUI layout fuses q / k / v). Its input is checked where it is
    read: read_native_input for a file, check_dense_input for a model already in memory."""
    from ..formats.containers import comfy_native
    t0 = time.time()
    scheme, family, overwrite = schemes.normalize(recipe.scheme), recipe.family, target.overwrite
    dest = os.path.abspath(os.fspath(target.dest))
    container_for(dest, NATIVE, scheme)
    _refuse_existing(dest, overwrite)
    base_model_id = recipe.base(family)
    out, layers, skipped = comfy_native.native_tensors(tensors, scheme, min_features=recipe.min_features,
                                                       progress=progress)
    if not layers:
        raise BuildError("No Linear layer of the transformer's blocks passes the filter, so nothing would be "
                         "quantized.", path=dest, fix="Lower min_features.")
    meta = {"base_model_id": base_model_id, "family": family.name, "scheme": scheme}
    nbytes = sum(t.numel() * t.element_size() for t in out.values())
    check_free_space(os.path.dirname(dest), nbytes)
    try:
        with atomic_output(dest, overwrite=overwrite) as tmp:
            comfy_native.write_native(tmp, out, layers, meta)
    except OSError as e:  # a full disk, a file size limit, a read-only drive: said plainly, as for the other writers
        err = write_error(e, dest)
        if err is None:
            raise
        raise err from None
    if progress:
        progress("write", 1, 1, "")
    dense_bytes = sum(qtensor.dense_nbytes(v) if qtensor.is_quantized(v) else v.numel() * v.element_size()
                      for v in tensors.values())
    return BuildResult(path=dest, container=NATIVE, family=family.name, scheme=scheme, base_model_id=base_model_id,
                       input_layout=input_layout, tensors=len(out), quantized=len(layers), skipped=sorted(skipped),
                       file_bytes=os.path.getsize(dest), dense_bytes=dense_bytes, estimated_bytes=nbytes,
                       fingerprint={}, metadata={**meta, "comfy_quant_formats": {comfy_native.native_format(scheme):
                                                                                   len(layers)}},
                       seconds=time.time() - t0)


def build_from_tensors(dense: Mapping, target: Target, recipe: Recipe, *, progress: ProgressFn | None = None) -> str:
    """Dense state dict -> checkpoint file with the keys exactly as given (either layout; tests build ComfyUI-layout
    files this way), ``recipe``'s family a ``Family``. ``build`` is the user-facing entry that always writes
    diffusers names. The target's container None: from the file name (``container_for``), refused where the scheme
    does not fit the container."""
    scheme = schemes.normalize(recipe.scheme)
    container = container_for(os.path.abspath(os.fspath(target.dest)), target.container, scheme)
    made = dataclasses.replace(recipe, scheme=scheme, exclude=recipe.excluded(recipe.family))
    q, _ = quantize_tensors(dense, scheme, min_features=made.min_features, exclude=made.exclude, progress=progress)
    return write_checkpoint(target.dest, q, make_metadata(made, q), container=container, overwrite=target.overwrite)


# ----------------------------------------------------------------------------------------------------------------
# ComfyUI's key maps for the command line (prequant_core/cli/build_commands.py)
# ----------------------------------------------------------------------------------------------------------------

def find_comfyui() -> str | None:
    """The ComfyUI this pack is installed in (``<ComfyUI>/custom_nodes/<this pack>``), or None. Looked for from the
    pack's own folder and from the shell's current folder as typed (``$PWD`` keeps a symlinked custom_nodes entry,
    which ``os.getcwd()`` resolves away)."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    starts = [here]
    if os.environ.get("PWD"):
        starts.append(os.environ["PWD"])
    for start in starts:
        d = start
        for _ in range(4):  # the pack's root, or a folder inside it
            parent = os.path.dirname(d)
            if os.path.basename(parent) == "custom_nodes":
                root = os.path.dirname(parent)
                if os.path.isfile(os.path.join(root, "comfy", "utils.py")):
                    return root
            if parent == d:
                break
            d = parent
    return None


def comfy_key_map_from(comfy_dir: str) -> Callable[[Family, dict], Mapping]:
    """Key-map provider backed by a ComfyUI checkout's ``comfy.utils`` (imported from ``comfy_dir``)."""
    comfy_dir = os.path.abspath(comfy_dir)
    if not os.path.isfile(os.path.join(comfy_dir, "comfy", "utils.py")):
        raise BuildError("This is not a ComfyUI folder.", path=comfy_dir, expected="a folder containing comfy/utils.py",
                         fix="Point --comfyui at your ComfyUI installation.")

    def provider(fam: Family, shapes: dict) -> Mapping:
        if comfy_dir not in sys.path:
            sys.path.insert(0, comfy_dir)
        if fam.arch.comfy_key_map is None or callable(fam.arch.comfy_key_map):
            return None if fam.arch.comfy_key_map is None else fam.arch.comfy_key_map(fam.config_from_shapes(shapes))
        import comfy.utils
        fn = getattr(comfy.utils, fam.arch.comfy_key_map, None)
        if fn is None:
            raise BuildError(f"This ComfyUI has no key map for {fam.title} (comfy.utils.{fam.arch.comfy_key_map}).",
                             path=comfy_dir, fix="Update ComfyUI.")
        return fn(fam.config_from_shapes(shapes))
    return provider
