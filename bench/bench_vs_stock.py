"""This pack's loader against ComfyUI's own stock loader on the twin of the same weights, per layout, in a real
ComfyUI server: which file a user should pick, measured side by side in one run.

For each scheme (int8, fp8, NVFP4, MXFP8) the same dense weights give two files:
  prequant  the pack's own file (int8 / fp8 `.safetensors`, NVFP4 / MXFP8 `.pt`, bench_load.prequant_name), loaded by
            Load Prequant Transformer: the pack's layers, its matmul choice for the device (docs/FORMAT.md section 8)
  stock     the ComfyUI-native twin (`build --container comfyui-native`: int8_tensorwise, float8_e4m3fn, nvfp4,
            mxfp8), loaded by ComfyUI's stock Load Diffusion Model (UNETLoader): comfy.quant_ops' QuantizedTensor,
            comfy-kitchen's kernels where the device has them
Each method runs in a fresh server (its own process, so its peak is its own): peak resident memory over idle
(sampled from outside, /proc/PID/status), on CUDA also the peak GPU memory (torch's allocator, read by a bench-only
route), the first prompt (load + one step), then the per-step time of a second prompt (--steps steps, the model
already loaded), the MODEL's patcher class, and the latent against the dense bf16 model's (UNETLoader).

Model: a real-width Z-Image (dim 3840, 30 heads), --layers main layers + 2+2 refiners, random weights made here; the
conditioning is random text features from a bench-only node (no text encoder). No downloads.

    python bench/bench_vs_stock.py [--layers 1] [--latent 16] [--schemes int8,fp8,nvfp4,mxfp8] [--out FILE]
    python bench/bench_vs_stock.py --device cuda ...     # on a GPU machine (bench/gpu_check_comfy.py does this)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

# ComfyUI 0.33 where scripts/setup_comfyui033.sh put it, before tools/ reads which ComfyUI (PREQUANT_COMFYUI: another)
_COMFY033 = os.path.join(ROOT, ".cache", "comfyui-0.33", "comfyui-0.33.0")
if os.path.isdir(_COMFY033):
    os.environ.setdefault("PREQUANT_COMFYUI", _COMFY033)

from bench_serving import COND_NODE, OutsidePeak, append_results  # noqa: E402

SCHEMES = ("int8", "fp8", "nvfp4", "mxfp8")
NATIVE_NAME = {"int8": "int8_tensorwise", "fp8": "float8_e4m3fn", "nvfp4": "nvfp4", "mxfp8": "mxfp8"}

# Bench-only routes, in the same custom node file: the server's peak GPU memory (reset on read) and the classes of
# the patchers ComfyUI holds loaded (what manages each MODEL: ModelPatcherDynamic with DynamicVRAM on).
ROUTES = '''

from aiohttp import web
from server import PromptServer


@PromptServer.instance.routes.get("/bench/peak")
async def bench_peak(request):
    import comfy.model_management as mm
    out = {"cuda": torch.cuda.is_available(), "patchers": sorted({type(m.model).__name__ for m in mm.current_loaded_models
                                                                   if m.model is not None})}
    layers = {"quantized": 0, "in_vram_bar": 0, "bar_refused": 0}  # the pack's layers under DynamicVRAM
    for m in mm.current_loaded_models:
        for mod in (m.model.model.modules() if m.model is not None else ()):
            if getattr(mod, "prequant_spec", None) is not None:
                layers["quantized"] += 1
                layers["in_vram_bar"] += hasattr(mod, "_v")
                layers["bar_refused"] += bool(getattr(mod, "prequant_vbar_failed", False))
    out["layers"] = layers
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        out["total_gib"] = torch.cuda.get_device_properties(0).total_memory / 2**30
        torch.cuda.reset_peak_memory_stats()
    return web.json_response(out)
'''


def make_files(base: str, layers: int, schemes: list[str]) -> dict:
    """The dense bf16 ComfyUI-layout file, and per scheme the pack's file and its ComfyUI-native twin, all from the
    same weights."""
    import bench_load
    from tools import comfy_headless
    comfy_headless.boot()
    from safetensors.torch import load_file
    from prequant_core import builder, families
    folder = os.path.join(base, "models")
    files = bench_load.make_files(folder, layers, schemes)  # dense + the pack's files (bench_load.prequant_name)
    fam = families.get("z-image")
    comfy_sd = load_file(files["dense"])
    for s in schemes:
        files[f"{s}-native"] = os.path.join(folder, "diffusion_models", f"zimage_{NATIVE_NAME[s]}.safetensors")
        builder.build_comfy_native(comfy_sd, builder.Target(files[f"{s}-native"]),
                                   builder.Recipe(s, family=fam, base_model_id="Tongyi-MAI/Z-Image-Turbo"))
    return files


def graph(method: str, files: dict, latent: int, steps: int, seed: int) -> dict:
    kind, _, scheme = method.partition(":")
    if kind == "prequant":
        loader = {"class_type": "PrequantLoadTransformer",
                  "inputs": {"checkpoint": os.path.basename(files[scheme]), "scheme": scheme}}
    else:
        name = files["dense"] if kind == "dense" else files[f"{scheme}-native"]
        loader = {"class_type": "UNETLoader", "inputs": {"unet_name": os.path.basename(name),
                                                          "weight_dtype": "default"}}
    return {
        "1": loader,
        "2": {"class_type": "BenchRandomConditioning", "inputs": {"tokens": 32, "width": 2560}},
        "3": {"class_type": "EmptySD3LatentImage", "inputs": {"width": latent * 8, "height": latent * 8,
                                                               "batch_size": 1}},
        "4": {"class_type": "KSampler", "inputs": {"model": ["1", 0], "positive": ["2", 0], "negative": ["2", 0],
                                                    "latent_image": ["3", 0], "seed": seed, "steps": steps,
                                                    "cfg": 1.0, "sampler_name": "euler", "scheduler": "simple",
                                                    "denoise": 1.0}},
        "5": {"class_type": "SaveLatent", "inputs": {"samples": ["4", 0],
                                                      "filename_prefix": f"bench_{method.replace(':', '_')}_{steps}"}},
    }


def run_one(method: str, base: str, files: dict, latent: int, steps: int, cpu: bool, extra_args=()) -> dict:
    from bench_load import drop_file_cache
    from tools.comfy_server import ComfyServer, execution_error
    with ComfyServer(base, cpu=cpu, extra_args=extra_args) as srv:
        time.sleep(3)  # idle: start-up work (node imports, the front end's routes) settles
        drop_file_cache(*files.values())
        srv.get("/bench/peak")  # resets the GPU peak
        meter = OutsidePeak(srv.proc.pid)
        t = time.perf_counter()
        entry = srv.run(graph(method, files, latent, 1, 0), timeout=1800)
        first = time.perf_counter() - t
        res = meter.stop()
        err = execution_error(entry)
        if err:
            raise RuntimeError(f"{method}: {err}\n{srv.log_tail()}")
        gpu = srv.get("/bench/peak")
        t = time.perf_counter()
        entry = srv.run(graph(method, files, latent, steps, 1), timeout=1800)
        loaded = time.perf_counter() - t
        err = execution_error(entry)
        if err:
            raise RuntimeError(f"{method}: {err}\n{srv.log_tail()}")
        text = [t for o in entry["outputs"].values() if "prequant" in o for t in o.get("text", [])]
        res.update(first_prompt_s=first, step_s=loaded / steps, patchers=gpu["patchers"], layers=gpu["layers"],
                   gpu_peak_gib=gpu.get("peak_gib"), gpu_step_peak_gib=srv.get("/bench/peak").get("peak_gib"),
                   summary=text[0] if text else None)
    prefix = f"bench_{method.replace(':', '_')}_1_"
    outs = sorted(n for n in os.listdir(os.path.join(base, "output")) if n.startswith(prefix))
    if outs:  # the first prompt's latent, kept in memory (the folder goes at the end of the run)
        from safetensors.torch import load_file
        res["latent"] = load_file(os.path.join(base, "output", outs[-1]))["latent_tensor"].float()
    return res


def rel_err(a, b) -> float | None:
    """Relative error of latent ``a`` against ``b`` (None where either is missing)."""
    if a is None or b is None:
        return None
    return ((a - b).norm() / b.norm()).item()


def table(res: dict, sizes: dict, gpu: bool) -> str:
    head = "| scheme | loader | file MiB | added peak RSS MiB | " + ("peak GPU GiB | " if gpu else "") + \
           "first prompt s | step s | step vs dense | latent vs dense | latent vs the other loader | patcher |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    dense = res.get("dense")
    for method, r in res.items():
        kind, _, scheme = method.partition(":")
        if kind == "dense":
            label, f, other = "dense bf16", "dense", None
        else:
            label = "this pack" if kind == "prequant" else f"stock UNETLoader ({NATIVE_NAME[scheme]} twin)"
            f = scheme if kind == "prequant" else f"{scheme}-native"
            other = res.get(("stock:" if kind == "prequant" else "prequant:") + scheme)
        cells = [scheme or "-", label, f"{sizes[f]:.0f}", f"{r['added_mib']:.0f}"]
        if gpu:
            cells.append(f"{r['gpu_peak_gib']:.2f}" if r.get("gpu_peak_gib") is not None else "-")
        vs_dense = rel_err(r.get("latent"), dense.get("latent")) if dense and kind != "dense" else None
        vs_other = rel_err(r.get("latent"), other.get("latent")) if other else None
        cells += [f"{r['first_prompt_s']:.1f}", f"{r['step_s']:.2f}",
                  f"{r['step_s'] / dense['step_s']:.2f}x" if dense else "-",
                  f"{vs_dense:.4f}" if vs_dense is not None else "-",
                  f"{vs_other:.4f}" if vs_other is not None else "-", ", ".join(r["patchers"]) or "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run(args) -> dict:
    """Every method, one fresh server each; returns {method: measurements} (bench/gpu_check_comfy.py reuses it)."""
    schemes = [s for s in args.schemes.split(",") if s]
    base = args.keep or tempfile.mkdtemp(prefix="prequant-vs-stock-")
    try:
        t = time.time()
        files = make_files(base, args.layers, schemes)
        print(f"files made in {time.time() - t:.0f}s", flush=True)
        cn = os.path.join(base, "custom_nodes")
        os.makedirs(cn, exist_ok=True)
        with open(os.path.join(cn, "bench_conditioning.py"), "w") as f:
            f.write(COND_NODE.replace("NODE_CLASS_MAPPINGS", ROUTES + "\n\nNODE_CLASS_MAPPINGS", 1))
        sizes = {k: os.path.getsize(v) / 2**20 for k, v in files.items()}
        methods = ["dense"] + [f"{k}:{s}" for s in schemes for k in ("prequant", "stock")]
        res = {}
        for m in methods:
            try:
                res[m] = run_one(m, base, files, args.latent, args.steps, args.device == "cpu", args.server_args)
            except RuntimeError as e:  # a layout this ComfyUI / device cannot run: said in the table, not fatal
                print(f"{m}: FAILED: {str(e).splitlines()[0][:300]}", flush=True)
                res[m] = None
                continue
            print(f"{m}: " + json.dumps({k: v for k, v in res[m].items() if k not in ("summary", "latent")}), flush=True)
        failed = [m for m, r in res.items() if r is None]
        res = {m: r for m, r in res.items() if r is not None}
        out = table(res, sizes, args.device != "cpu")
        if failed:
            out += "\n\n- did not run here: " + ", ".join(failed)
        summaries = {m: r["summary"] for m, r in res.items() if r.get("summary")}
        print(out, flush=True)
        return {"table": out, "results": res, "sizes": sizes, "failed": failed, "summaries": summaries}
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--latent", type=int, default=16)
    ap.add_argument("--steps", type=int, default=3, help="steps of the second prompt (the per-step time)")
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--server-args", nargs="*", default=[], help="more ComfyUI arguments (e.g. --reserve-vram 60)")
    ap.add_argument("--out", default=None, help="append the table (markdown) to this file")
    ap.add_argument("--keep", default=None, help="keep the generated files and outputs in this folder")
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    r = run(args)
    if args.out:
        append_results(args.out, "This pack vs ComfyUI's stock loader on the twin of the same weights",
                       "bench/bench_vs_stock.py",
                       f"real-width Z-Image, {args.layers} layer(s) + 2+2 refiners; latent {args.latent}x{args.latent}; "
                       f"device {args.device}; each method in a fresh server. First prompt: load + one euler step; "
                       f"step: a second prompt of {args.steps} steps / {args.steps}. Added peak RSS: the server's VmRSS "
                       f"over idle, sampled every 5 ms from outside.", r["table"])
    return 0 if not r["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
