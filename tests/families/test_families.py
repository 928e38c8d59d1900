"""Every family beyond Z-Image on the real ComfyUI (headless): ComfyUI's own model class, our key map proven against
diffusers' forward, pre-quantized int8/fp8 files through the Load Prequant Transformer node bit-identical to
quantizing the same dense weights at load time, and close to the dense model.

Tiny real-architecture models (tools/tiny_families.py), 2 sampling steps on tiny latents.
"""
from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from conftest import dense_of

from prequant_core import builder, families, schemes
from prequant_core.families import keymap
from prequant_core.schemes import qtensor, quantize
from prequant_core.errors import ComfyVersionError, CorruptCheckpointError, UnknownFamilyError
from tools import tiny_families as tf, tiny_models

FAMILIES = list(tf.TINY)
SCHEMES = ("int8", "fp8")


def test_every_registered_family_has_a_tiny_model():
    """Adding a family means adding its tiny model and thereby these tests."""
    # z-image: tests/nodes/test_loader.py; DIFFUSERS_ONLY (no ComfyUI class here): tests/test_diffusers_loader.py
    assert set(FAMILIES) | set(tf.DIFFUSERS_ONLY) == set(families.FAMILIES) - {"z-image"}
    # a diffusers-only family is either not mapped into ComfyUI yet, or mapped with a record of its diffusers forward
    # to prove the map against (its class needs a diffusers newer than the pinned one: a subprocess makes the record)
    assert all((families.get(f).arch.unet_config is None) == (tf.DIFFUSERS_ONLY[f].record is None)
               for f in tf.DIFFUSERS_ONLY)
    assert all(families.get(f).arch.unet_config is not None for f in FAMILIES)


# ---------------------------------------------------------------------------------------------------------------
# Shared per-family state (built once per session)

_dense: dict = {}


def dense(family):
    if family not in _dense:
        _dense[family] = tf.dense(family, seed=0)
    return _dense[family]


def sample(model, family, steps=2, seed=0):
    return tf.sample(model, family, steps, seed)


@pytest.fixture(scope="module")
def prequant_dir(comfy):
    import folder_paths
    d = os.path.join(folder_paths.get_folder_paths("prequant")[0], "families")
    os.makedirs(d, exist_ok=True)
    return d


_files: dict = {}


def prequant_file(prequant_dir, family, scheme):
    """The tiny model built into a pre-quantized file named like the hosted one, under models/prequant."""
    key = (family, scheme)
    if key not in _files:
        t = tf.TINY[family]
        name = f"{t.file_stem}-{scheme.upper()}.safetensors"
        path = os.path.join(prequant_dir, name)
        builder.build_from_tensors(dense(family), builder.Target(path, overwrite=True),
                                   builder.Recipe(scheme, family=families.get(family), base_model_id=t.base_model_id))
        _files[key] = "families/" + name
    return _files[key]


def comfy_model(comfy):
    return comfy[1].nodes.comfy_model


_dense_out: dict = {}


def dense_out(comfy, family):
    if family not in _dense_out:
        m = comfy_model(comfy).build_patcher(families.get(family), "diffusers", dict(dense(family)))
        _dense_out[family] = sample(m, family)
    return _dense_out[family]


# ---------------------------------------------------------------------------------------------------------------
# The key map and config are right: ComfyUI's model with our converted weights computes what diffusers computes


def comfy_velocity(patcher, x, sigma, ctx, extra):
    """What ComfyUI's diffusion model predicts for latent ``x`` at ``sigma`` (via BaseModel.apply_model)."""
    m = patcher.model
    conds = m.extra_conds(cross_attn=ctx, noise=x, device=x.device, **extra)
    den = m.apply_model(x, torch.tensor([sigma]), **{k: v.cond for k, v in conds.items()})
    return (x - den) / sigma


@pytest.mark.parametrize("family", FAMILIES)
def test_comfy_model_equals_diffusers_forward(comfy, family):
    t = tf.TINY[family]
    ref_model = tf.diffusers_model(family, seed=0, dtype=torch.float32)
    sd = {k: v.clone() for k, v in ref_model.state_dict().items()}
    fam = families.get(family)
    patcher = comfy_model(comfy).build_patcher(fam, "diffusers", sd, dtype=torch.float32)
    assert type(patcher.model.model_config).__name__ in fam.comfy_models
    x = torch.randn(*t.latent, generator=torch.Generator().manual_seed(1))
    ctx, extra = tf.conditioning(family)
    with torch.inference_mode():
        got = comfy_velocity(patcher, x, 0.7, ctx, extra)
        want = t.reference(ref_model, x, torch.tensor([0.7]), ctx, extra)
    rel = ((got - want).norm() / want.norm()).item()
    print(f"\n[{family}] ComfyUI vs diffusers forward (fp32): relative difference {rel:.2e}")
    assert rel < 1e-4, f"{family}: ComfyUI's model with our mapped weights differs from diffusers by {rel}"


# ---------------------------------------------------------------------------------------------------------------
# Pre-quantized files through the loader node == quantizing at load time; close to dense


# Files of this pack's own builder; every family's files as Unsloth's builder writes them (int8, fp8, NVFP4, v3 policy,
# ConvRot) go through the node in tests/families/test_unsloth_conformance_comfy.py. Here the families whose int8 files keep
# family-specific layers dense, and FLUX.1.
OWN_WRITER_FAMILIES = ("flux.1", "qwen-image", "hunyuanvideo-1.5")


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("family", OWN_WRITER_FAMILIES)
def test_prequant_equals_load_time_quantization(comfy, prequant_dir, family, scheme):
    nodes, pack = comfy
    fam = families.get(family)
    t = tf.TINY[family]
    name = prequant_file(prequant_dir, family, scheme)
    with torch.inference_mode():  # as ComfyUI runs every node
        res = nodes.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]().load(name, base_model_id=t.base_model_id,
                                                                           scheme=scheme)
    model = res["result"][0]
    summary = res["ui"]["prequant"][0]
    assert summary["family"] == family and summary["layout"] == "diffusers"
    assert type(model.model.model_config).__name__ in fam.comfy_models  # ComfyUI's own class for the family
    qlinears = [n for n, m in model.model.diffusion_model.named_modules() if getattr(m, "prequant_spec", None)]
    assert len(qlinears) >= 4, f"expected quantized Linears in the tiny {family}, got {qlinears}"
    want_dtype = torch.int8 if scheme == "int8" else torch.float8_e4m3fn
    assert all(model.model.diffusion_model.get_submodule(n).weight.dtype == want_dtype for n in qlinears)

    out = sample(model, family)
    q, _ = quantize.quantize_tensors(dense(family), scheme,
                                  exclude=schemes.exclude_tokens(scheme, fam.arch.int8_exclude_extra))
    ref = sample(pack.nodes.comfy_model.build_patcher(fam, "diffusers", q), family)
    assert torch.isfinite(out).all()
    diff = (out - ref).abs().max().item()
    d = dense_out(comfy, family)
    rel = ((out - d).norm() / d.norm()).item()
    print(f"\n[{family}/{scheme}] {len(qlinears)} quantized Linears; max |prequant - load-time| = {diff}; "
          f"relative error vs dense bf16 = {rel:.4f}")
    assert diff == 0.0, "pre-quantized output must equal load-time quantization bit for bit"
    assert 0 < rel < 0.1, f"output drifted from the dense model: {rel}"


