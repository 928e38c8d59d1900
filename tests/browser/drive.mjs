// Drives the real ComfyUI front end in headless Chromium (Debian's /usr/bin/chromium) for tests/project/test_browser.py.
//
//   node drive.mjs '<json>'   with {url, workflow, screenshot, out, chromium, userDataDir, timeoutMs}
//
// Loads `workflow` through the page's own app.loadGraphData, queues it with app.queuePrompt (so this page's
// websocket receives the "executed" messages), waits until every Prequant Info node shows its verdict and every
// Load Prequant Transformer shows its loaded summary, then writes what the page shows (DOM text, classes and the
// node widget values) to `out` and a screenshot to `screenshot`. Exit 0 on success, 1 with a message otherwise;
// the Python test asserts on the JSON.
import fs from "node:fs";
import { frameNode, launch, openComfy, run } from "./launch.mjs";

const cfg = JSON.parse(process.argv[2]);
const timeout = cfg.timeoutMs ?? 90000;
const log = [];
const result = { ok: false, console: log };

function save() {
  fs.writeFileSync(cfg.out, JSON.stringify(result, null, 2));
}

const context = await launch(cfg, timeout);
await run(cfg, context, result, async () => {
  const page = await openComfy(context, cfg, log, timeout);
  result.extensionLoaded = true;

  await page.evaluate(async (wf) => {
    const app = window.comfyAPI.app.app;
    await app.loadGraphData(wf);
  }, cfg.workflow);
  await page.waitForFunction((n) => {
    const nodes = window.comfyAPI.app.app.graph.nodes;
    return nodes.length === n && nodes.every((x) => x.comfyClass);
  }, cfg.workflow.nodes.length);
  // Inputs set by name as well (a node that gained inputs since the workflow was saved keeps the right values).
  result.missingWidgets = await page.evaluate((widgets) => {
    const app = window.comfyAPI.app.app;
    const missing = [];
    for (const [id, values] of Object.entries(widgets || {})) {
      const node = app.graph.getNodeById(Number(id));
      for (const [name, value] of Object.entries(values)) {
        const w = node?.widgets?.find((x) => x.name === name);
        if (w) w.value = value; else missing.push(`${id}.${name}`);
      }
    }
    return missing;
  }, cfg.widgets);
  // Close anything the front end may have opened over the canvas (first-run dialogs, missing-model prompts).
  await page.keyboard.press("Escape");

  const expected = await page.evaluate(() => {
    const app = window.comfyAPI.app.app;
    const nodes = app.graph.nodes;
    return {
      info: nodes.filter((n) => n.comfyClass === "PrequantInfo").map((n) => Number(n.id)),
      loader: nodes.filter((n) => n.comfyClass === "PrequantLoadTransformer").map((n) => Number(n.id)),
      placeholders: [...document.querySelectorAll(".prequant-info .prequant-placeholder")].map((e) => e.textContent),
    };
  });
  result.expected = expected;

  await page.evaluate(async () => { await window.comfyAPI.app.app.queuePrompt(0, 1); });

  await page.waitForFunction((exp) => {
    const app = window.comfyAPI.app.app;
    const nodes = exp.info.map((id) => app.graph.getNodeById(id));
    const loaders = exp.loader.map((id) => app.graph.getNodeById(id));
    return nodes.every((n) => n?.prequantReport) && loaders.every((n) => n?.prequantSummary) &&
      document.querySelectorAll(".prequant-verdict").length >= exp.info.length &&
      document.querySelectorAll(".prequant-loaded [class='prequant-scheme']").length >= exp.loader.length;
  }, expected);

  // Frame the nodes for the screenshot, then let the DOM widgets follow the canvas.
  await page.evaluate(() => {
    const app = window.comfyAPI.app.app;
    app.canvas.ds.scale = 0.8;
    app.canvas.ds.offset = [110, 190];
    app.graph.setDirtyCanvas(true, true);
  });
  for (let i = 0; i < 3 && await page.locator(".p-dialog-mask").count(); i++) {
    await page.keyboard.press("Escape");
    await page.waitForTimeout(300);
  }
  await page.waitForTimeout(800);

  result.nodes = await page.evaluate(() => {
    const app = window.comfyAPI.app.app;
    const out = [];
    for (const n of app.graph.nodes) {
      const w = n.widgets?.find((x) => x.name === "prequant_report" || x.name === "prequant_loaded");
      const elm = w?.element;
      const verdict = elm?.querySelector(".prequant-verdict");
      out.push({
        id: Number(n.id), type: n.comfyClass, title: n.title,
        widgetValue: w ? (w.value ?? null) : null,
        domText: elm ? elm.innerText : null,
        verdictClass: verdict ? verdict.className : null,
        verdictAttr: verdict ? verdict.dataset.verdict : null,
        verdictColor: verdict ? getComputedStyle(verdict).backgroundColor : null,
        reasons: elm ? [...elm.querySelectorAll(".prequant-reasons li")].map((li) => li.textContent) : [],
        rows: elm ? [...elm.querySelectorAll("tr")].map((tr) => [...tr.children].map((c) => c.textContent)) : [],
        visible: elm ? elm.getBoundingClientRect().width > 0 && getComputedStyle(elm).display !== "none" : false,
        // what a user would click at the top of the panel really is the panel (no dialog or node over it)
        onTop: (() => {
          const target = verdict || elm;
          if (!target) return false;
          const r = target.getBoundingClientRect();
          const hit = document.elementFromPoint(r.left + r.width / 2, r.top + Math.min(8, r.height / 2));
          return !!hit && elm.contains(hit);
        })(),
        loadedScheme: elm?.dataset?.scheme ?? null,
        summary: n.prequantSummary ?? null,
      });
    }
    return out;
  });
  await page.screenshot({ path: cfg.screenshot, fullPage: false });

  // Each node after the run, at zoom 1 (clear of the side bar and the tab bar), as test artifacts.
  result.nodeShots = [];
  if (cfg.shotDir) {
    fs.mkdirSync(cfg.shotDir, { recursive: true });
    for (const n of result.nodes) {
      const clip = await frameNode(page, n.id);
      await page.evaluate(() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r))));
      await page.waitForTimeout(300);
      const file = `${cfg.shotDir}/info-workflow-node-${n.id}-${n.type}.png`;
      await page.screenshot({ path: file, clip });
      result.nodeShots.push(file);
    }
  }

  // Narrowing an Info node after a run: the table wraps into more lines and the node grows to show all of them.
  const panelState = (id) => {
    const n = window.comfyAPI.app.app.graph.getNodeById(id);
    const p = n.prequantPanel;
    const pr = p.getBoundingClientRect();
    const rows = [...p.querySelectorAll("tr")];
    return {
      size: [...n.size], scrollHidden: p.scrollHeight - p.clientHeight,
      lastRowInside: rows.length ? rows[rows.length - 1].getBoundingClientRect().bottom <= pr.bottom + 1 : null,
      text: p.innerText, state: p.dataset.state ?? null,
      rows: rows.map((tr) => [...tr.children].map((c) => c.textContent)),
    };
  };
  result.resize = { before: await page.evaluate(panelState, expected.info[0]) };
  await page.evaluate((id) => {
    const app = window.comfyAPI.app.app;
    const n = app.graph.getNodeById(id);
    app.canvas.ds.scale = 1;
    app.canvas.ds.offset = [-n.pos[0] + 100, -n.pos[1] + 170];
    n.setSize([300, n.size[1]]); // what dragging the node's corner does
    app.canvas.setDirty(true, true);
  }, expected.info[0]);
  await page.evaluate(() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r))));
  await page.waitForTimeout(600);
  result.resize.after = await page.evaluate(panelState, expected.info[0]);

  // The last results show again after a tab switch and after a reload.
  const shown = async () => Object.fromEntries(await Promise.all(
    [...expected.info, ...expected.loader].map(async (id) => [id, await page.evaluate(panelState2, id)])));
  const panelState2 = (id) => {
    const p = window.comfyAPI.app.app.graph.getNodeById(id)?.prequantPanel;
    return p ? { text: p.innerText, state: p.dataset.state ?? null,
      verdict: p.querySelector(".prequant-verdict")?.dataset.verdict ?? null } : null;
  };
  result.kept = { before: await shown() };
  await page.evaluate(() => window.comfyAPI.app.app.extensionManager.command.execute("Comfy.NewBlankWorkflow"));
  await page.waitForFunction((id) => !window.comfyAPI.app.app.graph.getNodeById(id), expected.info[0]);
  await page.evaluate(() => window.comfyAPI.app.app.extensionManager.command.execute("Workspace.PreviousOpenedWorkflow"));
  await page.waitForFunction((id) => !!window.comfyAPI.app.app.graph.getNodeById(id), expected.info[0]);
  await page.waitForTimeout(600);
  result.kept.afterSwitch = await shown();
  await page.reload({ waitUntil: "domcontentloaded" });
  await page.waitForFunction((id) => !!window.comfyAPI?.app?.app?.graph?.getNodeById?.(id) &&
    window.comfyAPI.app.app.extensions?.some((e) => e.name === "ComfyUI-Prequant.Info"), expected.info[0]);
  await page.waitForTimeout(800);
  result.kept.afterReload = await shown();
}, { failedShot: cfg.screenshot?.replace(/\.png$/, "-failed.png"), save });
