// The card pictures of ComfyUI's template browser (Workflow > Browse Templates shows example_workflows/<name>.jpg
// beside each JSON): each shipped workflow opened in the real front end, the whole graph fitted into the canvas as a
// user sees it after "fit view", the canvas alone (no side bar, tabs or banners) captured as a PNG per workflow.
// tools/make_thumbnails.py turns them into the JPEGs.
//
//   node thumbnails.mjs '<json>'   with {url, workflows: [{name, workflow}], outDir, out, chromium, userDataDir,
//                                  extraNodeDefs}   (node definitions of a newer ComfyUI, registered for the picture)
import path from "node:path";
import { launch, openComfy, run } from "./launch.mjs";

const cfg = JSON.parse(process.argv[2]);
const timeout = cfg.timeoutMs ?? 90000;
const log = [];
const result = { ok: false, console: log, shots: {} };
const context = await launch(cfg, timeout);
await run(cfg, context, result, async () => {
  const page = await openComfy(context, cfg, log, timeout);
  await page.evaluate(async (defs) => {  // a picture of the graph, not of the dialogs a first visit opens
    const app = window.comfyAPI.app.app;
    app.showMissingNodesError = () => {};
    app.showMissingModelsError = () => {};
    for (const [id, def] of Object.entries(defs ?? {})) {
      if (!window.LiteGraph?.registered_node_types?.[id]) await app.registerNodeDef(id, def);
    }
  }, cfg.extraNodeDefs);
  for (let i = 0; i < 3; i++) { await page.keyboard.press("Escape"); await page.waitForTimeout(200); }
  for (const { name, workflow } of cfg.workflows) {
    await page.evaluate(async (wf) => {
      document.querySelectorAll(".p-toast-message, .p-dialog-mask").forEach((e) => e.remove());
      await window.comfyAPI.app.app.loadGraphData(wf);
    }, workflow);
    await page.waitForFunction((n) => window.comfyAPI.app.app.graph.nodes.length === n, workflow.nodes.length);
    const clip = await page.evaluate(() => {
      const app = window.comfyAPI.app.app;
      const canvas = app.canvas;
      // the graph's bounding box, fitted with a margin (what the front end's "fit view" does)
      let [x0, y0, x1, y1] = [Infinity, Infinity, -Infinity, -Infinity];
      for (const n of app.graph.nodes) {
        const b = n.boundingRect;
        x0 = Math.min(x0, b[0]); y0 = Math.min(y0, b[1]);
        x1 = Math.max(x1, b[0] + b[2]); y1 = Math.max(y1, b[1] + b[3]);
      }
      const rect = canvas.canvas.getBoundingClientRect();
      const top = 110;  // below the tab bar and the breadcrumb
      const room = [rect.width - 100, rect.height - top - 20];
      const scale = Math.min(room[0] / (x1 - x0 + 40), room[1] / (y1 - y0 + 40), 1.2);
      canvas.ds.scale = scale;
      canvas.ds.offset = [-x0 + 20 + (room[0] / scale - (x1 - x0 + 40)) / 2 + 80 / scale, -y0 + 20 + top / scale];
      // full detail at any zoom: below ~60 % the canvas otherwise draws nodes as blank boxes (level of detail)
      try { canvas.min_font_size_for_lod = 1; } catch (e) { /* older front ends */ }
      canvas._lowQualityZoomThreshold = 0;
      canvas._isLowQuality = false;
      canvas.setDirty(true, true);
      canvas.draw(true, true);
      return { x: rect.left + 70, y: rect.top + top - 10, width: rect.width - 80, height: rect.height - top };
    });
    await page.evaluate(() => document.querySelectorAll(".p-toast-message, .p-dialog-mask").forEach((e) => e.remove()));
    await page.waitForTimeout(300);
    const file = path.join(cfg.outDir, `${name}.png`);
    await page.screenshot({ path: file, clip });
    result.shots[name] = file;
  }
});
