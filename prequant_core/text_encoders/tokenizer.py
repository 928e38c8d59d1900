"""The tokenizer of a pre-cast text encoder (the file holds none), where ComfyUI takes it from a state dict
(Gemma's SentencePiece model as the ``spiece_model`` tensor): a ComfyUI text-encoder file of the same model the user
already has, else the base model's repo on the Hub, as Unsloth's loader does (downloaded once into the Hugging Face
cache, offline afterwards)."""
from __future__ import annotations

import dataclasses
import os
from typing import Iterable

import torch

from ..errors import CorruptCheckpointError, PrequantError
from ..families.encoders import EncoderKind
from ..context import LoadContext

MAX_BYTES = 64 << 20  # a SentencePiece model is a few MB (Gemma's: 4.2 MB)
SPIECE_KEY = "spiece_model"


@dataclasses.dataclass
class Tokenizer:
    data: torch.Tensor  # uint8, the model file's bytes
    source: str  # in words, for the node's status and Info


def _checked(raw: bytes, where: str, what: str, fix: str) -> torch.Tensor:
    """The bytes as the uint8 tensor ComfyUI takes, once SentencePiece itself has parsed them. ComfyUI parses them
    only while it builds the CLIP, after the encoder file was judged: a broken model there was reported as an internal
    error about the encoder file. Parsed here, the refusal names where the bytes came from (``where``, ``what``)."""
    if not raw or len(raw) > MAX_BYTES:
        raise CorruptCheckpointError(f"{what} is {len(raw)} bytes, not a SentencePiece model.", path=where,
                                     expected=f"1 byte to {MAX_BYTES >> 20} MiB", found=f"{len(raw)} bytes", fix=fix)
    # ComfyUI's SPieceTokenizer parses the same bytes with the same library (sentencepiece, one of its requirements)
    import sentencepiece
    try:
        pieces = sentencepiece.SentencePieceProcessor(model_proto=bytes(raw)).get_piece_size()
        problem = None if pieces > 0 else "a model without pieces"
    except Exception as e:  # noqa: BLE001 - a stranger's bytes: whatever the parser raises, the source is named
        problem = f"{type(e).__name__}: {str(e).strip()[:160]}"
    if problem:
        raise CorruptCheckpointError(f"{what} is not a SentencePiece model that SentencePiece can read.", path=where,
                                     expected="a serialized SentencePiece model (ModelProto), as ComfyUI's "
                                              "text-encoder files carry in their spiece_model tensor",
                                     found=f"{len(raw)} bytes starting {bytes(raw[:8]).hex(' ')}; SentencePiece: "
                                           f"{problem}", fix=fix)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


def from_comfy_files(kind: EncoderKind, folders: Iterable[str]) -> Tokenizer | None:
    """The ``spiece_model`` of a ComfyUI file of this encoder in ``folders`` (its header names the tensor and the
    encoder's marker keys; only that tensor is read)."""
    from ..formats.containers.safetensors_container import read_header
    for d in folders:
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for n in names:
            full = os.path.join(d, n)
            if not n.endswith(".safetensors") or not os.path.isfile(full):
                continue
            try:
                index, _, _ = read_header(full)
            except PrequantError:
                continue
            if SPIECE_KEY not in index or kind.missing_markers(index):
                continue
            entry = index[SPIECE_KEY]
            if entry.get("dtype") != "U8" or len(entry.get("shape") or ()) != 1:
                continue
            return Tokenizer(_donor_bytes(full, entry), f"the spiece_model of {n} (models/text_encoders)")
    return None


def _donor_bytes(full: str, entry: dict) -> torch.Tensor:
    """The donor's ``spiece_model``, its size checked from the header before a byte is read (a sparse file may
    declare gigabytes); any failure names the donor, never the encoder file being loaded."""
    fix = (f"Remove or replace {os.path.basename(full)} in models/text_encoders (a ComfyUI text-encoder file of the same "
           "model lends its tokenizer); the pre-cast encoder file itself is not at fault.")
    try:
        size = int(entry["shape"][0])
        a, b = (int(x) for x in entry["data_offsets"])
    except (KeyError, TypeError, ValueError):
        size, a, b = -1, 0, 0
    if not 0 < size <= MAX_BYTES or b - a != size:
        raise CorruptCheckpointError(
            f"The tokenizer donor {os.path.basename(full)} declares a spiece_model of {size} bytes, which is no "
            "SentencePiece model.", path=full, expected=f"1 byte to {MAX_BYTES >> 20} MiB, as its offsets span",
            found=f"{size} bytes declared, {b - a} by its offsets", fix=fix)
    try:
        from safetensors import safe_open
        with safe_open(full, framework="pt", device="cpu") as f:
            t = f.get_tensor(SPIECE_KEY)
        raw = t.numpy().tobytes()
    except PrequantError:
        raise
    except Exception as e:  # noqa: BLE001 - a stranger's file: whatever the reader raises, the donor is named
        raise CorruptCheckpointError(f"The tokenizer donor {os.path.basename(full)} could not be read.", path=full,
                                     found=f"{type(e).__name__}: {str(e)[:200]}", fix=fix) from None
    return _checked(raw, full, f"The spiece_model of the tokenizer donor {os.path.basename(full)}", fix)


def from_hub(kind: EncoderKind, base_repo: str, ctx: LoadContext = LoadContext()) -> Tokenizer:
    """The tokenizer file of ``base_repo`` through the Hugging Face cache (``ctx``'s download folder is for model
    files only)."""
    from ..hub import fetch as hub
    fetched = hub.download(base_repo, [kind.tokenizer_file], dataclasses.replace(ctx, download_dir=None))
    with open(fetched.path, "rb") as f:
        raw = f.read(MAX_BYTES + 1)
    how = "downloaded" if fetched.downloaded else "cached"
    data = _checked(raw, fetched.path, f"The tokenizer {base_repo}/{kind.tokenizer_file} ({how})",
                    f"Put ComfyUI's {kind.comfy_file_hint} into models/text_encoders (its tokenizer is used "
                    f"instead of the repo's); if the copy on disk was damaged, delete {fetched.path} and the Hugging "
                    "Face cache's blob it points to, so that it is downloaded again.")
    return Tokenizer(data, f"{base_repo}/{kind.tokenizer_file} ({how})")
