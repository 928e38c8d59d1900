"""Load Prequant Text Encoder in the real ComfyUI: Unsloth's pre-cast Gemma2-2B (Lumina Image 2.0's encoder, the
smallest real one; ComfyUI builds each encoder from a fixed config, so it is full size) gives the same conditioning
as ComfyUI's own CLIPLoader on the same cast weights, bit for bit, with the weights kept float8 in memory.

The encoder's values are deterministic stand-ins generated once per run (tests/unsloth_te_builder.full_size), cast
and written by the restated Unsloth builder; ComfyUI's file of the same weights is written here as ComfyUI lays its
text-encoder files out (``model.``-prefixed keys, the SentencePiece tokenizer as a ``spiece_model`` uint8 tensor)."""
from __future__ import annotations

import gc
import io
import os

import pytest
import torch

import unsloth_te_builder as te_builder

BASE = "Alpha-VLLM/Lumina-Image-2.0"
UNSLOTH_NAME = "Lumina-Image-2.0-text_encoder-FP8.safetensors"
COMFY_NAME = "gemma_2_2b_cast_fp8_e4m3fn.safetensors"
PROMPT = "a watercolor painting of a lighthouse at dawn, soft light"


def spiece_model() -> bytes:
    """A small SentencePiece model with Gemma's special ids (pad 0, eos 1, bos 2, unk 3), trained here."""
    import sentencepiece as spm
    words = ("a watercolor painting of the lighthouse at dawn soft light cat dog photo red blue green sky sea "
             "mountain river city night street portrait landscape").split()
    lines = [" ".join(words[(i * j) % len(words)] for j in range(1, 9)) for i in range(1, 400)]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=buf, vocab_size=120,
                                   model_type="bpe", pad_id=0, eos_id=1, bos_id=2, unk_id=3, minloglevel=2)
    return buf.getvalue()


@pytest.fixture(scope="module")
def gemma(comfy, models_dir):
    """ComfyUI's CLIPLoader on ComfyUI's file of the cast weights (its conditioning, pooled output, size and dtypes),
    then Unsloth's file of the same weights in models/prequant; removed afterwards.

    The two full-size files (3.2 GB each) never sit on disk together: CI's disk once ran out with both there while
    the other worker and the 0.12.1 build wrote theirs. Once CLIPLoader has read ComfyUI's file, the file is
    rewritten as its tokenizer and the marker keys alone: that is all the pack's loader reads from it (the
    ``spiece_model`` tensor, found by the header's keys), and the weights it would ignore are not needed on disk."""
    from safetensors.torch import save_file
    nodes, _ = comfy
    import comfy.model_management as mm
    from prequant_core.families import encoders
    model = te_builder.cast_layerwise(te_builder.full_size("Gemma2Model"))
    sd = te_builder.state_dict(model)
    del model
    theirs = os.path.join(models_dir, "text_encoders", COMFY_NAME)
    os.makedirs(os.path.dirname(theirs), exist_ok=True)
    comfy_sd = {"model." + k: v for k, v in sd.items()}
    comfy_sd["spiece_model"] = torch.frombuffer(bytearray(spiece_model()), dtype=torch.uint8)
    save_file(comfy_sd, theirs)
    ref_clip = nodes.CLIPLoader().load_clip(COMFY_NAME, type="lumina2")[0]
    ref = dict(zip(("cond", "pooled"), _encode(ref_clip)), bytes=ref_clip.patcher.model_size(),
               dtypes={p.dtype for p in ref_clip.cond_stage_model.parameters()})
    markers = encoders.for_class("Gemma2Model").markers
    save_file({k: comfy_sd[k].clone() for k in (*markers, "spiece_model")}, theirs + ".tmp")
    os.replace(theirs + ".tmp", theirs)
    del comfy_sd
    gc.collect()
    # Build Prequant Checkpoint from that CLIP (its weights in bf16, the cast values): the file is compared with the
    # restated Unsloth builder's tensors in memory and removed before Unsloth's file is written (one 3.2 GB file on
    # disk at a time)
    ref["built"] = _build_from_clip(comfy[1].nodes, ref_clip, sd, models_dir)
    del ref_clip
    mm.unload_all_models()
    gc.collect()
    meta = te_builder.metadata(te_class="Gemma2Model", base_model_id=BASE, family="lumina-2")
    ours = os.path.join(models_dir, "prequant", UNSLOTH_NAME)
    te_builder.save_safetensors(ours, sd, meta)
    del sd
    gc.collect()
    yield ours, ref
    for p in (ours, theirs):
        os.remove(p)