def test_int8_exclusions_follow_the_family(comfy, prequant_dir):
    """qwen-image keeps its text-stream Linears dense in int8 files (docs/FORMAT.md), and the loaded model agrees."""
    from prequant_core import formats
    name = prequant_file(prequant_dir, "qwen-image", "int8")
    import folder_paths
    ck = formats.read(folder_paths.get_full_path_or_raise("prequant", name))
    assert set(families.get("qwen-image").arch.int8_exclude_extra) <= set(ck.metadata["exclude_name_tokens"])
    assert not qtensor.is_quantized(ck.tensors["transformer_blocks.0.attn.add_q_proj.weight"])
    assert not qtensor.is_quantized(ck.tensors["transformer_blocks.0.txt_mlp.net.0.proj.weight"])
    assert qtensor.is_quantized(ck.tensors["transformer_blocks.0.attn.to_q.weight"])


# ---------------------------------------------------------------------------------------------------------------
# Detection, class choice, errors


@pytest.mark.parametrize("family", FAMILIES)
def test_detection_from_metadata_and_from_keys(family):
    keys = list(dense(family))
    fam, layout = families.detect(keys, {"family": family})
    assert (fam.name, layout) == (family, "diffusers")
    by_class, _ = families.detect(keys, {"transformer_class": fam.arch.diffusers_class})
    by_keys, layout = families.detect(keys, {})
    assert layout == "diffusers"
    # FLUX.2 klein and dev, Wan 2.2 TI2V-5B and A14B share class and names: without a family field either loads
    # (config and ComfyUI class from shapes)
    assert by_keys.arch.diffusers_class == by_class.arch.diffusers_class == fam.arch.diffusers_class
    if families.classes()[fam.arch.diffusers_class] == family:
        assert by_keys.name == by_class.name == family


def test_unknown_checkpoint_lists_the_families():
    with pytest.raises(UnknownFamilyError) as e:
        families.detect(["encoder.block.0.weight", "decoder.block.0.weight"], {})
    for name in families.FAMILIES:
        assert name in str(e.value)


def test_flux1_schnell_and_dev_pick_comfys_own_classes(comfy):
    cm = comfy_model(comfy)
    fam = families.get("flux.1")
    dev, _ = cm.model_config_for(fam, tf.meta_state_dict("flux.1", guidance_embeds=True))
    schnell, _ = cm.model_config_for(fam, tf.meta_state_dict("flux.1", guidance_embeds=False))
    assert type(dev).__name__ == "Flux" and type(schnell).__name__ == "FluxSchnell"
    assert schnell.sampling_settings.get("shift") == 1.0  # schnell's own sampling settings come with its class


@pytest.mark.parametrize("family", FAMILIES)
def test_real_size_model_matches_comfyuis_own_detection(comfy, family):
    """At the released model's size (meta tensors, no memory): our converted state dict is exactly ComfyUI's
    skeleton, ComfyUI's own detection on those keys agrees with our derived config and class, and every fused
    ComfyUI weight gets all or none of its parts quantized (a Linear cannot be half quantized)."""
    import comfy.model_detection as detection
    import comfy.ops as ops
    cm = comfy_model(comfy)
    fam = families.get(family)
    sd = tf.meta_state_dict(family)
    model_config, cfg = cm.model_config_for(fam, sd)
    converted = cm.diffusers_to_comfy(fam, sd, cfg, model_config=model_config)
    model_config.set_inference_dtype(torch.bfloat16, None)
    model_config.custom_operations = ops.disable_weight_init
    skeleton = {k: tuple(v.shape) for k, v in
                model_config.get_model({}, "", device=torch.device("meta")).diffusion_model.state_dict().items()}
    assert set(skeleton) - set(converted) <= set(fam.arch.fill_missing) and set(converted) <= set(skeleton)
    assert {k: tuple(v.shape) for k, v in converted.items()} == {k: s for k, s in skeleton.items() if k in converted}

    detected = detection.detect_unet_config(converted, "")
    differ = {k: (detected[k], cfg[k]) for k in detected if k in cfg and detected[k] != cfg[k]}
    if family == "flux.2-klein" and cm.comfy_version() == "0.3.75":
        # ComfyUI 0.3.75 assumes FLUX.2-dev's 48 heads; klein 4B has 24 (hidden / 128). 0.12.1 detects 24 too.
        assert differ == {"num_heads": (48, 24)}
    else:
        assert not differ, differ
    detected_cls = detection.model_config_from_unet_config(detected, converted)
    assert type(detected_cls).__name__ == type(model_config).__name__

    key_map = cm.key_map_for(fam, cfg) or {}
    fused: dict = {}
    for dk, target in keymap.parse_map(key_map).items():
        if target.rows is not None and dk.endswith(".weight") and dk in sd:
            fused.setdefault(target.name, []).append(dk)
    for scheme in SCHEMES:
        flt = schemes.LayerFilter(scheme, schemes.DEFAULT_MIN_FEATURES,
                                  tuple(schemes.exclude_tokens(scheme, fam.arch.int8_exclude_extra)))
        quantized = {k for k in tiny_models.linear_weight_keys(sd) if flt.reason_skipped(k[:-len(".weight")], sd[k]) is None}
        assert len(quantized) > 10
        mixed = {t: parts for t, parts in fused.items() if len({p in quantized for p in parts}) > 1}
        assert not mixed, f"{scheme}: fused ComfyUI weights with quantized and dense parts: {mixed}"


def test_missing_comfy_class_names_the_version_needed(comfy):
    flux = families.get("flux.1")
    fam = dataclasses.replace(flux, arch=dataclasses.replace(flux.arch, comfy_model="FluxFromTheFuture",
                                                             min_comfy="9.1.0"))
    with pytest.raises(ComfyVersionError) as e:
        comfy_model(comfy).build_patcher(fam, "diffusers", dict(dense("flux.1")))
    msg = str(e.value)
    assert "9.1.0" in msg and "FLUX.1" in msg and comfy_model(comfy).comfy_version() in msg


