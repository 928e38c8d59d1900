"""torch.compile through ComfyUI's own TorchCompileModel node works on pre-quantized weights (torchao's fast paths
stay reachable). Speed is reported, not asserted; it is measured properly in bench/gpu_check.py."""
from __future__ import annotations

import os
import time

import torch

from conftest import sample

NONE = "(none: use path or hub_repo)"


def test_torch_compile_node_runs_prequant_model(comfy, prequant_files, allow_dir):
    nodes, _ = comfy
    path = prequant_files("int8")
    allow_dir(os.path.dirname(path))
    with torch.inference_mode():
        model = nodes.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]().load(NONE, path=path)["result"][0]
    eager = sample(model)
    t = time.perf_counter()
    sample(model)
    t_eager = time.perf_counter() - t
    compile_node = nodes.NODE_CLASS_MAPPINGS["TorchCompileModel"]
    with torch.inference_mode():
        compiled = (compile_node.execute(model, "inductor") if hasattr(compile_node, "execute")
                    else compile_node().patch(model, "inductor"))[0]
    t = time.perf_counter()
    first = sample(compiled)
    t_first = time.perf_counter() - t
    t = time.perf_counter()
    out = sample(compiled)
    t_compiled = time.perf_counter() - t
    rel = ((out - eager).norm() / eager.norm()).item()
    print(f"\n[torch.compile int8, CPU] eager {t_eager:.3f}s, first compiled run {t_first:.1f}s, compiled "
          f"{t_compiled:.3f}s (x{t_eager / t_compiled:.2f}); relative difference to eager {rel:.4f}")
    assert torch.isfinite(out).all() and torch.equal(out, first)
    # Inductor fuses the dynamic activation quantization, so rounding differs slightly from eager.
    assert rel < 0.05, rel
    assert compiled.get_model_object("diffusion_model") is model.get_model_object("diffusion_model")
