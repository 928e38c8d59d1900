"""What a ComfyUI user reads before any code: every node has its help page (``web/docs/<Node>.md``, shown by
ComfyUI's node help panel) mentioning every input and output, and the descriptions name what the registries hold
(schemes, families, containers), so they cannot go stale."""
from __future__ import annotations

import os
import re

from conftest import ROOT


def _pack_nodes(comfy):
    _, pack = comfy
    return pack.NODE_CLASS_MAPPINGS


def test_every_node_has_a_help_page_naming_every_input_and_output(comfy):
    for name, cls in _pack_nodes(comfy).items():
        page = os.path.join(ROOT, "web", "docs", f"{name}.md")
        assert os.path.isfile(page), f"{name} has no help page at web/docs/{name}.md"
        text = open(page, encoding="utf-8").read()
        spec = cls.INPUT_TYPES()
        inputs = [k for part in ("required", "optional") for k in spec.get(part, {})]
        missing = [k for k in inputs if f"`{k}`" not in text]
        assert not missing, f"web/docs/{name}.md does not explain {missing}"
        for out in getattr(cls, "RETURN_NAMES", ()):
            assert f"`{out}`" in text, f"web/docs/{name}.md does not explain its output {out}"
        for img in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
            assert os.path.isfile(os.path.join(ROOT, "web", "docs", img)), f"{name}: picture {img} is missing"


def test_descriptions_name_what_the_registries_hold(comfy):
    from prequant_core import families
    from prequant_core.formats import comfy_layout
    nodes = _pack_nodes(comfy)
    loader = nodes["PrequantLoadTransformer"].DESCRIPTION
    for s in ("int8", "fp8", "nvfp4", "mxfp8"):
        assert s in loader and s in nodes["PrequantBuildCheckpoint"].DESCRIPTION and s in nodes["PrequantInfo"].DESCRIPTION
    for fam in families.FAMILIES.values():
        assert fam.title in loader, fam.title
    for fmt in comfy_layout.formats():
        assert fmt in loader
    assert "comfyui-native" in nodes["PrequantBuildCheckpoint"].DESCRIPTION


def test_prequant_files_of_every_scheme_are_listed_from_both_model_folders(comfy, tmp_path):
    """The loader lists pre-quantized files from models/prequant and from models/diffusion_models: a .pt by its
    name (one token per scheme of the registry: -int8, -fp8, -nvfp4, -mxfp8), a .safetensors by its header (an Unsloth
    container or ComfyUI's own quantized layout); a dense file is a dense-fallback candidate instead."""
    import folder_paths
    import torch
    from safetensors.torch import save_file
    _, pack = comfy
    paths = pack.nodes.paths
    dm = folder_paths.get_folder_paths("diffusion_models")[0]
    made = []
    for name in ("Thing-NVFP4.pt", "Thing-MXFP8.pt", "thing_int8.pt"):
        p = os.path.join(dm, "listing", name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        torch.save({}, p)
        made.append(p)
    native = os.path.join(dm, "listing", "native.safetensors")
    save_file({"l.weight": torch.zeros(4, 4, dtype=torch.float8_e4m3fn), "l.weight_scale": torch.ones(()),
               "l.comfy_quant": torch.tensor(list(b'{"format": "float8_e4m3fn"}'), dtype=torch.uint8)}, native)
    dense = os.path.join(dm, "listing", "dense.safetensors")
    save_file({"l.weight": torch.zeros(4, 4)}, dense)
    made += [native, dense]
    try:
        listed = paths.choices()
        for name in ("Thing-NVFP4.pt", "Thing-MXFP8.pt", "thing_int8.pt", "native.safetensors"):
            assert f"diffusion_models/listing/{name}" in listed, (name, listed)
        assert "diffusion_models/listing/dense.safetensors" not in listed
        assert "listing/dense.safetensors" in paths.dense_choices()
    finally:
        for p in made:
            os.remove(p)


def test_a_registered_scheme_is_listed_and_offered_by_the_nodes(comfy, monkeypatch):
    """A scheme added with one registry line (tests/toy/toy_scheme.py) is listed from both model folders and offered
    by every node's scheme input; without the line its .pt in models/diffusion_models is not listed."""
    import folder_paths
    import torch
    from prequant_core.schemes import registry
    from toy import toy_scheme
    _, pack = comfy
    paths = pack.nodes.paths
    made = []
    for folder in ("prequant", "diffusion_models"):
        p = os.path.join(folder_paths.get_folder_paths(folder)[0], "toyscheme", "Thing-Q8TOY.pt")
        os.makedirs(os.path.dirname(p), exist_ok=True)
        torch.save({}, p)
        made.append(p)
    try:
        # models/prequant lists every checkpoint; models/diffusion_models a .pt only when its name has a scheme token
        assert [c for c in paths.choices() if "Thing-Q8TOY" in c] == ["toyscheme/Thing-Q8TOY.pt"]
        monkeypatch.setattr(registry, "SCHEMES", (*registry.SCHEMES, toy_scheme.SCHEME))
        listed = [c for c in paths.choices() if "Thing-Q8TOY" in c]
        assert len(listed) == 2 and any(c.startswith("diffusion_models/") for c in listed), listed
        for name in ("PrequantLoadTransformer", "PrequantBuildCheckpoint", "PrequantInfo"):
            spec = pack.NODE_CLASS_MAPPINGS[name].INPUT_TYPES()
            offered = {**spec["required"], **spec.get("optional", {})}["scheme"][0]
            assert "q8toy" in offered, name
    finally:
        for p in made:
            os.remove(p)
