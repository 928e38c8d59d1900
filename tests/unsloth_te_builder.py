"""Unsloth Studio's pre-cast text-encoder builder, restated for tests from its public source (unslothai/unsloth:
``scripts/build_te_prequant_checkpoint.py``, ``studio/backend/core/inference/diffusion_te_prequant.py`` (tag, metadata,
validation), ``diffusion_precision._cast_fp8`` (the cast), diffusers' ``hooks/layerwise_casting.py`` (which modules it
touches), ``scripts/convert_prequant_to_safetensors.py`` (the pickle-free container)).

Written in our own words and independent of this pack: nothing here imports ``prequant_core``.

What it does, as Unsloth's builder does:
  * the encoder is a real ``transformers`` class in bf16 (``te_class`` is the class name the config's
    ``architectures`` names);
  * the cast walks the module tree from the root; a module whose dotted name matches one of the skip patterns
    (diffusers' defaults ``pos_embed``, ``patch_embed``, ``norm``, ``^proj_in$``, ``^proj_out$``; the encoder's own
    ``_keep_in_fp32_modules`` as literal substrings, T5's ``wo``; an output projection tied to the input embedding)
    or is an ``nn.Embedding`` is left alone with everything under it; a Linear / Conv is cast whole (weight and bias)
    to ``float8_e4m3fn`` with no scale; anything else is walked into;
  * the saved dict: ``format`` (the v1 tag), ``metadata`` (base_model_id, family, scheme fp8, component, te_class,
    torch_dtype bfloat16, cast_backend diffusers_layerwise, torch / transformers versions as strings), ``state_dict``
    (every key of ``encoder.state_dict()``, a tied weight once per key);
  * ``.safetensors``: the same tensors, header ``unsloth_format`` / ``unsloth_metadata`` (JSON) / ``unsloth_source``.
"""
from __future__ import annotations

import hashlib
import json
import os
import re

import torch

TE_FORMAT = "unsloth_prequant_text_encoder_state_dict_v1"
SKIP_PATTERNS = ("pos_embed", "patch_embed", "norm", "^proj_in$", "^proj_out$")
CAST_CLASSES = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.ConvTranspose1d,
                torch.nn.ConvTranspose2d, torch.nn.ConvTranspose3d)


def tiny_config(te_class: str):
    """A small config of the real class (dims divisible as the class needs)."""
    import transformers
    if te_class == "Gemma2Model":
        return transformers.Gemma2Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    if te_class == "Qwen3ForCausalLM":
        return transformers.Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                        tie_word_embeddings=True)
    if te_class == "T5EncoderModel":
        return transformers.T5Config(vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                                     feed_forward_proj="gated-gelu", is_encoder_decoder=False)
    if te_class == "Qwen2_5_VLForConditionalGeneration":
        return transformers.Qwen2_5_VLConfig(
            text_config=dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2),
            vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                               fullatt_block_indexes=[0]))
    if te_class == "LlamaForCausalLM":
        return transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2)
    if te_class in ("Qwen3VLModel", "Qwen3VLForConditionalGeneration"):  # Krea 2's / Qwen-Image 2.1's
        return qwen3vl_tiny_config()
    if te_class == "Mistral3ForConditionalGeneration":  # FLUX.2 [dev]'s Mistral-Small-3.1-24B (Pixtral vision tower)
        return transformers.Mistral3Config(
            text_config=dict(model_type="mistral", vocab_size=256, hidden_size=64, intermediate_size=128,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                             tie_word_embeddings=False),
            vision_config=dict(model_type="pixtral", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                               num_attention_heads=2, head_dim=16, image_size=32, patch_size=16),
            spatial_merge_size=2, tie_word_embeddings=False)
    if te_class == "Gemma3ForConditionalGeneration":  # LTX-2's Gemma 3 12B (SigLIP vision tower)
        return transformers.Gemma3Config(
            text_config=dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=16),
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                               image_size=32, patch_size=16),
            mm_tokens_per_image=4)
    raise ValueError(te_class)


def encoder(te_class: str, config=None, seed: int = 0) -> torch.nn.Module:
    import transformers
    torch.manual_seed(seed)
    config = config or tiny_config(te_class)
    model = getattr(transformers, te_class)(config).to(torch.bfloat16)
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    return model.eval()


def _skip_patterns(model) -> tuple:
    skip = tuple(SKIP_PATTERNS) + tuple(re.escape(m) for m in (getattr(model, "_keep_in_fp32_modules", None) or ()))
    out_emb = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    in_emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if out_emb is not None and in_emb is not None and out_emb.weight is in_emb.weight:
        name = next((n for n, m in model.named_modules() if m is out_emb), None)
        if name:
            skip += (rf"^{re.escape(name)}$",)
    return skip


def cast_layerwise(model: torch.nn.Module) -> torch.nn.Module:
    skip = _skip_patterns(model)

    def walk(module, prefix):
        if isinstance(module, torch.nn.Embedding) or any(re.search(p, prefix) for p in skip):
            return
        if isinstance(module, CAST_CLASSES):
            module.to(dtype=torch.float8_e4m3fn)
            return
        for name, child in module.named_children():
            walk(child, f"{prefix}.{name}" if prefix else name)

    walk(model, "")
    return model


