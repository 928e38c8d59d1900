"""Shared fixtures: the real ComfyUI (headless, in-process), tiny real-architecture models, files on disk."""
from __future__ import annotations

import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tools import tiny_models  # noqa: E402

# Remembered fingerprint passes (prequant_core.formats.fingerprint) go to a folder of this run, never ~/.cache; servers the
# tests start inherit it.
if not os.environ.get("PREQUANT_VERIFIED_DIR"):
    import tempfile
    os.environ["PREQUANT_VERIFIED_DIR"] = tempfile.mkdtemp(prefix="prequant-verified-")

BASE_ID = "Tongyi-MAI/Z-Image-Turbo"


@pytest.fixture(scope="session")
def comfy(tmp_path_factory):
    """(ComfyUI's nodes module, this pack's module) with ComfyUI imported headless on the CPU.

    ComfyUI's base directory is a session temp folder, so models/prequant etc. are real folders we control.
    """
    from tools import comfy_headless
    base = tmp_path_factory.mktemp("comfy_base")
    nodes, pack = comfy_headless.boot(base_dir=str(base))
    pack.nodes.paths.register()
    return nodes, pack


@pytest.fixture(scope="session")
def models_dir(comfy):
    import folder_paths
    return folder_paths.models_dir


@pytest.fixture(scope="session")
def zimage_dense():
    """Dense tiny Z-Image (diffusers layout, bf16), built once per session."""
    return tiny_models.zimage_dense(seed=0)


@pytest.fixture(scope="session")
def prequant_files(zimage_dense, tmp_path_factory):
    """Factory: path of a pre-quantized tiny Z-Image file for (scheme, container, layout), cached per session."""
    from prequant_core import builder, families
    cache: dict = {}
    folder = tmp_path_factory.mktemp("prequant_files")
    fam = families.get("z-image")

    def make(scheme="int8", container="safetensors", layout="diffusers"):
        key = (scheme, container, layout)
        if key not in cache:
            path = str(folder / f"Z-Image-Turbo-{scheme.upper()}-{layout}.{container}")
            if layout == "diffusers":
                builder.build_from_tensors(zimage_dense, builder.Target(path, container=container),
                                           builder.Recipe(scheme, family=fam, base_model_id=BASE_ID))
            else:
                tensors = tiny_models.zimage_comfy_layout(zimage_dense)
                builder.build_from_tensors(tensors, builder.Target(path, container=container),
                                           builder.Recipe(scheme, family=fam, base_model_id=BASE_ID))
            cache[key] = path
        return cache[key]

    return make


@pytest.fixture
def allow_dir(monkeypatch):
    """Allowlist a folder for explicit paths via the documented environment variable."""
    def allow(*dirs):
        monkeypatch.setenv("PREQUANT_ALLOW_LOCAL_PATH", os.pathsep.join(str(d) for d in dirs))
    return allow


def sample(model, steps=2, seed=0, size=32, cap_len=12, cap_dim=768, cfg=1.0):
    """One deterministic KSampler run through ComfyUI's own sampling code; returns the latent."""
    import comfy.sample
    g = torch.Generator().manual_seed(seed)
    cond = [[torch.randn(1, cap_len, cap_dim, generator=g), {}]]
    latent = torch.zeros(1, 16, size, size)
    noise = torch.randn(latent.shape, generator=torch.Generator().manual_seed(seed + 1))
    with torch.inference_mode():
        return comfy.sample.sample(model, noise, steps, cfg, "euler", "simple", cond, cond, latent, seed=seed,
                                   disable_pbar=True)


def absent_comfy_tokenizer() -> str | None:
    """The tokenizer file ComfyUI 0.33.0 as shipped here lacks (../shared/comfyui-0.33/README.md: two large tokenizer
    files are left out), where the ComfyUI under test is that copy: the class its key detection takes a tiny Qwen3
    encoder for needs it, so the node then names that file (the checkpoint not at fault) instead of a tensor's shape."""
    from tools.comfy_headless import COMFY, comfyui_version
    absent = os.path.join(COMFY, "comfy", "text_encoders", "llama_tokenizer", "tokenizer.json")
    return absent if comfyui_version() == "0.33.0" and not os.path.exists(absent) else None


NONE = "(none: use path or hub_repo)"  # the loader's checkpoint choice that defers to path / hub_repo


def low_vram(model):
    """The model as ComfyUI loads it when the device has no room for it (each Linear streamed, a LoRA applied per
    call): ComfyUI never loads partially on a CPU by itself, so the memory it may load into is capped."""
    m = model.clone()
    load = m.partially_load
    m.partially_load = lambda device_to, extra_memory=0, force_patch_weights=False: load(
        device_to, 1, force_patch_weights=force_patch_weights)
    return m


