"""ComfyUI workflow JSON (the UI format users save and drag in) -> API prompt, checked against /object_info."""
from __future__ import annotations

WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"}
# Front-end-only nodes: never sent to the server (the front end's graphToPrompt leaves them out too)
VIRTUAL = {"Note", "MarkdownNote"}


class WorkflowError(ValueError):
    pass


LOADER = "PrequantLoadTransformer"
LOADER_FAMILY_SLOT = 4  # the loader's widgets_values: checkpoint, preset, hub_repo, scheme, family, ...


def needs_newer_comfyui(workflow: dict) -> str | None:
    """The ComfyUI version a workflow needs when no ComfyUI the tests run has its family's model class (the family
    record has no unet config: Krea 2, Qwen-Image 2.1, ...), else None. Such a workflow cannot be queued here: it is
    checked against ComfyUI's own template of that model instead (tests/project/test_example_workflows.py)."""
    from prequant_core import families
    need = None
    for n in workflow["nodes"]:
        values = n.get("widgets_values") or []
        if n["type"] != LOADER or len(values) <= LOADER_FAMILY_SLOT:
            continue
        fam = families.FAMILIES.get(values[LOADER_FAMILY_SLOT])
        if fam is not None and fam.arch.unet_config is None:
            need = fam.arch.min_comfy
    return need


DYNAMIC_COMBO = "COMFY_DYNAMICCOMBO_V3"  # ComfyUI 0.33+: a combo whose chosen option brings inputs of its own


def _is_widget(spec) -> bool:
    # a multi-type input ("FLOAT,INT": a link of either type) is drawn as the widget its widgetType names
    return isinstance(spec[0], list) or spec[0] in WIDGET_TYPES or spec[0] == DYNAMIC_COMBO or \
        _opts(spec).get("widgetType") in WIDGET_TYPES


def _opts(spec) -> dict:
    return spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}


def widgets(node_input: dict, values: list) -> tuple[list, int]:
    """``([(name, spec, required, value, control)], positions used)`` for the widgets a UI node stores in
    ``widgets_values``, in the UI's order: a seed's control value ("fixed", "randomize" ...) is ``control``, a dynamic
    combo is followed by the widgets of the option it holds (their API names ``combo.name``, as ComfyUI 0.33's front
    end sends them), hidden inputs are left out. ``value`` is ``MISSING`` past the stored values."""
    out, pos = [], 0

    def walk(inp: dict, prefix: str):
        nonlocal pos
        for section in ("required", "optional"):
            for name, spec in (inp.get(section) or {}).items():
                if not _is_widget(spec) or _opts(spec).get("hidden"):
                    continue
                value = values[pos] if pos < len(values) else MISSING
                pos += 1
                control = None
                if _opts(spec).get("control_after_generate") or (name in ("seed", "noise_seed") and spec[0] == "INT"):
                    control = values[pos] if pos < len(values) else MISSING
                    pos += 1  # the UI stores "fixed" / "randomize" after the seed
                out.append((prefix + name, spec, section == "required", value, control))
                if spec[0] == DYNAMIC_COMBO and value is not MISSING:
                    chosen = next((o for o in _opts(spec).get("options", []) if o.get("key") == value), None)
                    if chosen is not None:
                        walk(chosen.get("inputs") or {}, prefix + name + ".")
    walk(node_input, "")
    return out, pos


MISSING = object()


def _inputs(info):
    for section in ("required", "optional"):
        yield from (info.get("input", {}).get(section) or {}).items()


def check(workflow: dict, object_info: dict) -> list[str]:
    """Problems: unknown node types, links whose types do not match the two ends."""
    problems = []
    nodes = {n["id"]: n for n in workflow["nodes"]}
    for n in nodes.values():
        if n["type"] not in object_info and n["type"] not in VIRTUAL:
            problems.append(f"node {n['id']}: unknown type {n['type']}")
    for link in workflow.get("links", []):
        lid, src, src_slot, dst, dst_slot, ltype = link[:6]
        if src not in nodes or dst not in nodes:
            problems.append(f"link {lid}: dangling")
            continue
        s, d = nodes[src], nodes[dst]
        if s["type"] not in object_info or d["type"] not in object_info:
            continue
        out_types = object_info[s["type"]]["output"]
        if src_slot >= len(out_types):
            problems.append(f"link {lid}: {s['type']} has no output {src_slot}")
            continue
        dst_input = d["inputs"][dst_slot]
        specs = dict(_inputs(object_info[d["type"]]))
        if dst_input["name"] not in specs:
            problems.append(f"link {lid}: {d['type']} has no input {dst_input['name']}")
            continue
        want = specs[dst_input["name"]][0]
        got = out_types[src_slot]
        if isinstance(want, list) or want == "*" or got == "*":
            continue
        if want != got or ltype not in (got, "*"):
            problems.append(f"link {lid}: {s['type']}[{src_slot}] gives {got}, {d['type']}.{dst_input['name']} "
                            f"takes {want} (link says {ltype})")
    return problems


def to_api(workflow: dict, object_info: dict, overrides: dict | None = None) -> dict:
    """``overrides``: {node title or type: {input name: value}} applied after conversion. A ``class_type`` among the
    values swaps the node for another of the same output (the test-size CLIPLoader standing in for a loader whose
    full-size file cannot exist here): its widget values are dropped, its links kept."""
    problems = check(workflow, object_info)
    if problems:
        raise WorkflowError("; ".join(problems))
    links = {l[0]: l for l in workflow.get("links", [])}
    prompt = {}
    for n in workflow["nodes"]:
        if n["type"] in VIRTUAL:
            continue
        info = object_info[n["type"]]
        linked = {i["name"]: links[i["link"]] for i in n.get("inputs", []) if i.get("link") is not None}
        inputs = {name: [str(l[1]), l[2]] for name, l in linked.items()}
        values = list(n.get("widgets_values") or [])
        for name, spec, _, value, _ in widgets(info.get("input", {}), values)[0]:
            if value is MISSING:
                break
            if name not in linked:
                inputs[name] = value
        prompt[str(n["id"])] = {"class_type": n["type"], "inputs": inputs,
                                "_meta": {"title": n.get("title") or n["type"]}}
    for key, vals in (overrides or {}).items():
        hits = [p for p in prompt.values() if p["_meta"]["title"] == key or p["class_type"] == key]
        if not hits:
            raise WorkflowError(f"override for '{key}' matches no node")
        for p in hits:
            vals = dict(vals)
            swap = vals.pop("class_type", None)
            if swap and swap != p["class_type"]:
                p["class_type"] = swap
                p["inputs"] = {k: v for k, v in p["inputs"].items() if isinstance(v, list)}
            p["inputs"].update(vals)
    return prompt
