"""NVFP4 / MXFP8 / v3 layer-policy / ConvRot (v2) files through the real ComfyUI (headless, CPU).

The CPU has no NVFP4 or MX kernels, so every weight here runs the dequantize-at-matmul path, which is the path any
device other than a Blackwell GPU takes. Files are written with torchao's own tensor classes (the builder, or
``schemes.quantize_weight``); outputs are compared with quantizing the same dense weights at load time.
"""
from __future__ import annotations

import os

import pytest
import torch

from conftest import dense_of

from prequant_core import builder, families, formats, schemes
from prequant_core.schemes import nvfp4_policy
from prequant_core.schemes import quantize, rotation
from prequant_core.builder import writers
from prequant_core.formats.checkpoint import FORMAT_V2, FORMAT_V3
from tools import tiny_families as tf, tiny_models

FAMILY = "flux.1"  # fused qkv in ComfyUI: NVFP4 rows with different per-tensor scales end up in one Linear


def sample(model, steps=2, seed=0):
    return tf.sample(model, FAMILY, steps, seed)


_dense: dict = {}


def dense():
    if "d" not in _dense:
        _dense["d"] = tf.dense(FAMILY, seed=0)
    return _dense["d"]


@pytest.fixture(scope="module")
def folder(comfy):
    import folder_paths
    d = os.path.join(folder_paths.get_folder_paths("prequant")[0], "block")
    os.makedirs(d, exist_ok=True)
    return d


def load(comfy, name, **kw):
    nodes, _ = comfy
    with torch.inference_mode():
        return nodes.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]().load("block/" + name, **kw)


def load_time(comfy, tensors):
    """The reference: the same dense weights quantized in memory, placed by the same ComfyUI model builder."""
    return comfy[1].nodes.comfy_model.build_patcher(families.get(FAMILY), "diffusers", tensors)


def built(folder, scheme) -> str:
    name = f"FLUX.1-schnell-{scheme.upper()}.pt"
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        builder.build_from_tensors(dense(), builder.Target(path, container="pt"),
                                   builder.Recipe(scheme, family=families.get(FAMILY),
                                                  base_model_id=tf.TINY[FAMILY].base_model_id))
    return name


@pytest.mark.parametrize("scheme", ["nvfp4", "mxfp8"])
def test_block_file_equals_load_time_quantization_and_says_its_path(comfy, folder, scheme):
    name = built(folder, scheme)
    ck = formats.read(os.path.join(folder, name))
    assert ck.format_tag == "unsloth_prequant_transformer_state_dict_v1" and ck.metadata["scheme"] == scheme
    assert ck.schemes_found() == {scheme}
    res = load(comfy, name, scheme=scheme)
    model, summary = res["result"][0], res["ui"]["prequant"][0]
    assert "dequantized at matmul" in summary["matmul"] and scheme in summary["matmul"], summary["matmul"]
    dm = model.model.diffusion_model
    qkv = dm.double_blocks[0].img_attn.qkv
    assert qkv.prequant_spec.kind == scheme
    if scheme == "nvfp4":  # the fused q/k/v rows keep their own per-tensor scales
        assert qkv.weight.dtype == torch.uint8 and qkv.weight.shape[1] * 2 == qkv.in_features
        assert len(torch.unique(qkv.weight_scale_2)) == 3
    out = sample(model)
    q, _ = quantize.quantize_tensors(dense(), scheme)
    ref = sample(load_time(comfy, q))
    d = sample(load_time(comfy, dict(dense())))
    rel = ((out - d).norm() / d.norm()).item()
    print(f"\n[{scheme}] max |prequant - load-time| = {(out - ref).abs().max().item()}; rel. error vs dense {rel:.4f}")
    assert torch.isfinite(out).all() and torch.equal(out, ref)
    assert 0 < rel < 0.25