def unsloth_video_file(family: str, kind: str, path: str) -> None:
    """A tiny video-family file as Unsloth's builder writes it (tests/unsloth_builder.py, never this pack's writer),
    run in a subprocess with diffusers 0.42.1 first on the path (the pinned diffusers lacks these classes)."""
    import subprocess
    import sys
    side = os.path.join(ROOT, ".cache", "diffusers042")
    dev_py = os.path.join(ROOT, ".venv", "bin", "python")
    p = subprocess.run([dev_py if os.path.exists(dev_py) else sys.executable,
                        os.path.join(ROOT, "tests", "unsloth_builder.py"), family, kind, path], cwd=ROOT,
                       capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join([side, ROOT, os.path.join(ROOT, "tests")])))
    assert p.returncode == 0, p.stderr[-3000:]


def load_path(comfy, path, **kw):
    """Load Prequant Transformer on ``path``, run as ComfyUI runs a node; the MODEL."""
    with torch.inference_mode():  # as ComfyUI runs every node
        return comfy[0].NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]().load(NONE, path=str(path), **kw)["result"][0]


def make_lora(model, path, rank=4, seed=3):
    """A real LoRA file in the diffusion_model.* key form ComfyUI's LoRA loader understands."""
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for name in ("layers.0.attention.qkv", "layers.0.feed_forward.w1", "cap_embedder.1"):
        w = model.model.diffusion_model.get_submodule(name).weight
        out_f, in_f = w.shape
        sd[f"diffusion_model.{name}.lora_up.weight"] = (torch.randn(out_f, rank, generator=g) * 0.05).to(torch.bfloat16)
        sd[f"diffusion_model.{name}.lora_down.weight"] = (torch.randn(rank, in_f, generator=g) * 0.05).to(torch.bfloat16)
        sd[f"diffusion_model.{name}.alpha"] = torch.tensor(float(rank))
    save_file(sd, path)


def with_lora(comfy, model, name, seed=3):
    """``model`` with a ``make_lora`` file of this name through stock LoraLoaderModelOnly."""
    import folder_paths
    nodes, _ = comfy
    lora_dir = folder_paths.get_folder_paths("loras")[0]
    os.makedirs(lora_dir, exist_ok=True)
    make_lora(model, os.path.join(lora_dir, name), seed=seed)
    with torch.inference_mode():
        return nodes.NODE_CLASS_MAPPINGS["LoraLoaderModelOnly"]().load_lora_model_only(model, name, 1.0)[0]


def dense_of(layer, dtype=torch.float32) -> torch.Tensor:
    """A quantized Linear's weight as its math sees it (dequantized; a ConvRot layer's rotated back)."""
    from prequant_core.schemes import qtensor
    return qtensor.dense_from_parts(layer.prequant_parts(), layer.prequant_spec, dtype)


# --- the loopback Hub (tests/hub_server.py, tests/loopback_hub.py) ------------------------------------------------

@pytest.fixture
def hf_env(tmp_path, monkeypatch):
    """A private HF_HOME and no token/offline settings from the developer's machine.

    HF_ENDPOINT / HF_HOME are read by the client at import: hub.py reads them at call time and passes endpoint and
    cache_dir explicitly, and where the client's own module constants matter we set those too (configuration)."""
    import shutil
    from huggingface_hub import constants
    from huggingface_hub.utils import reset_sessions
    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE",
                "TRANSFORMERS_OFFLINE", "HF_HUB_ENABLE_HF_TRANSFER", "HF_HUB_ETAG_TIMEOUT",
                "UNSLOTH_DIFFUSION_PREQUANT_MIRROR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    reset_sessions()
    yield home
    shutil.rmtree(home, ignore_errors=True)  # ~95 MB per test otherwise


HUB_CHUNK = "hub_chunk"  # a module's ``pytestmark = pytest.mark.hub_chunk(n)``: the loopback Hub's write size


@pytest.fixture
def hub(hf_env, monkeypatch, request):
    """The loopback Hub as HF_ENDPOINT, for one test (a module's ``hub_chunk`` mark sets its write size: small
    writes make a slowed transfer last seconds, not minutes)."""
    from hub_server import HubServer
    mark = request.node.get_closest_marker(HUB_CHUNK)
    with HubServer(**({"chunk": mark.args[0]} if mark else {})) as s:
        monkeypatch.setenv("HF_ENDPOINT", s.url)
        yield s


@pytest.fixture(scope="module")
def hub_files(prequant_files):
    """The pack's int8 Z-Image files the loopback Hub serves (its two containers)."""
    return {"int8.safetensors": prequant_files("int8", "safetensors"), "int8.pt": prequant_files("int8", "pt")}
