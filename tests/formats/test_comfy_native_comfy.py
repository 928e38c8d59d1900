"""ComfyUI's own quantized files on the real ComfyUI (0.3.75 here; scripts/test.sh runs this file on 0.12.1 too):

* read: a tiny FLUX.1 in ComfyUI's key layout, every block Linear written by ComfyUI's writer restated with
  comfy-kitchen's own quantizer (tests/comfy_quantizer.py), in each format whose math this pack runs, loads through
  Load Prequant Transformer; each layer's weight as the pack computes with it equals ComfyUI's own dequantization of
  the same bytes, and sampling stays close to the dense model;
* write: Build Prequant Checkpoint's ``comfyui-native`` output loads with ComfyUI's stock Load Diffusion Model
  (``UNETLoader``) where the running ComfyUI knows the format (float8_e4m3fn on 0.3.75; float8_e4m3fn and nvfp4 on
  0.12.1), and samples as this pack's own load of the same file does.
"""
from __future__ import annotations

import os

import pytest
import torch

import comfy_quantizer as cq
from prequant_core import families
from prequant_core.schemes import qtensor
from tools import comfy_headless, tiny_families as tf

FAMILY = "flux.1"
# the stock loader builds its model from ComfyUI's own detection, which hard-codes FLUX.1's 24 heads (a tiny FLUX is
# not a FLUX to it) but reads Wan's width from the weights: the write test uses the tiny Wan 2.2 A14B expert
WRITE_FAMILY = "wan2.2-t2v-a14b"
READ_FORMATS = [("float8_e4m3fn", {}), ("float8_e5m2", {}), ("nvfp4", {}), ("mxfp8", {}),
                ("int8_tensorwise", {"per_row": True}), ("int8_tensorwise", {"convrot": 256})]


def _version() -> tuple:
    return tuple(int(x) for x in comfy_headless.comfyui_version().split(".")[:3])


def _tiny(comfy, family):
    """A tiny model: dense in ComfyUI's key layout, and the dense model's sampler output."""
    _, pack = comfy
    fam = families.get(family)
    dense = tf.dense(family, seed=0)
    shapes = {k: tuple(v.shape) for k, v in dense.items()}
    comfy_sd = pack.nodes.comfy_model.diffusers_to_comfy(fam, dense, fam.config_from_shapes(shapes))
    ref = tf.sample(pack.nodes.comfy_model.build_patcher(fam, "comfyui", dict(comfy_sd)), family)
    return comfy_sd, ref


@pytest.fixture(scope="module")
def flux(comfy):
    return _tiny(comfy, FAMILY)


@pytest.fixture(scope="module")
def wan(comfy):
    return _tiny(comfy, WRITE_FAMILY)


def _block_linears(sd: dict, mult: int = 32) -> list[str]:
    return [k[:-len(".weight")] for k, v in sd.items() if k.endswith(".weight") and v.ndim == 2
            and ("blocks." in k) and v.shape[0] % 16 == 0 and v.shape[1] % mult == 0 and min(v.shape) >= 64]


def _folder(sub: str) -> str:
    import folder_paths
    d = os.path.join(folder_paths.get_folder_paths("diffusion_models")[0], sub)
    os.makedirs(d, exist_ok=True)
    return d


@pytest.mark.parametrize("fmt,opts", READ_FORMATS, ids=[f + ("-convrot" if o.get("convrot") else "")
                                                        for f, o in READ_FORMATS])
