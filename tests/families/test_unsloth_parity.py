"""Files move both ways with Unsloth Studio: what this builder writes passes Unsloth's loader rules (older releases:
the recorded exclude list compared as an ordered tuple; newer: the rules of docs/FORMAT.md "Validation rules"), and
this pack validates as Unsloth does, except where it is deliberately safer (README "Unsloth parity").

``unsloth_v1_accepts`` is the older Unsloth rule set written out from its documented behaviour (docs/FORMAT.md,
section 4 and "Validation rules"); the real files are this pack's builder output, read by this pack's readers.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from conftest import BASE_ID
from prequant_core import builder, families, formats, schemes
from prequant_core.load import opening, metadata, sources
from prequant_core.formats.checkpoint import FORMAT_V1
from prequant_core.errors import HubError, ValidationError
from prequant_core.formats.containers.pt import load_weights_only
from prequant_core.families import hub_names
from tools import tiny_families as tf

# Unsloth's order, written out (docs/FORMAT.md section 4), not derived from our code
UNSLOTH_INT8_BASE = ("norm", "_mod", "modulation", "timestep_embed", "guidance_embed", "time_text_embed", "pooled",
                     "time_embed")
UNSLOTH_FAMILY_EXTRA = {"qwen-image": ("txt_in", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out", "txt_mlp"),
                        "hunyuanvideo-1.5": ("context_embedder", "image_embedder", "add_q_proj", "add_k_proj",
                                             "add_v_proj", "to_add_out", "ff_context"),
                        "ltx-2": ("audio", "av_cross_attn", "adaln"), "minimax-h3": ("adaln_proj",)}


def unsloth_v1_accepts(fmt, m: dict, *, scheme: str, family: str, base: str) -> list[str]:
    """Older Unsloth loader's checks on a v1 file (reasons; empty = accepted)."""
    r = []
    if fmt != FORMAT_V1:
        r.append("format")
    tail = lambda s: s.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1].lower()  # noqa: E731
    if m.get("base_model_id") is None or (m["base_model_id"] != base and tail(m["base_model_id"]) != tail(base)):
        r.append("base")
    if m.get("scheme") != scheme:
        r.append("scheme")
    if int(m.get("min_features")) != 512:
        r.append("min_features")
    want = (UNSLOTH_INT8_BASE + UNSLOTH_FAMILY_EXTRA.get(family, ())) if scheme == "int8" else ()
    if tuple(m.get("exclude_name_tokens") or ()) != want:
        r.append("exclude_name_tokens (ordered tuple)")
    if m.get("require_bf16") != (scheme == "fp8") or m.get("require_divisible") != (16 if scheme == "fp8" else 0):
        r.append("require_bf16/require_divisible")
    if scheme == "fp8" and m.get("fp8_granularity") != "per_row":
        r.append("fp8_granularity")
    if m.get("component", "transformer") != "transformer":
        r.append("component")
    return r


@pytest.mark.parametrize("container", ["safetensors", "pt"])
@pytest.mark.parametrize("scheme", ["int8", "fp8"])
@pytest.mark.parametrize("family", ["qwen-image", "flux.1"])
def test_builder_files_pass_unsloths_older_ordered_rules(tmp_path, family, scheme, container):
    t = tf.TINY[family]
    path = str(tmp_path / f"{t.file_stem}-{scheme.upper()}.{container}")
    builder.build_from_tensors(tf.dense(family), builder.Target(path, container=container),
                               builder.Recipe(scheme, family=families.get(family), base_model_id=t.base_model_id))
    ck = formats.read(path)
    m = ck.metadata
    assert unsloth_v1_accepts(ck.format_tag, m, scheme=scheme, family=family, base=t.base_model_id) == []
    if scheme == "int8":  # written in Unsloth's order, not sorted
        assert m["exclude_name_tokens"] == list(UNSLOTH_INT8_BASE + UNSLOTH_FAMILY_EXTRA.get(family, ()))
        assert m["exclude_name_tokens"] != sorted(m["exclude_name_tokens"])
    # and this pack's own validation accepts it for the same request
    v = metadata.validate(ck, metadata.Request(scheme=scheme, base_model_id=t.base_model_id, min_features=512),
                          family=families.get(family))
    assert v.ok, v.reasons


