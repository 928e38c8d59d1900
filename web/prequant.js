// ComfyUI-Prequant front-end extension (plain JavaScript, served from WEB_DIRECTORY = "./web").
//
// - Prequant Info: renders the report the node sends back (ui.prequant_info[0], see prequant_core/report.py
//   Report.to_dict) as a table on the node, the verdict on top in green (valid) or red (invalid, with every reason).
// - Load Prequant Transformer: after a run, shows the scheme and size of the loaded checkpoint and where the file is
//   (ui.prequant[0]); maps widget values of workflows saved with an older input order by name (legacyLayout).
// - Load Prequant Text Encoder: the same panel for the encoder (renderEncoder).
//
// - All three: the last result is kept in the node's properties (saved with the workflow), so it shows again after a tab
//   switch or a page reload; while a node runs, the status lines the server sends (event "prequant.status", see
//   nodes/status.py: connecting, downloading with bytes and rate, checking, loading, verifying) show on it with the
//   time waited, and a failure shows as its message's first sentence and its fix. Panels grow the node when their
//   content needs more room (after a run, and when the node is narrowed).
// - Every node of the pack: inputs the server marks `advanced` fold on the classic canvas too (foldAdvanced).
//
// Everything a file supplies is inserted with textContent, never as HTML: names come from strangers' files.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

