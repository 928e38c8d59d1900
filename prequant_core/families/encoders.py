"""The text encoders this pack runs, one record per encoder model: the transformers classes Unsloth's builder
records for it (``te_class``), how its keys become the names ComfyUI's own encoder class loads, the keys that tell
ComfyUI's detection which encoder it is, and where its tokenizer comes from (the pre-cast file holds none).

Data only, like the family records that name these classes (``Family.hosting.text_encoders``):
``nodes/comfy_clip.py`` hands the renamed tensors to ComfyUI, which picks its class from the keys.
Since ComfyUI picks by keys, each record also says what its class's layers hold and how wide its released sizes are
(their configs: ComfyUI's ``text_encoders/llama.py`` and ``t5_config_xxl.json`` state the same), and one judge
(``EncoderKind.mismatches``) holds a file to the class it records: the load, Info / verify and the builder."""
from __future__ import annotations

import dataclasses
import re
from typing import Callable, Iterable, Mapping

# where the tokenizer comes from
TOKENIZER_COMFYUI = "comfyui"  # ComfyUI ships it next to its encoder class
TOKENIZER_SPIECE = "spiece"  # a SentencePiece model, passed to ComfyUI as the ``spiece_model`` tensor

# A token embedding of at least this many rows is a released model's, whose widths are its config's: every released
# tokenizer of these classes has tens of thousands of entries (T5's 32,128 the fewest). The scaled-down stand-ins the
# tests build of the real classes (tests/unsloth_te_builder.py: 256 rows, 64 wide) are judged on their structure alone.
RELEASED_VOCAB_MIN = 8192


@dataclasses.dataclass(frozen=True)
class Size:
    """One released model's widths, from its config: what every full-size file of it holds."""
    name: str  # "Qwen3-VL-4B"
    hidden: int  # hidden_size: the width of each layer's norms
    q: int  # query rows of a layer: attention heads x head dim
    kv: int  # key rows of a layer: key/value heads x head dim