def test_comfyui_parameter_defaults_are_the_familys_data(comfy):
    """A field a newer ComfyUI's parameter class requires and an older one's refuses (0.12.1: FLUX's
    ``txt_ids_dims``, HunyuanVideo's ``meanflow_sum``) is the family record's ``arch.comfy_params``: the ComfyUI side
    has no per-family rule. The same configs as the rule it replaced (keyed by ``image_model``), on this ComfyUI."""
    cm = comfy_model(comfy)

    def keyed_by_model(cfg):  # the rule nodes/comfy_model.py had before issue 59 step 4
        cfg = dict(cfg)
        model = cfg.get("image_model")
        if model in ("flux", "flux2") and "txt_ids_dims" not in cfg and \
                "txt_ids_dims" in cm._param_fields("comfy.ldm.flux.model", "FluxParams"):
            cfg["txt_ids_dims"] = [3] if model == "flux2" else []
        if model == "hunyuan_video" and "meanflow_sum" not in cfg and \
                "meanflow_sum" in cm._param_fields("comfy.ldm.hunyuan_video.model", "HunyuanVideoParams"):
            cfg["meanflow_sum"] = cfg.get("vision_in_dim") is not None
        return cfg

    for name in FAMILIES:
        fam = families.get(name)
        cfg = fam.config_from_shapes({k: tuple(v.shape) for k, v in tf.meta_state_dict(name, real=False).items()})
        assert cm.complete_for_this_comfyui(fam, cfg) == keyed_by_model(cfg), name
    has = "meanflow_sum" in cm._param_fields("comfy.ldm.hunyuan_video.model", "HunyuanVideoParams")  # 0.12.1 on
    cfg = {"image_model": "hunyuan_video", "vision_in_dim": 8}
    assert cm.complete_for_this_comfyui(families.get("hunyuanvideo-1.5"), cfg) == (
        {**cfg, "meanflow_sum": True} if has else cfg)
    # any family's: set only where the parameter class has the field and the config lacks it
    from toy import toy_family
    toy = toy_family.FAMILIES[0]
    assert cm.complete_for_this_comfyui(toy, {"dim": 4}) == {"dim": 4, "toy_axes": [4]}
    assert cm.complete_for_this_comfyui(toy, {"dim": 4, "toy_axes": [1]}) == {"dim": 4, "toy_axes": [1]}
    lacking = dataclasses.replace(toy, arch=dataclasses.replace(toy.arch, comfy_params=(
        dataclasses.replace(toy.arch.comfy_params[0], field="not_a_field"),)))
    assert cm.complete_for_this_comfyui(lacking, {"dim": 4}) == {"dim": 4}


def test_missing_comfy_key_map_names_the_version_needed(comfy):
    flux = families.get("flux.1")
    fam = dataclasses.replace(flux, arch=dataclasses.replace(flux.arch, comfy_key_map="flux_to_diffusers_v9",
                                                             min_comfy="9.1.0"))
    with pytest.raises(ComfyVersionError) as e:
        comfy_model(comfy).build_patcher(fam, "diffusers", dict(dense("flux.1")))
    assert "9.1.0" in str(e.value)


def test_a_file_that_passes_detection_but_lacks_a_config_key_is_corrupt(comfy, prequant_dir):
    """A truncated file (or another model's) whose keys still pass Qwen-Image's detection but lack a tensor its
    config is read from: a typed CorruptCheckpointError naming the file, the family and the key (not a KeyError)."""
    t = tf.TINY["qwen-image"]
    sd = {k: v for k, v in dense("qwen-image").items() if k != "txt_in.weight"}
    assert families.detect(list(sd), {})[0].name == "qwen-image"
    name = f"{t.file_stem}-truncated-INT8.safetensors"
    builder.build_from_tensors(sd, builder.Target(os.path.join(prequant_dir, name), overwrite=True),
                               builder.Recipe("int8", family=families.get("qwen-image"), base_model_id=t.base_model_id))
    with pytest.raises(CorruptCheckpointError) as e, torch.inference_mode():
        comfy[0].NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]().load("families/" + name,
                                                                       base_model_id=t.base_model_id, scheme="int8")
    msg = str(e.value)
    assert "Qwen-Image" in msg and "txt_in.weight" in msg and name in msg
    assert "the file may be truncated or for another model" in msg


# ---------------------------------------------------------------------------------------------------------------
# The one non-slice transform in the maps (FLUX's final adaLN scale/shift swap) is exact on quantized rows


@pytest.mark.parametrize("scheme", SCHEMES)
def test_swap_scale_shift_is_exact_on_quantized_rows(scheme):
    w = torch.randn(1024, 512, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    swapped_dense = torch.cat([w[512:], w[:512]])
    a = qtensor.split(keymap.swap_halves(schemes.quantize_weight(w, scheme)))
    b = qtensor.split(schemes.quantize_weight(swapped_dense, scheme))
    assert torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8)) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0].view(torch.uint8), qtensor.split(schemes.quantize_weight(w, scheme))[0].view(torch.uint8))


# ---------------------------------------------------------------------------------------------------------------
# Stock nodes on a family with fused weights: a diffusers-named FLUX LoRA (ComfyUI maps ``to_k`` onto rows of the
# fused ``qkv`` with its own flux_to_diffusers) lands on exactly those rows of the quantized weight


def test_flux1_diffusers_lora_patches_rows_of_the_fused_quantized_qkv(comfy, prequant_dir):
    import comfy.model_management as mm
    import folder_paths
    from safetensors.torch import save_file
    nodes, _ = comfy
    with torch.inference_mode():
        model = nodes.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]().load(
            prequant_file(prequant_dir, "flux.1", "int8"))["result"][0]
    base = sample(model, "flux.1")
    dm = model.model.diffusion_model
    qkv = dm.double_blocks[0].img_attn.qkv
    h = dm.hidden_size
    orig = dense_of(qkv).clone()

    g = torch.Generator().manual_seed(5)
    sd = {}
    for name, (out_f, in_f) in {"transformer_blocks.0.attn.to_k": (h, h),
                                "single_transformer_blocks.0.proj_mlp": (4 * h, h)}.items():
        sd[f"transformer.{name}.lora_B.weight"] = (torch.randn(out_f, 4, generator=g) * 0.2).to(torch.bfloat16)
        sd[f"transformer.{name}.lora_A.weight"] = (torch.randn(4, in_f, generator=g) * 0.2).to(torch.bfloat16)
    lora_dir = folder_paths.get_folder_paths("loras")[0]
    os.makedirs(lora_dir, exist_ok=True)
    save_file(sd, os.path.join(lora_dir, "tiny_flux1_diffusers_lora.safetensors"))
    with torch.inference_mode():
        lora_model = nodes.NODE_CLASS_MAPPINGS["LoraLoaderModelOnly"]().load_lora_model_only(
            model, "tiny_flux1_diffusers_lora.safetensors", 1.0)[0]
    assert {"diffusion_model.double_blocks.0.img_attn.qkv.weight",
            "diffusion_model.single_blocks.0.linear1.weight"} <= set(lora_model.patches)

    with_lora = sample(lora_model, "flux.1")
    assert torch.isfinite(with_lora).all() and not torch.equal(with_lora, base)
    delta = (dense_of(qkv) - orig).abs()  # weights are patched while the model stays loaded
    k_rows, other_rows = delta[h:2 * h].max().item(), torch.cat([delta[:h], delta[2 * h:]]).max().item()
    print(f"\n[flux.1 LoRA on to_k] max change: k rows {k_rows:.4f}, q/v rows {other_rows:.6f}")
    assert k_rows > 0 and other_rows == 0.0, "rows the LoRA does not touch keep their exact codes and scales"

    mm.unload_all_models()
    assert torch.equal(dense_of(qkv), orig), "unpatching must restore the quantized weight exactly"
    assert torch.equal(sample(model, "flux.1"), base)