const INFO_CLASS = "PrequantInfo";
const LOADER_CLASS = "PrequantLoadTransformer";
const ENCODER_CLASS = "PrequantLoadTextEncoder";
const RESULT_PROP = "prequant_last_result"; // node property: the last result, kept with the workflow
const STATUS_EVENT = "prequant.status";
const INFO_NONE = "(none: use path)";
const LOADER_NONE = "(none: use path or hub_repo)";
// Default widths at which every widget's label and value show in full (the loader's file names are long).
const MIN_WIDTH = { [INFO_CLASS]: 460, [LOADER_CLASS]: 400, [ENCODER_CLASS]: 400, PrequantBuildCheckpoint: 360 };

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
.prequant-status { color: #ffd479; }
.prequant-status .prequant-elapsed { opacity: 0.7; }
.prequant-failed { color: #ffb3b3; font-weight: bold; }
.prequant-fix { color: var(--input-text, #ddd); font-weight: normal; margin-top: 2px; }
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
  if (text !== undefined && text !== null) e.textContent = typeof text === "object" ? JSON.stringify(text) : String(text);
  return e;
}

function humanBytes(n) {
  n = Number(n) || 0;
  for (const [unit, div] of [["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]]) {
    if (Math.abs(n) >= div) return `${(n / div).toFixed(2)} ${unit}`;
  }
  return `${n} B`;
}

// A saved result comes back from a workflow file, which anyone may have edited: every part is checked for its shape.
const list = (v) => (Array.isArray(v) ? v : []);

// The report as DOM: verdict block, then the (label, value) rows the Python side chose (Report.rows()).
export function renderReport(container, report) {
  container.replaceChildren();
  report = report && typeof report === "object" ? report : {};
  const verdict = report.verdict && typeof report.verdict === "object" ? report.verdict
    : { ok: !!report.valid, reasons: report.reasons };
  const v = el("div", `prequant-verdict ${verdict.ok ? "prequant-valid" : "prequant-invalid"}`,
    typeof verdict.summary === "string" ? verdict.summary : (verdict.ok ? "VALID" : "INVALID"));
  v.dataset.verdict = verdict.ok ? "valid" : "invalid";
  const reasons = list(verdict.reasons);
  if (!verdict.ok && reasons.length) {
    const ul = el("ul", "prequant-reasons");
    for (const r of reasons) ul.appendChild(el("li", null, r));
    v.appendChild(ul);
  }
  container.appendChild(v);
  const table = el("table", "prequant-table");
  for (const row of list(report.rows)) {
    if (!Array.isArray(row)) continue;
    const tr = el("tr");
    tr.appendChild(el("th", null, row[0]));
    tr.appendChild(el("td", null, row[1]));
    table.appendChild(tr);
  }
  container.appendChild(table);
  for (const n of list(report.notes)) container.appendChild(el("div", "prequant-note", n));
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

// Grow the node (never shrink it) until the panel shows all its content without scrolling: after a result arrives,
// and whenever the node is resized (a narrower node wraps the table into more lines).
function fitToContent(node, div) {
  const grow = () => {
    const missing = div.scrollHeight - div.clientHeight;
    if (missing > 1) node.setSize([node.size[0], node.size[1] + missing + 4]);
    node.setDirtyCanvas?.(true, true);
  };
  requestAnimationFrame(() => { grow(); requestAnimationFrame(grow); });
}

function reflowOnResize(node, div) {
  const onResize = node.onResize;
  node.onResize = function () {
    const r = onResize?.apply(this, arguments);
    fitToContent(this, div);
    return r;
  };
}

function keepResult(node, value) {
  node.properties ??= {};
  node.properties[RESULT_PROP] = value;
  // the workflow changed (it now carries the result): let the front end persist it for a reload
  app.extensionManager?.workflow?.activeWorkflow?.changeTracker?.checkState?.();
}

function restoreOnConfigure(node, show) {
  const onConfigure = node.onConfigure;
  node.onConfigure = function (info) {
    const r = onConfigure?.apply(this, arguments);
    const kept = info?.properties?.[RESULT_PROP];
    if (kept && typeof kept === "object") show(kept);
    return r;
  };
}

// While a node runs: the server's status line, with the seconds waited; a failure as its first sentence and its fix.
const running = new Map(); // node id -> {node, div, timer, since, text}

function showStatus(node, div, text) {
  let st = running.get(node.id);
  if (!st) {
    st = { since: Date.now() };
    st.timer = setInterval(() => paintStatus(st), 1000);
    running.set(node.id, st);
  }
  Object.assign(st, { node, div, text });
  paintStatus(st);
}

function paintStatus(st) {
  const line = el("div", "prequant-status", st.text);
  const secs = Math.round((Date.now() - st.since) / 1000);
  if (secs >= 1) line.appendChild(el("span", "prequant-elapsed", ` · ${secs} s`));
  st.div.replaceChildren(line);
  st.div.dataset.state = "running";
}

function stopStatus(id) {
  const st = running.get(id);
  if (st) clearInterval(st.timer);
  running.delete(id);
  return st;
}

function showFailure(div, message) {
  const lines = String(message || "").split("\n").map((l) => l.trim()).filter(Boolean);
  const fix = lines.find((l) => l.startsWith("Fix: "));
  div.replaceChildren(el("div", "prequant-failed", `Failed: ${lines[0] || "see the error message"}`));
  if (fix) div.appendChild(el("div", "prequant-fix", fix));
  div.dataset.state = "failed";
}

function setupInfo(node) {
  const { div } = addPanel(node, "prequant_report", "prequant-info",
    "Run the workflow (Queue) to inspect the file.", 60);
  node.prequantPanel = div;
  const show = (report) => {
    node.prequantReport = report;
    renderReport(div, report);
    div.dataset.state = "done";
    fitToContent(node, div);
  };
  const onExecuted = node.onExecuted;
  node.onExecuted = function (output) {
    onExecuted?.apply(this, arguments);
    const report = output?.prequant_info?.[0];
    if (!report) return;
    stopStatus(node.id);
    const { path, ...kept } = report; // the table shows the file name; the absolute path is not kept
    keepResult(node, kept);
    show(report);
  };
  restoreOnConfigure(node, show);
  reflowOnResize(node, div);
}

// The first line of a loader's result (scheme, size in memory, saving against the dense model) and its last (the
// file, and where it was downloaded from): the transformer's and the text encoder's panels share them.
function appendSize(d, s, scheme) {
  const line = el("div");
  line.appendChild(el("span", "prequant-scheme", scheme));
  const saving = s.dense_bytes > 0 ? ` (dense ${humanBytes(s.dense_bytes)}, ` +
    `${(100 * (1 - s.size_bytes / s.dense_bytes)).toFixed(1)} % smaller)` : "";
  line.appendChild(document.createTextNode(` · ${humanBytes(s.size_bytes)} in memory${saving}`));
  d.appendChild(line);
}

function appendLocation(d, s) {
  if (!s.location) return;
  const from = s.source ? ` (${s.downloaded ? "downloaded" : "earlier download"} from ${String(s.source).slice(4)})` : "";
  d.appendChild(el("div", "prequant-note prequant-location", `File: ${s.location}${from}`));
}

export function renderLoaded(d, s) {
  d.replaceChildren();
  appendSize(d, s, s.scheme);
  d.appendChild(el("div", "prequant-note",
    `${s.family} · ${s.quantized_layers} quantized layers · ${s.file} (${s.container}, ${s.layout} keys)`));
  appendLocation(d, s);
  d.dataset.scheme = s.scheme;
  d.dataset.state = "done";
}

// Load Prequant Text Encoder's result (nodes/te_node.py summary): the encoder, its size in memory against the dense
// bf16 encoder, where the tokenizer came from, where the file is.
export function renderEncoder(d, s) {
  d.replaceChildren();
  appendSize(d, s, s.scheme ?? "fp8");
  d.appendChild(el("div", "prequant-note",
    `${s.encoder} · ${s.family} ${s.component} · ${s.fp8_tensors} float8 weights · ${s.file} (${s.container})`));
  if (s.tokenizer) d.appendChild(el("div", "prequant-note", `Tokenizer: ${s.tokenizer}`));
  appendLocation(d, s);
  d.dataset.scheme = s.scheme ?? "fp8";
  d.dataset.state = "done";
}

function setupLoader(node, render = renderLoaded, what = "what was loaded") {
  // The panel is there from the start (its place in the layout does not change when a result arrives).
  const panel = addPanel(node, "prequant_loaded", "prequant-loaded",
    `Queue the workflow: ${what}, and from where, shows here.`, 84);
  node.prequantPanel = panel.div;
  const show = (s) => {
    node.prequantSummary = s;
    render(panel.div, s);
    fitToContent(node, panel.div);
  };
  const onExecuted = node.onExecuted;
  node.onExecuted = function (output) {
    onExecuted?.apply(this, arguments);
    const s = output?.prequant?.[0];
    if (!s) return;
    stopStatus(node.id);
    keepResult(node, s);
    show(s);
  };
  restoreOnConfigure(node, show);
  reflowOnResize(node, panel.div);
}

function onStatus(event) {
  const { node: id, text } = event.detail ?? {};
  const node = app.graph?.getNodeById?.(id) ?? app.graph?.getNodeById?.(Number(id));
  if (!node?.prequantPanel || typeof text !== "string") return;
  showStatus(node, node.prequantPanel, text);
}

function onExecutionError(event) {
  const d = event.detail ?? {};
  const node = app.graph?.getNodeById?.(d.node_id) ?? app.graph?.getNodeById?.(Number(d.node_id));
  onExecutionEnd(); // other nodes that were still waiting say they stopped
  if (node?.prequantPanel) {
    showFailure(node.prequantPanel, d.exception_message);
    fitToContent(node, node.prequantPanel);
  }
}

function onExecutionEnd() {
  for (const id of [...running.keys()]) {
    const st = stopStatus(id);
    if (st?.div?.dataset.state === "running") {
      st.div.replaceChildren(el("div", "prequant-placeholder", "Stopped."));
      st.div.dataset.state = "stopped";
    }
  }
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
    // Info's first entry names only its own inputs now; older workflows carry the loader's
    const ck = cls === INFO_CLASS ? this.widgets?.find((w) => w.name === "checkpoint") : null;
    if (ck && ck.value === LOADER_NONE) ck.value = INFO_NONE;
    return r;
  };
}

// The server marks the inputs a first-time user does not set `advanced`. ComfyUI's front ends (1.32 of ComfyUI
// 0.3.75 as 1.58) carry that to the widget's options only, which 1.58 folds in Nodes 2.0 and its side panel; on the
// classic canvas, their default, a widget folds when its own `advanced` is set, which neither derives from the
// input's spec. Setting it here gives the canvas the small node, and the node's menu its "Show Advanced" /
// "Hide Advanced". A front end without that toggle draws every input as before; the values are saved and queued
// either way (tests/project/test_browser_fold.py).
function foldAdvanced(node) {
  if (typeof node.toggleAdvanced !== "function") return;
  let folded = false;
  for (const w of node.widgets ?? []) {
    // (reading w.advanced says true already: it is true when any surface folds it)
    if (w.options?.advanced) { w.advanced = true; folded = true; }
  }
  if (folded) node.setSize?.([node.size[0], node.computeSize()[1]]);
}

app.registerExtension({
  name: "ComfyUI-Prequant.Info",
  setup() {
    api.addEventListener(STATUS_EVENT, onStatus);
    api.addEventListener("execution_error", onExecutionError);
    api.addEventListener("execution_success", onExecutionEnd);
    api.addEventListener("execution_interrupted", onExecutionEnd);
  },
  async nodeCreated(node) {
    const cls = node.comfyClass || node.constructor?.comfyClass;
    if (typeof cls === "string" && cls.startsWith("Prequant")) foldAdvanced(node);
    if (OLD_LAYOUTS[cls]) setupLegacyInputs(node, cls);
    if (cls === INFO_CLASS) setupInfo(node);
    else if (cls === LOADER_CLASS) setupLoader(node);
    else if (cls === ENCODER_CLASS) setupLoader(node, renderEncoder, "which text encoder was loaded");
    if (MIN_WIDTH[cls] && node.size[0] < MIN_WIDTH[cls]) node.setSize([MIN_WIDTH[cls], node.size[1]]);
  },
});
