"""Scheme -> torchao config and the layer filter: one implementation shared by the builder and by load-time
quantization, so a pre-quantized file and quantizing on the fly give the same tensors bit for bit. The facts of each
scheme live in its own module (``int8.py``, ``fp8.py``, ``nvfp4.py``, ``mxfp8.py``), listed in ``registry.py``."""
from __future__ import annotations

import dataclasses

import torch

from ..errors import ValidationError
from ..scheme_names import DEFAULT, DEFAULT_MIN_FEATURES, spelling  # noqa: F401 (public names)
from . import qtensor, registry
from .record import WEIGHT_ONLY_TAIL, Scheme  # noqa: F401 (public names)


def names() -> tuple[str, ...]:
    """Every scheme name a file or a node input may use (``registry.names``), read at call time."""
    return registry.names()


@dataclasses.dataclass(frozen=True)
class SchemeRules:
    name: str
    require_bf16: bool
    require_divisible: int
    fast_accum: bool | None
    fp8_granularity: str | None  # the granularity the file must record (fp8: per_row), in granularity_field
    granularity_field: str | None = None


def normalize(scheme: str) -> str:
    s = spelling(scheme, {x.name for x in registry.all_schemes()})
    if registry.lookup(s) is not None:
        return s
    raise ValidationError(f"Unknown quantization scheme '{scheme}'.", expected=" / ".join(registry.names()),
                          found=str(scheme), fix="Pick one of the listed schemes.")


def get(scheme: str) -> tuple[Scheme, bool]:
    """(the scheme's record, weight-only?) for any spelling ``normalize`` accepts."""
    return registry.lookup(normalize(scheme))


def rules(scheme: str) -> SchemeRules:
    name = normalize(scheme)
    s, weight_only = registry.lookup(name)
    return SchemeRules(name, require_bf16=s.require_bf16, require_divisible=s.require_divisible,
                       fast_accum=None if weight_only else s.fast_accum, fp8_granularity=s.granularity,
                       granularity_field=s.granularity_field)


def same_kind(a: str, b: str) -> bool:
    """Whether two scheme names store weights of the same kind (int8 and int8-weight-only do)."""
    return get(a)[0].kind == get(b)[0].kind


def bf16_rule_text() -> str:
    return "true for " + " and ".join(s.name for s in registry.all_schemes() if s.require_bf16) + " only"


def rules_text() -> str:
    """Unsloth's scheme-pinned rules in words, from the records (error messages and docs)."""
    return ", ".join(f"{s.name} {s.require_divisible}" for s in registry.all_schemes())


def torchao_config(scheme: str):
    """The exact torchao config a scheme stands for (docs/FORMAT.md section 4)."""
    s, weight_only = get(scheme)
    return s.config(weight_only)


def quantize_weight(weight: torch.Tensor, scheme: str):
    """Quantize one Linear weight exactly as ``quantize_(module, torchao_config(scheme))`` would."""
    s, weight_only = get(scheme)
    return s.quantize(weight, s.config(weight_only))


def exclude_tokens(scheme: str, family_extra: tuple[str, ...] = ()) -> list[str]:
    """The tokens in Unsloth's order (base list, then the family's extras as docs/FORMAT.md section 4 lists them),
    never sorted: older Unsloth loaders compare the recorded list as an ordered tuple and refuse any other order."""
    s, _ = get(scheme)
    if s.exclude_base_tokens:
        return list(dict.fromkeys((*s.exclude_base_tokens, *family_extra)))
    return []


@dataclasses.dataclass(frozen=True)
class LayerFilter:
    """Which ``nn.Linear`` weights a scheme quantizes (docs/FORMAT.md section 4, layer filter)."""
    scheme: str
    min_features: int = DEFAULT_MIN_FEATURES
    exclude: tuple[str, ...] = ()

    def reason_skipped(self, name: str, weight: torch.Tensor) -> str | None:
        """None if the Linear weight is quantized, else why not. ``name`` is the module name (no ``.weight``)."""
        r = rules(self.scheme)
        if weight.ndim != 2:
            return "not a Linear weight"
        out_f, in_f = weight.shape
        if in_f < self.min_features or out_f < self.min_features:
            return f"smaller than min_features={self.min_features}"
        low = name.lower()
        for tok in self.exclude:
            if tok in low:
                return f"name contains excluded token '{tok}'"
        if r.require_bf16 and weight.dtype != torch.bfloat16:
            return f"{weight.dtype} weight (scheme needs bfloat16)"
        # Unsloth's filter asks both dims to divide (MX blocks run along the input dim only, but a file must hold
        # the layers Unsloth's builder quantizes, and load-time quantization must quantize the same ones)
        if r.require_divisible and any(d % r.require_divisible for d in (in_f, out_f)):
            return f"dims not divisible by {r.require_divisible}"
        return None


_SPECS: dict = {}


def spec(scheme: str, dtype: torch.dtype = torch.bfloat16):
    """The ``qtensor.QSpec`` (activation quantization, fp8 mm config, kernels) this scheme gives a weight of
    ``dtype``: taken from the scheme's own config, for readers that rebuild weights from bare codes and scales."""
    key = (normalize(scheme), dtype)
    if key not in _SPECS:
        _SPECS[key] = qtensor.parts(quantize_weight(torch.ones(16, 32, dtype=dtype), key[0]))[1]
    return _SPECS[key]
