"""The video families beyond what tests/families/test_families.py checks for every family (ComfyUI vs diffusers forward,
pre-quantized == load-time quantization, real-size skeletons): Wan 2.2 A14B's two experts (the ``component`` a file
records, the loader's ``component`` input, the high-noise / low-noise two-sampler graph), the Hub names of the
NVFP4-only repos (per expert, per HunyuanVideo 1.5 variant), and memory on the low-VRAM (streaming) path with a
video-length latent.
"""
from __future__ import annotations

import gc
import os
import statistics

import pytest
import torch

from prequant_core import builder, families, schemes
from prequant_core.schemes import quantize
from prequant_core.load import sources
from prequant_core.errors import BuildError, PrequantError
from tools import tiny_families as tf

A14B = "wan2.2-t2v-a14b"
TI2V = "wan2.2-ti2v-5b"


@pytest.fixture(scope="module")
def prequant_dir(comfy):
    import folder_paths
    d = os.path.join(folder_paths.get_folder_paths("prequant")[0], "video")
    os.makedirs(d, exist_ok=True)
    return d


_dense: dict = {}


def dense(family, seed):
    if (family, seed) not in _dense:
        _dense[family, seed] = tf.dense(family, seed=seed)
    return _dense[family, seed]


@pytest.fixture(scope="module")
def experts(prequant_dir):
    """The tiny A14B built as its two experts (different weights), int8, named like the hosted files."""
    out = {}
    t = tf.TINY[A14B]
    for comp, seed in (("transformer", 0), ("transformer_2", 1)):
        stem = t.file_stem if comp == "transformer" else f"{t.file_stem}-{comp}"
        path = os.path.join(prequant_dir, f"{stem}-INT8.safetensors")
        builder.build_from_tensors(dense(A14B, seed), builder.Target(path, overwrite=True),
                                   builder.Recipe("int8", family=families.get(A14B), base_model_id=t.base_model_id,
                                                  component=comp))
        out[comp] = "video/" + os.path.basename(path)
    return out


def _load(comfy, name, **kw):
    nodes, _ = comfy
    with torch.inference_mode():
        return nodes.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]().load(name, **kw)


def two_expert_sample(comfy, high, low, steps=4, switch=2, seed=0):
    """ComfyUI's Wan 2.2 A14B graph: KSamplerAdvanced on the high-noise expert for the first steps (leftover noise
    returned), a second KSamplerAdvanced on the low-noise expert for the rest."""
    nodes, _ = comfy
    ctx, extra = tf.conditioning(A14B, seed)
    cond = [[ctx, dict(extra)]]
    latent = {"samples": torch.zeros(tf.TINY[A14B].latent)}
    ks = nodes.NODE_CLASS_MAPPINGS["KSamplerAdvanced"]()
    with torch.inference_mode():
        mid = ks.sample(high, "enable", seed, steps, 1.0, "euler", "simple", cond, cond, latent, 0, switch, "enable")[0]
        out = ks.sample(low, "disable", seed, steps, 1.0, "euler", "simple", cond, cond, mid, switch, 10000,
                        "disable")[0]
    return mid["samples"], out["samples"]


def test_two_expert_graph_equals_load_time_quantization(comfy, experts):
    """Each expert's file loads with its component into ComfyUI's WAN21_T2V; the two-sampler graph on the two
    pre-quantized experts equals the same graph on the dense experts quantized at load time, bit for bit."""
    _, pack = comfy
    fam = families.get(A14B)
    loaded = {}
    for comp, name in experts.items():
        res = _load(comfy, name, component=comp, base_model_id=fam.hosting.base_repos[0], scheme="int8")
        model = res["result"][0]
        assert type(model.model.model_config).__name__ == "WAN21_T2V"
        loaded[comp] = model
    mid, out = two_expert_sample(comfy, loaded["transformer"], loaded["transformer_2"])

    ref = {}
    for comp, seed in (("transformer", 0), ("transformer_2", 1)):
        q, _ = quantize.quantize_tensors(dense(A14B, seed), "int8", exclude=schemes.exclude_tokens("int8", ()))
        ref[comp] = pack.nodes.comfy_model.build_patcher(fam, "diffusers", q)
    ref_mid, ref_out = two_expert_sample(comfy, ref["transformer"], ref["transformer_2"])
    # the low-noise expert really ran: swapping in the high-noise expert for the second pass changes the output
    _, same_expert = two_expert_sample(comfy, loaded["transformer"], loaded["transformer"])
    print(f"\n[{A14B}] two-expert graph: max |prequant - load-time| = {(out - ref_out).abs().max().item()}; "
          f"max |two experts - high-noise expert only| = {(out - same_expert).abs().max().item():.4f}")
    assert torch.isfinite(out).all()
    assert torch.equal(mid, ref_mid) and torch.equal(out, ref_out)
    assert not torch.equal(out, same_expert)


