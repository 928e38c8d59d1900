"""Our own diffusers -> ComfyUI key maps, as data, for families whose ComfyUI has none in ``comfy.utils``.

A map is ``{diffusers_key: target}`` in the form ComfyUI's own maps (``comfy.utils.flux_to_diffusers`` ...) use:

- ``"comfy_key"``: the tensor moves as is;
- ``("comfy_key", (0, offset, length))``: it is a row slice of a fused ComfyUI weight (e.g. ``to_q/to_k/to_v`` ->
  ``qkv``), applied by :func:`prequant_core.keymap.to_comfy`;
- ``("comfy_key", slice_or_None, "row_permutation")``: its rows are reordered first (ComfyUI's third element is a
  function; ours is the name of a row permutation in :data:`ROW_PERMUTATIONS`, e.g. FLUX's final ``norm_out``
  stores ``(scale, shift)`` where ComfyUI's ``final_layer.adaLN_modulation`` wants ``(shift, scale)``).

Only row operations appear: per-row quantized weights carry one scale per output row, so moving, slicing,
concatenating and permuting rows is exact. No map here splits or fuses along the input dimension.

No ComfyUI import: the unet config passed in is the dict our families derive from the checkpoint's shapes.
"""
from __future__ import annotations

from typing import Callable, Mapping

from . import qtensor
from .errors import CorruptCheckpointError

# ---------------------------------------------------------------------------------------------------------------
# Row permutations (exact on per-row quantized tensors)


def swap_halves(t):
    """``(a, b)`` -> ``(b, a)`` along dim 0: ComfyUI's ``swap_scale_shift``, done row-wise (and self-inverse)."""
    n = t.shape[0]
    if n % 2:
        raise ValueError(f"cannot swap the halves of {n} rows")
    h = n // 2
    return qtensor.cat_rows([qtensor.slice_rows(t, h, h), qtensor.slice_rows(t, 0, h)])


ROW_PERMUTATIONS: dict[str, Callable] = {
    "swap_scale_shift": swap_halves,  # the name ComfyUI's own function carries (comfy.utils.swap_scale_shift)
}


def apply_row_permutations(tensors: Mapping, key_map: Mapping, *, path: str | None = None) -> tuple[dict, dict]:
    """Apply the map's row permutations to ``tensors``; returns (tensors, map) with only the plain and the
    row-slice forms left, ready for :func:`prequant_core.keymap.to_comfy`."""
    out = dict(tensors)
    plain = {}
    for dk, target in key_map.items():
        if isinstance(target, str) or len(target) == 2:
            plain[dk] = target
            continue
        name, sl, perm = target[0], target[1], target[2]
        fn = ROW_PERMUTATIONS.get(perm) if isinstance(perm, str) else None
        if fn is None:
            raise CorruptCheckpointError(f"The key map transforms '{dk}' with '{perm}', which is not a known row "
                                         f"permutation; this ComfyUI's map cannot be applied exactly to quantized "
                                         f"weights.", path=path, expected=", ".join(sorted(ROW_PERMUTATIONS)))
        if dk in out:
            try:
                out[dk] = fn(out[dk])
            except ValueError as e:
                raise CorruptCheckpointError(f"Cannot reorder the rows of '{dk}': {e}.", path=path) from None
        plain[dk] = name if sl is None else (name, sl)
    return out, plain


# ---------------------------------------------------------------------------------------------------------------
# Shared pieces


def _qkv(m: dict, src: str, dst: str, sizes: tuple[int, ...], names=("to_q", "to_k", "to_v"), ends=("weight",)):
    """``src.to_q/k/v.<end>`` -> rows of ``dst.<end>`` (sizes in the order of ``names``)."""
    for end in ends:
        off = 0
        for n, size in zip(names, sizes):
            m[f"{src}.{n}.{end}"] = (f"{dst}.{end}", (0, off, size))
            off += size


def _moves(m: dict, src: str, dst: str, pairs: Mapping[str, str], ends=("weight", "bias")):
    """Plain moves; a pair naming a module (no ``.weight``/``.bias`` ending) moves each of ``ends``."""
    for a, b in pairs.items():
        if a.endswith((".weight", ".bias")):
            m[f"{src}{a}"] = f"{dst}{b}"
        else:
            for end in ends:
                m[f"{src}{a}.{end}"] = f"{dst}{b}.{end}"