def test_comfyui_native_files_load_through_the_node_as_comfyui_dequantizes_them(comfy, flux, fmt, opts):
    nodes, _ = comfy
    comfy_sd, dense_out = flux
    layers = {n: (fmt, opts) for n in _block_linears(comfy_sd, 256 if opts.get("convrot") else 32)}
    name = f"native-{fmt}{'-convrot' if opts.get('convrot') else ''}.safetensors"
    path = os.path.join(_folder("native"), name)
    made = cq.write(path, comfy_sd, layers, style="both")
    with torch.inference_mode():
        res = nodes.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]().load("diffusion_models/native/" + name, family=FAMILY)
    model = res["result"][0]
    s = res["ui"]["prequant"][0]
    assert s["container"] == "comfyui-native" and s["family"] == FAMILY and s["quantized_layers"] == len(layers)
    assert any("ComfyUI-native file" in n for n in s["notes"]), s["notes"]
    dm = model.model.diffusion_model
    for layer, (parts, cfg) in made.items():
        m = dm.get_submodule(layer)
        got = qtensor.dense_from_parts(m.prequant_parts(), m.prequant_spec, torch.float32)
        want = cq.dequantize_layer(parts, cfg)
        assert torch.equal(got, want), f"{layer}: max |pack - ComfyUI| = {(got - want).abs().max().item()}"
    out = tf.sample(model, FAMILY)
    rel = ((out - dense_out).norm() / dense_out.norm()).item()
    print(f"\n[{fmt}{' convrot' if opts.get('convrot') else ''}] {len(layers)} layers equal ComfyUI's dequantization; "
          f"sampled rel. error vs dense {rel:.4f}; matmul: {res['ui']['prequant'][0].get('matmul')}")
    assert torch.isfinite(out).all() and rel < (0.3 if fmt == "nvfp4" else 0.1)


@pytest.mark.parametrize("scheme", ["fp8", "nvfp4"])
def test_build_nodes_comfyui_native_output_loads_in_stock_comfyui(comfy, wan, scheme):
    """Where the running ComfyUI's own loader knows the format (fp8: 0.3.68+, nvfp4: 0.8.0+)."""
    nodes, pack = comfy
    name = _build(nodes, wan, scheme)
    if scheme == "nvfp4" and _version() < (0, 8, 0):
        # this ComfyUI's stock loader has no nvfp4 (its quant table raises); this pack's loader reads the file, and the
        # 0.12.1 leg runs the stock nvfp4 load
        with pytest.raises(Exception), torch.inference_mode():
            nodes.NODE_CLASS_MAPPINGS["UNETLoader"]().load_unet(name, "default")
        with torch.inference_mode():
            ours = nodes.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]().load("diffusion_models/" + name)["result"][0]
        assert torch.isfinite(tf.sample(ours, WRITE_FAMILY)).all()
        return
    with torch.inference_mode():  # as ComfyUI runs every node
        stock = nodes.NODE_CLASS_MAPPINGS["UNETLoader"]().load_unet(name, "default")[0]
        ours = nodes.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]().load("diffusion_models/" + name)["result"][0]
    a, b = tf.sample(stock, WRITE_FAMILY), tf.sample(ours, WRITE_FAMILY)
    dense_out = wan[1]
    diff = ((a - b).norm() / b.norm()).item()
    rel = ((a - dense_out).norm() / dense_out.norm()).item()
    print(f"\n[native {scheme}, ComfyUI {comfy_headless.comfyui_version()}] stock Load Diffusion Model vs this pack, "
          f"same file: rel. difference {diff:.2e} (stock vs dense {rel:.4f})")
    assert torch.isfinite(a).all() and type(stock.model.model_config).__name__ in families.get(WRITE_FAMILY).comfy_models
    assert diff < 1e-3, "stock ComfyUI and this pack must compute the same model from the same file"


def test_a_native_build_from_a_model_in_the_graph_writes_what_the_dense_file_gives(comfy, wan):
    """Build Prequant Checkpoint with a MODEL input (the dense model in ComfyUI's own class) and container
    comfyui-native: the MODEL's own state dict (ComfyUI's layout already) quantized the way ComfyUI's quantizer does,
    tensor for tensor the file the same node writes from the dense file itself."""
    from safetensors.torch import load_file
    nodes, pack = comfy
    from_file = _build(nodes, wan, "fp8")
    model = pack.nodes.comfy_model.build_patcher(families.get(WRITE_FAMILY), "comfyui", dict(wan[0]))
    with torch.inference_mode():
        res = nodes.NODE_CLASS_MAPPINGS["PrequantBuildCheckpoint"]().build(
            dense_file="(none: use the model input)", scheme="fp8", min_features=64,
            base_model_id="Wan-AI/Wan2.2-T2V-A14B-Diffusers", family=WRITE_FAMILY, filename="from-model.safetensors",
            container="comfyui-native", overwrite=True, model=model)
    info = res["ui"]["prequant_build"][0]
    assert info["container"] == "comfyui-native" and info["input_layout"] == "comfyui", info
    a = load_file(os.path.join(_folder("."), from_file))
    b = load_file(info["path"])
    assert sorted(a) == sorted(b) and any(k.endswith(".comfy_quant") for k in b)
    assert all(torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)) if a[k].element_size() == 1 else
               torch.equal(a[k], b[k]) for k in a)


