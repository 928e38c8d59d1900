"""The pipeline's open and judge steps, shared by every client (the loader node, the diffusers loader, Prequant Info,
``python -m prequant_core info | verify``): the allowlist -> the file opened once (the allowlist judges that handle)
-> the memory guard where the whole file is read -> the container's read (full, or header / index only) -> family,
layout and ``metadata.validate``'s verdict -> the fingerprint. What is built from it is the client's step."""
from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Callable, Iterable, Iterator, TypeVar

from . import allowlist, memory_check, metadata
from ..request import Request, Verdict
from ..text_encoders import checks as encoder_checks
from .. import families, formats
from ..families import encoders
from ..formats import fingerprint, layer_policy
from ..formats.checkpoint import Checkpoint
from ..formats.containers import READ_FULL, Light, recognise
from ..errors import UnknownFamilyError, ValidationError, reading
from ..families import Family

T = TypeVar("T")


@dataclasses.dataclass
class Opened:
    checkpoint: Checkpoint
    family: Family | None  # None only for a lenient judgement (Info) of a file whose family is not recognised
    layout: str | None
    verdict: Verdict
    read_mode: str = READ_FULL
    request: Request | None = None  # as judged (Info may take the component the file records)
    notes: list[str] = dataclasses.field(default_factory=list)
    encoder: encoders.EncoderKind | None = None  # a pre-cast text encoder's model (None: a transformer file)


@contextlib.contextmanager
def open_allowed(path: str, model_dirs: Iterable[str] = ()) -> Iterator[formats.OpenedFile]:
    """The file opened once, when the allowlist lets it be read: the rule judges the name first, then the handle
    (whatever happens to the name now, every later read goes through this handle)."""
    model_dirs = list(model_dirs)
    allowlist.check(path, model_dirs)
    with formats.open_file(path) as f:
        allowlist.check_opened(f, model_dirs)
        yield f


GUARD = memory_check.Guard()  # the host check alone: what a load is judged by where the caller names no device


def read_full(f, memory: memory_check.Guard | None = GUARD) -> Checkpoint:
    """Every tensor, after the memory guard judged the stored bytes; then what the tensors declare, before any of
    their bytes is touched. ``memory`` None: no memory check."""
    if memory is not None:
        memory_check.check_file(f, memory)
    ckpt = formats.read(f)
    if memory is not None:
        memory_check.check_declared(ckpt, memory)
    return ckpt


def read_light(f, memory: memory_check.Guard | None = GUARD) -> Light:
    """The container's header / index read (no weight byte), else (kinds the light paths do not understand) the
    full read under the memory guard."""
    light = recognise(f).read_light(f)
    if light is not None:
        from ..formats.validate_tensors import check_plain_tensors, int8_encoder_parts
        check_plain_tensors(light.checkpoint.tensors, f.path, read_data=False,  # dtypes from the header
                            exempt=int8_encoder_parts(light.checkpoint))
        return light
    return Light(read_full(f, memory), READ_FULL)


def judge(ckpt: Checkpoint, request: Request, real: str, *, strict: bool = True) -> Opened:
    """Family, layout and the verdict against ``request``. ``strict`` (a load): an unknown family or a failed verdict
    raises. Lenient (Info / verify): both are reported, and an expert a two-expert family records (Wan 2.2 A14B's
    transformer_2) is judged as what it records."""
    if encoder_checks.is_encoder_file(ckpt) or encoder_checks.asks_for_encoder(request):
        return _judge_encoder(ckpt, request, real, strict)
    notes: list[str] = []
    keys = ckpt.tensors.keys()
    req_fam = families.get(request.family) if request.family else None
    if strict:
        fam = req_fam
        layout = fam.layout_of(keys) if fam else None
        if layout is None:
            detected, layout = families.detect(keys, ckpt.metadata, real)
            fam = fam or detected
    else:
        fam = layout = None
        try:
            fam, layout = families.detect(keys, ckpt.metadata, real)
        except UnknownFamilyError:
            notes.append("model family not recognised from the metadata or the tensor names")
        if layout is None and req_fam is not None:
            layout = req_fam.layout_of(keys)
    judged_as = req_fam or fam
    comp = ckpt.metadata.get("component")
    if not strict and request.component == "transformer" and isinstance(comp, str) and comp != "transformer" and \
            judged_as is not None and comp in judged_as.arch.components:
        request = dataclasses.replace(request, component=comp)
        notes.append(f"component '{comp}': load it with the loader's component set to {comp}")
    verdict = metadata.validate(ckpt, request, family=judged_as)
    if strict and not verdict.ok:
        raise ValidationError("The checkpoint does not match what was asked for; it was not loaded.", path=real,
                              reasons=verdict.reasons,
                              fix="Pick the file built for this base model and scheme, or change the node's "
                                  "base_model_id / scheme inputs.")
    notes += list(getattr(verdict, "notes", None) or [])  # accepted but worth saying (e.g. per-tensor twins)
    return Opened(ckpt, fam, layout, verdict, request=request, notes=notes)


