"""The pack's MODEL on today's ComfyUI memory management (0.15+): built through ``CoreModelPatcher``, whatever class
``main.py`` points it at (``ModelPatcherDynamic`` with DynamicVRAM on, the CUDA default), its layers built and run
the way DynamicVRAM expects. A CPU never builds the dynamic patcher (its ``__new__`` hands back a plain
ModelPatcher) and never allocates its VRAM bars, so what DynamicVRAM does to a model that a CPU can show is
reproduced here: its lazy layer construction (``comfy.memory_management.aimdo_enabled``), the LoRA it attaches as
``weight_lowvram_function``, the class switch. The streaming itself is measured by ``bench/gpu_check_comfy.py``."""
from __future__ import annotations

import os

import pytest
import torch

from conftest import load_path, low_vram, sample, with_lora


@pytest.mark.parametrize("scheme,container", [("int8", "safetensors"), ("fp8", "pt"), ("nvfp4", "pt"),
                                              ("mxfp8", "pt")])
def test_a_load_with_dynamic_vram_on_builds_and_samples_as_without(comfy, prequant_files, allow_dir, monkeypatch,
                                                                    scheme, container):
    """With DynamicVRAM on, ComfyUI builds its Linear / Embedding layers with no weight until its own state-dict
    loader runs; the pack places the file's tensors itself, so it builds them as before. Without that, every load
    on a CUDA ComfyUI 0.15+ was refused with "The checkpoint's tensors do not match the model" (found on the CPU by
    turning the flag on)."""
    import comfy.memory_management as cmm
    import comfy.model_management as mm
    path = prequant_files(scheme, container)
    allow_dir(os.path.dirname(path))
    off = sample(load_path(comfy, path))
    mm.unload_all_models()
    monkeypatch.setattr(cmm, "aimdo_enabled", True)
    on = load_path(comfy, path)
    assert torch.equal(sample(on), off)
    mm.unload_all_models()


def test_native_unsloth_and_load_time_quantized_models_build_with_dynamic_vram_on(comfy, zimage_dense, models_dir,
                                                                                  tmp_path, monkeypatch):
    """The same with files the pack did not write, and with the dense fallback (quantized at load): a ComfyUI-native
    float8 file (ComfyUI's writer restated, tests/comfy_quantizer.py), an Unsloth-made int8 ``.pt`` (the restated
    builder), each sampled with the flag on and off."""
    import comfy.memory_management as cmm
    import comfy.model_management as mm
    import comfy_quantizer as cq
    import unsloth_builder as ub
    from prequant_core.load import route
    from tools import tiny_models
    native = str(tmp_path / "native-float8.safetensors")
    comfy_sd = tiny_models.zimage_comfy_layout(zimage_dense)
    cq.write(native, comfy_sd, {k[:-len(".weight")]: ("float8_e4m3fn", {}) for k, v in comfy_sd.items()
                                if k.startswith("layers.") and k.endswith(".weight") and v.ndim == 2})
    unsloth = str(tmp_path / "Z-Image-Turbo-INT8.pt")
    ub.build(ub.tiny_model("z-image"), "z-image", "int8", [unsloth])
    dense_dir = os.path.join(models_dir, "diffusion_models")
    os.makedirs(dense_dir, exist_ok=True)
    tiny_models.save_dense_safetensors(zimage_dense, os.path.join(dense_dir, "tiny_zimage_dyn_bf16.safetensors"))
    monkeypatch.setenv("PREQUANT_ALLOW_LOCAL_PATH", str(tmp_path))
    loads = {"native": dict(path=native, family="z-image"), "unsloth": dict(path=unsloth),
             "quantized at load": dict(path=unsloth, scheme="int8", policy=route.DENSE_ONLY,
                                       dense_fallback="tiny_zimage_dyn_bf16.safetensors")}
    for what, kw in loads.items():
        monkeypatch.setattr(cmm, "aimdo_enabled", False)
        off = sample(load_path(comfy, **kw))
        mm.unload_all_models()
        monkeypatch.setattr(cmm, "aimdo_enabled", True)
        on = sample(load_path(comfy, **kw))
        mm.unload_all_models()
        assert torch.equal(on, off), what

def _dynamic_vram_style(model):
    """The model as DynamicVRAM leaves each Linear once loaded (ComfyUI 0.15+, ``ModelPatcherDynamic.load``): a
    weight's LoRA attached as ``weight_lowvram_function``, not in ``weight_function``. A CPU never builds the dynamic
    patcher (its ``__new__`` hands back a plain one), so a load callback moves the low-VRAM patches there."""
    import comfy.model_patcher as mp
    m = low_vram(model)

    def as_dynamic(patcher, *_):
        for mod in patcher.model.modules():
            fs = getattr(mod, "weight_function", None)
            if fs and isinstance(fs[0], mp.LowVramPatch):
                mod.weight_lowvram_function, mod.weight_function = fs[0], fs[1:]
    m.add_callback(mp.CallbacksMP.ON_LOAD, as_dynamic)
    return m


def test_a_lora_attached_the_dynamic_vram_way_gives_the_merged_output(comfy, prequant_files, allow_dir, models_dir):
    """DynamicVRAM hands a Linear its LoRA as ``weight_lowvram_function``; ComfyUI's own cast path runs it and the
    pack's quantized forward must too, or the LoRA is silently dropped on every CUDA ComfyUI since 0.15."""
    import comfy.model_management as mm
    path = prequant_files("int8")
    allow_dir(os.path.dirname(path))
    model = load_path(comfy, path)
    base = sample(model)
    lora_model = with_lora(comfy, model, "tiny_zimage_lora_dynamic.safetensors", seed=12)
    merged = sample(lora_model)
    mm.unload_all_models()
    dm = model.model.diffusion_model
    try:
        streamed = sample(_dynamic_vram_style(lora_model))
        attached = [n for n, m in dm.named_modules() if getattr(m, "weight_lowvram_function", None) is not None]
        assert attached, "the load left no LoRA in weight_lowvram_function: the test exercises nothing"
    finally:
        mm.unload_all_models()
        for m in dm.modules():
            if hasattr(m, "weight_lowvram_function"):
                m.weight_lowvram_function = None
    assert not torch.equal(merged, base)
    assert torch.equal(streamed, merged)


