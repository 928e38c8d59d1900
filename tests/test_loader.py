"""Load Prequant Transformer on the real ComfyUI (headless): bit-identity, sizes, memory management, LoRA."""
from __future__ import annotations

import os

import pytest
import torch

from conftest import BASE_ID, sample
from prequant_core import families, schemes
from prequant_core.schemes import quantize

NONE = "(none: use path or hub_repo)"


def load_node(comfy):
    nodes, _ = comfy
    return nodes.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]()


def load_path(comfy, path, **kw):
    with torch.inference_mode():  # as ComfyUI runs every node
        return load_node(comfy).load(NONE, path=str(path), **kw)["result"][0]


def load_time_reference(comfy, dense, scheme):
    """The same dense weights quantized in memory at load time (no file), through the same ComfyUI model path."""
    _, pack = comfy
    fam = families.get("z-image")
    q, _ = quantize.quantize_tensors(dense, scheme, exclude=schemes.exclude_tokens(scheme))
    return pack.nodes.comfy_model.build_patcher(fam, "diffusers", q, {})


@pytest.fixture(scope="module")
def dense_out(comfy, zimage_dense):
    _, pack = comfy
    m = pack.nodes.comfy_model.build_patcher(families.get("z-image"), "diffusers", dict(zimage_dense), {})
    return sample(m)


@pytest.mark.parametrize("scheme", ["int8", "fp8"])
@pytest.mark.parametrize("layout", ["diffusers", "comfyui"])
@pytest.mark.parametrize("container", ["safetensors", "pt"])
def test_prequant_equals_load_time_quantization(comfy, zimage_dense, prequant_files, allow_dir, dense_out,
                                                scheme, layout, container):
    path = prequant_files(scheme, container, layout)
    allow_dir(os.path.dirname(path))
    model = load_path(comfy, path, base_model_id=BASE_ID, scheme=scheme)
    out = sample(model)
    ref = sample(load_time_reference(comfy, zimage_dense, scheme))
    assert torch.isfinite(out).all()
    assert (out - ref).abs().max().item() == 0.0, "pre-quantized output must equal load-time quantization bit for bit"
    rel = ((out - dense_out).norm() / dense_out.norm()).item()
    print(f"\n[{scheme}/{layout}/{container}] relative error vs dense bf16: {rel:.4f}")
    assert 0 < rel < 0.1, f"output drifted from the dense model: {rel}"


def test_model_reports_real_bytes(comfy, prequant_files, allow_dir, zimage_dense):
    path = prequant_files("int8")
    allow_dir(os.path.dirname(path))
    model = load_path(comfy, path)
    dense_bytes = sum(v.numel() * v.element_size() for v in zimage_dense.values())
    size = model.model_size()
    # int8 codes + fp32 row scales for the quantized layers, bf16 for the rest: well under the dense size
    assert size < 0.6 * dense_bytes, (size, dense_bytes)
    from prequant_core import formats
    assert abs(size - formats.read(path).nbytes()) < 0.01 * size


def test_meta_skeleton_is_fully_real_and_quantized(comfy, prequant_files, allow_dir):
    path = prequant_files("fp8")
    allow_dir(os.path.dirname(path))
    dm = load_path(comfy, path).model.diffusion_model
    tensors = list(dm.named_parameters()) + list(dm.named_buffers())
    assert tensors and not [n for n, t in tensors if t.is_meta]
    qkv = dm.layers[0].attention.qkv
    assert qkv.weight.dtype == torch.float8_e4m3fn and qkv.weight_scale.shape == (qkv.weight.shape[0], 1)


def test_sample_free_sample_again(comfy, prequant_files, allow_dir):
    import comfy.model_management as mm
    path = prequant_files("int8")
    allow_dir(os.path.dirname(path))
    model = load_path(comfy, path)
    first = sample(model)
    mm.unload_all_models()
    mm.soft_empty_cache()
    with torch.inference_mode(False):  # /free arrives outside inference mode
        mm.unload_all_models()
    again = sample(model)
    assert torch.equal(first, again)


def test_low_vram_partial_load_matches_full_load(comfy, prequant_files, allow_dir):
    import comfy.model_management as mm
    path = prequant_files("int8")
    allow_dir(os.path.dirname(path))
    full = sample(load_path(comfy, path))
    model = load_path(comfy, path)
    mm.unload_all_models()
    with torch.inference_mode():
        model.load(model.load_device, lowvram_model_memory=1, force_patch_weights=False, full_load=False)
    casted = [n for n, m in model.model.diffusion_model.named_modules() if getattr(m, "comfy_cast_weights", False)]
    assert casted, "the partial load should leave modules on the streaming (cast) path"
    low = sample(model)
    assert torch.equal(full, low)