def test_nvfp4_model_size_is_the_real_bytes(comfy, folder):
    """ComfyUI's memory manager sees the packed 4-bit size, well under the fp8 file's model."""
    nv = load(comfy, built(folder, "nvfp4"))["result"][0]
    fp8 = load(comfy, built(folder, "fp8"))["result"][0]
    mm = {n: sum(p.numel() * p.element_size() for p in m.model.diffusion_model.parameters()) for n, m in
          (("nv", nv), ("fp8", fp8))}
    assert nv.model_size() == pytest.approx(mm["nv"], rel=0.01)
    assert mm["nv"] < 0.8 * mm["fp8"], mm


def _lora_on(comfy, model, part, seed, name):
    """``model`` with a rank-4 diffusers-named LoRA on ``transformer_blocks.0.attn.<part>`` (a row slice of ComfyUI's
    fused qkv) through stock LoraLoaderModelOnly."""
    import folder_paths
    from safetensors.torch import save_file
    nodes, _ = comfy
    h = model.model.diffusion_model.hidden_size
    g = torch.Generator().manual_seed(seed)
    sd = {f"transformer.transformer_blocks.0.attn.{part}.lora_B.weight": (torch.randn(h, 4, generator=g) * 0.2)
          .to(torch.bfloat16),
          f"transformer.transformer_blocks.0.attn.{part}.lora_A.weight": (torch.randn(4, h, generator=g) * 0.2)
          .to(torch.bfloat16)}
    lora_dir = folder_paths.get_folder_paths("loras")[0]
    os.makedirs(lora_dir, exist_ok=True)
    save_file(sd, os.path.join(lora_dir, name))
    with torch.inference_mode():
        return nodes.NODE_CLASS_MAPPINGS["LoraLoaderModelOnly"]().load_lora_model_only(model, name, 1.0)[0]


def _patched_in_blocks_and_whole(pack, monkeypatch, lora, layer):
    """``layer``'s patched parts and the sampled latent, patched whole (the default block size on these tiny layers)
    and in blocks of 8 rows; unloaded after each."""
    import comfy.model_management as mm
    parts, outs = [], []
    for rows in (pack.nodes.lora_rows.rows_per_block, lambda columns: 8):
        monkeypatch.setattr(pack.nodes.lora_rows, "rows_per_block", rows)
        outs.append(sample(lora))
        parts.append([p.clone() for p in layer.prequant_parts()])
        mm.unload_all_models()
    return parts, outs


def test_nvfp4_lora_patches_only_its_rows_and_unpatches_exactly(comfy, folder):
    import comfy.model_management as mm
    model = load(comfy, built(folder, "nvfp4"))["result"][0]
    base = sample(model)
    qkv = model.model.diffusion_model.double_blocks[0].img_attn.qkv
    h = model.model.diffusion_model.hidden_size
    orig = [p.clone() for p in qkv.prequant_parts()]
    orig_dense = dense_of(qkv).clone()
    lora = _lora_on(comfy, model, "to_k", 5, "tiny_flux1_nvfp4_lora.safetensors")
    with_lora = sample(lora)
    assert torch.isfinite(with_lora).all() and not torch.equal(with_lora, base)
    delta = (dense_of(qkv) - orig_dense).abs()
    assert delta[h:2 * h].max() > 0 and torch.cat([delta[:h], delta[2 * h:]]).max() == 0
    assert torch.equal(qkv.weight_scale_2[:h], orig[2][:h]) and torch.equal(qkv.weight_scale_2[2 * h:], orig[2][2 * h:])
    mm.unload_all_models()
    assert all(torch.equal(a, b) for a, b in zip(qkv.prequant_parts(), orig)), "unpatch restores every part"
    assert torch.equal(sample(model), base)


