"""The command line as a user meets it (issue 37): ``--help`` and argument errors answer before torch loads, one
progress bar for a build, the same message for a bad ``--scheme`` everywhere, and ``prequant.py`` from any folder.
The torch-free names the parser offers are checked against the registries they restate."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

PREQUANT_PY = os.path.join(ROOT, "prequant.py")

# Runs the command line in a fresh interpreter and reports which heavy modules it imported on the way.
PROBE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from prequant_core.cli import main
code = None
try:
    code = main(sys.argv[2:])
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code, "heavy": sorted(m for m in ("torch", "torchao", "diffusers", "numpy", "comfy")
                                                 if m in sys.modules)}), file=sys.stderr)
"""


def _probe(*args, cwd=None):
    p = subprocess.run([sys.executable, "-c", PROBE, ROOT, *args], capture_output=True, text=True, timeout=300,
                       cwd=cwd or ROOT)
    last = p.stderr.strip().splitlines()[-1]
    return json.loads(last), p.stdout, p.stderr


def test_the_names_the_parser_offers_are_the_registries():
    from prequant_core import builder, scheme_names, schemes
    from prequant_core.cli import choices
    from prequant_core.text_encoders import checks as encoder_checks
    from prequant_core.schemes import registry
    assert scheme_names.NAMES == registry.names() == schemes.names()
    assert choices.BUILD_CONTAINERS == builder.OUTPUTS and choices.NATIVE == builder.NATIVE
    assert choices.ENCODER_CONTAINERS == builder.CONTAINERS
    assert choices.ENCODER_COMPONENTS == encoder_checks.COMPONENTS
    assert choices.DEFAULT_MIN_FEATURES == schemes.DEFAULT_MIN_FEATURES


@pytest.mark.parametrize("args", [[], ["--help"], ["info", "--help"], ["verify", "--help"], ["build", "--help"],
                                  ["build-text-encoder", "--help"], ["--version"]],
                         ids=["bare", "help", "info", "verify", "build", "build-text-encoder", "version"])
def test_help_answers_without_torch(args):
    res, out, err = _probe(*args)
    assert res["heavy"] == [], res
    assert res["code"] == (2 if not args else 0), (res, err[-800:])
    if args and args[-1] == "--help":
        assert "usage:" in out and "--help" in out
    if args[:1] == ["build"]:
        # every scheme and family named in the options (from the registries, without importing them)
        assert all(s in out for s in ("int8", "fp8", "nvfp4", "mxfp8", "z-image", "comfyui-native", "--quiet"))


@pytest.mark.parametrize("command", [["verify", "x.safetensors", "--base", "Tongyi-MAI/Z-Image-Turbo"],
                                     ["build", "--input", "x.safetensors"]], ids=["verify", "build"])
def test_a_bad_scheme_gets_the_same_message_from_every_command_without_torch(command):
    res, _, err = _probe(*command, "--scheme", "int3")
    assert res == {"code": 2, "heavy": []}, (res, err[-800:])
    assert "argument --scheme: unknown quantization scheme 'int3'; pick one of: int8, fp8, nvfp4, mxfp8" in err
    # a spelling users type is the scheme it means, for both
    from prequant_core import schemes
    from prequant_core.cli import choices
    for typed in ("INT8", "fp8_wo", "int8-wo", "Fp8-Weight-Only", " mxfp8 "):
        assert choices.scheme(typed) == schemes.normalize(typed)


def test_an_unknown_family_is_an_argument_error_without_torch():
    res, _, err = _probe("verify", "x.pt", "--base", "a/b", "--scheme", "int8", "--family", "sd15")
    assert res == {"code": 2, "heavy": []} and "invalid choice: 'sd15'" in err and "z-image" in err


