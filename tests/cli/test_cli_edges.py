"""The command line's edges no other file runs (``prequant_core/cli``): the safety net in ``main`` (Ctrl-C ends as
"interrupted" with status 130, an unexpected exception as one escaped "error: unexpected ..." message with status 3,
never a traceback), ``verify --json`` printing the full report, ``build --container comfyui-native`` writing its
default file name into an existing folder or the current one (from a diffusers-layout input of a family whose
ComfyUI key map is the pack's own function), and ``build-text-encoder`` writing its default name into an existing
folder. The builds run in a fresh interpreter on real tiny models, and their output is read back by ``info``.
Core tier: no ComfyUI."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import BASE_ID, ROOT

PREQUANT_PY = os.path.join(ROOT, "prequant.py")


def _cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, PREQUANT_PY, *args], cwd=str(cwd), capture_output=True, text=True,
                          timeout=600)


# --- main's safety net (in-process: the worker is made to raise, as a stranger's file or a Ctrl-C would) ----------

def test_ctrl_c_during_a_command_prints_interrupted_and_exits_130(monkeypatch, capsys):
    from prequant_core import report
    from prequant_core.cli import main

    def interrupted(*a, **kw):
        raise KeyboardInterrupt
    monkeypatch.setattr(report, "info", interrupted)
    assert main(["info", "some.safetensors"]) == 130
    out, err = capsys.readouterr()
    assert err == "interrupted\n" and out == ""


def test_an_unexpected_exception_is_one_escaped_message_and_exit_3(monkeypatch, capsys):
    from prequant_core import report
    from prequant_core.cli import main

    def broken(*a, **kw):
        raise ZeroDivisionError("bad \x1b[31mbytes in " + "x" * 600)
    monkeypatch.setattr(report, "info", broken)
    assert main(["verify", "odd.safetensors", "--base", BASE_ID, "--scheme", "int8"]) == 3
    out, err = capsys.readouterr()
    assert out == ""
    first, fix = err.rstrip("\n").split("\n")
    assert first.startswith("error: unexpected ZeroDivisionError while running 'verify': bad ")
    assert "\x1b" not in err, "a terminal escape from the message reached the terminal"
    assert len(first) < 500, "the message is cut, not printed whole"
    assert fix.startswith("Fix: if a file was being read, it is damaged or not a checkpoint")
    assert "Traceback" not in err


# --- verify --json ---------------------------------------------------------------------------------------------

def test_verify_json_prints_the_full_report(prequant_files):
    path = prequant_files("int8", "safetensors")
    p = _cli("verify", path, "--base", BASE_ID, "--scheme", "int8", "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    d = json.loads(p.stdout)
    assert d["valid"] is True and d["reasons"] == [] and d["verdict"]["ok"] is True
    assert d["scheme"] == "int8" and d["family"] == "z-image" and d["container"] == "safetensors"
    assert d["path"] == os.path.abspath(path) and d["request"] == {"base_model_id": BASE_ID, "scheme": "int8"}
    assert d["quantized_count"] > 0 and d["fingerprint_present"] is True and d["fingerprint_verified"] is None
    # the same file asked for as another scheme: the JSON says why, with status 1
    p = _cli("verify", path, "--base", BASE_ID, "--scheme", "fp8", "--json")
    d = json.loads(p.stdout)
    assert p.returncode == 1 and d["valid"] is False and d["reasons"], p.stdout[-2000:]
    assert d["request"]["scheme"] == "fp8"


# --- build: the default file name inside a folder ----------------------------------------------------------------

WAN = "wan2.2-t2v-a14b"  # its ComfyUI key map is the pack's own function (families/wan22.py), no ComfyUI needed
WAN_NATIVE = "Wan2.2-T2V-A14B-Diffusers-INT8-ComfyUI.safetensors"


def test_a_comfyui_native_build_names_its_file_in_the_folder_given_or_the_current_one(tmp_path):
    from prequant_core import families
    from safetensors.torch import save_file
    from tools import tiny_families
    assert callable(families.get(WAN).arch.comfy_key_map)
    dense = tiny_families.dense(WAN)
    assert "blocks.0.attn1.to_q.weight" in dense  # diffusers' layout
    src = str(tmp_path / "wan-dense.safetensors")
    save_file(dense, src)
    out = tmp_path / "out"
    out.mkdir()
    p = _cli("build", "-i", src, "-o", str(out), "--container", "comfyui-native", "--scheme", "int8",
             "--family", WAN, "-q")
    assert p.returncode == 0, p.stderr[-3000:]
    assert os.listdir(out) == [WAN_NATIVE]
    assert p.stdout.splitlines()[-1] == str(out / WAN_NATIVE)
    r = _cli("info", str(out / WAN_NATIVE), "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout)
    assert d["container"] == "comfyui-native" and d["layout"] == "comfyui" and d["scheme"] == "int8"
    assert d["quantized_count"] > 0
    # mapped to ComfyUI's names by the family's own map: no diffusers name is left
    from prequant_core import formats
    names = list(formats.read(str(out / WAN_NATIVE)).tensors)
    assert any(k.startswith("blocks.0.self_attn.q.") for k in names), names[:10]
    assert not any(".attn1." in k for k in names)
    # no --output: that name in the current folder
    here = tmp_path / "here"
    here.mkdir()
    p = _cli("build", "-i", src, "--container", "comfyui-native", "--scheme", "int8", "--family", WAN, "-q",
             cwd=here)
    assert p.returncode == 0, p.stderr[-3000:]
    assert os.listdir(here) == [WAN_NATIVE] and p.stdout.splitlines()[-1] == str(here / WAN_NATIVE)


def test_build_text_encoder_into_an_existing_folder_writes_the_hosted_name(tmp_path):
    import unsloth_te_builder as te_builder
    from safetensors.torch import save_file
    dense = str(tmp_path / "qwen3-dense.safetensors")
    save_file({k: v.contiguous().clone() for k, v in te_builder.state_dict(
        te_builder.encoder("Qwen3ForCausalLM")).items()}, dense)
    out = tmp_path / "encoders"
    out.mkdir()
    p = _cli("build-text-encoder", "-i", dense, "--family", "z-image", "-o", str(out), "-q")
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    name = "Z-Image-Turbo-text_encoder-FP8.safetensors"
    assert os.listdir(out) == [name]
    assert p.stdout.startswith(f"wrote {out / name} (")
    r = _cli("verify", str(out / name), "--base", BASE_ID, "--scheme", "fp8")
    assert r.returncode == 0 and ": VALID" in r.stdout, r.stdout + r.stderr[-2000:]


def test_the_safety_net_does_not_swallow_the_packs_own_errors(tmp_path, capsys):
    """Control for the net above: a missing file is the pack's own error (status 2, no "unexpected")."""
    from prequant_core.cli import main
    assert main(["info", str(tmp_path / "x.safetensors")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "unexpected" not in err and "x.safetensors" in err
