"""LoRA patches of a quantized Linear's *bias* and weight functions of another pack (issue 61: node lines no test
ran), on the tiny int8 Z-Image in the real ComfyUI: a LoRA's ``.diff_b`` on the quantized ``cap_embedder.1`` is
applied, merged, by ComfyUI's own code to the dense bias (patcher: a non-weight key is not the pack's), with the same
result as ComfyUI gives the unquantized model; a callable ComfyUI's ``add_weight_wrapper`` attaches (not a
LowVramPatch) gets the dense weight, and its result runs requantized, per call, the stored codes untouched; a bias
wrapper runs on the bias (ops: the layer's bias functions)."""
from __future__ import annotations

import os

import pytest
import torch

from conftest import load_path, low_vram

LAYER = "cap_embedder.1"  # the tiny Z-Image's one quantized Linear with a bias (1536 x 768)
BIAS_KEY = f"diffusion_model.{LAYER}.bias"
WEIGHT_KEY = f"diffusion_model.{LAYER}.weight"


def _lora_file(name, *, weight: bool, seed=5) -> str:
    """A LoRA file in ComfyUI's form for ``cap_embedder.1``: ``diff_b`` (a bias difference), and with ``weight`` its
    lora_up / lora_down too; written to the loras folder."""
    import folder_paths
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(seed)
    sd = {f"diffusion_model.{LAYER}.diff_b": (torch.randn(1536, generator=g) * 0.5).to(torch.bfloat16)}
    if weight:
        sd[f"diffusion_model.{LAYER}.lora_up.weight"] = (torch.randn(1536, 4, generator=g) * 0.05).to(torch.bfloat16)
        sd[f"diffusion_model.{LAYER}.lora_down.weight"] = (torch.randn(4, 768, generator=g) * 0.05).to(torch.bfloat16)
        sd[f"diffusion_model.{LAYER}.alpha"] = torch.tensor(4.0)
    folder = folder_paths.get_folder_paths("loras")[0]
    os.makedirs(folder, exist_ok=True)
    save_file(sd, os.path.join(folder, name))
    return name


def _with(comfy, model, lora):
    with torch.inference_mode():
        return comfy[0].NODE_CLASS_MAPPINGS["LoraLoaderModelOnly"]().load_lora_model_only(model, lora, 1.0)[0]


@pytest.fixture
def int8_model(comfy, prequant_files, allow_dir):
    path = prequant_files("int8")
    allow_dir(os.path.dirname(path))
    return load_path(comfy, path)


def test_a_bias_lora_on_a_quantized_linear_patches_the_bias_as_comfyui_patches_the_dense_model(
        comfy, int8_model, zimage_dense):
    """Merged: the weight of ``cap_embedder.1`` goes through the pack's requantizing patch, its bias (a plain tensor,
    not the pack's) through ComfyUI's own ``patch_weight_to_device``, giving the very bias ComfyUI gives the
    unquantized model under the same LoRA; unpatching restores it exactly."""
    import comfy.model_management as mm
    from prequant_core import families
    _, pack = comfy
    lora = _lora_file("prequant_test_bias_lora.safetensors", weight=True)
    q = _with(comfy, int8_model, lora)
    assert q.patches[BIAS_KEY][0][1][0] == "diff", q.patches[BIAS_KEY]  # ComfyUI's form of a LoRA's diff_b
    op = int8_model.model.diffusion_model.get_submodule(LAYER)
    assert q._prequant_op(BIAS_KEY) is None, "a bias is not the pack's to patch"
    assert q._prequant_op(WEIGHT_KEY) is op and q._prequant_op("diffusion_model.no.such.weight") is None
    orig_bias, orig_codes = op.bias.detach().clone(), op.weight.detach().clone()
    dense = pack.nodes.comfy_model.build_patcher(families.get("z-image"), "diffusers", dict(zimage_dense))
    dense_op = dense.model.diffusion_model.get_submodule(LAYER)
    assert torch.equal(dense_op.bias, orig_bias) and dense_op.bias.dtype == op.bias.dtype
    d = _with(comfy, dense, lora)
    mm.load_models_gpu([d])
    dense_patched = dense_op.bias.detach().clone()
    mm.unload_all_models()
    mm.load_models_gpu([q])
    try:
        assert not torch.equal(op.bias, orig_bias), "the bias patch must be applied"
        assert torch.equal(op.bias, dense_patched), "the same bias as ComfyUI gives the unquantized model"
        assert not torch.equal(op.weight, orig_codes), "the weight's LoRA is merged into the codes"
        # ComfyUI's calculate_weight on the bias alone, rounded to its dtype as ComfyUI rounds a patched weight
        from comfy import float as comfy_float, lora as comfy_lora, model_patcher, utils as comfy_utils
        seed = getattr(comfy_utils, "string_to_seed", None) or model_patcher.string_to_seed  # (0.3.75: the latter)
        ref = comfy_lora.calculate_weight(q.patches[BIAS_KEY], orig_bias.float(), BIAS_KEY)
        ref = comfy_float.stochastic_rounding(ref, orig_bias.dtype, seed=seed(BIAS_KEY))
        assert torch.equal(op.bias, ref)
        assert isinstance(q.backup[BIAS_KEY].weight, torch.Tensor) and torch.equal(q.backup[BIAS_KEY].weight,
                                                                                  orig_bias)
    finally:
        mm.unload_all_models()
    assert torch.equal(op.bias, orig_bias) and torch.equal(op.weight, orig_codes)


