"""Unsloth Studio's pre-quantized transformer builder, restated for tests from its public source (unslothai/unsloth:
``studio/backend/core/inference/diffusion_transformer_quant.py`` (filter, configs), ``diffusion_prequant.py``
(tags, fingerprint), ``diffusion_convrot.py``, ``diffusion_nvfp4_policy.py``, ``prequant_safetensors.py``,
``scripts/build_prequant_checkpoint.py``, ``scripts/convert_prequant_to_safetensors.py``; see docs/FORMAT.md).

Written in our own words and deliberately independent of this pack: nothing here imports ``prequant_core``. A reader
is only tested on files its own writer did not write; every file the conformance corpus loads comes from here.

What it does, as Unsloth's builder does:
  * the model is a real diffusers transformer in bf16; the layer filter walks ``named_modules()`` (``nn.Linear``;
    in and out features >= min_features; both divisible by the scheme's ``require_divisible``; no excluded token
    in the lower-cased name; bf16 weight where the scheme requires it);
  * torchao's own ``quantize_`` with Unsloth's config per scheme. Two of torchao's handlers refuse to run on a CPU
    (fp8 asserts compute capability >= 8.9, NVFP4 >= 10.0): that gate is hardware policy, not arithmetic, so it is
    lifted while ``quantize_`` runs (``_no_hardware_gate``) and the tensors are torchao's own;
  * ConvRot (v2): the weights of the rotatable Linears are rotated in float32 by the block Hadamard built from the
    *regular* 4x4 Hadamard, before quantizing; NVFP4 layer policy (v3): rules claim layers for nvfp4, the rest of
    the admitted layers take fp8, every other Linear stays bf16;
  * the metadata dict with Unsloth's keys, values and order (``version="current"``, or ``"released"``: the key
    set of releases v0.1.52 - v0.1.801, without component / require_divisible / fingerprint, and without the
    divisibility filter), the format tag, and the containers: the ``torch.save`` dict, or safetensors flattened with
    torchao's own helper plus ``unsloth_format`` / ``unsloth_metadata`` / ``unsloth_root_tensors`` (and, for a
    file converted from a pickle, ``unsloth_quant_layout`` / ``unsloth_source``).

``python tests/unsloth_builder.py FAMILY KIND PATH`` writes one file (container from the extension) (the diffusers-0.42 families are built
in a subprocess that has that diffusers first on its path).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import sys

import torch

FORMAT_V1 = "unsloth_prequant_transformer_state_dict_v1"
FORMAT_V2 = "unsloth_prequant_transformer_state_dict_v2"
FORMAT_V3 = "unsloth_prequant_transformer_state_dict_v3"

GENERIC_INT8_EXCLUDE = ("norm", "_mod", "modulation", "timestep_embed", "guidance_embed", "time_text_embed", "pooled",
                        "time_embed")
FAMILY_INT8_EXCLUDE = {
    "qwen-image": ("txt_in", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out", "txt_mlp"),
    "qwen-image-edit": ("txt_in", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out", "txt_mlp"),
    "hunyuanvideo-1.5": ("context_embedder", "image_embedder", "add_q_proj", "add_k_proj", "add_v_proj",
                         "to_add_out", "ff_context"),
    "hunyuanvideo-1.5-720p": ("context_embedder", "image_embedder", "add_q_proj", "add_k_proj", "add_v_proj",
                              "to_add_out", "ff_context"),
    "minimax-h3": ("adaln_proj",),
    "ltx-2": ("audio", "av_cross_attn", "adaln"),
}
REQUIRE_BF16 = ("fp8", "mxfp8")
DIVISIBLE = {"int8": 0, "fp8": 16, "nvfp4": 16, "mxfp8": 32}
MIN_FEATURES = 512
# Unsloth's family table: family -> (diffusers class, base repo)
FAMILIES = {
    "z-image": ("ZImageTransformer2DModel", "Tongyi-MAI/Z-Image-Turbo"),
    "flux.1": ("FluxTransformer2DModel", "black-forest-labs/FLUX.1-dev"),
    "flux.2-klein": ("Flux2Transformer2DModel", "black-forest-labs/FLUX.2-klein-4B"),
    "flux.2-dev": ("Flux2Transformer2DModel", "black-forest-labs/FLUX.2-dev"),
    "qwen-image": ("QwenImageTransformer2DModel", "Qwen/Qwen-Image"),
    "qwen-image-2.1": ("QwenImage21Transformer2DModel", "Qwen/Qwen-Image-2.1"),
    "krea-2": ("Krea2Transformer2DModel", "krea/Krea-2-Turbo"),
    "ltx-2": ("LTX2VideoTransformer3DModel", "Lightricks/LTX-2.3"),
    "minimax-h3": ("MiniMaxH3Transformer3DModel", "MiniMaxAI/MiniMax-H3"),
    "lumina-2": ("Lumina2Transformer2DModel", "Alpha-VLLM/Lumina-Image-2.0"),
    "hidream-i1": ("HiDreamImageTransformer2DModel", "HiDream-ai/HiDream-I1-Full"),
    "hunyuanimage-2.1": ("HunyuanImageTransformer2DModel", "hunyuanvideo-community/HunyuanImage-2.1-Diffusers"),
    "wan2.2-ti2v-5b": ("WanTransformer3DModel", "Wan-AI/Wan2.2-TI2V-5B-Diffusers"),
    "wan2.2-t2v-a14b": ("WanTransformer3DModel", "Wan-AI/Wan2.2-T2V-A14B-Diffusers"),
    "hunyuanvideo-1.5": ("HunyuanVideo15Transformer3DModel",
                         "hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v"),
}
CONVROT_KIND = "convrot_hadamard_v1"
POLICY_KIND = "unsloth_nvfp4_layer_policy_v1"
# The kinds of file the corpus holds, and the scheme each records
KINDS = {"int8": "int8", "fp8": "fp8", "nvfp4": "nvfp4", "policy": "nvfp4", "convrot": "int8", "mxfp8": "mxfp8"}


def exclude_tokens(scheme: str, family: str) -> list[str]:
    if scheme != "int8":
        return []
    return [*GENERIC_INT8_EXCLUDE, *FAMILY_INT8_EXCLUDE.get(family.strip().lower(), ())]


def make_filter(min_features: int, tokens, require_bf16: bool, divisible: int):
    """Unsloth's ``make_filter_fn``: checks in its order (Linear, size, divisibility, tokens, dtype)."""
    def keep(module, fqn: str) -> bool:
        if not isinstance(module, torch.nn.Linear):
            return False
        if module.in_features < min_features or module.out_features < min_features:
            return False
        if divisible and (module.in_features % divisible or module.out_features % divisible):
            return False
        low = (fqn or "").lower()
        if any(t in low for t in tokens):
            return False
        if require_bf16 and getattr(module, "weight", None) is not None and module.weight.dtype != torch.bfloat16:
            return False
        return True
    return keep


