"""A file from this pack's builder, loaded into the family's diffusers class by ``prequant_core.diffusers_loader``,
against torchao quantizing the same dense model at load time. Used by tests/test_diffusers_loader.py in-process and,
for families whose class needs a newer diffusers than the pinned one, in a subprocess run with diffusers 0.42.1
first on the path::

    PYTHONPATH=.cache/diffusers042 .venv/bin/python -m tools.diffusers_check krea-2 int8 safetensors OUT_DIR

prints one JSON line with the measurements.
"""
from __future__ import annotations

import json
import os
import sys

import torch

from prequant_core import builder, diffusers_loader, families, schemes
from tools import tiny_families as tf

ZIMAGE_BASE = "Tongyi-MAI/Z-Image-Turbo"


def base_model_id(family: str) -> str:
    t = tf.DIFFUSERS_ONLY.get(family) or tf.TINY.get(family)
    return t.base_model_id if t is not None else ZIMAGE_BASE


def dense_load(family: str, seed: int = 0, dtype=torch.bfloat16) -> torch.nn.Module:
    """The dense model as diffusers loads it with ``torch_dtype``: parameters and persistent buffers in ``dtype``,
    non-persistent buffers as the class computes them (``from_pretrained`` does not cast those)."""
    m = tf.any_diffusers_model(family, seed, torch.float32)
    m.load_state_dict({k: v.to(dtype) for k, v in m.state_dict().items()}, assign=True)
    return m.eval()


def quantize_at_load(family: str, scheme: str, seed: int = 0) -> tuple[torch.nn.Module, str]:
    """The dense model quantized in place by torchao with the scheme's config and the builder's layer filter:
    ``quantize_`` where torchao runs the config on this machine; the fp8 dynamic config asserts a CUDA GPU of
    compute capability >= 8.9, so on CPU its weights are ``Float8Tensor.from_hp`` with the config's own fields (what
    ``quantize_``'s handler builds)."""
    from torchao.quantization import quantize_
    m = dense_load(family, seed)
    fam = families.get(family)
    flt = schemes.LayerFilter(scheme, schemes.DEFAULT_MIN_FEATURES,
                              tuple(schemes.exclude_tokens(scheme, fam.arch.int8_exclude_extra)))

    def keep(mod, name):
        return isinstance(mod, torch.nn.Linear) and flt.reason_skipped(name, mod.weight) is None

    try:
        quantize_(m, schemes.torchao_config(scheme), filter_fn=keep)
        return m, "torchao quantize_"
    except AssertionError:  # fp8 dynamic on a CPU (or a GPU below sm 8.9)
        m = dense_load(family, seed)
        for name, mod in list(m.named_modules()):
            if keep(mod, name):
                mod.weight = torch.nn.Parameter(schemes.quantize_weight(mod.weight.detach(), scheme),
                                                requires_grad=False)
        return m, "Float8Tensor.from_hp with the config's fields"


def check(family: str, scheme: str, container: str, folder: str) -> dict:
    fam = families.get(family)
    base_id = base_model_id(family)
    base_dir = os.path.join(folder, "bases", base_id.rsplit("/", 1)[-1])  # a local base folder named like the repo
    tf.any_diffusers_model(family).save_config(os.path.join(base_dir, "transformer"))
    dense = {k: v.to(torch.bfloat16).contiguous() for k, v in tf.any_diffusers_model(family).state_dict().items()}
    path = os.path.join(folder, f"{family}-{scheme.upper()}.{container}")
    builder.build_from_tensors(dense, builder.Target(path, container=container, overwrite=True),
                               builder.Recipe(scheme, family=fam, base_model_id=base_id))
    loaded = diffusers_loader.load(fam.arch.diffusers_class, base_dir, path, scheme=scheme, allow_dirs=[folder])
    model = loaded.model
    ref, how = quantize_at_load(family, scheme)
    with torch.no_grad():
        got = tf.diffusers_forward(family, model)
        want = tf.diffusers_forward(family, ref)
        dense_out = tf.diffusers_forward(family, dense_load(family))
    qtypes = sorted({type(p).__name__ for p in model.parameters() if hasattr(p, "qdata")})
    kernels = sorted({str(p.kernel_preference) for p in model.parameters() if hasattr(p, "kernel_preference")})
    buffers_meta = [n for n, b in model.named_buffers() if b.is_meta]
    return {
        "family": family, "scheme": scheme, "container": container, "class": type(model).__name__,
        "diffusers": __import__("diffusers").__version__, "reference": how,
        "max_abs_diff": (got.float() - want.float()).abs().max().item(),
        "rel_vs_dense": ((got.float() - dense_out.float()).norm() / dense_out.float().norm()).item(),
        "quantized": sum(1 for p in model.parameters() if hasattr(p, "qdata")), "qtypes": qtypes,
        "kernels": kernels, "training": model.training, "meta_buffers": buffers_meta,
        "non_persistent_buffers": sorted(n for n, _ in model.named_buffers()
                                         if n not in model.state_dict()),
        "finite": bool(torch.isfinite(got.float()).all()), "source": loaded.source, "notes": loaded.notes,
    }


def build_file(family: str, scheme: str, path: str) -> str:
    """The family's tiny model built into a pre-quantized file at ``path`` (container from the extension)."""
    dense = {k: v.to(torch.bfloat16).contiguous() for k, v in tf.any_diffusers_model(family).state_dict().items()}
    return builder.build_from_tensors(dense, builder.Target(path, container=path.rsplit(".", 1)[-1], overwrite=True),
                                      builder.Recipe(scheme, family=families.get(family),
                                                     base_model_id=base_model_id(family)))


def forward_record(family: str, path: str, inputs_path: str | None = None) -> str:
    """The family's tiny model (float32) and one forward pass of its diffusers class, saved for a ComfyUI process that
    cannot import this diffusers: ``{"dense": state dict, "inputs": ..., "output": ...}`` (tests/families/test_families.py
    holds ComfyUI's model with the mapped weights against it). ``inputs_path``: inputs the ComfyUI side laid out (a
    packed sequence's positions and row kinds, as ComfyUI's model builds them), for a record that takes them."""
    from safetensors.torch import load_file, save_file
    inputs = load_file(inputs_path) if inputs_path else None
    # ``dense_form`` among the inputs: the class as built, not the hosted form (MiniMax-H3's dense adaLN)
    m = tf.any_diffusers_model(family, 0, torch.float32, hosted=not (inputs and tf.DENSE_FORM in inputs))
    record = tf.DIFFUSERS_ONLY[family].record
    rec = record(m, inputs) if inputs is not None else record(m)
    save_file({**{"dense." + k: v.contiguous() for k, v in m.state_dict().items()},
               **{k: v.contiguous() for k, v in rec.items()}}, path)
    return path


if __name__ == "__main__":
    if sys.argv[1] == "build":  # build FAMILY SCHEME PATH
        print(json.dumps({"path": build_file(*sys.argv[2:5])}))
    elif sys.argv[1] == "forward":  # forward FAMILY PATH [INPUTS]
        print(json.dumps({"path": forward_record(*sys.argv[2:5])}))
    else:  # FAMILY SCHEME CONTAINER OUT_DIR
        fam_, scheme_, container_, out = sys.argv[1:5]
        print(json.dumps(check(fam_, scheme_, container_, out)))
