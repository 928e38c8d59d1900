"""Dense inputs (prequant_core/formats/dense_sources.py) on real files: SafetensorsSource's header checks (a tensor in
two shards, no tensors, a file cut short while read), prefix stripping, diffusers folders (config.json and shard
index faults, folders without safetensors weights), file_source / open_dense refusals, RemappedSource's key-map
checks (fusion along another dim, rows past the tensor, unknown or failing row permutations) and open_input with a
Source, a family's own key-map function and a key-map callable that returns None. Core tier: no ComfyUI."""
from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch
from safetensors.torch import save_file

from prequant_core.errors import BuildError, CheckpointNotFoundError, CorruptCheckpointError, UnsupportedFormatError
from prequant_core.formats import dense_sources
from toy import toy_family

TOY = toy_family.FAMILIES[0]


def toy_diffusers(dim=8, in_ch=4) -> dict:
    g = torch.Generator().manual_seed(0)
    return {"toy_in.weight": torch.randn(dim, in_ch, generator=g),
            "toy_blocks.0.attn.to_q.weight": torch.randn(dim, dim, generator=g),
            "toy_blocks.0.attn.to_k.weight": torch.randn(dim, dim, generator=g),
            "toy_blocks.0.attn.to_v.weight": torch.randn(dim, dim, generator=g)}


def toy_comfy(d: dict) -> dict:
    qkv = torch.cat([d[f"toy_blocks.0.attn.to_{x}.weight"] for x in "qkv"])
    return {"toy_in.weight": d["toy_in.weight"], "toy_blocks.0.attn.qkv.weight": qkv}


def toy_key_map(dim: int) -> dict:
    return {"toy_in.weight": "toy_in.weight",
            **{f"toy_blocks.0.attn.to_{x}.weight": ("toy_blocks.0.attn.qkv.weight", (0, i * dim, dim))
               for i, x in enumerate("qkv")}}


def save(tensors: dict, path) -> str:
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    return str(path)


# ---- Source / MemorySource

def test_describe_names_the_path_or_a_state_dict(tmp_path):
    assert dense_sources.MemorySource({"a.weight": torch.ones(2, 2)}).describe() == "state dict"
    p = save({"a.weight": torch.ones(2, 2)}, tmp_path / "m.safetensors")
    assert dense_sources.SafetensorsSource([p]).describe() == p


def test_memory_source_skips_unused_names_unread():
    src = dense_sources.MemorySource({"a.weight": torch.ones(2, 2), "norm_final.weight": torch.ones(2)})
    src.unused = frozenset({"norm_final.weight"})
    assert [k for k, _ in src.items()] == ["a.weight"]


# ---- SafetensorsSource

def test_a_tensor_in_two_shards_is_refused(tmp_path):
    a = save({"x.weight": torch.ones(2, 2)}, tmp_path / "a.safetensors")
    b = save({"x.weight": torch.zeros(2, 2), "y.weight": torch.ones(2, 2)}, tmp_path / "b.safetensors")
    with pytest.raises(BuildError, match="appears in two weight files") as e:
        dense_sources.SafetensorsSource([a, b])
    assert a in e.value.found and b in e.value.found


def test_a_file_with_no_tensors_is_refused(tmp_path):
    p = save({}, tmp_path / "empty.safetensors")
    with pytest.raises(BuildError, match="holds no tensors"):
        dense_sources.SafetensorsSource([p])


def test_strip_prefix_keeps_only_the_prefixed_tensors(tmp_path):
    p = save({"model.diffusion_model.a.weight": torch.ones(2, 2), "vae.b.weight": torch.ones(2, 2)},
             tmp_path / "full.safetensors")
    src = dense_sources.SafetensorsSource([p])
    src.strip_prefix("model.diffusion_model.")
    assert list(src.infos()) == ["a.weight"]
    assert [k for k, _ in src.items()] == ["a.weight"]


