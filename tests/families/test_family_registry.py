"""The family registry: a family is one module. Every fact about a model family (its architecture and its hosting) is
read from its ``Family`` record, so a family added as one module (tests/toy/toy_family.py) plus its name in
``families.MODULES`` is named, detected, given its Hub repos and file names, built, validated, described by Info,
judged by the encoder and NVFP4 policy checks and offered by the command line; without the line it is unknown. No
table or ``if`` keyed by a family lives outside its module, and docs/DEVELOPING.md's recipe lists (and this file
counts) the files adding a family touches. Runs in the core tier (no ComfyUI)."""
from __future__ import annotations

import ast
import os
import re
import types

import pytest
import torch

from conftest import ROOT
from prequant_core import builder, families, formats, report
from prequant_core.cli import choices
from prequant_core.errors import HubError, UnknownFamilyError
from prequant_core.formats import layer_policy
from prequant_core.load import metadata, sources
from prequant_core.text_encoders import checks as encoder_checks, sources as encoder_sources

TOY = "toy.toy_family"
BASE = "toy-org/Toy-DiT"


@pytest.fixture
def with_toy(monkeypatch):
    """The one registry line: the toy module's name in ``families.MODULES`` (the registry loaded from it)."""
    modules = (*families.MODULES, TOY)
    monkeypatch.setattr(families, "MODULES", modules)
    monkeypatch.setattr(families, "FAMILIES", families.load(modules))


def _dense():
    g = torch.Generator().manual_seed(0)
    return {"toy_in.weight": (torch.randn(64, 32, generator=g) / 8).to(torch.bfloat16),
            "toy_blocks.0.attn.to_q.weight": (torch.randn(64, 64, generator=g) / 8).to(torch.bfloat16),
            "toy_blocks.0.norm.weight": torch.ones(64, dtype=torch.bfloat16)}


def _shapes(sd):
    return {k: tuple(v.shape) for k, v in sd.items()}


def _policy(pid):
    """A v3 file's metadata naming policy ``pid`` (the policy notes read nothing else)."""
    return types.SimpleNamespace(tensors={}, container="safetensors", metadata={
        "family": "toy-dit", "base_model_id": BASE, "nvfp4_policy": {
            "kind": "unsloth_nvfp4_layer_policy_v1", "policy_id": pid, "policy_version": 1,
            "counts": {"nvfp4": 8, "fp8": 4, "bf16": 1}}})


def test_a_family_is_unknown_without_its_registry_line():
    with pytest.raises(UnknownFamilyError):
        families.get("toy-dit")
    with pytest.raises(UnknownFamilyError):
        families.detect(list(_dense()))
    assert families.hosted_schemes("unsloth/Toy-DiT-FP8") == ("fp8", "int8")  # the suffix's guess
    assert families.declared_filenames("unsloth/Toy-DiT-FP8", "int8") == ()
    assert not encoder_checks.same_base(BASE, "Tongyi-MAI/Z-Image-Turbo")
    assert layer_policy.policy_notes(_policy("toy_r8_v1"))  # not one of the policies this pack knows
    assert "toydit-1" not in choices.accepted_families()


