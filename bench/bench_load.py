"""Load benchmark, every figure measured side by side in one run and printed as ratios.

Methods (each in its own fresh process, so peak RSS is its own):
  a  this pack's loader on a pre-quantized file (meta skeleton + assign)
  b  dense load + quantize at load time (whole dense state dict in memory, then quantized)
  s  this pack's streaming load-time quantization (the dense fallback: one tensor at a time)
  c  ComfyUI's own "Load Diffusion Model" with weight_dtype fp8_e4m3fn
  d  ComfyUI's own "Load Diffusion Model", dense bf16
Model: a real-width Z-Image (dim 3840, 30 heads) with --layers main layers and 2 refiner layers of each kind
(what ComfyUI's detection expects), random bf16 weights generated on the spot: 1 layer is ~1.8 GB dense.

    .venv/bin/python bench/bench_load.py [--layers 1] [--schemes int8,fp8] [--latent 32] [--out bench/RESULTS-cpu.md]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tools.rss_peak import RssPeak  # noqa: E402
DIM = 3840


def drop_file_cache(*paths: str) -> bool:
    """Evict these files' pages from the page cache (their first read comes from the disk), leaving the program's
    own code and libraries cached, as in a running ComfyUI loading a model for the first time."""
    ok = True
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        except (OSError, AttributeError):
            ok = False
    return ok


def model_files(base: str) -> list[str]:
    out = []
    for root, _, names in os.walk(os.path.join(base, "models")):
        out += [os.path.join(root, n) for n in names if n.endswith(".safetensors")]
    return out


def read_time(path: str, cold: bool = False) -> float:
    if cold:
        drop_file_cache(path)
    t = time.perf_counter()
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass
    return time.perf_counter() - t


def prequant_name(scheme: str) -> str:
    """Per-block schemes (nvfp4, mxfp8) are written as .pt, the others as .safetensors."""
    return f"Z-Image-Turbo-{scheme.upper()}." + ("pt" if scheme in ("nvfp4", "mxfp8") else "safetensors")


def make_files(folder: str, layers: int, schemes: list[str]) -> dict:
    """Dense ComfyUI-layout file (what ComfyUI detects) and pre-quantized diffusers-layout files."""
    import torch
    from diffusers import ZImageTransformer2DModel
    from prequant_core import builder, families
    from prequant_core.families import keymap
    import comfy.utils
    with torch.device("meta"):
        skel = ZImageTransformer2DModel(dim=DIM, n_layers=layers, n_refiner_layers=2, n_heads=30, n_kv_heads=30)
    g = torch.Generator().manual_seed(0)
    dense = {}
    for k, p in skel.state_dict().items():
        t = torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]) if p.ndim >= 2 else \
            1 + 0.1 * torch.randn(p.shape, generator=g)
        dense[k] = t.to(torch.bfloat16)
    fam = families.get("z-image")
    cfg = fam.config_from_shapes({k: tuple(v.shape) for k, v in dense.items()})
    from safetensors.torch import save_file
    files = {"dense": os.path.join(folder, "diffusion_models", "zimage_dense_bf16.safetensors")}
    os.makedirs(os.path.dirname(files["dense"]), exist_ok=True)
    save_file(keymap.to_comfy(dense, comfy.utils.z_image_to_diffusers(cfg)), files["dense"])
    os.makedirs(os.path.join(folder, "prequant"), exist_ok=True)
    for s in schemes:
        files[s] = os.path.join(folder, "prequant", prequant_name(s))
        builder.build_from_tensors(dense, builder.Target(files[s], container=os.path.splitext(files[s])[1][1:]),
                                   builder.Recipe(s, family=fam, base_model_id="Tongyi-MAI/Z-Image-Turbo"))
    return files


def child(method: str, scheme: str, base: str, latent: int) -> dict:
    """Runs in a fresh process: load with one method, time one sampling step, save the output latent."""
    import torch
    from tools import comfy_headless
    nodes, pack = comfy_headless.boot(base_dir=base)
    import comfy.sample
    import folder_paths
    from prequant_core import families, schemes
    from prequant_core.schemes import quantize
    import gc
    if method == "a":  # one-off imports (hub client, torchao safetensors helpers) are not the loader's cost
        with torch.inference_mode():
            nodes.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]().load(f"Z-Image-Turbo-{scheme.upper()}.safetensors")
    gc.collect()
    if os.environ.get("PREQUANT_BENCH_COLD") == "1":
        drop_file_cache(*model_files(base))
    meter = RssPeak()
    dense_path = os.path.join(folder_paths.models_dir, "diffusion_models", "zimage_dense_bf16.safetensors")
    t = time.perf_counter()
    with torch.inference_mode():
        if method == "a":
            model = nodes.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]().load(
                f"Z-Image-Turbo-{scheme.upper()}.safetensors")["result"][0]
        elif method in ("c", "d"):
            model = nodes.NODE_CLASS_MAPPINGS["UNETLoader"]().load_unet(
                "zimage_dense_bf16.safetensors", "fp8_e4m3fn" if method == "c" else "default")[0]
        else:
            fam = families.get("z-image")
            with torch.inference_mode(False):
                if method == "b":
                    import comfy.utils
                    sd = comfy.utils.load_torch_file(dense_path)
                    q, _ = quantize.quantize_tensors(sd, scheme, exclude=schemes.exclude_tokens(scheme))
                    del sd
                else:
                    from prequant_core.formats.dense_sources import open_dense, stream_quantized
                    q, _ = stream_quantized(open_dense(dense_path), scheme, min_features=512,
                                            exclude=schemes.exclude_tokens(scheme))
                model = pack.nodes.comfy_model.build_patcher(fam, "comfyui", q)
    load_s = time.perf_counter() - t
    load_rss = meter.mb()
    g = torch.Generator().manual_seed(1)
    cond = [[torch.randn(1, 32, 2560, generator=g), {}]]
    lat = torch.zeros(1, 16, latent, latent)
    noise = torch.randn(lat.shape, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        comfy.sample.sample(model, noise, 1, 1.0, "euler", "simple", cond, cond, lat, seed=0, disable_pbar=True)
        t = time.perf_counter()
        out = comfy.sample.sample(model, noise, 1, 1.0, "euler", "simple", cond, cond, lat, seed=0, disable_pbar=True)
        step_s = time.perf_counter() - t
    torch.save(out, os.path.join(base, f"out_{method}_{scheme}.pt"))
    return {"load_s": load_s, "load_peak_mb": load_rss, "peak_mb": meter.stop() / 2**20,
            "step_s": step_s, "size_mb": model.model_size() / 2**20}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--schemes", default="int8,fp8")
    ap.add_argument("--latent", type=int, default=16, help="latent side (tokens = (latent/2)^2)")
    ap.add_argument("--out", default=None, help="also write the table (markdown) to this file")
    ap.add_argument("--warm", action="store_true", help="keep the model files in the page cache (by default their "
                    "pages are evicted before every load and every file read, so both come from the disk)")
    ap.add_argument("--child", nargs=3, metavar=("METHOD", "SCHEME", "BASE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(*args.child, args.latent)))
        return 0
    schemes_ = args.schemes.split(",")
    base = tempfile.mkdtemp(prefix="prequant-bench-")
    try:
        from tools import comfy_headless
        comfy_headless.boot()
        t = time.time()
        files = make_files(os.path.join(base, "models"), args.layers, schemes_)
        print(f"files made in {time.time() - t:.0f}s: " + ", ".join(
            f"{k} {os.path.getsize(v) / 2**30:.2f} GiB" for k, v in files.items()), flush=True)
        runs = [("d", "bf16"), ("c", "fp8")] + [(m, s) for s in schemes_ for m in ("a", "s", "b")]
        res = {}
        cold = not args.warm and drop_file_cache(*model_files(base))
        print(f"page cache: {'model files evicted before every load and file read (cold)' if cold else 'warm'}",
              flush=True)
        for m, s in runs:
            p = subprocess.run([sys.executable, __file__, "--child", m, s, base, "--latent", str(args.latent)],
                               capture_output=True, text=True, env={**os.environ, "PREQUANT_BENCH_COLD": "1" if cold else "0"})
            line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
            if p.returncode or not line:
                print(f"{m}/{s} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
                continue
            res[(m, s)] = json.loads(line[0][7:])
            print(f"{m}/{s}: {res[(m, s)]}", flush=True)
        import torch
        dense_out = torch.load(os.path.join(base, "out_d_bf16.pt"))
        rows = []
        for (m, s), r in res.items():
            out = torch.load(os.path.join(base, f"out_{m}_{s}.pt"))
            r["rel_err"] = ((out - dense_out).norm() / dense_out.norm()).item()
            f = files.get(s, files["dense"]) if m == "a" else files["dense"]
            r["read_s"] = min(read_time(f, cold) for _ in range(2))
            rows.append((m, s, r))
        same = {}
        for s in schemes_:
            if ("a", s) in res and ("b", s) in res:
                a = torch.load(os.path.join(base, f"out_a_{s}.pt"))
                b = torch.load(os.path.join(base, f"out_b_{s}.pt"))
                same[s] = (a - b).abs().max().item()
        names = {"a": "prequant loader", "b": "dense load + quantize", "s": "streaming quantize at load",
                 "c": "ComfyUI fp8 weight_dtype", "d": "ComfyUI dense bf16"}
        lines = ["| method | scheme | load peak RSS MB | load s | load / file read | step s | step / dense | "
                 "rel err vs dense | model MB |", "|---|---|---|---|---|---|---|---|---|"]
        dstep = res.get(("d", "bf16"), {}).get("step_s")
        for m, s, r in rows:
            lines.append(f"| {m}: {names[m]} | {s} | {r['load_peak_mb']:.0f} | {r['load_s']:.2f} | "
                         f"{r['load_s'] / r['read_s']:.2f} | {r['step_s']:.2f} | "
                         f"{(r['step_s'] / dstep) if dstep else float('nan'):.2f} | {r['rel_err']:.4f} | "
                         f"{r['size_mb']:.0f} |")
        lines.append("")
        for s in schemes_:
            if ("a", s) in res and ("b", s) in res:
                lines.append(f"- {s}: load peak RSS a / b = {res[('a', s)]['load_peak_mb'] / res[('b', s)]['load_peak_mb']:.2f}"
                             f" (target <= 0.5); a / s = "
                             f"{res[('a', s)]['load_peak_mb'] / max(res.get(('s', s), {}).get('load_peak_mb', float('nan')), 1e-9):.2f};"
                             f" streaming s peak / quantized model size = "
                             f"{res.get(('s', s), {}).get('load_peak_mb', float('nan')) / res[('a', s)]['size_mb']:.2f}"
                             f" (target <= 1.3 x quantized + one layer); a vs b max abs diff = {same.get(s)}")
        table = "\n".join(lines)
        print(table)
        if args.out:
            import platform
            import torchao
            with open(args.out, "w") as fh:
                fh.write(f"# CPU benchmark ({time.strftime('%Y-%m-%d')})\n\nPage cache: {'model files evicted before every load and file read (cold reads from disk)' if cold else 'warm'}.\n"
                         f"Machine: {platform.processor() or platform.machine()}, "
                         f"{os.cpu_count()} cores; torch {torch.__version__}, torchao {torchao.__version__}; "
                         f"real-width Z-Image, {args.layers} layer(s) + 2+2 refiners; latent {args.latent}x{args.latent}.\n"
                         f"Peak RSS is the growth of resident memory over its level just before the load (sampled every 5 ms).\n\n"
                         f"{table}\n")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