def test_stock_shift_and_guidance_nodes_reach_the_prequant_model(comfy, prequant_dir):
    """ComfyUI's own ModelSamplingAuraFlow (shift) and FluxGuidance nodes act on a pre-quantized model as on its own."""
    nodes, _ = comfy
    load = nodes.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]()
    with torch.inference_mode():
        qwen = load.load(prequant_file(prequant_dir, "qwen-image", "fp8"))["result"][0]
        shifted = nodes.NODE_CLASS_MAPPINGS["ModelSamplingAuraFlow"]().patch_aura(qwen, 3.1)[0]
    assert shifted.get_model_object("model_sampling").shift == pytest.approx(3.1)
    base, with_shift = sample(qwen, "qwen-image"), sample(shifted, "qwen-image")
    assert torch.isfinite(with_shift).all() and not torch.equal(base, with_shift)

    with torch.inference_mode():
        flux = load.load(prequant_file(prequant_dir, "flux.1", "fp8"))["result"][0]
    import comfy.sample as comfy_sample
    ctx, extra = tf.conditioning("flux.1")
    outs = []
    for g in (4.0, 2.0):
        cond = nodes.NODE_CLASS_MAPPINGS["FluxGuidance"].execute([[ctx, dict(extra)]], g).result[0]
        latent = torch.zeros(tf.TINY["flux.1"].latent)
        noise = torch.randn(latent.shape, generator=torch.Generator().manual_seed(1))
        with torch.inference_mode():
            outs.append(comfy_sample.sample(flux, noise, 2, 1.0, "euler", "simple", cond, cond, latent, seed=0,
                                            disable_pbar=True))
    assert torch.equal(outs[0], sample(flux, "flux.1")), "guidance 4.0 set by the node = the tiny conditioning's 4.0"
    assert not torch.equal(outs[0], outs[1]), "the guidance value must reach the guidance embedder"


# ---------------------------------------------------------------------------------------------------------------
# Families whose diffusers class needs diffusers 0.42.1 (Krea 2, Qwen-Image 2.1, LTX-2.3, MiniMax-H3): built with its
# real classes (in a subprocess, .cache/diffusers042); Info / verify accept them; the loader node loads the ones ComfyUI
# 0.33.0 has a class for and names the ComfyUI the others need.

@pytest.mark.parametrize("family", list(tf.DIFFUSERS_ONLY))
def test_newer_families_info_verify_and_the_node_names_the_comfyui_needed(comfy, prequant_dir, family):
    import json
    import subprocess
    import sys
    from conftest import ROOT
    from prequant_core.report import info
    side = os.path.join(ROOT, ".cache", "diffusers042")
    if not os.path.isfile(os.path.join(side, "diffusers", "__init__.py")):
        pytest.fail("diffusers 0.42.1 is missing at .cache/diffusers042: run scripts/setup_test_extras.sh diffusers042")
    t = tf.DIFFUSERS_ONLY[family]
    fam = families.get(family)
    name = f"{t.file_stem}-INT8.safetensors"
    path = os.path.join(prequant_dir, name)
    # the side-by-side diffusers 0.42 is installed for the dev venv's packages (scripts/setup_test_extras.sh); the build
    # needs no ComfyUI, so it runs there whichever ComfyUI (and venv) this test runs on
    dev_py = os.path.join(ROOT, ".venv", "bin", "python")
    p = subprocess.run([dev_py if os.path.exists(dev_py) else sys.executable, "-m", "tools.diffusers_check", "build",
                        family, "int8", path], cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join([side, ROOT])), capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout.strip().splitlines()[-1])["path"] == path

    r = info(path, {"base_model_id": t.base_model_id, "scheme": "int8"})
    assert r.valid, r.reasons
    assert r.family == family and r.quantized_count >= 4
    assert not info(path, {"base_model_id": "someone/Other-Model", "scheme": "int8"}).valid

    nodes_, pack = comfy
    load = lambda: nodes_.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]().load(  # noqa: E731
        "families/" + name, base_model_id=t.base_model_id, scheme="int8")
    if not hosts_here(comfy, fam):
        with pytest.raises(ComfyVersionError) as e, torch.inference_mode():
            load()
        msg = str(e.value)
        assert fam.arch.min_comfy in msg and fam.title in msg and fam.comfy_models[0] in msg
        assert comfy_model(comfy).comfy_version() in msg
        return
    # this ComfyUI hosts it: the node's model is ComfyUI's class, and computes what the same weights quantized at load
    # compute (the int8 file's tensors placed again by the pack from a dense copy quantized here)
    rec = _record(family)
    dense_sd = {k[len("dense."):]: v.to(torch.bfloat16) for k, v in rec.items() if k.startswith("dense.")}
    companion = fam.arch.companion
    extra = {k: v for k, v in dense_sd.items() if companion and k.startswith(companion.prefix)}
    if companion is None:
        with torch.inference_mode():
            res = load()
        model = res["result"][0]
        assert res["ui"]["prequant"][0]["family"] == family
    else:  # LTX-2.3: the file holds the transformer only; ComfyUI's class also runs the text connectors
        dense_name = f"{t.file_stem}-dense-{family}.safetensors"
        from safetensors.torch import save_file
        import folder_paths
        dense_path = os.path.join(folder_paths.get_folder_paths("diffusion_models")[0], dense_name)
        os.makedirs(os.path.dirname(dense_path), exist_ok=True)
        save_file({k: v.contiguous() for k, v in dense_sd.items() if k not in extra}, dense_path)
        load_dense = lambda: nodes_.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]().load(  # noqa: E731
            pack.nodes.paths.NONE_CHOICE, policy="quantize dense", dense_fallback=dense_name, scheme="int8",
            family=family)
        try:
            model, from_dense = _load_with_companion(fam, (load, load_dense), extra, os.path.dirname(prequant_dir))
        finally:
            os.remove(dense_path)
    assert type(model.model.model_config).__name__ == fam.comfy_models[0]
    q, _ = quantize.quantize_tensors({k: v for k, v in dense_sd.items() if k not in extra}, "int8",
                                     exclude=schemes.exclude_tokens("int8", fam.arch.int8_exclude_extra))
    ref = comfy_model(comfy).build_patcher(fam, "diffusers", {**q, **extra})
    dense_model = comfy_model(comfy).build_patcher(fam, "diffusers", dense_sd)
    got, want, d = (_recorded_velocity(m, rec)[0] for m in (model, ref, dense_model))
    assert torch.isfinite(got).all() and torch.equal(got, want)
    assert 0 < ((got - d).norm() / d.norm()).item() < 0.1
    if companion is not None:  # the dense file quantized at load, its connectors from their own file: the same
        assert torch.equal(_recorded_velocity(from_dense, rec)[0], want)


