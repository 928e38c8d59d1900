"""prequant_core.families.pages: the fused q/k/v parts' pages of a memory-mapped file are given back after fusing, without
changing any value; memory that is not a file mapping is never advised."""
from __future__ import annotations

import torch

from prequant_core.families import keymap, pages
from prequant_core.schemes import quantize


def test_release_gives_back_file_pages_and_keeps_values(tmp_path):
    path = tmp_path / "w.pt"
    torch.save({"a": torch.randn(256, 4096), "b": torch.randn(3, 5)}, path)
    sd = torch.load(path, mmap=True, weights_only=True)
    a = sd["a"]
    before = a.clone()
    advised = pages.release([a, sd["b"]])
    assert advised > 0 and advised % 4096 == 0 and advised <= a.numel() * a.element_size()
    assert torch.equal(a, before)  # read back from the file: the same values


def test_anonymous_memory_is_never_advised():
    x = torch.randn(1024, 1024)
    y = x.clone()
    assert pages.release([x]) == 0
    assert torch.equal(x, y)


def test_fusing_rows_from_a_mapped_file_is_exact(tmp_path):
    g = torch.Generator().manual_seed(0)
    parts = {f"to_{n}.weight": quantize.quantize_rows(torch.randn(64, 1024, generator=g).to(torch.bfloat16), "int8")
             for n in "qkv"}
    from prequant_core.schemes import qtensor
    want = qtensor.cat_rows(list(parts.values()))
    path = tmp_path / "qkv.pt"
    torch.save(parts, path)
    mapped = torch.load(path, mmap=True, weights_only=True)  # torchao registers its tensor classes as safe
    codes = [qtensor.parts(v)[0][0] for v in mapped.values()]
    assert pages.release(codes) > 0  # the parts' codes are file pages here (what to_comfy gives back)
    key_map = {f"to_{n}.weight": ("qkv.weight", (0, 64 * i, 64)) for i, n in enumerate("qkv")}
    got = keymap.to_comfy(mapped, key_map)["qkv.weight"]
    for x, y in zip(qtensor.parts(got)[0], qtensor.parts(want)[0]):
        assert torch.equal(x, y)
    for k, v in mapped.items():  # the parts, given back, still read as before
        for x, y in zip(qtensor.parts(v)[0], qtensor.parts(parts[k])[0]):
            assert torch.equal(x, y)


def test_to_comfy_names_the_file_rows_a_fused_weight_was_copied_from(tmp_path):
    """What a LoRA's backup of a fused weight rests on (nodes/patcher.py): ``sources`` gets the parts, in row order,
    only where they all lie in a mapped file; parts in ordinary memory are not named (their copy is all there is)."""
    g = torch.Generator().manual_seed(1)
    parts = {f"to_{n}.weight": quantize.quantize_rows(torch.randn(64, 1024, generator=g).to(torch.bfloat16), "int8")
             for n in "kqv"}
    key_map = {f"to_{n}.weight": ("qkv.weight", (0, 64 * i, 64)) for i, n in enumerate("qkv")}
    path = tmp_path / "qkv.pt"
    torch.save(parts, path)
    mapped = torch.load(path, mmap=True, weights_only=True)
    from prequant_core.schemes import qtensor
    assert pages.file_backed(qtensor.parts(mapped["to_q.weight"])[0])
    assert not pages.file_backed([torch.randn(4, 4)]) and not pages.file_backed([])
    # a view of the mapped codes that is not their bytes in order (transposed), or holds none, is not file-backed
    q = qtensor.parts(mapped["to_q.weight"])[0][0]
    assert pages.file_backed([q]) and not pages.file_backed([q.t()]) and not pages.file_backed([q[:0]])
    sources: dict = {}
    keymap.to_comfy(mapped, key_map, sources=sources)
    assert list(sources) == ["qkv.weight"]
    assert [s is mapped[f"to_{n}.weight"] for s, n in zip(sources["qkv.weight"], "qkv")] == [True] * 3
    in_memory: dict = {}
    keymap.to_comfy(parts, key_map, sources=in_memory)
    assert in_memory == {}


def test_a_mappings_snapshot_serves_several_releases(tmp_path):
    path = tmp_path / "w.pt"
    torch.save({"a": torch.randn(512, 4096)}, path)
    a = torch.load(path, mmap=True, weights_only=True)["a"]
    snap = pages.file_mappings()
    assert snap is not None and len(snap.starts) == len(snap.spans) > 0
    assert sum(pages.release([a[i:i + 128]], snap) for i in range(0, 512, 128)) > 0
    assert pages.release([torch.randn(1024, 1024)], snap) == 0  # anonymous memory: never advised


def test_pages_are_given_back_in_the_kernels_own_page_size():
    # round 5: a hard-coded 4096 made madvise fail on 16K / 64K-page kernels (pages never given back)
    import mmap
    from prequant_core.families import pages
    assert pages._PAGE == mmap.PAGESIZE
