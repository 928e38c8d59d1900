// Every shipped workflow in the real ComfyUI front end (headless Debian Chromium), for tests/project/test_browser.py:
// what a user sees when they open it and after the loader has run.
//
//   node workflows.mjs '<json>'   with {url, workflows: [{name, workflow, run: {loader input: value} for the run}],
//                                 shotDir, out, chromium, userDataDir, timeoutMs}
//
// For each workflow: load it as a user would (app.loadGraphData), measure every node's rendered box (LiteGraph's
// boundingRect, title included, in graph units) and where each DOM panel really is on the page, and how every
// widget's label and value fit the width they are drawn at (observed inside the front end's own drawTruncatingText
// while it draws each node at zoom 1); screenshot the workflow at the view it opens with. Then run the loader for
// real in the server (the loader and a PreviewAny sink, queued from this page so its websocket gets the node's
// messages; the text encoders and VAE the rest of the graph needs are not on the test server), measure again,
// screenshot the workflow and each node. After the last workflow: switch to a new tab and back, then reload the
// page, and read the loader's panel each time. Writes what it saw to `out`; the Python test asserts on it.
import fs from "node:fs";
import path from "node:path";
import { frameNode, frontEndReady, launch, openComfy, run } from "./launch.mjs";

const cfg = JSON.parse(process.argv[2]);
const timeout = cfg.timeoutMs ?? 90000;
const log = [];
const result = { ok: false, console: log, workflows: {}, shots: [] };

const context = await launch(cfg, timeout);

const ready = frontEndReady;

// In the page: every node's box, its DOM panel's box on the page and the canvas transform.
const measure = () => {
  const app = window.comfyAPI.app.app;
  const ds = app.canvas.ds;
  const rect = app.canvas.canvas.getBoundingClientRect();
  return {
    ds: { scale: ds.scale, offset: [...ds.offset] },
    nodes: app.graph.nodes.map((n) => {
      const panel = n.prequantPanel;
      const pr = panel?.getBoundingClientRect();
      const b = n.boundingRect;
      return {
        id: Number(n.id), type: n.type, title: n.title, box: [b[0], b[1], b[2], b[3]], size: [...n.size],
        // the node's box on the page (CSS px) at the current view, to compare with its panel's
        screen: [rect.left + (b[0] + ds.offset[0]) * ds.scale, rect.top + (b[1] + ds.offset[1]) * ds.scale,
          b[2] * ds.scale, b[3] * ds.scale],
        panel: pr && pr.width > 0 ? {
          rect: [pr.left, pr.top, pr.width, pr.height], text: panel.innerText, state: panel.dataset.state ?? null,
          scrolls: panel.scrollHeight - panel.clientHeight > 1,
        } : null,
        // points inside the node (corners inset, centre) where something else is on top: a sidebar, a dialog...
        covered: (() => {
          const [x, y, w, h] = [rect.left + (b[0] + ds.offset[0]) * ds.scale, rect.top + (b[1] + ds.offset[1]) * ds.scale,
            b[2] * ds.scale, b[3] * ds.scale];
          const pts = [[x + 12, y + 12], [x + w - 12, y + 12], [x + 12, y + h - 12], [x + w - 12, y + h - 12],
            [x + w / 2, y + h / 2]];
          return pts.filter(([px, py]) => {
            const hit = document.elementFromPoint(px, py);
            return !(hit === app.canvas.canvas || (panel && panel.contains(hit)));
          }).map(([px, py]) => {
            const hit = document.elementFromPoint(px, py);
            return [Math.round(px), Math.round(py), hit ? `${hit.tagName}.${hit.className}`.slice(0, 80) : "outside"];
          });
        })(),
        summary: n.prequantSummary ?? null,
        kept: n.properties?.prequant_last_result ?? null,
      };
    }),
  };
};

