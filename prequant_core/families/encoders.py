"""The text encoders this pack runs, one record per encoder model: the transformers classes Unsloth's builder
records for it (``te_class``), how its keys become the names ComfyUI's own encoder class loads, the keys that tell
ComfyUI's detection which encoder it is, and where its tokenizer comes from (the pre-cast file holds none).

Data only, like the family records that name these classes (``Family.text_encoders``): ``nodes/comfy_clip.py`` hands the renamed tensors to ComfyUI, which picks its class from the keys."""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterable

# where the tokenizer comes from
TOKENIZER_COMFYUI = "comfyui"  # ComfyUI ships it next to its encoder class
TOKENIZER_SPIECE = "spiece"  # a SentencePiece model, passed to ComfyUI as the ``spiece_model`` tensor


@dataclasses.dataclass(frozen=True)
class EncoderKind:
    name: str  # what a user reads ("Gemma2-2B")
    te_classes: tuple[str, ...]  # transformers classes whose state dict this is
    # transformers key -> ComfyUI key (None from it: not used by ComfyUI, dropped); None itself: this pack has no map to
    # ComfyUI's class for the encoder yet (``min_comfy`` says which ComfyUI has the class): described, never built
    comfy_key: Callable[[str], str | None] | None
    markers: tuple[str, ...]  # ComfyUI-layout keys that make ComfyUI's detection pick this encoder
    tokenizer: str = TOKENIZER_COMFYUI
    tokenizer_file: str | None = None  # the tokenizer's path in the base model's repo (TOKENIZER_SPIECE)
    comfy_file_hint: str = ""  # ComfyUI's own file of the same encoder (its tokenizer can serve)
    # building one (prequant_core/build/text_encoder.py): ComfyUI key -> transformers key; copies the class's state
    # dict holds of a tied weight {key: the key it repeats}; the class's Embedding modules (never cast) and the
    # modules it keeps in float32 (``_keep_in_fp32_modules``, T5's ``wo``: never cast either)
    from_comfy: Callable[[str], str] = str
    tied: tuple[tuple[str, str], ...] = ()
    embeddings: tuple[str, ...] = ("embed_tokens",)
    keep_dense: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()  # what the class's strict load needs that ComfyUI's files drop (an untied lm_head)
    min_comfy: str | None = None  # the first ComfyUI with a class for it, where that is newer than any tested here
    schemes: tuple[str, ...] = ("fp8",)  # the forms Unsloth hosts it in (int8: the int8 ConvRot file)

    def not_this_encoder(self, keys: Iterable[str]) -> list[str]:
        """The marker tensors ``keys`` lacks in both namings (ComfyUI's, and the transformers class's that the files
        hold), any layer index standing for the marker's (a smaller model of the same class has fewer layers): non-empty
        when the tensors are another encoder's (a Gemma2 or a CLIP-L labelled as this one). Only for the encoders the
        pack maps (a name map both ways is known)."""
        import re
        if not self.hostable:
            return []
        keys = set(keys)

        def lacking(names):
            pats = [re.compile(re.sub(r"\\\.\d+\\\.", r"\\.\\d+\\.", re.escape(m)) + "$") for m in names]
            return [m for m, p in zip(names, pats) if not any(p.match(k) for k in keys)]
        if not lacking(self.markers):
            return []
        return lacking([self.from_comfy(m) for m in self.markers])

    def needs_comfy(self, hosted=None) -> str | None:
        """The first ComfyUI with a class for it: the family's (``HostedEncoder.min_comfy``) where it names one."""
        return (hosted.min_comfy if hosted is not None else None) or self.min_comfy

    @property
    def hostable(self) -> bool:
        """Whether the node can hand it to ComfyUI (a key map to ComfyUI's class is known)."""
        return self.comfy_key is not None

    def to_comfy(self, tensors: dict) -> dict:
        if self.comfy_key is None:
            raise ValueError(f"no ComfyUI key map for the {self.name}")
        out = {}
        for k, v in tensors.items():
            name = self.comfy_key(k)
            if name is not None:
                out[name] = v
        return out

    def missing_markers(self, comfy_keys: Iterable[str]) -> list[str]:
        keys = set(comfy_keys)
        return [m for m in self.markers if m not in keys]


def _prefixed(prefix: str, drop: tuple[str, ...] = ()) -> Callable[[str], str | None]:
    def key(k: str) -> str | None:
        if any(k == d or k.startswith(d + ".") for d in drop):
            return None
        return k if k.startswith(prefix) else prefix + k
    return key


