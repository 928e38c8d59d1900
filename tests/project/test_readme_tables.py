"""The README's Families table is the family registry's own (tools/families_table.py): repos, the schemes each really
holds, the Hub file names tried in order. Regenerate with ``python -m tools.families_table --write``."""
from __future__ import annotations

import os

from conftest import ROOT
from tools import families_table


def test_readme_families_table_is_generated_from_the_registry():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    assert families_table.readme_block(text) == families_table.table(), \
        "README's Families table is stale: run python -m tools.families_table --write"


def test_readme_encoders_table_is_generated_from_the_registry():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    block = families_table.readme_block(text, families_table.TE_START, families_table.TE_END)
    assert block == families_table.encoder_table(), \
        "README's text-encoder table is stale: run python -m tools.families_table --write"
    assert "`FLUX.1-schnell-text_encoder_2-FP8.safetensors`" in block and "clip_l (with_encoder)" in block


def test_the_table_shows_what_repos_really_hold():
    t = families_table.table()
    qwen = next(line for line in t.splitlines() if "| unsloth/Qwen-Image-FP8 |" in line)
    assert "`Qwen-Image-INT8.safetensors`" in qwen and "| fp8, int8 |" in qwen
    assert "`Wan2.2-T2V-A14B-transformer_2-NVFP4.pt`" in t


def test_every_shipped_workflow_has_a_readable_card():
    """ComfyUI's template browser shows example_workflows/<name>.jpg as the card picture of <name>.json: each is the
    card rendered from that very workflow (model, what it does, its nodes as large boxes, the file and the ComfyUI it
    needs; round 5: editor screenshots nobody could read at 640 x 375). Regenerate: python -m tools.workflow_cards."""
    import json
    from PIL import Image
    from tools import workflow_cards
    folder = os.path.join(ROOT, "example_workflows")
    names = sorted(n[:-5] for n in os.listdir(folder) if n.endswith(".json"))
    assert names
    for n in names:
        jpg = os.path.join(folder, n + ".jpg")
        assert os.path.isfile(jpg), f"{n}.json has no card: run python -m tools.workflow_cards {n}"
        with Image.open(jpg) as img:
            assert img.format == "JPEG" and img.size == workflow_cards.SIZE, (n, img.size)
        with open(os.path.join(folder, n + ".json"), encoding="utf-8") as f:
            wf = json.load(f)
        with open(jpg, "rb") as f:
            assert f.read() == workflow_cards.encoded(workflow_cards.card(wf)), \
                f"{n}.jpg is not the card of {n}.json: run python -m tools.workflow_cards {n}"
        d = workflow_cards.describe(wf)
        assert d["stages"][0] == ("Load Prequant\nTransformer", True) and d["checkpoint"] and d["repo"], (n, d)
    assert not [f for f in os.listdir(folder) if f.endswith(".jpg") and f[:-4] not in names], "a picture without a workflow"


def test_readme_says_which_encoder_file_each_workflow_loads():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    block = families_table.readme_block(text, families_table.WF_START, families_table.WF_END)
    assert block == families_table.workflow_encoder_table(), \
        "README's workflow-encoder table is stale: run python -m tools.families_table --write"
    rows = families_table.workflow_encoder_rows()[2:]
    # every workflow is listed, each with the file its encoder node loads
    assert len(rows) == len([f for f in os.listdir(os.path.join(ROOT, "example_workflows")) if f.endswith(".json")])
    assert all(".safetensors`" in r for r in rows)
