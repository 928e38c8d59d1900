"""Inputs at the nodes' edges (issue 61: node lines no test ran), in the real ComfyUI: Build Prequant Checkpoint with
two inputs, a CLIP asked for ComfyUI's native layout, a MODEL whose family nothing can tell (a stub patcher, as
DEVELOPING's entry has it) or whose ComfyUI class two families share, a MODEL without a diffusion model; the
loader's list with an unreadable .safetensors in diffusion_models; an API prompt still passing the removed hf_token;
PREQUANT_MATMUL=quantized on fp8 layers whose codes are e5m2 (ComfyUI-native float8_e5m2), which torchao's fp8 matmul
does not take; a quantized tensor for something other than a Linear's weight; a ComfyUI encoder file assigned beside a
pre-cast one (non-strict) and the pre-cast one (strict) into ComfyUI's real CLIP-L class."""
from __future__ import annotations

import logging
import os
import shutil
import types

import pytest
import torch

from conftest import NONE, load_path

NO_FILE = "(none: use the model input)"


def _build(comfy):
    return comfy[1].nodes.build_node.PrequantBuildCheckpoint()


def _args(**kw):
    """Build Prequant Checkpoint's required inputs (int8, safetensors), as ComfyUI passes them."""
    a = dict(dense_file=NO_FILE, scheme="int8", min_features=512, base_model_id="", family="auto", filename="",
             container="safetensors", overwrite=False)
    a.update(kw)
    return a


@pytest.fixture(scope="module")
def clip(comfy, tmp_path_factory):
    """Load CLIP's CLIP of a (randomised) CLIP-L file: a real CLIP the Build node can be handed."""
    from comfy import sd as comfy_sd
    from tools import tiny_assets
    path = tiny_assets.write_clip(str(tmp_path_factory.mktemp("clip") / tiny_assets.CLIP_NAME))
    return comfy_sd.load_clip(ckpt_paths=[path], clip_type=comfy_sd.CLIPType.STABLE_DIFFUSION)


@pytest.fixture(scope="module")
def dense_model(comfy, zimage_dense):
    from prequant_core import families
    return comfy[1].nodes.comfy_model.build_patcher(families.get("z-image"), "diffusers", dict(zimage_dense))


def test_a_clip_with_a_model_or_a_dense_file_is_refused_naming_both(comfy, clip, dense_model):
    from prequant_core.errors import BuildError
    for extra in ({"model": dense_model}, {"dense_file": "some-dense.safetensors"}):
        with pytest.raises(BuildError) as e:
            _build(comfy).build(**_args(**extra), clip=clip)
        assert e.value.message == "A CLIP and a model input (or a dense_file) are set; the node builds from one.", extra
        assert "disconnect the CLIP" in e.value.fix


def test_a_clip_asked_for_comfyuis_native_layout_is_refused_before_anything_is_read(comfy, clip, models_dir):
    from prequant_core.errors import BuildError
    before = sorted(os.listdir(os.path.join(models_dir, "prequant")))
    with pytest.raises(BuildError) as e:
        _build(comfy).build(**_args(container="comfyui-native"), clip=clip)
    assert e.value.message.startswith("A text encoder is written in Unsloth's format")
    assert e.value.found == "comfyui-native" and e.value.expected == "safetensors / pt"
    assert e.value.fix == "Set container to safetensors."
    assert sorted(os.listdir(os.path.join(models_dir, "prequant"))) == before


def _stub_model(config, diffusion_model=None):
    """A MODEL as far as the Build node reads one (``.model.model_config``, ``.model.diffusion_model``): the stub
    patcher DEVELOPING names for these lines."""
    inner = types.SimpleNamespace(model_config=config)
    if diffusion_model is not None:
        inner.diffusion_model = diffusion_model
    return types.SimpleNamespace(model=inner, patches={})


class UnknownConfig:  # a ComfyUI model config class no family lists
    pass


def test_a_model_of_no_known_class_and_unknown_keys_is_refused_asking_for_the_family(comfy):
    from prequant_core.errors import UnknownFamilyError
    bn = comfy[1].nodes.build_node
    stub = _stub_model(UnknownConfig(), torch.nn.Sequential(torch.nn.Linear(8, 8)))
    with pytest.raises(UnknownFamilyError) as e:
        _build(comfy).build(**_args(), model=stub)  # no base_model_id: the node asks the family for the file name
    assert e.value.message == "Could not tell which model family this MODEL is."
    assert e.value.found == "ComfyUI model config 'UnknownConfig'" and e.value.fix == "Pick the family on the node."
    assert e.value.expected  # what detection looked for
    assert bn.model_family(stub, "z-image").name == "z-image", "a named family is taken as named"


def test_a_class_two_families_share_with_unreadable_keys_is_the_first_family_listing_it(comfy):
    """ComfyUI's WAN21_T2V config serves both Wan 2.2 families this pack knows; where the weights' names do not tell
    them apart (here: no Wan key at all), the first family listing the class is taken, not a refusal."""
    from comfy import supported_models
    from prequant_core import families
    bn = comfy[1].nodes.build_node
    cfg = supported_models.WAN21_T2V({"image_model": "wan2.1", "model_type": "t2v"})  # ComfyUI's own class
    listing = [f for f in families.FAMILIES.values() if "WAN21_T2V" in f.comfy_models]
    assert len(listing) == 2
    stub = _stub_model(cfg, torch.nn.Sequential(torch.nn.Linear(8, 8)))
    assert bn.model_family(stub, "auto") is listing[0]