# what every decoder layer of a Llama-style model holds (after its ``layers.N.``); the classes below add to it
DECODER_LAYER = ("input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
                 "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                 "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")
QK_NORM = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")  # Qwen3's and Gemma 3's per-head norms
SANDWICH_NORM = ("pre_feedforward_layernorm.weight", "post_feedforward_layernorm.weight")  # Gemma 2's and 3's
QKV_BIAS = ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias")  # Qwen2's attention biases
T5_BLOCK = ("layer.0.SelfAttention.q.weight", "layer.0.SelfAttention.k.weight", "layer.0.SelfAttention.v.weight",
            "layer.0.SelfAttention.o.weight", "layer.0.layer_norm.weight", "layer.1.DenseReluDense.wi_0.weight",
            "layer.1.DenseReluDense.wi_1.weight", "layer.1.DenseReluDense.wo.weight", "layer.1.layer_norm.weight")


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
    # building one (prequant_core/builder/text_encoder.py): ComfyUI key -> transformers key; copies the class's state
    # dict holds of a tied weight {key: the key it repeats}; the class's Embedding modules (never cast) and the
    # modules it keeps in float32 (``_keep_in_fp32_modules``, T5's ``wo``: never cast either)
    from_comfy: Callable[[str], str] = str
    tied: tuple[tuple[str, str], ...] = ()
    embeddings: tuple[str, ...] = ("embed_tokens",)
    keep_dense: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()  # what the class's strict load needs that ComfyUI's files drop (an untied lm_head)
    min_comfy: str | None = None  # the first ComfyUI with a class for it, where that is newer than any tested here
    schemes: tuple[str, ...] = ("fp8",)  # the forms Unsloth hosts it in (int8: the int8 ConvRot file)
    # What the class is, judged by ``mismatches``: where its layers stand in each naming its files use (ComfyUI's, the
    # transformers class's, an older transformers'), what every layer holds (a key another record's layers hold and
    # this one's do not is another class's: never here), the released sizes it stands for, and the layer keys whose
    # first dimension is the hidden width, the query rows and the key rows
    layers: tuple[str, ...] = ("model.layers.",)
    layer_keys: tuple[str, ...] = DECODER_LAYER
    sizes: tuple[Size, ...] = ()
    width_keys: tuple[str, str, str] = ("input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight")

    def mismatches(self, tensors: Mapping[str, object]) -> list[str]:
        """Why tensors (a name -> anything with a ``.shape``: tensors, header entries) are not this class's; empty
        when they are. Judged from what really differs between classes, never from one marker a bigger class also
        holds (Llama's layer is inside every Qwen3's): each layer 0..N must hold every key of the class's layer, no
        layer a key only other classes have (Qwen3's q_norm / k_norm in a Llama, a Qwen3 with one Gemma2 norm added
        labelled Gemma2) and, in a file of released size, the hidden width and the query / key rows of one of the
        released models it stands for (a Qwen3-8B is not a Qwen3-4B)."""
        layers = _layers(self, tensors)
        if not layers:
            return [f"no decoder layer (no '{self.layers[0]}0.{self.layer_keys[0]}')"]
        reasons: list[str] = []
        for prefix in sorted({p for p, _ in layers}):
            present = sorted(i for p, i in layers if p == prefix)
            # the first index missing below the last (looked for among as many indices as there are layers: a
            # header naming layer 999999999 costs nothing)
            have = set(present)
            hole = next(i for i in range(len(present) + 1) if i not in have)
            if hole < present[-1]:
                reasons.append(f"no layer '{prefix}{hole}.' (its layers run to '{prefix}{present[-1]}.')")
            gaps = [(i, k) for i in present for k in self.layer_keys if k not in layers[(prefix, i)]]
            if gaps:
                i, k = gaps[0]
                more = f" (and {len(gaps) - 1} more layer keys missing)" if len(gaps) > 1 else ""
                reasons.append(f"no '{prefix}{i}.{k}'{more}")
        own = set(self.layer_keys)
        foreign = {k: owners for k, owners in _layer_owners().items() if k not in own}
        held = sorted({k for keys in layers.values() for k in keys if k in foreign})
        if held:
            n = sum(1 for keys in layers.values() if any(k in foreign for k in keys))
            others = sorted({o for k in held for o in foreign[k]})
            count = f"its {n}" if n == len(layers) else f"{n} of its {len(layers)}"
            reasons.append(f"{count} layers hold {', '.join(held)}, which a {self.name}'s layers do not (a "
                           f"{' / '.join(others)}'s do)")
        if self.sizes and vocab_rows(tensors) >= RELEASED_VOCAB_MIN:
            reasons += self._size_reasons(layers)
        return reasons

    def _size_reasons(self, layers: dict) -> list[str]:
        first = min(layers)
        keys = layers[first]
        dims = [keys.get(k) for k in self.width_keys]
        if any(not d for d in dims):
            return []  # a missing layer key is reported above
        hidden, q, kv = (d[0] for d in dims)
        size = next((s for s in self.sizes if s.hidden == hidden), None)
        if size is None:
            return [f"hidden width {hidden} ('{first[0]}{first[1]}.{self.width_keys[0]}'), where "
                    + " or ".join(f"a {s.name}'s is {s.hidden}" for s in self.sizes)]
        if (q, kv) != (size.q, size.kv):
            return [f"attention rows {q} / {kv} ('{first[0]}{first[1]}.{self.width_keys[1]}' / "
                    f"'{self.width_keys[2]}'), a {size.name}'s are {size.q} / {size.kv}"]
        return []

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


def _layers(kind: EncoderKind, tensors: Mapping[str, object]) -> dict[tuple[str, int], dict[str, tuple]]:
    """{(prefix, index): {layer key: shape}} of the tensors under one of the kind's layer prefixes."""
    # an index of at most 9 digits (a longer one is no layer of any released model, and int() of thousands of digits
    # from a hostile header would raise)
    pats = [(p, re.compile(re.escape(p) + r"(\d{1,9})\.(.+)$")) for p in kind.layers]
    out: dict = {}
    for name, t in tensors.items():
        for p, pat in pats:
            m = pat.match(name)
            if m:
                out.setdefault((p, int(m.group(1))), {})[m.group(2)] = tuple(getattr(t, "shape", ()))
                break
    return out


def _layer_owners() -> dict[str, tuple[str, ...]]:
    """Each layer key any record declares -> the encoders whose layers hold it."""
    owners: dict[str, list[str]] = {}
    for k in KINDS:
        for key in k.layer_keys:
            owners.setdefault(key, []).append(k.name)
    return {key: tuple(v) for key, v in owners.items()}


def vocab_rows(tensors: Mapping[str, object]) -> int:
    """Rows of the file's token embedding (any record's embedding module; 0 when it has none)."""
    names = {k.embeddings[0] for k in KINDS}
    rows = [getattr(t, "shape", ())[:1] for n, t in tensors.items() if n.endswith(".weight")
            and n[: -len(".weight")].rsplit(".", 1)[-1] in names and len(getattr(t, "shape", ())) == 2]
    return max((r[0] for r in rows if r), default=0)


def identify(tensors: Mapping[str, object]) -> EncoderKind | None:
    """The encoder whose structure (and, at released size, widths) the tensors have."""
    return next((k for k in KINDS if not k.mismatches(tensors)), None)


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


def _qwen25_vl_back(k: str) -> str:
    if k.startswith("model.") and not k.startswith("model.language_model."):
        return "model.language_model." + k[len("model."):]
    if k.startswith("visual."):
        return "model." + k
    return k


KINDS: tuple[EncoderKind, ...] = (
    EncoderKind("Gemma2-2B", ("Gemma2Model",), _prefixed("model."),
                ("model.layers.0.post_feedforward_layernorm.weight",),
                tokenizer=TOKENIZER_SPIECE, tokenizer_file="tokenizer/tokenizer.model",
                comfy_file_hint="gemma_2_2b_fp16.safetensors", from_comfy=lambda k: k.removeprefix("model."),
                layers=("model.layers.", "layers."), layer_keys=DECODER_LAYER + SANDWICH_NORM,
                sizes=(Size("Gemma2-2B", 2304, 8 * 256, 4 * 256),)),
    EncoderKind("Qwen3-4B", ("Qwen3ForCausalLM", "Qwen3Model"), _prefixed("model.", drop=("lm_head",)),
                ("model.layers.0.self_attn.q_norm.weight", "model.layers.0.post_attention_layernorm.weight"),
                tied=(("lm_head.weight", "model.embed_tokens.weight"),),
                layers=("model.layers.", "layers."), layer_keys=DECODER_LAYER + QK_NORM,
                sizes=(Size("Qwen3-4B", 2560, 32 * 128, 8 * 128),)),
    EncoderKind("Qwen2.5-VL-7B", ("Qwen2_5_VLForConditionalGeneration",), _qwen25_vl,
                ("model.layers.0.self_attn.k_proj.bias",), from_comfy=_qwen25_vl_back, needs=("lm_head.weight",),
                layers=("model.layers.", "model.language_model.layers."), layer_keys=DECODER_LAYER + QKV_BIAS,
                sizes=(Size("Qwen2.5-VL-7B", 3584, 28 * 128, 4 * 128),)),
    # T5's encoder.embed_tokens is the tied copy of ``shared``
    EncoderKind("T5-XXL", ("T5EncoderModel",), lambda k: None if k == "encoder.embed_tokens.weight" else k,
                ("encoder.block.23.layer.1.DenseReluDense.wi_1.weight",),
                tied=(("encoder.embed_tokens.weight", "shared.weight"),),
                embeddings=("shared", "embed_tokens", "relative_attention_bias"), keep_dense=("wo",),
                layers=("encoder.block.",), layer_keys=T5_BLOCK, sizes=(Size("T5-XXL", 4096, 64 * 64, 64 * 64),),
                width_keys=("layer.0.layer_norm.weight", "layer.0.SelfAttention.q.weight",
                            "layer.0.SelfAttention.k.weight")),
    EncoderKind("Llama-3.1-8B", ("LlamaForCausalLM",), _prefixed("model.", drop=("lm_head",)),
                ("model.layers.0.post_attention_layernorm.weight",), needs=("lm_head.weight",),
                sizes=(Size("Llama-3.1-8B", 4096, 32 * 128, 8 * 128),)),
    # Krea 2's (Qwen3-VL-4B, diffusers' Qwen3VLModel, fp8) and Qwen-Image 2.1's (Qwen3-VL-8B, int8 ConvRot): ComfyUI's
    # classes for them (qwen3vl_4b / qwen3vl_8b) arrive in 0.38.1, which no ComfyUI here has, so no key map is restated
    # yet; Info and verify describe the files, the node names the version and ComfyUI's own file (the family's)
    EncoderKind("Qwen3-VL", ("Qwen3VLModel", "Qwen3VLForConditionalGeneration"), None,
                ("model.language_model.layers.0.self_attn.q_norm.weight",), min_comfy="0.38.1",
                comfy_file_hint="qwen3vl_4b_fp8_scaled.safetensors or qwen3vl_8b_int8_convrot.safetensors",
                schemes=("fp8", "int8"), layers=("model.language_model.layers.", "language_model.layers."),
                layer_keys=DECODER_LAYER + QK_NORM,
                sizes=(Size("Qwen3-VL-4B", 2560, 32 * 128, 8 * 128), Size("Qwen3-VL-8B", 4096, 32 * 128, 8 * 128))),
    # FLUX.2 [dev]'s Mistral-Small-3.1-24B and LTX-2's Gemma 3 12B (diffusers' Mistral3ForConditionalGeneration /
    # Gemma3ForConditionalGeneration, Unsloth's fp8 files in unsloth/FLUX.2-dev-FP8 and unsloth/LTX-2-FP8): ComfyUI 0.33
    # has classes for both (type flux2 / ltxv), but the pack restates no key map to them yet (each is checked only at
    # full size, 24B / 12B, which this machine cannot hold twice): read, judged and described; the node names ComfyUI's
    # own file of the encoder
    EncoderKind("Mistral-Small-24B", ("Mistral3ForConditionalGeneration",), None,
                ("model.language_model.layers.0.post_attention_layernorm.weight", "model.vision_tower.patch_conv.weight"),
                comfy_file_hint="mistral_3_small_flux2_bf16.safetensors (type flux2)",
                layers=("model.language_model.layers.", "language_model.model.layers."),
                sizes=(Size("Mistral-Small-3.1-24B", 5120, 32 * 128, 8 * 128),)),
    EncoderKind("Gemma3-12B", ("Gemma3ForConditionalGeneration",), None,
                ("model.language_model.layers.0.pre_feedforward_layernorm.weight",),
                comfy_file_hint="gemma_3_12B_it_fp4_mixed.safetensors (type ltxv)",
                layers=("model.language_model.layers.", "language_model.model.layers."),
                layer_keys=DECODER_LAYER + QK_NORM + SANDWICH_NORM,
                sizes=(Size("Gemma3-12B", 3840, 16 * 256, 8 * 256),)),
)


def for_class(te_class) -> EncoderKind | None:
    for k in KINDS:
        if te_class in k.te_classes:
            return k
    return None
