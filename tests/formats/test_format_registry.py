"""The container registry: a read-only container added as one module plus one registry line is read by the loader's
reader, described by Prequant Info, sized by the memory guard and validated like the others, while the builder
(which writes only writable containers) does not offer it. Runs in the core tier (no ComfyUI)."""
from __future__ import annotations

import torch

from prequant_core import builder, formats, report, schemes
from prequant_core.load import memory_check, metadata
from prequant_core.formats import containers
from toy import toy_container


def _tiny_int8():
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(64, 64, generator=g) / 8).to(torch.bfloat16)
    return {"blk.proj.weight": schemes.quantize_weight(w, "int8"), "blk.norm.weight": torch.ones(1, 64)}


def test_every_container_record_is_complete_and_names_are_unique():
    cs = containers.containers()
    assert [c.name for c in cs] == ["pt", "safetensors"]
    assert len({c.name for c in cs}) == len(cs) and all(c.extensions and c.extension.startswith(".") for c in cs)
    assert set(builder.CONTAINERS) == {c.name for c in containers.writable()}
    assert builder.EXTENSIONS == {"pt": ".pt", "safetensors": ".safetensors"}


def test_a_new_read_only_container_is_one_module_and_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(containers, "_MODULES", (*containers._MODULES, "toy.toy_container"))
    tensors = _tiny_int8()
    meta = {"scheme": "int8", "base_model_id": "x/Toy", "exclude_name_tokens": schemes.exclude_tokens("int8")}
    path = tmp_path / "Toy-INT8.toy"
    toy_container.write_toy(str(path), tensors, meta, "unsloth_prequant_transformer_state_dict_v1")

    assert formats.sniff(str(path)) == "toy" and ".toy" in containers.extensions()
    ck = formats.read(str(path))
    assert ck.container == "toy" and torch.equal(ck.tensors["blk.proj.weight"].dequantize(),
                                                 tensors["blk.proj.weight"].dequantize())
    assert metadata.validate(ck, metadata.Request(scheme="int8", base_model_id="x/Toy")).ok
    assert memory_check.declared_bytes(str(path)) == 64 * 64 + 64 * 4 + 64 * 2
    r = report.info(str(path))
    assert r.container == "toy" and r.read_mode == containers.READ_FULL and r.quantized_count == 1 and r.valid
    # read-only: never offered as a build output
    assert "toy" not in [c.name for c in containers.writable()]


def test_a_file_no_container_recognises_names_every_container(tmp_path):
    p = tmp_path / "x.bin"
    p.write_bytes(b"<html>not a checkpoint</html>")
    try:
        formats.read(str(p))
    except Exception as e:  # noqa: BLE001
        msg = str(e)
    assert "neither a torch.save archive nor a safetensors file" in msg and "x.bin" in msg
