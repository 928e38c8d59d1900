"""The README's Families table, made from the family registry (repos, the schemes each really holds, the Hub file names
tried in order) so it cannot drift from what the loader does. ``python -m tools.families_table --write`` rewrites the
table between its markers in README.md; tests/project/test_readme_tables.py fails when the README's copy is stale.
"""
from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START, END = "<!-- families-table:start -->", "<!-- families-table:end -->"
TE_START, TE_END = "<!-- encoders-table:start -->", "<!-- encoders-table:end -->"
WF_START, WF_END = "<!-- workflow-encoders:start -->", "<!-- workflow-encoders:end -->"
# ComfyUI's text-encoder loaders: node type -> (the name a user sees, its widgets that name files)
COMFY_TE_LOADERS = {"CLIPLoader": ("Load CLIP", 1), "DualCLIPLoader": ("DualCLIPLoader", 2),
                    "TripleCLIPLoader": ("TripleCLIPLoader", 3), "QuadrupleCLIPLoader": ("QuadrupleCLIPLoader", 4),
                    "LTXAVTextEncoderLoader": ("LTXAV Text Encoder Loader", 2)}
PREQUANT_TE = "PrequantLoadTextEncoder"
# What the suite proves per encoder model: ComfyUI builds each encoder at its real size, so only the smallest
# (Gemma2-2B) runs through the node in the tests; the others are read, judged and renamed from tiny real configs.
TE_NODE_TESTED = {"Gemma2-2B": "node on ComfyUI 0.3.75 and 0.12.1 (full size): conditioning equal to CLIPLoader",
                  "Qwen3-4B": "files (tiny real config); node at full size in bench/bench_text_encoder.py: "
                              "conditioning equal to CLIPLoader",
                  "T5-XXL": "files (tiny real config); node at full size with CLIP-L in bench/bench_text_encoder.py: "
                            "conditioning and pooled output equal to DualCLIPLoader"}
TE_NODE_TESTED.update({n: "files read, judged and described (tiny real config); node: refused naming ComfyUI's own "
                          "file of the encoder (no key map to ComfyUI 0.33's class yet)"
                       for n in ("Mistral-Small-24B", "Gemma3-12B")})
TE_CORE_TESTED = "files read, judged and renamed (tiny real config); node not run at full size"

# What the test suite proves per family (the registry cannot know it): the node on ComfyUI 0.33.0 (and 0.3.75 /
# 0.12.1 where they have the class), or the diffusers loader only where no testable ComfyUI has the class.
NODE_TESTED = "node (ComfyUI 0.33.0, 0.3.75, 0.12.1) + diffusers loader, every kind (CPU, tiny)"
NEWER_NODE_TESTED = ("node on ComfyUI {min_comfy} (map proven against diffusers' forward; int8 equal to load-time "
                     "quantization) + diffusers loader, every kind (CPU, tiny, diffusers 0.42.1)")
DIFFUSERS_ONLY_TESTED = "diffusers loader, every kind (CPU, tiny, diffusers 0.42.1); node: ComfyUI {min_comfy}+"
# a family whose ComfyUI class also holds weights its files lack (LTX-2.3's text connectors, read from a second file)
COMPANION_TESTED = ("node on ComfyUI {min_comfy} with {what} from their own file (map proven against diffusers' "
                    "forward on both streams; int8 equal to load-time quantization) + diffusers loader, every kind "
                    "(CPU, tiny, diffusers 0.42.1)")


def _status(fam) -> str:
    need = fam.arch.min_comfy
    if fam.arch.unet_config is None:
        return DIFFUSERS_ONLY_TESTED.format(min_comfy=need)
    if fam.arch.companion is not None:
        return COMPANION_TESTED.format(min_comfy=need, what="the text connectors")
    return NEWER_NODE_TESTED.format(min_comfy=need) if need.startswith("0.33") else NODE_TESTED


def _names(repo: str, scheme: str, component: str) -> str:
    from prequant_core.load import sources
    return " → ".join(f"`{n}`" for n in sources.filenames(repo, scheme, component))


def rows() -> list[str]:
    from prequant_core import families
    from prequant_core.load import sources
    out = ["| Family | Hosted repo | Schemes it holds (in the order auto tries them) | File names tried, in order | "
           "ComfyUI class | Tested here |", "|---|---|---|---|---|---|"]
    for fam in families.FAMILIES.values():
        newer = fam.arch.unet_config is None or fam.arch.min_comfy.startswith("0.33")
        cls = " / ".join(fam.comfy_models) + (f" ({fam.arch.min_comfy}+)" if newer else "")
        status = _status(fam)
        for i, repo in enumerate(fam.hosted):
            held = sources.schemes_for_repo(repo)
            names = []
            for comp in fam.arch.components:
                for s in held:
                    tag = s if comp == "transformer" else f"{s}, {comp}"
                    names.append(f"{tag}: {_names(repo, s, comp)}")
            first = i == 0
            out.append(f"| {fam.title if first else ''} | {repo} | {', '.join(held)} | {'<br>'.join(names)} | "
                       f"{cls if first else ''} | {status if first else ''} |")
    return out


