"""Family configs read from shapes, on the files that say a value another way or lack a tensor: Krea 2 without its q
norms (the release's head width), a Krea 2 missing a projection or the input layer, or whose v projection is not as
wide as its k (each refused naming the tensor and the file); LTX-2.0's caption projection and LTX-2.3 with one text
connector or none; Lumina 2 in ComfyUI's layout (fused q / k / v), at tiny and at released size; a family with no
ComfyUI config. And MiniMax-H3's curve form (``diffusers_prepare``) given a dense-form record or a model it cannot
reshape: another family's diffusers class, or a skeleton whose modulation is no Linear. Shapes from the families'
real diffusers classes on the meta device (tools/tiny_families.py) where the pinned diffusers has them, else plain
shape dicts as a file's header gives them. Core tier (no ComfyUI)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from prequant_core import families
from prequant_core.errors import CorruptCheckpointError
from prequant_core.families import keymap, ltx2
from tools import tiny_families as tf

PATH = "/models/prequant/some-file.safetensors"


def _config(shapes: dict, family: str) -> dict:
    """The config as the loader derives it: the family detected from the names, then read from the shapes."""
    fam, layout = families.detect(list(shapes), shapes=shapes)
    assert fam.name == family, (fam.name, layout)
    return fam.config_from_shapes(shapes, PATH)


def _refusal(shapes: dict, family: str) -> CorruptCheckpointError:
    with pytest.raises(CorruptCheckpointError) as e:
        _config(shapes, family)
    assert e.value.path == PATH
    return e.value


# --- Krea 2 -----------------------------------------------------------------------------------------------------------

def _krea2(*, norms: bool = True, head: int = 64) -> dict:
    """A Krea 2 header's shapes (diffusers names): 512 wide, four query and key heads of 128 rows each (or ``head``-wide
    heads, as the q norms say, where ``norms``)."""
    s = {"img_in.weight": (512, 64), "time_mod_proj.weight": (3072, 512), "text_fusion.projector.weight": (512, 2),
         "txt_in.norm.weight": (512,), "transformer_blocks.0.norm1.weight": (512,)}
    for a in ("transformer_blocks.0.attn.", "text_fusion.refiner_blocks.0.attn."):
        s.update({f"{a}to_{p}.weight": (512, 512) for p in "qkv"})
        if norms:
            s.update({f"{a}norm_q.weight": (head,), f"{a}norm_k.weight": (head,)})
    return s


def test_krea2_heads_follow_the_q_norm_width_and_the_releases_width_without_one():
    with_norms = _config(_krea2(norms=True, head=64), "krea-2")
    assert (with_norms["heads"], with_norms["kvheads"], with_norms["txtheads"]) == (8, 8, 8)
    without = _config(_krea2(norms=False), "krea-2")  # no q norm to read the width from: the release's 128
    assert (without["heads"], without["kvheads"], without["txtheads"], without["txtkvheads"]) == (4, 4, 4, 4)
    assert {k: v for k, v in without.items() if "heads" not in k} == \
        {k: v for k, v in with_norms.items() if "heads" not in k} == {
            "image_model": "krea2", "features": 512, "patch": 2, "channels": 16, "layers": 1, "txtlayers": 2,
            "txtdim": 512}


def test_a_krea2_without_a_query_projection_is_refused_naming_it():
    s = _krea2()
    del s["transformer_blocks.0.attn.to_q.weight"]
    e = _refusal(s, "krea-2")
    assert e.message.startswith("This Krea 2 checkpoint lacks the tensor 'transformer_blocks.0.attn.to_q.weight'")


def test_a_krea2_without_its_input_layer_is_refused_naming_it():
    s = _krea2()
    del s["img_in.weight"]
    e = _refusal(s, "krea-2")
    assert e.message.startswith("This Krea 2 checkpoint lacks the tensor 'img_in.weight'")
    assert e.found == f"{len(s)} tensors without 'img_in.weight'"


def test_a_krea2_whose_values_are_not_as_wide_as_its_keys_is_refused_naming_the_v_projection():
    s = _krea2()
    s["text_fusion.refiner_blocks.0.attn.to_v.weight"] = (256, 512)
    e = _refusal(s, "krea-2")
    assert e.message.startswith("This Krea 2 checkpoint's tensor 'text_fusion.refiner_blocks.0.attn.to_v.weight' "
                                "does not have a shape")
    assert e.expected == "as many rows as text_fusion.refiner_blocks.0.attn.to_k.weight (512: one value per key head)"
    assert e.found == "256 rows"


def test_a_family_without_a_comfyui_config_says_so():
    fam = families.get("qwen-image-2.1")
    with pytest.raises(ValueError) as e:
        fam.config_from_shapes({"modulation.1.weight": (512, 512)}, PATH)
    assert str(e.value) == "Qwen-Image 2.1 has no ComfyUI unet config in this pack"


# --- LTX-2 ------------------------------------------------------------------------------------------------------------

def _ltx(*, gated: bool = True, caption: bool = False, video_connector: bool = False) -> dict:
    """An LTX-2 header's shapes (diffusers names): video and audio 512 wide in four heads, text 512 wide; LTX-2.3's
    gates (one logit per head) where ``gated``, LTX-2.0's caption projection (3840-wide text) where ``caption``, and
    the video text connector (a companion's tensors) where ``video_connector``."""
    b0 = "transformer_blocks.0."
    s = {"proj_in.weight": (512, 64), "audio_proj_in.weight": (512, 128),
         "av_cross_attn_video_scale_shift.linear.weight": (2048, 512),
         f"{b0}attn2.to_k.weight": (512, 512), f"{b0}audio_attn2.to_k.weight": (512, 512),
         f"{b0}ff.net.0.proj.weight": (2048, 512)}
    if gated:
        s.update({f"{b0}attn1.to_gate_logits.weight": (4, 512), f"{b0}audio_attn1.to_gate_logits.weight": (4, 512)})
    if caption:
        s.update({"caption_projection.linear_1.weight": (512, 3840), "caption_projection.linear_2.weight": (512, 512)})
    if video_connector:
        c = f"{ltx2.CONNECTORS}video_connector."
        s.update({f"{c}learnable_registers": (128, 512), f"{c}transformer_blocks.0.attn1.to_gate_logits.weight": (8, 512),
                  f"{c}transformer_blocks.1.attn1.to_q.weight": (512, 512)})
    return s


def test_ltx20s_caption_projection_gives_the_caption_width_and_no_connector_sizes_without_connectors():
    cfg = _config(_ltx(gated=False, caption=True), "ltx-2")
    assert cfg["caption_channels"] == 3840 and cfg["caption_proj_before_connector"] is False
    assert (cfg["num_attention_heads"], cfg["attention_head_dim"], cfg["apply_gated_attention"]) == (4, 128, False)
    assert (cfg["audio_num_attention_heads"], cfg["audio_attention_head_dim"]) == (8, 64)  # the release's 64 wide
    assert not any("connector_" in k for k in cfg), cfg  # ComfyUI's default connector sizes are left
    assert "caption_channels" not in _config(_ltx(), "ltx-2")  # LTX-2.3 projects the text in its connectors


def test_ltx23_with_only_its_video_connector_sizes_that_one():
    cfg = _config(_ltx(video_connector=True), "ltx-2")
    assert {k: v for k, v in cfg.items() if "connector_" in k} == {
        "connector_num_attention_heads": 8, "connector_attention_head_dim": 64, "connector_num_layers": 2,
        "connector_apply_gated_attention": True}
    assert cfg["caption_proj_before_connector"] is True and cfg["apply_gated_attention"] is True


# --- Lumina 2 ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("real", [False, True], ids=["tiny", "released-size"])
def test_lumina2_in_comfyuis_layout_reads_the_same_config_as_in_diffusers(real):
    """ComfyUI's Lumina 2 fuses q / k / v into one ``attention.qkv`` (the k / v heads are read from its rows); the
    diffusers layout has ``to_k``. The same model in both layouts (the family's own key map) gives one config."""
    fam = families.get("lumina-2")
    sd = tf.meta_state_dict("lumina-2", real=real)
    diffusers_shapes = {k: tuple(v.shape) for k, v in sd.items()}
    want = _config(diffusers_shapes, "lumina-2")
    comfy = keymap.to_comfy_layout(sd, fam.arch.comfy_key_map(want))
    comfy_shapes = {k: tuple(v.shape) for k, v in comfy.items()}
    assert "layers.0.attention.qkv.weight" in comfy_shapes and "layers.0.attn.to_k.weight" not in comfy_shapes
    assert families.detect(list(comfy_shapes))[1] == "comfyui"
    got = _config(comfy_shapes, "lumina-2")
    assert got == want
    assert (got["n_heads"], got["n_kv_heads"]) == ((24, 8) if real else (12, 6))


# --- MiniMax-H3's curve form ------------------------------------------------------------------------------------------

CURVE = {"adaln_form": "curve", "curve_dim": 8, "curve_grid": 33, "adaln_out_dtype": "bfloat16"}


def _prepare():
    """MiniMax-H3's record's step before a file's tensors go into its diffusers class."""
    return families.get("minimax-h3").arch.diffusers_prepare


def _h3_skeleton(blocks: int = 2, modulation=lambda: nn.Linear(32, 96)) -> nn.Module:
    """The modules the curve form reshapes, named as MiniMaxH3Transformer3DModel names them (``transformer_blocks.
    <i>.adaln_proj.linear``, ``norm_out.linear``, ``time_embedder``, ``time_proj``), small; ``modulation`` makes each
    block's modulation projection."""
    m = nn.Module()
    m.transformer_blocks = nn.ModuleList()
    for _ in range(blocks):
        b = nn.Module()
        b.adaln_proj = nn.Module()
        b.adaln_proj.linear = modulation()
        b.adaln_proj.hidden_size = 16
        m.transformer_blocks.append(b)
    m.norm_out = nn.Module()
    m.norm_out.linear = nn.Linear(32, 32)
    m.norm_out.norm = nn.LayerNorm(16, elementwise_affine=False)
    m.time_embedder = nn.Linear(16, 32)
    m.time_proj = nn.Identity()
    return m


def test_the_curve_form_reshapes_the_modulation_to_the_recorded_curve():
    """The control: a curve-form record reshapes every modulation projection to take the curve's 8 coordinates and
    the time embedder to the 33-row table."""
    m = _h3_skeleton()
    assert _prepare()(m, CURVE) is True
    for b in m.transformer_blocks:
        lin = b.adaln_proj.linear
        assert type(lin) is nn.Linear and (lin.in_features, lin.out_features, lin.weight.dtype) == (8, 96, torch.float32)
        assert b.adaln_proj.prequant_out_dtype == torch.bfloat16
    assert (m.norm_out.linear.in_features, m.norm_out.linear.out_features) == (8, 32)
    assert tuple(m.time_embedder.table.shape) == (33, 8)


@pytest.mark.parametrize("metadata", [{}, {"adaln_form": "dense"}, {**CURVE, "curve_grid": 0}, None],
                         ids=["no-record", "dense", "no-grid", "none"])
def test_a_dense_form_record_leaves_the_model_as_built(metadata):
    m = _h3_skeleton()
    before = {n: id(mod) for n, mod in m.named_modules()}
    assert _prepare()(m, metadata) is False
    assert {n: id(mod) for n, mod in m.named_modules()} == before
    assert m.transformer_blocks[0].adaln_proj.linear.in_features == 32


def _meta_model(family: str) -> nn.Module:
    import diffusers
    with torch.device("meta"):
        return getattr(diffusers, tf.TINY[family].diffusers_class)(**tf.tiny_kwargs(family))


def test_the_curve_form_refuses_a_model_without_transformer_blocks():
    lumina = _meta_model("lumina-2")  # another family's class: layers, no transformer_blocks
    with pytest.raises(ValueError) as e:
        _prepare()(lumina, CURVE)
    assert str(e.value) == "the curve form needs transformer_blocks and norm_out: not a MiniMaxH3Transformer3DModel"
    m = _h3_skeleton()
    del m.norm_out
    with pytest.raises(ValueError, match="needs transformer_blocks and norm_out"):
        _prepare()(m, CURVE)


def test_the_curve_form_refuses_blocks_without_the_modulation_projection():
    flux = _meta_model("flux.1")  # transformer_blocks and norm_out, but FLUX.1's blocks
    with pytest.raises(ValueError) as e:
        _prepare()(flux, CURVE)
    assert str(e.value) == "block 0 has no adaln_proj"


@pytest.mark.parametrize("where", ["block", "norm_out"])
def test_the_curve_form_refuses_a_modulation_that_is_no_linear_naming_where(where):
    if where == "block":
        made = iter([nn.Linear(32, 96), nn.Conv1d(32, 96, 1)])
        m = _h3_skeleton(modulation=lambda: next(made))
        name = "transformer_blocks.1.adaln_proj.linear"
    else:
        m = _h3_skeleton()
        m.norm_out.linear = nn.Conv1d(32, 32, 1)
        name = "norm_out.linear"
    with pytest.raises(ValueError) as e:
        _prepare()(m, CURVE)
    assert str(e.value) == f"the curve form expects a Linear at {name}"
    assert isinstance(m.time_embedder, nn.Linear)  # refused before the time embedder is replaced