def test_a_new_family_is_one_module_and_one_line(tmp_path, with_toy):
    toy = families.get("toy-dit")
    # named: its name and alias everywhere a family is named
    assert families.get(" ToyDiT-1 ") is toy and families.canonical("toydit-1") == "toy-dit"
    assert "toy-dit" in choices.families() and "toydit-1" in choices.accepted_families()
    assert "toy-dit" in choices.encoder_families()

    # detected from its keys in either layout, and from the class a file records; its config from the shapes
    dense = _dense()
    assert families.detect(list(dense)) == (toy, "diffusers")
    comfy_keys = ["toy_in.weight", "toy_blocks.0.attn.qkv.weight"]
    assert families.detect(comfy_keys) == (toy, "comfyui")
    assert families.detect(list(dense), {"transformer_class": "ToyDiTTransformer2DModel"})[0] is toy
    assert toy.config_from_shapes(_shapes(dense)) == {"image_model": "toy", "dim": 64, "in_channels": 32,
                                                      "depth": 1}
    # a ComfyUI parameter default is data the ComfyUI side applies (nodes/comfy_model.complete_for_this_comfyui)
    (param,) = toy.arch.comfy_params
    assert (param.module, param.params, param.field) == (TOY, "ToyParams", "toy_axes")
    assert param.value(toy.config_from_shapes(_shapes(dense))) == [64]

    # hosted: the schemes its table says (not the suffix's), its declared name after the ConvRot build, no ComfyUI
    # twin (a video model), its repo picked by scheme, its excluded base refused
    assert families.hosted_schemes("unsloth/Toy-DiT-FP8") == ("int8",)
    assert sources.filenames("unsloth/Toy-DiT-FP8", "int8")[:3] == (
        "Toy-DiT-INT8-ConvRot.safetensors", "toy_dit_int8.safetensors", "Toy-DiT-INT8.safetensors")
    assert not any("-ComfyUI" in n for n in sources.filenames("unsloth/Toy-DiT-FP8", "int8"))
    assert sources.hosted_repo("toy-dit", scheme="nvfp4") == "unsloth/Toy-DiT-NVFP4"
    assert sources.plan(sources.Wanted(None, None, "toy-dit", "int8")).candidates[0].repo == "unsloth/Toy-DiT-FP8"
    with pytest.raises(HubError, match="excluded"):
        sources.hosted_repo("toy-dit", scheme="int8", base_model_id="Toy-Org/Toy-DiT-Raw")

    # its text encoder: hosted under its repo, and one file with Z-Image's (the same Qwen3-4B bytes)
    assert encoder_checks.hosted_for("toy-dit").repo == "unsloth/Toy-DiT-FP8"
    assert encoder_sources.filenames("unsloth/Toy-DiT-FP8", "text_encoder")[0] == \
        "Toy-DiT-text_encoder-FP8.safetensors"
    assert encoder_checks.same_base(BASE, "Tongyi-MAI/Z-Image-Turbo")
    assert not encoder_checks.same_base(BASE, "Qwen/Qwen-Image")

    # its NVFP4 layer policy: one the policy check knows (no "not published" note), and the one it replaced
    assert families.nvfp4_policies()["toy_r8_v1"].family == "toy-dit"
    assert families.retired_nvfp4_policies()["toy_old_v1"] == "toy_r8_v1"
    assert layer_policy.policy_notes(_policy("toy_r8_v1")) == []

    # built (its int8 exclusions), read back, judged against its bases and described by Info
    path = builder.build_from_tensors(dense, builder.Target(str(tmp_path / "Toy-DiT-INT8.safetensors")),
                                      builder.Recipe("int8", family=toy, base_model_id=BASE, min_features=32))
    ck = formats.read(path)
    assert ck.metadata["family"] == "toy-dit" and ck.metadata["transformer_class"] == "ToyDiTTransformer2DModel"
    assert "toy_in" in ck.metadata["exclude_name_tokens"]
    assert metadata.validate(ck, metadata.Request(scheme="int8", base_model_id=BASE), family=toy).ok
    v = metadata.validate(ck, metadata.Request(scheme="int8", base_model_id="toy-org/Toy-DiT-Raw"), family=toy)
    assert not v.ok and any("excluded" in r for r in v.reasons)
    r = report.info(path)
    assert r.valid and r.family == "toy-dit"


# --- no family fact outside its module ------------------------------------------------------------------------------

def _facts(fam) -> set:
    """The strings that name something of this family only: names, classes, repos, bases, file names, policy ids,
    and the ComfyUI parameters its records default."""
    a, h = fam.arch, fam.hosting
    out = {fam.name, *fam.aliases, a.diffusers_class, *fam.comfy_models, *h.base_repos, *h.hosted, *h.excluded_bases,
           *h.convrot_repos, *(f.filename for f in h.files), *(b for bs in h.shared_encoders.values() for b in bs)}
    out |= {x for p in h.nvfp4_policies for x in (p.policy_id, *p.replaces)}
    out |= {x for p in a.comfy_params for x in (p.module, p.params, p.field)}
    if isinstance(a.comfy_key_map, str):
        out.add(a.comfy_key_map)
    return {s.lower() for s in out}


