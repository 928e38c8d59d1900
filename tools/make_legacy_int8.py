"""Write a *legacy* INT8 ``.pt`` the way older hosted files were made: torchao's v1 tensor classes.

Older Unsloth INT8 files pickle ``LinearActivationQuantizedTensor`` wrapping an ``AffineQuantizedTensor`` with a
``PlainAQTTensorImpl``; torchao 0.15+ deleted those classes. torchao 0.14.1 still has them and imports beside the
current torch in Python-only mode, so this script must run with 0.14.1 shadowing the current torchao, e.g.::

    .venv/bin/python -m pip install --no-deps --target .cache/torchao014 torchao==0.14.1
    PYTHONPATH=.cache/torchao014 .venv/bin/python tools/make_legacy_int8.py dense.safetensors out.pt \
        [--codes codes.safetensors]

Input: a dense transformer state dict (safetensors, diffusers layout, bf16). Every Linear weight the int8 scheme's
filter admits (docs/FORMAT.md section 4: in/out >= min_features, no excluded name token) is quantized with torchao 0.14.1's
``int8_dynamic_activation_int8_weight`` (the v1 ``AffineQuantizedTensor`` path) through ``quantize_`` on a Linear,
exactly as a model quantized in place; the Unsloth container ``{"format", "metadata", "state_dict"}`` is then
written with ``torch.save``. ``--codes`` also writes each quantized weight's int8 data and scale, as torchao 0.14.1
holds them, so a test can compare a reader's output with them bit for bit.
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# torch + stdlib only (no torchao import): the same layer filter and tags the current builder uses
from prequant_core import schemes  # noqa: E402

FORMAT_V1 = "unsloth_prequant_transformer_state_dict_v1"  # prequant_core.formats.checkpoint imports current-torchao types


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dense", help="dense state dict (.safetensors)")
    ap.add_argument("out", help="legacy .pt to write")
    ap.add_argument("--codes", help="also write the 0.14.1 int8 codes and scales here (.safetensors)")
    ap.add_argument("--base-model-id", default="Tongyi-MAI/Z-Image-Turbo")
    ap.add_argument("--family", default="z-image")
    ap.add_argument("--transformer-class", default="ZImageTransformer2DModel")
    ap.add_argument("--min-features", type=int, default=512)
    args = ap.parse_args(argv)

    import torchao
    if not torchao.__version__.startswith("0.14"):
        print(f"error: needs torchao 0.14.x (found {torchao.__version__}); put it first on PYTHONPATH",
              file=sys.stderr)
        return 2
    from safetensors.torch import load_file, save_file
    from torchao.quantization import int8_dynamic_activation_int8_weight, quantize_
    from torchao.quantization.linear_activation_quantized_tensor import LinearActivationQuantizedTensor

    dense = load_file(args.dense)
    exclude = schemes.exclude_tokens("int8")  # z-image adds no family tokens
    flt = schemes.LayerFilter("int8", args.min_features, tuple(exclude))
    state, codes = {}, {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the v1 config name is deprecated in 0.14.1: that is the point
        cfg = int8_dynamic_activation_int8_weight(set_inductor_config=False)
    for k, v in dense.items():
        if not (k.endswith(".weight") and v.ndim == 2) or flt.reason_skipped(k[: -len(".weight")], v):
            state[k] = v
            continue
        lin = torch.nn.Linear(v.shape[1], v.shape[0], bias=False, dtype=v.dtype)
        with torch.no_grad():
            lin.weight.copy_(v)
        quantize_(lin, cfg)
        w = lin.state_dict()["weight"]
        assert isinstance(w, LinearActivationQuantizedTensor), type(w)
        state[k] = w
        impl = w.original_weight_tensor.tensor_impl
        codes[k + ".int_data"] = impl.int_data.contiguous()
        codes[k + ".scale"] = impl.scale.contiguous()
    metadata = {
        "base_model_id": args.base_model_id, "family": args.family, "scheme": "int8", "component": "transformer",
        "min_features": args.min_features, "exclude_name_tokens": exclude, "require_bf16": False,
        "require_divisible": 0, "fast_accum": None, "torch_dtype": "bfloat16", "quant_backend": "torchao",
        "transformer_class": args.transformer_class,
        # as older builders wrote them: torch.__version__ pickles as torch.torch_version.TorchVersion
        "torch_version": torch.__version__, "torchao_version": torchao.__version__,
    }
    tmp = args.out + ".partial"
    torch.save({"format": FORMAT_V1, "metadata": metadata, "state_dict": state}, tmp)
    os.replace(tmp, args.out)
    if args.codes:
        save_file(codes, args.codes)
    print(f"wrote {args.out}: {len(codes) // 2} int8 v1 weights of {len(state)} tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
