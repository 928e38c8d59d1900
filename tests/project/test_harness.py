"""The test runner's own lists (scripts/test.sh) stay true to the files they name.

Guards: a test file listed in a leg that no longer exists (renamed: it would silently drop out of its leg, or end the
leg with "file not found"), a file in two legs, a core-tier file that imports ComfyUI's test helpers, and a test file
that needs a set-up extra (Chromium, strace, torchao 0.14.1, comfy-cli, diffusers 0.42.1, comfy-kitchen) that
``scripts/test.sh FILE`` would not set up for it (it would then fail on a machine that never ran the whole suite).
"""
from __future__ import annotations

import glob
import os
import re
import subprocess

from conftest import ROOT

SCRIPT = os.path.join(ROOT, "scripts", "test.sh")
TEXT = open(SCRIPT, encoding="utf-8").read()
# what in a test file shows that it needs an extra, by the extra's name in the script
NEEDS = {
    "browser": r"tests/browser|BROWSER_DIR|playwright",
    "strace": r"\bstrace\b",
    "torchao014": r"torchao014|TORCHAO014",
    "comfy-cli": r"comfy-cli",
    "diffusers042": r"diffusers042|DIFFUSERS042",
    "comfy-kitchen": r"comfy_quantizer|comfy-kitchen",
    "hf24": r"\bHF24\b|\.cache/hf24",
}


# every test file: tests/ for prequant_core's own modules, tests/<room>/ for each of its packages and nodes/,
# tests/project/ for what checks the project as a whole (README, workflows, browser, set-up)
TEST_FILES = sorted(p for p in glob.glob(os.path.join(ROOT, "tests", "**", "test_*.py"), recursive=True)
                    if "node_modules" not in p)


def _array(name: str) -> list[str]:
    m = re.search(rf"^{name}=\((.*?)\)", TEXT, re.M | re.S)
    assert m, f"{name}=(...) is gone from scripts/test.sh"
    return [w for w in m.group(1).split() if not w.startswith("--")]


def _extras_of(paths: list[str]) -> dict[str, str]:
    """The script's own answers, from its extras_of function run by bash once for all ``paths``."""
    fn = re.search(r"^extras_of\(\) \{.*?^\}", TEXT, re.M | re.S).group(0)
    loop = 'for p in "$@"; do printf "%s\\t%s\\n" "$p" "$(extras_of "$p")"; done'
    out = subprocess.run(["bash", "-c", f"{fn}\n{loop}", "extras", *paths], capture_output=True, text=True,
                         check=True).stdout
    return dict(line.split("\t", 1) for line in out.splitlines())


def test_every_listed_file_exists_and_each_test_file_runs_in_one_leg():
    core, heavy = _array("CORE_TESTS"), _array("COMFY_HEAVY")
    on012 = _array("COMPAT_TESTS")
    for f in core + heavy + on012:
        assert os.path.isfile(os.path.join(ROOT, f)), f"scripts/test.sh lists {f}, which does not exist"
    assert len(set(core)) == len(core) and len(set(heavy)) == len(heavy)
    assert not set(core) & set(heavy), "a file listed both in the core tier and in the ComfyUI tier"
    assert not set(core) & set(on012), "a core-tier file listed for the compatibility legs (0.3.75, 0.12.1)"
    every = {os.path.relpath(p, ROOT) for p in TEST_FILES}
    assert set(core) <= every and set(heavy) <= every


def test_the_test_folders_mirror_the_package():
    """A test file sits where the code it tests sits: tests/<room>/ for prequant_core/<room>/ and nodes/, tests/ for
    prequant_core's top-level modules, tests/project/ for the project as a whole; no folder that no room has."""
    rooms = {d for d in os.listdir(os.path.join(ROOT, "prequant_core"))
             if os.path.isfile(os.path.join(ROOT, "prequant_core", d, "__init__.py"))} | {"nodes", "project"}
    folders = {os.path.relpath(os.path.dirname(p), os.path.join(ROOT, "tests")) for p in TEST_FILES}
    assert folders <= rooms | {"."}, f"test folders no package room has: {sorted(folders - rooms - {'.'})}"
    assert len(folders) >= 10
    names = [os.path.basename(p) for p in TEST_FILES]
    assert len(set(names)) == len(names), "two test files of one name: pytest imports them as one module"


