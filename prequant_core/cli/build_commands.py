"""``build`` and ``build-text-encoder``: their arguments (torch-free) and what runs them (the build package,
imported when they run)."""
from __future__ import annotations

import os

from . import choices
from .choices import NATIVE
from .progress import BuildBar


def add(subparsers) -> None:
    p = subparsers.add_parser(
        "build", help="make a pre-quantized checkpoint from a dense model",
        description="Quantize a dense diffusion transformer (torchao int8 / fp8 per-row, nvfp4 / mxfp8 per-block) "
                    "and write a pre-quantized checkpoint with diffusers key names and full metadata, or ComfyUI's "
                    "own quantized layout. Reads one tensor at a time (peak memory about the quantized size plus one "
                    "layer), shows one progress bar, and writes atomically. Exit status: 0 written, 2 refused "
                    "(nothing written).")
    p.add_argument("--input", "-i", required=True, metavar="PATH",
                   help="dense weights: a .safetensors file (diffusers or ComfyUI key layout) or a diffusers folder "
                        "(model root with transformer/config.json, or the transformer folder; sharded weights with "
                        "an index json are fine)")
    p.add_argument("--output", "-o", metavar="PATH", default=None,
                   help="output file, or an existing folder to write <Model>-<SCHEME>.<ext> into "
                        "(default: that name in the current folder)")
    p.add_argument("--scheme", type=choices.scheme, default=None, metavar="S",
                   help="quantization scheme: " + ", ".join(choices.SCHEMES) + f" (default: {choices.DEFAULT}; for "
                        "comfyui-native output from a pre-quantized input, the input's scheme)")
    p.add_argument("--min-features", type=int, default=choices.DEFAULT_MIN_FEATURES, metavar="N",
                   help="quantize only Linear layers whose in and out features are both >= N (default: %(default)s)")
    p.add_argument("--base-model-id", default=None, metavar="REPO",
                   help="base model recorded in the metadata (default: the family's base repo, e.g. "
                        "Tongyi-MAI/Z-Image-Turbo)")
    p.add_argument("--family", choices=["auto"] + choices.accepted_families(), default="auto",
                   help="model family (default: %(default)s, from config.json or the tensor names)")
    p.add_argument("--container", choices=["auto"] + list(choices.BUILD_CONTAINERS), default="auto",
                   help="file format: safetensors (safe, no pickle) or pt (torch.save); comfyui-native: ComfyUI's own "
                        "quantized layout, which ComfyUI's stock Load Diffusion Model reads (fp8 from ComfyUI 0.3.68, "
                        "nvfp4 0.8.0, mxfp8 0.18.0, int8 0.27.0), made from a dense file or from a pre-quantized one "
                        "(e.g. an Unsloth file); default auto: from the output extension, else safetensors")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output file (default: refuse)")
    p.add_argument("--component", default="transformer", metavar="NAME",
                   help="which transformer of the model the input is, recorded in the metadata (default: "
                        "%(default)s; transformer_2 for the low-noise expert of Wan 2.2 A14B)")
    p.add_argument("--comfyui", metavar="DIR", default=None,
                   help="a ComfyUI folder whose key map converts ComfyUI-layout input to diffusers names, or "
                        "diffusers names to ComfyUI's for comfyui-native output (only needed for families whose map "
                        "is ComfyUI's: Z-Image, FLUX.1, Qwen-Image, ...). Default: the ComfyUI this pack is installed "
                        "in, when it runs from ComfyUI/custom_nodes/")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar (the summary and path still print)")
    p.set_defaults(func=run_build)

    t = subparsers.add_parser(
        "build-text-encoder", help="make a pre-cast fp8 text encoder (Unsloth's format) from a dense one",
        description="Cast a dense text encoder the way Unsloth's builder does (every Linear weight stored as "
                    "float8_e4m3fn, no scale; embeddings and norms kept bf16) and write it in Unsloth's pre-cast "
                    "format, which Load Prequant Text Encoder loads at about half the memory. The input is ComfyUI's "
                    "own encoder file (e.g. qwen_3_4b.safetensors) or one with the transformers class's names. Exit "
                    "status: 0 written, 2 refused (nothing written).")
    t.add_argument("--input", "-i", required=True, metavar="PATH", help="the dense encoder (.safetensors)")
    t.add_argument("--family", required=True, choices=choices.encoder_families(),
                   help="the model the encoder belongs to (picks the encoder class and the file name)")
    t.add_argument("--component", default=None, choices=choices.ENCODER_COMPONENTS,
                   help="which encoder of the model (default: the family's hosted one)")
    t.add_argument("--base-model-id", default=None, metavar="REPO",
                   help="base model recorded in the metadata (default: the family's first base repo)")
    t.add_argument("--output", "-o", default=None, metavar="PATH",
                   help="output file or folder (default: Unsloth's name, e.g. Z-Image-Turbo-text_encoder-FP8"
                        ".safetensors, in the current folder)")
    t.add_argument("--container", choices=choices.ENCODER_CONTAINERS, default="safetensors",
                   help="file format (default: %(default)s)")
    t.add_argument("--overwrite", action="store_true", help="replace an existing output file (default: refuse)")
    t.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    t.set_defaults(func=run_build_text_encoder)