def test_nvfp4_lora_is_patched_layer_by_layer(comfy, folder, monkeypatch):
    """NVFP4's changed rows share one fresh row scale (from the maximum over all of them), so its layers are never cut
    into blocks of rows (nodes/lora_rows.py): with blocks of 8 rows asked for, the patched parts are the same bytes."""
    _, pack = comfy
    model = load(comfy, built(folder, "nvfp4"))["result"][0]
    qkv = model.model.diffusion_model.double_blocks[0].img_attn.qkv
    lora = _lora_on(comfy, model, "to_k", 6, "tiny_flux1_nvfp4_lora_rows.safetensors")
    patched, _ = _patched_in_blocks_and_whole(pack, monkeypatch, lora, qkv)
    assert qkv.weight.shape[0] > 8 and all(torch.equal(a.view(torch.uint8), b.view(torch.uint8))
                                           for a, b in zip(*patched))
    assert not torch.equal(patched[0][2], qkv.weight_scale_2), "the patch gave the changed rows a fresh scale"


# ---------------------------------------------------------------------------------------------------------------
# v3: a layer policy mixing NVFP4, per-row fp8 and bf16 layers


def policy_tensors():
    """Unsloth-style policy on the tiny model: attention projections NVFP4, MLPs fp8, one big Linear kept bf16."""
    fam = families.get(FAMILY)
    out, fqns, counts = {}, [], {"nvfp4": 0, "fp8": 0, "bf16": 0}
    flt = schemes.LayerFilter("fp8", schemes.DEFAULT_MIN_FEATURES, ())
    lin = set(tiny_models.linear_weight_keys(dense()))
    for k, v in dense().items():
        v = v.to(torch.bfloat16)
        mod = k[:-len(".weight")]
        if k not in lin or flt.reason_skipped(mod, v) is not None:
            out[k] = v
        elif "single_transformer_blocks.0.proj_out" in k:
            out[k] = v
            counts["bf16"] += 1
        elif ".attn." in k:
            out[k] = schemes.quantize_weight(v, "nvfp4")
            fqns.append(mod)
            counts["nvfp4"] += 1
        else:
            out[k] = schemes.quantize_weight(v, "fp8")
            counts["fp8"] += 1
    meta = builder.make_metadata(builder.Recipe("nvfp4", family=fam, base_model_id=tf.TINY[FAMILY].base_model_id,
                                                min_features=schemes.DEFAULT_MIN_FEATURES, exclude=[]),
                                 out)
    meta["nvfp4_policy"] = {"kind": nvfp4_policy.POLICY_KIND, "policy_id": "tiny_flux_attn_v1", "policy_version": 1,
                            "counts": counts, "nvfp4_fqns": fqns, "activation_scales_baked": False, "gptq": False}
    return out, meta


def test_v3_policy_file_loads_mixed_layers_like_load_time(comfy, folder):
    tensors, meta = policy_tensors()
    path = os.path.join(folder, "FLUX.1-schnell-NVFP4-policy.pt")
    writers.write_checkpoint(path, tensors, meta, container="pt", overwrite=True)
    ck = formats.read(path)
    assert ck.format_tag == FORMAT_V3 and ck.schemes_found() == {"nvfp4", "fp8"}
    res = load(comfy, os.path.basename(path), scheme="nvfp4")
    model = res["result"][0]
    kinds = {m.prequant_spec.kind for m in model.model.diffusion_model.modules() if getattr(m, "prequant_spec", None)}
    assert kinds == {"nvfp4", "float8"}
    # FLUX fuses q, k, v (nvfp4 here) with the MLP input (fp8): that one weight is kept as its exact dense rows
    assert getattr(model.model.diffusion_model.single_blocks[0].linear1, "prequant_spec", None) is None
    assert sample(model).equal(sample(load_time(comfy, dict(tensors))))
    info = comfy[0].NODE_CLASS_MAPPINGS["PrequantInfo"]().inspect("block/" + os.path.basename(path))
    text = str(info)
    assert "tiny_flux_attn_v1" in text and f"{meta['nvfp4_policy']['counts']['nvfp4']} nvfp4" in text


def test_v3_policy_with_wrong_counts_is_refused_naming_the_field(comfy, folder):
    from prequant_core.errors import ValidationError
    tensors, meta = policy_tensors()
    meta["nvfp4_policy"]["counts"]["fp8"] += 1
    path = os.path.join(folder, "FLUX.1-schnell-NVFP4-badpolicy.pt")
    writers.write_checkpoint(path, tensors, meta, container="pt", overwrite=True)
    with pytest.raises(ValidationError) as e:
        load(comfy, os.path.basename(path))
    msg = str(e.value)
    assert "counts['fp8']" in msg and "the file holds" in msg


