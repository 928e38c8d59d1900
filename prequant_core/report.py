"""Inspecting checkpoints (``info``) and checking them against a request (``verify``).

``info(path)`` tells what a checkpoint is without loading it:

- ``.safetensors``: only the 8-byte length and the JSON header are read. Every tensor becomes a ``meta`` tensor
  (shape and dtype, no storage); quantized weights are rebuilt as torchao tensors on ``meta`` with the same strict
  decoder the real reader uses, so the report, family detection and ``metadata.validate`` see exactly what a full
  read would, minus the bytes.
- ``.pt``: ``torch.load(mmap=True, weights_only=True)``: the pickle is read, tensor storages stay mapped and are
  never touched (sizes come from shapes and dtypes).
- Kinds these light paths do not understand (a ComfyUI-native safetensors twin, a legacy torchao-v1 ``.pt``) fall
  back to the full reader (``formats.read``), whatever ``container`` it reports; the report says how it was read.

Fingerprint verification hashes every quantized weight, so it reads the data; it runs only when asked
(``verify_fingerprint=True``), one weight at a time.
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Iterable, Iterator, Mapping


from .formats import fingerprint, layer_policy
from .load import memory_check, opening
from .request import Request
from .text_encoders import checks as encoder_checks
from .schemes import qtensor
from .errors import CorruptCheckpointError
from .formats.containers import READ_FULL, READ_HEADER, READ_MMAP, Light
from .safe_text import escape
from .units import human_bytes

READ_MODE_TEXT = {READ_HEADER: "header only, no weight bytes", READ_MMAP: "index only (memory-mapped, weights untouched)",
                  READ_FULL: "full read"}


# ----------------------------------------------------------------------------------------------------------------
# The report

@dataclasses.dataclass
class Report:
    path: str
    file_size: int
    container: str  # "safetensors" | "pt" | "legacy-pt" | "comfyui-native" | whatever a reader reports
    read_mode: str  # READ_HEADER | READ_MMAP | READ_FULL
    format_tag: str | None
    scheme: str | None  # as recorded in the metadata, else inferred from the weights
    schemes_found: list[str]  # from the weights themselves
    family: str | None
    layout: str | None  # key layout: "diffusers" | "comfyui"
    base_model_id: Any
    component: Any
    transformer_class: Any
    layers: str | None  # a v3 file's layer policy (layers per format) or a v2 file's rotation, else None
    quantized_count: int
    quantized_bytes: int  # stored bytes of the quantized weights (codes + scales + zero points)
    dense_count: int
    dense_bytes: int  # every other tensor, as stored
    dense_equivalent_bytes: int  # the same checkpoint unquantized (quantized weights at their logical dtype)
    torch_version: Any
    torchao_version: Any
    diffusers_version: Any
    min_features: Any
    exclude_tokens: Any
    fingerprint_present: bool
    fingerprint_algo: Any
    fingerprint_count: Any
    fingerprint_verified: bool | None  # None: not checked (not asked, or nothing to check)
    fingerprint_reasons: list[str]
    request: dict | None  # what the verdict was checked against; None: the file's own consistency only
    valid: bool
    reasons: list[str]
    notes: list[str]
    encoder: str | None = None  # a pre-cast text encoder: its model, ComfyUI class and tokenizer, in words
    # a file the loader downloaded: its repo (and revision), the names the loader asks that repo for, in order, and
    # the one this file is (``sources.hub_origin``)
    hub: dict | None = None

    @property
    def file(self) -> str:
        return os.path.basename(self.path)

    @property
    def total_bytes(self) -> int:
        return self.quantized_bytes + self.dense_bytes

    @property
    def saving_bytes(self) -> int:
        return self.dense_equivalent_bytes - self.total_bytes

    @property
    def saving_pct(self) -> float:
        if self.dense_equivalent_bytes <= 0:
            return 0.0
        return round(100.0 * self.saving_bytes / self.dense_equivalent_bytes, 1)

    def verdict_line(self) -> str:
        if self.request:
            asked = ", ".join(f"{k} '{v}'" for k, v in self.request.items())
            head = f"VALID for {asked}" if self.valid else f"INVALID for {asked}"
        else:
            head = ("VALID (no base or scheme requested: the file is self-consistent)" if self.valid
                    else "INVALID (the file is not a loadable pre-quantized checkpoint)")
        return head

    def rows(self) -> list[list[str]]:
        """(label, value) pairs: the one layout both ``to_text`` and the browser table show."""
        def opt(v):
            return "-" if v is None or v == "" else str(v)

        versions = ", ".join(f"{name} {v}" for name, v in (("torch", self.torch_version),
                                                           ("torchao", self.torchao_version),
                                                           ("diffusers", self.diffusers_version)) if v)
        fam = opt(self.family)
        if self.layout:
            fam += f" ({self.layout} keys)"
        if self.transformer_class:
            fam += f", {self.transformer_class}"
        scheme = opt(self.scheme)
        if self.schemes_found and [self.scheme] != self.schemes_found:
            scheme += f" (weights: {', '.join(self.schemes_found)})"
        if not self.fingerprint_present:
            fp = "absent"
        else:
            fp = f"{opt(self.fingerprint_algo)}, {opt(self.fingerprint_count)} weights; "
            fp += {None: "not verified", True: "verified", False: "MISMATCH"}[self.fingerprint_verified]
        ex = self.exclude_tokens
        ex_text = "-" if ex is None else (", ".join(map(str, ex)) if isinstance(ex, list) and ex else
                                          "none" if isinstance(ex, list) else str(ex))
        read = READ_MODE_TEXT.get(self.read_mode, self.read_mode)
        if self.fingerprint_verified is not None:  # verify_fingerprint read the weights after the header / index
            read = ("every tensor (full read)" if self.read_mode == READ_FULL else
                    f"{'header' if self.read_mode == READ_HEADER else 'index'} and every quantized weight (full "
                    "read, for verify_fingerprint)")
        other = self.file_size - self.total_bytes
        tensor_note = "quantized + unquantized"
        if other > 0:
            tensor_note += f"; the file's other {human_bytes(other)} is its header / index"
        rows = [
            ["File", f"{self.file} ({human_bytes(self.file_size)} on disk)"],
            ["Format", f"{opt(self.format_tag)} [{self.container}, read: {read}]"],
            ["Scheme", scheme],
            ["Family", fam],
            ["Base model", opt(self.base_model_id)],
            ["Component", opt(self.component)],
            *([["Layers", self.layers]] if self.layers else []),
            *([["Text encoder", self.encoder]] if self.encoder else []),
            *([["Hub source", self._hub_text()]] if self.hub else []),
            ["Quantized tensors", f"{self.quantized_count} tensors, {human_bytes(self.quantized_bytes)} "
                                  + ("(int8 codes + per-row scales, ConvRot)" if self.encoder and
                                     self.format_tag == encoder_checks.FORMAT_INT8_CONVROT else
                                     "(float8 storage, no scale: layerwise cast)" if self.encoder else
                                     "(codes + scales)")],
            ["Unquantized tensors", f"{self.dense_count} tensors, {human_bytes(self.dense_bytes)} (kept as stored)"],
            ["Tensor bytes", f"{human_bytes(self.total_bytes)} ({tensor_note})"],
            ["Dense model", f"{human_bytes(self.dense_equivalent_bytes)} with every tensor unquantized (this file "
                            f"saves {human_bytes(self.saving_bytes)}, {self.saving_pct:.1f} %)"],
            ["Versions", versions or "-"],
            ["min_features", opt(self.min_features)],
            ["Excluded names", ex_text],
            ["Fingerprint", fp],
        ]
        return [[k, escape(v)] for k, v in rows]  # names and values come from the file: no control characters

    def _hub_text(self) -> str:
        h = self.hub
        at = f"@{h['revision']}" if h.get("revision") else ""
        names = " → ".join(f"{n} (this file)" if n == h["served"] else n for n in h["names"])
        return f"{h['repo']}{at}, where the loader asks for {self.scheme} in this order: {names}"

    def to_dict(self) -> dict:
        d = {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}
        d.update(file=self.file, total_bytes=self.total_bytes, saving_bytes=self.saving_bytes,
                 saving_pct=self.saving_pct,
                 verdict={"ok": self.valid, "reasons": list(self.reasons), "requested": _jsonable(self.request),
                          "summary": self.verdict_line()},
                 rows=self.rows())
        return d

    def to_text(self) -> str:
        rows = self.rows()
        width = max(len(k) for k, _ in rows)
        lines = [f"Prequant Info: {escape(self.file)}", f"  {'Verdict'.ljust(width)}  {escape(self.verdict_line())}"]
        lines += [f"  {' ' * width}  - {escape(r)}" for r in self.reasons]
        lines += [f"  {k.ljust(width)}  {v}" for k, v in rows]
        lines += [f"  note: {escape(n)}" for n in self.notes]
        return "\n".join(lines)


def _jsonable(v):
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # strict JSON has no NaN / Infinity
    if v is None or isinstance(v, (bool, int, float)):
        return v
    if isinstance(v, str):
        return str(v)  # TorchVersion and other str subclasses -> plain str
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set)):
        return [_jsonable(x) for x in v]
    return str(v)


class _StreamedWeights(Mapping):
    """Quantized weights of a safetensors file, read and decoded one at a time (for fingerprint verification)."""

    def __init__(self, handle, parts: dict, path: str):
        self._f, self._parts, self._path = handle, parts, path

    def __iter__(self) -> Iterator[str]:
        return iter(self._parts)

    def __len__(self) -> int:
        return len(self._parts)

    def __getitem__(self, name: str):
        from .formats import torchao_json
        entry, stored = self._parts[name]
        try:
            return torchao_json.decode_weight(entry, {p: self._f.get_tensor(k) for p, k in stored.items()})
        except Exception as e:  # noqa: BLE001 - any failure reading a stranger's bytes is corruption
            raise CorruptCheckpointError(f"Quantized tensor '{name[:80]}' could not be read.", path=self._path,
                                         found=f"{type(e).__name__}: {str(e)[:200]}") from None


class _ScalesChecked(Mapping):
    """Weights as read for fingerprinting, each refused if its scale is not finite (the header-only report never
    reads a scale; verification reads every weight anyway)."""

    def __init__(self, tensors: Mapping, path: str):
        self._t, self._path = tensors, path

    def __iter__(self) -> Iterator[str]:
        return iter(self._t)

    def __len__(self) -> int:
        return len(self._t)

    def __getitem__(self, name: str):
        from .formats.validate_tensors import check_quantized
        t = self._t[name]
        if qtensor.is_quantized(t):  # every kind's own value checks (per-block scales are float8 / e8m0 bytes)
            check_quantized(name, t, self._path, read_data=True)
        return t


def _plain_value_reasons(light: Light, fh) -> list[str]:
    """Non-finite unquantized values, read one tensor at a time (the header-only report never reads them)."""
    from .errors import CorruptCheckpointError as Corrupt
    from .formats.validate_tensors import check_plain_tensors, int8_encoder_parts
    ck = light.checkpoint
    exempt = int8_encoder_parts(ck)
    plain = [k for k, v in ck.tensors.items() if not qtensor.is_quantized(v) and k not in exempt]
    try:
        if light.quantized_parts is None:
            check_plain_tensors({k: ck.tensors[k] for k in plain}, ck.path)
            return []
        from safetensors import safe_open
        from .formats.containers.safetensors_container import ROOT_PREFIX
        with safe_open(fh.io_path, framework="pt", device="cpu") as f:
            stored = set(f.keys())
            for k in plain:
                key = k if k in stored else ROOT_PREFIX + k
                if key in stored:
                    check_plain_tensors({k: f.get_tensor(key)}, ck.path)
    except Corrupt as e:
        return [f"values: {e.message}"]
    return []


def _verify_fingerprint(light: Light, fp: dict, fh) -> list[str]:
    ck = light.checkpoint
    if light.quantized_parts is None:
        return fingerprint.verify(_ScalesChecked(ck.tensors, ck.path), fp, "full")
    from safetensors import safe_open
    try:
        handle = safe_open(fh.io_path, framework="pt", device="cpu")
    except Exception as e:  # noqa: BLE001
        raise CorruptCheckpointError("The safetensors file could not be read.", path=ck.path,
                                     found=f"{type(e).__name__}: {str(e)[:200]}") from None
    with handle as f:
        weights = _ScalesChecked(_StreamedWeights(f, light.quantized_parts, ck.path), ck.path)
        plain = {k: None for k in ck.tensors if k not in light.quantized_parts}  # plain weights: never covered
        return fingerprint.verify({**plain, **{k: None for k in weights}}, fp, "full",
                                  digests={**plain, **{k: fingerprint.of_tensor(weights[k]) for k in weights}})


# ----------------------------------------------------------------------------------------------------------------

def _sizes(t) -> tuple[int, int]:
    """(stored bytes, dense-equivalent bytes) from shapes and dtypes only."""
    if qtensor.is_quantized(t):
        parts = [t.qdata, t.scale]
        for extra in ("zero_point", "per_tensor_scale"):
            if getattr(t, extra, None) is not None:
                parts.append(getattr(t, extra))
        return sum(p.numel() * p.element_size() for p in parts), qtensor.dense_nbytes(t)
    n = t.numel() * t.element_size()
    return n, n


def _request_dict(req: Request | None) -> dict | None:
    if req is None:
        return None
    d = {k: getattr(req, k) for k in ("base_model_id", "scheme", "family", "min_features", "exclude_tokens")
         if getattr(req, k) not in (None, "")}
    if d and encoder_checks.is_encoder_component(req.component):
        d["component"] = req.component
    return d or None


def info(path, request: Request | Mapping | None = None, verify_fingerprint: bool = False, *,
         model_dirs: Iterable[str] | None = None, memory: memory_check.Guard | None = opening.GUARD) -> Report:
    """Describe a checkpoint (and judge it against ``request``) without loading its weights: the load pipeline's
    open and judge steps (``load.opening.inspect``: allowlist, one handle, memory guard where a full read happens,
    the same verdict as the loader), then this report. ``memory`` None: no memory check.

    ``model_dirs``: the folders the file must lie in (Prequant Info: ComfyUI's model folders); None: the command
    line, where the file is named by hand. Raises the ``PrequantError`` family (not found, corrupt, unsafe,
    unsupported, unknown family/scheme in the request). A file that reads but does not fit (wrong base, v2 tag,
    dense) is a report with ``valid=False``.
    """
    if isinstance(request, Mapping):
        request = Request(**request)
    return opening.inspect(path, request, lambda o, light, fh: _report(o, light, fh, verify_fingerprint),
                           model_dirs=model_dirs, memory=memory)


def _report(opened: opening.Opened, light: Light, fh, verify_fingerprint: bool) -> Report:
    path = fh.path
    ck = light.checkpoint
    md = ck.metadata
    fam, layout, verdict, request = opened.family, opened.layout, opened.verdict, opened.request
    reasons = list(verdict.reasons)
    notes = list(opened.notes)

    q_count = q_bytes = d_count = d_bytes = equiv = 0
    int8_te = ck.format_tag == encoder_checks.FORMAT_INT8_CONVROT
    int8_layers = set(encoder_checks.int8_layers(ck.tensors)) if int8_te else set()
    for key, t in ck.tensors.items():
        stored, dense = _sizes(t)
        cast = opened.encoder is not None and t.dtype == encoder_checks.STORAGE_DTYPE and not int8_te
        side = False
        if int8_te:  # an int8 ConvRot layer: its codes stand for a bf16 weight, its scale and blob for nothing
            layer, _, attr = key.rpartition(".")
            if layer in int8_layers:
                cast, side = attr == "weight", attr != "weight"
        if cast:  # a layerwise-cast weight: its dense form is the bf16 it was cast from
            dense = 2 * stored
        elif side:
            dense = 0
        equiv += dense
        if qtensor.is_quantized(t) or cast:
            q_count += 1
            q_bytes += stored
        elif side:
            q_bytes += stored
        else:
            d_count += 1
            d_bytes += stored
    if ck.container == "comfyui-native":
        # its scales are decoded into the in-memory layout (a per-tensor fp8 scale repeated per row): the header's
        # offsets say what the file holds, and every byte not an unquantized tensor's belongs to a quantized layer
        from .load.memory_check import declared_bytes
        declared = declared_bytes(fh)
        if declared is not None and declared >= d_bytes:
            q_bytes = declared - d_bytes
    found = sorted(s for s in ck.schemes_found() if s)

    fp = md.get("fingerprint")
    fp_present = isinstance(fp, dict)
    fp_verified, fp_reasons = None, []
    if verify_fingerprint:
        if not fp_present:
            notes.append("no fingerprint recorded: nothing to verify")
        else:
            fp_reasons = _verify_fingerprint(light, fp, fh)
            fp_verified = not fp_reasons
            reasons += list(fp_reasons)  # each reason names the fingerprint itself
    elif fp_present:
        notes.append("fingerprint not verified: turn on verify_fingerprint (command line: --verify-fingerprint) to "
                     "hash every quantized weight against it (reads the whole file)")
    if verify_fingerprint:  # the whole file is read anyway: the unquantized values too (one NaN makes every output NaN)
        reasons += _plain_value_reasons(light, fh)

    scheme = md.get("scheme") if md.get("scheme") is not None else (",".join(found) or None)
    hub = _hub_origin(path, scheme, md)
    return Report(
        path=os.path.abspath(path), file_size=fh.size, container=ck.container, read_mode=light.read_mode,
        format_tag=ck.format_tag, scheme=scheme, schemes_found=found,
        family=md.get("family") if isinstance(md.get("family"), str) else (fam.name if fam else None),
        layout=layout, base_model_id=md.get("base_model_id"), component=md.get("component"),
        transformer_class=md.get("transformer_class"), layers=layer_policy.summary(md),
        quantized_count=q_count, quantized_bytes=q_bytes, dense_count=d_count, dense_bytes=d_bytes,
        dense_equivalent_bytes=equiv, torch_version=md.get("torch_version"),
        torchao_version=md.get("torchao_version"), diffusers_version=md.get("diffusers_version"),
        min_features=md.get("min_features"), exclude_tokens=md.get("exclude_name_tokens"),
        fingerprint_present=fp_present, fingerprint_algo=fp.get("algo") if fp_present else None,
        fingerprint_count=(fp.get("count") if fp.get("count") is not None else
                           len(fp["modules"]) if isinstance(fp.get("modules"), (dict, list)) else None)
        if fp_present else None,
        fingerprint_verified=fp_verified, fingerprint_reasons=fp_reasons, request=_request_dict(request),
        valid=not reasons, reasons=reasons, notes=notes, encoder=_encoder_text(opened), hub=hub)


def _hub_origin(path: str, scheme, md: Mapping) -> dict | None:
    if not isinstance(scheme, str) or "," in scheme:
        return None
    comp = md.get("component") if isinstance(md.get("component"), str) else None
    base = md.get("base_model_id") if isinstance(md.get("base_model_id"), str) else None
    from .load import sources
    return sources.hub_origin(path, scheme, comp, base)


def _encoder_text(opened: opening.Opened) -> str | None:
    """The encoder's model, the ComfyUI class it runs as, and where its tokenizer comes from."""
    from .families import encoders
    if opened.encoder is None:
        te = opened.checkpoint.metadata.get("te_class")
        return f"te_class {str(te)[:60]}: not an encoder this pack can run" if encoder_checks.is_encoder_file(
            opened.checkpoint) else None
    k = opened.encoder
    te = opened.checkpoint.metadata.get("te_class")
    if not k.hostable:
        from . import families
        fam = opened.checkpoint.metadata.get("family")
        known = encoder_checks.hosted_for(fam, opened.checkpoint.metadata.get("component")) \
            if isinstance(fam, str) and fam in families.FAMILIES else None
        own = known.comfy_file if known and known.comfy_file else k.comfy_file_hint
        need = k.needs_comfy(known)
        where = f"ComfyUI's class for it arrives in ComfyUI {need}" if need else \
            "this pack has no key map to ComfyUI's class for it yet"
        return (f"{k.name} ({te}); {where}: this pack describes and verifies the file but does not build it yet "
                f"(ComfyUI's own {own} loads with Load CLIP{' there' if need else ''})")
    if k.tokenizer == encoders.TOKENIZER_SPIECE:
        base = opened.checkpoint.metadata.get("base_model_id")
        tok = (f"tokenizer from {str(base)[:80]}'s {k.tokenizer_file} (downloaded once), or from ComfyUI's own "
               f"{k.comfy_file_hint} in models/text_encoders")
    else:
        tok = "tokenizer shipped with ComfyUI"
    return f"{k.name} ({te}), run by ComfyUI's own {k.name} class; {tok}"