def _judge_encoder(ckpt: Checkpoint, request: Request, real: str, strict: bool) -> Opened:
    """A pre-cast text encoder (or a request for one): its family is what it records or what is asked for; a
    transformer load of an encoder file is refused by name. Info judges it as the component it records."""
    m = ckpt.metadata
    notes: list[str] = []
    name = request.family or (m.get("family") if isinstance(m.get("family"), str) else None)
    fam = None
    if name:
        try:
            fam = families.get(name)
        except UnknownFamilyError:
            if request.family:
                raise
            notes.append(f"family '{str(name)[:40]}' is not one this pack registers")
    kind = encoders.for_class(m.get("te_class"))
    comp = m.get("component")
    if encoder_checks.is_encoder_file(ckpt) and not encoder_checks.asks_for_encoder(request):
        what = f"{kind.name} " if kind else ""
        if strict:
            raise ValidationError(f"This is a pre-cast {what}text encoder ({str(comp)[:40]}), not a transformer; it "
                                  "was not loaded.", path=real, expected=f"a {request.component} checkpoint",
                                  found=f"{ckpt.format_tag or 'an untagged file'} recording te_class "
                                        f"{str(m.get('te_class'))[:60]}",
                                  fix="Load it with Load Prequant Text Encoder (its CLIP output goes where "
                                      "CLIPLoader's does).")
        if encoder_checks.is_encoder_component(comp):
            request = dataclasses.replace(request, component=comp)
            kind = encoders.for_class(m.get("te_class"))
            notes.append(f"a text encoder ({comp}): load it with Load Prequant Text Encoder" if kind is None or
                         kind.hostable else f"a text encoder ({comp}) Load Prequant Text Encoder does not build yet "
                                            f"(a {kind.name}): described here")
    verdict = encoder_checks.validate(ckpt, request)
    if strict and not verdict.ok:
        raise ValidationError("The text-encoder file does not match what was asked for; it was not loaded.",
                              path=real, reasons=verdict.reasons,
                              fix="Pick the file hosted for this family and component (the node's preset downloads "
                                  "it), or change the node's family / component / base_model_id inputs.")
    return Opened(ckpt, fam, "transformers", verdict, request=request, notes=notes + list(verdict.notes),
                  encoder=kind)


def open_checkpoint(path: str, request: Request | None = None, *, model_dirs: Iterable[str] = (),
                    strict: bool = True, memory: memory_check.Guard | None = GUARD,
                    fingerprint_mode: str | None = None) -> Opened:
    """A load's open and judge: ``memory`` checks host memory (and, where the guard names one, the load device's)
    against the file's declared size before reading it (``memory_check``); None skips the check.
    ``fingerprint_mode``: ``full`` / ``sample`` / ``off`` (None: ``fingerprint.mode_from_env``); checked only for a
    file that passed validation."""
    request = request or Request()
    with open_allowed(path, model_dirs) as f:
        ckpt = read_full(f, memory)
        st = os.fstat(f.fd)  # the opened file's identity, for a remembered fingerprint pass
    real = f.real
    with reading(real, "judged"):
        opened = judge(ckpt, request, real, strict=strict)
        if opened.verdict.ok:
            check_fingerprint(ckpt, real, st, fingerprint_mode)
        # Unsloth's rule: every fp8 weight runs torchao's TORCH kernels (the same as load-time quantization)
        metadata.pin_loaded(ckpt.tensors)
        layer_policy.mark_rotations(ckpt)
        return opened


def inspect(path, request: Request | None, build: Callable[[Opened, Light, formats.OpenedFile], T], *,
            model_dirs: Iterable[str] | None = None, memory: memory_check.Guard | None = GUARD) -> T:
    """Info's open and judge (header / index only where the container can), then ``build(opened, light, handle)``
    while the file is still open (fingerprint verification reads weights through it). ``path``: a name, or a handle
    the caller opened (then already judged by the allowlist). ``model_dirs`` None: the command line, where the person
    names the file themselves (its own folder is allowed)."""
    request = request or Request()
    if isinstance(path, formats.OpenedFile):
        ctx = contextlib.nullcontext(path)
    else:
        dirs = [os.path.dirname(os.path.abspath(str(path)))] if model_dirs is None else list(model_dirs)
        ctx = open_allowed(str(path), dirs)
    with ctx as f, reading(f.path, "described"):
        light = read_light(f, memory)
        opened = judge(light.checkpoint, request, f.path, strict=False)
        opened.read_mode = light.read_mode
        return build(opened, light, f)


def check_fingerprint(ckpt: Checkpoint, real: str, st: os.stat_result | None, mode: str | None = None) -> None:
    """Unsloth's check of the recorded ``md5-packed-v1`` digests against the weights, before any weight is placed.
    A full pass is remembered for this very file (path, inode, size, mtime, ctime), so it is hashed once, not on every load."""
    fp = ckpt.metadata.get("fingerprint")
    mode = mode or fingerprint.mode_from_env()
    if not fp or mode == "off":
        return
    if st is not None and fingerprint.remembered(real, st, fp):
        return
    reasons = fingerprint.verify(ckpt.tensors, fp, mode)
    if reasons:
        raise ValidationError("The checkpoint's weights do not match the fingerprint recorded when it was built; it "
                              "was not loaded.", path=ckpt.path, reasons=reasons,
                              fix="Download or build the file again (a damaged or edited file). To load it anyway, "
                                  "set PREQUANT_FINGERPRINT=off before starting ComfyUI.")
    if mode == "full" and st is not None:
        fingerprint.remember(real, st, fp)
