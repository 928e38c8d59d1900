"""GPU check: one command, no downloads (weights are generated), well under 8 minutes on one GPU.

    python bench/gpu_check.py --out bench/RESULTS.md      # on a CUDA machine with this repo's .venv or ComfyUI env

Measures, side by side in one run, on a real-width Z-Image (dim 3840, 30 heads; --layers main layers + 2+2 refiners):
  - torchao's own Float8DynamicActivationFloat8WeightConfig / Int8DynamicActivationInt8WeightConfig applied with
    quantize_ on the GPU vs this pack's schemes.quantize_weight: identical codes and scales (bit for bit)
  - peak GPU memory while loading: (a) this loader (meta skeleton + assign from a pre-quantized file, then moved to
    the GPU) vs (b) dense bf16 on the GPU + quantize_ in place; target a <= 0.55 x b
  - sampling step time at 1024x1024-equivalent tokens (latent 128x128 -> 4096 image tokens): fp8 (a) vs dense bf16;
    target <= 0.8
  - output relative error vs dense bf16 (target <= 2e-2) and (a) == (b) outputs
  - torch.compile of the diffusion model (as ComfyUI's TorchCompileModel node does) with quantized weights: step gain
--device cpu runs the same code paths on the CPU at small size (a smoke test of the script itself).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--latent", type=int, default=128)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dim", type=int, default=3840)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import torch
    import torchao
    from diffusers import ZImageTransformer2DModel
    from torchao.quantization import quantize_
    from prequant_core import builder, families, formats, schemes
    from prequant_core.load import placement
    from prequant_core.schemes import qtensor
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    heads = args.dim // 128
    cfg = dict(dim=args.dim, n_layers=args.layers, n_refiner_layers=2, n_heads=heads, n_kv_heads=heads)
    lines, t_all = [], time.time()

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def peak_reset():
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()

    def peak_gb():
        return torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")

    with torch.device("meta"):
        skel = ZImageTransformer2DModel(**cfg)
    g = torch.Generator().manual_seed(0)
    dense = {k: (torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]) if p.ndim >= 2 else
                 1 + 0.1 * torch.randn(p.shape, generator=g)).to(torch.bfloat16) for k, p in skel.state_dict().items()}
    dense_gb = sum(v.numel() * 2 for v in dense.values()) / 2**30
    lines.append(f"- model: Z-Image dim {args.dim}, {args.layers} layers + 2+2 refiners, dense {dense_gb:.2f} GiB; "
                 f"device {torch.cuda.get_device_name() if cuda else 'cpu'}; torch {torch.__version__}, "
                 f"torchao {torchao.__version__}")
    from prequant_core.schemes import devices
    here = devices.describe(dev)
    lines.append(f"- matmul path the loader picks on this device: int8 -> {devices.choose('int8', True, here).text()}; "
                 f"fp8 -> {devices.choose('float8', True, here).text()}")

    def inputs(n_tok):
        gg = torch.Generator().manual_seed(1)
        x = torch.randn(1, 16, args.latent, args.latent, generator=gg).to(dev, torch.bfloat16)
        cap = torch.randn(1, 32, 2560, generator=gg).to(dev, torch.bfloat16)
        return x, cap

    def run(model, reps=3):
        x, cap = inputs(0)
        t = torch.tensor([0.5], device=dev)
        with torch.inference_mode():
            out = model([x[0].unsqueeze(1)], t, [cap[0]])
            sync()
            s = time.perf_counter()
            for _ in range(reps):
                out = model([x[0].unsqueeze(1)], t, [cap[0]])
            sync()
        o = out[0] if isinstance(out, (list, tuple)) else out.sample
        o = o[0] if isinstance(o, (list, tuple)) else o
        return o.float().cpu(), (time.perf_counter() - s) / reps

    tmp = tempfile.mkdtemp(prefix="prequant-gpu-")
    results = {}
    dense_model = None
    for scheme in ("fp8", "int8"):
        path = os.path.join(tmp, f"z-{scheme}.safetensors")
        builder.build_from_tensors(dense, builder.Target(path),
                                   builder.Recipe(scheme, family=families.get("z-image"), base_model_id="x"))
        # (b) dense on the device, then torchao's own config applied in place
        peak_reset()
        with torch.device("meta"):
            mb = ZImageTransformer2DModel(**cfg)
        placement.place(mb, {k: v.to(dev) for k, v in dense.items()}, device=dev)
        flt = schemes.LayerFilter(scheme, 512, tuple(schemes.exclude_tokens(scheme)))
        names = [n for n, m in mb.named_modules() if isinstance(m, torch.nn.Linear)
                 and flt.reason_skipped(n, m.weight) is None]
        sel = set(names)
        if cuda:
            quantize_(mb, schemes.torchao_config(scheme), filter_fn=lambda m, fqn: fqn in sel)
        else:
            for n in names:
                mod = mb.get_submodule(n)
                mod.weight = torch.nn.Parameter(schemes.quantize_weight(mod.weight, scheme), requires_grad=False)
        sync()
        peak_b = peak_gb()
        # (a) pre-quantized: meta skeleton, assign from the file, move
        ck = formats.read(path)
        same = all(torch.equal(qtensor.split(ck.tensors[n + ".weight"])[0].to(dev),
                               qtensor.split(mb.get_submodule(n).weight)[0]) and
                   torch.equal(qtensor.split(ck.tensors[n + ".weight"])[1].to(dev),
                               qtensor.split(mb.get_submodule(n).weight)[1]) for n in names)
        peak_reset()
        with torch.device("meta"):
            ma = ZImageTransformer2DModel(**cfg)
        placement.place(ma, ck.tensors, device=dev)
        sync()
        peak_a = peak_gb()
        out_a, step_a = run(ma)
        out_b, step_b = run(mb)
        del mb
        if dense_model is None:
            with torch.device("meta"):
                dense_model = ZImageTransformer2DModel(**cfg)
            placement.place(dense_model, {k: v.to(dev) for k, v in dense.items()}, device=dev)
            results["dense"] = run(dense_model)
        out_d, step_d = results["dense"]
        rel = ((out_a - out_d).norm() / out_d.norm()).item()
        comp = float("nan")
        if not args.no_compile:
            try:
                mc = torch.compile(ma)
                _, comp = run(mc)
            except Exception as e:  # noqa: BLE001 - reported, not fatal
                comp = f"failed: {type(e).__name__}: {str(e)[:120]}"
        lines.append(f"- {scheme}: torchao quantize_ == our quantize_weight (codes+scales, {len(names)} layers): {same}")
        lines.append(f"- {scheme}: load peak GPU GiB a={peak_a:.2f} b={peak_b:.2f} ratio a/b={peak_a / peak_b if cuda else float('nan'):.2f} (target <= 0.55)")
        lines.append(f"- {scheme}: step s a={step_a:.4f} dense={step_d:.4f} ratio={step_a / step_d:.2f} (target fp8 <= 0.8); "
                     f"compiled a={comp if isinstance(comp, str) else f'{comp:.4f} (gain {step_a / comp:.2f}x)'}")
        lines.append(f"- {scheme}: rel err vs dense {rel:.4f} (target <= 0.02); a vs b max abs diff {(out_a - out_b).abs().max().item()}")
        del ma
        print("\n".join(lines[-4:]), flush=True)
    # The product lines no CPU test reaches (docs/DEVELOPING.md, "Coverage", (a)) that this script's steps above do
    # not: the memory guard's device rule (memory_check.cuda_free) and a device tensor handed to the safetensors
    # writer (safetensors_layout.write_flat). devices.describe and the int8 / fp8 quantized matmuls ran above.
    from prequant_core.context import Guard
    from prequant_core.load import memory_check
    b = memory_check.check(os.path.join(tmp, "z-int8.safetensors"), 2**20, Guard(device=dev, lowvram=False))
    lines.append(f"- memory guard on {dev}: device free {b.device_available} bytes read (None off CUDA)")
    on_dev = os.path.join(tmp, "z-int8-from-device.safetensors")
    builder.build_from_tensors({k: v.to(dev) for k, v in dense.items()}, builder.Target(on_dev),
                               builder.Recipe("int8", family=families.get("z-image"), base_model_id="x"))
    a, d = formats.read(os.path.join(tmp, "z-int8.safetensors")).tensors, formats.read(on_dev).tensors
    same = all(torch.equal(qtensor.split(a[n + ".weight"])[0], qtensor.split(d[n + ".weight"])[0]) for n in names)
    lines.append(f"- int8 built from {dev} tensors: written and read back ({len(d)} tensors), codes equal to the "
                 f"host-built file's: {same}")
    lines.append(f"- total {time.time() - t_all:.0f}s")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(f"# GPU check ({time.strftime('%Y-%m-%d')})\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
