"""Ready for the Comfy Registry / ComfyUI Manager (issue 14, item 6), checked with the Registry's own tooling.

comfy-cli (``comfy node validate`` / ``comfy node pack``) lives in ``.cache/comfy-cli`` (scripts/setup_test_extras.sh).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import zipfile

import pytest

from conftest import ROOT

VENV = os.path.join(ROOT, ".cache", "comfy-cli", "bin")
COMFY = os.path.join(VENV, "comfy")
DEV_ONLY = ("tests/", "bench/", "tools/", "scripts/", ".ci/", "pytest.ini", "requirements-dev.txt")
SHIPS = ("__init__.py", "nodes/ops.py", "nodes/load_node.py", "prequant_core/schemes/devices.py", "prequant_core/__main__.py",
         "web/prequant.js", "example_workflows/z_image_turbo_prequant.json", "requirements.txt", "pyproject.toml",
         "LICENSE", "README.md", "docs/FORMAT.md")


@pytest.fixture(scope="module")
def comfy_cli(tmp_path_factory):
    assert os.access(COMFY, os.X_OK), "comfy-cli is missing: run scripts/setup_test_extras.sh (or scripts/test.sh)"
    home = tmp_path_factory.mktemp("comfy_cli_config")  # comfy-cli's own settings go here, not to ~/.config
    env = {**os.environ, "XDG_CONFIG_HOME": str(home), "PATH": VENV + os.pathsep + os.environ.get("PATH", "")}

    def run(args, cwd):
        p = subprocess.run([COMFY, *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=300)
        return p.returncode, p.stdout + p.stderr

    return run


def _tree_copy(dst) -> str:
    """The working tree's tracked and not-ignored files in a fresh git repo (what a commit of them would hold)."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for f in filter(None, files):
        src = os.path.join(ROOT, f)
        if os.path.isfile(src):
            os.makedirs(os.path.join(dst, os.path.dirname(f)), exist_ok=True)
            shutil.copy2(src, os.path.join(dst, f))
    subprocess.run(["git", "init", "-q", str(dst)], check=True)
    subprocess.run(["git", "add", "-A"], cwd=dst, check=True)  # a scratch repo of our own, never the checkout
    return str(dst)


def test_registry_validator_passes_without_a_warning(comfy_cli):
    rc, out = comfy_cli(["node", "validate"], ROOT)
    assert rc == 0, out
    assert "All validation checks passed" in out, out
    for bad in ("Warning", "Error", "Security warnings", "Invalid"):
        assert bad not in out, out


def test_registry_reads_every_field(tmp_path):
    """The Registry's own parser (comfy_cli.registry.config_parser) finds each [tool.comfy] / [project] field."""
    code = """if True:
        import dataclasses, json
        from comfy_cli.registry.config_parser import extract_node_configuration

        def plain(o):  # tomlkit's containers are not plain lists / dicts
            if dataclasses.is_dataclass(o):
                return {f.name: plain(getattr(o, f.name)) for f in dataclasses.fields(o)}
            if isinstance(o, dict):
                return {str(k): plain(v) for k, v in o.items()}
            if isinstance(o, (list, tuple)):
                return [plain(v) for v in o]
            return o if o is None or isinstance(o, (bool, int, float)) else str(o)

        print(json.dumps(plain(extract_node_configuration("pyproject.toml"))))
    """
    p = subprocess.run([os.path.join(VENV, "python"), "-c", code], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path)}, timeout=120)
    assert p.returncode == 0, p.stderr
    cfg = json.loads(p.stdout.strip().splitlines()[-1])
    tool, proj = cfg["tool_comfy"], cfg["project"]
    assert tool["publisher_id"] and tool["display_name"] and tool["icon"].startswith("https://"), tool
    assert proj["name"] and proj["version"] and proj["description"] and proj["urls"]["repository"], proj
    # what the Registry and ComfyUI Manager list names every scheme and the text encoders (issue 37: "int8 / fp8" only)
    from prequant_core.schemes import registry as scheme_registry
    assert all(s.suffix.lstrip("-").lower() in proj["description"].lower() for s in scheme_registry.all_schemes())
    assert "text encoders" in proj["description"], proj["description"]
    assert proj["supported_comfyui_version"].startswith(">="), proj
    assert {"Microsoft :: Windows", "POSIX :: Linux", "MacOS"} <= set(proj["supported_os"]), proj
    assert {"GPU :: NVIDIA CUDA", "GPU :: AMD ROCm", "GPU :: Apple Metal"} <= set(proj["supported_accelerators"])
    assert not any(d.startswith("torch") and not d.startswith("torchao") for d in proj["dependencies"]), \
        "torch comes from the user's ComfyUI and is never a dependency"
    # the license named in pyproject.toml is the file shipped, and the classifier says the same license
    lic = proj["license"]
    assert lic["file"] == "LICENSE", lic
    with open(os.path.join(ROOT, "LICENSE")) as f:
        text = f.read()
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        assert '"License :: OSI Approved :: Apache Software License"' in f.read()


def test_registry_package_leaves_out_dev_files(comfy_cli, tmp_path):
    """``comfy node pack`` (what ``comfy node publish`` uploads) holds the node and none of the dev-only folders."""
    tree = _tree_copy(tmp_path / "tree")
    rc, out = comfy_cli(["node", "pack"], tree)
    assert rc == 0, out
    with zipfile.ZipFile(os.path.join(tree, "node.zip")) as z:
        names = set(z.namelist())
    for f in SHIPS:
        assert f in names, f"{f} missing from the Registry package"
    leaked = sorted(n for n in names if n.startswith(DEV_ONLY))
    assert not leaked, leaked
    assert any(n.startswith("nodes/") for n in names) and any(n.startswith("prequant_core/formats/") for n in names)