def test_unused_names_are_skipped_and_a_file_cut_short_while_read_is_corrupt(tmp_path):
    p = save({"a.weight": torch.ones(4, 4), "b.weight": torch.full((64, 64), 2.0)}, tmp_path / "m.safetensors")
    src = dense_sources.SafetensorsSource([p])
    src.unused = frozenset({"a.weight"})
    got = dict(src.items())
    assert list(got) == ["b.weight"] and torch.equal(got["b.weight"], torch.full((64, 64), 2.0))
    # the header passed, then the file shrank: the read comes up short
    src.unused = frozenset()
    with open(p, "r+b") as f:
        f.truncate(os.path.getsize(p) - 100)
    with pytest.raises(CorruptCheckpointError, match="cut short") as e:
        list(src.items())
    assert e.value.found.endswith(f"of {64 * 64 * 4} bytes")


# ---- diffusers folders

def test_unreadable_or_non_object_config_json_is_refused(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(BuildError, match="config.json cannot be read") as e:
        dense_sources.open_input(tmp_path)
    assert "JSONDecodeError" in e.value.found
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(BuildError, match="not a JSON object"):
        dense_sources.open_input(tmp_path)


def test_a_folder_without_a_config_is_not_a_diffusers_model(tmp_path):
    save({"a.weight": torch.ones(2, 2)}, tmp_path / "m.safetensors")
    with pytest.raises(BuildError, match="not a diffusers model"):
        dense_sources.open_input(tmp_path)


def write_config(folder, cls="ToyDiTTransformer2DModel"):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"_class_name": cls}, f)


def test_shard_index_faults_are_refused(tmp_path):
    t = tmp_path / "transformer"
    write_config(t)
    index = t / dense_sources.INDEX_NAME
    index.write_text(json.dumps({"metadata": {}}))  # no weight_map
    with pytest.raises(BuildError, match="shard index cannot be read") as e:
        dense_sources.open_input(tmp_path)
    assert "KeyError" in e.value.found
    index.write_text(json.dumps({"weight_map": {"toy_in.weight": "shard-1.safetensors"}}))
    with pytest.raises(BuildError, match="shard named in the index is missing") as e:
        dense_sources.open_input(tmp_path)
    assert e.value.path == str(t / "shard-1.safetensors")
    # a shard outside the folder counts as missing, even when the file exists
    save({"toy_in.weight": torch.ones(2, 2)}, tmp_path / "outside.safetensors")
    index.write_text(json.dumps({"weight_map": {"toy_in.weight": "../outside.safetensors"}}))
    with pytest.raises(BuildError, match="missing"):
        dense_sources.open_input(tmp_path)


def test_a_folder_of_unsharded_safetensors_is_read_and_pickles_are_named(tmp_path):
    t = tmp_path / "transformer"
    write_config(t)
    (t / "diffusion_pytorch_model.bin").write_bytes(b"pickle")
    (t / "other.pt").write_bytes(b"pickle")
    with pytest.raises(BuildError, match="no .safetensors weights") as e:
        dense_sources.open_input(tmp_path)
    assert e.value.found == "diffusion_pytorch_model.bin, other.pt"
    os.remove(t / "diffusion_pytorch_model.bin")
    os.remove(t / "other.pt")
    with pytest.raises(BuildError, match="no .safetensors weights") as e:
        dense_sources.open_input(tmp_path)
    assert e.value.found == "no weight files"
    d = toy_diffusers()
    save(d, t / "diffusion_pytorch_model.safetensors")
    p = dense_sources.open_input(tmp_path, family=TOY)
    assert p.input_layout == "diffusers" and p.source.hints["transformer_class"] == "ToyDiTTransformer2DModel"
    assert set(p.source.infos()) == set(d)


# ---- single files

def test_a_torch_save_archive_is_not_a_dense_input(tmp_path):
    p = str(tmp_path / "model.safetensors")  # the name does not matter: the content is a torch.save archive
    torch.save({"a.weight": torch.ones(2, 2)}, p)
    with pytest.raises(BuildError, match="must be a .safetensors file") as e:
        dense_sources.open_input(p)
    assert e.value.found == "a torch.save archive"


def test_a_file_beside_a_config_gets_its_class_and_a_known_prefix_is_stripped(tmp_path):
    write_config(tmp_path)
    d = toy_diffusers()
    p = save({"model.diffusion_model." + k: v for k, v in d.items()}, tmp_path / "full.safetensors")
    src = dense_sources.file_source(p)
    assert src.hints == {"transformer_class": "ToyDiTTransformer2DModel"}
    assert set(src.infos()) == set(d)
    got = dict(src.items())
    assert all(torch.equal(got[k], d[k]) for k in d)