def metadata(*, te_class: str, base_model_id: str, family: str, component: str = "text_encoder") -> dict:
    import transformers
    return {"base_model_id": base_model_id, "family": family, "scheme": "fp8", "component": component,
            "te_class": te_class, "torch_dtype": "bfloat16", "cast_backend": "diffusers_layerwise",
            "torch_version": str(torch.__version__), "transformers_version": str(transformers.__version__)}


def state_dict(model) -> dict:
    return {k: v.detach().to("cpu") for k, v in model.state_dict().items()}


def save_pt(path: str, sd: dict, meta: dict) -> str:
    torch.save({"format": TE_FORMAT, "metadata": meta, "state_dict": sd}, path)
    return path


def save_safetensors(path: str, sd: dict, meta: dict, *, converted_from: str | None = None) -> str:
    from safetensors.torch import save_file
    header = {"unsloth_format": TE_FORMAT, "unsloth_metadata": json.dumps(meta)}
    if converted_from is not None:
        with open(converted_from, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        header["unsloth_source"] = json.dumps({"file": os.path.basename(converted_from), "sha256": digest,
                                               "bytes": os.path.getsize(converted_from)})
    # safetensors refuses shared storage: a tied weight is saved once per key, as torch.save's dict holds it
    seen: set = set()
    out = {}
    for k, v in sd.items():
        ptr = v.untyped_storage().data_ptr()
        out[k] = v.contiguous().clone() if ptr in seen else v.contiguous()
        seen.add(ptr)
    save_file(out, path, metadata=header)
    return path


def build_file(path: str, te_class: str, *, base_model_id: str, family: str, component: str = "text_encoder",
               config=None, seed: int = 0) -> dict:
    """Builds the cast encoder and writes it (container from the extension). Returns the saved state dict."""
    model = cast_layerwise(encoder(te_class, config, seed))
    sd = state_dict(model)
    meta = metadata(te_class=te_class, base_model_id=base_model_id, family=family, component=component)
    if path.endswith(".pt"):
        save_pt(path, sd, meta)
    else:
        save_safetensors(path, sd, meta)
    return sd


BANK = 16_777_213


def full_config(te_class: str):
    """The released encoder's config: Gemma2-2B (Lumina Image 2.0), Qwen3-4B (Z-Image, Krea 2)."""
    import transformers
    if te_class == "Gemma2Model":
        return transformers.Gemma2Config()  # the class's defaults are gemma-2-2b's
    if te_class == "Qwen3ForCausalLM":
        return transformers.Qwen3Config(vocab_size=151936, hidden_size=2560, intermediate_size=9728,
                                        num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                                        head_dim=128, max_position_embeddings=40960, rope_theta=1000000.0,
                                        rms_norm_eps=1e-6, tie_word_embeddings=True)
    if te_class == "T5EncoderModel":  # google/t5-v1_1-xxl, FLUX.1's text_encoder_2
        return transformers.T5Config(vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=24,
                                     num_heads=64, feed_forward_proj="gated-gelu", relative_attention_num_buckets=32,
                                     tie_word_embeddings=False, is_encoder_decoder=False)
    if te_class == "CLIPTextModelWithProjection":  # CLIP-L's text tower (FLUX.1's text_encoder)
        return transformers.CLIPTextConfig(vocab_size=49408, hidden_size=768, intermediate_size=3072,
                                           num_hidden_layers=12, num_attention_heads=12, projection_dim=768,
                                           max_position_embeddings=77, hidden_act="quick_gelu")
    raise ValueError(te_class)


def full_size(te_class: str, seed: int = 0) -> torch.nn.Module:
    """The real-size encoder with deterministic values instead of trained ones: built on ``meta``, then filled
    tensor by tensor in bf16, so the float32 initialisation of billions of parameters never runs."""
    import transformers
    config = full_config(te_class)
    with torch.device("meta"):
        model = getattr(transformers, te_class)(config)
    model = model.to(torch.bfloat16).to_empty(device="cpu")
    # values drawn once (a bank of a prime length) and laid out from a different offset per tensor: as varied as the
    # test needs, at the cost of a memory copy rather than billions of random draws
    g = torch.Generator().manual_seed(seed)
    bank = torch.randn(BANK, generator=g, dtype=torch.float32)
    banks = {s: torch.cat([bank, bank]).mul_(s).to(torch.bfloat16) for s in (0.02, 0.1, 1.0)}
    with torch.no_grad():
        for i, (name, p) in enumerate(model.named_parameters()):
            values = banks[0.1 if "norm" in name else 1.0 if "embed" in name else 0.02]
            flat, at = p.view(-1), (i * 7919) % BANK
            for start in range(0, flat.numel(), BANK):
                n = min(BANK, flat.numel() - start)
                flat[start:start + n].copy_(values[at:at + n])
        if hasattr(model, "tie_weights"):
            model.tie_weights()
        for name, b in model.named_buffers():  # rotary inverse frequencies: computed again by the class
            if b.is_floating_point() and hasattr(model, "rotary_emb") and name.startswith("rotary_emb"):
                model.rotary_emb.__init__(config=config)
                break
    return model.eval()


# --- the int8 ConvRot encoder (Qwen-Image 2.1's Qwen3-VL-8B) -------------------------------------------------------
# Restated from ``scripts/build_te_int8_convrot_checkpoint.py`` and ``diffusion_te_prequant.quantize_int8_convrot_weight``:
# every decoder projection rotated by the group's Hadamard (``W_rot = W @ blockdiag(H).T`` in float32), then int8 with a
# float32 per-row scale (absmax / 127, at least 1e-12, round half to even, clamped to +-127) and a ``.comfy_quant``
# blob naming ComfyUI's format; every other tensor bf16; no lm_head; a canonical header (sorted keys, widest dtype
# first) in the plain-tensor container (``tensor_names`` + ``unsloth_format`` + ``unsloth_metadata``).

TE_FORMAT_INT8_CONVROT = "unsloth_prequant_text_encoder_int8_convrot_v1"
DECODER_LINEAR = re.compile(r"^model\.language_model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)"
                            r"\.weight$")
_ST_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16", "int8": "I8", "uint8": "U8"}


def qwen3vl_tiny_config():
    """A small Qwen3-VL of the real class: every decoder projection's input width a multiple of the 256 group."""
    import transformers
    return transformers.Qwen3VLConfig(
        text_config=dict(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                         rope_scaling={"rope_type": "default", "mrope_section": [8, 12, 12], "mrope_interleaved": True}),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=256,
                           num_position_embeddings=16, deepstack_visual_indexes=[0]))