def test_no_test_file_imports_another():
    """What two test files share lives in a helper module (server_kit, browser_kit, ...): importing a test file would
    collect its tests again and tie one file's fixtures to another's."""
    for p in TEST_FILES:
        text = open(p, encoding="utf-8").read()
        assert not re.search(r"^\s*(from|import) test_\w+", text, re.M), f"{os.path.basename(p)} imports a test file"


def test_core_tier_files_do_not_start_comfyui():
    for f in _array("CORE_TESTS"):
        text = open(os.path.join(ROOT, f), encoding="utf-8").read()
        assert not re.search(r"\bcomfy_headless\b|\bComfyServer\b|def \w+\([^)]*\bcomfy\b", text), \
            f"{f} starts ComfyUI: it belongs to the ComfyUI tier"


def test_a_file_run_alone_gets_the_extras_it_needs():
    files = sorted(os.path.relpath(p, ROOT) for p in TEST_FILES
                   if not p.endswith("test_harness.py"))  # it names every marker itself
    answers = _extras_of(files + ["tests/test_core_tier.py"])
    checked = 0
    for rel in files:
        text = open(os.path.join(ROOT, rel), encoding="utf-8").read()
        needed = {extra for extra, pattern in NEEDS.items() if re.search(pattern, text)}
        got = set(answers[rel].split())
        assert needed <= got, f"{rel} needs {sorted(needed - got)}: add it to extras_of in scripts/test.sh"
        checked += bool(needed)
    assert checked >= 6, "the markers above no longer find the files that need extras"
    assert answers["tests/test_core_tier.py"] == "", "a core-tier file needs no Chromium, strace or npm"


def test_the_coverage_report_names_every_unrun_line_by_function(tmp_path):
    """``scripts/test.sh --coverage`` ends with tools/coverage_gaps.py: the figures per part and the functions with
    lines no test ran, as spans; files outside prequant_core/ and nodes/ are left out."""
    import json
    import sys
    root = tmp_path / "checkout"
    (root / "prequant_core").mkdir(parents=True)
    (root / "nodes").mkdir()
    files = {
        "prequant_core/a.py": {"summary": {"num_statements": 10, "covered_lines": 7, "num_branches": 4,
                                           "covered_branches": 1},
                               "missing_lines": [3, 4, 5, 9],
                               "functions": {"f": {"missing_lines": [3, 4, 5]}, "g": {"missing_lines": [9]},
                                             "h": {"missing_lines": []}}},
        "nodes/b.py": {"summary": {"num_statements": 4, "covered_lines": 4, "num_branches": 0, "covered_branches": 0},
                       "missing_lines": [], "functions": {}},
        "tools/c.py": {"summary": {"num_statements": 5, "covered_lines": 0}, "missing_lines": [1],
                       "functions": {"x": {"missing_lines": [1]}}},
    }
    report = tmp_path / "coverage.json"
    report.write_text(json.dumps({"files": files}))
    out = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "coverage_gaps.py"), str(report), str(root)],
                         capture_output=True, text=True, check=True).stdout
    assert "| prequant_core/ | 7 / 10 lines (70.0%) | 1 / 4 branches (25.0%) |" in out
    assert "| both | 11 / 14 lines (78.6%) | 1 / 4 branches (25.0%) |" in out
    assert "- `prequant_core/a.py` f: 3 line(s): 3-5" in out and "- `prequant_core/a.py` g: 1 line(s): 9" in out
    assert " h:" not in out and "tools/c.py" not in out