def table() -> str:
    return "\n".join([START, *rows(), END])


def encoder_rows() -> list[str]:
    from prequant_core import families
    from prequant_core.families import encoders
    from prequant_core.text_encoders import sources as encoder_sources
    out = ["| Family | Text encoder | Hosted file (names tried, in order) | ComfyUI type | Tested here |",
           "|---|---|---|---|---|"]
    for fam in families.FAMILIES.values():
        for e in fam.hosting.text_encoders:
            kind = encoders.for_class(e.te_class)
            names = " → ".join(f"`{n}`" for n in encoder_sources.filenames(e.repo, e.component))
            with_ = f" + {', '.join(e.with_encoders)} (with_encoder)" if e.with_encoders else ""
            out.append(f"| {fam.title} | {kind.name} ({e.component}) | {e.repo}: {names} | "
                       f"{e.clip_type.lower()}{with_} | {_te_tested(kind, e)} |")
    return out


def _te_tested(kind, hosted) -> str:
    need = kind.needs_comfy(hosted)
    if not kind.hostable and need:
        return (f"files read, judged and described (tiny real config{'; the int8 ConvRot form too' if 'int8' in kind.schemes else ''}"
                f"); node: refused naming ComfyUI {need} (its class) and ComfyUI's own file, before any download")
    return TE_NODE_TESTED.get(kind.name, TE_CORE_TESTED)


def encoder_table() -> str:
    return "\n".join([TE_START, *encoder_rows(), TE_END])


def workflow_encoder_rows() -> list[str]:
    """Which text-encoder file each example workflow loads, read from the workflows themselves: Unsloth's pre-cast
    file through Load Prequant Text Encoder (its preset's names, as the node tries them), or ComfyUI's own file
    through ComfyUI's loader (with the host the workflow declares for it)."""
    import glob
    import json

    from prequant_core.text_encoders import sources as encoder_sources
    out = ["| Workflow | Text encoder node | File(s) it loads | From |", "|---|---|---|---|"]
    for path in sorted(glob.glob(os.path.join(ROOT, "example_workflows", "*.json"))):
        nodes = json.load(open(path, encoding="utf-8"))["nodes"]
        for n in nodes:
            values = n.get("widgets_values") or []
            if n["type"] == PREQUANT_TE:
                preset = encoder_sources.get_preset(values[1])
                names = encoder_sources.filenames(preset.repo, preset.label.rsplit(" / ", 1)[1])
                extra = values[2] if values[2] not in ("", "none") else None
                files = f"`{names[0]}` (Unsloth's pre-cast fp8)" + (f" + `{extra}`" if extra else "")
                out.append(f"| `{os.path.basename(path)}` | Load Prequant Text Encoder | {files} | "
                           f"{preset.repo}{' + ComfyUI (with_encoder)' if extra else ''} |")
            elif n["type"] in COMFY_TE_LOADERS:
                shown, count = COMFY_TE_LOADERS[n["type"]]
                urls = {m["name"]: m.get("url", "") for m in (n.get("properties") or {}).get("models") or []}
                files = list(values[:count])
                hosts = dict.fromkeys("/".join(urls[f].split("/")[3:5]) for f in files if urls.get(f))
                # ComfyUI's own files come from its hosts; LTX-2.3's text projection is a community split file
                whose = "ComfyUI's own" if all(h.split("/")[0] in ("Comfy-Org", "comfyanonymous") for h in hosts) \
                    else "for ComfyUI's loader"
                out.append(f"| `{os.path.basename(path)}` | {shown} | "
                           + " + ".join(f"`{f}`" for f in files) + f" ({whose}) | {', '.join(hosts)} |")
    return out


def workflow_encoder_table() -> str:
    return "\n".join([WF_START, *workflow_encoder_rows(), WF_END])


def readme_block(text: str, start: str = START, end: str = END) -> str:
    a, b = text.index(start), text.index(end) + len(end)
    return text[a:b]


def main(argv: list[str]) -> int:
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    if "--write" in argv:
        text = text.replace(readme_block(text), table())
        text = text.replace(readme_block(text, TE_START, TE_END), encoder_table())
        text = text.replace(readme_block(text, WF_START, WF_END), workflow_encoder_table())
        with open(os.path.join(ROOT, "README.md"), "w", encoding="utf-8") as f:
            f.write(text)
    else:
        print(table())
        print(encoder_table())
        print(workflow_encoder_table())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
