"""The template browser's card pictures, ``example_workflows/<name>.jpg`` (ComfyUI's Workflow > Browse Templates
shows a same-name .jpg beside each workflow JSON), rendered as cards a person can read at the browser's size: the
model, what the workflow does, its chain of nodes as large boxes, the hosted file it downloads and the ComfyUI it
needs. No editor screenshot (round 5: thirteen alike screenshots with tab bar, minimap and a debug overlay, no text
readable at 640 x 375).

    .venv/bin/python -m tools.workflow_cards            # every shipped workflow
    .venv/bin/python -m tools.workflow_cards z_image_turbo_prequant

Deterministic: ``card(workflow)`` gives the same pixels for the same workflow (tests/project/test_readme_tables.py holds each
shipped picture against it, so a changed workflow with a stale picture fails).
"""
from __future__ import annotations

import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKFLOWS = os.path.join(ROOT, "example_workflows")
SIZE = (640, 375)  # the template browser shows cards at about 300 px: twice that stays sharp on HiDPI screens
JPEG_QUALITY = 90

# the node kinds a card draws, in the order of the pipeline; the first type of each kind present is drawn
STAGES = [
    ("load", ("PrequantLoadTransformer",), "Load Prequant\nTransformer"),
    ("text", ("PrequantLoadTextEncoder", "CLIPLoader", "DualCLIPLoader"), "Load CLIP"),
    ("sample", ("KSampler", "KSamplerAdvanced", "SamplerCustomAdvanced"), "KSampler"),
    ("decode", ("VAEDecode", "VAEDecodeTiled"), "VAE Decode"),
    ("save", ("SaveImage", "SaveVideo", "SaveAnimatedWEBP"), "Save"),
]
BG, PANEL, ACCENT, TEXT, DIM = (24, 26, 33), (44, 48, 60), (94, 170, 255), (240, 242, 246), (168, 174, 188)
PREQUANT = (46, 125, 78)


def _font(size: int):
    from PIL import ImageFont
    return ImageFont.load_default(size=size)  # Pillow's bundled FreeType font: the same on every machine


def _loader_values(wf: dict) -> list:
    n = next(n for n in wf["nodes"] if n["type"] == "PrequantLoadTransformer")
    return list(n.get("widgets_values") or [])


def describe(wf: dict) -> dict:
    """What the card says, read from the workflow itself."""
    info = str(wf.get("extra", {}).get("info", ""))
    what = re.split(r" with a pre-quantized", info, maxsplit=1)[0].strip() or "ComfyUI-Prequant workflow"
    values = _loader_values(wf)
    checkpoint = str(values[0]) if values else ""
    scheme = str(values[3]).upper() if len(values) > 3 else ""
    m = re.search(r"\(([\w.-]+/[\w.-]+)\)", info)
    needs = re.search(r"needs ComfyUI ([0-9]+(?:\.[0-9]+)+)", info)
    types = {n["type"] for n in wf["nodes"]}
    video = "SaveVideo" in types
    stages = []
    for _, kinds, label in STAGES:
        hit = next((t for t in kinds if t in types), None)
        if hit == "SaveVideo" or (hit and hit.startswith("Save") and video):
            label = "Save Video"
        elif hit == "SaveImage":
            label = "Save Image"
        elif hit == "PrequantLoadTextEncoder":
            label = "Load Prequant\nText Encoder"
        if hit:
            stages.append((label, hit.startswith("Prequant")))
    experts = sum(n["type"] == "PrequantLoadTransformer" for n in wf["nodes"])
    return {"what": what, "checkpoint": checkpoint, "scheme": scheme, "repo": m.group(1) if m else "",
            "needs": needs.group(1) if needs else None, "stages": stages, "experts": experts}


def _wrap(draw, text: str, font, width: int) -> list[str]:
    lines, line = [], ""
    for word in text.split():
        trial = f"{line} {word}".strip()
        if draw.textlength(trial, font=font) <= width or not line:
            line = trial
        else:
            lines.append(line)
            line = word
    return lines + ([line] if line else [])


def card(wf: dict):
    """The card of one workflow (a PIL image of ``SIZE``)."""
    from PIL import Image, ImageDraw
    d = describe(wf)
    img = Image.new("RGB", SIZE, BG)
    draw = ImageDraw.Draw(img)
    w, h = SIZE
    draw.rectangle([0, 0, w, 8], fill=ACCENT)
    y = 26
    for line in _wrap(draw, d["what"], _font(34), w - 56)[:2]:
        draw.text((28, y), line, font=_font(34), fill=TEXT)
        y += 42
    sub = f"pre-quantized {d['scheme']} transformer" + ("s" if d["experts"] > 1 else "")
    draw.text((28, y + 2), sub, font=_font(22), fill=DIM)
    # the chain of nodes, as large boxes with arrows
    stages = d["stages"]
    gap, top, box_h = 24, 168, 92
    box_w = (w - 56 - gap * (len(stages) - 1)) // max(len(stages), 1)
    for i, (label, ours) in enumerate(stages):
        x0 = 28 + i * (box_w + gap)
        draw.rounded_rectangle([x0, top, x0 + box_w, top + box_h], radius=12, fill=PREQUANT if ours else PANEL)
        lines = label.split("\n")
        f = _font(16)
        ty = top + (box_h - 21 * len(lines)) // 2
        for line in lines:
            tw = draw.textlength(line, font=f)
            draw.text((x0 + (box_w - tw) / 2, ty), line, font=f, fill=TEXT)
            ty += 21
        if i < len(stages) - 1:
            ax = x0 + box_w + 6
            draw.polygon([(ax, top + box_h / 2 - 7), (ax + gap - 12, top + box_h / 2), (ax, top + box_h / 2 + 7)],
                         fill=ACCENT)
    # where the file comes from, and the ComfyUI it needs
    y = top + box_h + 26
    draw.text((28, y), d["checkpoint"], font=_font(21), fill=TEXT)
    if d["repo"]:
        draw.text((28, y + 30), f"from {d['repo']}: downloaded on the first run", font=_font(19), fill=DIM)
    needs = f"Needs ComfyUI {d['needs']} or newer" if d["needs"] else "ComfyUI 0.3.75 or newer"
    draw.text((28, h - 40), needs, font=_font(19), fill=ACCENT)
    tag = "ComfyUI-Prequant"
    draw.text((w - 28 - draw.textlength(tag, font=_font(19)), h - 40), tag, font=_font(19), fill=DIM)
    return img


def encoded(img) -> bytes:
    import io
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=JPEG_QUALITY, optimize=True)
    return buf.getvalue()


def main(argv: list[str]) -> int:
    names = argv or sorted(n[:-5] for n in os.listdir(WORKFLOWS) if n.endswith(".json"))
    for name in names:
        with open(os.path.join(WORKFLOWS, name + ".json"), encoding="utf-8") as f:
            wf = json.load(f)
        out = os.path.join(WORKFLOWS, name + ".jpg")
        with open(out, "wb") as f:
            f.write(encoded(card(wf)))
        print(f"{out}: {SIZE[0]}x{SIZE[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