def _build_from_clip(pack_nodes_mod, clip, sd, models_dir) -> dict:
    """Build Prequant Checkpoint with a CLIP connected; what it wrote, compared with ``sd`` (the restated Unsloth
    builder's tensors of the same weights), then removed."""
    from safetensors import safe_open
    node = pack_nodes_mod.NODE_CLASS_MAPPINGS["PrequantBuildCheckpoint"]()
    out = node.build("(none: use the model input)", "int8", 512, "", "auto", "", "safetensors", False, clip=clip)
    path = out["result"][0]
    try:
        with safe_open(path, framework="pt") as f:
            keys = set(f.keys())
            meta = dict(f.metadata())
            equal = keys == set(sd) and all(torch.equal(f.get_tensor(k).view(torch.uint8),
                                                        sd[k].contiguous().view(torch.uint8)) and
                                            f.get_tensor(k).dtype == sd[k].dtype for k in sorted(keys))
        return {"name": os.path.basename(path), "folder": os.path.dirname(path), "equal": equal, "n": len(keys),
                "meta": meta, "text": out["ui"]["text"][0]}
    finally:
        os.remove(path)


def _encode(clip):
    cond = clip.encode_from_tokens_scheduled(clip.tokenize(PROMPT))
    return cond[0][0], cond[0][1].get("pooled_output")


