"""MiniMax-H3: MiniMaxH3Transformer3DModel (diffusers 0.42.1), a joint video + audio transformer -> ComfyUI 0.33.0's
MiniMaxH3 (``comfy.ldm.minimax.model``), which reads the curve form natively (``adaln_t_table``); the map below
moves tensors, fuses q / k / v rows and swaps the SwiGLU projection's halves (diffusers: value then gate; ComfyUI:
gate then value). ComfyUI keeps the rotary frequencies as a buffer no file holds: computed from the release's base.

Unsloth hosts int8 (ConvRot, format v2, ``MiniMax-H3-INT8-ConvRot.pt``) and fp8 (``MiniMax-H3-FP8.pt``) in
``unsloth/MiniMax-H3-FP8``, both in the *pruned* ("curve") adaLN form its builder bakes in: ``silu(time_embedder(t))``
over a fixed grid of t in [0, 1] lies in a low-rank affine subspace, so the file stores the tabulated coordinates
(``time_embedder.table``, grid x dim, float32) and every modulation projection folded onto that basis (``(out,
dim)`` weights, the curve's mean in the bias), declared in the metadata (``adaln_form`` = ``curve``, ``curve_dim``,
``curve_grid``, ``adaln_out_dtype``). The diffusers class is built dense from its config, so ``curve_form`` reshapes
it before the file's tensors go in, restated from Unsloth's ``video_minimax_h3_adaln`` (the forward it describes: no
SiLU on the tabulated curve, the table read by linear interpolation at the raw timestep, block modulation cast to
the recorded dtype). The Ref2VA task files (a second partition of the same base, ``MiniMax-H3-Ref2VA-*.pt``) are
not offered by name: they load when picked as a file, and nothing tells them apart from the keyframe partition."""
from __future__ import annotations

from typing import Mapping

from ._base import Architecture, Family, HostedFile, Hosting, Shapes, blocks, first, has_any
from .keymap import moves, qkv_rows

ADALN_FORM, CURVE = "adaln_form", "curve"
CURVE_DIM, CURVE_GRID, OUT_DTYPE = "curve_dim", "curve_grid", "adaln_out_dtype"
TABLE = "time_embedder.table"


def is_curve(metadata: Mapping) -> bool:
    """Keyed on the recorded form (as Unsloth's loader is): a table without the declaration is not reshaped for."""
    return isinstance(metadata, Mapping) and metadata.get(ADALN_FORM) == CURVE and bool(metadata.get(CURVE_DIM)) \
        and bool(metadata.get(CURVE_GRID))


def curve_metadata(tensors: Mapping) -> dict:
    """What a build from curve-form weights records (nothing for the dense form)."""
    table = tensors.get(TABLE)
    if table is None or len(getattr(table, "shape", ())) != 2:
        return {}
    stack = next((v for k, v in tensors.items() if k.startswith("transformer_blocks.") and k.endswith(".weight")
                  and getattr(v, "ndim", 0) == 2 and ".adaln_proj." not in k), None)
    dtype = str(getattr(stack, "dtype", "") or "").replace("torch.", "")
    return {ADALN_FORM: CURVE, CURVE_DIM: int(table.shape[1]), CURVE_GRID: int(table.shape[0]),
            **({OUT_DTYPE: dtype} if dtype in ("bfloat16", "float16", "float32") else {})}


