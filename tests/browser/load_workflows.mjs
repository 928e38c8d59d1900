// Loads workflows into the real ComfyUI front end in headless Chromium (Debian's /usr/bin/chromium), for
// tests/project/test_browser.py, and reports what the front end made of each: missing node types and missing models it
// would warn about (its own hooks, app.showMissingNodesError / app.showMissingModelsError), toasts (workflow schema
// validation alerts), every node's widget values by name, and the workflow and prompt it would save / queue.
//
//   node load_workflows.mjs '<json>'   with {url, workflows: [{name, workflow}], out, chromium, userDataDir, timeoutMs}
import { launch, openComfy, run } from "./launch.mjs";

const cfg = JSON.parse(process.argv[2]);
const timeout = cfg.timeoutMs ?? 90000;
const log = [];
const result = { ok: false, console: log, workflows: {} };

const context = await launch(cfg, timeout);
await run(cfg, context, result, async () => {
  const page = await openComfy(context, cfg, log, timeout);
  await page.evaluate(() => {
    const app = window.comfyAPI.app.app;
    window.__pq = { missingNodes: [], missingModels: [] };
    app.showMissingNodesError = (types) => window.__pq.missingNodes.push(...types);
    app.showMissingModelsError = (models) => window.__pq.missingModels.push(...models);
  });
  for (const { name, workflow } of cfg.workflows) {
    const start = log.length;
    await page.evaluate(async (wf) => {
      window.__pq.missingNodes = [];
      window.__pq.missingModels = [];
      document.querySelectorAll(".p-toast-message").forEach((e) => e.remove());
      await window.comfyAPI.app.app.loadGraphData(wf);
    }, workflow);
    await page.waitForFunction((n) => window.comfyAPI.app.app.graph.nodes.length === n, workflow.nodes.length);
    await page.waitForTimeout(300);
    const r = await page.evaluate(async () => {
      const app = window.comfyAPI.app.app;
      const nodes = app.graph.nodes.map((n) => ({
        id: Number(n.id), type: n.type, comfyClass: n.comfyClass ?? null, hasErrors: !!n.has_errors,
        registered: !!window.LiteGraph?.registered_node_types?.[n.type] || !!n.constructor?.nodeData || !!n.isVirtualNode,
        widgets: Object.fromEntries((n.widgets ?? []).filter((w) => w.serialize !== false).map((w) => [w.name, w.value])),
        // what the node draws by default: the front end folds inputs marked advanced ("Show Advanced" unfolds)
        shown: (n.widgets ?? []).filter((w) => w.serialize !== false && !w.hidden
          && (typeof n.isWidgetVisible === "function" ? n.isWidgetVisible(w) : true)).map((w) => w.name),
        advanced: (n.widgets ?? []).filter((w) => w.advanced || w.options?.advanced).map((w) => w.name),
        height: n.size[1],
        // the node menu's "Show Advanced" (front ends with a canvas toggle): what it draws then, and its height
        unfolded: typeof n.toggleAdvanced === "function" && n.widgets?.some((w) => w.advanced) ? (() => {
          n.toggleAdvanced();
          const r = { shown: n.widgets.filter((w) => w.serialize !== false && !w.hidden && n.isWidgetVisible(w))
            .map((w) => w.name), height: n.size[1] };
          n.toggleAdvanced();
          return r;
        })() : null,
      }));
      const p = await app.graphToPrompt();
      return {
        nodes,
        missingNodes: window.__pq.missingNodes.map((t) => (typeof t === "string" ? t : t?.type ?? JSON.stringify(t))),
        missingModels: window.__pq.missingModels.map((m) => ({ name: m.name, url: m.url, directory: m.directory })),
        toasts: [...document.querySelectorAll(".p-toast-message")].map((e) => e.innerText),
        saved: JSON.stringify(app.graph.serialize()),
        prompt: JSON.stringify(p.output),
        promptWorkflow: JSON.stringify(p.workflow),
      };
    });
    r.console = log.slice(start);
    result.workflows[name] = r;
  }
});