def run_build(args) -> int:
    from .. import builder, families, schemes
    family = None if args.family == "auto" else args.family
    comfy_dir = args.comfyui or builder.find_comfyui()
    key_map = builder.comfy_key_map_from(comfy_dir) if comfy_dir else None
    with BuildBar(quiet=args.quiet) as bar:
        if args.container == NATIVE:
            res = _native(args, family, bar)
        else:
            scheme = args.scheme or choices.DEFAULT
            output, container = args.output, args.container
            if output is None or os.path.isdir(output):
                folder = output or os.getcwd()
                fam = families.get(family) if family else builder.open_input(args.input, key_map=key_map).family
                c = builder.container_for(os.path.join(folder, "x"), container, schemes.normalize(scheme))
                base = args.base_model_id or fam.hosting.base_repos[0]
                output = os.path.join(folder, builder.default_filename(base, scheme, c, args.component))
            res = builder.build(args.input,
                                builder.Target(output, container=None if container == "auto" else container,
                                               overwrite=args.overwrite),
                                builder.Recipe(scheme, family=family, base_model_id=args.base_model_id,
                                               min_features=args.min_features, component=args.component),
                                key_map=key_map, progress=bar)
    print(res.summary())
    print(res.path)
    return 0


def _native(args, family: str | None, bar):
    """``--container comfyui-native``: from a dense .safetensors or from a pre-quantized file this pack reads (an
    Unsloth file turned into one stock ComfyUI loads); diffusers names are mapped to ComfyUI's with the family's own
    map, or ComfyUI's (``--comfyui DIR``)."""
    from .. import builder, families
    from ..errors import BuildError
    from ..families import keymap
    tensors, md, scheme_default = builder.read_native_input(args.input)
    fam, layout = (families.get(family), None) if family else families.detect(list(tensors), md, args.input)
    layout = layout or fam.layout_of(tensors) or "diffusers"
    scheme = args.scheme or scheme_default or choices.DEFAULT
    if layout == "diffusers" and fam.arch.comfy_key_map is not None:
        shapes = {k: tuple(v.shape) for k, v in tensors.items()}
        if callable(fam.arch.comfy_key_map):
            km = fam.arch.comfy_key_map(fam.config_from_shapes(shapes, args.input))
        elif args.comfyui or builder.find_comfyui():
            km = builder.comfy_key_map_from(args.comfyui or builder.find_comfyui())(fam, shapes)
        else:
            raise BuildError(f"{fam.title} files in diffusers' layout need ComfyUI's key map for ComfyUI-native "
                             "output, and no ComfyUI was found (this pack is not run from ComfyUI/custom_nodes/).",
                             path=args.input, fix="Add --comfyui DIR (your ComfyUI folder), or run the command from "
                                                  "ComfyUI/custom_nodes/ComfyUI-Prequant.")
        tensors = keymap.to_comfy_layout(tensors, km, path=args.input)
    output = args.output
    if output is None or os.path.isdir(output):
        output = os.path.join(output or os.getcwd(), builder.default_filename(
            args.base_model_id or md.get("base_model_id") or fam.hosting.base_repos[0], scheme, NATIVE, args.component))
    return builder.build_comfy_native(tensors, builder.Target(output, overwrite=args.overwrite),
                                      builder.Recipe(scheme, family=fam,
                                                     base_model_id=args.base_model_id or md.get("base_model_id"),
                                                     min_features=args.min_features),
                                      progress=bar, input_layout=layout)


def run_build_text_encoder(args) -> int:
    from ..builder.recipe import Target
    from ..builder.text_encoder import build_text_encoder, default_filename
    container = args.container
    dest = args.output or default_filename(args.family, args.component, container)
    if os.path.isdir(dest):
        dest = os.path.join(dest, default_filename(args.family, args.component, container))
    with BuildBar(quiet=args.quiet) as bar:
        path = build_text_encoder(args.input, Target(dest, container, args.overwrite), family=args.family,
                                  component=args.component, base_model_id=args.base_model_id, progress=bar)
    print(f"wrote {path} ({os.path.getsize(path) / 2**20:.0f} MiB)")
    return 0
