"""Load Prequant Text Encoder's routes before ComfyUI builds the full-size class (issue 61: node lines no test ran),
on tiny pre-cast files from the restated Unsloth builder in the real ComfyUI: the Gemma2 tokenizer with no donor
(refused without a base model, fetched from the loopback Hub with one), a listed name the user lacks that the preset
serves, FLUX.1's T5-XXL (too few blocks for ComfyUI's detection; no CLIP-L picked; a CLIP-L read and handed to
ComfyUI beside it), a file recording a component its family hosts no encoder under, and the text_encoders listing
(which files are the pack's pre-cast encoders, which are ComfyUI's own)."""
from __future__ import annotations

import os

import pytest
import torch

import unsloth_te_builder as te_builder
from tools import tiny_assets

LUMINA_BASE = "Alpha-VLLM/Lumina-Image-2.0"
LUMINA_REPO = "unsloth/Lumina-Image-2.0-FP8"
LUMINA_NAME = "Lumina-Image-2.0-text_encoder-FP8.safetensors"  # the preset's (Unsloth's) name
FLUX_BASE = "black-forest-labs/FLUX.1-schnell"


def _node(comfy):
    return comfy[1].nodes.NODE_CLASS_MAPPINGS["PrequantLoadTextEncoder"]()


def _folder(models_dir, sub):
    d = os.path.join(models_dir, sub)
    os.makedirs(d, exist_ok=True)
    return d


def _tiny_gemma(path, base_model_id):
    """A tiny pre-cast Gemma2 (Lumina Image 2.0's encoder class); ``base_model_id`` None: the metadata has none."""
    sd = te_builder.state_dict(te_builder.cast_layerwise(te_builder.encoder("Gemma2Model")))
    meta = te_builder.metadata(te_class="Gemma2Model", base_model_id=base_model_id or "", family="lumina-2")
    if base_model_id is None:
        del meta["base_model_id"]
    te_builder.save_safetensors(str(path), sd, meta)
    return str(path)


def _no_gemma_donor(pack):
    """No ComfyUI Gemma2 file (a tokenizer donor) in the folders the node searches: the premise of these tests."""
    from prequant_core.families import encoders
    from prequant_core.text_encoders import tokenizer
    assert tokenizer.from_comfy_files(encoders.for_class("Gemma2Model"), pack.nodes.paths.encoder_dirs()) is None


@pytest.mark.parametrize("base", [None, ""], ids=["no-key", "empty"])
def test_a_gemma2_file_without_a_base_model_and_no_donor_is_refused_naming_both_ways_out(comfy, models_dir, base):
    """SentencePiece tokenizers are not in Unsloth's files: without ComfyUI's gemma file in models/text_encoders and
    without base_model_id (absent, or empty) in the file there is nowhere to take it from; the node says so and
    names both remedies, before ComfyUI builds anything."""
    from prequant_core.errors import ValidationError
    _, pack = comfy
    _no_gemma_donor(pack)
    name = "Lumina-Image-2.0-nobase-text_encoder-FP8.safetensors"
    path = _tiny_gemma(os.path.join(_folder(models_dir, "prequant"), name), base)
    try:
        with pytest.raises(ValidationError) as e:
            _node(comfy).load(name)
    finally:
        os.remove(path)
    assert e.value.message == ("The Gemma2-2B tokenizer is not in the file, and the file names no base model to "
                               "take it from.")
    assert e.value.found == "neither" and e.value.path == path  # the file is named
    assert e.value.expected == ("base_model_id in the file, or a ComfyUI gemma_2_2b_fp16.safetensors in "
                                "models/text_encoders")
    assert "Put ComfyUI's gemma_2_2b_fp16.safetensors into models/text_encoders" in e.value.fix
    assert "hosted by Unsloth" in e.value.fix