def curve_form(model, metadata: Mapping) -> bool:
    """Reshape a freshly built dense MiniMaxH3Transformer3DModel to the curve form the file declares, in place
    (False for a dense-form file, which is left as it is)."""
    if not is_curve(metadata):
        return False
    import types

    import torch
    from torch import nn

    dim, grid = int(metadata[CURVE_DIM]), int(metadata[CURVE_GRID])
    out_dtype = getattr(torch, str(metadata.get(OUT_DTYPE) or ""), None)
    out_dtype = out_dtype if isinstance(out_dtype, torch.dtype) else None
    blocks, norm_out = getattr(model, "transformer_blocks", None), getattr(model, "norm_out", None)
    if blocks is None or norm_out is None:
        raise ValueError("the curve form needs transformer_blocks and norm_out: not a MiniMaxH3Transformer3DModel")

    def narrow(linear, where):
        if not isinstance(linear, nn.Linear):
            raise ValueError(f"the curve form expects a Linear at {where}")
        return nn.Linear(dim, linear.out_features, bias=linear.bias is not None, device="cpu", dtype=torch.float32)

    def modulation(self, temb):  # the tabulated curve is already the activation's output: no SiLU again
        temb = self.linear(temb.to(self.linear.weight.dtype))
        if self.prequant_out_dtype is not None:
            temb = temb.to(self.prequant_out_dtype)  # the block stack multiplies by these without a cast
        return temb.view(-1, 6 * self.hidden_size).chunk(6, dim=-1)

    def final(self, hidden_states, temb, timestep_indices):
        shift, scale = self.linear(temb.to(self.linear.weight.dtype)).chunk(2, dim=-1)
        hidden_states = self.norm(hidden_states)
        return hidden_states * (1.0 + scale.index_select(0, timestep_indices)) + shift.index_select(0, timestep_indices)

    for i, block in enumerate(blocks):
        proj = getattr(block, "adaln_proj", None)
        if proj is None:
            raise ValueError(f"block {i} has no adaln_proj")
        proj.linear = narrow(proj.linear, f"transformer_blocks.{i}.adaln_proj.linear")
        proj.prequant_out_dtype = out_dtype  # an attribute, not a buffer: kept out of the state dict and of .to()
        proj.forward = types.MethodType(modulation, proj)  # per instance: the class serves dense loads too
    norm_out.linear = narrow(norm_out.linear, "norm_out.linear")
    norm_out.forward = types.MethodType(final, norm_out)
    model.time_embedder = _CurveTimeEmbedder(grid, dim)
    model.time_proj = _RawTimestep()
    return True


# Module classes made on first use: the registry is imported without torch (the command line's --help).

def _CurveTimeEmbedder(grid: int, dim: int):  # noqa: N802 - a class factory
    import torch

    class CurveTimeEmbedder(torch.nn.Module):
        """``time_embedder`` of the curve form: the file's ``time_embedder.table``, read by linear interpolation
        between the two neighbouring grid rows (t clamped to [0, 1]; t = 1 reads the last interval)."""

        def __init__(self):
            super().__init__()
            self.register_buffer("table", torch.empty(grid, dim, dtype=torch.float32))

        def forward(self, timestep):
            table = self.table.float()  # float32 as hosted; a table cast down (a bf16 build) is read in float32 too
            n = table.shape[0]
            pos = timestep.to(torch.float32).clamp(0.0, 1.0) * (n - 1)
            i0 = pos.floor().long().clamp(max=n - 2)
            return torch.lerp(table[i0], table[i0 + 1], (pos - i0).unsqueeze(1))

    return CurveTimeEmbedder()


def _RawTimestep():  # noqa: N802 - a class factory
    import torch

    class RawTimestep(torch.nn.Module):
        """``time_proj`` of the curve form: the table is indexed by the raw timestep, not its Fourier features."""

        def forward(self, timestep):
            return timestep

    return RawTimestep()


# ---------------------------------------------------------------------------------------------------------------
# diffusers -> ComfyUI 0.33.0's MiniMaxH3 (comfy.ldm.minimax.model), which has the curve form itself (its
# ``adaln_t_table``, read by the same interpolation, the modulation projections in float32 without a SiLU)

ROPE_FREQS, ROPE_THETA = 16, 10000.0  # the release's rotary frequencies per axis and base (no tensor holds them)
INV_FREQ = "rope.inv_freq"  # ComfyUI keeps them as a buffer the file must give; diffusers computes them


def rope_inv_freq(shape, dtype):
    """ComfyUI's ``rope.inv_freq`` as diffusers computes it from the release's base (no file holds it)."""
    import torch
    n = int(shape[0])
    return (1.0 / (ROPE_THETA ** (torch.arange(0, 2 * n, 2, dtype=torch.float32) / (2 * n)))).to(dtype)


def _attention_and_mlp(m: dict, src: str, dst: str, hidden: int) -> None:
    qkv_rows(m, f"{src}attn", f"{dst}attn.qkv_proj", (hidden, hidden, hidden))
    moves(m, src, dst, {"attn.to_out.0.weight": "attn.out_proj.weight", "attn.norm_q.weight": "attn.q_norm.weight",
                        "attn.norm_k.weight": "attn.k_norm.weight", "norm1.weight": "norm1.weight",
                        "norm2.weight": "norm2.weight", "ff.net.2.weight": "mlp.fc2.weight"})
    # diffusers' SwiGLU takes (value, gate) from its projection's rows, ComfyUI's (gate, value): halves swapped
    m[f"{src}ff.net.0.proj.weight"] = (f"{dst}mlp.fc1.weight", None, "swap_scale_shift")


