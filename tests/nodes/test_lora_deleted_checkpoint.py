"""A checkpoint deleted while its model is loaded (issue 61: node lines no test ran): deleting a file keeps its memory
mapping whole (the inode lives on while mapped), unlike truncating it. The fused qkv of a LoRA'd layer is backed up as
the file's own to_q / to_k / to_v rows (nodes/patcher.py); with the file deleted before the LoRA is applied, or between
patch and unpatch, those rows still hold the same bytes, so the unpatch restores the layer exactly and the model is
not dropped as changed (test_loader.py covers a file rewritten or truncated)."""
from __future__ import annotations

import os
import shutil

import pytest
import torch

from conftest import NONE, load_path, sample, with_lora

QKV = "diffusion_model.layers.0.attention.qkv"


@pytest.mark.parametrize("when", ["before_patch", "before_unpatch"])
def test_a_checkpoint_deleted_under_a_loaded_model_still_unpatches_exactly(comfy, prequant_files, allow_dir,
                                                                          tmp_path, caplog, when):
    import logging
    import comfy.model_management as mm
    nodes, pack = comfy
    patcher = pack.nodes.patcher
    path = str(tmp_path / "Z-Image-Turbo-INT8.safetensors")
    shutil.copy(prequant_files("int8", "safetensors"), path)
    allow_dir(tmp_path)
    model = load_path(comfy, path)
    base = sample(model)
    mm.unload_all_models()
    qkv = model.model.diffusion_model.layers[0].attention.qkv
    assert len(qkv.prequant_fused_from) == 3 and qkv.prequant_fused_file == path
    orig_w, orig_s = qkv.weight.detach().clone(), qkv.weight_scale.detach().clone()
    stale_before = patcher.stale_generation()
    if when == "before_patch":
        os.remove(path)
    lora_model = with_lora(comfy, model, f"tiny_zimage_lora_deleted_{when}.safetensors")
    lora_out = sample(lora_model)
    assert not torch.equal(lora_out, base), "the LoRA must change the output"
    backup = lora_model.backup[QKV + ".weight"]
    assert isinstance(backup, patcher._RebuiltFromFile), "the backup is the file's rows, not a copy"
    if when == "before_patch":
        assert backup.file is None, "no file to stat: no length to check against later"
    else:
        assert tuple(backup.file) == (path, *(lambda st: (st.st_dev, st.st_ino, st.st_size))(os.stat(path)))
        os.remove(path)
        assert not backup.file.truncated(), "a deleted file is not a shorter one: its mapping is whole"
    with caplog.at_level(logging.WARNING, logger="prequant"):
        mm.unload_all_models()
    assert not lora_model.backup
    assert torch.equal(qkv.weight, orig_w) and torch.equal(qkv.weight_scale, orig_s), "restored exactly"
    assert qkv.prequant_stale is None and patcher.stale_generation() == stale_before
    assert not [r for r in caplog.records if "changed on disk" in r.getMessage()]
    assert torch.equal(sample(model), base), "the model runs as loaded"
    assert torch.equal(sample(lora_model), lora_out), "patching again from the mapped rows: the same output"
    mm.unload_all_models()
    # the loader itself sees the file gone: IS_CHANGED names the path alone, so ComfyUI runs it again (and it fails)
    assert nodes.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"].IS_CHANGED(NONE, path=path) == path
