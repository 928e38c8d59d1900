"""Build Prequant Checkpoint: core builder, the ComfyUI node (on the real ComfyUI, headless) and the command line.

Round trips are checked against load-time quantization of the same dense weights (no file) through the same ComfyUI
model path: the sampler output must be identical (max abs diff 0).
"""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import BASE_ID, ROOT, sample
from prequant_core import builder, families, formats, schemes
from prequant_core.formats import checkpoint, dense_sources
from prequant_core.load import opening, metadata
from prequant_core.formats import fingerprint
from prequant_core.builder import output_file, writers
from prequant_core.schemes import qtensor, quantize
from prequant_core.errors import BuildError, UnknownFamilyError
from tools import tiny_models

PY = sys.executable
NONE = "(none: use path or hub_repo)"
NO_FILE = "(none: use the model input)"
DENSE_NAME = "tiny-zimage-dense-diffusers.safetensors"
DENSE_COMFY_NAME = "tiny-zimage-dense-comfyui.safetensors"


# ---------------------------------------------------------------------------------------------------------------
# helpers and fixtures
# ---------------------------------------------------------------------------------------------------------------

def build_node(comfy):
    nodes, _ = comfy
    return nodes.NODE_CLASS_MAPPINGS["PrequantBuildCheckpoint"]()


def run_build_node(comfy, **kw):
    args = dict(dense_file=NO_FILE, scheme="int8", min_features=512, base_model_id=BASE_ID, family="auto",
                filename="", container="safetensors", overwrite=False)
    args.update(kw)
    with torch.inference_mode():  # as ComfyUI runs every node
        return build_node(comfy).build(**args)


def load_file(comfy, path, **kw):
    nodes, _ = comfy
    with torch.inference_mode():
        return nodes.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]().load(NONE, path=str(path), **kw)["result"][0]