@pytest.mark.parametrize("scheme", ["int8", "fp8"])
@pytest.mark.parametrize("family", sorted(families.FAMILIES))
def test_every_familys_record_passes_unsloths_older_rules(family, scheme):
    """The record the builder writes for every registered family (the files themselves: the test above and
    tests/test_diffusers_loader.py)."""
    fam = families.get(family)
    w = torch.randn(512, 512, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    tensors = {"blocks.0.proj.weight": schemes.quantize_weight(w, scheme)}
    exclude = schemes.exclude_tokens(scheme, fam.arch.int8_exclude_extra)
    m = builder.make_metadata(builder.Recipe(scheme, family=fam, base_model_id=fam.hosting.base_repos[0],
                                             min_features=512, exclude=exclude), tensors)
    assert unsloth_v1_accepts(FORMAT_V1, m, scheme=scheme, family=family, base=fam.hosting.base_repos[0]) == []
    assert m["transformer_class"] == fam.arch.diffusers_class and m["family"] == family


def test_sorted_list_is_what_the_older_rule_refused():
    """Control: the list as this pack used to write it (sorted) fails the ordered comparison above."""
    m = {"base_model_id": BASE_ID, "scheme": "int8", "min_features": 512, "require_bf16": False,
         "require_divisible": 0, "exclude_name_tokens": sorted(UNSLOTH_INT8_BASE)}
    assert unsloth_v1_accepts(FORMAT_V1, m, scheme="int8", family="z-image", base=BASE_ID) == \
        ["exclude_name_tokens (ordered tuple)"]
    m["exclude_name_tokens"] = list(UNSLOTH_INT8_BASE)
    assert unsloth_v1_accepts(FORMAT_V1, m, scheme="int8", family="z-image", base=BASE_ID) == []
    assert schemes.exclude_tokens("int8", families.get("qwen-image").arch.int8_exclude_extra) == \
        list(UNSLOTH_INT8_BASE + UNSLOTH_FAMILY_EXTRA["qwen-image"])


# --- validation rules, one by one, on real files --------------------------------------------------------------------

def _pt_with(src: str, dst, edit) -> str:
    obj = load_weights_only(src, mmap=False)
    edit(obj)
    torch.save(obj, dst)
    return str(dst)


def _verdict(path, **req) -> metadata.Verdict:
    o = opening.open_checkpoint(path, metadata.Request(**req), model_dirs=[str(path.rsplit("/", 1)[0])], strict=False)
    return o.verdict


@pytest.fixture
def pt_int8(prequant_files):
    return prequant_files("int8", "pt")


@pytest.fixture
def pt_fp8(prequant_files):
    return prequant_files("fp8", "pt")


def test_requested_base_needs_a_recorded_base(pt_int8, tmp_path):
    p = _pt_with(pt_int8, tmp_path / "nobase.pt", lambda o: o["metadata"].pop("base_model_id"))
    assert _verdict(p).ok  # nothing requested: accepted (older files)
    v = _verdict(p, base_model_id=BASE_ID)
    assert not v.ok and any("records no base_model_id" in r for r in v.reasons)


def test_untagged_containers_are_refused(pt_int8, prequant_files, tmp_path):
    import json
    p = _pt_with(pt_int8, tmp_path / "untagged.pt", lambda o: o.pop("format"))
    v = _verdict(p)
    assert not v.ok and any("no format tag ('format' entry" in r for r in v.reasons)
    with pytest.raises(ValidationError):
        opening.open_checkpoint(p, metadata.Request(), model_dirs=[str(tmp_path)])
    src = prequant_files("int8", "safetensors")
    with open(src, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    assert header["__metadata__"].pop("unsloth_format") == FORMAT_V1
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    dst = tmp_path / "untagged.safetensors"
    dst.write_bytes(len(blob).to_bytes(8, "little") + blob + data)
    v = _verdict(str(dst))
    assert not v.ok and any("no format tag ('unsloth_format'" in r for r in v.reasons)
    assert _verdict(src).ok  # control: the same file with its tag


@pytest.mark.parametrize("base,ok", [("C:\\models\\Z-Image-Turbo", True), ("C:\\models\\Z-Image-Turbo\\", True),
                                     ("D:\\Z-IMAGE-TURBO", True), ("/models/Z-Image-Turbo/", True),
                                     ("C:\\models\\Z-Image", False), ("Tongyi-MAI/Z-Image-Turbo-2", False)])
def test_base_ids_compare_by_last_part_with_either_slash(pt_int8, base, ok):
    v = _verdict(pt_int8, base_model_id=base)
    assert v.ok is ok, v.reasons


@pytest.mark.parametrize("recorded,requested,ok", [("512", 512, True), (" 512 ", 512, True), ("1024", 512, False),
                                                   (512, "512", True), ("lots", None, False)])
def test_min_features_compared_as_integers(pt_int8, tmp_path, recorded, requested, ok):
    p = _pt_with(pt_int8, tmp_path / "mf.pt", lambda o: o["metadata"].__setitem__("min_features", recorded))
    v = _verdict(p, min_features=requested)
    assert v.ok is ok, v.reasons
    if recorded == "lots":
        assert any("expected an integer" in r for r in v.reasons)


def test_fast_accum_checked_only_when_forced(pt_fp8, tmp_path):
    p = _pt_with(pt_fp8, tmp_path / "fa.pt", lambda o: o["metadata"].__setitem__("fast_accum", False))
    assert _verdict(p, scheme="fp8").ok  # an older fp8 file that recorded false: accepted, as Unsloth does
    v = _verdict(p, scheme="fp8", fast_accum=True)
    assert not v.ok and any("fast_accum is False, requested True" in r for r in v.reasons)
    assert _verdict(pt_fp8, scheme="fp8", fast_accum=True).ok


@pytest.mark.parametrize("tokens,ok", [
    (list(UNSLOTH_INT8_BASE), True),  # today's list in Unsloth's order
    (sorted(UNSLOTH_INT8_BASE), True),  # order does not matter to this pack (newer Unsloth: set rules)
    (list(UNSLOTH_INT8_BASE) + ["proj_out", "context_embedder"], True),  # a superset: more layers kept dense
    (list(UNSLOTH_INT8_BASE[:-1]), False),  # lacks time_embed
    (["norm"], False),
])
def test_exclude_list_superset_rule(pt_int8, tmp_path, tokens, ok):
    p = _pt_with(pt_int8, tmp_path / "ex.pt", lambda o: o["metadata"].__setitem__("exclude_name_tokens", tokens))
    v = _verdict(p, scheme="int8")
    assert v.ok is ok, v.reasons


def test_require_divisible_and_component(pt_fp8, tmp_path):
    p = _pt_with(pt_fp8, tmp_path / "div.pt", lambda o: o["metadata"].__setitem__("require_divisible", 32))
    v = _verdict(p, scheme="fp8")
    assert not v.ok and any("require_divisible is 32" in r for r in v.reasons)
    p = _pt_with(pt_fp8, tmp_path / "comp.pt", lambda o: o["metadata"].__setitem__("component", "transformer_2"))
    v = _verdict(p, scheme="fp8")
    assert not v.ok and any("component is 'transformer_2'" in r for r in v.reasons)
    assert _verdict(p, scheme="fp8", component="transformer_2").ok


def test_excluded_base_never_gets_the_turbo_file(pt_int8):
    v = _verdict(pt_int8, base_model_id="Tongyi-MAI/Z-Image", family="z-image")
    assert not v.ok and any("listed as excluded for Z-Image" in r for r in v.reasons)
    assert _verdict(pt_int8, base_model_id="Tongyi-MAI/Z-Image-Turbo", family="z-image").ok


def _with_fp8_kwargs(src, dst, **act_changes):
    from torchao.quantization.quantize_.common import KernelPreference
    from torchao.quantization.quantize_.workflows import Float8Tensor

    def edit(o):
        sd = o["state_dict"]
        for k, t in list(sd.items()):
            if isinstance(t, Float8Tensor):
                act = dataclasses.replace(t.act_quant_kwargs, kernel_preference=KernelPreference.AUTO, **act_changes)
                sd[k] = Float8Tensor(t.qdata, t.scale, t.block_size, mm_config=t.mm_config, act_quant_kwargs=act,
                                     kernel_preference=KernelPreference.AUTO, dtype=t.dtype)
    return _pt_with(src, dst, edit)


def test_fp8_kernels_pinned_to_torch_and_activation_floor_supplied(pt_fp8, tmp_path):
    """Unsloth's published fp8 files record AUTO kernels; loaded weights run torchao's TORCH kernels (as load-time
    quantization does) and a missing activation floor is supplied; a different floor is refused."""
    from torchao.quantization.quantize_.common import KernelPreference
    from torchao.quantization.quantize_.workflows import Float8Tensor
    auto = _with_fp8_kwargs(pt_fp8, tmp_path / "auto.pt", hp_value_lb=None)
    raw = formats.read(auto)
    fp8 = [t for t in raw.tensors.values() if isinstance(t, Float8Tensor)]
    assert fp8 and all(t.kernel_preference == KernelPreference.AUTO and t.act_quant_kwargs.hp_value_lb is None
                       for t in fp8)
    o = opening.open_checkpoint(auto, metadata.Request(scheme="fp8"), model_dirs=[str(tmp_path)])
    loaded = [t for t in o.checkpoint.tensors.values() if isinstance(t, Float8Tensor)]
    assert len(loaded) == len(fp8)
    assert all(t.kernel_preference == KernelPreference.TORCH for t in loaded)
    assert all(t.act_quant_kwargs.kernel_preference == KernelPreference.TORCH for t in loaded)
    assert all(t.act_quant_kwargs.hp_value_lb == 1e-12 for t in loaded)
    assert any("1e-12 is supplied" in n for n in o.verdict.notes)
    # the pinned weights are the builder's own (same codes, scales, settings) as quantizing at load time
    ref = formats.read(pt_fp8)
    k = next(k for k, t in ref.tensors.items() if isinstance(t, Float8Tensor))
    a, b = o.checkpoint.tensors[k], ref.tensors[k]
    assert torch.equal(a.qdata.view(torch.uint8), b.qdata.view(torch.uint8)) and torch.equal(a.scale, b.scale)
    assert a.act_quant_kwargs == b.act_quant_kwargs and a.kernel_preference == b.kernel_preference
    other = _with_fp8_kwargs(pt_fp8, tmp_path / "lb.pt", hp_value_lb=1e-6)
    v = _verdict(other, scheme="fp8")
    assert not v.ok and any("activation_value_lb 1e-06" in r for r in v.reasons)


# --- Hub: family-declared names first, excluded bases, the new families -----------------------------------------------

def test_filename_order_declared_names_first(monkeypatch):
    monkeypatch.setenv(hub_names.TWIN_ENV, "0")  # the twins' places: tests/hub/test_comfy_twins.py
    assert sources.filenames("unsloth/Qwen-Image-2.1-FP8", "int8") == (  # the repo's ConvRot build first
        "Qwen-Image-2.1-INT8-ConvRot.safetensors", "Qwen-Image-2.1-INT8.safetensors", "Qwen-Image-2.1-INT8.pt",
        "transformer_int8.pt")
    krea = families.get("krea-2")
    fam = dataclasses.replace(krea, hosting=dataclasses.replace(krea.hosting, files=(
        families.HostedFile("unsloth/Krea-2-Turbo-FP8", "fp8", "krea2_turbo_fp8.safetensors"),)))
    try:
        families.FAMILIES["krea-2"] = fam
        assert sources.filenames("unsloth/Krea-2-Turbo-FP8", "fp8") == (
            "krea2_turbo_fp8.safetensors", "Krea-2-Turbo-FP8.safetensors", "Krea-2-Turbo-FP8.pt", "transformer_fp8.pt")
        assert sources.filenames("unsloth/Krea-2-Turbo-FP8", "int8")[0] == "Krea-2-Turbo-INT8.safetensors"
    finally:
        families.FAMILIES["krea-2"] = dataclasses.replace(fam, hosting=dataclasses.replace(fam.hosting, files=()))


@pytest.mark.parametrize("family,base,repo", [
    ("krea-2", "krea/Krea-2-Turbo", "unsloth/Krea-2-Turbo-FP8"),
    ("qwen-image-2.1", "Qwen/Qwen-Image-2.1", "unsloth/Qwen-Image-2.1-FP8"),
    ("qwen-image-2.1", "Qwen/Qwen-Image-2.1-Turbo", "unsloth/Qwen-Image-2.1-Turbo-FP8"),  # the variant wins first
    ("z-image", "Tongyi-MAI/Z-Image-Turbo", "unsloth/Z-Image-Turbo-FP8"),
    ("z-image", "Tongyi-MAI/Z-Image", None), ("krea-2", "krea/krea-2-raw", None),
    ("hidream-i1", "HiDream-ai/HiDream-I1-Dev", None), ("hidream-i1", "hidream-ai/hidream-i1-fast", None),
    ("hidream-i1", "HiDream-ai/HiDream-I1-Full", "unsloth/HiDream-I1-Full-FP8"),
])
def test_hosted_repo_for_base(family, base, repo):
    p = sources.plan(sources.Wanted(None, None, family, "fp8", base_model_id=base))
    got = [c.repo for c in p]
    if repo is None:
        assert got == [] and any("excluded" in n for n in p.notes), p.notes
        with pytest.raises(HubError) as e:
            sources.hosted_repo(family, base_model_id=base)
        assert "excluded" in str(e.value)
    else:
        assert got == [repo]


def test_new_families_have_presets_and_need_newer_comfyui():
    labels = sources.preset_labels()
    for label in ("Krea-2-Turbo / fp8", "Qwen-Image-2.1 / int8", "Qwen-Image-2.1-Turbo / fp8"):
        assert label in labels
    # Krea 2's class arrived in ComfyUI 0.33.0, which the pack maps into; Qwen-Image 2.1's in 0.38.1, not yet mapped
    assert families.get("krea-2").arch.min_comfy == "0.33.0" and families.get("krea-2").arch.unet_config is not None
    fam = families.get("qwen-image-2.1")
    assert fam.arch.min_comfy == "0.38.1" and fam.arch.unet_config is None
    assert families.get("qwen-image-2.1").comfy_models == ("QwenImage21",)
    assert families.get("krea-2").comfy_models == ("Krea2",)


def test_the_video_families_unsloth_hosts_now(monkeypatch):
    """LTX-2.3 (Unsloth's family ``ltx-2``, its alias ``ltx-2.3``) and MiniMax-H3: presets, Unsloth's names in order,
    the alias wherever a family is named (the registry, a file's ``family``, the command line)."""
    from prequant_core import cli
    from prequant_core.load import metadata
    monkeypatch.delenv(hub_names.TWIN_ENV, raising=False)
    labels = sources.preset_labels()
    assert {"LTX-2.3 / fp8", "MiniMax-H3 / int8", "MiniMax-H3 / fp8"} <= set(labels)
    assert "LTX-2.3 / int8" not in labels  # fp8 only
    assert sources.filenames("unsloth/LTX-2.3-FP8", "fp8") == ("LTX-2.3-FP8.safetensors", "LTX-2.3-FP8.pt",
                                                               "transformer_fp8.pt")  # a video family: no twin
    assert sources.filenames("unsloth/MiniMax-H3-FP8", "int8")[0] == "MiniMax-H3-INT8-ConvRot.pt"
    assert sources.filenames("unsloth/MiniMax-H3-FP8", "fp8")[:2] == ("MiniMax-H3-FP8.safetensors", "MiniMax-H3-FP8.pt")
    assert families.get("LTX-2.3") is families.get("ltx-2") and families.canonical(" ltx-2.3 ") == "ltx-2"
    # both map into ComfyUI 0.33.0's classes (LTXAV with its text connectors from their own file; MiniMaxH3)
    ltx, h3 = families.get("ltx-2"), families.get("minimax-h3")
    assert ltx.arch.min_comfy == "0.33.0" and ltx.arch.unet_config is not None and ltx.arch.companion is not None
    assert h3.arch.min_comfy == "0.33.0" and h3.arch.unet_config is not None and h3.arch.companion is None
    for fam in (ltx, h3):
        assert fam.hosting.video
    assert families.get("ltx-2").arch.int8_exclude_extra == ("audio", "av_cross_attn", "adaln")
    assert families.get("minimax-h3").arch.int8_exclude_extra == ("adaln_proj",)
    # a file recording the alias is the family asked for, and the other way round; another family is not
    from prequant_core.formats.checkpoint import Checkpoint
    w = schemes.quantize_weight(torch.randn(512, 512).to(torch.bfloat16), "fp8")
    fam = families.get("ltx-2")

    def family_reasons(recorded, asked):
        ck = Checkpoint("/x/LTX-2.3-FP8.pt", "pt", FORMAT_V1, {"family": recorded, "scheme": "fp8",
                        "base_model_id": "Lightricks/LTX-2.3", "fp8_granularity": "per_row"},
                        {"transformer_blocks.0.attn1.to_q.weight": w})
        return [r for r in metadata.validate(ck, metadata.Request(family=asked), family=fam).reasons
                if r.startswith("family")]
    assert family_reasons("ltx-2.3", "ltx-2") == [] and family_reasons("ltx-2", "LTX-2.3") == []
    assert family_reasons("ltx-2", "minimax-h3") == ["family is 'ltx-2', requested 'minimax-h3'"]
    args = cli.parser().parse_args(["verify", "f.pt", "--base", "Lightricks/LTX-2.3", "--scheme", "fp8",
                                    "--family", "ltx-2.3"])
    assert args.family == "ltx-2.3"
