"""The text-encoder builder (prequant_core/builder/text_encoder.py) on the inputs and requests it must refuse or pass
over: a family with no hosted encoder or a component it does not host (the command line, in a fresh process), a
family whose hosted encoder this pack does not build, an encoder no family hosts given under a family's name, a tensor
that is not a dense float (ComfyUI's fp8 T5 file, no scales), ComfyUI's tokenizer entry inside an encoder file,
and an entry that is neither a weight nor a bias. Every refusal writes nothing (and names the input once it is
read); every build is compared with Unsloth's builder restated (tests/unsloth_te_builder.py), tensor by tensor.
Tiny encoders of the real transformers classes; core tier (no ComfyUI)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

import unsloth_te_builder as te_builder
from conftest import ROOT
from prequant_core.builder import text_encoder
from prequant_core.builder.recipe import Target
from prequant_core.errors import BuildError
from prequant_core.families import encoders
from tools import tiny_assets


def _save(path, sd: dict) -> str:
    from safetensors.torch import save_file
    save_file({k: v.contiguous().clone() for k, v in sd.items()}, str(path))
    return str(path)


def _dense(tmp_path, te_class="Qwen3ForCausalLM", name="dense.safetensors", extra=None) -> str:
    """A dense encoder file in the transformers class's names (the tiny real class, bf16)."""
    return _save(tmp_path / name, {**te_builder.state_dict(te_builder.encoder(te_class)), **(extra or {})})


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and (torch.equal(a.view(torch.uint8), b.view(torch.uint8)) if a.element_size() == 1
                                   else torch.equal(a, b))


def _read(path: str) -> dict:
    from safetensors.torch import load_file
    return load_file(path)


# --- which encoder a family hosts -------------------------------------------------------------------------------------

def test_a_family_without_a_hosted_text_encoder_is_refused_before_the_input_is_opened(tmp_path):
    out = tmp_path / "out.safetensors"
    with pytest.raises(BuildError) as e:
        text_encoder.build_text_encoder(str(tmp_path / "not-there.safetensors"), Target(str(out)),
                                        family="flux.2-klein")
    assert e.value.message == "FLUX.2 [klein] has no hosted text encoder."
    assert e.value.expected == "a family with one" and e.value.found == "None" and not out.exists()