# Unsloth's own files of the video families (tests/unsloth_builder.py, run with diffusers 0.42.1): the containers and
# kinds Unsloth hosts for each (LTX-2.3: fp8; MiniMax-H3: int8 ConvRot v2 and fp8), through the node on ComfyUI 0.33
VIDEO_FILES = [("ltx-2", "fp8", "pt"), ("ltx-2", "fp8", "safetensors"), ("minimax-h3", "convrot", "pt"),
               ("minimax-h3", "fp8", "safetensors")]


@pytest.mark.parametrize("family,kind,container", VIDEO_FILES, ids=["-".join(v) for v in VIDEO_FILES])
def test_unsloths_video_family_files_load_through_the_node(comfy, prequant_dir, family, kind, container):
    """Each file as Unsloth's builder writes it (never this pack's writer) loads through Load Prequant Transformer
    into ComfyUI 0.33's class (LTX-2.3 with its text connectors from their own file); fp8 computes what this pack
    quantizing the same dense weights at load computes, bit for bit; int8 ConvRot stays as close to dense as plain
    int8. An older ComfyUI refuses them naming 0.33.0."""
    from conftest import unsloth_video_file
    from safetensors.torch import save_file
    fam = families.get(family)
    stem = tf.DIFFUSERS_ONLY[family].file_stem
    name = f"{stem}-unsloth-{kind}.{container}"
    path = os.path.join(prequant_dir, name)
    unsloth_video_file(family, kind, path)
    nodes_, pack = comfy
    load = lambda: nodes_.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]().load(  # noqa: E731
        "families/" + name, scheme="int8" if kind == "convrot" else kind)
    if not hosts_here(comfy, fam):
        with pytest.raises(ComfyVersionError) as e, torch.inference_mode():
            load()
        assert fam.arch.min_comfy in str(e.value)
        return
    rec = _record(family)
    dense_sd = {k[len("dense."):]: v.to(torch.bfloat16) for k, v in rec.items() if k.startswith("dense.")}
    c = fam.arch.companion
    extra = {k: v for k, v in dense_sd.items() if c and k.startswith(c.prefix)}
    local = os.path.join(os.path.dirname(prequant_dir), c.local_name) if c else None
    if c:  # the connectors as the base repo's component holds them
        save_file({k[len(c.prefix):]: v.contiguous() for k, v in extra.items()}, local)
    try:
        with torch.inference_mode():
            res = load()
    finally:
        if local:
            os.remove(local)
    model = res["result"][0]
    assert type(model.model.model_config).__name__ == fam.comfy_models[0]
    assert res["ui"]["prequant"][0]["family"] == family
    got = _recorded_velocity(model, rec)[0]
    dense_model = comfy_model(comfy).build_patcher(fam, "diffusers", dense_sd)
    d = _recorded_velocity(dense_model, rec)[0]
    rel = _relative(got, d)
    if kind == "fp8":
        # fp8 takes no family tokens (docs/FORMAT.md section 4: they are int8's)
        q, _ = quantize.quantize_tensors({k: v for k, v in dense_sd.items() if k not in extra}, "fp8",
                                         exclude=schemes.exclude_tokens("fp8"))
        ref = comfy_model(comfy).build_patcher(fam, "diffusers", {**q, **extra})
        assert torch.equal(got, _recorded_velocity(ref, rec)[0])
    print(f"[{family} {kind} {container}] node vs dense ComfyUI model: relative difference {rel:.3f}")
    assert torch.isfinite(got).all() and 0 < rel < 0.1


BLOCK_BUILDS = [(f, s) for f in ("ltx-2", "minimax-h3") for s in ("nvfp4", "mxfp8")]


@pytest.mark.parametrize("family,scheme", BLOCK_BUILDS, ids=["-".join(b) for b in BLOCK_BUILDS])
def test_the_packs_block_scheme_builds_of_the_video_families_equal_load_time_quantization(comfy, prequant_dir, family,
                                                                                          scheme):
    """Issue 60 #1: this pack's own NVFP4 and MXFP8 builds of LTX-2.3 and MiniMax-H3 (int8: above) load through the
    node into ComfyUI 0.33's class and compute what the node computes quantizing the same dense file at load, bit
    for bit (LTX-2.3's connectors from their own file in both). An older ComfyUI refuses the family by version."""
    import folder_paths
    from safetensors.torch import save_file
    fam = families.get(family)
    if refused_here(comfy, fam):
        return
    nodes_, pack = comfy
    rec = _record(family)
    c = fam.arch.companion
    dense_sd = {k[len("dense."):]: v.to(torch.bfloat16).contiguous() for k, v in rec.items() if k.startswith("dense.")}
    body = {k: v for k, v in dense_sd.items() if not (c and k.startswith(c.prefix))}
    t = tf.DIFFUSERS_ONLY[family]
    name = f"{t.file_stem}-{scheme.upper()}.pt"  # the container Unsloth's block-scheme files use
    builder.build_from_tensors(body, builder.Target(os.path.join(prequant_dir, name), overwrite=True),
                               builder.Recipe(scheme, family=fam, base_model_id=t.base_model_id))
    dense_name = f"{t.file_stem}-dense-{scheme}.safetensors"
    made = [os.path.join(folder_paths.get_folder_paths("diffusion_models")[0], dense_name)]
    os.makedirs(os.path.dirname(made[0]), exist_ok=True)
    save_file(body, made[0])
    if c:
        made.append(os.path.join(os.path.dirname(prequant_dir), c.local_name))
        save_file({k[len(c.prefix):]: v for k, v in dense_sd.items() if k.startswith(c.prefix)}, made[-1])
    load = nodes_.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]().load
    try:
        with torch.inference_mode():
            pre = load("families/" + name, scheme=scheme)
            at_load = load(pack.nodes.paths.NONE_CHOICE, policy="quantize dense", dense_fallback=dense_name,
                           scheme=scheme, family=family)
    finally:
        for f in made:
            os.remove(f)
    assert pre["ui"]["prequant"][0]["scheme"] == scheme and pre["ui"]["prequant"][0]["family"] == family
    model = pre["result"][0]
    assert type(model.model.model_config).__name__ == fam.comfy_models[0]
    assert any(getattr(m, "prequant_spec", None) is not None and m.prequant_spec.kind == schemes.get(scheme)[0].kind
               for m in model.model.diffusion_model.modules())
    got, want = (_recorded_velocity(r["result"][0], rec)[0] for r in (pre, at_load))
    d = _recorded_velocity(comfy_model(comfy).build_patcher(fam, "diffusers", dense_sd), rec)[0]
    rel = _relative(got, d)
    print(f"[{family} {scheme}] node vs dense ComfyUI model: relative difference {rel:.3f}")
    assert torch.isfinite(got).all() and torch.equal(got, want) and 0 < rel < 0.2