def test_precast_gemma_matches_cliploader_bit_for_bit(comfy, gemma):
    _, pack = comfy
    _, r = gemma
    ref, ref_pooled = r["cond"], r["pooled"]
    node = pack.nodes.NODE_CLASS_MAPPINGS["PrequantLoadTextEncoder"]()
    out = node.load(UNSLOTH_NAME)
    clip = out["result"][0]
    got, got_pooled = _encode(clip)
    assert torch.isfinite(ref).all() and ref.abs().sum() > 0  # a real signal, not NaN == NaN or zeros
    assert got.dtype == ref.dtype and got.shape == ref.shape
    assert torch.equal(got, ref)
    assert (got_pooled is None and ref_pooled is None) or torch.equal(got_pooled, ref_pooled)

    # the Linear weights stay float8: ComfyUI's own load holds them in bf16
    linears = [m for m in clip.cond_stage_model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(m.weight.dtype == torch.float8_e4m3fn for m in linears)
    assert torch.float8_e4m3fn not in r["dtypes"]
    assert clip.patcher.model_size() < 0.65 * r["bytes"]
    text = out["ui"]["text"][0]
    assert "Gemma2-2B" in text and f"the spiece_model of {COMFY_NAME}" in text, text


def test_the_build_node_writes_unsloths_file_from_a_clip(comfy, gemma, models_dir):
    """Build Prequant Checkpoint with Load CLIP's CLIP of the dense encoder connected writes Unsloth's pre-cast file:
    tensor for tensor (bytes and dtypes) what the restated Unsloth builder writes from the same weights, under
    Unsloth's name, in models/prequant, with the metadata Unsloth's loader checks."""
    import json
    _, r = gemma
    b = r["built"]
    assert b["equal"] and b["n"] > 100, b
    assert b["name"] == "Lumina-Image-2.0-text_encoder-FP8.safetensors"
    assert os.path.realpath(b["folder"]) == os.path.realpath(os.path.join(models_dir, "prequant"))
    assert b["meta"]["unsloth_format"] == "unsloth_prequant_text_encoder_state_dict_v1"
    meta = json.loads(b["meta"]["unsloth_metadata"])
    assert (meta["te_class"], meta["family"], meta["component"], meta["scheme"], meta["cast_backend"]) == \
        ("Gemma2Model", "lumina-2", "text_encoder", "fp8", "diffusers_layerwise")
    assert "Gemma2-2B text encoder (lumina-2)" in b["text"]


def test_precast_file_refused_for_another_family(comfy, gemma):
    from prequant_core.errors import ValidationError
    _, pack = comfy
    node = pack.nodes.NODE_CLASS_MAPPINGS["PrequantLoadTextEncoder"]()
    with pytest.raises(ValidationError) as e:
        node.load(UNSLOTH_NAME, family="z-image")
    assert "Z-Image's text_encoder is a Qwen3-4B, this file holds a Gemma2-2B" in str(e.value.reasons)


def test_a_named_file_the_user_lacks_is_refused_by_name_unless_a_source_serves_it(comfy):
    from prequant_core.errors import ValidationError
    _, pack = comfy
    cls = pack.nodes.NODE_CLASS_MAPPINGS["PrequantLoadTextEncoder"]
    assert cls.VALIDATE_INPUTS("someone-text_encoder-FP8.safetensors") is True  # reaches load(), not "not in list"
    assert "not a .safetensors or .pt" in cls.VALIDATE_INPUTS("notes.txt")
    with pytest.raises(ValidationError) as e:
        cls().load("my-own-text_encoder-FP8.safetensors", family="z-image")  # the family's file has another name
    assert "'my-own-text_encoder-FP8.safetensors'" in e.value.message and "nothing the node names serves" in \
        e.value.message


def _tiny_qwen3vl_dense() -> dict:
    """A transformers-named Qwen3-VL state dict of a tiny shape, without the transformers class (ComfyUI 0.12.1's
    environment may not have it): what the restated builder needs."""
    g = torch.Generator().manual_seed(0)
    sd = {"model.language_model.embed_tokens.weight": (256, 256), "model.language_model.norm.weight": (256,),
          "model.visual.patch_embed.proj.weight": (32, 3, 2, 16, 16), "lm_head.weight": (256, 256)}
    for i in range(2):
        p = f"model.language_model.layers.{i}."
        sd.update({p + "self_attn.q_proj.weight": (256, 256), p + "self_attn.k_proj.weight": (128, 256),
                   p + "self_attn.v_proj.weight": (128, 256), p + "self_attn.o_proj.weight": (256, 256),
                   p + "self_attn.q_norm.weight": (64,), p + "self_attn.k_norm.weight": (64,),
                   p + "mlp.gate_proj.weight": (512, 256), p + "mlp.up_proj.weight": (512, 256),
                   p + "mlp.down_proj.weight": (256, 512), p + "input_layernorm.weight": (256,),
                   p + "post_attention_layernorm.weight": (256,)})
    return {k: (torch.randn(s, generator=g) * 0.02).to(torch.bfloat16) for k, s in sd.items()}


def test_qwen_image_21s_int8_encoder_is_refused_naming_the_comfyui_that_has_its_class(comfy, models_dir, monkeypatch):
    """Unsloth's int8 ConvRot Qwen3-VL-8B (tests/text_encoders/test_text_encoder_int8.py reads it): ComfyUI's class for it arrives
    in 0.38.1. The preset is refused before any download (offline here: a download attempt would fail with the
    Hub's error instead), a local file after it is judged, both naming the version and ComfyUI's own file."""
    from prequant_core.errors import ComfyVersionError, ValidationError
    _, pack = comfy
    node = pack.nodes.NODE_CLASS_MAPPINGS["PrequantLoadTextEncoder"]()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ComfyVersionError) as e:
        node.load(pack.nodes.paths.NONE_CHOICES[0], preset="Qwen-Image 2.1 / text_encoder")
    assert "0.38.1" in e.value.message and "Qwen-Image 2.1's Qwen3-VL" in e.value.message
    assert "qwen3vl_8b_int8_convrot.safetensors" in e.value.fix
    # Krea 2's Qwen3-VL-4B (fp8): ComfyUI 0.33.0 has its class (type krea2), the pack no key map to it yet; FLUX.2
    # [dev]'s Mistral-Small-24B: likewise (type flux2). Each names ComfyUI's own file, before any download.
    from tools.comfy_headless import comfyui_version
    has_krea = tuple(int(x) for x in comfyui_version().split(".")[:2]) >= (0, 33)
    with pytest.raises(ValidationError if has_krea else ComfyVersionError) as e:
        node.load(pack.nodes.paths.NONE_CHOICES[0], preset="Krea 2 / text_encoder")
    assert "qwen3vl_4b_fp8_scaled.safetensors" in e.value.fix
    assert ("does not build ComfyUI's Qwen3-VL encoder yet" if has_krea else
            "Krea 2's Qwen3-VL text encoder runs in ComfyUI 0.33.0") in e.value.message, e.value.message
    with pytest.raises(ValidationError) as e:
        node.load(pack.nodes.paths.NONE_CHOICES[0], preset="FLUX.2 [dev] / text_encoder")
    assert "Mistral-Small-24B" in e.value.message and "mistral_3_small_flux2_bf16.safetensors" in e.value.fix
    name = "Qwen-Image-2.1-text_encoder-INT8-ConvRot.safetensors"
    path = os.path.join(models_dir, "prequant", name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    te_builder.build_int8_convrot_file(path, dense=_tiny_qwen3vl_dense())
    try:
        with pytest.raises(ComfyVersionError) as e:
            node.load(name)
        assert "0.38.1" in e.value.message and e.value.path == os.path.realpath(path)
    finally:
        os.remove(path)


def test_an_encoder_of_another_size_is_refused_naming_the_tensor_and_both_shapes(comfy, models_dir):
    """ComfyUI builds each encoder from its fixed config: a file of another size (here a tiny Qwen3 of the real class
    where Z-Image's Qwen3-4B belongs) is refused with the first tensor that does not fit, not a bare load error."""
    from prequant_core.errors import CorruptCheckpointError
    _, pack = comfy
    name = "Z-Image-Turbo-text_encoder-FP8.safetensors"
    path = os.path.join(models_dir, "prequant", name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    te_builder.build_file(path, "Qwen3ForCausalLM", base_model_id="Tongyi-MAI/Z-Image-Turbo", family="z-image")
    from conftest import absent_comfy_tokenizer
    from prequant_core.errors import InternalError, PrequantError
    # ComfyUI 0.33.0 as shipped here lacks two large tokenizer files (../shared/comfyui-0.33/README.md), one of them
    # the tokenizer of the class its key detection takes this tiny file for: the refusal then names that file and
    # clears the checkpoint, where it used to call the file damaged
    absent = absent_comfy_tokenizer()
    try:
        with pytest.raises(PrequantError) as e:
            pack.nodes.NODE_CLASS_MAPPINGS["PrequantLoadTextEncoder"]().load(name)
        if absent:
            assert isinstance(e.value, InternalError) and absent in e.value.message, e.value
            assert "not at fault" in e.value.fix and "Download or build the file again" not in e.value.fix
            return
        # (0.3.75 builds its Qwen3-4B, (151936, 2560); 0.12.1's key detection takes the tiny file for another class)
        assert isinstance(e.value, CorruptCheckpointError)
        assert e.value.message.startswith("Tensor 'model.embed_tokens.weight' has shape (256, 64), ComfyUI's "
                                          "encoder expects ("), e.value.message
        assert e.value.path == os.path.realpath(path) and "preset" in e.value.fix
    finally:
        os.remove(path)


def test_build_from_a_clip_refuses_its_lora_and_reads_pristine_weights_after_another_branchs_lora(comfy, tmp_path):
    nodes_, pack = comfy
    """Round 5: a CLIP carrying a LoRA was built without it, silently; a plain CLIP built after another branch ran a
    LoRA on the same loaded encoder got that LoRA baked in (ComfyUI patches the shared module in place). Now the first
    is refused like a patched MODEL, and the second is unpatched before it is read."""
    import comfy.model_management as mm
    import comfy.sd
    from prequant_core.errors import BuildError
    from tools import tiny_assets
    path = tiny_assets.write_clip(str(tmp_path / tiny_assets.CLIP_NAME))
    plain = comfy.sd.load_clip(ckpt_paths=[path], clip_type=comfy.sd.CLIPType.STABLE_DIFFUSION)
    node = pack.nodes.NODE_CLASS_MAPPINGS["PrequantBuildCheckpoint"]()
    build = lambda clip: node.build("(none: use the model input)", "int8", 512, "", "auto", "",  # noqa: E731
                                    "safetensors", False, clip=clip)
    key = next(k for k, v in plain.cond_stage_model.state_dict().items() if v.ndim == 2 and "mlp" in k)
    pristine = plain.cond_stage_model.state_dict()[key].clone()
    lora = plain.clone()
    lora.add_patches({key: (torch.ones_like(pristine),)}, 1.0)  # a "diff" patch: +1 everywhere
    with pytest.raises(BuildError) as e:
        build(lora)
    assert "carries 1 weight patches" in e.value.message and "before LoRA" in e.value.fix
    # the LoRA'd branch runs (ComfyUI applies its patch to the shared module), then the plain CLIP is built
    mm.load_models_gpu([lora.patcher])
    assert not torch.equal(plain.cond_stage_model.state_dict()[key], pristine)
    with pytest.raises(BuildError) as e:  # CLIP-L is not an encoder this pack writes: refused after the read
        build(plain)
    assert "holds no text encoder this pack writes" in e.value.message
    assert torch.equal(plain.cond_stage_model.state_dict()[key], pristine), "the build read the LoRA'd weights"


def test_a_qwen3_labelled_hidreams_llama_is_refused_before_comfyui_builds_anything(comfy, models_dir):
    """Issue 58: a Qwen3 pre-cast file recording HiDream's LlamaForCausalLM held Llama's one marker (every Qwen3
    does), so the node reported "Llama-3.1-8B fp8" and ComfyUI, picking its class from the keys, built a Qwen3. Now
    the load refuses it, naming the file, the class it claims and the one it holds, and what to do. (The right label
    still loads: the Gemma2-2B tests above, through the same judge at full size.)"""
    from prequant_core.errors import ValidationError
    _, pack = comfy
    name = "HiDream-I1-Full-text_encoder_4-FP8.safetensors"
    path = os.path.join(models_dir, "prequant", name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    sd = te_builder.state_dict(te_builder.cast_layerwise(te_builder.encoder("Qwen3ForCausalLM")))
    te_builder.save_safetensors(path, sd, te_builder.metadata(
        te_class="LlamaForCausalLM", base_model_id="HiDream-ai/HiDream-I1-Full", family="hidream-i1",
        component="text_encoder_4"))
    node = pack.nodes.NODE_CLASS_MAPPINGS["PrequantLoadTextEncoder"]()
    try:
        for kw in ({}, {"family": "hidream-i1"}):
            with pytest.raises(ValidationError) as e:
                node.load(name, **kw)
            assert e.value.path == os.path.realpath(path), kw
            why = " ".join(e.value.reasons)
            assert "te_class 'LlamaForCausalLM' says Llama-3.1-8B, but the tensors are not a Llama-3.1-8B's (they " \
                   "are a Qwen3-4B's)" in why and "self_attn.q_norm.weight" in why, (kw, why)
            assert "Pick the file hosted for this family" in e.value.fix
            assert "Llama-3.1-8B fp8" not in str(e.value)
    finally:
        os.remove(path)


def test_a_broken_tokenizer_donor_is_named_by_the_node_not_reported_as_a_bug(comfy, models_dir):
    """Issue 58 #3: a ComfyUI Gemma2 file in models/text_encoders whose spiece_model SentencePiece cannot read lent
    it anyway, and ComfyUI's tokenizer failed while the CLIP was built: "An unexpected error ... (the file itself was
    read and judged valid before it) ... Please report this", naming the pre-cast file. The node now names the donor,
    what it holds and what to do, before ComfyUI builds anything. (A tiny pre-cast Gemma2 from the restated Unsloth
    builder: the tokenizer is fetched before ComfyUI sees a weight; the donor is written directly.)"""
    from safetensors.torch import save_file
    from prequant_core.errors import CorruptCheckpointError
    from prequant_core.families import encoders
    _, pack = comfy
    name = "Lumina-Image-2.0-tiny-text_encoder-FP8.safetensors"
    path = os.path.join(models_dir, "prequant", name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    te_builder.build_file(path, "Gemma2Model", base_model_id=BASE, family="lumina-2")
    donor = os.path.join(models_dir, "text_encoders", "a_gemma_2_2b_fp16.safetensors")  # listed before any other
    os.makedirs(os.path.dirname(donor), exist_ok=True)
    sd = {k: torch.zeros(8, dtype=torch.bfloat16) for k in encoders.for_class("Gemma2Model").markers}
    sd["spiece_model"] = torch.frombuffer(bytearray(b"\x00" * 4096), dtype=torch.uint8)
    save_file(sd, donor)
    try:
        with pytest.raises(CorruptCheckpointError) as e:
            pack.nodes.NODE_CLASS_MAPPINGS["PrequantLoadTextEncoder"]().load(name)
    finally:
        os.remove(path)
        os.remove(donor)
    assert os.path.realpath(e.value.path) == os.path.realpath(donor), str(e.value)
    assert "tokenizer donor a_gemma_2_2b_fp16.safetensors" in e.value.message and "report" not in str(e.value)
    assert "SentencePiece" in e.value.expected and "4096 bytes" in e.value.found and "replace" in e.value.fix
