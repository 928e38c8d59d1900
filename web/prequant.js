// ComfyUI-Prequant front-end extension (plain JavaScript, served from WEB_DIRECTORY = "./web").
//
// - Prequant Info: renders the report the node sends back (ui.prequant_info[0], see prequant_core/info.py
//   Report.to_dict) as a table on the node, the verdict on top in green (valid) or red (invalid, with every reason).
// - Load Prequant Transformer: after a run, shows the scheme and size of the loaded checkpoint and where the file is
//   (ui.prequant[0]); maps widget values of workflows saved with an older input order by name (legacyLayout).
//
// Everything a file supplies is inserted with textContent, never as HTML: names come from strangers' files.
import { app } from "../../scripts/app.js";

const INFO_CLASS = "PrequantInfo";
const LOADER_CLASS = "PrequantLoadTransformer";

const CSS = `
.prequant-info, .prequant-loaded {
  box-sizing: border-box; width: 100%; height: 100%; overflow: auto; padding: 4px 6px;
  font: 11px/1.35 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
  color: var(--input-text, #ddd); background: var(--comfy-input-bg, #222); border-radius: 6px;
}
.prequant-info table { border-collapse: collapse; width: 100%; }
.prequant-info th { text-align: left; font-weight: normal; opacity: 0.7; padding: 1px 10px 1px 0;
  white-space: nowrap; vertical-align: top; }
.prequant-info td { padding: 1px 0; overflow-wrap: anywhere; }
.prequant-verdict { padding: 4px 6px; margin-bottom: 4px; border-radius: 4px; font-weight: bold; }
.prequant-verdict.prequant-valid { background: #1e6b34; color: #e3ffe8; }
.prequant-verdict.prequant-invalid { background: #8a1f1f; color: #ffe5e5; }
.prequant-verdict ul { margin: 3px 0 0 0; padding-left: 16px; font-weight: normal; }
.prequant-note { opacity: 0.65; font-style: italic; margin-top: 3px; }
.prequant-placeholder { opacity: 0.6; font-style: italic; }
.prequant-loaded .prequant-scheme { font-weight: bold; color: #8fd3ff; }
`;

function addStyle() {
  if (document.getElementById("prequant-style")) return;
  const style = document.createElement("style");
  style.id = "prequant-style";
  style.textContent = CSS;
  document.head.appendChild(style);
}

function el(tag, className, text) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

