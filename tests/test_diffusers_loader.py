"""The diffusers-side loader (prequant_core.diffusers_loader): for every registered family, a file written by this
pack's builder loads strictly into the family's real diffusers class and its output equals torchao quantizing the
same dense model at load time (max abs diff 0 on CPU); plus the source chain (allowlist, Hub fallback names, excluded
bases) and typed errors.

Families whose diffusers class needs diffusers >= 0.41 (Krea 2, Qwen-Image 2.1) run in a subprocess with the real
diffusers 0.42.1 first on the path (.cache/diffusers042, installed by scripts/setup_test_extras.sh): the pinned
environment keeps diffusers 0.38.0 because 0.41+ requires huggingface_hub >= 1.32, which transformers 4.57 (and so
ComfyUI 0.3.75's text encoders here) refuses (see README, "diffusers loader").
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from prequant_core import builder, diffusers_loader, families, formats
from prequant_core.errors import (CheckpointNotFoundError, CorruptCheckpointError, PathNotAllowedError,
                                  UnknownFamilyError, UnsupportedFormatError, ValidationError)
from tools import diffusers_check, tiny_families as tf

HERE = ["z-image", *tf.TINY]  # classes in the pinned diffusers 0.38.0
NEWER = list(tf.DIFFUSERS_ONLY)  # classes in diffusers 0.42.1 only
DIFFUSERS042 = os.path.join(ROOT, ".cache", "diffusers042")


def test_every_family_is_covered():
    assert set(HERE) | set(NEWER) == set(families.FAMILIES)


def _assert_identical(r: dict):
    print(f"\n[{r['family']}/{r['scheme']}/{r['container']}] diffusers {r['diffusers']} {r['class']}: "
          f"{r['quantized']} quantized Linears ({', '.join(r['qtypes'])}); max |file - load-time ({r['reference']})| "
          f"= {r['max_abs_diff']}; relative error vs dense bf16 = {r['rel_vs_dense']:.4f}")
    assert r["max_abs_diff"] == 0.0, "the pre-quantized file must equal quantizing at load time bit for bit"
    assert r["finite"] and 0 < r["rel_vs_dense"] < 0.1
    assert r["quantized"] >= 4 and r["qtypes"] == (["Int8Tensor"] if r["scheme"] == "int8" else ["Float8Tensor"])
    assert r["training"] is False and r["meta_buffers"] == []
    if r["scheme"] == "fp8":
        assert r["kernels"] == ["KernelPreference.TORCH"]


@pytest.mark.parametrize("scheme", ["int8", "fp8"])
@pytest.mark.parametrize("family", ["z-image", "qwen-image", "hunyuanvideo-1.5"])  # every family, Unsloth-made files:
def test_builder_file_loads_into_the_diffusers_class_equal_to_load_time_quantization(tmp_path, family, scheme):
    """This pack's own builder output (every family's Unsloth-made files: tests/families/test_unsloth_conformance.py)."""
    _assert_identical(diffusers_check.check(family, scheme, "safetensors", str(tmp_path)))


@pytest.mark.parametrize("scheme", ["int8", "fp8"])
def test_pt_container_too(tmp_path, scheme):
    _assert_identical(diffusers_check.check("qwen-image", scheme, "pt", str(tmp_path)))


def _newer_diffusers(args, tmp_path):
    if not os.path.isfile(os.path.join(DIFFUSERS042, "diffusers", "__init__.py")):
        pytest.fail("diffusers 0.42.1 is missing at .cache/diffusers042: run scripts/setup_test_extras.sh diffusers042")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([DIFFUSERS042, ROOT]))
    p = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout.strip().splitlines()[-1]


# each newer family in both schemes and both containers, over four subprocess runs (each ~20 s on 2 cores)
@pytest.mark.parametrize("family,scheme,container", [(f, s, c) for i, f in enumerate(NEWER)
                                                     for s, c in (("int8", ("safetensors", "pt")[i % 2]),
                                                                  ("fp8", ("pt", "safetensors")[i % 2]))])
def test_newer_families_load_into_diffusers_042_classes(tmp_path, family, scheme, container):
    r = json.loads(_newer_diffusers(["-m", "tools.diffusers_check", family, scheme, container, str(tmp_path)],
                                    tmp_path))
    assert r["diffusers"] == "0.42.1" and r["class"] == families.get(family).arch.diffusers_class
    _assert_identical(r)
    if family == "qwen-image-2.1":  # a non-persistent buffer the file does not hold, computed by the class
        assert r["non_persistent_buffers"] == ["time_text_embed.time_proj.freqs"]


# --- source chain and typed errors ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def flux_files(tmp_path_factory):
    """Tiny FLUX.1-dev files (int8 .safetensors and .pt, ComfyUI-layout int8) and a local base folder."""
    d = tmp_path_factory.mktemp("dl_flux")
    dense = tf.dense("flux.1")
    fam = families.get("flux.1")
    out = {"dir": str(d)}
    for name, container in (("st", "safetensors"), ("pt", "pt")):
        out[name] = str(d / f"FLUX.1-dev-INT8.{container}")
        builder.build_from_tensors(dense, builder.Target(out[name], container=container),
                                   builder.Recipe("int8", family=fam, base_model_id="black-forest-labs/FLUX.1-dev"))
    base = d / "FLUX.1-dev"
    tf.diffusers_model("flux.1").save_config(str(base / "transformer"))
    out["base"] = str(base)
    other = d / "FLUX.1-dev-2-layers"
    tf.diffusers_model("flux.1", num_layers=2).save_config(str(other / "transformer"))
    out["other_base"] = str(other)
    return out


def test_local_file_outside_the_allowlist_is_refused(flux_files, monkeypatch):
    for var in ("PREQUANT_ALLOW_LOCAL_PATH", "UNSLOTH_ALLOW_LOCAL_PREQUANT_PATH"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(PathNotAllowedError):
        diffusers_loader.load("FluxTransformer2DModel", flux_files["base"], flux_files["st"], scheme="int8")
    monkeypatch.setenv("UNSLOTH_ALLOW_LOCAL_PREQUANT_PATH", flux_files["dir"])  # Unsloth's variable works too
    m = diffusers_loader.load_transformer("FluxTransformer2DModel", flux_files["base"], flux_files["st"], scheme="int8")
    assert type(m).__name__ == "FluxTransformer2DModel" and not m.training


def test_validation_is_the_nodes(flux_files):
    with pytest.raises(ValidationError) as e:
        diffusers_loader.load("FluxTransformer2DModel", flux_files["base"], flux_files["st"], scheme="fp8",
                              base_model_id="black-forest-labs/FLUX.1-schnell", allow_dirs=[flux_files["dir"]])
    msg = str(e.value)
    assert "requested 'fp8'" in msg and "FLUX.1-schnell" in msg and "FLUX.1-dev-INT8.safetensors" in msg
    # a Windows folder as base: compared by its last part, as Unsloth does
    r = diffusers_loader.load("FluxTransformer2DModel", flux_files["base"], flux_files["pt"], scheme="int8",
                              base_model_id="C:\\models\\FLUX.1-dev\\", allow_dirs=[flux_files["dir"]])
    assert r.family == "flux.1" and r.scheme == "int8"


def test_file_for_another_size_is_a_typed_error(flux_files):
    with pytest.raises(CorruptCheckpointError) as e:
        diffusers_loader.load("FluxTransformer2DModel", flux_files["other_base"], flux_files["st"],
                              base_model_id="black-forest-labs/FLUX.1-dev", allow_dirs=[flux_files["dir"]])
    assert "do not fit FluxTransformer2DModel" in str(e.value) and "transformer_blocks.1" in str(e.value)


def test_wrong_class_and_missing_config_are_typed_errors(flux_files, tmp_path):
    with pytest.raises(UnknownFamilyError) as e:
        diffusers_loader.load("QwenImageTransformer2DModel", flux_files["base"], flux_files["st"],
                              base_model_id="black-forest-labs/FLUX.1-dev", allow_dirs=[flux_files["dir"]])
    assert "FluxTransformer2DModel" in str(e.value)
    with pytest.raises(UnsupportedFormatError):
        diffusers_loader.load("NoSuchTransformer2DModel", flux_files["base"], flux_files["st"])
    with pytest.raises(CheckpointNotFoundError) as e:
        diffusers_loader.load("FluxTransformer2DModel", str(tmp_path), flux_files["st"],
                              base_model_id="black-forest-labs/FLUX.1-dev", allow_dirs=[flux_files["dir"]])
    assert "config.json" in str(e.value)


def test_comfyui_layout_file_is_refused(comfy, prequant_files, tmp_path):
    """A file in ComfyUI's key layout (fused qkv) cannot fill a diffusers class: a typed refusal, not a strict-load
    traceback."""
    path = prequant_files("int8", "safetensors", "comfyui")
    assert families.get("z-image").layout_of(formats.read(path).tensors) == "comfyui"
    base = tmp_path / "Z-Image-Turbo"
    tf.any_diffusers_model("z-image").save_config(str(base / "transformer"))
    with pytest.raises(UnsupportedFormatError) as e:
        diffusers_loader.load("ZImageTransformer2DModel", str(base), path, allow_dirs=[os.path.dirname(path)])
    assert "ComfyUI's key names" in str(e.value) and os.path.basename(path) in str(e.value)


def test_hub_fallback_chain_into_the_diffusers_class(hub, hf_env, flux_files, monkeypatch):  # noqa: F811
    """No source: the family's hosted repo for the base's variant, the same names in the same order as the node."""
    monkeypatch.setenv("UNSLOTH_DIFFUSION_PREQUANT_COMFY", "0")  # the artifact chain alone; twins: test_comfy_twins.py
    hub.commit("unsloth/FLUX.1-dev-FP8", {"transformer_int8.pt": flux_files["pt"]})
    r = diffusers_loader.load("FluxTransformer2DModel", flux_files["base"], None, scheme="int8",
                              base_model_id="black-forest-labs/FLUX.1-dev")
    assert r.source == "hub:unsloth/FLUX.1-dev-FP8@main/transformer_int8.pt"
    assert [x["filename"] for x in hub.log if x.get("filename")][:2] == ["FLUX.1-dev-INT8.safetensors",
                                                                       "FLUX.1-dev-INT8.pt"]
    assert type(r.model).__name__ == "FluxTransformer2DModel"
    # an explicit repo id as source goes the same way
    r2 = diffusers_loader.load("FluxTransformer2DModel", flux_files["base"], "unsloth/FLUX.1-dev-FP8", scheme="int8",
                               base_model_id="black-forest-labs/FLUX.1-dev")
    assert r2.source == r.source and r2.path == r.path


def test_excluded_base_gets_no_hosted_file(tmp_path):
    base = tmp_path / "Z-Image"
    tf.any_diffusers_model("z-image").save_config(str(base / "transformer"))
    with pytest.raises(CheckpointNotFoundError) as e:
        diffusers_loader.load("ZImageTransformer2DModel", str(base), None, scheme="fp8",
                              base_model_id="Tongyi-MAI/Z-Image")
    assert "excluded" in str(e.value) and "tongyi-mai/z-image" in str(e.value)


def test_comfyui_path_never_imports_diffusers_or_accelerate():
    """The nodes and the core modules they use import neither optional extra."""
    code = ("import sys; sys.path.insert(0, '.');"
            "import prequant_core.load.opening, prequant_core.hub.fetch, prequant_core.load.sources, prequant_core.load.route, "
            "prequant_core.report, prequant_core.builder, prequant_core.load.metadata, prequant_core.families, "
            "prequant_core.load.locate, prequant_core.text_encoders.checks, prequant_core.text_encoders.sources;"
            "bad = [m for m in ('diffusers', 'accelerate') if m in sys.modules]; print(bad); assert not bad")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr[-2000:]
    nodes_src = "".join(open(os.path.join(ROOT, "nodes", f)).read() for f in os.listdir(os.path.join(ROOT, "nodes"))
                        if f.endswith(".py"))
    # an import of either package, in any form (a name such as diffusers_to_comfy is not one)
    assert "diffusers_loader" not in nodes_src and \
        not re.search(r"^\s*(import|from)\s+(diffusers|accelerate)\b", nodes_src, re.M)
    assert "accelerate" not in nodes_src


def test_missing_extra_is_a_typed_error_naming_the_fix():
    """Without accelerate (made unimportable in a fresh interpreter) the loader says what to install."""
    code = ("import sys; sys.path.insert(0, '.'); sys.modules['accelerate'] = None\n"
            "from prequant_core import diffusers_loader\n"
            "from prequant_core.errors import DependencyError\n"
            "try:\n"
            "    diffusers_loader.load('FluxTransformer2DModel', '/nonexistent', '/nonexistent.safetensors')\n"
            "except DependencyError as e:\n"
            "    print('DEPENDENCY', type(e).__name__, '|', str(e).replace(chr(10), ' '))\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else p.stderr[-2000:]
    assert out.startswith("DEPENDENCY DependencyError |"), out
    assert "'accelerate'" in out and "requirements-diffusers.txt" in out


def test_nvfp4_file_dequantizes_at_matmul_in_the_diffusers_class(tmp_path):
    """The CPU has no NVFP4 kernels: each NVFP4 Linear computes with its weight dequantized exactly as torchao
    dequantizes it, i.e. the dense model whose Linear weights are those dequantized weights."""
    family = "qwen-image"
    fam = families.get(family)
    base_id = diffusers_check.base_model_id(family)
    base_dir = tmp_path / "bases" / base_id.rsplit("/", 1)[-1]
    tf.any_diffusers_model(family).save_config(str(base_dir / "transformer"))
    dense = {k: v.to(torch.bfloat16).contiguous() for k, v in tf.any_diffusers_model(family).state_dict().items()}
    path = str(tmp_path / "Qwen-Image-NVFP4.pt")
    builder.build_from_tensors(dense, builder.Target(path, container="pt"),
                               builder.Recipe("nvfp4", family=fam, base_model_id=base_id))
    loaded = diffusers_loader.load(fam.arch.diffusers_class, str(base_dir), path, scheme="nvfp4", allow_dirs=[tmp_path])
    assert any("dequantize at matmul" in n for n in loaded.notes), loaded.notes
    q = formats.read(path).tensors
    ref = diffusers_check.dense_load(family)
    ref.load_state_dict({k: (v.dequantize(torch.bfloat16) if hasattr(v, "qdata") else v) for k, v in q.items()},
                        assign=True)
    with torch.no_grad():
        got, want = tf.diffusers_forward(family, loaded.model), tf.diffusers_forward(family, ref.eval())
    assert torch.isfinite(got).all() and torch.equal(got, want)
