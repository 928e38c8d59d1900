"""The rest of a text-to-image graph at test size, built on the spot: a CLIP-L text encoder (SD1 layout, which
ComfyUI's CLIPLoader reads with type 'stable_diffusion') and a 16-channel TAESD VAE (ComfyUI reads it from the
'taesd_*' keys). Weights are seeded random: the pictures are noise, the graph and every node are real."""
from __future__ import annotations

import os

import torch

from .tiny_models import randomize_

CLIP_NAME = "tiny_clip_l.safetensors"
VAE_NAME = "tiny_taef1.safetensors"
CAP_FEAT_DIM = 768  # CLIP-L hidden size: the tiny Z-Image's caption embedder takes this width


def text_encoder_stand_in(clip_name: str = CLIP_NAME) -> dict:
    """A workflow override that swaps the shipped text-encoder loader (a 4B-parameter Qwen3 whose ComfyUI class has
    fixed dims) for CLIPLoader on the tiny CLIP-L: the graph keeps its wiring, the CLIP output is the same type."""
    return {"class_type": "CLIPLoader", "clip_name": clip_name, "type": "stable_diffusion"}


def write_clip(path: str, seed: int = 11) -> str:
    import comfy.sd1_clip
    from safetensors.torch import save_file
    m = comfy.sd1_clip.SDClipModel(device="cpu", dtype=torch.float32)
    randomize_(m.transformer, seed)
    save_file({k: v.to(torch.float16).contiguous() for k, v in m.transformer.state_dict().items()}, path)
    return path


def write_vae(path: str, seed: int = 12) -> str:
    import comfy.taesd.taesd
    from safetensors.torch import save_file
    m = comfy.taesd.taesd.TAESD(latent_channels=16)
    randomize_(m, seed)
    sd = {k: v.contiguous() for k, v in m.state_dict().items() if k.startswith(("taesd_encoder.", "taesd_decoder."))}
    save_file(sd, path)
    return path


def install(models_dir: str) -> dict:
    """Write both into a ComfyUI models folder (text_encoders/, vae/); returns their names."""
    for sub, name, fn in (("text_encoders", CLIP_NAME, write_clip), ("vae", VAE_NAME, write_vae)):
        os.makedirs(os.path.join(models_dir, sub), exist_ok=True)
        p = os.path.join(models_dir, sub, name)
        if not os.path.exists(p):
            fn(p)
    return {"clip": CLIP_NAME, "vae": VAE_NAME}


def spiece_model() -> bytes:
    """A tiny SentencePiece model with Gemma's special ids (pad 0, eos 1, bos 2, unk 3), trained here (a tokenizer
    is parsed by SentencePiece on the way in, so it must be a real one)."""
    import io

    import sentencepiece as spm
    words = "a watercolor painting of the lighthouse at dawn soft light cat dog photo".split()
    lines = [" ".join(words[(i * j) % len(words)] for j in range(1, 9)) for i in range(1, 200)]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=buf, vocab_size=40, model_type="bpe",
                                   pad_id=0, eos_id=1, bos_id=2, unk_id=3, minloglevel=2)
    return buf.getvalue()