def test_a_model_without_a_diffusion_model_is_refused(comfy, models_dir):
    from prequant_core.errors import BuildError
    stub = _stub_model(UnknownConfig())
    with pytest.raises(BuildError) as e:
        _build(comfy).build(**_args(family="z-image"), model=stub)
    assert e.value.message == "This MODEL has no diffusion model to build from."
    assert e.value.found == "SimpleNamespace"
    assert not os.path.exists(os.path.join(models_dir, "prequant", "Z-Image-Turbo-INT8.safetensors"))


def test_an_unreadable_safetensors_in_diffusion_models_is_not_offered_to_the_loader(comfy, models_dir,
                                                                                      prequant_files):
    """The loader lists a diffusion_models .safetensors when its header says it is pre-quantized; one whose header
    cannot be read is not offered to it (the Build node's dense list still shows it: its read says what is wrong),
    while a real pre-quantized file beside it is."""
    _, pack = comfy
    paths, bn = pack.nodes.paths, pack.nodes.build_node
    folder = os.path.join(models_dir, "diffusion_models")
    os.makedirs(folder, exist_ok=True)
    garbage = os.path.join(folder, "prequant-test-garbage.safetensors")
    with open(garbage, "wb") as f:
        f.write(b"\xff" * 64)  # a header length no file has
    good = os.path.join(folder, "prequant-test-Z-Image-Turbo-INT8.safetensors")
    shutil.copy(prequant_files("int8"), good)
    try:
        listed, dense, build_list = paths.choices(), paths.dense_choices(), bn.dense_file_choices()
        listed_again = paths.choices()  # from the header cache: the same answer
    finally:
        os.remove(garbage)
        os.remove(good)
    assert "diffusion_models/prequant-test-garbage.safetensors" not in listed
    assert "diffusion_models/prequant-test-Z-Image-Turbo-INT8.safetensors" in listed
    assert listed_again == listed
    assert "prequant-test-garbage.safetensors" in dense and "prequant-test-garbage.safetensors" in build_list
    assert "prequant-test-Z-Image-Turbo-INT8.safetensors" not in dense + build_list


def test_an_api_prompt_passing_the_removed_hf_token_loads_and_never_logs_it(comfy, prequant_files, allow_dir, caplog):
    """hf_token was removed from the loader; an API-format prompt saved before still passes it. The load goes on,
    and the log names the input, never its value."""
    path = prequant_files("int8")
    allow_dir(os.path.dirname(path))
    secret = "hf_NotARealTokenButSecret1234"
    with caplog.at_level(logging.INFO, logger="prequant"):
        model = load_path(comfy, path, hf_token=secret)
    assert model.model.diffusion_model is not None
    told = [r.getMessage() for r in caplog.records if "removed input" in r.getMessage()]
    assert len(told) == 1 and "hf_token" in told[0] and "HF_TOKEN" in told[0], told
    assert not any(secret in r.getMessage() for r in caplog.records)


def test_a_quantized_tensor_for_anything_but_a_linear_weight_is_refused(comfy, prequant_files, allow_dir):
    """Only a Linear's weight may be quantized (e.g. a file quantizing Z-Image's x_pad_token is refused, not read as
    garbage): the module's class and attribute are named."""
    ops = comfy[1].nodes.ops
    path = prequant_files("int8")
    allow_dir(os.path.dirname(path))
    layer = load_path(comfy, path).model.diffusion_model.layers[0].feed_forward.w1
    t = layer.weight
    with pytest.raises(TypeError, match=r"a quantized tensor arrived for LayerNorm\.weight; only Linear weights"):
        ops.set_quantized(torch.nn.LayerNorm(8), "weight", t)
    with pytest.raises(TypeError, match=r"arrived for Linear\.bias; only Linear weights"):
        ops.set_quantized(layer, "bias", t)