def _mlp_embedder(m: dict, src: str, dst: str, ends=("weight", "bias")):
    """diffusers ``TimestepEmbedding`` (linear_1/linear_2) -> ComfyUI ``MLPEmbedder`` (in_layer/out_layer)."""
    _moves(m, src, dst, {".linear_1": ".in_layer", ".linear_2": ".out_layer"}, ends)


# ---------------------------------------------------------------------------------------------------------------
# FLUX.2 (Flux2Transformer2DModel -> comfy.ldm.flux.model.Flux with image_model "flux2"). Linears carry no bias.


def flux2_to_diffusers(cfg: Mapping) -> dict:
    h = int(cfg["hidden_size"])
    m: dict = {}
    w = ("weight",)
    for i in range(int(cfg.get("depth", 0))):
        s, d = f"transformer_blocks.{i}", f"double_blocks.{i}"
        _qkv(m, f"{s}.attn", f"{d}.img_attn.qkv", (h, h, h), ends=w)
        _qkv(m, f"{s}.attn", f"{d}.txt_attn.qkv", (h, h, h), names=("add_q_proj", "add_k_proj", "add_v_proj"), ends=w)
        _moves(m, s + ".", d + ".", {
            "attn.to_out.0.weight": "img_attn.proj.weight", "attn.to_add_out.weight": "txt_attn.proj.weight",
            "attn.norm_q.weight": "img_attn.norm.query_norm.scale", "attn.norm_k.weight": "img_attn.norm.key_norm.scale",
            "attn.norm_added_q.weight": "txt_attn.norm.query_norm.scale",
            "attn.norm_added_k.weight": "txt_attn.norm.key_norm.scale",
            "ff.linear_in.weight": "img_mlp.0.weight", "ff.linear_out.weight": "img_mlp.2.weight",
            "ff_context.linear_in.weight": "txt_mlp.0.weight", "ff_context.linear_out.weight": "txt_mlp.2.weight",
        })
    for i in range(int(cfg.get("depth_single_blocks", 0))):
        s, d = f"single_transformer_blocks.{i}", f"single_blocks.{i}"
        _moves(m, s + ".", d + ".", {
            "attn.to_qkv_mlp_proj.weight": "linear1.weight", "attn.to_out.weight": "linear2.weight",
            "attn.norm_q.weight": "norm.query_norm.scale", "attn.norm_k.weight": "norm.key_norm.scale",
        })
    _moves(m, "", "", {
        "x_embedder.weight": "img_in.weight", "context_embedder.weight": "txt_in.weight",
        "double_stream_modulation_img.linear.weight": "double_stream_modulation_img.lin.weight",
        "double_stream_modulation_txt.linear.weight": "double_stream_modulation_txt.lin.weight",
        "single_stream_modulation.linear.weight": "single_stream_modulation.lin.weight",
        "proj_out.weight": "final_layer.linear.weight",
    })
    _mlp_embedder(m, "time_guidance_embed.timestep_embedder", "time_in", w)
    _mlp_embedder(m, "time_guidance_embed.guidance_embedder", "guidance_in", w)
    m["norm_out.linear.weight"] = ("final_layer.adaLN_modulation.1.weight", None, "swap_scale_shift")
    return m


# ---------------------------------------------------------------------------------------------------------------
# Lumina 2 (Lumina2Transformer2DModel -> comfy.ldm.lumina.model.NextDiT). Grouped-query attention: k/v rows are
# n_kv_heads * head_dim each.