def _load_with_companion(fam, loads, extra: dict, models_prequant: str):
    """A family whose ComfyUI class holds weights its files lack (LTX-2.3's text connectors): offline and without
    them, the node refuses naming the base repo's file it needs (before building anything), for the pre-quantized
    file and for a dense one quantized at load alike; with the base repo's component as a file of the companion's
    name in models/prequant, it reads only the companion's tensors (the text projections beside them are the
    encoder's) and loads. Returns the node's two models."""
    from safetensors.torch import save_file
    from prequant_core.errors import HubError
    c = fam.arch.companion
    for load in loads:
        with pytest.MonkeyPatch.context() as mp, pytest.raises(HubError) as e, torch.inference_mode():
            mp.setenv("HF_HUB_OFFLINE", "1")
            load()
        assert fam.hosting.base_repos[0] in str(e.value) and c.repo_file in str(e.value), str(e.value)
    local = os.path.join(models_prequant, c.local_name)
    component = {k[len(c.prefix):]: v.contiguous() for k, v in extra.items()}
    component["video_text_proj_in.weight"] = torch.zeros(8, 8, dtype=torch.bfloat16)  # the encoder's, not read
    save_file(component, local)
    try:
        with torch.inference_mode():
            res = [load() for load in loads]
        # ComfyUI's reload of the model (``cached_patcher_init``: a non-dynamic delegate, a device copy) reads the
        # connectors from their own file again, as the load did
        reload, args = res[0]["result"][0].cached_patcher_init
        assert os.path.samefile(args[2], local)
        before, after = res[0]["result"][0].model.state_dict(), reload(*args).model.state_dict()
        connectors = [k for k in before if "connector" in k]
        assert connectors and all(torch.equal(before[k], after[k]) for k in connectors)
    finally:
        os.remove(local)
    assert res[0]["ui"]["prequant"][0]["companion"] == f"{c.local_name} (local)"
    assert f"with {c.local_name} (local)" in res[0]["ui"]["text"][0]
    return tuple(r["result"][0] for r in res)


def refused_here(comfy, fam) -> bool:
    """Whether this ComfyUI lacks the class the pack maps ``fam`` into, having checked that the refusal names the
    version that has it."""
    if hosts_here(comfy, fam):
        return False
    with pytest.raises(ComfyVersionError) as e:
        comfy_model(comfy).check_loadable(fam)
    assert fam.arch.min_comfy in str(e.value)
    return True


def hosts_here(comfy, fam) -> bool:
    """Whether this ComfyUI has the class the pack maps ``fam`` into (the version the family records, and the class)."""
    cm = comfy_model(comfy)
    if fam.arch.unet_config is None or cm._older_than(cm.comfy_version(), fam.arch.min_comfy):
        return False
    try:
        cm.model_class_for(fam, {})
        return True
    except ComfyVersionError:
        return False


_records: dict = {}


def _record(family, dense_form: bool = False):
    """The family's tiny model and one forward pass of its diffusers class (tools/tiny_families.forward_record); a
    family whose class takes a packed sequence (MiniMax-H3) on the one ComfyUI's own model lays out (``_packed``)."""
    key = (family, dense_form)
    if key not in _records:
        if tf.DIFFUSERS_ONLY[family].layout:
            model_inputs, inputs = _packed()
            if dense_form:
                inputs[tf.DENSE_FORM] = torch.ones(1)
            _records[key] = {**tf.forward_record(family, inputs), **model_inputs}
        else:
            _records[key] = tf.forward_record(family)
    return _records[key]


PACKED = "packed.video"  # a record of a packed-sequence family: its ComfyUI-side inputs under packed.*


def _packed(n_txt: int = 6, frames: int = 2, h: int = 4, w: int = 4, audio_t: int = 3, sigma: float = 0.7):
    """MiniMax-H3's inputs, laid out by ComfyUI 0.33's own MiniMaxH3 code: a video latent [1, 16, F, H, W], an audio
    latent [1, 32, 2, T], text, sigma (the model's inputs, ``packed.*``), and the packed sequence its forward builds
    from them for diffusers' class: the rows (ComfyUI's patchify and audio packing), the text / audio / video
    segments, their rotary positions, modality tags and distinct timesteps (video and text at 1 - sigma, audio at the
    audio stream's shifted sigma)."""
    from comfy.ldm.minimax import model as h3
    g = torch.Generator().manual_seed(3)
    cfg = tf.tiny_kwargs("minimax-h3")
    video = torch.randn(1, cfg["in_channels"], frames, h, w, generator=g)
    audio = torch.randn(1, cfg["audio_in_channels"], 2, audio_t, generator=g)
    ctx = torch.randn(1, n_txt, cfg["text_dim"], generator=g)
    layout = h3.PackedLayout(n_txt, frames, h, w, audio_t)
    sigma_v = torch.tensor(sigma)
    import inspect
    shifts = inspect.signature(h3.MiniMaxH3Model).parameters  # the model's own stream shifts
    shift_v, shift_a = shifts["sigma_shift_video"].default, shifts["sigma_shift_audio"].default
    seg_t = {"text": float(1.0 - sigma_v), "video": float(1.0 - sigma_v),
             "audio": float(1.0 - h3.time_shift_sigma(sigma_v, shift_v, shift_a))}
    levels = sorted(set(seg_t.values()))
    tags = {"video": 0, "text": 1, "audio": 2}  # ComfyUI's and diffusers' modality tags
    t_index = torch.zeros(layout.seq_len, dtype=torch.long)
    tag = torch.zeros(layout.seq_len, dtype=torch.long)
    rows: dict = {k: [] for k in tags}
    for a, b, kind in layout.segments:
        t_index[a:b], tag[a:b] = levels.index(seg_t[kind]), tags[kind]
        rows[kind] += range(a, b)
    inputs = {"video_rows": h3.patchify_video(video, (1, 2, 2)), "audio_rows": h3.pack_audio(audio), "context": ctx,
              "timestep": torch.tensor(levels, dtype=torch.float32), "timestep_indices": t_index, "token_tags": tag,
              "position_ids": layout.position_ids.to(torch.float32),
              **{f"{k}_indices": torch.tensor(v, dtype=torch.long) for k, v in rows.items()}}
    return {PACKED: video, "packed.audio": audio, "packed.context": ctx, "packed.sigma": torch.tensor([sigma])}, inputs