def test_a_file_of_another_component_is_refused(comfy, experts):
    """The loader's component (default transformer) must match the one the file records, both ways."""
    with pytest.raises(PrequantError) as e:
        _load(comfy, experts["transformer_2"])  # a workflow saved before the input existed: component transformer
    assert "component is 'transformer_2', expected 'transformer'" in str(e.value)
    with pytest.raises(PrequantError) as e:
        _load(comfy, experts["transformer"], component="transformer_2")
    assert "component is 'transformer', expected 'transformer_2'" in str(e.value)


def test_info_accepts_an_expert_as_what_it_records(comfy, experts):
    """Prequant Info judges base and scheme: the second expert's file is valid, with a note saying which component
    the loader must ask for; a wrong scheme is still refused."""
    import folder_paths
    from prequant_core import report
    from prequant_core.load import metadata
    path = folder_paths.get_full_path_or_raise("prequant", experts["transformer_2"])
    for req in (None, metadata.Request(scheme="int8", base_model_id="Wan2.2-T2V-A14B-Diffusers")):
        r = report.info(path, req)
        assert r.valid, r.reasons
        assert r.component == "transformer_2"
        assert any("component set to transformer_2" in n for n in r.notes), r.notes
    assert not report.info(path, metadata.Request(scheme="fp8")).valid


def test_loader_component_input_is_last_with_a_tooltip(comfy):
    _, pack = comfy
    spec = pack.nodes.load_node.PrequantLoadTransformer.INPUT_TYPES()["optional"]
    assert list(spec)[-1] == "component"
    choices, opts = spec["component"]
    assert choices[0] == opts["default"] == "transformer" and "transformer_2" in choices
    assert "high noise" in opts["tooltip"] and "low noise" in opts["tooltip"]
    build_spec = pack.nodes.build_node.PrequantBuildCheckpoint.INPUT_TYPES()["optional"]
    assert list(build_spec)[-1] == "component" and build_spec["component"][1]["default"] == "transformer"


def test_builder_records_the_component(tmp_path):
    fam = families.get(A14B)
    name = builder.default_filename(fam.hosting.base_repos[0], "fp8", "safetensors", "transformer_2")
    res = builder.build(dense(A14B, 1), builder.Target(str(tmp_path / name)),
                        builder.Recipe("fp8", family=fam, component="transformer_2"))
    assert res.metadata["component"] == "transformer_2"
    assert os.path.basename(res.path) == "Wan2.2-T2V-A14B-Diffusers-transformer_2-FP8.safetensors"
    with pytest.raises(BuildError, match="has no component 'transformer_3'"):
        builder.build(dense(A14B, 1), builder.Target(str(tmp_path / "x.safetensors")),
                      builder.Recipe("fp8", family=fam, component="transformer_3"))
    with pytest.raises(BuildError, match="has no component"):  # single-transformer families have none other
        builder.build(dense(TI2V, 0), builder.Target(str(tmp_path / "y.safetensors")),
                      builder.Recipe("fp8", family=families.get(TI2V), component="transformer_2"))
    # the command line: --component, and the default name it gives the second expert's file
    from prequant_core import cli, formats
    from safetensors.torch import save_file
    src = str(tmp_path / "dense_expert2.safetensors")
    save_file(dense(A14B, 1), src)
    assert cli.main(["build", "-i", src, "-o", str(tmp_path), "--scheme", "int8", "--family", A14B,
                     "--component", "transformer_2", "-q"]) == 0
    out = tmp_path / "Wan2.2-T2V-A14B-Diffusers-transformer_2-INT8.safetensors"
    assert formats.read(str(out)).metadata["component"] == "transformer_2"


