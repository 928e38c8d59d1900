"""What the Hub tests share: the repo and file names the loopback Hub (tests/hub_server.py) serves, and small helpers
on the files a download leaves. The fixtures (``hf_env``, ``hub``, ``hub_files``) are in conftest.py."""
from __future__ import annotations

import hashlib
import os

REPO = "unsloth/Z-Image-Turbo-FP8"
PRIMARY, PT, LEGACY = "Z-Image-Turbo-INT8.safetensors", "Z-Image-Turbo-INT8.pt", "transformer_int8.pt"
MiB = 2**20


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(MiB), b""):
            h.update(chunk)
    return h.hexdigest()


def cache_files(home) -> list[str]:
    out = []
    for root, _, names in os.walk(home):
        out.extend(os.path.relpath(os.path.join(root, n), home) for n in names)
    return sorted(out)


def partials(home) -> list[str]:
    return [f for f in cache_files(home) if f.endswith(".incomplete")]
