"""The main job on the embedded default: a tiny Z-Image-architecture transformer built on the spot ->
pre-quantized checkpoint (this pack's builder) -> a real ComfyUI on 127.0.0.1 with this pack -> the example
workflow (example_workflows/z_image_turbo_prequant.json) posted to /prompt -> image written and summarised.

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
WORKFLOW = os.path.join(ROOT, "example_workflows", "z_image_turbo_prequant.json")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "demo"), help="work folder (default: out/demo)")
    ap.add_argument("--scheme", default="fp8", choices=["int8", "fp8"], help="quantization scheme (default fp8)")
    ap.add_argument("--size", type=int, default=256, help="image side in pixels (default 256)")
    ap.add_argument("--steps", type=int, default=4, help="sampling steps (default 4)")
    args = ap.parse_args(argv)

    from prequant_core import build, families
    from tools import tiny_assets, tiny_models
    from tools.comfy_server import ComfyServer, execution_error
    from tools.workflow import to_api

    base = os.path.abspath(args.out)
    shutil.rmtree(os.path.join(base, "comfy", "output"), ignore_errors=True)
    models = os.path.join(base, "comfy", "models")
    os.makedirs(os.path.join(models, "prequant"), exist_ok=True)
    t0 = time.time()
    ckpt_name = f"Z-Image-Turbo-{args.scheme.upper()}.safetensors"
    ckpt = os.path.join(models, "prequant", ckpt_name)
    dense = tiny_models.zimage_dense(seed=0, cap_feat_dim=tiny_assets.CAP_FEAT_DIM)
    dense_bytes = sum(v.numel() * v.element_size() for v in dense.values())
    build.build_from_tensors(ckpt, dense, family=families.get("z-image"), scheme=args.scheme,
                             base_model_id="Tongyi-MAI/Z-Image-Turbo", overwrite=True)
    del dense
    print(f"[demo] built {ckpt_name}: {os.path.getsize(ckpt) / 2**20:.1f} MiB on disk "
          f"(dense bf16 {dense_bytes / 2**20:.1f} MiB) in {time.time() - t0:.1f}s")

    from tools import comfy_headless
    comfy_headless.boot()  # the tiny text encoder and VAE are made with ComfyUI's own classes (on the CPU)
    names = tiny_assets.install(models)

    with open(WORKFLOW) as f:
        workflow = json.load(f)
    with ComfyServer(os.path.join(base, "comfy")) as server:
        print(f"[demo] ComfyUI {server.get('/system_stats')['system']['comfyui_version']} serving on {server.url}")
        overrides = {
            "Load Prequant Transformer": {"checkpoint": ckpt_name, "scheme": args.scheme},
            "CLIPLoader": {"clip_name": names["clip"], "type": "stable_diffusion"},
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
    print("[demo] OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