def quant_config(scheme: str, fast_accum: bool = True, granularity: str = "per_row"):
    """Unsloth's ``_make_quant_config`` (``granularity="per_tensor"``: fp8 as its older builds made it, one scale per
    weight, the files its current loader calls stale)."""
    if scheme == "int8":
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig
        return Int8DynamicActivationInt8WeightConfig()
    if scheme == "fp8":
        from torchao.float8.inference import Float8MMConfig
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, PerTensor
        from torchao.quantization.quantize_.common import KernelPreference
        gran = PerTensor() if granularity == "per_tensor" else PerRow()
        return Float8DynamicActivationFloat8WeightConfig(granularity=gran, activation_value_lb=1e-12,
                                                         kernel_preference=KernelPreference.TORCH,
                                                         mm_config=Float8MMConfig(use_fast_accum=fast_accum))
    if scheme == "nvfp4":
        from torchao.prototype.mx_formats import NVFP4DynamicActivationNVFP4WeightConfig
        return NVFP4DynamicActivationNVFP4WeightConfig(use_triton_kernel=False)
    if scheme == "mxfp8":
        from torchao.prototype.mx_formats import MXDynamicActivationMXWeightConfig
        return MXDynamicActivationMXWeightConfig(activation_dtype=torch.float8_e4m3fn, weight_dtype=torch.float8_e4m3fn)
    raise ValueError(scheme)


@contextlib.contextmanager
def _no_hardware_gate():
    """torchao's fp8 and NVFP4 handlers assert a new enough NVIDIA GPU before building the very tensors they would
    build anywhere; the assert is lifted for the duration (test helper only)."""
    import torchao.prototype.mx_formats.inference_workflow as iw
    import torchao.quantization.quant_api as qa
    saved = qa._check_hardware_support, iw.is_sm_at_least_100
    qa._check_hardware_support = lambda *a, **k: None
    iw.is_sm_at_least_100 = lambda: True
    try:
        yield
    finally:
        qa._check_hardware_support, iw.is_sm_at_least_100 = saved