def test_a_listed_name_the_user_lacks_is_downloaded_by_the_preset_and_its_tokenizer_fetched_from_the_base(
        comfy, models_dir, hub, tmp_path):
    """A shared workflow names Lumina's pre-cast encoder, which this user does not have: the preset serves that very
    file, so it is downloaded from the (loopback) Hub into models/prequant; the file names its base model and no
    donor is there, so the tokenizer is fetched from the base repo (``tokenizer/tokenizer.model``), once. The tiny
    encoder then reaches ComfyUI's full-size Gemma2 class, which refuses its shapes, naming the downloaded file: the
    node got past the download and the tokenizer."""
    from prequant_core.errors import CorruptCheckpointError
    _, pack = comfy
    _no_gemma_donor(pack)
    import shutil
    repo_dir = os.path.join(_folder(models_dir, "prequant"), *LUMINA_REPO.split("/"))  # downloads: <repo>/<file>
    dest = os.path.join(repo_dir, LUMINA_NAME)
    assert not os.path.exists(repo_dir) and LUMINA_NAME not in pack.nodes.paths.encoder_choices()
    src = _tiny_gemma(tmp_path / LUMINA_NAME, LUMINA_BASE)
    spm = tmp_path / "tokenizer.model"
    spm.write_bytes(tiny_assets.spiece_model())
    hub.commit(LUMINA_REPO, {LUMINA_NAME: src})
    hub.commit(LUMINA_BASE, {"tokenizer/tokenizer.model": str(spm)})
    node = _node(comfy)
    try:
        # not the preset's name: refused by name, nothing downloaded
        from prequant_core.errors import ValidationError
        with pytest.raises(ValidationError) as e:
            node.load("someone-elses-text_encoder-FP8.safetensors", preset="Lumina Image 2.0 / text_encoder")
        assert "'someone-elses-text_encoder-FP8.safetensors'" in e.value.message
        assert not hub.body_gets(LUMINA_NAME)
        with pytest.raises(CorruptCheckpointError) as e:
            node.load(LUMINA_NAME, preset="Lumina Image 2.0 / text_encoder")
        assert os.path.isfile(dest), "the preset's file is downloaded into models/prequant"
        with open(dest, "rb") as a, open(src, "rb") as b:
            assert a.read() == b.read()
    finally:
        shutil.rmtree(repo_dir, ignore_errors=True)
    assert len(hub.body_gets(LUMINA_NAME)) == 1
    assert len(hub.body_gets("tokenizer/tokenizer.model")) == 1, "the tokenizer comes from the file's base model"
    assert [r for r in hub.requests() if r.get("repo") == LUMINA_BASE], hub.requests()
    assert os.path.realpath(e.value.path) == os.path.realpath(dest), str(e.value)
    assert e.value.message.startswith("Tensor 'model.") and "ComfyUI's encoder expects (" in e.value.message, \
        e.value.message


def _t5_config(blocks: int):
    import transformers
    return transformers.T5Config(vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=blocks, num_heads=4,
                                 feed_forward_proj="gated-gelu", is_encoder_decoder=False)


@pytest.fixture(scope="module")
def flux_t5(comfy, models_dir):
    """A tiny pre-cast T5 with FLUX.1's metadata and 24 blocks (ComfyUI's T5-XXL marker is block 23), in
    models/prequant; removed afterwards."""
    name = "FLUX.1-schnell-tiny24-text_encoder_2-FP8.safetensors"
    path = os.path.join(_folder(models_dir, "prequant"), name)
    te_builder.build_file(path, "T5EncoderModel", base_model_id=FLUX_BASE, family="flux.1", component="text_encoder_2",
                          config=_t5_config(24))
    yield name, path
    os.remove(path)