def test_another_packs_weight_function_gets_the_dense_weight_and_its_result_runs_per_call(comfy, int8_model):
    """A callable another pack attaches through ComfyUI's ``add_weight_wrapper`` (not a LowVramPatch) is handed the
    dequantized weight, as ComfyUI hands dense layers theirs; what it returns is requantized and runs, per call, the
    stored codes untouched. Negating the weight negates the layer's output (the bias left as it is); a bias wrapper
    runs on the bias."""
    import comfy.model_management as mm
    from prequant_core.schemes import qtensor
    op = int8_model.model.diffusion_model.get_submodule(LAYER)
    codes, bias = op.weight.detach().clone(), op.bias.detach().clone()
    x = torch.randn(3, 768, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    mm.load_models_gpu([int8_model])
    with torch.no_grad():
        plain = op(x).float()
    mm.unload_all_models()
    seen = []

    def negate(w):
        seen.append((w.dtype, tuple(w.shape)))
        return -w

    m = int8_model.clone()
    m.add_weight_wrapper(WEIGHT_KEY, negate)
    m.add_weight_wrapper(BIAS_KEY, lambda b: b * 0)
    mm.load_models_gpu([m])
    try:
        assert op.weight_function == [negate]
        with torch.no_grad():
            out = op(x).float()
        assert torch.equal(op.weight, codes) and torch.equal(op.bias, bias), "nothing is merged"
    finally:
        mm.unload_all_models()
    assert seen and seen[0] == (op.prequant_spec.dtype, (1536, 768)), seen
    dense = qtensor.dense_from_parts(op.prequant_parts(), op.prequant_spec, torch.float32)
    # W x + b with b -> 0 and W -> -W (requantized: the same codes negated, the scale within bf16's rounding)
    no_bias = plain - bias.float()
    assert torch.allclose(out, -no_bias, rtol=2e-2, atol=2e-2 * no_bias.abs().max().item()), \
        (out - (-no_bias)).abs().max()
    assert torch.allclose(no_bias, x.float() @ dense.T, rtol=5e-2, atol=5e-2 * no_bias.abs().max().item())


def test_a_bias_lora_in_low_vram_mode_adds_its_difference_once_per_call_and_leaves_the_bias_as_loaded(
        comfy, int8_model):
    """Low-VRAM mode applies a LoRA's ``diff_b`` per call through ComfyUI's LowVramPatch, which adds it in place: the
    layer used to hand it its own bias, so each call added the difference again (the stored bias at 1x, 2x, 3x
    ``diff_b`` after three calls, kept after unloading, and every output different). Now every call computes what
    the merged LoRA computes, the same each time, and the bias stays the file's."""
    import comfy.model_management as mm
    lora = _lora_file("prequant_test_bias_only_lora.safetensors", weight=False)
    op = int8_model.model.diffusion_model.get_submodule(LAYER)
    x = torch.randn(3, 768, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    orig_bias = op.bias.detach().clone()
    mm.load_models_gpu([int8_model])
    with torch.no_grad():
        plain = op(x)
    mm.unload_all_models()
    merged_model = _with(comfy, int8_model, lora)
    mm.load_models_gpu([merged_model])
    with torch.no_grad():
        merged = op(x)
    mm.unload_all_models()
    low = low_vram(_with(comfy, int8_model, lora))
    mm.load_models_gpu([low])
    try:
        assert op.prequant_bias_functions(), "the LoRA runs per call here"
        with torch.no_grad():
            outs = [op(x) for _ in range(3)]
        assert torch.equal(op.bias, orig_bias), "the stored bias is never patched in place"
    finally:
        mm.unload_all_models()
    assert torch.equal(op.bias, orig_bias)
    assert all(torch.equal(o, outs[0]) for o in outs), "every call adds the difference once"
    assert not torch.equal(outs[0], plain), "the bias LoRA applies"
    d = (merged.float() - plain.float()).abs().max().item()
    assert torch.allclose(outs[0].float(), merged.float(), atol=0.02 * d), (outs[0].float() - merged.float()).abs().max()

