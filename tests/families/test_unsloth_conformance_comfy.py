"""The Unsloth conformance corpus (tests/unsloth_builder.py: files made the way Unsloth's builder makes them, never by
this pack's writer) through Load Prequant Transformer on the real ComfyUI, for every family ComfyUI has a class for:
int8, fp8, whole-model NVFP4 and v3-policy files sample exactly as this pack quantizing the same dense weights at
load (policy layers in the file's own formats); int8 ConvRot samples as close to the dense model as plain int8.
Each kind is sampled from the ``.pt``; its converted ``.safetensors`` twin must place the very same weights.
"""
from __future__ import annotations

import os

import pytest
import torch

import conformance_check as cc
import unsloth_builder as ub
from prequant_core import families, schemes
from prequant_core.schemes import qtensor, quantize
from tools import tiny_families as tf

FAMILIES = ["z-image", *tf.TINY]


def _sample(model, family):
    if family == "z-image":
        from conftest import sample
        return sample(model, steps=2, cap_dim=768)
    return tf.sample(model, family, steps=2)


def _dense(family):
    if family == "z-image":
        from tools import tiny_models
        return tiny_models.zimage_dense(seed=0)
    return tf.dense(family, seed=0)


def _reference_tensors(family, kind, dense, ck):
    """This pack quantizing ``dense`` at load: the scheme's filter, or for a policy file the formats it records."""
    fam = families.get(family)
    if kind != "policy":
        scheme = ub.KINDS[kind]
        q, _ = quantize.quantize_tensors(dense, scheme,
                                         exclude=schemes.exclude_tokens(scheme, fam.arch.int8_exclude_extra))
        return q
    nv = set(ck.metadata["nvfp4_policy"]["nvfp4_fqns"])
    out = {}
    for k, v in dense.items():
        fqn = k[:-len(".weight")] if k.endswith(".weight") else None
        if fqn in nv:
            out[k] = schemes.quantize_weight(v, "nvfp4")
        elif qtensor.is_quantized(ck.tensors.get(k)):
            out[k] = schemes.quantize_weight(v, "fp8")
        else:
            out[k] = v
    return out


def _weights(model) -> dict:
    """Every tensor the placed diffusion model holds, quantized ones as their parts."""
    out = {}
    for n, m in model.model.diffusion_model.named_modules():
        for pn, p in list(m.named_parameters(recurse=False)) + list(m.named_buffers(recurse=False)):
            out[f"{n}.{pn}"] = p
        if getattr(m, "prequant_spec", None) is not None:
            out[f"{n}.prequant_spec"] = m.prequant_spec
    return out


def _same(a, b) -> bool:
    if not isinstance(a, torch.Tensor):  # a layer's QSpec
        return a == b
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor) and a.is_meta:
        return False
    if qtensor.is_quantized(a) or qtensor.is_quantized(b):
        return qtensor.is_quantized(a) and qtensor.is_quantized(b) and _same(qtensor.parts(a)[0], qtensor.parts(b)[0])
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


@pytest.mark.parametrize("family", FAMILIES)
def test_unsloth_files_through_the_loader_node(comfy, family):
    import folder_paths
    nodes, pack = comfy
    folder = os.path.join(folder_paths.get_folder_paths("prequant")[0], "unsloth", family)
    os.makedirs(folder, exist_ok=True)
    try:
        _through_the_node(nodes, pack, family, folder)
    finally:
        # each family's ten files (up to 0.8 GB) go when its test ends: the module's model folder lives for the
        # whole module, and the 11 families' files together (3.2 GB) were a quarter of the suite's scratch peak
        import gc
        import shutil
        import comfy.model_management as mm
        mm.unload_all_models()
        gc.collect()
        shutil.rmtree(folder, ignore_errors=True)


def _through_the_node(nodes, pack, family, folder):
    import folder_paths
    files = cc.corpus_files(family, folder)
    base = ub.FAMILIES[family][1]
    dense = _dense(family)
    fam = families.get(family)
    loader_node = nodes.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]()
    dense_out = _sample(pack.nodes.comfy_model.build_patcher(fam, "diffusers", dict(dense)), family)
    rel = {}
    for kind in cc.KINDS:
        models = {}
        for container in cc.CONTAINERS:
            name = os.path.relpath(files[(kind, container)], folder_paths.get_folder_paths("prequant")[0])
            with torch.inference_mode():
                res = loader_node.load(name, base_model_id=base, scheme=ub.KINDS[kind])
            models[container] = res["result"][0]
            assert res["ui"]["prequant"][0]["family"] == family
        a, b = _weights(models["pt"]), _weights(models["safetensors"])
        assert set(a) == set(b) and all(_same(a[k], b[k]) for k in a), f"{family}/{kind}: the containers differ"
        out = _sample(models["pt"], family)
        assert torch.isfinite(out).all()
        rel[kind] = ((out - dense_out).norm() / dense_out.norm()).item()
        line = f"\n[{family}/{kind}] rel. error vs dense {rel[kind]:.4f}"
        if kind != "convrot":
            from prequant_core import formats
            ck = formats.read(files[(kind, "pt")])
            ref = pack.nodes.comfy_model.build_patcher(fam, "diffusers", _reference_tensors(family, kind, dense, ck))
            diff = (out - _sample(ref, family)).abs().max().item()
            line += f"; max |Unsloth file - load-time| = {diff}"
            assert diff == 0.0, f"{family}/{kind}: must equal this pack quantizing the same dense weights at load"
        print(line)
    assert rel["convrot"] < max(1.5 * rel["int8"], 0.03), rel


@pytest.mark.parametrize("container", cc.CONTAINERS)
def test_a_lora_on_an_unsloth_file_backs_up_fused_rows_from_that_file(comfy, container):
    """An Unsloth-made int8 Z-Image file (diffusers keys: to_q/to_k/to_v fused into ComfyUI's qkv at load), in both
    containers: the LoRA's backup of the fused qkv is that file's own rows (nodes/patcher.py), checked against the
    file's bytes, and unpatching restores the loaded weights byte for byte."""
    import folder_paths
    import comfy.model_management as mm
    from conftest import with_lora as _with_lora
    nodes, pack = comfy
    root = folder_paths.get_folder_paths("prequant")[0]
    folder = os.path.join(root, "unsloth", "lora")
    os.makedirs(folder, exist_ok=True)
    path = cc.corpus_files("z-image", folder, kinds=("int8",))[("int8", container)]
    with torch.inference_mode():
        model = nodes.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]().load(
            os.path.relpath(path, root), base_model_id=ub.FAMILIES["z-image"][1], scheme="int8")["result"][0]
    qkv = model.model.diffusion_model.layers[0].attention.qkv
    assert len(qkv.prequant_fused_from) == 3
    orig = [p.clone() for p in qkv.prequant_parts()]
    lora = _with_lora(comfy, model, "tiny_zimage_unsloth_lora.safetensors", seed=13)
    _sample(lora, "z-image")
    kept = lora.backup["diffusion_model.layers.0.attention.qkv.weight"]
    assert isinstance(kept, pack.nodes.patcher._RebuiltFromFile) and torch.equal(kept.weight, orig[0])
    assert not torch.equal(qkv.weight, orig[0])
    mm.unload_all_models()
    assert all(torch.equal(a, b) for a, b in zip(qkv.prequant_parts(), orig))