def quantize_int8_convrot(weight: torch.Tensor, group: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    from unsloth_builder import hadamard
    out_f, in_f = weight.shape
    h = hadamard(group, torch.float32)
    rotated = (weight.float().reshape(out_f, in_f // group, group) @ h.T).reshape(out_f, in_f)
    scale = (rotated.abs().amax(dim=1, keepdim=True) / 127.0).clamp_min(1e-12)
    return torch.round(rotated / scale).clamp(-127, 127).to(torch.int8), scale


def write_canonical_safetensors(path: str, tensors: dict, metadata: dict) -> None:
    order = sorted(tensors, key=lambda n: (-tensors[n].element_size(), n))
    header: dict = {"__metadata__": dict(sorted(metadata.items()))}
    offset = 0
    for name in order:
        t = tensors[name]
        size = t.numel() * t.element_size()
        header[name] = {"dtype": _ST_DTYPES[str(t.dtype).replace("torch.", "")], "shape": list(t.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as fh:
        fh.write(len(blob).to_bytes(8, "little"))
        fh.write(blob)
        for name in order:
            fh.write(tensors[name].contiguous().view(torch.uint8).numpy().tobytes())


def build_int8_convrot_file(path: str, *, base_model_id: str = "Qwen/Qwen-Image-2.1", family: str = "qwen-image-2.1",
                            component: str = "text_encoder", te_class: str = "Qwen3VLForConditionalGeneration",
                            group: int = 256, seed: int = 0, dense: dict | None = None) -> dict:
    """Writes the int8 ConvRot encoder of a tiny Qwen3-VL (or of ``dense``, a transformers-named bf16 state dict).
    Returns the dense state dict it was built from."""
    import safetensors
    import transformers
    if dense is None:
        torch.manual_seed(seed)
        model = transformers.Qwen3VLForConditionalGeneration(qwen3vl_tiny_config()).to(torch.bfloat16)
        dense = {k: v.detach().clone() for k, v in model.state_dict().items()}
    quant = {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": group}
    blob = torch.tensor(list(json.dumps(quant).encode("utf-8")), dtype=torch.uint8)
    tensors: dict = {}
    quantized = 0
    for name in sorted(dense):
        if name == "lm_head.weight":
            continue
        t = dense[name]
        if DECODER_LINEAR.match(name):
            q, scale = quantize_int8_convrot(t, group)
            prefix = name[: -len(".weight")]
            tensors[name] = q.contiguous()
            tensors[prefix + ".weight_scale"] = scale.contiguous()
            tensors[prefix + ".comfy_quant"] = blob.clone()
            quantized += 1
        else:
            tensors[name] = t.to(torch.bfloat16).contiguous()
    meta = {"base_model_id": base_model_id, "family": family, "scheme": "int8", "component": component,
            "te_class": te_class, "torch_dtype": "bfloat16",
            "quant": dict(quant, weight_only=True, scale="per_output_channel_absmax_over_127", linears=quantized),
            "lm_head": "dropped", "torch_version": torch.__version__,
            "transformers_version": transformers.__version__, "safetensors_version": safetensors.__version__}
    names = sorted(tensors)
    header = {"unsloth_format": TE_FORMAT_INT8_CONVROT, "unsloth_metadata": json.dumps(meta, sort_keys=True),
              "tensor_names": json.dumps(names)}
    header.update({name: json.dumps({"_type": "Tensor"}) for name in names})
    write_canonical_safetensors(path, tensors, header)
    return dense