async function settle(page) {
  for (let i = 0; i < 3 && await page.locator(".p-dialog-mask").count(); i++) {
    await page.keyboard.press("Escape");
    await page.waitForTimeout(200);
  }
  await page.evaluate(() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r))));
  await page.waitForTimeout(400);
}

// Draw each node at zoom 1 and note, per widget, how its label and value fit (the front end's own arithmetic).
const widgetFits = () => {
  const app = window.comfyAPI.app.app;
  const out = {};
  for (const n of app.graph.nodes) {
    for (const w of n.widgets ?? []) {
      let p = Object.getPrototypeOf(w);
      while (p && !Object.prototype.hasOwnProperty.call(p, "drawTruncatingText")) p = Object.getPrototypeOf(p);
      if (!p || p.__prequantObserved) continue;
      const draw = p.drawTruncatingText;
      p.drawTruncatingText = function (args) {
        const { ctx, width, leftPadding = 5, rightPadding = 20 } = args;
        const m = this.constructor.margin ?? 15;
        const gap = this.constructor.labelValueGap ?? 5;
        const label = ctx.measureText(this.displayName ?? "").width;
        const value = ctx.measureText(String(this._displayValue ?? "")).width;
        const room = width - (m * 2 + leftPadding) - 2 * m - rightPadding; // as drawTruncatingText computes it
        this.__prequantFit = { label: this.displayName, value: String(this._displayValue ?? ""), room,
          needed: label + gap + value, fits: label + gap + value <= room };
        return draw.call(this, args);
      };
      p.__prequantObserved = true;
    }
  }
  const ds = app.canvas.ds;
  const saved = { scale: ds.scale, offset: [...ds.offset] };
  for (const n of app.graph.nodes) {
    for (const w of n.widgets ?? []) delete w.__prequantFit;
    ds.scale = 1;
    ds.offset = [-n.pos[0] + 60, -n.pos[1] + 80];
    app.canvas.draw(true, true);
    out[n.id] = (n.widgets ?? []).filter((w) => w.__prequantFit).map((w) => ({ name: w.name, ...w.__prequantFit }));
  }
  ds.scale = saved.scale;
  ds.offset = saved.offset;
  app.canvas.setDirty(true, true);
  return out;
};

async function shot(page, name, clip) {
  const file = path.join(cfg.shotDir, name.replace(/[^A-Za-z0-9_.-]+/g, "_") + ".png");
  await page.screenshot({ path: file, clip, fullPage: false });
  result.shots.push(file);
  return file;
}