def _qwen25_vl(k: str) -> str | None:
    """transformers >= 4.52 nests the language model and the vision tower under ``model.``; ComfyUI (and older
    transformers) name them ``model.layers`` / ``visual``."""
    if k == "lm_head.weight":
        return None
    if k.startswith("model.language_model."):
        return "model." + k[len("model.language_model."):]
    if k.startswith("model.visual."):
        return k[len("model."):]
    return k


def _unprefixed(prefix: str) -> Callable[[str], str]:
    return lambda k: k[len(prefix):] if k.startswith(prefix) else k


def _qwen25_vl_back(k: str) -> str:
    if k.startswith("model.") and not k.startswith("model.language_model."):
        return "model.language_model." + k[len("model."):]
    if k.startswith("visual."):
        return "model." + k
    return k


def _t5(k: str) -> str | None:
    return None if k == "encoder.embed_tokens.weight" else k  # the tied copy of ``shared``


KINDS: tuple[EncoderKind, ...] = (
    EncoderKind("Gemma2-2B", ("Gemma2Model",), _prefixed("model."),
                ("model.layers.0.post_feedforward_layernorm.weight",),
                tokenizer=TOKENIZER_SPIECE, tokenizer_file="tokenizer/tokenizer.model",
                comfy_file_hint="gemma_2_2b_fp16.safetensors", from_comfy=_unprefixed("model.")),
    EncoderKind("Qwen3-4B", ("Qwen3ForCausalLM", "Qwen3Model"), _prefixed("model.", drop=("lm_head",)),
                ("model.layers.0.self_attn.q_norm.weight", "model.layers.0.post_attention_layernorm.weight"),
                tied=(("lm_head.weight", "model.embed_tokens.weight"),)),
    EncoderKind("Qwen2.5-VL-7B", ("Qwen2_5_VLForConditionalGeneration",), _qwen25_vl,
                ("model.layers.0.self_attn.k_proj.bias",), from_comfy=_qwen25_vl_back, needs=("lm_head.weight",)),
    EncoderKind("T5-XXL", ("T5EncoderModel",), _t5, ("encoder.block.23.layer.1.DenseReluDense.wi_1.weight",),
                tied=(("encoder.embed_tokens.weight", "shared.weight"),),
                embeddings=("shared", "embed_tokens", "relative_attention_bias"), keep_dense=("wo",)),
    EncoderKind("Llama-3.1-8B", ("LlamaForCausalLM",), _prefixed("model.", drop=("lm_head",)),
                ("model.layers.0.post_attention_layernorm.weight",), needs=("lm_head.weight",)),
    # Krea 2's (Qwen3-VL-4B, diffusers' Qwen3VLModel, fp8) and Qwen-Image 2.1's (Qwen3-VL-8B, int8 ConvRot): ComfyUI's
    # classes for them (qwen3vl_4b / qwen3vl_8b) arrive in 0.38.1, which no ComfyUI here has, so no key map is restated
    # yet; Info and verify describe the files, the node names the version and ComfyUI's own file (the family's)
    EncoderKind("Qwen3-VL", ("Qwen3VLModel", "Qwen3VLForConditionalGeneration"), None,
                ("model.language_model.layers.0.self_attn.q_norm.weight",), min_comfy="0.38.1",
                comfy_file_hint="qwen3vl_4b_fp8_scaled.safetensors or qwen3vl_8b_int8_convrot.safetensors",
                schemes=("fp8", "int8")),
    # FLUX.2 [dev]'s Mistral-Small-3.1-24B and LTX-2's Gemma 3 12B (diffusers' Mistral3ForConditionalGeneration /
    # Gemma3ForConditionalGeneration, Unsloth's fp8 files in unsloth/FLUX.2-dev-FP8 and unsloth/LTX-2-FP8): ComfyUI 0.33
    # has classes for both (type flux2 / ltxv), but the pack restates no key map to them yet (each is checked only at
    # full size, 24B / 12B, which this machine cannot hold twice): read, judged and described; the node names ComfyUI's
    # own file of the encoder
    EncoderKind("Mistral-Small-24B", ("Mistral3ForConditionalGeneration",), None,
                ("model.language_model.layers.0.post_attention_layernorm.weight", "model.vision_tower.patch_conv.weight"),
                comfy_file_hint="mistral_3_small_flux2_bf16.safetensors (type flux2)"),
    EncoderKind("Gemma3-12B", ("Gemma3ForConditionalGeneration",), None,
                ("model.language_model.layers.0.pre_feedforward_layernorm.weight",),
                comfy_file_hint="gemma_3_12B_it_fp4_mixed.safetensors (type ltxv)"),
)


def for_class(te_class) -> EncoderKind | None:
    for k in KINDS:
        if te_class in k.te_classes:
            return k
    return None


def known_classes() -> tuple[str, ...]:
    return tuple(c for k in KINDS for c in k.te_classes)