def _make_lora(model, path, rank=4, seed=3):
    """A real LoRA file in the diffusion_model.* key form ComfyUI's LoRA loader understands."""
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for name in ("layers.0.attention.qkv", "layers.0.feed_forward.w1", "cap_embedder.1"):
        w = model.model.diffusion_model.get_submodule(name).weight
        out_f, in_f = w.shape
        sd[f"diffusion_model.{name}.lora_up.weight"] = (torch.randn(out_f, rank, generator=g) * 0.05).to(torch.bfloat16)
        sd[f"diffusion_model.{name}.lora_down.weight"] = (torch.randn(rank, in_f, generator=g) * 0.05).to(torch.bfloat16)
        sd[f"diffusion_model.{name}.alpha"] = torch.tensor(float(rank))
    save_file(sd, path)


def test_stock_lora_loader_on_quantized_weights(comfy, prequant_files, allow_dir, models_dir):
    import comfy.model_management as mm
    import folder_paths
    nodes, _ = comfy
    path = prequant_files("int8")
    allow_dir(os.path.dirname(path))
    model = load_path(comfy, path)
    base = sample(model)
    dm = model.model.diffusion_model
    qkv = dm.layers[0].attention.qkv
    orig_w, orig_s = qkv.weight.detach().clone(), qkv.weight_scale.detach().clone()

    lora_dir = folder_paths.get_folder_paths("loras")[0]
    os.makedirs(lora_dir, exist_ok=True)
    _make_lora(model, os.path.join(lora_dir, "tiny_zimage_lora.safetensors"))
    loader = nodes.NODE_CLASS_MAPPINGS["LoraLoaderModelOnly"]()
    with torch.inference_mode():
        lora_model = loader.load_lora_model_only(model, "tiny_zimage_lora.safetensors", 1.0)[0]
        zero_model = loader.load_lora_model_only(model, "tiny_zimage_lora.safetensors", 0.0)[0]
    patched = [k for k in lora_model.patches if "qkv" in k]
    assert patched, "the LoRA keys must map onto the quantized model's weights"

    with_lora = sample(lora_model)
    assert not torch.equal(with_lora, base), "the LoRA must change the output"
    assert torch.isfinite(with_lora).all()
    assert torch.equal(sample(zero_model), base), "strength 0 must reproduce the no-LoRA output exactly"

    mm.unload_all_models()
    assert torch.equal(qkv.weight, orig_w) and torch.equal(dm.layers[0].attention.qkv.weight_scale, orig_s), \
        "unpatching must restore the quantized codes and scales exactly"
    assert torch.equal(sample(model), base)


def test_a_lora_gives_back_the_original_weights_pages_and_unpatches_exactly(comfy, prequant_files, allow_dir,
                                                                            monkeypatch):
    """The originals of the patched layers live on only in the backup: where they are the mapped checkpoint's own
    pages (a `.pt`, read with mmap) those pages leave memory while the LoRA is on (issue 38: the peak with a LoRA),
    and unpatching reads them back from the file byte for byte."""
    import comfy.model_management as mm
    import folder_paths
    from prequant_core.families import pages
    nodes, _ = comfy
    path = prequant_files("int8", "pt")
    allow_dir(os.path.dirname(path))
    model = load_path(comfy, path)
    base = sample(model)
    ff = model.model.diffusion_model.layers[0].feed_forward.w1
    orig = ff.weight.detach().clone()
    freed = []
    real = pages.release
    monkeypatch.setattr(pages, "release", lambda ts: freed.append(real(ts)) or freed[-1])
    lora_dir = folder_paths.get_folder_paths("loras")[0]
    os.makedirs(lora_dir, exist_ok=True)
    _make_lora(model, os.path.join(lora_dir, "tiny_zimage_lora_pages.safetensors"))
    with torch.inference_mode():
        lora_model = nodes.NODE_CLASS_MAPPINGS["LoraLoaderModelOnly"]().load_lora_model_only(
            model, "tiny_zimage_lora_pages.safetensors", 1.0)[0]
    with_lora = sample(lora_model)
    assert not torch.equal(with_lora, base)
    # the LoRA's three layers: qkv (fused from q, k, v at load: anonymous, kept), w1 and cap_embedder.1 (the file's
    # own pages, given back)
    assert len(freed) == 3 and sorted(freed)[0] == 0 and sorted(freed)[1] > 0, freed
    mm.unload_all_models()
    assert torch.equal(model.model.diffusion_model.layers[0].feed_forward.w1.weight, orig)
    assert torch.equal(sample(model), base)
    assert torch.equal(sample(lora_model), with_lora), "patching again from the re-read pages: the same output"
