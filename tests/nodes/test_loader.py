"""Load Prequant Transformer on the real ComfyUI (headless): bit-identity, sizes, memory management, LoRA."""
from __future__ import annotations

import os
import shutil

import pytest
import torch

from conftest import BASE_ID, NONE, load_path, low_vram, make_lora, sample, with_lora
from prequant_core import families, schemes
from prequant_core.schemes import quantize


def load_node(comfy):
    nodes, _ = comfy
    return nodes.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]()


def load_time_reference(comfy, dense, scheme):
    """The same dense weights quantized in memory at load time (no file), through the same ComfyUI model path."""
    _, pack = comfy
    fam = families.get("z-image")
    q, _ = quantize.quantize_tensors(dense, scheme, exclude=schemes.exclude_tokens(scheme))
    return pack.nodes.comfy_model.build_patcher(fam, "diffusers", q)


@pytest.fixture(scope="module")
def dense_out(comfy, zimage_dense):
    _, pack = comfy
    m = pack.nodes.comfy_model.build_patcher(families.get("z-image"), "diffusers", dict(zimage_dense))
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
    make_lora(model, os.path.join(lora_dir, "tiny_zimage_lora.safetensors"))
    loader = nodes.NODE_CLASS_MAPPINGS["LoraLoaderModelOnly"]()
    with torch.inference_mode():
        lora_model = loader.load_lora_model_only(model, "tiny_zimage_lora.safetensors", 1.0)[0]
        zero_model = loader.load_lora_model_only(model, "tiny_zimage_lora.safetensors", 0.0)[0]
    patched = [k for k in lora_model.patches if "qkv" in k]
    assert patched, "the LoRA keys must map onto the quantized model's weights"

    lora_out = sample(lora_model)
    assert not torch.equal(lora_out, base), "the LoRA must change the output"
    assert torch.isfinite(lora_out).all()
    assert torch.equal(sample(zero_model), base), "strength 0 must reproduce the no-LoRA output exactly"

    mm.unload_all_models()
    assert torch.equal(qkv.weight, orig_w) and torch.equal(dm.layers[0].attention.qkv.weight_scale, orig_s), \
        "unpatching must restore the quantized codes and scales exactly"
    assert torch.equal(sample(model), base)


def test_a_lora_keeps_no_original_the_file_holds_and_unpatches_exactly(comfy, prequant_files, allow_dir,
                                                                       monkeypatch):
    """The originals of the patched layers live on only in the backup, and where the mapped checkpoint holds them
    they are not kept in memory (issue 38: the peak with a LoRA): the file's own pages (w1, cap_embedder.1) are given
    back, and the fused qkv (copied from the file's to_q/to_k/to_v at load) is backed up as those rows of the file,
    rebuilt when ComfyUI reads the backup. Unpatching restores every byte; patching again gives the same output; a
    layer patched in blocks of 8 rows gives the very bytes of one block (nodes/lora_rows.py)."""
    import comfy.model_management as mm
    from prequant_core.families import pages
    nodes, pack = comfy
    lora_rows, patcher = pack.nodes.lora_rows, pack.nodes.patcher
    path = prequant_files("int8", "pt")
    allow_dir(os.path.dirname(path))
    model = load_path(comfy, path)
    base = sample(model)
    dm = model.model.diffusion_model
    orig = {n: dm.get_submodule(n).weight.detach().clone() for n in ("layers.0.feed_forward.w1", "layers.0.attention.qkv")}
    orig_scale = dm.layers[0].attention.qkv.weight_scale.detach().clone()
    assert len(dm.layers[0].attention.qkv.prequant_fused_from) == 3  # to_q, to_k, to_v of the mapped file
    freed = []
    real = pages.release
    monkeypatch.setattr(pages, "release", lambda ts, *a: freed.append(real(ts, *a)) or freed[-1])
    lora_model = with_lora(comfy, model, "tiny_zimage_lora_pages.safetensors")
    lora_out = sample(lora_model)
    assert not torch.equal(lora_out, base)
    backup = lora_model.backup
    for part in ("weight", "weight_scale"):
        assert isinstance(backup[f"diffusion_model.layers.0.attention.qkv.{part}"], patcher._RebuiltFromFile)
        assert isinstance(backup[f"diffusion_model.layers.0.feed_forward.w1.{part}"], patcher._Backup)
    assert sum(f > 0 for f in freed) >= 2, freed  # w1's and cap_embedder.1's pages (and the qkv rows' read back)
    assert torch.equal(backup["diffusion_model.layers.0.attention.qkv.weight"].weight, orig["layers.0.attention.qkv"])
    mm.unload_all_models()
    for n, w in orig.items():
        assert torch.equal(dm.get_submodule(n).weight, w), n
    assert torch.equal(dm.layers[0].attention.qkv.weight_scale, orig_scale)
    assert torch.equal(sample(model), base)
    assert torch.equal(sample(lora_model), lora_out), "patching again from the re-read pages: the same output"
    mm.unload_all_models()
    monkeypatch.setattr(lora_rows, "rows_per_block", lambda columns: 8)  # the tiny layers' 64-192 rows in many blocks
    assert len(lora_rows.blocks(lora_model.patches["diffusion_model.layers.0.attention.qkv.weight"],
                                dm.layers[0].attention.qkv.weight.shape[0], lora_rows.rows_per_block(64))) > 2
    assert torch.equal(sample(lora_model), lora_out), "patched in blocks of rows: the same bytes"
    mm.unload_all_models()
    assert torch.equal(dm.layers[0].attention.qkv.weight, orig["layers.0.attention.qkv"])