# ---------------------------------------------------------------------------------------------------------------
# v2: ConvRot (int8 weights of W·H, inputs rotated by the block Hadamard at run time)


def convrot_tensors(group=64):
    fam = families.get(FAMILY)
    flt = schemes.LayerFilter("int8", schemes.DEFAULT_MIN_FEATURES, tuple(schemes.exclude_tokens("int8", ())))
    lin = set(tiny_models.linear_weight_keys(dense()))
    out, fqns = {}, []
    for k, v in dense().items():
        v = v.to(torch.bfloat16)
        mod = k[:-len(".weight")]
        if k in lin and flt.reason_skipped(mod, v) is None:
            if ".attn." in k or ".ff." in k:
                v = rotation.rotate(v.to(torch.float64), group).to(torch.bfloat16)  # W H (H symmetric)
                fqns.append(mod)
            out[k] = schemes.quantize_weight(v, "int8")
        else:
            out[k] = v
    meta = builder.make_metadata(builder.Recipe("int8", family=fam, base_model_id=tf.TINY[FAMILY].base_model_id,
                                                min_features=schemes.DEFAULT_MIN_FEATURES,
                                                exclude=schemes.exclude_tokens("int8", fam.arch.int8_exclude_extra)),
                                 out)
    meta.update(activation_rotation=rotation.KIND, activation_rotation_group=group, activation_rotation_fqns=fqns)
    return out, meta