def _shipped_literals() -> dict[str, set]:
    """{file: its string constants, lower-case} for the shipped Python outside the family modules themselves."""
    fam_modules = {os.path.join("prequant_core", "families", m + ".py") for m in families.MODULES}
    out = {}
    for top in ("prequant_core", "nodes"):
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                rel = os.path.relpath(os.path.join(d, f), ROOT)
                if f.endswith(".py") and rel not in fam_modules:
                    with open(os.path.join(ROOT, rel), encoding="utf-8") as fh:
                        tree = ast.parse(fh.read())
                    out[rel] = {n.value.lower() for n in ast.walk(tree)
                                if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    return out


def test_no_family_fact_lives_outside_its_module():
    """Before issue 59 step 4: Unsloth's NVFP4 policies (formats/layer_policy.py), the bases sharing encoder bytes
    (text_encoders/checks.py), the aliases (families/__init__.py) and HunyuanVideo's / FLUX's ComfyUI parameters
    (nodes/comfy_model.py) were tables or ifs keyed by family elsewhere."""
    literals = _shipped_literals()
    assert len(literals) > 50
    # the one line a family has outside its module: its module's name in MODULES (flux2, krea2, ... spell some
    # ComfyUI class names too)
    literals[os.path.join("prequant_core", "families", "__init__.py")] -= set(families.MODULES)
    found = {f"{fam.name}: {path}": sorted(_facts(fam) & lits)
             for fam in families.FAMILIES.values() for path, lits in literals.items() if _facts(fam) & lits}
    assert found == {}


def test_the_recipe_counts_the_files_a_family_touches():
    """docs/DEVELOPING.md lists them; the shipped code is two of them (the module, its line in MODULES), the rest are
    what the family's tests ask for, each checked here for every registered family."""
    with open(os.path.join(ROOT, "docs", "DEVELOPING.md"), encoding="utf-8") as f:
        text = " ".join(f.read().split())
    recipe = re.search(r"Adding a family touches (\d+) files: (.*?)\.(?: |$)", text)
    assert recipe, "docs/DEVELOPING.md has no 'Adding a family touches N files: ...' recipe"
    items = re.findall(r"\((\d+)\) (\S+?)[,:;]", recipe.group(2))
    assert [int(n) for n, _ in items] == list(range(1, int(recipe.group(1)) + 1))
    assert [p for _, p in items] == [
        "prequant_core/families/<family>.py", "prequant_core/families/__init__.py", "tools/tiny_families.py",
        "tests/unsloth_builder.py", "example_workflows/<name>.json", "example_workflows/<name>.jpg", "README.md"]
    for _, p in items:
        assert os.path.exists(os.path.join(ROOT, p.split("<")[0])), p

    # (1) + (2): every family's module is listed once and defines it
    import importlib
    for m in families.MODULES:
        assert families.MODULES.count(m) == 1 and os.path.isfile(os.path.join(ROOT, "prequant_core", "families",
                                                                              m + ".py"))
    defined = [f.name for m in families.MODULES
               for f in importlib.import_module(f"prequant_core.families.{m}").FAMILIES]
    assert defined == list(families.FAMILIES)
    # (3) its tiny model (Z-Image's is tests/nodes/test_loader.py's), (4) Unsloth's table in the conformance corpus
    from tools import tiny_families as tf
    import unsloth_builder as ub
    assert set(tf.TINY) | set(tf.DIFFUSERS_ONLY) | {"z-image"} == set(families.FAMILIES) == set(ub.FAMILIES)
    # (5) + (6) a workflow and its card for each family a tested ComfyUI runs
    folder = os.path.join(ROOT, "example_workflows")
    workflows = {}
    for n in os.listdir(folder):
        if n.endswith(".json"):
            with open(os.path.join(folder, n), encoding="utf-8") as f:
                workflows[n[:-5]] = f.read()
            assert os.path.isfile(os.path.join(folder, n[:-5] + ".jpg")), n
    for fam in families.FAMILIES.values():
        has = any(f'"{fam.name}"' in w for w in workflows.values())
        if fam.arch.unet_config is not None:
            assert has, fam.name
    # (7) its rows in the README's tables
    from tools import families_table
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        block = families_table.readme_block(f.read())
    assert all(f"| {fam.title} |" in block for fam in families.FAMILIES.values())


# --- the tables the registry reads from the family records: as they were ----------------------------------------------

def test_the_tables_read_from_the_family_records_are_unchanged():
    """The per-family tables that lived elsewhere, as they were before they moved into the family modules."""
    assert families.aliases() == {"ltx-2.3": "ltx-2"}
    assert set(families.encoder_groups()) == {
        frozenset({"qwen/qwen-image", "qwen/qwen-image-2512", "hunyuanvideo-community/hunyuanimage-2.1-diffusers"}),
        frozenset({"krea/krea-2-turbo", "krea/krea-2-raw"}),
        frozenset({"black-forest-labs/flux.1-schnell", "black-forest-labs/flux.1-dev",
                   "black-forest-labs/flux.1-krea-dev", "hidream-ai/hidream-i1-full"}),
        frozenset({"tongyi-mai/z-image-turbo", "tongyi-mai/z-image"})}
    assert {k: (p.version, p.family, p.base, p.counts, p.repo) for k, p in families.nvfp4_policies().items()} == {
        "zimg_rg76_v1": (1, "z-image", "tongyi-mai/z-image-turbo", {"nvfp4": 76, "fp8": 195, "bf16": 5},
                         "unsloth/Z-Image-Turbo-NVFP4"),
        "flux_r420_v1": (1, "flux.1", "black-forest-labs/flux.1-schnell", {"nvfp4": 187, "fp8": 312, "bf16": 3},
                         "unsloth/FLUX.1-schnell-NVFP4"),
        "qwen21_r020_v1": (1, "qwen-image-2.1", "qwen/qwen-image-2.1", {"nvfp4": 48, "fp8": 181, "bf16": 3},
                           "unsloth/Qwen-Image-2.1-NVFP4"),
        "qwen2512_m120_attn8_v1": (1, "qwen-image", "qwen/qwen-image-2512", {"nvfp4": 600, "fp8": 243, "bf16": 3},
                                   "unsloth/Qwen-Image-2512-NVFP4"),
        "qwen_p02_v1": (1, "qwen-image", "qwen/qwen-image", {"nvfp4": 120, "fp8": 723, "bf16": 3},
                        "unsloth/Qwen-Image-FP8")}
    # within a family, Unsloth's order (the first policy for a base wins)
    assert [p for p in families.nvfp4_policies() if p.startswith("qwen2512") or p.startswith("qwen_p")] == [
        "qwen2512_m120_attn8_v1", "qwen_p02_v1"]
    assert families.retired_nvfp4_policies() == {"zimg_f8mod_toq34_v1": "zimg_rg76_v1",
                                                 "flux_mod_single_v1": "flux_r420_v1"}
    # the three file-name tables, now one: each name as it was
    declared = families.declared_filenames
    assert declared("unsloth/Qwen-Image-2.1-FP8", "fp8") == ("Qwen-Image-2.1-FP8.safetensors",)
    assert declared("unsloth/Qwen-Image-2.1-FP8", "int8") == ("Qwen-Image-2.1-INT8.safetensors",)
    assert declared("unsloth/Qwen-Image-2.1-FP8", "nvfp4") == ()
    assert declared("unsloth/MiniMax-H3-FP8", "int8") == ("MiniMax-H3-INT8-ConvRot.pt",)
    assert declared("unsloth/Wan2.2-TI2V-5B-NVFP4", "nvfp4") == ("Wan2.2-TI2V-5B-NVFP4.pt",)
    assert declared("unsloth/Wan2.2-T2V-A14B-NVFP4", "nvfp4") == ("Wan2.2-T2V-A14B-NVFP4.pt",)
    assert declared("unsloth/Wan2.2-T2V-A14B-NVFP4", "nvfp4", "transformer_2") == (
        "Wan2.2-T2V-A14B-transformer_2-NVFP4.pt",)
    hy = "unsloth/HunyuanVideo-1.5-NVFP4"
    assert declared(hy, "nvfp4") == ("HunyuanVideo-1.5-Diffusers-480p_t2v-NVFP4.pt",
                                     "HunyuanVideo-1.5-Diffusers-720p_t2v-NVFP4.pt")
    assert declared(hy, "nvfp4", base_model_id="HunyuanVideo-1.5-Diffusers-720p_t2v") == (
        "HunyuanVideo-1.5-Diffusers-720p_t2v-NVFP4.pt",)
    assert declared(hy, "nvfp4", "transformer_2") == () and declared(hy, "fp8") == ()
    assert declared("UNSLOTH/minimax-h3-fp8", "int8") == ("MiniMax-H3-INT8-ConvRot.pt",)  # repo ids: any case


def test_families_sharing_names_are_told_apart_by_shapes_and_unreadable_shapes_fall_back_to_the_first():
    """Wan 2.2 TI2V-5B and T2V-A14B share every tensor name; the patch embedding's input channels tell them apart
    (48 / 16). Shapes the test cannot read (the tensor missing, or of another rank) pick neither by shape: the first
    family with those names is taken, as without shapes, never an exception."""
    keys = ["condition_embedder.time_proj.weight", "blocks.0.attn1.to_q.weight", "patch_embedding.weight"]
    def pick(shapes):
        fam, layout = families.detect(keys, shapes=shapes)
        return fam.name, layout
    assert pick({"patch_embedding.weight": (3072, 48, 1, 2, 2)}) == ("wan2.2-ti2v-5b", "diffusers")
    assert pick({"patch_embedding.weight": (5120, 16, 1, 2, 2)}) == ("wan2.2-t2v-a14b", "diffusers")
    first = pick(None)
    assert first[0] in ("wan2.2-ti2v-5b", "wan2.2-t2v-a14b")
    assert pick({"patch_embedding.weight": (5120,)}) == first  # IndexError inside the test
    assert pick({"blocks.0.attn1.to_q.weight": (64, 64)}) == first  # KeyError inside the test