def cli(*args, timeout=240, **kw):
    return subprocess.run([PY, "-m", "prequant_core", *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, **kw)


def prequant_dir():
    import folder_paths
    d = folder_paths.get_folder_paths("prequant")[0]
    os.makedirs(d, exist_ok=True)
    return d


def temps_in(folder):
    return sorted(f for f in os.listdir(folder) if f.startswith(output_file.TEMP_PREFIX) and f.endswith(output_file.TEMP_SUFFIX))


def assert_same_tensors(a: dict, b: dict):
    assert list(sorted(a)) == list(sorted(b))
    for k in a:
        x, y = a[k], b[k]
        assert qtensor.is_quantized(x) == qtensor.is_quantized(y), k
        if qtensor.is_quantized(x):
            qx, sx, spx = qtensor.split(x)
            qy, sy, spy = qtensor.split(y)
            assert qx.dtype == qy.dtype and torch.equal(qx.view(torch.uint8), qy.view(torch.uint8)), k
            assert sx.dtype == sy.dtype and torch.equal(sx, sy), k
            assert spx == spy, k
        else:
            assert x.dtype == y.dtype and torch.equal(x, y), k


@pytest.fixture(scope="module")
def dense_files(comfy, models_dir, zimage_dense):
    """The tiny dense Z-Image in models/diffusion_models, in diffusers and in ComfyUI key layout."""
    d = os.path.join(models_dir, "diffusion_models")
    os.makedirs(d, exist_ok=True)
    diff = tiny_models.save_dense_safetensors(zimage_dense, os.path.join(d, DENSE_NAME))
    comfy_sd = tiny_models.zimage_comfy_layout(zimage_dense)
    com = tiny_models.save_dense_safetensors(comfy_sd, os.path.join(d, DENSE_COMFY_NAME))
    return {"diffusers": diff, "comfyui": com}


@pytest.fixture(scope="module")
def small_dense(tmp_path_factory):
    """A few real-width Linear weights under Z-Image's diffusers names: for tests about files, not about models."""
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(1)
    sd = {f"layers.0.attention.{p}.weight": torch.randn(512, 512, generator=g).bfloat16() for p in ("to_q", "to_k", "to_v")}
    sd["layers.0.attention_norm1.weight"] = torch.ones(512, dtype=torch.bfloat16)
    sd["x_pad_token"] = torch.zeros(1, 512, dtype=torch.bfloat16)
    path = str(tmp_path_factory.mktemp("small_dense") / "small.safetensors")
    save_file(sd, path)
    return path


@pytest.fixture(scope="module")
def reference(comfy, zimage_dense):
    """Sampler output of load-time quantization: same dense weights quantized in memory, no file."""
    _, pack = comfy
    fam = families.get("z-image")
    cache = {}

    def ref(scheme):
        if scheme not in cache:
            q, skipped = quantize.quantize_tensors(zimage_dense, scheme, exclude=schemes.exclude_tokens(scheme))
            meta = builder.make_metadata(builder.Recipe(scheme, family=fam, base_model_id=BASE_ID, min_features=512,
                                                        exclude=schemes.exclude_tokens(scheme)),
                                         q)
            cache[scheme] = (sample(pack.nodes.comfy_model.build_patcher(fam, "diffusers", q)), meta)
        return cache[scheme]
    return ref


@pytest.fixture(scope="module")
def node_built(comfy, dense_files):
    """Factory: (scheme, container) -> file written by the node from the diffusers dense file, cached."""
    cache = {}

    def make(scheme, container):
        if (scheme, container) not in cache:
            out = run_build_node(comfy, dense_file=DENSE_NAME, scheme=scheme, container=container,
                                 filename=f"rt-{scheme}-{container}", overwrite=True)
            cache[(scheme, container)] = out
        return cache[(scheme, container)]["result"][0]
    return make


# ---------------------------------------------------------------------------------------------------------------
# round trip: node build -> Load Prequant Transformer -> sampler == load-time quantization
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("scheme", ["int8", "fp8"])
@pytest.mark.parametrize("container", ["safetensors", "pt"])
def test_round_trip_equals_load_time_quantization(comfy, node_built, reference, scheme, container):
    path = node_built(scheme, container)
    assert os.path.dirname(path) == prequant_dir() and path.endswith(builder.EXTENSIONS[container])
    assert os.path.basename(path) in comfy[0].NODE_CLASS_MAPPINGS["PrequantLoadTransformer"].INPUT_TYPES()[
        "required"]["checkpoint"][0], "the built file must show up in the loader's list"
    out = sample(load_file(comfy, path, base_model_id=BASE_ID, scheme=scheme))
    ref, _ = reference(scheme)
    assert torch.isfinite(out).all()
    assert (out - ref).abs().max().item() == 0.0, "built file must equal load-time quantization bit for bit"


@pytest.mark.parametrize("scheme", ["int8", "fp8"])
@pytest.mark.parametrize("container", ["safetensors", "pt"])
def test_built_file_passes_validation_and_carries_every_field(node_built, zimage_dense, scheme, container):
    path = node_built(scheme, container)
    req = metadata.Request(scheme=scheme, base_model_id=BASE_ID, min_features=512, family="z-image")
    opened = opening.open_checkpoint(path, req, model_dirs=[os.path.dirname(path)])
    assert opened.verdict.ok and opened.layout == "diffusers" and opened.family.name == "z-image"
    ck = opened.checkpoint
    m = ck.metadata
    assert ck.format_tag == "unsloth_prequant_transformer_state_dict_v1"
    # Unsloth's current builder writes fp8_granularity for fp8 only, every other field always, in its order
    want = [f for f in metadata.FIELDS if f != "fp8_granularity" or scheme == "fp8"]
    assert set(want) <= set(m), set(want) - set(m)
    assert list(m)[:len(want)] == [f for f in checkpoint.WRITE_ORDER if f in want]
    assert all(m[f] is not None for f in want if f not in ("fast_accum", "fp8_granularity"))
    rule = schemes.rules(scheme)
    assert (m["base_model_id"], m["family"], m["scheme"], m["component"]) == (BASE_ID, "z-image", scheme, "transformer")
    assert m["min_features"] == 512 and m["exclude_name_tokens"] == schemes.exclude_tokens(scheme)
    assert (m["require_bf16"], m["require_divisible"], m["fast_accum"], m.get("fp8_granularity")) == \
        (rule.require_bf16, rule.require_divisible, rule.fast_accum, rule.fp8_granularity)
    assert m["torch_dtype"] == "bfloat16" and m["quant_backend"] == "torchao"
    assert m["transformer_class"] == "ZImageTransformer2DModel"
    import torchao
    from importlib.metadata import version
    assert (m["torch_version"], m["torchao_version"], m["diffusers_version"]) == \
        (str(torch.__version__), torchao.__version__, version("diffusers"))
    for f in ("torch_version", "torchao_version", "diffusers_version"):
        assert type(m[f]) is str, f  # never TorchVersion: strict weights_only readers refuse that class
    fp = m["fingerprint"]
    assert fp["algo"] == "md5-packed-v1" and fp["count"] == len(ck.quantized_keys) > 0
    assert fingerprint.verify(ck.tensors, fp) == []
    # as Unsloth lists them: every ".weight" not quantized is skipped (norms too); every Linear weight is one of the
    # two; keys are diffusers names
    weights = {k for k in ck.tensors if k.endswith(".weight")}
    assert set(fp["skipped"]) == weights - set(ck.quantized_keys) and set(fp["modules"]) == set(ck.quantized_keys)
    assert set(tiny_models.linear_weight_keys(zimage_dense)) <= set(ck.quantized_keys) | set(fp["skipped"])
    assert set(ck.tensors) == set(zimage_dense)


@pytest.mark.parametrize("scheme", ["int8", "fp8"])
def test_pt_and_safetensors_load_bit_identical(node_built, scheme):
    st = formats.read(node_built(scheme, "safetensors"))
    pt = formats.read(node_built(scheme, "pt"))
    assert_same_tensors(st.tensors, pt.tensors)
    assert json.dumps(st.metadata, sort_keys=True) == json.dumps(pt.metadata, sort_keys=True)
    assert len(st.quantized_keys) > 10


def test_streamed_safetensors_is_what_torchao_and_safetensors_read(node_built, tmp_path):
    """The streaming writer's header equals the container's reference ``flatten``; safetensors and torchao read it."""
    from safetensors import safe_open
    from torchao.prototype.safetensors.safetensors_support import unflatten_tensor_state_dict
    from prequant_core.formats.containers.safetensors_container import flatten, read_header
    path = node_built("int8", "safetensors")
    ck = formats.read(path)
    tensors = {k: ck.tensors[k] for k in json.loads(read_header(path)[1]["tensor_names"])}
    tensors.update({k: v for k, v in ck.tensors.items() if k not in tensors})
    flat_ref, header_ref = flatten(tensors, format_tag=ck.format_tag, metadata=ck.metadata)
    out = writers.write_checkpoint(str(tmp_path / "again.safetensors"), tensors, ck.metadata)
    index, header, _ = read_header(out)
    assert header == header_ref
    with safe_open(out, framework="pt") as f:
        raw = {k: f.get_tensor(k) for k in f.keys()}
    assert set(raw) == set(flat_ref) == set(index)
    for k, v in flat_ref.items():
        assert raw[k].dtype == v.dtype and torch.equal(raw[k].view(torch.uint8), v.view(torch.uint8)), k
    for name, e in index.items():  # every tensor starts aligned to its element size
        assert e["data_offsets"][0] % raw[name].element_size() == 0, name
    dotted = {k: v for k, v in raw.items() if not k.startswith("unsloth_root::")}
    rebuilt, left = unflatten_tensor_state_dict(dotted, header)
    assert not left
    assert_same_tensors(rebuilt, {k: v for k, v in ck.tensors.items() if "." in k})


def test_two_builds_are_deterministic(dense_files, node_built, reference, tmp_path):
    events = []
    a = builder.build(dense_files["diffusers"], builder.Target(tmp_path / "a.safetensors"), builder.Recipe("int8"),
                      progress=lambda *e: events.append(e))
    b = formats.read(node_built("int8", "safetensors"))  # the node's build of the same file, earlier
    assert a.fingerprint == b.metadata["fingerprint"] and a.fingerprint["count"] == a.quantized > 0
    with open(a.path, "rb") as fa, open(node_built("int8", "safetensors"), "rb") as fb:
        assert fa.read() == fb.read(), "same input, same bytes"
    # and the same as quantizing the in-memory state dict (load-time quantization)
    assert reference("int8")[1]["fingerprint"]["modules"] == a.fingerprint["modules"]
    assert a.estimated_bytes >= a.file_bytes > 0.95 * a.estimated_bytes - output_file.HEADER_SLACK
    # a progress event per tensor while quantizing, then the writes, ending complete
    q = [e for e in events if e[0] == "quantize"]
    w = [e for e in events if e[0] == "write"]
    assert [e[1] for e in q] == list(range(1, a.tensors + 1)) and all(e[2] == a.tensors for e in q)
    assert w and w[-1][1] == w[-1][2] and events.index(w[0]) > events.index(q[-1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_row_chunked_quantization_is_the_same_tensor(dtype):
    """The builder bounds torchao's temporaries by quantizing big weights in row blocks: same codes, scales, zero
    points and attributes as quantizing the whole weight at once."""
    from torchao.prototype.safetensors.safetensors_utils import TensorSubclassAttributeJSONEncoder
    g = torch.Generator().manual_seed(3)
    w = (torch.randn(1056, 768, generator=g) * 2).to(dtype)  # both dims divisible by 32 (MX blocks)
    w[3] = 0
    w[9, :4] = 1e4
    for scheme in schemes.names():
        whole = schemes.quantize_weight(w.to(torch.bfloat16).contiguous(), scheme)
        got, skipped = quantize.quantize_one("blk.proj.weight", w, schemes.LayerFilter(scheme, 512, ()),
                                          chunk_elems=100 * 768)  # 11 row blocks, the last one short
        assert not skipped and type(got) is type(whole), scheme
        for name in ("qdata", "scale", "zero_point"):
            a, b = getattr(whole, name, None), getattr(got, name, None)
            assert (a is None) == (b is None), (scheme, name)
            if a is not None:
                assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8)), (scheme, name)
        assert json.dumps(whole, cls=TensorSubclassAttributeJSONEncoder) == \
            json.dumps(got, cls=TensorSubclassAttributeJSONEncoder), scheme


def test_key_map_row_permutations_are_undone():
    """Map entries with a row transform (ComfyUI's swap_scale_shift, as a function or by name) are undone on the way
    back to diffusers names; a transform that is not its own inverse is refused."""
    from prequant_core.families.keymap import ROW_PERMUTATIONS
    comfy_sd = {"final.mod.weight": torch.arange(8.0).repeat(4, 1).T.contiguous(), "final.mod.bias": torch.arange(8.0)}
    src = dense_sources.MemorySource(comfy_sd)
    kmap = {"norm_out.linear.weight": ("final.mod.weight", None, ROW_PERMUTATIONS["swap_scale_shift"]),
            "norm_out.linear.bias": ("final.mod.bias", None, "swap_scale_shift")}
    out = dict(dense_sources.RemappedSource(src, kmap).items())
    assert out["norm_out.linear.bias"].tolist() == [4, 5, 6, 7, 0, 1, 2, 3]
    assert out["norm_out.linear.weight"][:, 0].tolist() == [4, 5, 6, 7, 0, 1, 2, 3]
    with pytest.raises(BuildError, match="own inverse"):
        dense_sources.RemappedSource(src, {"x.weight": ("final.mod.weight", None, lambda t: t.roll(1, 0)),
                                   "x.bias": "final.mod.bias"})
    with pytest.raises(BuildError, match="no diffusers name"):
        dense_sources.RemappedSource(src, {"x.bias": "final.mod.bias"})


# ---------------------------------------------------------------------------------------------------------------
# input layouts: ComfyUI-layout file, stock ComfyUI MODEL, diffusers folder (command line)
# ---------------------------------------------------------------------------------------------------------------

def test_comfyui_layout_file_is_converted_with_comfyuis_key_map(comfy, dense_files, node_built, tmp_path):
    comfy_utils = importlib.import_module("comfy.utils")
    fam = families.get("z-image")
    ref = formats.read(node_built("fp8", "safetensors"))  # built from the diffusers-layout file
    # the node: file from diffusion_models in ComfyUI layout
    out = run_build_node(comfy, dense_file=DENSE_COMFY_NAME, scheme="fp8", filename="from-comfy-layout",
                         overwrite=True)["result"][0]
    got = formats.read(out)
    assert got.metadata["fingerprint"]["modules"] == ref.metadata["fingerprint"]["modules"]
    assert_same_tensors(got.tensors, ref.tensors)
    assert not any(".qkv." in k for k in got.tensors), "output keys are diffusers names"
    # streamed remapping == the in-memory remap of the whole dict
    src = dense_sources.SafetensorsSource([dense_files["comfyui"]])
    shapes = {k: i.shape for k, i in src.infos().items()}
    kmap = comfy_utils.z_image_to_diffusers(fam.config_from_shapes(shapes))
    streamed = dict(dense_sources.RemappedSource(src, kmap).items())
    in_memory = tiny_models.comfy_to_diffusers(dict(src.items()), kmap)
    assert list(streamed) and sorted(streamed) == sorted(in_memory)
    assert all(torch.equal(streamed[k], in_memory[k]) for k in streamed)
    # without ComfyUI's key map the core refuses and says how to get one
    with pytest.raises(BuildError, match="key map") as e:
        builder.build(dense_files["comfyui"], builder.Target(tmp_path / "nomap.safetensors"), builder.Recipe("fp8"))
    assert "--comfyui" in str(e.value) and not os.path.exists(tmp_path / "nomap.safetensors")


def stock_comfy_model(path):
    """A MODEL made by ComfyUI's own loading code, exactly as ``comfy.sd.load_diffusion_model`` (what UNETLoader
    calls) builds it, except for the detection step: ComfyUI 0.3.75 only recognises Z-Image at dim 3840 and would
    call this tiny 1536-wide model Lumina 2, so the model config is ComfyUI's own ``supported_models.ZImage`` with
    the unet config read from the shapes. File reading, dtype choice, model construction, weight loading and the
    ModelPatcher are ComfyUI's real code."""
    import comfy.model_management as mm
    import comfy.model_patcher
    import comfy.supported_models
    import comfy.utils
    sd = comfy.utils.load_torch_file(path)
    unet_config = families.get("z-image").config_from_shapes({k: tuple(v.shape) for k, v in sd.items()})
    model_config = comfy.supported_models.ZImage(unet_config)
    load_device, offload_device = mm.get_torch_device(), mm.unet_offload_device()
    unet_dtype = mm.unet_dtype(model_params=comfy.utils.calculate_parameters(sd),
                               supported_dtypes=list(model_config.supported_inference_dtypes),
                               weight_dtype=comfy.utils.weight_dtype(sd))
    model_config.set_inference_dtype(unet_dtype, mm.unet_manual_cast(unet_dtype, load_device,
                                                                      model_config.supported_inference_dtypes))
    model = model_config.get_model(sd, "").to(offload_device)
    model.load_model_weights(sd, "")
    return comfy.model_patcher.ModelPatcher(model, load_device=load_device, offload_device=offload_device)


def test_an_unused_skeleton_tensor_holding_garbage_does_not_stop_a_build(comfy, dense_files, reference):
    """ComfyUI leaves a skeleton entry the file does not provide as allocated memory (Z-Image's norm_final, unused
    by its forward): whatever it holds, even NaN, is not the dense input's, so the build neither reads nor refuses
    it, and the output matches load-time quantization of the original weights."""
    model = stock_comfy_model(dense_files["comfyui"])
    dm = model.model.diffusion_model
    # ComfyUI 0.3.75 / 0.12.1 keep an unused norm_final; 0.33 dropped it: there, the unused entry is another
    # skeleton tensor the dense file does not provide, if any (the build must still match load-time quantization)
    unused = [n for n, t in dm.state_dict().items() if n not in tiny_models.zimage_comfy_layout(
        tiny_models.zimage_dense(seed=0)) and t.is_floating_point()]
    assert ("norm_final.weight" in unused) == hasattr(dm, "norm_final")
    with torch.no_grad():
        for n in unused:
            dm.get_parameter(n).fill_(float("nan")) if n in dict(dm.named_parameters()) else dm.get_buffer(n).fill_(
                float("nan"))
    res = run_build_node(comfy, model=model, scheme="int8", filename="garbage-unused.safetensors", overwrite=True)
    ck = formats.read(res["result"][0])
    ref, ref_meta = reference("int8")
    assert ck.metadata["fingerprint"]["modules"] == ref_meta["fingerprint"]["modules"]
    assert "norm_final.weight" not in ck.tensors


def test_node_builds_from_a_stock_comfyui_model(comfy, dense_files, reference):
    """MODEL loaded by ComfyUI's own code from a ComfyUI-layout dense file -> node -> loader -> same sampler output
    as load-time quantization of the original diffusers weights."""
    comfy_utils = importlib.import_module("comfy.utils")
    model = stock_comfy_model(dense_files["comfyui"])
    assert type(model).__name__ == "ModelPatcher"
    hook_calls = []
    old = comfy_utils.PROGRESS_BAR_HOOK
    comfy_utils.set_progress_bar_global_hook(lambda value, total, preview, node_id=None: hook_calls.append((value, total)))
    try:
        res = run_build_node(comfy, model=model, scheme="int8", filename="from-stock-model.safetensors",
                             overwrite=True)
    finally:
        comfy_utils.set_progress_bar_global_hook(old)
    path = res["result"][0]
    assert res["ui"]["prequant_build"][0]["input_layout"] == "comfyui"
    # ComfyUI 0.33's ProgressBar sends an update at most every few ms (first and last always): fewer calls reach the
    # hook there, the same per-layer updates are made
    throttled = hasattr(comfy_utils.ProgressBar(1), "_last_update_time")
    assert len(hook_calls) > (3 if throttled else 20) and hook_calls[-1][0] == hook_calls[-1][1], \
        "progress per layer, ending complete"
    assert [v for v, _ in hook_calls] == sorted(v for v, _ in hook_calls), "progress only moves forward"
    assert [v for v, _ in hook_calls] == sorted(v for v, _ in hook_calls)
    ck = formats.read(path)
    assert "layers.0.attention.to_q.weight" in ck.tensors and not any(".qkv." in k for k in ck.tensors)
    out = sample(load_file(comfy, path, scheme="int8"))
    ref, ref_meta = reference("int8")
    assert ck.metadata["fingerprint"]["modules"] == ref_meta["fingerprint"]["modules"]
    assert (out - ref).abs().max().item() == 0.0


def test_node_builds_from_comfyuis_own_unetloader(comfy, models_dir, tmp_path):
    """The stock "Load Diffusion Model" (UNETLoader) node, detection included, on a real-width Z-Image (dim 3840,
    the only width ComfyUI 0.3.75 recognises; one main layer, ComfyUI's default two refiner layers of each kind)."""
    import gc
    from safetensors.torch import load_file, save_file
    from diffusers import ZImageTransformer2DModel
    nodes, _ = comfy
    with torch.device("meta"):
        shapes = {k: (tuple(v.shape), v.ndim) for k, v in ZImageTransformer2DModel(
            dim=3840, n_layers=1, n_refiner_layers=2, n_heads=30, n_kv_heads=30, axes_dims=[32, 48, 48],
            cap_feat_dim=2560).state_dict().items()}
    g = torch.Generator().manual_seed(5)
    dense = {k: (torch.randn(shape, generator=g) / (shape[1] ** 0.5 if nd == 2 else 1)).to(torch.bfloat16)
             for k, (shape, nd) in shapes.items()}
    name = "real-width-zimage-comfyui.safetensors"
    path = os.path.join(models_dir, "diffusion_models", name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    save_file(tiny_models.zimage_comfy_layout(dense), path)
    del dense
    gc.collect()
    try:
        with torch.inference_mode():
            model = nodes.NODE_CLASS_MAPPINGS["UNETLoader"]().load_unet(name, "default")[0]
        assert type(model.model.model_config).__name__ == "ZImage"
        out = run_build_node(comfy, model=model, scheme="int8", filename="from-unetloader", overwrite=True)
        built = out["result"][0]
        del model
        gc.collect()
        comfy_utils = importlib.import_module("comfy.utils")
        sd = load_file(path)
        fam = families.get("z-image")
        kmap = comfy_utils.z_image_to_diffusers(fam.config_from_shapes({k: tuple(v.shape) for k, v in sd.items()}))
        diff = tiny_models.comfy_to_diffusers(sd, kmap)
        q, skipped = quantize.quantize_tensors(diff, "int8", exclude=schemes.exclude_tokens("int8"))
        ck = formats.read(built)
        assert ck.metadata["fingerprint"]["modules"] == fingerprint.compute(q)["modules"] and len(ck.quantized_keys) > 20
        assert set(ck.tensors) == set(q)
        for k, v in ck.tensors.items():
            if not qtensor.is_quantized(v):
                assert torch.equal(v, q[k]), k
    finally:
        os.remove(path)
        with contextlib.suppress(OSError):
            os.remove(os.path.join(prequant_dir(), "from-unetloader.safetensors"))


def test_node_refuses_a_model_loaded_prequantized(comfy, node_built):
    model = load_file(comfy, node_built("int8", "safetensors"))
    with pytest.raises(BuildError, match="already pre-quantized"):
        run_build_node(comfy, model=model, filename="never.safetensors")
    assert not os.path.exists(os.path.join(prequant_dir(), "never.safetensors"))


def test_node_input_and_filename_rules(comfy, dense_files):
    before = sorted(os.listdir(prequant_dir()))
    for bad in ("../escape", "sub/dir.safetensors", "sub\\dir", "..", ".hidden", "/abs/x.safetensors", "a..b"):
        with pytest.raises(BuildError, match="plain file name"):
            run_build_node(comfy, dense_file=DENSE_NAME, filename=bad)
    with pytest.raises(BuildError, match="extension"):
        run_build_node(comfy, dense_file=DENSE_NAME, filename="x.pt", container="safetensors")
    with pytest.raises(BuildError, match="Nothing to build"):
        run_build_node(comfy)
    with pytest.raises(BuildError, match="Both"):
        run_build_node(comfy, dense_file=DENSE_NAME, model=object())
    assert sorted(os.listdir(prequant_dir())) == before
    types = build_node(comfy).INPUT_TYPES()
    assert DENSE_NAME in types["required"]["dense_file"][0]
    assert types["required"]["min_features"][1]["default"] == 512 and not types["required"]["overwrite"][1]["default"]
    assert set(schemes.names()) == set(types["required"]["scheme"][0])
    nodes, _ = comfy
    cls = nodes.NODE_CLASS_MAPPINGS["PrequantBuildCheckpoint"]
    assert cls.OUTPUT_NODE and cls.CATEGORY == "loaders/prequant" and cls.RETURN_TYPES == ("STRING",)
    assert nodes.NODE_DISPLAY_NAME_MAPPINGS["PrequantBuildCheckpoint"] == "Build Prequant Checkpoint"


def test_default_filename_follows_the_hub_naming(comfy, dense_files):
    out = run_build_node(comfy, dense_file=DENSE_NAME, scheme="fp8", base_model_id="", overwrite=True)
    path = out["result"][0]
    assert os.path.basename(path) == "Z-Image-Turbo-FP8.safetensors"
    assert formats.read(path).metadata["base_model_id"] == "Tongyi-MAI/Z-Image-Turbo"


def make_diffusers_folder(root, dense: dict, shards: int = 2) -> str:
    """A diffusers model root: transformer/config.json + sharded weights + index json."""
    from safetensors.torch import save_file
    t = os.path.join(root, "transformer")
    os.makedirs(t)
    cfg = {"_class_name": "ZImageTransformer2DModel", "_diffusers_version": "0.38.0", **tiny_models.ZIMAGE_TINY}
    with open(os.path.join(t, "config.json"), "w") as f:
        json.dump(cfg, f)
    keys = list(dense)
    wmap = {}
    for i in range(shards):
        name = f"diffusion_pytorch_model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: dense[k].contiguous() for k in keys[i::shards]}
        save_file(part, os.path.join(t, name))
        wmap.update({k: name for k in part})
    with open(os.path.join(t, dense_sources.INDEX_NAME), "w") as f:
        json.dump({"metadata": {}, "weight_map": wmap}, f)
    return root


def test_cli_builds_a_sharded_diffusers_folder(tmp_path, zimage_dense, reference):
    root = make_diffusers_folder(str(tmp_path / "Z-Image-Turbo"), zimage_dense)
    out = tmp_path / "out"
    out.mkdir()
    r = cli("build", "--input", root, "--output", out, "--scheme", "fp8", "--base-model-id", BASE_ID)
    assert r.returncode == 0, r.stderr[-3000:]
    path = r.stdout.strip().splitlines()[-1]
    assert path == str(out / "Z-Image-Turbo-FP8.safetensors")
    stages = r.stderr.strip().split("\n")[-2:]  # piped: one line per stage, when it is done
    assert stages[0].startswith("quantizing ") and stages[1].startswith("writing "), r.stderr[-2000:]
    ck = opening.open_checkpoint(path, metadata.Request(scheme="fp8", base_model_id=BASE_ID),
                                model_dirs=[str(out)]).checkpoint
    assert ck.metadata["transformer_class"] == "ZImageTransformer2DModel" and set(ck.tensors) == set(zimage_dense)
    assert ck.metadata["fingerprint"]["modules"] == reference("fp8")[1]["fingerprint"]["modules"], "same codes as load-time quantization"
    for k, v in ck.tensors.items():
        if not qtensor.is_quantized(v):
            assert v.dtype == torch.bfloat16 and torch.equal(v, zimage_dense[k]), k
    # existing output: refused with the documented exit code, file untouched
    before = os.stat(path)
    r2 = cli("build", "--input", root, "--output", path, "--scheme", "fp8", "--quiet")
    assert r2.returncode == 2 and "already exists" in r2.stderr and "--overwrite" in r2.stderr  # the fix names the switch
    assert os.stat(path).st_mtime_ns == before.st_mtime_ns
    # a single shard picked directly means the whole folder (the node lists shards, not folders)
    shard = os.path.join(root, "transformer", "diffusion_pytorch_model-00001-of-00002.safetensors")
    src = dense_sources.open_input(shard).source
    assert len(src.files) == 2 and set(src.infos()) == set(zimage_dense)
    assert src.hints["transformer_class"] == "ZImageTransformer2DModel"


def test_cli_help_documents_every_option():
    r = cli("build", "--help", timeout=120)
    assert r.returncode == 0, r.stderr
    for opt in ("--input", "--output", "--scheme", "--min-features", "--base-model-id", "--family", "--container",
                "--overwrite", "--comfyui", "--quiet"):
        assert opt in r.stdout, opt
    for word in list(schemes.names()) + sorted(families.FAMILIES) + ["safetensors", "pt", "default: 512"]:
        assert word in r.stdout, word


# ---------------------------------------------------------------------------------------------------------------
# refusals and failures
# ---------------------------------------------------------------------------------------------------------------

def test_existing_output_refused_and_overwrite_replaces(small_dense, tmp_path):
    dest = tmp_path / "exists.safetensors"
    dest.write_bytes(b"precious")
    t0 = time.time()
    with pytest.raises(BuildError, match="already exists") as e:
        builder.build(small_dense, builder.Target(dest), builder.Recipe("int8"))
    assert time.time() - t0 < 5, "refused before reading or quantizing anything"
    assert e.value.path == str(dest) and e.value.fix
    assert dest.read_bytes() == b"precious" and not temps_in(tmp_path)
    res = builder.build(small_dense, builder.Target(dest, overwrite=True), builder.Recipe("int8"))
    assert formats.read(res.path).metadata["scheme"] == "int8" and not temps_in(tmp_path)


def test_node_refuses_existing_output(comfy, node_built):
    path = node_built("int8", "pt")
    before = os.stat(path)
    with pytest.raises(BuildError, match="already exists"):
        run_build_node(comfy, dense_file=DENSE_NAME, filename=os.path.basename(path), container="pt")
    assert os.stat(path).st_mtime_ns == before.st_mtime_ns


def test_disk_space_is_checked_before_writing(small_dense, tmp_path, monkeypatch):
    folder = tmp_path / "small"
    folder.mkdir()
    dest = folder / "x.safetensors"
    # the free space ComfyUI's disk would report, set at the estimated output size's boundary
    seen = {}

    def probe(estimate_offset):
        def free(path):
            seen["folder"] = path
            return seen["estimate"] + estimate_offset
        return free
    est, n_q = output_file.estimate_output_bytes(dense_sources.open_input(small_dense).source.infos(),
                                           schemes.LayerFilter("int8", 512, tuple(schemes.exclude_tokens("int8"))))
    seen["estimate"] = est
    with pytest.raises(BuildError, match="Not enough free disk space") as e:
        monkeypatch.setattr(output_file, "default_free_space", probe(-1))
        builder.build(small_dense, builder.Target(dest), builder.Recipe("int8"))
    assert seen["folder"] == str(folder) and e.value.expected and e.value.found and e.value.fix
    assert os.listdir(folder) == []
    monkeypatch.setattr(output_file, "default_free_space", probe(0))
    res = builder.build(small_dense, builder.Target(dest), builder.Recipe("int8"))
    assert res.file_bytes <= est and n_q == res.quantized


def test_disk_space_on_a_real_small_filesystem(small_dense, tmp_path):
    """A 256 KiB tmpfs: shutil.disk_usage refuses up front; with the check bypassed, the real ENOSPC during the write
    is reported the same way and leaves no partial file."""
    mnt = tmp_path / "tiny_fs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()}); the injected probe test covers the check")
    try:
        with pytest.raises(BuildError, match="Not enough free disk space"):
            builder.build(small_dense, builder.Target(mnt / "x.safetensors"), builder.Recipe("int8"))
        assert os.listdir(mnt) == []
        with pytest.raises(BuildError, match="disk filled up"), pytest.MonkeyPatch.context() as mp:
            mp.setattr(output_file, "default_free_space", lambda p: 1 << 40)
            builder.build(small_dense, builder.Target(mnt / "x.safetensors"), builder.Recipe("int8"))
        assert os.listdir(mnt) == [], "partial file removed"
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_unknown_family_is_refused_with_the_list(tmp_path):
    from safetensors.torch import save_file
    p = str(tmp_path / "mystery.safetensors")
    save_file({"blocks.0.proj.weight": torch.zeros(512, 512, dtype=torch.bfloat16)}, p)
    with pytest.raises(UnknownFamilyError) as e:
        builder.build(p, builder.Target(tmp_path / "o.safetensors"), builder.Recipe("int8"))
    assert "z-image" in str(e.value) and e.value.expected
    with pytest.raises(UnknownFamilyError, match="z-image"):
        builder.build(p, builder.Target(tmp_path / "o.safetensors"), builder.Recipe("int8", family="not-a-family"))
    with pytest.raises(BuildError, match="do not look like Z-Image"):
        builder.build(p, builder.Target(tmp_path / "o.safetensors"), builder.Recipe("int8", family="z-image"))
    assert sorted(os.listdir(tmp_path)) == ["mystery.safetensors"]


def test_prequantized_input_is_refused(node_built, tmp_path):
    with pytest.raises(BuildError, match="already"):
        builder.build(node_built("int8", "safetensors"), builder.Target(tmp_path / "again.safetensors"),
                      builder.Recipe("int8"))
    with pytest.raises(BuildError, match="already"):
        builder.build(formats.read(node_built("fp8", "pt")).tensors, builder.Target(tmp_path / "again.safetensors"),
                      builder.Recipe("fp8"))


def _dense_many_tensors(path, n_layers=120):
    """A dense file with Z-Image key names and many Linear weights: a write long enough to be caught inside."""
    from safetensors.torch import save_file
    sd = {}
    for i in range(n_layers):
        for p in ("to_q", "to_k", "to_v"):
            sd[f"layers.{i}.attention.{p}.weight"] = torch.ones(512, 512, dtype=torch.bfloat16)
    save_file(sd, path)


def test_killed_build_leaves_no_file_and_temps_do_not_accumulate(small_dense, tmp_path):
    """SIGKILL mid-write: no destination file. Its temp file is left (nothing runs on SIGKILL) and the next build in
    that folder removes it, while temps of live builds are kept."""
    src = str(tmp_path / "many.safetensors")
    _dense_many_tensors(src)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    dest = out_dir / "killed.safetensors"
    # Kill point: the temp file beside the destination holds bytes (the write has begun; 360 weights take a while);
    # the child is stopped there, checked to be still inside the write, then killed.
    proc = subprocess.Popen([PY, "-m", "prequant_core", "build", "--input", src, "--output", str(dest),
                             "--family", "z-image"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 300
        while True:
            assert time.time() < deadline and proc.poll() is None, "the build ended before its write was seen"
            tmps = temps_in(out_dir)
            try:
                if tmps and os.path.getsize(out_dir / tmps[0]) > 0:
                    break
            except FileNotFoundError:  # renamed into place between the listing and the stat: caught too late
                pass
            time.sleep(0.002)
        os.kill(proc.pid, signal.SIGSTOP)
        assert proc.poll() is None and not dest.exists(), "child must still be inside the write"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    assert not dest.exists(), "a killed build must not leave a destination file"
    left = temps_in(out_dir)
    assert len(left) == 1 and os.path.getsize(out_dir / left[0]) > 0, "killed mid-write"
    # a live build's temp (pid of a running process) must survive the cleanup
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        live = out_dir / f".prequant-{output_file._host_tag()}-{sleeper.pid}-abc123.partial"
        live.write_bytes(b"in progress")
        res = builder.build(small_dense, builder.Target(out_dir / "next.safetensors"), builder.Recipe("int8"))
        assert os.path.exists(res.path) and not dest.exists()
        assert temps_in(out_dir) == [live.name], "the dead build's temp is removed, the live one kept"
    finally:
        sleeper.kill()
        sleeper.wait()
    assert output_file.clean_stale_temps(str(out_dir)) == [str(live)]
    assert temps_in(out_dir) == []


def test_cli_finds_the_comfyui_it_is_installed_in_for_comfyui_native_output(comfy, dense_files, tmp_path):
    """Round 5: ``build --container comfyui-native`` from a diffusers-layout Z-Image needed ``--comfyui DIR``, which
    no page named. Run from ``ComfyUI/custom_nodes/ComfyUI-Prequant`` (as a shell there sets $PWD) it finds that
    ComfyUI's key map; from elsewhere it says which option to add and where it is found by itself."""
    from tools.comfy_headless import COMFY, link_pack
    link_pack(COMFY)
    inside = os.path.join(COMFY, "custom_nodes", "ComfyUI-Prequant")
    out = tmp_path / "native.safetensors"
    r = subprocess.run([PY, "-m", "prequant_core", "build", "-i", dense_files["diffusers"], "-o", str(out),
                        "--scheme", "fp8", "--container", "comfyui-native", "--quiet"], cwd=inside,
                       env={**os.environ, "PWD": inside, "PYTHONPATH": inside}, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    ck = formats.read(str(out))
    assert ck.container == "comfyui-native" and any(".qkv." in k for k in ck.tensors)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = subprocess.run([PY, "-m", "prequant_core", "build", "-i", dense_files["diffusers"], "-o",
                        str(tmp_path / "no.safetensors"), "--scheme", "fp8", "--container", "comfyui-native",
                        "--quiet"], cwd=str(elsewhere), env={**os.environ, "PWD": str(elsewhere), "PYTHONPATH": ROOT},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "--comfyui DIR" in r.stderr and "custom_nodes" in r.stderr, r.stderr[-2000:]