def test_a_t5_with_fewer_blocks_than_comfyuis_detection_reads_is_refused_naming_the_marker(comfy, models_dir):
    from prequant_core.errors import ValidationError
    name = "FLUX.1-schnell-tiny2-text_encoder_2-FP8.safetensors"
    path = os.path.join(_folder(models_dir, "prequant"), name)
    te_builder.build_file(path, "T5EncoderModel", base_model_id=FLUX_BASE, family="flux.1", component="text_encoder_2",
                          config=_t5_config(2))
    try:
        with pytest.raises(ValidationError) as e:
            _node(comfy).load(name, with_encoder="none")
    finally:
        os.remove(path)
    assert e.value.message == ("ComfyUI would not recognise this T5-XXL: its keys lack what ComfyUI's detection "
                               "reads.")
    assert e.value.expected == "encoder.block.23.layer.1.DenseReluDense.wi_1.weight"
    assert e.value.found.endswith("tensors without them") and e.value.path == os.path.realpath(path)
    assert "truncated or of another encoder size" in e.value.fix


def test_flux1s_t5_without_a_clip_l_is_refused_naming_the_input_to_set(comfy, flux_t5):
    """FLUX.1's CLIP is T5-XXL plus CLIP-L (DualCLIPLoader): with with_encoder left at none (the default, or passed)
    the node asks for the CLIP-L file instead of building half a CLIP."""
    from prequant_core.errors import ValidationError
    name, t5_path = flux_t5
    for kw in ({}, {"with_encoder": "none"}, {"with_encoder": ""}):
        with pytest.raises(ValidationError) as e:
            _node(comfy).load(name, **kw)
        assert e.value.message == "FLUX.1's CLIP takes a clip_l encoder next to this T5-XXL.", kw
        assert e.value.expected == "a clip_l file in with_encoder (from models/text_encoders)"
        assert e.value.found == "none" and e.value.path == t5_path  # the file is named
        assert e.value.fix == "Pick ComfyUI's clip_l.safetensors in with_encoder, as DualCLIPLoader takes it."


def test_flux1s_t5_with_a_clip_l_hands_both_to_comfyui_the_clip_l_not_strict(comfy, models_dir, flux_t5,
                                                                             monkeypatch):
    """With ComfyUI's CLIP-L picked, the node reads it and hands ComfyUI both state dicts, the pre-cast T5 strict and
    CLIP-L not (ComfyUI's own file may carry keys its class lacks), as FLUX; ComfyUI's full-size T5-XXL then refuses
    the tiny T5's shapes, naming the pre-cast file, not the CLIP-L."""
    from comfy import sd as comfy_sd
    from prequant_core.errors import CorruptCheckpointError
    from tools import tiny_assets
    _, pack = comfy
    te_node = pack.nodes.te_node
    name, path = flux_t5
    clip_l = tiny_assets.write_clip(os.path.join(_folder(models_dir, "text_encoders"), "prequant-test-clip_l.safetensors"))
    seen = []
    real = te_node.build_clip
    monkeypatch.setattr(te_node, "build_clip", lambda sds, clip_type, **kw: seen.append((sds, clip_type, kw)) or
                        real(sds, clip_type, **kw))
    try:
        assert "prequant-test-clip_l.safetensors" in pack.nodes.paths.comfy_encoder_choices()
        with pytest.raises(CorruptCheckpointError) as e:
            _node(comfy).load(name, with_encoder="prequant-test-clip_l.safetensors")
        from safetensors.torch import load_file
        want = load_file(clip_l)
    finally:
        os.remove(clip_l)
    assert len(seen) == 1
    sds, clip_type, kw = seen[0]
    assert clip_type == "FLUX" and kw["strict"] == [True, False] and kw["path"] == os.path.realpath(path)
    assert "encoder.block.23.layer.1.DenseReluDense.wi_1.weight" in sds[0]
    assert sds[1].keys() == want.keys() and all(torch.equal(sds[1][k], want[k]) for k in want)
    assert hasattr(comfy_sd.CLIPType, clip_type)
    assert os.path.realpath(e.value.path) == os.path.realpath(path)
    assert e.value.message.startswith("Tensor 'encoder.block.0.layer.0.SelfAttention.q.weight' has shape (64, 64), "
                                      "ComfyUI's encoder expects (4096, 4096)"), e.value.message


