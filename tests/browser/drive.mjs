// Drives the real ComfyUI front end in headless Chromium (Debian's /usr/bin/chromium) for tests/test_browser.py.
//
//   node drive.mjs '<json>'   with {url, workflow, screenshot, out, chromium, userDataDir, timeoutMs}
//
// Loads `workflow` through the page's own app.loadGraphData, queues it with app.queuePrompt (so this page's
// websocket receives the "executed" messages), waits until every Prequant Info node shows its verdict and every
// Load Prequant Transformer shows its loaded summary, then writes what the page shows (DOM text, classes and the
// node widget values) to `out` and a screenshot to `screenshot`. Exit 0 on success, 1 with a message otherwise;
// the Python test asserts on the JSON.
import fs from "node:fs";
import { chromium } from "playwright-core";

const cfg = JSON.parse(process.argv[2]);
const timeout = cfg.timeoutMs ?? 90000;
const log = [];
const result = { ok: false, console: log };

function save() {
  fs.writeFileSync(cfg.out, JSON.stringify(result, null, 2));
}

const context = await chromium.launchPersistentContext(cfg.userDataDir, {
  executablePath: cfg.chromium,
  headless: true,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  viewport: { width: 1600, height: 1000 },
  timeout,
});
try {
  const page = context.pages()[0] ?? await context.newPage();
  page.setDefaultTimeout(timeout);
  page.on("console", (m) => log.push(`${m.type()}: ${m.text()}`.slice(0, 500)));
  page.on("pageerror", (e) => log.push(`pageerror: ${e.message}`.slice(0, 500)));

  await page.goto(cfg.url, { waitUntil: "domcontentloaded" });
  // The app exists and this pack's extension was imported from /extensions/ComfyUI-Prequant/prequant.js.
  await page.waitForFunction(() => {
    const app = window.comfyAPI?.app?.app;
    // ...and the start-up workflow is open, so loading ours cannot race the front end's own restore.
    return !!(app?.graph && app.extensions?.some((e) => e.name === "ComfyUI-Prequant.Info") &&
      app.extensionManager?.workflow?.activeWorkflow);
  });
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
      info: nodes.filter((n) => n.comfyClass === "PrequantInfo").map((n) => n.id),
      loader: nodes.filter((n) => n.comfyClass === "PrequantLoadTransformer").map((n) => n.id),
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
        id: n.id, type: n.comfyClass, title: n.title,
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
  result.ok = true;
} catch (e) {
  result.error = String(e?.stack || e).slice(0, 4000);
  try {
    const page = context.pages()[0];
    if (page && cfg.screenshot) await page.screenshot({ path: cfg.screenshot.replace(/\.png$/, "-failed.png") });
  } catch {}
} finally {
  save();
  await context.close();
}
process.exit(result.ok ? 0 : 1);