function humanBytes(n) {
  n = Number(n) || 0;
  for (const [unit, div] of [["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]]) {
    if (Math.abs(n) >= div) return `${(n / div).toFixed(2)} ${unit}`;
  }
  return `${n} B`;
}

// The report as DOM: verdict block, then the (label, value) rows the Python side chose (Report.rows()).
export function renderReport(container, report) {
  container.replaceChildren();
  const verdict = report.verdict || { ok: !!report.valid, reasons: report.reasons || [] };
  const v = el("div", `prequant-verdict ${verdict.ok ? "prequant-valid" : "prequant-invalid"}`,
    verdict.summary || (verdict.ok ? "VALID" : "INVALID"));
  v.dataset.verdict = verdict.ok ? "valid" : "invalid";
  if (!verdict.ok && verdict.reasons?.length) {
    const ul = el("ul", "prequant-reasons");
    for (const r of verdict.reasons) ul.appendChild(el("li", null, r));
    v.appendChild(ul);
  }
  container.appendChild(v);
  const table = el("table", "prequant-table");
  for (const [label, value] of report.rows || []) {
    const tr = el("tr");
    tr.appendChild(el("th", null, label));
    tr.appendChild(el("td", null, value));
    table.appendChild(tr);
  }
  container.appendChild(table);
  for (const n of report.notes || []) container.appendChild(el("div", "prequant-note", n));
}

function addPanel(node, name, className, placeholder, minHeight) {
  addStyle();
  const div = el("div", className);
  div.appendChild(el("div", "prequant-placeholder", placeholder));
  const widget = node.addDOMWidget(name, "prequant_panel", div, {
    serialize: false, // neither a workflow value nor a prompt input
    hideOnZoom: false,
    getMinHeight: () => minHeight,
    getValue: () => node.prequantReport ?? null,
    setValue: () => {},
  });
  widget.serialize = false;
  return { div, widget };
}

// Grow the node (never shrink it) until the panel shows all its content without scrolling.
function fitToContent(node, div) {
  const grow = () => {
    const missing = div.scrollHeight - div.clientHeight;
    if (missing > 1) node.setSize([node.size[0], node.size[1] + missing + 4]);
    node.setDirtyCanvas?.(true, true);
  };
  requestAnimationFrame(() => { grow(); requestAnimationFrame(grow); });
}

function setupInfo(node) {
  const { div } = addPanel(node, "prequant_report", "prequant-info",
    "Run the workflow (Queue) to inspect the file.", 60);
  if (node.size[0] < 460) node.setSize([460, node.size[1]]);
  const onExecuted = node.onExecuted;
  node.onExecuted = function (output) {
    onExecuted?.apply(this, arguments);
    const report = output?.prequant_info?.[0];
    if (!report) return;
    node.prequantReport = report;
    renderReport(div, report);
    fitToContent(node, div);
  };
}

function setupLoader(node) {
  let panel = null;
  const onExecuted = node.onExecuted;
  node.onExecuted = function (output) {
    onExecuted?.apply(this, arguments);
    const s = output?.prequant?.[0];
    if (!s) return;
    node.prequantSummary = s;
    if (!panel) panel = addPanel(node, "prequant_loaded", "prequant-loaded", "", 40);
    const d = panel.div;
    d.replaceChildren();
    const line = el("div");
    line.appendChild(el("span", "prequant-scheme", s.scheme));
    const saving = s.dense_bytes > 0 ? ` (dense ${humanBytes(s.dense_bytes)}, ` +
      `${(100 * (1 - s.size_bytes / s.dense_bytes)).toFixed(1)} % smaller)` : "";
    line.appendChild(document.createTextNode(` · ${humanBytes(s.size_bytes)} in memory${saving}`));
    d.appendChild(line);
    d.appendChild(el("div", "prequant-note",
      `${s.family} · ${s.quantized_layers} quantized layers · ${s.file} (${s.container}, ${s.layout} keys)`));
    if (s.location) {
      const from = s.source ? ` (${s.downloaded ? "downloaded" : "earlier download"} from ${s.source.slice(4)})` : "";
      d.appendChild(el("div", "prequant-note prequant-location", `File: ${s.location}${from}`));
    }
    d.dataset.scheme = s.scheme;
    fitToContent(node, d);
  };
}

// Workflows saved before the nodes' inputs were reordered (expert inputs last) and the loader's hf_token was removed
// store widgets_values in an older order; the front end assigns them by position, so map them back by name here.
// An old hf_token value is dropped: it is copied into no widget, so it is never saved or queued again.
const POLICIES = ["prequant only", "prequant, else quantize dense", "quantize dense"];
const OLD_5 = ["checkpoint", "path", "base_model_id", "scheme", "family"];
const OLD_9 = [...OLD_5, "hub_repo", "preset", "revision", "hf_token"];
const OLD_12 = [...OLD_9, "min_features", "policy", "dense_fallback"];
const OLD_LAYOUTS = {
  [LOADER_CLASS]: (v) => {
    if (v.length === 5) return OLD_5;
    if (v.length === 9) return OLD_9;
    // The current layout also has 12 values, but min_features (a number) sits at index 10 and revision at 9.
    if (v.length === 12 && typeof v[9] === "number" && POLICIES.includes(v[10])) return OLD_12;
    return null;
  },
  // now: checkpoint, base_model_id, scheme, verify_fingerprint, path
  [INFO_CLASS]: (v) => (v.length === 5 && typeof v[4] === "boolean"
    ? ["checkpoint", "path", "base_model_id", "scheme", "verify_fingerprint"] : null),
  // now: dense_file, scheme, base_model_id, family, filename, min_features, container, overwrite
  PrequantBuildCheckpoint: (v) => (v.length === 8 && typeof v[2] === "number"
    ? ["dense_file", "scheme", "min_features", "base_model_id", "family", "filename", "container", "overwrite"]
    : null),
};

export function legacyLayout(cls, values) {
  if (!Array.isArray(values) || !OLD_LAYOUTS[cls]) return null;
  return OLD_LAYOUTS[cls](values);
}

function inputDefault(node, name) {
  const def = node.constructor?.nodeData?.input ?? {};
  const spec = def.required?.[name] ?? def.optional?.[name];
  if (!spec) return undefined;
  if (spec[1] && "default" in spec[1]) return spec[1].default;
  if (Array.isArray(spec[0])) return spec[0][0];
  return spec[1]?.options?.[0];
}

function remapLegacy(node, cls, info) {
  const values = info?.widgets_values;
  const names = legacyLayout(cls, values);
  if (!names) return false;
  const byName = new Map(names.map((n, i) => [n, values[i]]));
  byName.delete("hf_token");
  for (const w of node.widgets ?? []) {
    if (w.serialize === false) continue;
    const v = byName.has(w.name) ? byName.get(w.name) : inputDefault(node, w.name);
    if (v !== undefined) w.value = v;
  }
  info.widgets_values = (node.widgets ?? []).filter((w) => w.serialize !== false).map((w) => w.value);
  node.setDirtyCanvas?.(true, true);
  return true;
}

function setupLegacyInputs(node, cls) {
  const onConfigure = node.onConfigure;
  node.onConfigure = function (info) {
    const r = onConfigure?.apply(this, arguments);
    remapLegacy(this, cls, info);
    return r;
  };
}

app.registerExtension({
  name: "ComfyUI-Prequant.Info",
  async nodeCreated(node) {
    const cls = node.comfyClass || node.constructor?.comfyClass;
    if (OLD_LAYOUTS[cls]) setupLegacyInputs(node, cls);
    if (cls === INFO_CLASS) setupInfo(node);
    else if (cls === LOADER_CLASS) setupLoader(node);
  },
});