def test_forcing_the_quantized_matmul_leaves_e5m2_fp8_layers_weight_only(comfy, monkeypatch):
    """PREQUANT_MATMUL=quantized forces torchao's fp8 matmul on a CPU (tests/schemes/test_matmul_path.py), which takes e4m3
    weights only: a ComfyUI-native float8_e5m2 file's layers stay weight-only under it and sample exactly as the
    default load does, while the same file's e4m3 twin runs quantized."""
    import comfy_quantizer as cq
    from prequant_core import families
    from prequant_core.schemes import devices
    from tools import tiny_families as tf
    import folder_paths
    nodes, pack = comfy
    fam = families.get("flux.1")
    dense = tf.dense("flux.1", seed=0)
    sd = pack.nodes.comfy_model.diffusers_to_comfy(fam, dense, fam.config_from_shapes(
        {k: tuple(v.shape) for k, v in dense.items()}))
    layers = [k[:-len(".weight")] for k, v in sd.items() if k.endswith(".weight") and v.ndim == 2 and "blocks." in k
              and v.shape[0] % 16 == 0 and v.shape[1] % 32 == 0 and min(v.shape) >= 64]
    folder = os.path.join(folder_paths.get_folder_paths("diffusion_models")[0], "prequant-test-e5m2")
    os.makedirs(folder, exist_ok=True)
    loader = nodes.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]()

    def load(fmt):
        name = f"native-{fmt}.safetensors"
        cq.write(os.path.join(folder, name), sd, {n: (fmt, {}) for n in layers}, style="both")
        with torch.inference_mode():
            res = loader.load(f"diffusion_models/prequant-test-e5m2/{name}", family="flux.1")
        m = res["result"][0]
        return m, {x.prequant_matmul for x in m.model.diffusion_model.modules() if getattr(x, "prequant_spec", None)}

    try:
        monkeypatch.delenv(devices.ENV, raising=False)
        default, default_paths = load("float8_e5m2")
        monkeypatch.setenv(devices.ENV, "quantized")
        forced, forced_paths = load("float8_e5m2")
        _, e4m3_paths = load("float8_e4m3fn")
        assert default_paths == {devices.WEIGHT_ONLY} and forced_paths == {devices.WEIGHT_ONLY}, forced_paths
        assert e4m3_paths == {devices.QUANTIZED}, e4m3_paths
        assert torch.equal(tf.sample(default, "flux.1", steps=1), tf.sample(forced, "flux.1", steps=1))
    finally:
        shutil.rmtree(folder)


def test_load_state_dict_on_a_packs_dense_layer_loads_through_comfyuis_own_loader(comfy, prequant_files, allow_dir):
    """The pack's layer classes declare ComfyUI's state-dict loader as their own (nodes/ops.py); ``load_state_dict``
    on one (as ``BaseModel.load_model_weights`` would call it) loads the given tensors into it."""
    path = prequant_files("int8")
    allow_dir(os.path.dirname(path))
    dm = load_path(comfy, path).model.diffusion_model
    name, layer = next((n, m) for n, m in dm.named_modules() if isinstance(m, torch.nn.Linear)
                       and getattr(m, "prequant_spec", "x") is None and type(m).__module__.endswith("nodes.ops"))
    new = {k: torch.full_like(v, 0.25) for k, v in layer.state_dict().items()}
    with torch.inference_mode(False), torch.no_grad():
        result = layer.load_state_dict(new)
    assert not result.missing_keys and not result.unexpected_keys, (name, result)
    assert all(torch.equal(getattr(layer, k), v) for k, v in new.items()), name


def test_a_comfyui_encoder_file_beside_a_pre_cast_one_is_assigned_as_clip_loader_assigns_it(comfy):
    """The with_encoder file (FLUX.1's CLIP-L next to its T5) is assigned non-strictly, as ComfyUI's own CLIPLoader
    loads it: a tensor ComfyUI's class does not hold (a CLIP-L file's ``position_ids``) is ignored, one the file does
    not provide (``text_projection``) is allocated as zeros, never left on the meta device; every other tensor lands
    as given. The pre-cast file itself is assigned strictly: the same extra tensor is refused, naming the file."""
    from comfy import sd1_clip
    from prequant_core.errors import CorruptCheckpointError
    cc = comfy[1].nodes.comfy_clip

    def skeleton():
        with torch.device("meta"):  # ComfyUI's real CLIP-L class, as the loader builds it before assigning
            return sd1_clip.SDClipModel(device="meta")
    model = skeleton()
    shapes = {k: (tuple(v.shape), v.dtype) for k, v in model.state_dict(keep_vars=True).items()}
    assert "transformer.text_projection.weight" in shapes
    g = torch.Generator().manual_seed(0)
    sd = {k: torch.randn(s, generator=g).to(torch.float16) if dt.is_floating_point else torch.zeros(s, dtype=dt)
          for k, (s, dt) in shapes.items() if k != "transformer.text_projection.weight"}
    sd["transformer.text_model.embeddings.position_ids"] = torch.arange(77)[None]
    cc._assign(model, sd, "/models/text_encoders/clip_l.safetensors", strict=False)
    got = model.state_dict(keep_vars=True)
    assert not [k for k, v in got.items() if v.is_meta], "nothing is left unallocated"
    assert "transformer.text_model.embeddings.position_ids" not in got
    proj = got["transformer.text_projection.weight"]
    assert isinstance(proj, torch.nn.Parameter) and not proj.requires_grad and not proj.any()
    assert proj.shape == shapes["transformer.text_projection.weight"][0]
    for k, v in sd.items():
        if k in got:
            assert torch.equal(got[k].to(v.dtype), v), k
    with pytest.raises(CorruptCheckpointError) as e:
        cc._assign(skeleton(), sd, "/models/prequant/x-text_encoder-FP8.safetensors", strict=True)
    assert e.value.path == "/models/prequant/x-text_encoder-FP8.safetensors"
    assert e.value.found == "1 unexpected: transformer.text_model.embeddings.position_ids", e.value.found