def lumina2_to_diffusers(cfg: Mapping) -> dict:
    dim = int(cfg["dim"])
    hd = dim // int(cfg["n_heads"])
    kv = int(cfg.get("n_kv_heads") or cfg["n_heads"]) * hd
    m: dict = {}

    def block(s, d, modulation):
        _qkv(m, f"{s}.attn", f"{d}.attention.qkv", (dim, kv, kv), ends=("weight",))
        _moves(m, s + ".", d + ".", {
            "attn.norm_q.weight": "attention.q_norm.weight", "attn.norm_k.weight": "attention.k_norm.weight",
            "attn.to_out.0.weight": "attention.out.weight", "attn.to_out.0.bias": "attention.out.bias",
            "feed_forward.linear_1.weight": "feed_forward.w1.weight",
            "feed_forward.linear_2.weight": "feed_forward.w2.weight",
            "feed_forward.linear_3.weight": "feed_forward.w3.weight",
            "norm2.weight": "attention_norm2.weight",
            "ffn_norm1.weight": "ffn_norm1.weight", "ffn_norm2.weight": "ffn_norm2.weight",
        })
        if modulation:
            m[f"{s}.norm1.norm.weight"] = f"{d}.attention_norm1.weight"
            _moves(m, s + ".", d + ".", {"norm1.linear": "adaLN_modulation.1"})
        else:
            m[f"{s}.norm1.weight"] = f"{d}.attention_norm1.weight"

    for i in range(int(cfg.get("n_layers", 0))):
        block(f"layers.{i}", f"layers.{i}", True)
    for i in range(int(cfg.get("n_refiner_layers", 0))):
        block(f"noise_refiner.{i}", f"noise_refiner.{i}", True)
        block(f"context_refiner.{i}", f"context_refiner.{i}", False)
    _moves(m, "", "", {
        "x_embedder": "x_embedder", "time_caption_embed.caption_embedder.1": "cap_embedder.1",
        "time_caption_embed.timestep_embedder.linear_1": "t_embedder.mlp.0",
        "time_caption_embed.timestep_embedder.linear_2": "t_embedder.mlp.2",
        "norm_out.linear_1": "final_layer.adaLN_modulation.1", "norm_out.linear_2": "final_layer.linear",
    })
    m["time_caption_embed.caption_embedder.0.weight"] = "cap_embedder.0.weight"
    return m


# ---------------------------------------------------------------------------------------------------------------
# HunyuanImage 2.1 (HunyuanImageTransformer2DModel -> comfy.ldm.hunyuan_video.model.HunyuanVideo). The double and
# single blocks follow FLUX.1's layout (ComfyUI's flux_to_diffusers); the text token refiner, the ByT5 mapper and
# the time embedders have their own names.


def hunyuan_image_to_diffusers(cfg: Mapping) -> dict:
    h = int(cfg["hidden_size"])
    mlp = int(h * float(cfg.get("mlp_ratio", 4.0)))
    m: dict = {}
    wb = ("weight", "bias")
    for i in range(int(cfg.get("depth", 0))):
        s, d = f"transformer_blocks.{i}", f"double_blocks.{i}"
        _qkv(m, f"{s}.attn", f"{d}.img_attn.qkv", (h, h, h), ends=wb)
        _qkv(m, f"{s}.attn", f"{d}.txt_attn.qkv", (h, h, h), names=("add_q_proj", "add_k_proj", "add_v_proj"),
             ends=wb)
        _moves(m, s + ".", d + ".", {
            "attn.to_out.0": "img_attn.proj", "attn.to_add_out": "txt_attn.proj",
            "norm1.linear": "img_mod.lin", "norm1_context.linear": "txt_mod.lin",
            "ff.net.0.proj": "img_mlp.0", "ff.net.2": "img_mlp.2",
            "ff_context.net.0.proj": "txt_mlp.0", "ff_context.net.2": "txt_mlp.2",
        })
        _moves(m, s + ".", d + ".", {
            "attn.norm_q.weight": "img_attn.norm.query_norm.scale", "attn.norm_k.weight": "img_attn.norm.key_norm.scale",
            "attn.norm_added_q.weight": "txt_attn.norm.query_norm.scale",
            "attn.norm_added_k.weight": "txt_attn.norm.key_norm.scale",
        })
    for i in range(int(cfg.get("depth_single_blocks", 0))):
        s, d = f"single_transformer_blocks.{i}", f"single_blocks.{i}"
        _qkv(m, f"{s}.attn", f"{d}.linear1", (h, h, h), ends=wb)
        for end in wb:
            m[f"{s}.proj_mlp.{end}"] = (f"{d}.linear1.{end}", (0, 3 * h, mlp))
        _moves(m, s + ".", d + ".", {"proj_out": "linear2", "norm.linear": "modulation.lin"})
        _moves(m, s + ".", d + ".", {"attn.norm_q.weight": "norm.query_norm.scale",
                                     "attn.norm_k.weight": "norm.key_norm.scale"})
    ce = "context_embedder"
    for i in range(2):  # ComfyUI's TokenRefiner always has two blocks (as the released model)
        s, d = f"{ce}.token_refiner.refiner_blocks.{i}", f"txt_in.individual_token_refiner.blocks.{i}"
        _qkv(m, f"{s}.attn", f"{d}.self_attn.qkv", (h, h, h), ends=wb)
        _moves(m, s + ".", d + ".", {
            "attn.to_out.0": "self_attn.proj", "ff.net.0.proj": "mlp.0", "ff.net.2": "mlp.2",
            "norm1": "norm1", "norm2": "norm2", "norm_out.linear": "adaLN_modulation.1",
        })
    _moves(m, "", "", {
        "x_embedder.proj": "img_in.proj", f"{ce}.proj_in": "txt_in.input_embedder",
        "context_embedder_2.norm": "byt5_in.layernorm", "context_embedder_2.linear_1": "byt5_in.fc1",
        "context_embedder_2.linear_2": "byt5_in.fc2", "context_embedder_2.linear_3": "byt5_in.fc3",
        "proj_out": "final_layer.linear",
    })
    _mlp_embedder(m, f"{ce}.time_text_embed.timestep_embedder", "txt_in.t_embedder")
    _mlp_embedder(m, f"{ce}.time_text_embed.text_embedder", "txt_in.c_embedder")
    _mlp_embedder(m, "time_guidance_embed.timestep_embedder", "time_in")
    _mlp_embedder(m, "time_guidance_embed.timestep_embedder_r", "time_r_in")
    _mlp_embedder(m, "time_guidance_embed.guidance_embedder", "guidance_in")
    for end in wb:
        m[f"norm_out.linear.{end}"] = (f"final_layer.adaLN_modulation.1.{end}", None, "swap_scale_shift")
    return m