def _recorded_velocity(patcher, rec) -> list:
    """ComfyUI's velocity for the record's latent: one stream, or (LTX-2.3) the video and audio latents packed into
    one as ComfyUI's sampler packs them (``comfy.utils.pack_latents``), the velocity unpacked per stream; MiniMax-H3:
    its diffusion model on the video and audio latents, the velocity in diffusers' rows and sign (ComfyUI's model
    returns its negative)."""
    import comfy.utils
    if PACKED in rec:
        from comfy.ldm.minimax import model as h3
        with torch.inference_mode():
            v, a = patcher.model.diffusion_model([rec[PACKED], rec["packed.audio"]], rec["packed.sigma"] * 1000.0,
                                                 rec["packed.context"])
        return [-h3.patchify_video(v.float(), (1, 2, 2)), -h3.pack_audio(a.float())]
    streams = [rec["x"].to(torch.float32)] + ([rec["audio_x"].to(torch.float32)] if "audio_x" in rec else [])
    x, shapes = comfy.utils.pack_latents(streams) if len(streams) > 1 else (streams[0], None)
    with torch.inference_mode():
        v = comfy_velocity(patcher, x, float(rec["sigma"]), rec["context"],
                           {"latent_shapes": shapes} if shapes else {})
    return comfy.utils.unpack_latents(v, shapes) if shapes else [v]


def _relative(got, want) -> float:
    return ((got - want).norm() / want.norm()).item()


@pytest.mark.parametrize("family", [f for f, t in tf.DIFFUSERS_ONLY.items() if t.record is not None])
def test_a_newer_family_in_comfyuis_class_equals_diffusers_forward(comfy, family):
    """Krea 2 (ComfyUI 0.33.0's Krea2) and LTX-2.3 (0.33.0's LTXAV): ComfyUI's model with the pack's mapped weights
    computes what diffusers' own class computes; a ComfyUI without the class (or with an older form of it: 0.12.1's
    LTXAV is LTX-2.0's) refuses it naming the version that has it. LTX-2.3's audio stream is held equal with the
    audio-to-video gate zeroed in both models: ComfyUI 0.33's block feeds its video-to-audio attention the video after
    the audio-to-video update, diffusers the video before it (the pack follows ComfyUI's forward, not its own)."""
    fam = families.get(family)
    if refused_here(comfy, fam):
        return
    rec = _record(family)
    dense_sd = {k[len("dense."):]: v.clone() for k, v in rec.items() if k.startswith("dense.")}
    patcher = comfy_model(comfy).build_patcher(fam, "diffusers", dense_sd, dtype=torch.float32)
    assert type(patcher.model.model_config).__name__ == fam.comfy_models[0]
    got = _recorded_velocity(patcher, rec)
    rel = _relative(got[0], rec["output"])
    print(f"\n[{family}] ComfyUI vs diffusers forward (fp32): relative difference {rel:.2e}")
    assert rel < 1e-4, f"{family}: ComfyUI's model with our mapped weights differs from diffusers by {rel}"
    if "audio_output" in rec:  # MiniMax-H3's audio stream, as ComfyUI and diffusers both compute it
        rel = _relative(got[1], rec["audio_output"])
        print(f"[{family}] audio stream: relative difference {rel:.2e}")
        assert rel < 1e-4, f"{family}: ComfyUI's audio stream differs from diffusers by {rel}"
    if "audio_output_without_a2v" in rec:
        for k, v in dense_sd.items():
            if k in tf.LTX2_A2V_GATE:
                v.zero_()
            elif k.endswith(tf.LTX2_A2V_GATE_ROW):
                v[-1] = 0
        gated = comfy_model(comfy).build_patcher(fam, "diffusers", dense_sd, dtype=torch.float32)
        rel = _relative(_recorded_velocity(gated, rec)[1], rec["audio_output_without_a2v"])
        print(f"[{family}] audio stream, audio-to-video gate zeroed: relative difference {rel:.2e}")
        assert rel < 1e-4, f"{family}: ComfyUI's audio stream differs from diffusers by {rel}"


def test_minimax_h3_dense_adaln_form_in_comfyuis_class_equals_diffusers_forward(comfy):
    """MiniMax-H3 in its dense adaLN form (the class as diffusers builds it: a time embedder, full-width modulation;
    Unsloth's files hold the curve form the test above holds): the same map into ComfyUI 0.33's MiniMaxH3 computes
    what diffusers computes, both streams."""
    from prequant_core.families import minimax_h3
    fam = families.get("minimax-h3")
    if refused_here(comfy, fam):
        return
    rec = _record("minimax-h3", dense_form=True)
    dense_sd = {k[len("dense."):]: v.clone() for k, v in rec.items() if k.startswith("dense.")}
    assert "time_embedder.linear_1.weight" in dense_sd and minimax_h3.TABLE not in dense_sd
    patcher = comfy_model(comfy).build_patcher(fam, "diffusers", dense_sd, dtype=torch.float32)
    assert not patcher.model.diffusion_model.use_adaln_curves
    for got, want in zip(_recorded_velocity(patcher, rec), (rec["output"], rec["audio_output"])):
        rel = _relative(got, want)
        print(f"[minimax-h3, dense adaLN] ComfyUI vs diffusers (fp32): relative difference {rel:.2e}")
        assert rel < 1e-4


