// Measures what the real front end draws for each node of the given workflows (for tools/layout_workflows.py):
// the node's minimum size (computeSize, this pack's panels included) and, per widget, the node width at which its
// label and value are drawn in full (observed inside the front end's own drawTruncatingText, at zoom 1).
//
//   node measure_nodes.mjs '<json>'   with {url, files: [path], out, chromium, userDataDir, timeoutMs}
import fs from "node:fs";
import { launch, run } from "./launch.mjs";

const cfg = JSON.parse(process.argv[2]);
const context = await launch(cfg, cfg.timeoutMs ?? 120000);
const result = { ok: false, workflows: {} };
await run(cfg, context, result, async () => {
  const page = context.pages()[0] ?? await context.newPage();
  page.setDefaultTimeout(cfg.timeoutMs ?? 120000);
  await page.goto(cfg.url, { waitUntil: "domcontentloaded" });
  await page.waitForFunction(() => !!window.comfyAPI?.app?.app?.extensionManager?.workflow?.activeWorkflow &&
    window.comfyAPI.app.app.extensions?.some((e) => e.name === "ComfyUI-Prequant.Info"));
  for (const f of cfg.files) {
    const wf = JSON.parse(fs.readFileSync(f, "utf8"));
    await page.evaluate(async (wf) => { await window.comfyAPI.app.app.loadGraphData(wf); }, wf);
    await page.waitForFunction((n) => window.comfyAPI.app.app.graph.nodes.length === n, wf.nodes.length);
    await page.waitForTimeout(500);
    result.workflows[f] = await page.evaluate(() => {
      const app = window.comfyAPI.app.app;
      const out = [];
      for (const n of app.graph.nodes) {
        for (const w of n.widgets ?? []) {
          let p = Object.getPrototypeOf(w);
          while (p && !Object.prototype.hasOwnProperty.call(p, "drawTruncatingText")) p = Object.getPrototypeOf(p);
          if (!p || p.__prequantMeasured) continue;
          const draw = p.drawTruncatingText;
          p.drawTruncatingText = function (a) {
            const { ctx, width, leftPadding = 5, rightPadding = 20 } = a;
            const m = this.constructor.margin ?? 15, gap = this.constructor.labelValueGap ?? 5;
            const room = width - (m * 2 + leftPadding) - 2 * m - rightPadding;
            const need = ctx.measureText(this.displayName ?? "").width + gap +
              ctx.measureText(String(this._displayValue ?? "")).width;
            this.__prequantWidth = width - room + need;
            return draw.call(this, a);
          };
          p.__prequantMeasured = true;
        }
        app.canvas.ds.scale = 1;
        app.canvas.ds.offset = [-n.pos[0] + 100, -n.pos[1] + 170];
        app.canvas.draw(true, true);
        const widths = (n.widgets ?? []).map((w) => w.__prequantWidth ?? 0);
        out.push({ id: Number(n.id), type: n.type, min: [...n.computeSize()], width: Math.ceil(Math.max(0, ...widths)) });
      }
      return out;
    });
  }
});
