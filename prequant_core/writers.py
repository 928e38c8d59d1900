"""Writing the two containers from a state dict holding torchao tensors, streaming tensor by tensor."""
from __future__ import annotations

import errno
import json
import os
import shutil
from typing import Callable, Mapping

import torch

from . import qtensor
from .layer_formats import expected_tag
from .errors import BuildError
from .output_file import atomic_output


BuildProgress = Callable[[str, int, int, str], None]  # (stage "quantize" | "write", done, total, key)
CONTAINERS = ("safetensors", "pt")
from .dense_sources import ST_DTYPES  # noqa: E402





def _flat_parts(key: str, t) -> tuple[str | None, list[tuple[str, torch.Tensor]]]:
    """(torchao header JSON or None, [(flat name, tensor)]) exactly as the container's ``flatten`` lays them out,
    without cloning the tensor data."""
    from .formats.safetensors_container import ROOT_PREFIX
    if "." not in key:
        if qtensor.is_quantized(t):
            raise BuildError(f"Root-level tensor '{key}' cannot be quantized.")
        return None, [(ROOT_PREFIX + key, t)]
    if not qtensor.is_quantized(t):
        return json.dumps({"_type": torch.Tensor.__name__}), [(key, t)]
    from torchao.prototype.safetensors.safetensors_utils import TensorSubclassAttributeJSONEncoder
    mod, attr = key.rsplit(".", 1)
    names = list(t.tensor_data_names) + list(getattr(t, "optional_tensor_data_names", None) or [])
    parts = [(f"{mod}._{attr}_{n}", getattr(t, n)) for n in names if getattr(t, n) is not None]
    return json.dumps(t, cls=TensorSubclassAttributeJSONEncoder), parts


def safetensors_layout(tensors: Mapping, metadata: dict) -> tuple[dict, list[tuple[str, str, torch.Tensor]]]:
    """(``__metadata__`` header dict, [(key, flat name, tensor)]) for the safetensors container."""
    header: dict = {}
    dotted, roots, flat = [], [], []
    for k, v in tensors.items():
        entry, parts = _flat_parts(k, v)
        if entry is None:
            roots.append(k)
        else:
            dotted.append(k)
            header[k] = entry
        flat.extend((k, n, p) for n, p in parts)
    header["tensor_names"] = json.dumps(dotted)
    header["unsloth_format"] = expected_tag(metadata)
    header["unsloth_metadata"] = json.dumps(metadata, sort_keys=True, default=str)
    header["unsloth_root_tensors"] = json.dumps(sorted(roots))
    return header, flat


def write_safetensors(path: str, tensors: Mapping, metadata: dict, *, progress: BuildProgress | None = None) -> None:
    """Stream the container to ``path``: header first, then each tensor's bytes straight from its storage.

    ``safetensors.save_file`` would need every flattened tensor at once (torchao's flatten clones them; older
    safetensors versions also copy every tensor to ``bytes``); this writer never holds more than the input.
    Tensors are ordered by element size (largest first), so every tensor starts aligned to its element size.
    """
    meta_header, flat = safetensors_layout(tensors, metadata)
    seen = set()
    for _, name, _ in flat:
        if name in seen:
            raise BuildError(f"Two tensors flatten to the same name '{name}'.")
        seen.add(name)
    order = sorted(range(len(flat)), key=lambda i: (-flat[i][2].element_size(), i))
    header: dict = {"__metadata__": meta_header}
    offset = 0
    for i in order:
        _, name, t = flat[i]
        if t.dtype not in ST_DTYPES:
            raise BuildError(f"Tensor '{name}' has dtype {t.dtype}, which safetensors cannot store.")
        n = t.numel() * t.element_size()
        header[name] = {"dtype": ST_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    blob += b" " * (-(8 + len(blob)) % 8)
    total = len(order)
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for done, i in enumerate(order, 1):
            key, name, t = flat[i]
            t = t.detach()
            if t.device.type != "cpu":
                t = t.cpu()
            t = t.contiguous()
            if t.numel():
                f.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
            if progress:
                progress("write", done, total, name)


def write_pt(path: str, tensors: Mapping, metadata: dict, *, progress: BuildProgress | None = None) -> None:
    sd = {k: (v if qtensor.is_quantized(v) else v.contiguous()) for k, v in tensors.items()}
    if progress:
        progress("write", 0, 1, os.path.basename(path))
    torch.save({"format": expected_tag(metadata), "metadata": metadata, "state_dict": sd}, path)
    if progress:
        progress("write", 1, 1, os.path.basename(path))


def write_checkpoint(dest: str, tensors: Mapping, metadata: dict, *, container: str = "safetensors",
                     overwrite: bool = False, progress: BuildProgress | None = None) -> str:
    if container not in CONTAINERS:
        raise BuildError(f"Unknown output container '{container}'.", expected=" or ".join(CONTAINERS))
    writer = write_safetensors if container == "safetensors" else write_pt
    try:
        with atomic_output(dest, overwrite=overwrite) as tmp:
            writer(tmp, tensors, metadata, progress=progress)
    except OSError as e:
        err = _write_error(e, dest)
        if err is None:
            raise
        raise err from None
    except RuntimeError as e:
        if container != "pt":
            raise
        # torch.save reports a failed write as RuntimeError ("PytorchStreamWriter failed writing file ...") and
        # drops the errno: a full disk or a file size limit are the usual causes; a disk with less room than the
        # tensors (the temp is gone by now) was the full one
        try:
            full = shutil.disk_usage(os.path.dirname(os.path.abspath(dest))).free < \
                sum(qtensor.nbytes(v) for v in tensors.values())
        except OSError:
            full = False
        if full:
            raise _write_error(OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} ({str(e).strip()[:200]})"),
                               dest) from None
        raise BuildError("Writing the .pt file failed; the partial file was removed and nothing was written.",
                         path=dest, found=str(e).strip().splitlines()[0][:300] if str(e).strip() else "RuntimeError",
                         fix="Check the free space and the file size limit of that drive, or write the checkpoint "
                             "to another folder.") from None
    return os.path.abspath(dest)


def _write_error(e: OSError, dest: str) -> BuildError | None:
    """A clear BuildError for the file system refusing the output (nothing was written); None: not one of those."""
    if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        return BuildError("The disk filled up while writing; the partial file was removed and nothing was "
                          "written.", path=dest, found=str(e),
                          fix="Free some space on that drive, or write the checkpoint to another folder.")
    if e.errno == errno.EFBIG:
        return BuildError("The output is larger than this system lets one file be (file size limit); the partial "
                          "file was removed and nothing was written.", path=dest, found=str(e),
                          fix="Raise the file size limit (ulimit -f), or write to another file system.")
    if e.errno == errno.EROFS:
        return BuildError("The output folder is on a read-only file system; nothing was written.", path=dest,
                          found=str(e), fix="Write the checkpoint to a writable folder.")
    if e.errno in (errno.EACCES, errno.EPERM):
        return BuildError("No permission to write the output (permission denied); nothing was written.", path=dest,
                          found=str(e), fix="Write to a folder you may write to, fix its permissions, or clear an "
                                            "immutable flag on the existing file (chattr -i).")
    return None