RENAMED = [  # (a module of the tiny FLUX in ComfyUI's layout, the attribute the damaged file stores its tensor as)
    ("double_blocks.0.txt_attn.qkv", "scale"),  # its bias (the image stream's tells the config there are biases)
    ("double_blocks.0.txt_attn.norm.query_norm", "gamma"),  # its scale (.weight in ComfyUI 0.33's names)
    ("single_blocks.0.norm.key_norm", "bias"),
    ("double_blocks.0.img_mlp.0", "scale"),  # its bias
]


@pytest.mark.parametrize("module,attr", RENAMED, ids=[f"{m.split('.', 2)[-1]}.{a}" for m, a in RENAMED])
def test_a_native_file_with_a_renamed_tensor_is_a_damaged_file_not_a_version_mismatch(comfy, flux, module, attr):
    """Issue 58 #4: a ComfyUI-native file (ComfyUI's writer restated) with one tensor stored under another attribute
    name of the same module was reported as 'a ComfyUI and pack version mismatch' with 'Update ComfyUI-Prequant':
    the check compared module names only. No ComfyUI release made these renames (the one it did make, FLUX's q/k
    norms .scale -> .weight, is the family's data: the next test), so the file is refused as damaged, naming the
    tensor it holds."""
    from prequant_core.errors import ComfyVersionError, CorruptCheckpointError
    nodes, _ = comfy
    comfy_sd, _ = flux
    # the module's one non-weight tensor (a bias, or a norm's scale as this ComfyUI's map names it)
    (name,) = [k for k in comfy_sd if k.startswith(module + ".") and k.count(".") == module.count(".") + 1
               and (k.endswith(".bias") or "norm" in module)]
    stored = f"{module}.{attr}"
    sd = {(stored if k == name else k): v for k, v in comfy_sd.items()}
    layers = {n: ("float8_e4m3fn", {}) for n in _block_linears(comfy_sd)}
    fname = f"renamed-{stored.replace('.', '-')}.safetensors"
    path = os.path.join(_folder("native"), fname)
    cq.write(path, sd, layers)
    try:
        with pytest.raises(CorruptCheckpointError) as e, torch.inference_mode():
            nodes.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]().load("diffusion_models/native/" + fname,
                                                                         family=FAMILY)
    finally:
        os.remove(path)
    msg = str(e.value)
    assert not isinstance(e.value, ComfyVersionError) and stored in msg and fname in msg, msg
    assert "Update ComfyUI" not in msg, msg


def test_a_rename_a_comfyui_release_made_stays_a_version_mismatch(comfy, flux):
    """The rename ComfyUI 0.33 made (FLUX's q/k norms: '.scale' before, '.weight' since; the family's
    ``comfy_renames``): tensors named as the other side of it are a version mismatch naming the release, whichever
    side this ComfyUI is on, and never a damaged file."""
    from prequant_core.errors import ComfyVersionError, CorruptCheckpointError
    from prequant_core.families import FAMILIES
    from prequant_core.load import placement
    _, pack = comfy
    cm = pack.nodes.comfy_model
    fam = families.get(FAMILY)
    comfy_sd, _ = flux
    model_config, _ = cm.model_config_for(fam, comfy_sd)
    ours = model_config.process_unet_state_dict(dict(comfy_sd))  # this ComfyUI's names
    model = model_config.get_model({}, "", device=torch.device("meta")).diffusion_model
    assert set(ours) == set(model.state_dict())
    (rename,) = fam.arch.comfy_renames
    flipped = {}
    for k, v in ours.items():
        module, _, attr = k.rpartition(".")
        other = rename.counterpart(module, attr)
        flipped[f"{module}.{other}" if other else k] = v
    assert len(set(flipped) - set(ours)) >= 4  # every q/k norm of the tiny FLUX (double and single blocks)
    with pytest.raises(ComfyVersionError) as e:
        cm.check_names_match(model, flipped, fam, "/models/flux.safetensors")
    msg = str(e.value)
    assert "ComfyUI 0.33.0 renamed" in msg and "not a damaged file" in msg and "/models/flux.safetensors" in msg, msg
    older = cm._older_than(cm.comfy_version(), rename.since)
    assert ("Update ComfyUI to 0.33.0" in e.value.fix) == older, e.value.fix
    # the renamed names plus one tensor no release ever named: a damaged file, not a version mismatch (left to the
    # placement's own check, which names the tensors)
    extra = {**flipped, "double_blocks.0.img_attn.norm.query_norm.bias": torch.zeros(1)}
    assert cm.check_names_match(model, extra, fam, "/models/flux.safetensors") is None
    with pytest.raises(CorruptCheckpointError) as e:
        placement.assign(model, extra, path="/models/flux.safetensors")
    assert "query_norm.bias" in str(e.value) and e.value.path == "/models/flux.safetensors"
    # and the renames are data: only the families built from ComfyUI's FLUX layers carry this one
    assert {f.name for f in FAMILIES.values() if rename in f.arch.comfy_renames} == {
        "flux.1", "flux.2-klein", "flux.2-dev", "hunyuanimage-2.1", "hunyuanvideo-1.5"}


