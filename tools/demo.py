"""The main job on the embedded default: a tiny Z-Image-architecture transformer built on the spot ->
pre-quantized checkpoint (this pack's builder) -> the point, side by side: peak memory of a dense load + quantize
against this loader, and the largest difference between their sampled outputs (0) -> a real ComfyUI on 127.0.0.1
with this pack -> the example workflow (example_workflows/z_image_turbo_prequant.json) posted to /prompt -> image
written and summarised -> where to go next with the real model.

Only what cannot exist at test size is swapped, and the swaps are printed: the transformer is tiny (same
architecture), the text encoder is a CLIP-L (the tiny transformer takes 768-wide captions) and the VAE a TAESD.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _quiet() -> None:
    """Other packages' notices are kept out of what the user reads (the demo's own lines and errors still print):
    torch's deprecation note about torchao's enums, diffusers' note on torchao's old tensor classes, library warnings.
    Children inherit it through the environment."""
    import logging
    import warnings
    # the demo speaks through print(): logging below ERROR (ComfyUI's "torchaudio missing", torch's and diffusers'
    # notices) is not for the person running it; errors still show
    logging.disable(logging.WARNING)
    os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    os.environ.setdefault("PYTHONWARNINGS", "ignore")


_quiet()

from tools.rss_peak import RssPeak  # noqa: E402

WORKFLOW = os.path.join(ROOT, "example_workflows", "z_image_turbo_prequant.json")
DENSE_NAME = "zimage_tiny_dense_bf16.safetensors"


def measure(method: str, comfy_base: str, ckpt_name: str, dense_path: str, scheme: str, out_path: str) -> dict:
    """In a fresh process (its peak is its own): load one way, sample, save the latent. ``method``: "dense" (the
    whole dense file in memory, quantized there with the same scheme) or "prequant" (this pack's loader)."""
    import gc
    import torch
    from tools import comfy_headless
    nodes, pack = comfy_headless.boot(base_dir=comfy_base)
    import comfy.sample
    import comfy.utils
    from prequant_core import families, schemes
    from prequant_core.schemes import quantize
    gc.collect()
    meter = RssPeak()
    with torch.inference_mode(False), torch.no_grad():
        if method == "dense":
            sd = comfy.utils.load_torch_file(dense_path)
            q, _ = quantize.quantize_tensors(sd, scheme, exclude=schemes.exclude_tokens(scheme))
            del sd
            model = pack.nodes.comfy_model.build_patcher(families.get("z-image"), "diffusers", q)
            matmul = model.prequant_matmul
        else:
            with torch.inference_mode():
                res = nodes.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]().load(ckpt_name)
            model, matmul = res["result"][0], res["ui"]["prequant"][0].get("matmul")
    load_peak = meter.growth()
    g = torch.Generator().manual_seed(0)
    cond = [[torch.randn(1, 12, 768, generator=g), {}]]
    latent = torch.zeros(1, 16, 32, 32)
    noise = torch.randn(latent.shape, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        out = comfy.sample.sample(model, noise, 4, 1.0, "euler", "simple", cond, cond, latent, seed=0,
                                  disable_pbar=True)
    torch.save(out, out_path)
    return {"peak": load_peak, "run_peak": meter.stop(), "size": model.model_size(), "matmul": matmul}


def side_by_side(base: str, ckpt_name: str, dense_path: str, scheme: str) -> bool:
    """Run both loads in their own processes and print the comparison; True when the outputs are identical."""
    import subprocess
    import torch
    res = {}
    for method in ("dense", "prequant"):
        out = os.path.join(base, f"latent_{method}.pt")
        p = subprocess.run([sys.executable, "-m", "tools.demo", "--measure", method, "--out", base,
                            "--scheme", scheme], cwd=ROOT, capture_output=True, text=True)
        line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
        if p.returncode or not line:
            print(f"[demo] FAILED to measure '{method}':\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}", file=sys.stderr)
            return False
        res[method] = {**json.loads(line[0][7:]), "out": torch.load(out)}
    diff = (res["dense"]["out"] - res["prequant"]["out"]).abs().max().item()
    mib = 2 ** 20
    d, q = res["dense"], res["prequant"]
    print("[demo] the same tiny model, two ways to get it quantized (each in a fresh process):")
    print(f"[demo]   {'':34s} {'dense load + quantize':>22s} {'this loader':>14s}")
    print(f"[demo]   {'load peak memory (RSS growth)':34s} {d['peak'] / mib:19.1f} MiB {q['peak'] / mib:11.1f} MiB"
          f"   ratio {q['peak'] / max(d['peak'], 1):.2f}")
    print(f"[demo]   {'peak through load + 4 steps':34s} {d['run_peak'] / mib:19.1f} MiB {q['run_peak'] / mib:11.1f} MiB"
          f"   ratio {q['run_peak'] / max(d['run_peak'], 1):.2f}")
    print(f"[demo]   {'model size in memory':34s} {d['size'] / mib:19.1f} MiB {q['size'] / mib:11.1f} MiB")
    print(f"[demo]   max abs diff of the sampled latents (4 euler steps): {diff}")
    print(f"[demo]   matmul on this machine: {q['matmul']}")
    return diff == 0.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "demo"), help="work folder (default: out/demo)")
    ap.add_argument("--scheme", default="fp8", choices=["int8", "fp8"], help="quantization scheme (default fp8)")
    ap.add_argument("--size", type=int, default=256, help="image side in pixels (default 256)")
    ap.add_argument("--steps", type=int, default=4, help="sampling steps (default 4)")
    ap.add_argument("--measure", choices=["dense", "prequant"], help=argparse.SUPPRESS)  # child process
    args = ap.parse_args(argv)
    ckpt_name = f"Z-Image-Turbo-{args.scheme.upper()}.safetensors"
    if args.measure:
        base = os.path.abspath(args.out)
        r = measure(args.measure, os.path.join(base, "comfy"), ckpt_name, os.path.join(base, "dense", DENSE_NAME),
                    args.scheme, os.path.join(base, f"latent_{args.measure}.pt"))
        print("RESULT " + json.dumps(r))
        return 0

    from prequant_core import builder, families
    from tools import tiny_assets, tiny_models
    from tools.comfy_server import ComfyServer, execution_error
    from tools.workflow import to_api

    base = os.path.abspath(args.out)
    shutil.rmtree(os.path.join(base, "comfy", "output"), ignore_errors=True)
    models = os.path.join(base, "comfy", "models")
    os.makedirs(os.path.join(models, "prequant"), exist_ok=True)
    t0 = time.time()
    ckpt = os.path.join(models, "prequant", ckpt_name)
    dense = tiny_models.zimage_dense(seed=0, cap_feat_dim=tiny_assets.CAP_FEAT_DIM)
    dense_bytes = sum(v.numel() * v.element_size() for v in dense.values())
    os.makedirs(os.path.join(base, "dense"), exist_ok=True)  # outside the model folders: only the demo reads it
    dense_path = tiny_models.save_dense_safetensors(dense, os.path.join(base, "dense", DENSE_NAME))
    builder.build_from_tensors(dense, builder.Target(ckpt, overwrite=True),
                               builder.Recipe(args.scheme, family=families.get("z-image"),
                                              base_model_id="Tongyi-MAI/Z-Image-Turbo"))
    del dense
    print(f"[demo] built {ckpt_name}: {os.path.getsize(ckpt) / 2**20:.1f} MiB on disk "
          f"(dense bf16 {dense_bytes / 2**20:.1f} MiB) in {time.time() - t0:.1f}s")
    if not side_by_side(base, ckpt_name, dense_path, args.scheme):
        print("[demo] FAILED: the pre-quantized load does not reproduce dense load + quantize", file=sys.stderr)
        return 1

    from tools import comfy_headless
    comfy_headless.boot()  # the tiny text encoder and VAE are made with ComfyUI's own classes (on the CPU)
    names = tiny_assets.install(models)

    with open(WORKFLOW) as f:
        workflow = json.load(f)
    with ComfyServer(os.path.join(base, "comfy")) as server:
        print(f"[demo] ComfyUI {server.get('/system_stats')['system']['comfyui_version']} serving on {server.url}")
        overrides = {
            "Load Prequant Transformer": {"checkpoint": ckpt_name, "scheme": args.scheme},
            "PrequantLoadTextEncoder": tiny_assets.text_encoder_stand_in(names["clip"]),
            "VAELoader": {"vae_name": names["vae"]},
            "EmptySD3LatentImage": {"width": args.size, "height": args.size},
            "KSampler": {"steps": args.steps},
        }
        for node, vals in overrides.items():
            print(f"[demo] test-size swap on '{node}': {vals}")
        prompt = to_api(workflow, server.get("/object_info"), overrides)
        t1 = time.time()
        entry = server.run(prompt, timeout=900)
        err = execution_error(entry)
        if err:
            print(f"[demo] FAILED: {err}\n{server.log_tail()}", file=sys.stderr)
            return 1
        took = time.time() - t1
        outputs = entry["outputs"]
        loader_id = next(k for k, v in prompt.items() if v["class_type"] == "PrequantLoadTransformer")
        images = [img for out in outputs.values() for img in out.get("images", [])]
        summary = outputs.get(loader_id, {}).get("text", ["?"])[0]
    if not images:
        print("[demo] FAILED: the workflow produced no image", file=sys.stderr)
        return 1
    img = images[0]
    path = os.path.join(base, "comfy", "output", img.get("subfolder", ""), img["filename"])
    from PIL import Image
    import numpy as np
    arr = np.asarray(Image.open(path))
    print(f"[demo] loader: {summary}")
    print(f"[demo] workflow ran in {took:.1f}s: {len(prompt)} nodes, image {arr.shape[1]}x{arr.shape[0]} "
          f"(mean {arr.mean():.1f}, std {arr.std():.1f}) written to {path}")
    print("[demo] (the picture is near black noise by design: the tiny model, text encoder and VAE have seeded random "
          "weights; what the run proves is the graph: real ComfyUI nodes around a pre-quantized model loaded on meta "
          "and matching dense + quantize bit for bit above)")
    print("[demo] OK")
    print(NEXT_STEPS.format(scheme=args.scheme.upper()))
    return 0


NEXT_STEPS = """
[demo] Next, with internet, the same workflow on the real model (Z-Image-Turbo, 6B; about 6.3 GB as {scheme}):
[demo]   1. put this folder into ComfyUI/custom_nodes/ and `pip install -r requirements.txt` (never touches torch)
[demo]   2. start ComfyUI and drag in example_workflows/z_image_turbo_prequant.json
[demo]   3. Queue: the loaders fetch unsloth/Z-Image-Turbo-FP8's {scheme} transformer and its fp8 text encoder from the
[demo]      Hugging Face Hub on first use; the workflow lists its VAE with a download link (ComfyUI offers it)
[demo]   (here the text-encoder loader stood in as CLIPLoader on a tiny CLIP-L: Qwen3-4B has no test-size form)
[demo]   Inspect any file first:  python -m prequant_core info FILE   (or the Prequant Info node)"""


if __name__ == "__main__":
    sys.exit(main())