def test_resolve_comfy_encoder_none_or_a_listed_name(comfy, models_dir):
    _, pack = comfy
    paths = pack.nodes.paths
    assert paths.resolve_comfy_encoder("none") is None and paths.resolve_comfy_encoder("") is None
    assert paths.resolve_comfy_encoder(None) is None
    f = os.path.join(_folder(models_dir, "text_encoders"), "prequant-test-resolve.safetensors")
    from safetensors.torch import save_file
    save_file({"x": torch.zeros(2)}, f)
    try:
        assert os.path.realpath(paths.resolve_comfy_encoder("prequant-test-resolve.safetensors")) == \
            os.path.realpath(f)
    finally:
        os.remove(f)
    with pytest.raises(FileNotFoundError):  # a name the folder does not hold (ComfyUI's list check runs first)
        paths.resolve_comfy_encoder("prequant-test-resolve.safetensors")


def test_text_encoders_lists_pre_cast_files_for_the_node_and_the_rest_as_comfyuis_own(comfy, models_dir):
    """models/text_encoders holds both kinds: the node's text_encoder list takes the pre-cast ones (an Unsloth header,
    or a .pt named ``*text_encoder*``), its with_encoder list ComfyUI's own files (any other .safetensors or .pt)."""
    from safetensors.torch import save_file
    _, pack = comfy
    paths = pack.nodes.paths
    folder = _folder(models_dir, "text_encoders")
    made = {
        "precast": "prequant-test-text_encoder-FP8.safetensors",  # judged by its header, not its name
        "precast_pt": "Prequant-Test-Text_Encoder-FP8.pt",
        "comfy_pt": "prequant-test-clip_g.pt",
        "comfy_st": "prequant-test-t5xxl.safetensors",
    }
    te_builder.build_file(os.path.join(folder, made["precast"]), "Qwen3ForCausalLM",
                          base_model_id="Tongyi-MAI/Z-Image-Turbo", family="z-image")
    for key in ("precast_pt", "comfy_pt"):
        torch.save({"x": torch.zeros(2)}, os.path.join(folder, made[key]))
    save_file({"x": torch.zeros(2)}, os.path.join(folder, made["comfy_st"]))
    try:
        enc, own = paths.encoder_choices(), paths.comfy_encoder_choices()
    finally:
        for n in made.values():
            os.remove(os.path.join(folder, n))
    assert enc[0] == paths.NONE_CHOICE and own[0] == paths.NO_ENCODER
    assert {"text_encoders/" + made["precast"], "text_encoders/" + made["precast_pt"]} <= set(enc), enc
    assert not any(made[k] in e for k in ("comfy_pt", "comfy_st") for e in enc), enc
    assert {made["comfy_pt"], made["comfy_st"]} <= set(own) and made["precast"] not in own and \
        made["precast_pt"] not in own, own


def test_a_file_recording_a_component_its_family_hosts_no_encoder_under_is_refused(comfy, models_dir):
    """A Qwen3-4B pre-cast file saying it is Z-Image's text_encoder_2: Z-Image hosts its Qwen3-4B as text_encoder, so
    no family entry runs this encoder as that component; the node names what the family does host."""
    from prequant_core.errors import ValidationError
    name = "Z-Image-Turbo-text_encoder_2-FP8.safetensors"
    path = os.path.join(_folder(models_dir, "prequant"), name)
    te_builder.build_file(path, "Qwen3ForCausalLM", base_model_id="Tongyi-MAI/Z-Image-Turbo", family="z-image",
                          component="text_encoder_2")
    try:
        with pytest.raises(ValidationError) as e:
            _node(comfy).load(name)
    finally:
        os.remove(path)
    assert e.value.message == "No family this pack knows runs a Qwen3-4B as its text_encoder_2.", str(e.value)
    assert e.value.expected == "Z-Image: text_encoder" and e.value.found == "Qwen3-4B (text_encoder_2)"
    assert e.value.fix == "Set the node's family to the model this encoder belongs to."