@pytest.mark.parametrize("family", list(tf.DIFFUSERS_ONLY))
def test_a_family_this_comfyui_cannot_build_is_refused_before_any_download(comfy, monkeypatch, family):
    """Picking Krea 2 / Qwen-Image 2.1 on a ComfyUI without their class must not fetch gigabytes first: the version
    error comes before the Hub is asked (offline here, so without the early check the error would be the Hub's). A
    ComfyUI that hosts the family goes on to the Hub (the offline error then names the repo)."""
    from prequant_core.errors import PrequantError
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    nodes_, pack = comfy
    fam = families.get(family)
    with pytest.raises(PrequantError) as e, torch.inference_mode():
        nodes_.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]().load(pack.nodes.paths.NONE_CHOICE, family=family,
                                                                     scheme="fp8")
    if hosts_here(comfy, fam):
        assert not isinstance(e.value, ComfyVersionError) and next(iter(fam.hosting.repos)) in str(e.value), \
            str(e.value)
    else:
        assert isinstance(e.value, ComfyVersionError) and fam.arch.min_comfy in str(e.value)


def _krea2_native(path: str, cut: dict, **shape) -> None:
    """A ComfyUI-native Krea 2 file (ComfyUI's writer restated, tests/comfy_quantizer.py; its MLPs fp8) of ComfyUI's
    own Krea2 class at a tiny size with ``shape``'s heads, random weights; ``cut``: {tensor: rows kept}."""
    import comfy.ops
    import comfy_quantizer as cq
    from comfy.ldm.krea2.model import SingleStreamDiT
    cfg = {**dict(features=512, heads=4, kvheads=4, layers=1, channels=16, txtdim=512, txtlayers=2, txtheads=4,
                  txtkvheads=4), **shape}
    m = SingleStreamDiT(**cfg, device="cpu", dtype=torch.bfloat16, operations=comfy.ops.disable_weight_init)
    g = torch.Generator().manual_seed(0)
    sd = {k: (torch.randn(v.shape, generator=g) * 0.02).to(v.dtype) if v.is_floating_point() else v.clone()
          for k, v in m.state_dict().items()}
    for k, rows in cut.items():
        sd[k] = sd[k][:rows].contiguous()
    cq.write(path, sd, {f"blocks.0.mlp.{n}": ("float8_e4m3fn", {}) for n in ("gate", "up", "down")})


_QKV = lambda attn: {f"{attn}.w{p}.weight": 64 for p in "qkv"}  # noqa: E731 - half a 128-wide head each
KREA2_MALFORMED = [  # (case, the class's shape, rows cut, the tensor the refusal names)
    ("image-qkv-under-one-head", {}, _QKV("blocks.0.attn"), "blocks.0.attn.wq.weight"),
    ("text-qkv-under-one-head", {}, _QKV("txtfusion.refiner_blocks.0.attn"),
     "txtfusion.refiner_blocks.0.attn.wq.weight"),
    ("3-kv-heads-for-4", {"kvheads": 3}, {}, "blocks.0.attn.wk.weight"),
    ("5-kv-heads-for-4", {"kvheads": 5}, {}, "blocks.0.attn.wk.weight"),
    ("3-text-kv-heads-for-4", {"txtkvheads": 3}, {}, "txtfusion.refiner_blocks.0.attn.wk.weight"),
]


@pytest.mark.parametrize("case,shape,cut,tensor", KREA2_MALFORMED, ids=[c[0] for c in KREA2_MALFORMED])
def test_a_krea2_file_whose_heads_cannot_be_is_refused_naming_the_tensor(comfy, prequant_dir, case, shape, cut,
                                                                         tensor):
    """Issue 58 #5: q / k / v narrower than one 128-wide head made 0 heads, a ZeroDivisionError in ComfyUI's
    constructor reported as an internal bug; kv heads that do not divide the q heads (3 or 5 for 4) loaded and sampled
    a wrong image without a word (diffusers refuses those weights). The configuration read refuses both as a damaged
    file, naming the file and the tensor. A ComfyUI without the Krea2 class refuses the family before any file."""
    fam = families.get("krea-2")
    load = comfy[0].NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]().load
    if refused_here(comfy, fam):
        return
    name = f"Krea-2-{case}-ComfyUI.safetensors"
    path = os.path.join(prequant_dir, name)
    _krea2_native(path, cut, **shape)
    try:
        with pytest.raises(CorruptCheckpointError) as e, torch.inference_mode():
            load("families/" + name)
    finally:
        os.remove(path)
    msg = str(e.value)
    assert e.value.path == path and f"tensor '{tensor}'" in msg and "Krea 2" in msg, msg
    assert e.value.expected and e.value.found and e.value.fix, msg


def test_a_krea2_of_another_text_width_loads_as_stock_comfyui_builds_it(comfy):
    """Issue 60 #4: ComfyUI's detection keeps Krea 2's text heads at the release's 20 and its layers take the head
    width from the width (``dim // heads``); the pack derived the text heads as q rows // 128, so a Krea 2 whose text
    width is not 2560 (here 1280: twenty 64-wide heads) was refused as another model size although stock ComfyUI 0.33
    builds and runs it. The heads are now read as the layers hold them (the q / k norms' width), and the node's model
    computes what the stock Load Diffusion Model's does from the same file."""
    import folder_paths
    fam = families.get("krea-2")
    if not hosts_here(comfy, fam):
        with pytest.raises(ComfyVersionError):
            comfy_model(comfy).check_loadable(fam)
        return
    nodes_ = comfy[0]
    name = "Krea-2-txt1280-ComfyUI.safetensors"
    path = os.path.join(folder_paths.get_folder_paths("diffusion_models")[0], name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    _krea2_native(path, {}, txtdim=1280, txtheads=20, txtkvheads=20)
    try:
        with torch.inference_mode():
            stock = nodes_.NODE_CLASS_MAPPINGS["UNETLoader"]().load_unet(name, "default")[0]
            ours = nodes_.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]().load("diffusion_models/" + name)["result"][0]
    finally:
        os.remove(path)
    txt = ours.model.diffusion_model.txtfusion.refiner_blocks[0].attn
    assert (txt.heads, txt.kvheads, txt.headdim) == (20, 20, 64)
    g = torch.Generator().manual_seed(1)
    x, ctx, sigma = torch.randn(1, 16, 8, 8, generator=g), torch.randn(1, 6, 2 * 1280, generator=g), torch.tensor([0.7])
    with torch.inference_mode():
        a = stock.model.apply_model(x, sigma, c_crossattn=ctx).float()
        b = ours.model.apply_model(x, sigma, c_crossattn=ctx).float()
    assert torch.isfinite(a).all()
    diff = ((a - b).norm() / a.norm()).item()
    assert diff < 1e-3, f"stock ComfyUI and this pack must compute the same model from the same file: {diff}"
