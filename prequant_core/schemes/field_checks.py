"""The checks a codec's ``check_fields`` runs on a stranger's tensor attributes: each raises ``Bad`` (field, what was
expected, what was found), which ``formats/tensor_fields.check_fields`` turns into the file's typed error."""
from __future__ import annotations

import dataclasses

import torch

from ..safe_text import escape
from .codec import row_block_accepted as block_accepted


class Bad(Exception):
    def __init__(self, field: str, expected: str, found):
        super().__init__(field)
        self.field, self.expected, self.found = field, expected, found


def need(ok: bool, field: str, expected: str, value) -> None:
    if not ok:
        raise Bad(field, expected, f"{type(value).__name__} {escape(repr(value)[:80])}")


def bool_(v, field):
    need(isinstance(v, bool), field, "true or false", v)


def int_(v, field, allowed=None):
    need(isinstance(v, int) and not isinstance(v, bool) and (allowed is None or v in allowed), field,
          f"an integer{'' if allowed is None else ' in ' + str(sorted(allowed))}", v)


def enum(v, cls, field):
    need(isinstance(v, cls), field, f"a {cls.__name__}", v)


def opt_float(v, field, lo=None):
    need(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and v == v
                        and abs(v) != float("inf") and (lo is None or v >= lo)), field,
          "none or a finite number" + ("" if lo is None else f" >= {lo}"), v)


def scalar(v, field):
    need(v is None or (isinstance(v, torch.Tensor) and type(v) is torch.Tensor and v.dtype == torch.float32
                        and v.numel() == 1), field, "none or one float32 number", v)


def granularity(v, field):
    from torchao.quantization import PerRow, PerTensor
    need(type(v) in (PerRow, PerTensor) or (isinstance(v, (list, tuple)) and len(v) == 2
                                             and all(type(g) in (PerRow, PerTensor) for g in v)),
          field, "PerRow / PerTensor granularity", v)
    for g in (v if isinstance(v, (list, tuple)) else (v,)):
        if type(g) is PerRow:
            int_(g.dim, field + ".dim", {-1, 1})


def block(v, field, shape, whole_ok=False):
    need(block_accepted(v, shape, whole_ok), field, f"[1, {shape[-1] if len(shape) else -1}] (one block per row)", v)


def dataclass_of(v, cls, field):
    need(type(v) is cls and dataclasses.is_dataclass(v), field, f"a {cls.__name__} or none", v)
