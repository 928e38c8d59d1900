"""Giving back a checkpoint file's resident pages (prequant_core/load/file_pages.py): what a LoRA patch does with the
original weights it keeps only for an exact unpatch. The pages of a memory-mapped file's tensor leave the process's
resident memory and come back from the file byte for byte; an anonymous tensor (a fused or converted weight) is
never touched, since dropping its pages would zero it."""
from __future__ import annotations

import os

import torch

from prequant_core.load import file_pages


def _rss_file_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssFile:"):
                return int(line.split()[1])
    raise AssertionError("no RssFile in /proc/self/status")


def test_a_mapped_files_pages_go_and_come_back_byte_for_byte(tmp_path):
    path = str(tmp_path / "w.pt")
    torch.save({"w": torch.randint(-128, 127, (4096, 4096), dtype=torch.int8)}, path)
    t = torch.load(path, mmap=True, weights_only=True)["w"]
    want = t.clone()  # an anonymous copy to compare with
    assert torch.equal(t, want)  # every page read: resident now
    before = _rss_file_kib()
    freed = file_pages.release([t])
    after = _rss_file_kib()
    assert freed >= (16 << 20) - 2 * os.sysconf("SC_PAGE_SIZE"), freed  # all but the edge pages of 16 MiB
    assert before - after >= (freed >> 10) * 0.9, (before, after, freed)  # they left the resident set
    assert torch.equal(t, want), "read again from the file: the same bytes"


def test_an_anonymous_tensor_is_never_touched():
    t = torch.randint(-128, 127, (4096, 4096), dtype=torch.int8)
    want = t.clone()
    assert file_pages.release([t, torch.empty(0), None]) == 0
    assert torch.equal(t, want)


def test_a_view_into_a_mapped_file_releases_only_its_own_whole_pages(tmp_path):
    path = str(tmp_path / "two.pt")
    torch.save({"a": torch.full((3000,), 7, dtype=torch.int8), "b": torch.full((5000,), 9, dtype=torch.int8)}, path)
    sd = torch.load(path, mmap=True, weights_only=True)
    a, b = sd["a"], sd["b"]
    assert file_pages.release([a]) % os.sysconf("SC_PAGE_SIZE") == 0
    assert torch.equal(a, torch.full((3000,), 7, dtype=torch.int8))
    assert torch.equal(b, torch.full((5000,), 9, dtype=torch.int8))


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