def test_convrot_file_rotates_inputs_and_matches_the_dense_model(comfy, folder):
    tensors, meta = convrot_tensors()
    path = os.path.join(folder, "FLUX.1-schnell-INT8-ConvRot.pt")
    writers.write_checkpoint(path, tensors, meta, container="pt", overwrite=True)
    assert formats.read(path).format_tag == FORMAT_V2
    model = load(comfy, os.path.basename(path), scheme="int8")["result"][0]
    dm = model.model.diffusion_model
    rotated = [m for m in dm.modules() if getattr(m, "prequant_spec", None) is not None and m.prequant_spec.rotation]
    assert rotated and all(m.prequant_spec.rotation == 64 for m in rotated)
    assert dm.double_blocks[0].img_attn.qkv.prequant_spec.rotation == 64  # fused parts, all rotated alike

    # one layer against a float64 reference: (codes * scale) @ (H x), weight-only path
    lin = dm.double_blocks[0].img_attn.proj
    lin.prequant_matmul = "weight-only"
    x = torch.randn(3, lin.in_features, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        got = lin(x)
    w64 = lin.weight.to(torch.float64) * lin.weight_scale.to(torch.float64)
    ref = rotation.rotate(x.to(torch.float64), 64) @ w64.T + lin.bias.to(torch.float64)
    assert ((got.to(torch.float64) - ref).abs().max() / ref.abs().max()).item() < 1e-5
    lin.prequant_matmul = None

    # the whole model: the rotated int8 file tracks the dense model as well as the plain int8 file does
    out = sample(model)
    d = sample(load_time(comfy, dict(dense())))
    q, _ = quantize.quantize_tensors(dense(), "int8", exclude=schemes.exclude_tokens("int8", ()))
    plain = sample(load_time(comfy, q))
    rel_rot = ((out - d).norm() / d.norm()).item()
    rel_plain = ((plain - d).norm() / d.norm()).item()
    print(f"\n[ConvRot] rel. error vs dense: rotated int8 {rel_rot:.4f}, plain int8 {rel_plain:.4f}")
    assert torch.isfinite(out).all() and rel_rot < 2 * rel_plain + 0.01


def test_convrot_lora_in_blocks_of_rows_is_the_whole_layers_patch(comfy, folder, monkeypatch):
    """A LoRA on a ConvRot layer patches W = W' H (the stored weight rotated back) and requantizes W H: both rotations
    are along the columns, so patching a block of rows at a time (nodes/lora_rows.py) gives the very codes of patching
    the whole layer, and unpatching restores the file's."""
    _, pack = comfy
    tensors, meta = convrot_tensors()
    path = os.path.join(folder, "FLUX.1-schnell-INT8-ConvRot-lora.pt")
    writers.write_checkpoint(path, tensors, meta, container="pt", overwrite=True)
    model = load(comfy, os.path.basename(path), scheme="int8")["result"][0]
    qkv = model.model.diffusion_model.double_blocks[0].img_attn.qkv
    assert qkv.prequant_spec.rotation == 64
    orig = [p.clone() for p in qkv.prequant_parts()]
    h = model.model.diffusion_model.hidden_size
    lora = _lora_on(comfy, model, "to_v", 7, "tiny_flux1_convrot_lora.safetensors")
    patched, outs = _patched_in_blocks_and_whole(pack, monkeypatch, lora, qkv)
    assert len(pack.nodes.lora_rows.blocks(lora.patches["diffusion_model.double_blocks.0.img_attn.qkv.weight"],
                                           qkv.weight.shape[0], 8)) > 2
    assert all(torch.equal(a, b) for a, b in zip(*patched)) and torch.equal(*outs)
    assert not torch.equal(patched[0][0][2 * h:], orig[0][2 * h:]) and torch.equal(patched[0][0][:2 * h], orig[0][:2 * h])
    assert all(torch.equal(a, b) for a, b in zip(qkv.prequant_parts(), orig)), "unpatch restores every part"


def test_convrot_without_its_rotation_would_be_wrong(comfy, folder):
    """The rotation is doing the work: the same file with the rotation fields removed drifts far from dense."""
    tensors, meta = convrot_tensors()
    for k in ("activation_rotation", "activation_rotation_group", "activation_rotation_fqns"):
        meta.pop(k)
    path = os.path.join(folder, "FLUX.1-schnell-INT8-unrotated.pt")
    writers.write_checkpoint(path, tensors, meta, container="pt", overwrite=True)
    out = sample(load(comfy, os.path.basename(path))["result"][0])
    d = sample(load_time(comfy, dict(dense())))
    assert ((out - d).norm() / d.norm()).item() > 0.3


def test_convrot_with_a_bad_group_is_refused_before_any_layer_changes(comfy, folder):
    from prequant_core.errors import ValidationError
    tensors, meta = convrot_tensors()
    meta["activation_rotation_group"] = 32  # a power of 2, not of 4
    path = os.path.join(folder, "FLUX.1-schnell-INT8-ConvRot-bad.pt")
    writers.write_checkpoint(path, tensors, meta, container="pt", overwrite=True)
    with pytest.raises(ValidationError) as e:
        load(comfy, os.path.basename(path))
    assert "activation_rotation_group" in str(e.value) and "power of 4" in str(e.value)


def test_nvfp4_on_the_low_vram_path_equals_the_full_load(comfy, folder):
    """ComfyUI's low-VRAM mode streams each Linear's parts to the compute device per call (here the CPU again):
    the same output as the model loaded whole."""
    import comfy.model_management as mm
    name = built(folder, "nvfp4")
    full_model = load(comfy, name)["result"][0]
    mm.unload_all_models()
    with torch.inference_mode():
        full_model.load(full_model.load_device, force_patch_weights=False, full_load=True)
    full = sample(full_model)
    del full_model
    mm.unload_all_models()
    model = load(comfy, name)["result"][0]
    with torch.inference_mode():
        model.load(model.load_device, lowvram_model_memory=1, force_patch_weights=False, full_load=False)
    streamed = [m for m in model.model.diffusion_model.modules()
                if getattr(m, "comfy_cast_weights", False) and getattr(m, "prequant_spec", None)]
    assert len(streamed) >= 4 and all(m.prequant_spec.kind == "nvfp4" for m in streamed)
    assert torch.equal(sample(model), full)