def test_prequant_py_runs_from_any_folder(prequant_files, tmp_path):
    path = prequant_files("int8", "safetensors")
    p = subprocess.run([sys.executable, "-m", "prequant_core", "--help"], cwd=str(tmp_path), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode != 0 and "No module named prequant_core" in p.stderr  # what the docs warn about
    p = subprocess.run([sys.executable, PREQUANT_PY, "info", path, "--json"], cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    d = json.loads(p.stdout)
    assert d["scheme"] == "int8" and d["verdict"]["ok"] is True
    p = subprocess.run([sys.executable, PREQUANT_PY, "--help"], cwd=str(tmp_path), capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and p.stdout.startswith(f"usage: python {PREQUANT_PY}")


def test_info_imports_what_the_file_in_hand_needs(tmp_path):
    """A pre-cast text encoder holds plain float8 tensors: info describes it without importing torchao (seconds of
    import); a quantized file needs torchao to rebuild its tensors; diffusers and ComfyUI are never imported."""
    import unsloth_te_builder as te_builder
    enc = str(tmp_path / "Lumina-Image-2.0-text_encoder-FP8.safetensors")
    te_builder.build_file(enc, "Gemma2Model", base_model_id="Alpha-VLLM/Lumina-Image-2.0", family="lumina2")
    res, out, err = _probe("info", enc)
    assert res == {"code": 0, "heavy": ["numpy", "torch"]}, (res, err[-2000:])
    assert "Text encoder" in out and "VALID" in out


def test_a_native_file_reports_the_bytes_it_holds(tmp_path):
    """A per-tensor fp8 scale is one float in the file and a row of scales in memory: Info counts the file's."""
    import torch
    from safetensors.torch import save_file
    from prequant_core.report import info
    w = torch.randn(64, 64).to(torch.float8_e4m3fn)
    path = str(tmp_path / "native.safetensors")
    save_file({"blocks.0.attn.qkv.weight": w, "blocks.0.attn.qkv.weight_scale": torch.tensor(0.01),
               "blocks.0.attn.qkv.comfy_quant": torch.tensor(list(b'{"format": "float8_e4m3fn"}'),
                                                             dtype=torch.uint8),
               "blocks.0.norm.weight": torch.ones(64, dtype=torch.bfloat16)}, path)
    r = info(path)
    assert r.container == "comfyui-native" and r.quantized_count == 1
    assert r.quantized_bytes + r.dense_bytes <= os.path.getsize(path)
    assert r.quantized_bytes >= 64 * 64 + 4 and r.dense_bytes == 128


def test_build_shows_one_progress_bar_and_a_summary(zimage_dense, tmp_path):
    from tools import tiny_models
    dense = tiny_models.save_dense_safetensors(zimage_dense, str(tmp_path / "dense.safetensors"))
    out = str(tmp_path / "Z-Image-Turbo-INT8.safetensors")
    p = subprocess.run([sys.executable, PREQUANT_PY, "build", "-i", dense, "-o", out, "--scheme", "int8"],
                       cwd=str(tmp_path), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    n_tensors = len(zimage_dense)
    # piped, as here: one line per stage when it is done, never a line per tensor
    stages = p.stderr.strip().split("\n")
    assert len(stages) == 2 and stages[0].startswith("quantizing ") and stages[1].startswith("writing "), p.stderr
    assert all(": done in " in line for line in stages), stages
    # on a terminal: one tqdm bar the stages share
    from prequant_core.cli.progress import BuildBar

    class Tty(io.StringIO):
        def isatty(self):
            return True
    tty = Tty()
    with BuildBar(stream=tty) as bar:
        for i in range(200):
            bar("quantize", i + 1, 200, f"blocks.{i}.weight")
        for i in range(300):
            bar("write", i + 1, 300, f"blocks.{i}.weight")
    drawn = tty.getvalue()
    assert drawn.count("\n") == 1 and drawn.rstrip().rsplit("\r", 1)[-1].startswith("writing 100%"), drawn[-400:]
    assert "quantizing" in drawn and "blocks." not in drawn
    lines = p.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith("Wrote ") and "quantized layers" in lines[0] and lines[1] == out
    assert n_tensors > 50
    q = subprocess.run([sys.executable, PREQUANT_PY, "build", "-i", dense, "-o", out, "--scheme", "int8", "-q",
                        "--overwrite"], cwd=str(tmp_path), capture_output=True, text=True, timeout=600)
    assert q.returncode == 0 and q.stderr.strip() == "" and q.stdout.splitlines()[-1] == out, q.stderr[-2000:]
    r = subprocess.run([sys.executable, PREQUANT_PY, "build", "-i", dense, "-o", out, "--scheme", "int8", "-q"],
                       cwd=str(tmp_path), capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and "--overwrite" in r.stderr, r.stderr[-2000:]


def test_an_output_name_with_terminal_escapes_or_an_unwritable_folder_is_refused_plainly(zimage_dense, tmp_path):
    """Round 5: ``-o`` took a name with terminal escapes and printed it raw (the node refuses such names);
    ``-o /proc/self/x.safetensors`` ended as "unexpected FileNotFoundError ... please report"."""
    from tools import tiny_models
    dense = tiny_models.save_dense_safetensors(zimage_dense, str(tmp_path / "dense.safetensors"))
    run = lambda out: subprocess.run([sys.executable, PREQUANT_PY, "build", "-i", dense, "-o", out, "-q"],  # noqa: E731
                                     cwd=str(tmp_path), capture_output=True, text=True, timeout=600)
    p = run(str(tmp_path / "bad\x1b[2J\x1b[31mname.safetensors"))
    assert p.returncode == 2 and "control or reserved characters" in p.stderr, p.stderr[-2000:]
    assert "\x1b" not in p.stderr + p.stdout and not any("bad" in n for n in os.listdir(tmp_path))
    p = run("/proc/self/x.safetensors")
    assert p.returncode == 2 and "Nothing can be written in the output folder" in p.stderr, p.stderr[-2000:]
    assert "report" not in p.stderr and "Traceback" not in p.stderr


def test_the_messages_a_new_user_met_say_what_is_meant(prequant_files, tmp_path):
    """Round 5 as a new user: build on a non-checkpoint asked for "a pre-quantized transformer" (it wants a dense
    one); a missing input had no Fix line; verify's VALID did not say the weights were not hashed; its --help lacked
    ltx-2.3; a fingerprint reason read "fingerprint: fingerprint: ..."."""
    import shutil
    import struct
    junk = tmp_path / "notes.safetensors"
    junk.write_text("hello")
    run = lambda *a: subprocess.run([sys.executable, PREQUANT_PY, *a], cwd=str(tmp_path), capture_output=True,  # noqa
                                    text=True, timeout=300)
    p = run("build", "-i", str(junk), "-o", str(tmp_path / "o.safetensors"))
    assert p.returncode == 2 and "not a model file" in p.stderr and "dense" in p.stderr, p.stderr
    assert "pre-quantized transformer" not in p.stderr
    p = run("build", "-i", str(tmp_path / "absent.safetensors"), "-o", str(tmp_path / "o.safetensors"))
    assert p.returncode == 2 and "does not exist" in p.stderr and "Fix: " in p.stderr, p.stderr
    path = prequant_files("int8", "safetensors")
    p = run("verify", path, "--base", "Tongyi-MAI/Z-Image-Turbo", "--scheme", "int8")
    assert p.returncode == 0 and "VALID" in p.stdout and "weights not hashed" in p.stdout, p.stdout
    p = run("verify", path, "--base", "Tongyi-MAI/Z-Image-Turbo", "--scheme", "int8", "--verify-fingerprint")
    assert p.returncode == 0 and "not hashed" not in p.stdout, p.stdout
    assert "ltx-2.3" in run("verify", "--help").stdout
    # one quantized weight changed after the build: the reason names the fingerprint once
    bad = tmp_path / "changed.safetensors"
    shutil.copy(path, bad)
    with open(bad, "r+b") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        a, _ = json.loads(f.read(n))["layers.0.attention.to_q._weight_qdata"]["data_offsets"]
        f.seek(8 + n + a)
        byte = f.read(1)
        f.seek(8 + n + a)
        f.write(bytes([byte[0] ^ 1]))
    p = run("verify", str(bad), "--base", "Tongyi-MAI/Z-Image-Turbo", "--scheme", "int8", "--verify-fingerprint")
    assert p.returncode == 1 and "weights differ" in p.stdout and "fingerprint: fingerprint" not in p.stdout, p.stdout