def test_a_pre_quant_scale_on_an_fp8_layer_is_ignored_as_stock_comfyui_ignores_it(comfy, wan):
    """Issue 58 #8: a ComfyUI-native fp8 file (ComfyUI's writer restated) whose layers carry ``pre_quant_scale`` (an
    nvfp4-only parameter in ComfyUI 0.33: its loader drops it on every other format) was refused by the node as a
    file for another model size. The node loads it, says what it ignored, and samples what stock Load Diffusion
    Model samples from the same file."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    nodes, _ = comfy
    comfy_sd, _ = wan
    layers = {n: ("float8_e4m3fn", {}) for n in _block_linears(comfy_sd)}
    name = "native-fp8-pre-quant-scale.safetensors"
    path = os.path.join(_folder("."), name)
    cq.write(path, comfy_sd, layers, style="both")  # ComfyUI 0.3.75 reads the header's marking only
    with safe_open(path, "pt") as f:
        sd, meta = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    for n in layers:  # far from 1, so that a layer applying it would compute visibly another function
        sd[n + ".pre_quant_scale"] = torch.full((comfy_sd[n + ".weight"].shape[1],), 3.0, dtype=torch.bfloat16)
    save_file(sd, path, metadata=meta)
    try:
        with torch.inference_mode():
            stock = nodes.NODE_CLASS_MAPPINGS["UNETLoader"]().load_unet(name, "default")[0]
            res = nodes.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]().load("diffusion_models/" + name)
    finally:
        os.remove(path)
    ours = res["result"][0]
    notes = res["ui"]["prequant"][0]["notes"]
    assert any(f"{len(layers)} pre_quant_scale entries" in n for n in notes), notes
    a, b = tf.sample(stock, WRITE_FAMILY), tf.sample(ours, WRITE_FAMILY)
    assert torch.isfinite(a).all()
    diff = ((a - b).norm() / b.norm()).item()
    assert diff < 1e-3, f"stock ComfyUI and this pack must compute the same model from the same file: {diff}"


def test_a_native_build_from_a_diffusers_layout_dense_file_writes_what_the_comfyui_layout_file_gives(comfy, wan):
    """Build Prequant Checkpoint, container comfyui-native, from a dense file in diffusers' layout (as Unsloth's and
    diffusers' dense files are): mapped to ComfyUI's names first, tensor for tensor the file the same node writes from
    the same weights in ComfyUI's layout."""
    from safetensors.torch import load_file, save_file
    nodes, _ = comfy
    from_comfy_layout = load_file(os.path.join(_folder("."), _build(nodes, wan, "fp8")))
    dense_name = "wan-tiny-dense-diffusers.safetensors"
    save_file({k: v.contiguous() for k, v in tf.dense(WRITE_FAMILY, seed=0).items()},
              os.path.join(_folder("."), dense_name))
    with torch.inference_mode():
        res = nodes.NODE_CLASS_MAPPINGS["PrequantBuildCheckpoint"]().build(
            dense_file=dense_name, scheme="fp8", min_features=64, base_model_id="Wan-AI/Wan2.2-T2V-A14B-Diffusers",
            family="auto", filename="from-diffusers-layout.safetensors", container="comfyui-native", overwrite=True)
    info = res["ui"]["prequant_build"][0]
    assert info["container"] == "comfyui-native" and info["input_layout"] == "diffusers", info
    got = load_file(info["path"])
    assert sorted(got) == sorted(from_comfy_layout) and any(k.endswith(".comfy_quant") for k in got)
    assert all(torch.equal(got[k], from_comfy_layout[k]) for k in got)