def test_hub_names_of_the_nvfp4_repos():
    """Unsloth's video repos hold NVFP4 files only: the presets offer nvfp4, each expert and each HunyuanVideo 1.5
    variant has its own declared file, tried first."""
    labels = {p.label: p for p in sources.presets()}
    for label, repo in (("Wan2.2-TI2V-5B / nvfp4", "unsloth/Wan2.2-TI2V-5B-NVFP4"),
                        ("Wan2.2-T2V-A14B / nvfp4", "unsloth/Wan2.2-T2V-A14B-NVFP4"),
                        ("HunyuanVideo-1.5 / nvfp4", "unsloth/HunyuanVideo-1.5-NVFP4")):
        assert labels[label].repo == repo and labels[label].scheme == "nvfp4"
        assert label.replace("nvfp4", "int8") not in labels and label.replace("nvfp4", "fp8") not in labels

    def first(*a, **kw):
        return sources.plan(sources.Wanted(None, *a, **kw)).candidates[0].filenames[0]

    assert first(None, TI2V, "nvfp4") == "Wan2.2-TI2V-5B-NVFP4.pt"
    assert first(None, A14B, "nvfp4") == "Wan2.2-T2V-A14B-NVFP4.pt"
    assert first(None, A14B, "nvfp4", component="transformer_2") == "Wan2.2-T2V-A14B-transformer_2-NVFP4.pt"
    assert first(preset="Wan2.2-T2V-A14B / nvfp4", component="transformer_2") == \
        "Wan2.2-T2V-A14B-transformer_2-NVFP4.pt"
    hy = families.get("hunyuanvideo-1.5")
    assert first(None, hy.name, "nvfp4", base_model_id=hy.hosting.base_repos[1]) == \
        "HunyuanVideo-1.5-Diffusers-720p_t2v-NVFP4.pt"
    assert first(preset="HunyuanVideo-1.5 / nvfp4", base_model_id="HunyuanVideo-1.5-Diffusers-480p_t2v") == \
        "HunyuanVideo-1.5-Diffusers-480p_t2v-NVFP4.pt"
    chain = sources.plan(sources.Wanted(None, None, hy.name, "nvfp4",
                                        base_model_id=hy.hosting.base_repos[1])).candidates[0].filenames
    assert "HunyuanVideo-1.5-Diffusers-480p_t2v-NVFP4.pt" not in chain, "never the other variant's file"
    # int8 / fp8 are not hosted there: the family step plans nothing and says why
    p = sources.plan(sources.Wanted(None, None, TI2V, "int8"))
    assert not p and "nvfp4 only" in p.notes[0]
    # a file of either expert, named by a workflow the user has no file for yet, is found on the repo
    assert sources.hosted_source("Wan2.2-T2V-A14B-transformer_2-NVFP4.pt").repo == "unsloth/Wan2.2-T2V-A14B-NVFP4"
    assert sources.hosted_source("HunyuanVideo-1.5-Diffusers-720p_t2v-NVFP4.pt").family == hy.name


# ---------------------------------------------------------------------------------------------------------------
# Video-length latents on the low-VRAM path: the weights stream through the cast path (ComfyUI's partial load) on
# every forward; repeated runs must give the full-load output and must not grow the process.

LONG_LATENT = (1, 48, 31, 16, 16)  # 31 latent frames (Wan 2.2's 121-frame clip), 1984 tokens in the tiny model
RUNS, WARMUP = 8, 2
RSS_GROWTH_LIMIT = 24 * 2**20


def _rss() -> int:
    import psutil
    gc.collect()
    quantize.release_free_memory()
    return psutil.Process().memory_info().rss


