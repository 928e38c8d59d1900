"""The README's first command does what it says: the main job on the embedded default (tools/demo.py, which
scripts/demo.sh runs after its set-up) builds the tiny model, shows dense + quantize against this loader with the
same output bit for bit, runs the shipped Z-Image workflow on a real ComfyUI server, and says "OK" on stdout with
nothing from other packages on stderr (round 5: torch's deprecation notes and ComfyUI's "torchaudio missing")."""
from __future__ import annotations

import subprocess
import sys

from conftest import ROOT


def test_the_demo_runs_the_workflow_and_keeps_other_packages_notices_out(tmp_path):
    p = subprocess.run([sys.executable, "-m", "tools.demo", "--out", str(tmp_path / "demo")], cwd=ROOT,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = p.stdout.splitlines()
    assert "[demo] OK" in out, p.stdout[-3000:]
    assert any("max abs diff of the sampled latents" in line and line.rstrip().endswith(" 0.0") for line in out), \
        p.stdout[-3000:]
    assert p.stderr.strip() == "", p.stderr[-3000:]