def test_a_component_the_family_does_not_host_is_refused_naming_the_ones_it_does(tmp_path):
    """From the command line, in a fresh process: z-image hosts its text_encoder only."""
    dense = _dense(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    p = subprocess.run([sys.executable, "-m", "prequant_core", "build-text-encoder", "-i", dense, "--family",
                        "z-image", "--component", "text_encoder_2", "-o", str(out / "te.safetensors"), "-q"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stdout + p.stderr[-2000:]
    assert "Z-Image has no hosted text encoder named text_encoder_2." in p.stderr, p.stderr[-2000:]
    assert "Expected: text_encoder" in p.stderr and "Found: text_encoder_2" in p.stderr, p.stderr[-2000:]
    assert os.listdir(out) == []


@pytest.mark.parametrize("family,title,kind", [("flux.2-dev", "FLUX.2 [dev]", "Mistral-Small-24B"),
                                               ("krea-2", "Krea 2", "Qwen3-VL")])
def test_a_family_whose_hosted_fp8_encoder_this_pack_does_not_build_is_refused_with_nothing_written(tmp_path, family,
                                                                                                   title, kind):
    dense = _dense(tmp_path)
    out = tmp_path / "out.safetensors"
    with pytest.raises(BuildError) as e:
        text_encoder.build_text_encoder(dense, Target(str(out)), family=family)
    assert e.value.message.startswith(f"{title}'s text_encoder is a {kind}, which this pack does not build yet")
    assert e.value.message.endswith("nothing was written.") and e.value.path == dense
    assert e.value.found == f"{family}: {kind}" and not out.exists()
    assert encoders.for_class("Qwen3ForCausalLM").hostable  # the input is not at fault: the family's encoder is


# --- what the input holds ---------------------------------------------------------------------------------------------

def test_an_encoder_no_family_hosts_is_refused_without_naming_a_family_for_it(tmp_path):
    """LTX-2's Gemma 3 given as Z-Image's encoder: refused as another encoder, and since no family hosts a Gemma 3
    there is no family to point to (a Qwen3 given as HiDream's Llama is pointed to z-image)."""
    gemma3 = encoders.for_class("Gemma3ForConditionalGeneration")
    assert text_encoder.family_for_kind(gemma3) is None
    assert text_encoder.family_for_kind(encoders.for_class("Qwen3ForCausalLM")) == "z-image"
    dense = _dense(tmp_path, "Gemma3ForConditionalGeneration")
    out = tmp_path / "out.safetensors"
    with pytest.raises(BuildError) as e:
        text_encoder.build_text_encoder(dense, Target(str(out)), family="z-image")
    assert e.value.message == "The input is not a Qwen3-4B, which is Z-Image's text_encoder; nothing was written."
    assert e.value.found.startswith("a Gemma3-12B: ") and e.value.path == dense
    assert e.value.fix == "Pick the family whose encoder it is, or give this family's own encoder."
    assert not out.exists()


def test_comfyuis_fp8_t5_file_is_refused_as_not_dense_naming_a_float8_tensor(tmp_path):
    """ComfyUI's ``t5xxl_fp8_e4m3fn.safetensors`` form: T5's Linear weights stored as float8_e4m3fn with no scale and
    no pre-cast record. It reads as a plain file, and the builder, which casts from bf16 as Unsloth's does, refuses
    it by the first float8 tensor's name, with nothing written."""
    sd = te_builder.state_dict(te_builder.cast_layerwise(te_builder.encoder("T5EncoderModel")))
    sd.pop("encoder.embed_tokens.weight")  # ComfyUI's T5 files hold the embedding once, as shared.weight
    fp8_file = _save(tmp_path / "t5xxl_fp8_e4m3fn.safetensors", sd)
    out = tmp_path / "out.safetensors"
    with pytest.raises(BuildError) as e:
        text_encoder.build_text_encoder(fp8_file, Target(str(out)), family="flux.1")
    m = re.fullmatch(r"Tensor '(.+)' is float8_e4m3fn: the input must be a dense \(bf16 / fp16 / fp32\) encoder\.",
                     e.value.message)
    assert m, e.value.message
    assert sd[m.group(1)].dtype == torch.float8_e4m3fn
    assert e.value.path == fp8_file and e.value.fix == "Use the dense encoder file." and not out.exists()


def test_comfyuis_gemma_file_with_its_tokenizer_entry_builds_what_unsloths_builder_writes(tmp_path):
    """ComfyUI's gemma_2_2b files carry the tokenizer as a ``spiece_model`` uint8 tensor: it is no weight of the
    encoder, passed over (a uint8 tensor is otherwise refused as not dense), and the build is Unsloth's cast of the
    encoder bit for bit."""
    model = te_builder.encoder("Gemma2Model")
    sd = {("model." + k): v for k, v in te_builder.state_dict(model).items()}  # ComfyUI's names
    spiece = tiny_assets.spiece_model()
    sd["spiece_model"] = torch.frombuffer(bytearray(spiece), dtype=torch.uint8)
    dense = _save(tmp_path / "gemma_2_2b.safetensors", sd)
    out = text_encoder.build_text_encoder(dense, Target(str(tmp_path / "gemma-fp8.safetensors")), family="lumina-2")
    ours = _read(out)
    theirs = te_builder.state_dict(te_builder.cast_layerwise(model))
    assert "spiece_model" not in ours and set(ours) == set(theirs)
    assert all(_same_bits(ours[k], v) for k, v in theirs.items())
    assert any(v.dtype == torch.float8_e4m3fn for v in ours.values())


def test_an_entry_that_is_neither_a_weight_nor_a_bias_is_kept_as_it_is_and_never_cast(tmp_path):
    """Older transformers checkpoints hold the rotary embedding's ``inv_freq`` buffer: no module's weight or bias, so
    the layerwise cast leaves it (bf16, like every tensor the cast passes over); every other tensor is Unsloth's."""
    model = te_builder.encoder("Qwen3ForCausalLM")
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16))
    key = "model.layers.0.self_attn.rotary_emb.inv_freq"
    dense = _save(tmp_path / "qwen3-old.safetensors", {**te_builder.state_dict(model), key: inv_freq})
    kind = encoders.for_class("Qwen3ForCausalLM")
    shapes = {k: tuple(v.shape) for k, v in _read(dense).items()}
    to_cast = text_encoder.cast_keys(kind, shapes)
    assert key not in to_cast and "model.layers.0.self_attn.q_proj.weight" in to_cast
    out = text_encoder.build_text_encoder(dense, Target(str(tmp_path / "qwen3-fp8.safetensors")), family="z-image")
    ours = _read(out)
    assert ours[key].dtype == torch.bfloat16 and torch.equal(ours[key], inv_freq.to(torch.bfloat16))
    theirs = te_builder.state_dict(te_builder.cast_layerwise(model))
    assert set(ours) == set(theirs) | {key}
    assert all(_same_bits(ours[k], v) for k, v in theirs.items())
