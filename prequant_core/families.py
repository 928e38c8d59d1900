"""The one registry of model families. Adding a family is one ``Family(...)`` entry plus its test.

Everything ComfyUI-specific is named here as data (class and key-map names, a config derived from shapes); only
``nodes/comfy_model.py`` resolves those names against the running ComfyUI.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Callable, Mapping

from . import keymaps
from .errors import UnknownFamilyError

Shapes = Mapping[str, tuple]


def count_blocks(shapes: Shapes, prefix: str) -> int:
    pat = re.compile(re.escape(prefix) + r"(\d+)\.")
    idx = {int(m.group(1)) for k in shapes for m in [pat.match(k)] if m}
    return max(idx) + 1 if idx else 0


def _has(keys: set, marker) -> bool:
    return all(k in keys for k in ((marker,) if isinstance(marker, str) else marker))


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    title: str
    diffusers_class: str
    base_repos: tuple[str, ...]
    hosted_repos: tuple[str, ...]
    int8_exclude_extra: tuple[str, ...]
    diffusers_markers: tuple  # keys only a diffusers-layout file of this family has (a key, or a tuple: all of them)
    comfy_markers: tuple  # the same for a ComfyUI-layout file; empty where both layouts are the same
    # Class name(s) in comfy.supported_models. Several: the first whose own ``unet_config`` matches the derived config
    # (ComfyUI's own rule), e.g. FLUX.1 dev (guidance embedder) vs schnell (none).
    comfy_model: str | tuple[str, ...]
    # diffusers -> ComfyUI key map, {diffusers key: comfy key | (comfy key, (0, offset, length)) | (.., .., permutation)}:
    # a str names a function in comfy.utils taking the unet config (ComfyUI's own map), a callable is our own map in
    # prequant_core.keymaps, None means the diffusers names already are ComfyUI's.
    comfy_key_map: str | Callable[[Mapping], dict] | None
    # ComfyUI unet config from the file's shapes (either layout); None: no ComfyUI version this pack can test has the
    # family's class, so the loader node refuses it naming ``min_comfy`` (Info, verify, build, Hub resolution and the
    # diffusers loader still work).
    comfy_unet_config: Callable[[Shapes, dict], dict] | None
    # Skeleton entries a checkpoint may lack because ComfyUI's module has them but never uses them.
    fill_missing: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # Oldest ComfyUI that runs the family end to end (model class and the text encoder its workflow needs); named in
    # the error when the running ComfyUI lacks the class or key map (the loader refuses only then).
    min_comfy: str = "0.3.75"
    # Bases that must never get this family's hosted files (another model of the same name family, e.g. the
    # non-Turbo Z-Image), compared exactly or by last path part, case-insensitively (newer Unsloth releases).
    excluded_bases: tuple[str, ...] = ()
    # Hub file names a hosted repo declares, tried before the generic chain: {repo: {scheme: filename}}.
    hub_filenames: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)
    # The model's transformers: one, or several experts (Wan 2.2 A14B: ``transformer`` for high noise,
    # ``transformer_2`` for low noise), each its own file whose metadata records its ``component``.
    components: tuple[str, ...] = ("transformer",)
    # Hub file names per component other than ``transformer``: {repo: {component: {scheme: filename}}}.
    hub_component_filenames: Mapping[str, Mapping[str, Mapping[str, str]]] = dataclasses.field(default_factory=dict)
    # One repo hosting a file per base (HunyuanVideo 1.5 480p / 720p): {repo: {base: {scheme: filename}}}; the
    # requested base picks its file, without one every variant's name is tried in the order listed.
    variant_filenames: Mapping[str, Mapping[str, Mapping[str, str]]] = dataclasses.field(default_factory=dict)
    # Families sharing class and key names (Wan 2.2 TI2V-5B / A14B): which one a file without a ``family`` field is,
    # from its shapes (tried in registry order when ``detect`` is given shapes).
    shape_test: Callable[[Shapes], bool] | None = None

    def excluded_base(self, wanted: str | None) -> str | None:
        """The excluded base ``wanted`` names, else None."""
        if not wanted:
            return None
        for ex in self.excluded_bases:
            if normalize_base(ex) == normalize_base(wanted) or base_tail(ex) == base_tail(wanted):
                return ex
        return None

    @property
    def comfy_models(self) -> tuple[str, ...]:
        return (self.comfy_model,) if isinstance(self.comfy_model, str) else tuple(self.comfy_model)

    def layout_of(self, keys) -> str | None:
        keys = set(keys)
        if any(_has(keys, m) for m in self.diffusers_markers):
            return "diffusers"
        if any(_has(keys, m) for m in self.comfy_markers):
            return "comfyui"
        return None


def normalize_base(s: str) -> str:
    """Lower-case, backslashes as slashes, no trailing slash (Unsloth's rule: a Windows folder path such as
    ``C:\\models\\Z-Image-Turbo`` compares by its last part like a repo id)."""
    return str(s).strip().replace("\\", "/").rstrip("/").lower()


def base_tail(s: str) -> str:
    return normalize_base(s).rsplit("/", 1)[-1]


def first(shapes: Shapes, *keys: str) -> tuple:
    """Shape of the first key present: configs are derived from files in either key layout."""
    for k in keys:
        if k in shapes:
            return shapes[k]
    raise KeyError(keys[0])


def _z_image_config(shapes: Shapes, meta: dict) -> dict:
    dim, cap_feat_dim = shapes["cap_embedder.1.weight"]
    # Z-Image's head is 128 wide (rope axes 32/48/48) at every size; ComfyUI's own detection only knows dim 3840.
    cfg = {
        "image_model": "lumina2", "patch_size": 2, "in_channels": first(shapes, "x_embedder.weight", "all_x_embedder.2-1.weight")[1] // 4,
        "dim": dim, "cap_feat_dim": cap_feat_dim, "n_layers": count_blocks(shapes, "layers."),
        "n_refiner_layers": count_blocks(shapes, "noise_refiner."), "qk_norm": True,
        "n_heads": dim // 128, "n_kv_heads": dim // 128, "axes_dims": [32, 48, 48], "axes_lens": [1536, 512, 512],
        "rope_theta": 256.0, "ffn_dim_multiplier": 8.0 / 3.0, "z_image_modulation": True, "time_scale": 1000.0,
    }
    if "cap_pad_token" in shapes:
        cfg["pad_tokens_multiple"] = 32
    return cfg


def blocks(shapes: Shapes, *prefixes: str) -> int:
    """Block count under the first prefix that has any (one prefix per key layout)."""
    for p in prefixes:
        n = count_blocks(shapes, p)
        if n:
            return n
    return 0


def has_any(shapes: Shapes, *keys: str) -> bool:
    return any(k in shapes for k in keys)


def _flux_config(shapes: Shapes, meta: dict) -> dict:
    hidden, in_ch = first(shapes, "x_embedder.weight", "img_in.weight")
    head = first(shapes, "transformer_blocks.0.attn.norm_q.weight", "double_blocks.0.img_attn.norm.query_norm.scale")[0]
    # ComfyUI's detection assumes hidden 3072 / 24 heads; FLUX.1's head is 128 wide (rope axes 16/56/56) at any size.
    return {
        "image_model": "flux", "in_channels": in_ch // 4, "patch_size": 2,
        "out_channels": first(shapes, "proj_out.weight", "final_layer.linear.weight")[0] // 4,
        "vec_in_dim": first(shapes, "time_text_embed.text_embedder.linear_1.weight", "vector_in.in_layer.weight")[1],
        "context_in_dim": first(shapes, "context_embedder.weight", "txt_in.weight")[1],
        "hidden_size": hidden, "num_heads": hidden // head,
        "mlp_ratio": first(shapes, "transformer_blocks.0.ff.net.0.proj.weight", "double_blocks.0.img_mlp.0.weight")[0]
        / hidden,
        "depth": blocks(shapes, "transformer_blocks.", "double_blocks."),
        "depth_single_blocks": blocks(shapes, "single_transformer_blocks.", "single_blocks."),
        "axes_dim": [16, 56, 56], "theta": 10000,
        "qkv_bias": has_any(shapes, "transformer_blocks.0.attn.to_q.bias", "double_blocks.0.img_attn.qkv.bias"),
        "guidance_embed": has_any(shapes, "time_text_embed.guidance_embedder.linear_1.weight",
                                  "guidance_in.in_layer.weight"),
    }


def _flux2_config(shapes: Shapes, meta: dict) -> dict:
    hidden, in_ch = first(shapes, "x_embedder.weight", "img_in.weight")
    head = first(shapes, "transformer_blocks.0.attn.norm_q.weight", "double_blocks.0.img_attn.norm.query_norm.scale")[0]
    # ComfyUI's detection hard-codes FLUX.2-dev's 48 heads; klein (24) and tiny models need heads = hidden / 128.
    return {
        "image_model": "flux2", "in_channels": in_ch, "patch_size": 1,
        "out_channels": first(shapes, "proj_out.weight", "final_layer.linear.weight")[0],
        "vec_in_dim": None, "context_in_dim": first(shapes, "context_embedder.weight", "txt_in.weight")[1],
        "hidden_size": hidden, "num_heads": hidden // head,
        "mlp_ratio": first(shapes, "transformer_blocks.0.ff.linear_in.weight", "double_blocks.0.img_mlp.0.weight")[0]
        / 2 / hidden,
        "depth": blocks(shapes, "transformer_blocks.", "double_blocks."),
        "depth_single_blocks": blocks(shapes, "single_transformer_blocks.", "single_blocks."),
        "axes_dim": [32, 32, 32, 32], "theta": 2000, "qkv_bias": False, "ops_bias": False, "mlp_silu_act": True,
        "global_modulation": True, "default_ref_method": "index", "ref_index_scale": 10.0,
        "guidance_embed": has_any(shapes, "time_guidance_embed.guidance_embedder.linear_1.weight",
                                  "guidance_in.in_layer.weight"),
    }


def _qwen_image_config(shapes: Shapes, meta: dict) -> dict:
    inner, in_ch = shapes["img_in.weight"]
    head = shapes["transformer_blocks.0.attn.norm_q.weight"][0]
    return {
        "image_model": "qwen_image", "patch_size": 2, "in_channels": in_ch,
        "out_channels": shapes["proj_out.weight"][0] // 4, "num_layers": count_blocks(shapes, "transformer_blocks."),
        "attention_head_dim": head, "num_attention_heads": inner // head,
        "joint_attention_dim": shapes["txt_in.weight"][1], "axes_dims_rope": [16, 56, 56],
    }


def _lumina2_config(shapes: Shapes, meta: dict) -> dict:
    dim, cap_feat_dim = first(shapes, "time_caption_embed.caption_embedder.1.weight", "cap_embedder.1.weight")
    head = first(shapes, "layers.0.attn.norm_q.weight", "layers.0.attention.q_norm.weight")[0]
    if "layers.0.attn.to_k.weight" in shapes:
        kv_heads = shapes["layers.0.attn.to_k.weight"][0] // head
    else:
        kv_heads = (shapes["layers.0.attention.qkv.weight"][0] // head - dim // head) // 2
    ffn = first(shapes, "layers.0.feed_forward.linear_1.weight", "layers.0.feed_forward.w1.weight")[0]
    # ComfyUI's detection knows only dim 2304 (and reads diffusers files as OmniGen2). Lumina 2's head is 96 wide
    # (rope axes 32/32/32); ComfyUI's FFN width is ffn_dim_multiplier * dim (diffusers': 4 * dim * its multiplier).
    return {
        "image_model": "lumina2", "patch_size": 2, "in_channels": first(shapes, "x_embedder.weight")[1] // 4,
        "dim": dim, "cap_feat_dim": cap_feat_dim, "n_layers": count_blocks(shapes, "layers."),
        "n_refiner_layers": count_blocks(shapes, "noise_refiner."), "qk_norm": True,
        "n_heads": dim // head, "n_kv_heads": kv_heads, "axes_dims": [32, 32, 32], "axes_lens": [300, 512, 512],
        "rope_theta": 10000.0, "ffn_dim_multiplier": ffn / dim,
    }


# HiDream-I1's text-layer schedule (ComfyUI's detection): which Llama-3.1 hidden layer feeds each block.
HIDREAM_LLAMA_LAYERS = list(range(32)) + [31] * 16


def _hidream_config(shapes: Shapes, meta: dict) -> dict:
    inner, patch_in = shapes["x_embedder.proj.weight"]
    n_double = count_blocks(shapes, "double_stream_blocks.")
    n_single = count_blocks(shapes, "single_stream_blocks.")
    n_caption = count_blocks(shapes, "caption_projection.")
    n_blocks = n_double + n_single
    layers = HIDREAM_LLAMA_LAYERS if n_blocks == len(HIDREAM_LLAMA_LAYERS) else list(range(n_blocks))
    return {
        "image_model": "hidream", "patch_size": 2, "in_channels": patch_in // 4,
        "out_channels": shapes["final_layer.linear.weight"][0] // 4,
        "num_layers": n_double, "num_single_layers": n_single,
        "attention_head_dim": 128, "num_attention_heads": inner // 128,
        "caption_channels": [shapes[f"caption_projection.{n_caption - 1}.linear.weight"][1],
                             shapes["caption_projection.0.linear.weight"][1]],
        "text_emb_dim": shapes["p_embedder.pooled_embedder.linear_1.weight"][1],
        "num_routed_experts": count_blocks(shapes, "double_stream_blocks.0.block.ff_i.experts.")
        or count_blocks(shapes, "single_stream_blocks.0.block.ff_i.experts."),
        "num_activated_experts": 2, "axes_dims_rope": [64, 32, 32], "max_resolution": [128, 128],
        "llama_layers": layers,
    }


def _hunyuan_image_config(shapes: Shapes, meta: dict) -> dict:
    w = first(shapes, "x_embedder.proj.weight", "img_in.proj.weight")
    hidden, in_ch, patch = w[0], w[1], list(w[2:])
    head = first(shapes, "transformer_blocks.0.attn.norm_q.weight", "double_blocks.0.img_attn.norm.query_norm.scale")[0]
    out_rows = first(shapes, "proj_out.weight", "final_layer.linear.weight")[0]
    n_patch = 1
    for p in patch:
        n_patch *= p
    return {
        "image_model": "hunyuan_video", "in_channels": in_ch, "patch_size": patch, "out_channels": out_rows // n_patch,
        "vec_in_dim": None, "axes_dim": [64, 64] if len(patch) == 2 else [16, 56, 56],
        "meanflow": has_any(shapes, "time_guidance_embed.timestep_embedder_r.linear_1.weight",
                            "time_r_in.in_layer.weight"),
        "context_in_dim": first(shapes, "context_embedder.proj_in.weight", "txt_in.input_embedder.weight")[1],
        "hidden_size": hidden, "num_heads": hidden // head,
        "mlp_ratio": first(shapes, "transformer_blocks.0.ff.net.0.proj.weight", "double_blocks.0.img_mlp.0.weight")[0]
        / hidden,
        "depth": blocks(shapes, "transformer_blocks.", "double_blocks."),
        "depth_single_blocks": blocks(shapes, "single_transformer_blocks.", "single_blocks."),
        "theta": 256, "qkv_bias": True,
        "byt5": has_any(shapes, "context_embedder_2.linear_1.weight", "byt5_in.fc1.weight"),
        "guidance_embed": has_any(shapes, "time_guidance_embed.guidance_embedder.linear_1.weight",
                                  "guidance_in.in_layer.weight"),
        "use_cond_type_embedding": False, "vision_in_dim": None,
    }


def _wan_config(shapes: Shapes, meta: dict) -> dict:
    w = shapes["patch_embedding.weight"]  # [dim, in_dim, pt, ph, pw], the same name in both layouts
    dim, in_dim, patch = w[0], w[1], tuple(w[2:])
    n_patch = 1
    for p in patch:
        n_patch *= p
    # ComfyUI's detection, with the text width read from the file (tiny models); Wan's heads are 128 wide at every
    # released size (5B: 24 heads of 3072, A14B: 40 of 5120).
    return {
        "image_model": "wan2.1", "model_type": "t2v", "patch_size": patch, "in_dim": in_dim, "dim": dim,
        "out_dim": first(shapes, "proj_out.weight", "head.head.weight")[0] // n_patch,
        "ffn_dim": first(shapes, "blocks.0.ffn.net.0.proj.weight", "blocks.0.ffn.0.weight")[0],
        "text_dim": first(shapes, "condition_embedder.text_embedder.linear_1.weight", "text_embedding.0.weight")[1],
        "freq_dim": first(shapes, "condition_embedder.time_embedder.linear_1.weight", "time_embedding.0.weight")[1],
        "num_heads": dim // 128, "num_layers": count_blocks(shapes, "blocks."), "window_size": (-1, -1),
        "qk_norm": True, "cross_attn_norm": True, "eps": 1e-6,
    }


def _hunyuan_video15_config(shapes: Shapes, meta: dict) -> dict:
    cfg = _hunyuan_image_config(shapes, meta)
    cfg.update(
        meanflow=has_any(shapes, "time_embed.timestep_embedder_r.linear_1.weight", "time_r_in.in_layer.weight"),
        guidance_embed=False, use_cond_type_embedding=True, axes_dim=[16, 56, 56],
        vision_in_dim=first(shapes, "image_embedder.linear_1.weight", "vision_in.proj.1.weight")[1],
    )
    return cfg


FAMILIES: dict[str, Family] = {f.name: f for f in [
    Family(
        name="z-image", title="Z-Image", diffusers_class="ZImageTransformer2DModel",
        base_repos=("Tongyi-MAI/Z-Image-Turbo",), hosted_repos=("unsloth/Z-Image-Turbo-FP8", "unsloth/Z-Image-Turbo-NVFP4"),
        int8_exclude_extra=(),
        diffusers_markers=("all_x_embedder.2-1.weight", "layers.0.attention.to_q.weight"),
        # Lumina 2 shares ComfyUI's NextDiT names; Z-Image's modulation Linear is adaLN_modulation.0 (Lumina 2: .1)
        comfy_markers=(("x_embedder.weight", "layers.0.adaLN_modulation.0.weight"),
                       ("layers.0.attention.qkv.weight", "layers.0.adaLN_modulation.0.weight")),
        comfy_model="ZImage", comfy_key_map="z_image_to_diffusers", comfy_unet_config=_z_image_config,
        fill_missing={"norm_final.weight": "ones"}, excluded_bases=("tongyi-mai/z-image",),
    ),
    Family(
        name="flux.1", title="FLUX.1", diffusers_class="FluxTransformer2DModel",
        base_repos=("black-forest-labs/FLUX.1-schnell", "black-forest-labs/FLUX.1-dev",
                    "black-forest-labs/FLUX.1-Krea-dev"),
        hosted_repos=("unsloth/FLUX.1-schnell-FP8", "unsloth/FLUX.1-dev-FP8", "unsloth/FLUX.1-Krea-dev-FP8",
                      "unsloth/FLUX.1-schnell-NVFP4"),
        int8_exclude_extra=(),
        diffusers_markers=(("single_transformer_blocks.0.proj_mlp.weight", "time_text_embed.timestep_embedder.linear_1.weight"),),
        comfy_markers=(("double_blocks.0.img_mod.lin.weight", "img_in.weight", "vector_in.in_layer.weight"),),
        comfy_model=("Flux", "FluxSchnell"), comfy_key_map="flux_to_diffusers", comfy_unet_config=_flux_config,
    ),
    Family(
        name="flux.2-klein", title="FLUX.2 [klein]", diffusers_class="Flux2Transformer2DModel",
        base_repos=("black-forest-labs/FLUX.2-klein-4B",), hosted_repos=("unsloth/FLUX.2-klein-4B-FP8",),
        int8_exclude_extra=(),
        diffusers_markers=("double_stream_modulation_img.linear.weight",),
        comfy_markers=("double_stream_modulation_img.lin.weight",),
        comfy_model="Flux2", comfy_key_map=keymaps.flux2_to_diffusers, comfy_unet_config=_flux2_config,
        # the transformer runs in 0.3.75's Flux2 class (tested); its Qwen3-4B text encoder arrived later
        min_comfy="0.9.2",
    ),
    Family(
        name="flux.2-dev", title="FLUX.2 [dev]", diffusers_class="Flux2Transformer2DModel",
        base_repos=("black-forest-labs/FLUX.2-dev",), hosted_repos=("unsloth/FLUX.2-dev-FP8",),
        int8_exclude_extra=(),
        diffusers_markers=("double_stream_modulation_img.linear.weight",),
        comfy_markers=("double_stream_modulation_img.lin.weight",),
        comfy_model="Flux2", comfy_key_map=keymaps.flux2_to_diffusers, comfy_unet_config=_flux2_config,
    ),
    Family(
        name="qwen-image", title="Qwen-Image", diffusers_class="QwenImageTransformer2DModel",
        base_repos=("Qwen/Qwen-Image", "Qwen/Qwen-Image-2512"),
        hosted_repos=("unsloth/Qwen-Image-FP8", "unsloth/Qwen-Image-2512-FP8", "unsloth/Qwen-Image-2512-NVFP4"),
        int8_exclude_extra=("txt_in", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out", "txt_mlp"),
        # ComfyUI's Qwen-Image uses the diffusers names: one layout
        diffusers_markers=(("txt_norm.weight", "transformer_blocks.0.img_mod.1.weight"),), comfy_markers=(),
        comfy_model="QwenImage", comfy_key_map=None, comfy_unet_config=_qwen_image_config,
    ),
    Family(
        name="lumina-2", title="Lumina Image 2.0", diffusers_class="Lumina2Transformer2DModel",
        base_repos=("Alpha-VLLM/Lumina-Image-2.0",), hosted_repos=("unsloth/Lumina-Image-2.0-FP8",),
        int8_exclude_extra=(),
        diffusers_markers=(("time_caption_embed.caption_embedder.1.weight", "layers.0.attn.to_q.weight"),),
        comfy_markers=(("layers.0.attention.qkv.weight", "layers.0.adaLN_modulation.1.weight", "cap_embedder.1.weight"),),
        comfy_model="Lumina2", comfy_key_map=keymaps.lumina2_to_diffusers, comfy_unet_config=_lumina2_config,
        fill_missing={"norm_final.weight": "ones"},
    ),
    Family(
        name="hidream-i1", title="HiDream-I1", diffusers_class="HiDreamImageTransformer2DModel",
        base_repos=("HiDream-ai/HiDream-I1-Full",), hosted_repos=("unsloth/HiDream-I1-Full-FP8",),
        int8_exclude_extra=(),
        diffusers_markers=(("caption_projection.0.linear.weight", "double_stream_blocks.0.block.attn1.to_q.weight"),),
        comfy_markers=(),  # ComfyUI's HiDream uses the diffusers names
        comfy_model="HiDream", comfy_key_map=None, comfy_unet_config=_hidream_config,
        excluded_bases=("hidream-ai/hidream-i1-dev", "hidream-ai/hidream-i1-fast"),
    ),
    # Video families. Unsloth hosts NVFP4 files only (docs/FORMAT.md section 6); int8 / fp8 files built with this
    # pack's builder load the same way. Wan 2.2 TI2V-5B and A14B share the diffusers class and key names: a file
    # without a family field loads either way, ComfyUI's class picked from the shapes (48 latent channels: WAN22_T2V).
    Family(
        name="wan2.2-ti2v-5b", title="Wan 2.2 TI2V-5B", diffusers_class="WanTransformer3DModel",
        base_repos=("Wan-AI/Wan2.2-TI2V-5B-Diffusers",), hosted_repos=("unsloth/Wan2.2-TI2V-5B-NVFP4",),
        int8_exclude_extra=(),
        diffusers_markers=(("condition_embedder.time_proj.weight", "blocks.0.attn1.to_q.weight"),),
        comfy_markers=(("head.modulation", "blocks.0.self_attn.q.weight"),),
        comfy_model=("WAN22_T2V", "WAN21_T2V"), comfy_key_map=keymaps.wan_to_diffusers,
        comfy_unet_config=_wan_config,
        shape_test=lambda s: s["patch_embedding.weight"][1] == 48,  # Wan 2.2's 48-channel latents
        hub_filenames={"unsloth/Wan2.2-TI2V-5B-NVFP4": {"nvfp4": "Wan2.2-TI2V-5B-NVFP4.pt"}},
    ),
    Family(
        name="wan2.2-t2v-a14b", title="Wan 2.2 T2V-A14B", diffusers_class="WanTransformer3DModel",
        base_repos=("Wan-AI/Wan2.2-T2V-A14B-Diffusers",), hosted_repos=("unsloth/Wan2.2-T2V-A14B-NVFP4",),
        int8_exclude_extra=(),
        diffusers_markers=(("condition_embedder.time_proj.weight", "blocks.0.attn1.to_q.weight"),),
        comfy_markers=(("head.modulation", "blocks.0.self_attn.q.weight"),),
        comfy_model=("WAN22_T2V", "WAN21_T2V"), comfy_key_map=keymaps.wan_to_diffusers,
        comfy_unet_config=_wan_config,
        shape_test=lambda s: s["patch_embedding.weight"][1] == 16,  # Wan 2.1's 16-channel latents
        # two experts: transformer (high noise, the first steps), transformer_2 (low noise, the rest)
        components=("transformer", "transformer_2"),
        hub_filenames={"unsloth/Wan2.2-T2V-A14B-NVFP4": {"nvfp4": "Wan2.2-T2V-A14B-NVFP4.pt"}},
        hub_component_filenames={"unsloth/Wan2.2-T2V-A14B-NVFP4": {
            "transformer_2": {"nvfp4": "Wan2.2-T2V-A14B-transformer_2-NVFP4.pt"}}},
    ),
    # Before HunyuanImage 2.1: a ComfyUI-layout HunyuanVideo 1.5 file also has HunyuanImage's ComfyUI markers.
    Family(
        name="hunyuanvideo-1.5", title="HunyuanVideo 1.5", diffusers_class="HunyuanVideo15Transformer3DModel",
        base_repos=("hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v",
                    "hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-720p_t2v"),
        hosted_repos=("unsloth/HunyuanVideo-1.5-NVFP4",),
        int8_exclude_extra=("context_embedder", "image_embedder", "add_q_proj", "add_k_proj", "add_v_proj",
                            "to_add_out", "ff_context"),
        diffusers_markers=(("cond_type_embed.weight", "context_embedder_2.linear_1.weight"),),
        comfy_markers=(("cond_type_embedding.weight", "txt_in.individual_token_refiner.blocks.0.norm1.weight"),),
        comfy_model="HunyuanVideo15", comfy_key_map=keymaps.hunyuan_video15_to_diffusers,
        comfy_unet_config=_hunyuan_video15_config,
        # one repo, one file per variant (base): the base picks it (sources.filenames)
        variant_filenames={"unsloth/HunyuanVideo-1.5-NVFP4": {
            "hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v":
                {"nvfp4": "HunyuanVideo-1.5-Diffusers-480p_t2v-NVFP4.pt"},
            "hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-720p_t2v":
                {"nvfp4": "HunyuanVideo-1.5-Diffusers-720p_t2v-NVFP4.pt"}}},
    ),
    Family(
        name="hunyuanimage-2.1", title="HunyuanImage 2.1", diffusers_class="HunyuanImageTransformer2DModel",
        base_repos=("hunyuanvideo-community/HunyuanImage-2.1-Diffusers",),
        hosted_repos=("unsloth/HunyuanImage-2.1-FP8",),
        int8_exclude_extra=(),
        diffusers_markers=(("time_guidance_embed.timestep_embedder.linear_1.weight",
                            "context_embedder.token_refiner.refiner_blocks.0.attn.to_q.weight"),),
        comfy_markers=(("txt_in.individual_token_refiner.blocks.0.self_attn.qkv.weight", "byt5_in.fc1.weight"),
                       # the original release's names, which ComfyUI's own loader renames (process_unet_state_dict)
                       ("txt_in.individual_token_refiner.blocks.0.self_attn_qkv.weight", "byt5_in.fc1.weight")),
        comfy_model="HunyuanImage21", comfy_key_map=keymaps.hunyuan_image_to_diffusers,
        comfy_unet_config=_hunyuan_image_config,
    ),
    # Newer families (diffusers >= 0.41): no ComfyUI version testable here has their classes (Krea2 and QwenImage21
    # arrive in ComfyUI 0.38.1), so the ComfyUI loader refuses them naming that version; Info, verify, build, Hub
    # resolution and the diffusers loader (prequant_core.diffusers_loader) handle them. No int8 extras: docs/FORMAT.md
    # (section 4) lists family tokens only for qwen-image(-edit), hunyuanvideo-1.5 and ltx-2.
    Family(
        name="krea-2", title="Krea 2", diffusers_class="Krea2Transformer2DModel",
        base_repos=("krea/Krea-2-Turbo",), hosted_repos=("unsloth/Krea-2-Turbo-FP8",),
        int8_exclude_extra=(),
        diffusers_markers=(("text_fusion.projector.weight", "time_mod_proj.weight"),), comfy_markers=(),
        comfy_model="Krea2", comfy_key_map=None, comfy_unet_config=None, min_comfy="0.38.1",
        excluded_bases=("krea/krea-2-raw",),
    ),
    Family(
        name="qwen-image-2.1", title="Qwen-Image 2.1", diffusers_class="QwenImage21Transformer2DModel",
        base_repos=("Qwen/Qwen-Image-2.1", "Qwen/Qwen-Image-2.1-Turbo"),
        hosted_repos=("unsloth/Qwen-Image-2.1-FP8", "unsloth/Qwen-Image-2.1-Turbo-FP8", "unsloth/Qwen-Image-2.1-NVFP4"),
        int8_exclude_extra=(),
        diffusers_markers=(("modulation.1.weight", "txt_in.in_layer.weight", "txt_in.text_norm.weight"),),
        comfy_markers=(),
        comfy_model="QwenImage21", comfy_key_map=None, comfy_unet_config=None, min_comfy="0.38.1",
        # the Turbo base has its own variant repo, which a matching base picks first (sources.hosted_repo)
        excluded_bases=("qwen/qwen-image-2.1-turbo",),
        hub_filenames={"unsloth/Qwen-Image-2.1-FP8": {"fp8": "Qwen-Image-2.1-FP8.safetensors",
                                                      "int8": "Qwen-Image-2.1-INT8.safetensors"}},
    ),
]}


def declared_filenames(repo: str, scheme: str, component: str = "transformer",
                       base_model_id: str | None = None) -> tuple[str, ...]:
    """File names the family hosting ``repo`` declares for ``scheme`` (and ``component``, and the base where the repo
    holds one file per base; tried first), else ()."""
    low = str(repo).strip().lower()
    for fam in FAMILIES.values():
        for r, by_base in fam.variant_filenames.items():
            if r.lower() != low or component != "transformer":
                continue
            names = {b: v[scheme] for b, v in by_base.items() if scheme in v}
            if base_model_id and str(base_model_id).strip():
                hit = [n for b, n in names.items() if normalize_base(b) == normalize_base(base_model_id)
                       or base_tail(b) == base_tail(base_model_id)]
                if hit:
                    return tuple(hit)
            return tuple(names.values())
        if component == "transformer":
            table = fam.hub_filenames
        else:
            table = {r: by_comp.get(component, {}) for r, by_comp in fam.hub_component_filenames.items()}
        for r, by_scheme in table.items():
            if r.lower() == low and scheme in by_scheme:
                return (by_scheme[scheme],)
    return ()


def all_components() -> tuple[str, ...]:
    """Every component a registered family has, ``transformer`` first (the loader's choices)."""
    out = ["transformer"]
    for fam in FAMILIES.values():
        out += [c for c in fam.components if c not in out]
    return tuple(out)


def hosting_family(repo: str) -> Family | None:
    """The family whose hosted repos include ``repo``, else None."""
    low = str(repo).strip().lower()
    for fam in FAMILIES.values():
        if any(r.lower() == low for r in fam.hosted_repos):
            return fam
    return None

CLASS_TO_FAMILY: dict[str, str] = {}
for _f in FAMILIES.values():  # a class shared by several families (FLUX.2 klein / dev) names the first listed
    CLASS_TO_FAMILY.setdefault(_f.diffusers_class, _f.name)


def get(name: str) -> Family:
    key = str(name).strip().lower()
    if key in FAMILIES:
        return FAMILIES[key]
    raise UnknownFamilyError(f"Unknown model family '{name}'.", expected=", ".join(sorted(FAMILIES)), found=str(name),
                             fix="Pick one of the supported families.")


def detect(keys, metadata: Mapping | None = None, path: str | None = None,
           shapes: Shapes | None = None) -> tuple[Family, str]:
    """(family, layout) from metadata, else from the keys (and, where families share their names, the shapes).
    Layout is 'diffusers' or 'comfyui'."""
    metadata = metadata or {}
    keys = list(keys)
    named = metadata.get("family")
    if isinstance(named, str) and named.strip().lower() in FAMILIES:
        fam = FAMILIES[named.strip().lower()]
        layout = fam.layout_of(keys)
        if layout:
            return fam, layout
    cls = metadata.get("transformer_class")
    if isinstance(cls, str) and cls in CLASS_TO_FAMILY:
        fam = FAMILIES[CLASS_TO_FAMILY[cls]]
        if fam.layout_of(keys):
            return fam, fam.layout_of(keys)
    matches = [(fam, fam.layout_of(keys)) for fam in FAMILIES.values()]
    matches = [(fam, layout) for fam, layout in matches if layout]
    if shapes:
        for fam, layout in matches:
            if fam.shape_test is not None:
                try:
                    if fam.shape_test(shapes):
                        return fam, layout
                except (KeyError, IndexError, TypeError):
                    pass
    if matches:
        return matches[0]
    raise UnknownFamilyError(
        "Could not tell which model family this checkpoint is.", path=path,
        expected="one of: " + ", ".join(sorted(FAMILIES)),
        found=(f"family '{str(named)[:80]}'" if isinstance(named, str) and named
               else f"{len(keys)} tensors, e.g. {sorted(map(str, keys))[:3]}"),
        fix="Pick the family on the node, or check that the file is a diffusion transformer.")