def _build(nodes, tiny, scheme: str) -> str:
    """Build Prequant Checkpoint, container comfyui-native, from a dense file in models/diffusion_models."""
    from safetensors.torch import save_file
    comfy_sd, _ = tiny
    dense_name = "wan-tiny-dense.safetensors"
    dense_path = os.path.join(_folder("."), dense_name)
    if not os.path.exists(dense_path):
        save_file({k: v.contiguous() for k, v in comfy_sd.items()}, dense_path)
    res = nodes.NODE_CLASS_MAPPINGS["PrequantBuildCheckpoint"]().build(
        dense_file=dense_name, scheme=scheme, min_features=64, base_model_id="Wan-AI/Wan2.2-T2V-A14B-Diffusers",
        family=WRITE_FAMILY, filename="", container="comfyui-native", overwrite=True)
    info = res["ui"]["prequant_build"][0]
    assert info["container"] == "comfyui-native" and info["quantized_layers"] >= 4, info
    assert os.path.samefile(os.path.dirname(info["path"]), _folder("."))  # where Load Diffusion Model looks
    return info["file"]


@pytest.mark.parametrize("fmt,suffix", [("int8_tensorwise", "_scale"), ("nvfp4", "_scale_2")])
def test_a_native_file_with_a_nan_scale_is_refused_by_the_node(comfy, flux, fmt, suffix):
    """Issue 39 #1: the node used to load it and sample a NaN latent; now the reader's tensor boundary refuses it
    with the pack's typed error, naming the file and the layer."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    from prequant_core.errors import CorruptCheckpointError
    nodes, _ = comfy
    comfy_sd, _ = flux
    layers = {n: (fmt, {}) for n in _block_linears(comfy_sd)}
    name = f"nan-{fmt}.safetensors"
    path = os.path.join(_folder("native"), name)
    cq.write(path, comfy_sd, layers)
    with safe_open(path, "pt") as f:
        sd, meta = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    poisoned = sorted(layers)[0]
    sd[poisoned + ".weight" + suffix] = torch.full_like(sd[poisoned + ".weight" + suffix], float("nan"))
    save_file(sd, path, metadata=meta)
    with pytest.raises(CorruptCheckpointError) as e, torch.inference_mode():
        nodes.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]().load("diffusion_models/native/" + name, family=FAMILY)
    assert "not finite" in str(e.value) and poisoned in str(e.value) and name in str(e.value), str(e.value)


def test_the_build_node_never_shadows_a_users_model(comfy, wan, tmp_path):
    """Issue 39 #3: a native build named like a model in another diffusion_models folder would be resolved first by
    every loader; it is refused, overwrite or not, and nothing is written."""
    import folder_paths
    from prequant_core.errors import BuildError
    nodes, _ = comfy
    _build(nodes, wan, "fp8")  # the dense input file in the first folder
    other = tmp_path / "more_models"
    other.mkdir()
    folder_paths.add_model_folder_path("diffusion_models", str(other))
    try:
        name = "users-own-model.safetensors"
        (other / name).write_bytes(b"the user's own model")
        target = os.path.join(_folder("."), name)
        for overwrite in (False, True):
            with pytest.raises(BuildError) as e:
                nodes.NODE_CLASS_MAPPINGS["PrequantBuildCheckpoint"]().build(
                    dense_file="wan-tiny-dense.safetensors", scheme="fp8", min_features=64,
                    base_model_id="Wan-AI/Wan2.2-T2V-A14B-Diffusers", family=WRITE_FAMILY, filename=name,
                    container="comfyui-native", overwrite=overwrite)
            assert "would shadow it" in str(e.value) and str(other / name) in str(e.value), str(e.value)
            assert not os.path.exists(target) and (other / name).read_bytes() == b"the user's own model"
    finally:
        folder_paths.folder_names_and_paths["diffusion_models"][0].remove(str(other))
