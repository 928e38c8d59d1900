"""A LoRA-patched weight is requantized a few rows at a time (the patch's memory, issue 38): per-row kinds give the
same bytes as quantizing the whole weight at once. (The originals the patch keeps give their pages back through
prequant_core.families.pages, tests/families/test_pages.py; through a real LoRA: tests/nodes/test_loader.py.)"""
from __future__ import annotations

import torch


def test_a_patched_weight_is_requantized_a_few_rows_at_a_time_to_the_same_bytes():
    """Per-row kinds requantize in row chunks (the LoRA patch's memory): the codes and scales equal quantizing the
    whole weight at once, bit for bit, for int8 and fp8, and a weight smaller than a chunk takes the one-shot path."""
    from prequant_core import schemes
    from prequant_core.schemes import qtensor, registry
    g = torch.Generator().manual_seed(5)
    for scheme in ("int8", "fp8"):
        w = (torch.randn(1300, 640, generator=g) / 25).to(torch.bfloat16)
        w[7] = 0  # an all-zero row: the eps floor of the scale
        parts, spec = qtensor.parts(schemes.quantize_weight(w, scheme))
        codec = registry.codec(spec.kind)
        assert codec.QUANTIZE_ROWS < w.shape[0]
        whole = codec.parts(codec.from_dense(w.float().to(spec.dtype), spec))[0]
        got = codec.quantize(w.float(), spec)
        assert len(got) == len(whole)
        for a, b in zip(got, whole):
            assert a.dtype == b.dtype and a.shape == b.shape
            assert torch.equal(a.view(torch.uint8) if a.element_size() == 1 else a,
                               b.view(torch.uint8) if b.element_size() == 1 else b), scheme
        for a, b in zip(got, parts):  # and the weight as the builder made it (bytes: fp8 may hold NaN codes)
            assert torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)), scheme