def test_open_dense_refuses_a_missing_file_and_a_pickle(tmp_path):
    with pytest.raises(CheckpointNotFoundError):
        dense_sources.open_dense(str(tmp_path / "nothing.safetensors"))
    p = tmp_path / "model.ckpt"
    torch.save({"a.weight": torch.ones(2, 2)}, str(p))
    with pytest.raises(UnsupportedFormatError, match="could run code"):
        dense_sources.open_dense(str(p))
    q = save({"a.weight": torch.ones(2, 2)}, tmp_path / "model.safetensors")
    assert list(dense_sources.open_dense(q).infos()) == ["a.weight"]


# ---- open_input

def test_open_input_refuses_quantized_names():
    with pytest.raises(BuildError, match="already quantized") as e:
        dense_sources.open_input({"blocks.0.weight_scale": torch.ones(2), "blocks.0.weight": torch.ones(2, 2)},
                                 family=TOY)
    assert "blocks.0.weight_scale" in e.value.found


def test_open_input_takes_a_source_as_it_is():
    d = toy_diffusers()
    src = dense_sources.MemorySource(d, path="given")
    p = dense_sources.open_input(src, family=TOY)
    assert p.source is src and p.input_layout == "diffusers" and p.family is TOY


def test_a_familys_own_key_map_function_converts_comfy_layout():
    dim = 8
    d = toy_diffusers(dim)
    seen = []

    def own_map(cfg):
        seen.append(cfg)
        return toy_key_map(cfg["dim"])

    fam = dataclasses.replace(TOY, arch=dataclasses.replace(TOY.arch, comfy_key_map=own_map))
    p = dense_sources.open_input(toy_comfy(d), family=fam)
    assert p.input_layout == "comfyui" and seen == [{"image_model": "toy", "dim": dim, "in_channels": 4, "depth": 1}]
    got = dict(p.source.items())
    assert set(got) == set(d) and all(torch.equal(got[k], d[k]) for k in d)


def test_a_key_map_callable_returning_none_means_the_same_names():
    d = toy_comfy(toy_diffusers())
    calls = []

    def provider(fam, shapes):
        calls.append((fam.name, dict(shapes)))
        return None

    p = dense_sources.open_input(d, family=TOY, key_map=provider)
    assert calls == [("toy-dit", {k: tuple(v.shape) for k, v in d.items()})]
    assert p.input_layout == "comfyui" and set(p.source.infos()) == set(d)


# ---- RemappedSource's checks on the key map

def test_a_fusion_along_columns_is_refused_as_a_build_error():
    src = dense_sources.MemorySource({"qkv.weight": torch.ones(6, 2)})
    with pytest.raises(BuildError, match="along dim 1"):
        dense_sources.RemappedSource(src, {"q.weight": ("qkv.weight", (1, 0, 1))})


def test_a_slice_past_the_tensors_rows_is_refused():
    src = dense_sources.MemorySource({"qkv.weight": torch.ones(6, 2)})
    with pytest.raises(BuildError, match="has 6 rows, the key map takes rows 4..8"):
        dense_sources.RemappedSource(src, {"q.weight": ("qkv.weight", (0, 0, 4)), "k.weight": ("qkv.weight", (0, 4, 4))})


def test_unknown_or_failing_row_permutations_are_refused():
    src = dense_sources.MemorySource({"mod.weight": torch.ones(4, 2)})
    with pytest.raises(BuildError, match="not a known row permutation"):
        dense_sources.RemappedSource(src, {"m.weight": ("mod.weight", None, "no_such_permutation")})

    def fails(t):
        raise RuntimeError("cannot")

    with pytest.raises(BuildError, match="not its own inverse"):
        dense_sources.RemappedSource(src, {"m.weight": ("mod.weight", None, fails)})


def test_a_family_comfyui_names_like_diffusers_needs_no_key_map():
    d = toy_comfy(toy_diffusers())
    p = dense_sources.open_input(d, family=TOY)  # the toy family's comfy_key_map is None: the names are kept
    assert p.input_layout == "comfyui" and p.source.plan == {k: [(k, None, None)] for k in d}