def test_long_video_latent_on_the_low_vram_path_does_not_grow(comfy, prequant_dir, request):
    import comfy.model_management as mm
    t = tf.TINY[TI2V]
    path = os.path.join(prequant_dir, f"{t.file_stem}-INT8.safetensors")
    builder.build_from_tensors(dense(TI2V, 0), builder.Target(path, overwrite=True),
                               builder.Recipe("int8", family=families.get(TI2V), base_model_id=t.base_model_id))
    name = "video/" + os.path.basename(path)
    ctx, extra = tf.conditioning(TI2V)
    x = torch.randn(LONG_LATENT, generator=torch.Generator().manual_seed(3))

    def forward(patcher):
        m = patcher.model
        with torch.inference_mode():
            conds = m.extra_conds(cross_attn=ctx, noise=x, device=x.device, **extra)
            return m.apply_model(x, torch.tensor([0.6]), **{k: v.cond for k, v in conds.items()})

    full_model = _load(comfy, name)["result"][0]
    mm.unload_all_models()
    with torch.inference_mode():
        full_model.load(full_model.load_device, force_patch_weights=False, full_load=True)
    full = forward(full_model)
    del full_model
    mm.unload_all_models()

    model = _load(comfy, name)["result"][0]
    with torch.inference_mode():
        model.load(model.load_device, lowvram_model_memory=1, force_patch_weights=False, full_load=False)
    dm = model.model.diffusion_model
    streamed = [n for n, m in dm.named_modules() if getattr(m, "comfy_cast_weights", False)
                and getattr(m, "prequant_spec", None)]
    assert len(streamed) >= 8, "the quantized Linears should be on the streaming (cast) path"
    rss = []
    for _ in range(RUNS):
        out = forward(model)
        assert torch.equal(out, full), "the low-VRAM path must give the full-load output"
        del out
        rss.append(_rss())
    assert all(getattr(dm.get_submodule(n), "comfy_cast_weights", False) for n in streamed)
    base, tail = statistics.median(rss[WARMUP:WARMUP + 3]), statistics.median(rss[-3:])
    latent_mib = x.numel() * 4 / 2**20
    line = (f"[rss] {RUNS} forwards of a {LONG_LATENT} latent ({latent_mib:.1f} MiB) with {len(streamed)} quantized "
            f"Linears streamed: first {rss[0] / 2**20:.0f} MiB, after warm-up {base / 2**20:.0f} MiB, last "
            f"{rss[-1] / 2**20:.0f} MiB, growth {(tail - base) / 2**20:.1f} MiB")
    print("\n" + line)
    assert tail - base < RSS_GROWTH_LIMIT, line
    assert max(rss[WARMUP:]) - base < 2 * RSS_GROWTH_LIMIT, line


# ---------------------------------------------------------------------------------------------------------------
# Building from ComfyUI's own dense video MODEL (ComfyUI layout) gives the file built from the diffusers weights:
# our key maps invert exactly (HunyuanVideo 1.5's fused qkv rows included), and the family is told from the shapes
# where Wan 2.2's two families share class and names.

@pytest.mark.parametrize("family", [A14B, TI2V, "hunyuanvideo-1.5"])
def test_build_node_from_a_dense_comfyui_model_equals_the_diffusers_build(comfy, prequant_dir, family):
    from prequant_core import formats
    from prequant_core.schemes import qtensor
    nodes, pack = comfy
    fam = families.get(family)
    d = dense(family, 0)
    model = pack.nodes.comfy_model.build_patcher(fam, "diffusers", dict(d))  # dense, ComfyUI's class and names
    assert "blocks.0.attn1.to_q.weight" not in model.model.diffusion_model.state_dict()
    name = f"from-comfy-{family}-INT8.safetensors"
    with torch.inference_mode():
        res = nodes.NODE_CLASS_MAPPINGS["PrequantBuildCheckpoint"]().build(
            pack.nodes.build_node.NO_FILE, "int8", 512, "", "auto", name, "safetensors", True, model=model)
    ck = formats.read(res["result"][0])
    assert ck.metadata["family"] == family and ck.metadata["base_model_id"] == fam.hosting.base_repos[0]
    want, _ = quantize.quantize_tensors(d, "int8", exclude=schemes.exclude_tokens("int8", fam.arch.int8_exclude_extra))
    assert set(ck.tensors) == set(want)
    for k, w in want.items():
        got = ck.tensors[k]
        assert qtensor.is_quantized(got) == qtensor.is_quantized(w), k
        if qtensor.is_quantized(w):
            (gq, gs, gspec), (wq, ws, wspec) = qtensor.split(got), qtensor.split(w)
            assert torch.equal(gq, wq) and torch.equal(gs, ws) and gspec == wspec, k
        else:
            assert torch.equal(got, w.to(got.dtype)), k
    # a dense diffusers file without a family field: the family from its shapes too
    out = builder.build(d, builder.Target(os.path.join(prequant_dir, f"auto-{family}-FP8.safetensors"), overwrite=True),
                        builder.Recipe("fp8"))
    assert out.family == family