def h3_to_comfy(cfg: Mapping) -> dict:
    m: dict = {}
    hidden = int(cfg.get("hidden_size", 0))
    for i in range(int(cfg.get("num_layers", 0))):
        _attention_and_mlp(m, f"transformer_blocks.{i}.", f"blocks.{i}.", hidden)
        moves(m, f"transformer_blocks.{i}.", f"blocks.{i}.", {"adaln_proj.linear": "adaln_proj.linear"})
    for i in range(int(cfg.get("token_refiner_num_layers", 0))):
        _attention_and_mlp(m, f"token_refiner.refiner_blocks.{i}.", f"token_refiner.blocks.{i}.", hidden)
    moves(m, "", "", {"proj_in": "video_patch_proj", "audio_proj_in": "audio_patch_proj",
                      "context_embedder": "condition_proj", "norm_out.linear": "final_layer.adaln_proj.linear",
                      "proj_out": "final_layer.video_out", "audio_proj_out": "final_layer.audio_out",
                      "time_embedder.linear_1": "time_embedder.proj_in", "time_embedder.linear_2": "time_embedder.proj_out"})
    moves(m, "", "", {"norm_out.norm.weight": "final_layer.norm.weight",
                      "token_refiner.final_norm.weight": "token_refiner.final_norm.weight"})
    m[TABLE] = "adaln_t_table"  # the curve form's table (a buffer, neither weight nor bias)
    return m


def config(shapes: Shapes) -> dict:
    hidden, patch_in = first(shapes, "proj_in.weight", "video_patch_proj.weight")
    head = first(shapes, "transformer_blocks.0.attn.norm_q.weight", "blocks.0.attn.q_norm.weight")[0]
    q = shapes.get("transformer_blocks.0.attn.to_q.weight")
    q_rows = q[0] if q else first(shapes, "blocks.0.attn.qkv_proj.weight")[0] // 3
    cfg = {
        "image_model": "minimax_h3", "hidden_size": hidden, "latents_dim": patch_in // 4,  # patch 1 x 2 x 2
        "audio_latents_dim": first(shapes, "audio_proj_in.weight", "audio_patch_proj.weight")[1],
        "num_layers": blocks(shapes, "transformer_blocks.", "blocks."),
        "token_refiner_num_layers": blocks(shapes, "token_refiner.refiner_blocks.", "token_refiner.blocks."),
        "attention_head_dim": head, "num_attention_heads": q_rows // head,
        "ffn_hidden_size": first(shapes, "transformer_blocks.0.ff.net.0.proj.weight", "blocks.0.mlp.fc1.weight")[0] // 2,
        "text_dim": first(shapes, "context_embedder.weight", "condition_proj.weight")[1],
        "rope_inv_freq_len": ROPE_FREQS,
    }
    if has_any(shapes, TABLE, "adaln_t_table"):
        cfg["adaln_curve_grid"], cfg["time_embed_dim"] = first(shapes, TABLE, "adaln_t_table")
    else:
        te_hidden, cfg["timestep_input_dim"] = first(shapes, "time_embedder.linear_1.weight",
                                                     "time_embedder.proj_in.weight")
        cfg["time_embed_hidden_size"] = te_hidden
        cfg["time_embed_dim"] = first(shapes, "time_embedder.linear_2.weight", "time_embedder.proj_out.weight")[0]
    return cfg


FAMILIES = (
    Family(
        name="minimax-h3", title="MiniMax-H3",
        arch=Architecture(
            diffusers_class="MiniMaxH3Transformer3DModel",
            diffusers_markers=(("token_refiner.final_norm.weight", "transformer_blocks.0.adaln_proj.linear.weight"),),
            comfy_markers=(),
            comfy_model="MiniMaxH3", comfy_key_map=h3_to_comfy, unet_config=config, min_comfy="0.33.0",
            fill_missing={INV_FREQ: rope_inv_freq},
            int8_exclude_extra=("adaln_proj",),
            diffusers_prepare=curve_form, metadata_from_tensors=curve_metadata,
        ),
        hosting=Hosting(
            base_repos=("MiniMaxAI/MiniMax-H3",), repos={"unsloth/MiniMax-H3-FP8": ("int8", "fp8")},
            # the int8 file is rotated (ConvRot, v2) and named so; the plain derived names follow it
            files=(HostedFile("unsloth/MiniMax-H3-FP8", "int8", "MiniMax-H3-INT8-ConvRot.pt"),),
            video=True,
        ),
    ),
)