def _rewrite_to_q_scales_in_place(path):
    """A same-size rewrite in place of layer 0's to_q scales (NaN), the file's length and mtime kept."""
    import json
    import struct
    st = os.stat(path)
    with open(path, "r+b") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        entry = json.loads(f.read(n))["layers.0.attention.to_q._weight_scale"]
        a, b = entry["data_offsets"]
        f.seek(8 + n + a)
        f.write(struct.pack("<f", float("nan")) * ((b - a) // 4))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    return 8 + n + a


@pytest.mark.parametrize("change", ["rewritten", "truncated"])
def test_a_file_changed_under_a_loras_backup_drops_the_model_and_unpatch_never_raises(comfy, prequant_files,
                                                                                      allow_dir, tmp_path, caplog,
                                                                                      change):
    """Round 5: the fused qkv's backup is the file's own to_q / to_k / to_v rows, re-read at unpatch; a file
    rewritten in place between patch and unpatch (same size, NaN scales) was restored unchecked, and the model gave
    NaN after the LoRA was removed. Round 6: refusing by raising out of ComfyUI's unpatch left the model half
    unpatched and, from the prompt worker's unload, stopped the worker; a truncated file ended the process (SIGBUS)
    when the unpatch touched its vanished pages. Now the unpatch completes, the layer refuses to run (typed, naming the
    file), the loader's IS_CHANGED moves so ComfyUI loads the file again, and the log says so once."""
    import logging
    import comfy.model_management as mm
    from prequant_core.errors import CorruptCheckpointError
    nodes, pack = comfy
    path = str(tmp_path / "Z-Image-Turbo-INT8.safetensors")
    shutil.copy(prequant_files("int8", "safetensors"), path)
    allow_dir(tmp_path)
    model = load_path(comfy, path)
    qkv = model.model.diffusion_model.layers[0].attention.qkv
    assert len(qkv.prequant_fused_from) == 3
    lora_model = with_lora(comfy, model, f"tiny_zimage_lora_{change}.safetensors")
    sample(lora_model)  # the LoRA is applied: the qkv backup is the file's rows
    loader = nodes.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]
    before = loader.IS_CHANGED(NONE, path=path)
    if change == "rewritten":
        _rewrite_to_q_scales_in_place(path)
    else:  # cut off before layer 0's to_q rows: touching their pages would be SIGBUS
        import json
        import struct
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            off = min(e["data_offsets"][0] for k, e in json.loads(f.read(n)).items()
                      if k.startswith("layers.0.attention.to_"))
        os.truncate(path, 8 + n + off)
    with caplog.at_level(logging.WARNING, logger="prequant"):
        mm.unload_all_models()  # raised CorruptCheckpointError out of ComfyUI's unpatch (round 5's fix)
        mm.unload_all_models()
    assert not lora_model.backup, "the unpatch completed: no backup left behind for every later load to trip on"
    told = [r.getMessage() for r in caplog.records if "changed on disk" in r.getMessage()]
    assert len(told) == 1 and path in told[0] and "loads the file again" in told[0], told
    assert qkv.prequant_stale == path
    assert loader.IS_CHANGED(NONE, path=path) != before, "ComfyUI must run the loader again, not reuse the model"
    if change == "rewritten":  # (a truncated file's other mapped layers would fault before the stale one runs)
        with pytest.raises(CorruptCheckpointError) as e:
            sample(model)
        assert e.value.path == path and "changed on disk" in e.value.message
        assert "Queue the prompt again" in e.value.fix


def test_a_lora_in_low_vram_mode_gives_the_merged_output(comfy, prequant_files, allow_dir, models_dir, monkeypatch):
    """Low-VRAM mode applies a LoRA per call (ComfyUI's weight_function): the pack runs ComfyUI's LowVramPatch
    through the same row blocks as the merge, so each call computes the very codes the merged LoRA stores and the
    sampled latent equals the full load's bit for bit (issue 38), with nothing merged into the weights."""
    import comfy.model_management as mm
    nodes, pack = comfy
    path = prequant_files("int8")
    allow_dir(os.path.dirname(path))
    model = load_path(comfy, path)
    lora_model = with_lora(comfy, model, "tiny_zimage_lora_lowvram.safetensors", seed=11)
    merged = sample(lora_model)
    mm.unload_all_models()
    dm = model.model.diffusion_model
    codes = dm.layers[0].attention.qkv.weight.detach().clone()
    per_call = []
    real = pack.nodes.lora_rows.patched_parts
    monkeypatch.setattr(pack.nodes.lora_rows, "patched_parts",
                        lambda *a, **k: per_call.append(k.get("give_back_pages", True)) or real(*a, **k))
    streamed = sample(low_vram(lora_model))
    assert per_call and not any(per_call), "every patch ran per call (low-VRAM), none was merged"
    assert torch.equal(dm.layers[0].attention.qkv.weight, codes), "the stored codes stay the file's"
    assert torch.equal(streamed, merged)
    mm.unload_all_models()