def quantize(model: torch.nn.Module, scheme: str, keep, fast_accum: bool = True, granularity: str = "per_row") -> None:
    from torchao.quantization import quantize_
    with _no_hardware_gate():
        quantize_(model, quant_config(scheme, fast_accum, granularity), filter_fn=keep)


# --- ConvRot ------------------------------------------------------------------------------------------------------

def hadamard(group: int, dtype=torch.float32) -> torch.Tensor:
    """Unsloth's ``build_convrot_hadamard``: the regular H4 (entry -1 on the anti-diagonal), Kronecker-multiplied
    with itself (H4 on the right) up to ``group``, over sqrt(group)."""
    h4 = torch.tensor([[1, 1, 1, -1], [1, 1, -1, 1], [1, -1, 1, 1], [-1, 1, 1, 1]], dtype=torch.float64)
    h = h4
    while h.shape[0] < group:
        h = torch.kron(h, h4)
    assert h.shape[0] == group, group
    return (h / math.sqrt(group)).to(dtype)


def rotate_weight_(linear: torch.nn.Linear, group: int) -> None:
    """W <- W blockdiag(H)^T along the input features, in float32, back to the weight's dtype."""
    w = linear.weight.data
    out_f, in_f = w.shape
    h = hadamard(group, torch.float32)
    r = (w.float().reshape(out_f, in_f // group, group) @ h.T).reshape(out_f, in_f)
    linear.weight.data = r.to(w.dtype)


# --- NVFP4 policy -------------------------------------------------------------------------------------------------

def assign_precisions(model, rules, min_features: int = MIN_FEATURES) -> dict:
    """{fqn: 'nvfp4' | 'fp8' | 'bf16'} for every Linear: the admitted layers (bf16, dims divisible by 16, no
    ``lora_``) are claimed by the first rule whose dotted suffix they end with, the rest of them take fp8; every
    other Linear stays bf16."""
    admit = make_filter(min_features, ("lora_",), True, 16)
    out = {}
    for fqn, mod in model.named_modules():
        if not isinstance(mod, torch.nn.Linear):
            continue
        if not admit(mod, fqn):
            out[fqn] = "bf16"
        elif any(fqn == r or fqn.endswith("." + r) for r in rules):
            out[fqn] = "nvfp4"
        else:
            out[fqn] = "fp8"
    return out


def policy_block(prec: dict, policy_id: str, version: int = 1) -> dict:
    counts = {}
    for p in sorted(set(prec.values())):  # keys sorted: bf16, fp8, nvfp4; a precision no layer took is absent
        counts[p] = sum(1 for v in prec.values() if v == p)
    return {"kind": POLICY_KIND, "policy_id": policy_id, "policy_version": version, "counts": counts,
            "nvfp4_fqns": sorted(f for f, p in prec.items() if p == "nvfp4"), "activation_scales_baked": False,
            "gptq": False}


# --- fingerprint --------------------------------------------------------------------------------------------------

_FP_ATTRS = {
    "NVFP4Tensor": ("qdata", "scale", "per_tensor_scale"), "Float8Tensor": ("qdata", "scale"),
    "Int8Tensor": ("qdata", "scale", "zero_point", "act_quant_scale", "act_quant_zero_point", "act_pre_scale"),
    "MXTensor": ("qdata", "scale"), "LinearActivationQuantizedTensor": ("original_weight_tensor",),
    "AffineQuantizedTensor": ("tensor_impl",), "PlainAQTTensorImpl": ("int_data", "scale", "zero_point"),
}


def _fp_feed(h, t) -> bool:
    attrs = _FP_ATTRS.get(type(t).__name__)
    if attrs is None:
        return False
    covered = False
    for a in attrs:
        v = getattr(t, a, None)
        if v is None:
            continue
        h.update(a.encode("utf-8"))
        if type(v).__name__ in _FP_ATTRS:
            if not _fp_feed(h, v):
                raise ValueError(a)
        else:
            v = v.detach()
            v = v.reshape(1) if v.ndim == 0 else v
            h.update(v.contiguous().view(torch.uint8).cpu().numpy().tobytes())
        covered = True
    return covered


def packed_weight_fingerprint(sd: dict) -> dict:
    """Unsloth's ``md5-packed-v1`` over a state dict, in its order."""
    mods, skipped = {}, []
    for k, v in sd.items():
        if not (k == "weight" or k.endswith(".weight")):
            continue
        h = hashlib.md5()
        try:
            ok = _fp_feed(h, v)
        except (ValueError, RuntimeError, TypeError):
            ok = False
        if ok:
            mods[k] = h.hexdigest()
        else:
            skipped.append(k)
    return {"algo": "md5-packed-v1", "count": len(mods), "modules": mods, "skipped": skipped}


# --- metadata and containers --------------------------------------------------------------------------------------

def _versions() -> dict:
    import diffusers
    import torchao
    return {"torch_version": torch.__version__, "torchao_version": getattr(torchao, "__version__", "?"),
            "diffusers_version": diffusers.__version__}


def metadata(*, family: str, scheme: str, sd: dict, base_model_id: str, component: str = "transformer",
             version: str = "current", exclude=None, fast_accum=None, extra: dict | None = None,
             fp8_granularity: str = "per_row") -> dict:
    """Unsloth's metadata dict in its insertion order (``extra``: policy or rotation keys, appended as it does)."""
    cls = FAMILIES[family][0]
    ex = list(exclude_tokens(scheme, family) if exclude is None else exclude)
    fa = fast_accum if fast_accum is not None else (True if scheme == "fp8" else None)
    if version == "released":
        m = {"base_model_id": base_model_id, "family": family, "scheme": scheme, "min_features": MIN_FEATURES,
             "exclude_name_tokens": ex, "require_bf16": scheme in REQUIRE_BF16, "fast_accum": fa,
             "torch_dtype": "bfloat16", "quant_backend": "torchao", "transformer_class": cls, **_versions()}
    else:
        m = {"base_model_id": base_model_id, "family": family, "scheme": scheme, "component": component,
             "min_features": MIN_FEATURES, "exclude_name_tokens": ex, "require_bf16": scheme in REQUIRE_BF16,
             "require_divisible": DIVISIBLE[scheme], "fingerprint": packed_weight_fingerprint(sd), "fast_accum": fa,
             "torch_dtype": "bfloat16", "quant_backend": "torchao", "transformer_class": cls, **_versions()}
    extra = dict(extra or {})
    policy = extra.pop("nvfp4_policy", None)
    if scheme == "fp8":
        m["fp8_granularity"] = fp8_granularity
    if policy is not None:
        m["nvfp4_policy"] = policy
        m["fp8_granularity"] = "per_row"
    m.update(extra)  # rotation keys last
    return m


def format_tag(meta: dict) -> str:
    if meta.get("activation_rotation") and meta.get("nvfp4_policy"):
        raise ValueError("a file declares a rotation or a policy, never both")
    if meta.get("nvfp4_policy") not in (None, ""):
        return FORMAT_V3
    return FORMAT_V2 if meta.get("activation_rotation") not in (None, "") else FORMAT_V1


def save_pt(path: str, sd: dict, meta: dict) -> str:
    torch.save({"format": format_tag(meta), "metadata": meta, "state_dict": sd}, path)
    return path


def save_safetensors(path: str, sd: dict, meta: dict, *, converted_from: str | None = None) -> str:
    """torchao's ``flatten_tensor_state_dict`` + Unsloth's header entries; root-level keys (no dot) go in as
    ``unsloth_root::<key>``. ``converted_from``: the ``.pt`` this file was converted from (the converter also writes
    ``unsloth_quant_layout`` and ``unsloth_source``)."""
    from safetensors.torch import save_file
    from torchao.prototype.safetensors.safetensors_support import flatten_tensor_state_dict
    roots = {k: v for k, v in sd.items() if "." not in k}
    rest = {k: v for k, v in sd.items() if "." in k}
    tensors, header = flatten_tensor_state_dict(rest)
    for k, v in roots.items():
        tensors["unsloth_root::" + k] = v.contiguous()
    header = dict(header)
    header["unsloth_format"] = format_tag(meta)
    header["unsloth_metadata"] = json.dumps(meta, default=str)
    if converted_from is not None:
        kinds = {type(v).__name__ for v in sd.values()}
        weights = {}
        if "Int8Tensor" in kinds:
            weights["int8"] = {"tensors": "qdata int8 [out,in], scale float32 [out,1], zero_point",
                               "dequant": "qdata * scale", "activation": "per-token symmetric int8"}
        if "Float8Tensor" in kinds:
            weights["fp8"] = {"tensors": "qdata float8_e4m3fn [out,in], scale float32 [out,1]",
                              "dequant": "qdata * scale", "activation": "per-row float8_e4m3fn"}
        header["unsloth_quant_layout"] = json.dumps({"version": 1, "weights": weights})
        with open(converted_from, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        header["unsloth_source"] = json.dumps({"file": os.path.basename(converted_from), "sha256": digest,
                                               "bytes": os.path.getsize(converted_from),
                                               "converter_torch": torch.__version__})
    if roots:
        header["unsloth_root_tensors"] = json.dumps(sorted(roots))
    save_file(tensors, path, metadata=header)
    return path


# --- the builder --------------------------------------------------------------------------------------------------

def tiny_model(family: str, seed: int = 0) -> torch.nn.Module:
    """The family's tiny diffusers model (tools/tiny_families), in bf16 as Unsloth loads the dense transformer."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tools import tiny_families
    return tiny_families.any_diffusers_model(family, seed, torch.float32).to(torch.bfloat16).eval()


def build(model: torch.nn.Module, family: str, kind: str, paths, *, base_model_id: str | None = None,
          component: str = "transformer", version: str = "current", group: int = 256, policy_id: str = "tiny_test_v1",
          policy_rules=("attn.to_q", "attention.to_q", "attn1.to_q"), exclude=None,
          fp8_granularity: str = "per_row") -> dict:
    """Quantize ``model`` (changed in place) as Unsloth's builder does for ``kind`` (``KINDS``) and write each of
    ``paths`` (``.pt`` or ``.safetensors``, from the name; a ``.safetensors`` after a ``.pt`` is written as Unsloth's
    converter makes it from that pickle). ``fp8_granularity="per_tensor"``: an fp8 file of Unsloth's older builds, one
    scale per weight. Returns the metadata written."""
    paths = [paths] if isinstance(paths, str) else list(paths)
    scheme = KINDS[kind]
    base = base_model_id or FAMILIES[family][1]
    divisible = 0 if version == "released" else DIVISIBLE[scheme]
    extra: dict = {}
    if kind == "policy":
        prec = assign_precisions(model, policy_rules)
        nv = {f for f, p in prec.items() if p == "nvfp4"}
        f8 = {f for f, p in prec.items() if p == "fp8"}
        quantize(model, "nvfp4", lambda m, n: n in nv)
        quantize(model, "fp8", lambda m, n: n in f8, fast_accum=True)
        extra["nvfp4_policy"] = policy_block(prec, policy_id)
        fast_accum = True
    else:
        keep = make_filter(MIN_FEATURES, exclude_tokens(scheme, family) if exclude is None else exclude,
                           scheme in REQUIRE_BF16, divisible)
        if kind == "convrot":
            fqns = sorted(n for n, m in model.named_modules() if keep(m, n) and m.in_features % group == 0)
            assert fqns, "no rotatable Linear"
            mods = dict(model.named_modules())
            for n in fqns:
                rotate_weight_(mods[n], group)
            extra.update({"activation_rotation": CONVROT_KIND, "activation_rotation_group": group,
                          "activation_rotation_fqns": fqns})
        quantize(model, scheme, keep, granularity=fp8_granularity)
        fast_accum = None
    sd = {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
    if "time_embedder.table" in sd:  # MiniMax-H3 in its pruned adaLN form: the builder records the form it baked in
        grid, dim = sd["time_embedder.table"].shape
        extra.update({"adaln_form": "curve", "curve_dim": int(dim), "curve_grid": int(grid),
                      "adaln_out_dtype": "bfloat16"})
    meta = metadata(family=family, scheme=scheme, sd=sd, base_model_id=base, component=component, version=version,
                    exclude=exclude, fast_accum=fast_accum, extra=extra, fp8_granularity=fp8_granularity)
    pickled = None
    for path in paths:
        if path.endswith(".pt"):
            pickled = save_pt(path, sd, meta)
        else:
            save_safetensors(path, sd, meta, converted_from=pickled)
    return meta


def build_file(family: str, kind: str, path: str, seed: int = 0, **kw) -> dict:
    return build(tiny_model(family, seed), family, kind, path, **kw)


if __name__ == "__main__":  # FAMILY KIND PATH [json kwargs]
    kw = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    print(json.dumps({"path": sys.argv[3], "metadata": build_file(sys.argv[1], sys.argv[2], sys.argv[3], **kw)},
                     default=str))