# ---------------------------------------------------------------------------------------------------------------
# Wan 2.1 / 2.2 (WanTransformer3DModel -> comfy.ldm.wan.model.WanModel): plain renames, no fused weights (the inverse
# of diffusers' own convert_wan_transformer_to_diffusers; ComfyUI's norm3 is the cross-attention norm, diffusers'
# norm2).


def wan_to_diffusers(cfg: Mapping) -> dict:
    m: dict = {}
    for i in range(int(cfg.get("num_layers", 0))):
        s = d = f"blocks.{i}."
        for a, b in (("attn1", "self_attn"), ("attn2", "cross_attn")):
            _moves(m, s, d, {f"{a}.to_q": f"{b}.q", f"{a}.to_k": f"{b}.k", f"{a}.to_v": f"{b}.v",
                             f"{a}.to_out.0": f"{b}.o"})
            _moves(m, s, d, {f"{a}.norm_q.weight": f"{b}.norm_q.weight", f"{a}.norm_k.weight": f"{b}.norm_k.weight"})
        _moves(m, s, d, {"ffn.net.0.proj": "ffn.0", "ffn.net.2": "ffn.2", "norm2": "norm3"})
        m[f"{s}scale_shift_table"] = f"{d}modulation"
    _moves(m, "", "", {
        "patch_embedding": "patch_embedding", "proj_out": "head.head",
        "condition_embedder.time_embedder.linear_1": "time_embedding.0",
        "condition_embedder.time_embedder.linear_2": "time_embedding.2",
        "condition_embedder.text_embedder.linear_1": "text_embedding.0",
        "condition_embedder.text_embedder.linear_2": "text_embedding.2",
        "condition_embedder.time_proj": "time_projection.1",
    })
    m["scale_shift_table"] = "head.modulation"
    return m


# ---------------------------------------------------------------------------------------------------------------
# HunyuanVideo 1.5 (HunyuanVideo15Transformer3DModel -> comfy.ldm.hunyuan_video.model.HunyuanVideo with
# cond_type_embedding and vision_in): HunyuanImage 2.1's double blocks, token refiner and ByT5 mapper, plus its own
# time embedder, condition-type embedding and image (SigLIP) projection.


def hunyuan_video15_to_diffusers(cfg: Mapping) -> dict:
    m = hunyuan_image_to_diffusers(cfg)
    for k in [k for k in m if k.startswith("time_guidance_embed.")]:  # HunyuanImage's names for the time embedders
        del m[k]
    _mlp_embedder(m, "time_embed.timestep_embedder", "time_in")
    _mlp_embedder(m, "time_embed.timestep_embedder_r", "time_r_in")
    m["cond_type_embed.weight"] = "cond_type_embedding.weight"
    _moves(m, "image_embedder.", "vision_in.proj.", {"norm_in": "0", "linear_1": "1", "linear_2": "3",
                                                      "norm_out": "4"})
    return m