await run(cfg, context, result, async () => {
  const page = await openComfy(context, cfg, log, timeout);
  fs.mkdirSync(cfg.shotDir, { recursive: true });

  let last = null;
  for (const { name, workflow, run } of cfg.workflows) {
    const base = name.replace(/\.json$/, "");
    const r = { name };
    await page.evaluate(async (wf) => { await window.comfyAPI.app.app.loadGraphData(wf); }, workflow);
    await page.waitForFunction((n) => window.comfyAPI.app.app.graph.nodes.length === n, workflow.nodes.length);
    await settle(page);
    r.fits = await page.evaluate(widgetFits);
    await settle(page);
    r.before = await page.evaluate(measure);
    r.shotBefore = await shot(page, `${base}`);

    // the run: the loader (with this workflow's run inputs) and a sink, queued from this page; /free first, so the
    // server's cache of the previous workflow's identical loader does not answer instead of a run
    const loaderId = await page.evaluate(async (run) => {
      await fetch("/free", { method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ unload_models: true, free_memory: true }) });
      await new Promise((r) => setTimeout(r, 1000));
      const app = window.comfyAPI.app.app;
      const api = window.comfyAPI.api.api;
      const loader = app.graph.nodes.find((n) => n.comfyClass === "PrequantLoadTransformer");
      for (const [k, v] of Object.entries(run)) {
        const w = loader.widgets.find((x) => x.name === k);
        if (w) w.value = v;
      }
      const p = await app.graphToPrompt();
      const id = String(loader.id);
      const output = { [id]: p.output[id], 99999: { class_type: "PreviewAny", inputs: { source: [id, 0] } } };
      await api.queuePrompt(0, { output, workflow: p.workflow });
      return loader.id;
    }, run ?? {});
    await page.waitForFunction((id) => {
      const n = window.comfyAPI.app.app.graph.getNodeById(id);
      return n?.prequantPanel?.dataset.state === "done" || n?.prequantPanel?.dataset.state === "failed";
    }, loaderId);
    await settle(page);
    r.after = await page.evaluate(measure);
    r.shotAfter = await shot(page, `${base}-after-run`);
    // each node after the run, at zoom 1
    r.nodeShots = [];
    for (const n of r.after.nodes) {
      const clip = await frameNode(page, n.id);
      await settle(page);
      r.nodeShots.push(await shot(page, `${base}-node-${n.id}-${n.type}`, clip));
    }
    result.workflows[name] = r;
    last = { name, loaderId };
  }

  // The last result shows again after a tab switch and after a page reload (kept with the workflow).
  const panelOf = (id) => {
    const n = window.comfyAPI.app.app.graph.getNodeById(id);
    const p = n?.prequantPanel;
    return p ? { text: p.innerText, state: p.dataset.state ?? null, scheme: p.dataset.scheme ?? null,
      visible: p.getBoundingClientRect().width > 0 } : null;
  };
  const persisted = { name: last.name };
  persisted.beforeSwitch = await page.evaluate(panelOf, last.loaderId);
  await page.evaluate(async () => {
    await window.comfyAPI.app.app.extensionManager.command.execute("Comfy.NewBlankWorkflow");
  });
  await page.waitForFunction((id) => !window.comfyAPI.app.app.graph.getNodeById(id), last.loaderId);
  persisted.otherTab = await page.evaluate(() => window.comfyAPI.app.app.graph.nodes.length);
  await page.evaluate(async () => {
    await window.comfyAPI.app.app.extensionManager.command.execute("Workspace.PreviousOpenedWorkflow");
  });
  await page.waitForFunction((id) => !!window.comfyAPI.app.app.graph.getNodeById(id), last.loaderId);
  await settle(page);
  persisted.afterSwitch = await page.evaluate(panelOf, last.loaderId);
  await page.reload({ waitUntil: "domcontentloaded" });
  await page.waitForFunction(ready);
  await page.waitForFunction((id) => !!window.comfyAPI.app.app.graph.getNodeById(id), last.loaderId);
  await settle(page);
  persisted.afterReload = await page.evaluate(panelOf, last.loaderId);
  persisted.shot = await shot(page, `${last.name.replace(/\.json$/, "")}-after-reload`);
  result.persisted = persisted;

  // This pack's nodes as a user adds them (fresh, default size): every label and value drawn in full.
  await page.evaluate(async () => {
    await window.comfyAPI.app.app.extensionManager.command.execute("Comfy.NewBlankWorkflow");
  });
  await page.waitForFunction((id) => !window.comfyAPI.app.app.graph.getNodeById(id), last.loaderId);
  result.fresh = await page.evaluate(() => {
    const app = window.comfyAPI.app.app;
    const added = [];
    let x = 40;
    for (const type of ["PrequantLoadTransformer", "PrequantInfo", "PrequantBuildCheckpoint"]) {
      const n = window.LiteGraph.createNode(type);
      n.pos = [x, 80];
      app.graph.add(n);
      added.push({ id: Number(n.id), type, size: [...n.size] });
      x += n.size[0] + 60;
    }
    return added;
  });
  await settle(page);
  result.freshFits = await page.evaluate(widgetFits);
  await settle(page);
  result.freshShot = await shot(page, "fresh-nodes");
}, { failedShot: path.join(cfg.shotDir, "failed.png") });