def test_the_model_is_built_through_comfyuis_core_patcher_class(comfy, prequant_files, allow_dir, models_dir,
                                                                 monkeypatch):
    """Whatever ``comfy.model_patcher.CoreModelPatcher`` names when the model loads (``main.py`` points it at
    ``ModelPatcherDynamic`` with DynamicVRAM on), the MODEL is that class with the pack's hooks, as ComfyUI's own
    loaders build it; clones keep it; the latent, and a stock LoRA's, are bit for bit the plain class's. On a CPU
    ``ModelPatcherDynamic`` hands back a plain ModelPatcher, which the pack then hooks."""
    import comfy.model_management as mm
    import comfy.model_patcher as mp
    patcher = comfy[1].nodes.patcher
    path = prequant_files("int8")
    allow_dir(os.path.dirname(path))

    class MarkerPatcher(mp.ModelPatcher):
        pass

    def run(core):
        monkeypatch.setattr(mp, "CoreModelPatcher", core, raising=False)
        model = load_path(comfy, path)
        lora = with_lora(comfy, model, "tiny_zimage_lora_core.safetensors", seed=13)
        out = model, lora, sample(model), sample(lora)
        mm.unload_all_models()
        return out

    plain, _, plain_out, plain_lora = run(mp.ModelPatcher)
    marked, marked_lora, marked_out, marked_lora_out = run(MarkerPatcher)
    assert isinstance(marked, MarkerPatcher) and isinstance(marked, patcher.PrequantPatching)
    assert type(marked_lora) is type(marked) and type(marked.clone()) is type(marked)
    assert patcher.describe_class(marked) == "MarkerPatcher"
    assert torch.equal(marked_out, plain_out) and torch.equal(marked_lora_out, plain_lora)
    assert not torch.equal(plain_lora, plain_out)
    if hasattr(mp, "ModelPatcherDynamic"):
        dyn, _, dyn_out, dyn_lora = run(mp.ModelPatcherDynamic)
        assert type(dyn).__mro__[1:3] == (patcher.PrequantPatching, mp.ModelPatcher), type(dyn).__mro__
        assert torch.equal(dyn_out, plain_out) and torch.equal(dyn_lora, plain_lora)


def test_comfyui_can_load_the_model_again_as_its_non_dynamic_delegate(comfy, prequant_files, allow_dir, models_dir):
    """Under DynamicVRAM a sampler whose conds carry hooks asks ``clone(disable_dynamic=True)``, which builds a plain
    ModelPatcher around a fresh copy from ``cached_patcher_init`` (ComfyUI's own loaders register one; without it:
    "Cannot create non-dynamic delegate"). The pack registers its load, and the delegate keeps the pack's hooks, so a
    LoRA on it patches the quantized weights as on the original (the stock path would patch the raw codes)."""
    import comfy.model_management as mm
    patcher_mod = comfy[1].nodes.patcher
    path = prequant_files("int8")
    allow_dir(os.path.dirname(path))
    model = load_path(comfy, path)
    assert model.cached_patcher_init is not None
    lora = with_lora(comfy, model, "tiny_zimage_lora_delegate.safetensors", seed=14)
    base_out, lora_out = sample(model), sample(lora)
    mm.unload_all_models()
    for original, want in ((model, base_out), (lora, lora_out)):
        original.is_dynamic = lambda: True  # what ModelPatcherDynamic answers (a CPU never builds one)
        delegate = original.clone(disable_dynamic=True)
        del original.is_dynamic
        assert isinstance(delegate, patcher_mod.PrequantPatching) and not delegate.is_dynamic()
        assert delegate.model is not model.model, "a fresh copy from the file"
        assert torch.equal(sample(delegate), want)
        mm.unload_all_models()


def test_newer_comfyuis_patch_arguments_are_taken_and_a_save_of_a_patched_model_is_refused(comfy, prequant_files,
                                                                                         allow_dir, models_dir):
    """DynamicVRAM's pre-load calls ``patch_weight_to_device(key, force_cast=True)`` and a model save
    ``return_weight=True``: the pack's patcher took neither (TypeError). A forced cast of a LoRA-patched quantized
    weight patches it as the merge does; a save would write patched codes beside unpatched scales, so it is refused."""
    import comfy.model_management as mm
    from prequant_core.errors import UnsupportedFormatError
    path = prequant_files("int8")
    allow_dir(os.path.dirname(path))
    model = load_path(comfy, path)
    lora = with_lora(comfy, model, "tiny_zimage_lora_kwargs.safetensors", seed=15)
    key = "diffusion_model.layers.0.attention.qkv.weight"
    assert key in lora.patches
    with pytest.raises(UnsupportedFormatError) as e:
        lora.patch_weight_to_device(key, device_to=torch.device("cpu"), return_weight=True)
    assert "LoRA" in e.value.message
    op = lora.model.diffusion_model.layers[0].attention.qkv
    before = op.weight.detach().clone()
    with torch.inference_mode():
        lora.patch_weight_to_device(key, device_to=torch.device("cpu"), force_cast=True)
    assert not torch.equal(op.weight, before), "the forced cast applied the LoRA"
    lora.unpatch_model()
    assert torch.equal(op.weight, before), "and unpatching restores the codes"
    mm.unload_all_models()
