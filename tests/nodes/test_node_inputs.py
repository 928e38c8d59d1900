"""What ComfyUI asks the nodes before it runs them (issue 61: node lines no test ran), each through the node class
ComfyUI calls: IS_CHANGED (when ComfyUI re-runs a node instead of reusing its cached output), VALIDATE_INPUTS (a
linked or malformed checkpoint input), the Build node's output name for a ComfyUI-native file, the text encoder's
summary line, and the version rule that refuses a family on an older ComfyUI."""
from __future__ import annotations

import os

import pytest

from prequant_core.errors import BuildError


def _touch(path, data=b"x"):
    with open(path, "wb") as f:
        f.write(data)


def test_a_typed_path_that_appears_later_makes_every_loader_run_again(comfy, tmp_path):
    """A loader whose typed file is missing fails; when the user then puts the file there, ComfyUI must run the node
    again instead of serving the cached failure: IS_CHANGED names the path alone, then the path with its mtime and
    size, and a rewrite of the file changes it again."""
    _, pack = comfy
    missing = str(tmp_path / "later.safetensors")
    changed = {
        "transformer": lambda: pack.nodes.load_node.PrequantLoadTransformer.IS_CHANGED("(none)", path=missing),
        "info": lambda: pack.nodes.info_node.PrequantInfo.IS_CHANGED("(none)", path=missing),
        "text encoder": lambda: pack.nodes.te_node.PrequantLoadTextEncoder.IS_CHANGED("(none)", path=missing),
    }
    before = {k: f() for k, f in changed.items()}
    assert all(v.startswith(missing) for v in before.values()), before
    _touch(missing)
    after = {k: f() for k, f in changed.items()}
    for k in changed:
        assert after[k] != before[k] and str(os.path.getsize(missing)) in after[k], (k, after[k])
    _touch(missing, b"longer file")
    assert all(f() != after[k] for k, f in changed.items())


def test_the_build_node_reruns_when_its_dense_file_changes_and_not_without_one(comfy, models_dir):
    _, pack = comfy
    build = pack.nodes.build_node.PrequantBuildCheckpoint
    assert build.IS_CHANGED(pack.nodes.build_node.NO_FILE) == "" and build.IS_CHANGED() == ""
    folder = os.path.join(models_dir, "diffusion_models")
    os.makedirs(folder, exist_ok=True)
    dense = os.path.join(folder, "node-inputs-dense.safetensors")
    _touch(dense)
    first = build.IS_CHANGED("node-inputs-dense.safetensors")
    assert first.startswith(dense + ":")
    _touch(dense, b"rewritten")
    assert build.IS_CHANGED("node-inputs-dense.safetensors") not in (first, "")
    # a name ComfyUI does not list: no stat to take, the same answer each time (the load itself says what is wrong)
    gone = build.IS_CHANGED("not-listed.safetensors")
    assert gone == build.IS_CHANGED("not-listed.safetensors") and gone != ""


def test_a_linked_or_malformed_checkpoint_input_is_judged_where_it_belongs(comfy):
    _, pack = comfy
    loader = pack.nodes.load_node.PrequantLoadTransformer
    assert loader.VALIDATE_INPUTS(None) is True  # linked from another node: judged when it runs
    said = loader.VALIDATE_INPUTS(5)
    assert said is not True and "file name" in said and "int" in said


def test_a_comfyui_native_build_is_a_safetensors_file(comfy):
    _, pack = comfy
    check = pack.nodes.build_node.check_filename
    with pytest.raises(BuildError, match="ComfyUI-native file is a .safetensors") as e:
        check("mine.pt", "comfyui-native", "Tongyi-MAI/Z-Image-Turbo", "int8")
    assert e.value.found == "mine.pt" and e.value.expected == ".safetensors"
    assert check("mine", "comfyui-native", "Tongyi-MAI/Z-Image-Turbo", "int8") == "mine.safetensors"


def test_the_text_encoders_line_says_where_the_file_came_from_and_its_notes(comfy):
    _, pack = comfy
    s = {"encoder": "Qwen3-4B", "family": "z-image", "component": "text_encoder", "file": "te.safetensors",
         "container": "safetensors", "fp8_tensors": 252, "size_bytes": 2 << 30, "dense_bytes": 4 << 30,
         "tokenizer": "ComfyUI's own", "location": "/m/te.safetensors"}
    plain = pack.nodes.te_node.summary_text(s)
    assert "downloaded" not in plain and "Note:" not in plain
    fetched = pack.nodes.te_node.summary_text({**s, "source": "hub:unsloth/Z-Image-Turbo-FP8@main", "downloaded": True,
                                               "notes": ["read as fp8"]})
    assert fetched.startswith(plain) and "(downloaded from unsloth/Z-Image-Turbo-FP8@main)" in fetched
    assert fetched.endswith(" Note: read as fp8")
    again = pack.nodes.te_node.summary_text({**s, "source": "hub:unsloth/Z-Image-Turbo-FP8@main"})
    assert "(earlier download from unsloth/Z-Image-Turbo-FP8@main)" in again


def test_an_unknown_comfyui_version_is_never_refused_for_being_old(comfy):
    """A ComfyUI whose version cannot be read (a repackaging without comfyui_version) is not called older than the
    one a family needs: its class lookup decides instead."""
    _, pack = comfy
    older = pack.nodes.comfy_model._older_than
    assert older("0.12.1", "0.33.0") and not older("0.33.0", "0.33.0") and not older("v0.38.1", "0.33.0")
    assert not older("unknown", "0.33.0") and not older("0.33.0", "next")
