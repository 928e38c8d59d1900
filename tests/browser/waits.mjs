// What the loader node says while a user waits, in the real front end (headless Debian Chromium), for
// tests/project/test_browser.py (a Hub download from the slowed loopback Hub; a run against a Hub that cannot be reached).
//
//   node waits.mjs '<json>'   with {url, workflow, loaderId, runs: [{inputs}], out, shotDir, shotName,
//                             chromium, userDataDir, timeoutMs, show}
// ``show``: after the runs, a node output handed to the node as the front end hands one over (onExecuted), and the
// panel read back (a result the test server cannot produce).
//
// Every 100 ms the loader's panel text is sampled (what is on screen), and every "prequant.status" event the page
// receives is logged; after each run it reads ComfyUI's own error dialog too.
import { launch, openComfy, run } from "./launch.mjs";

const cfg = JSON.parse(process.argv[2]);
const timeout = cfg.timeoutMs ?? 120000;
const log = [];
const result = { ok: false, console: log, runs: [] };

const context = await launch(cfg, timeout);
await run(cfg, context, result, async () => {
  const page = await openComfy(context, cfg, log, timeout);
  await page.evaluate(async (wf) => { await window.comfyAPI.app.app.loadGraphData(wf); }, cfg.workflow);
  await page.waitForFunction((n) => window.comfyAPI.app.app.graph.nodes.length === n, cfg.workflow.nodes.length);
  await page.keyboard.press("Escape");

  for (const [i, run] of cfg.runs.entries()) {
    await page.evaluate(({ id, inputs }) => {
      const app = window.comfyAPI.app.app;
      const node = app.graph.getNodeById(id);
      for (const [k, v] of Object.entries(inputs)) node.widgets.find((w) => w.name === k).value = v;
      window.__pqSeen = [];
      window.__pqEvents = [];
      window.comfyAPI.api.api.addEventListener("prequant.status", (e) => window.__pqEvents.push(e.detail));
      const sample = () => {
        const t = node.prequantPanel?.innerText ?? "";
        if (window.__pqSeen[window.__pqSeen.length - 1] !== t) window.__pqSeen.push(t);
      };
      window.__pqSampler = setInterval(sample, 100);
    }, { id: cfg.loaderId, inputs: run.inputs });
    await page.evaluate(async () => { await window.comfyAPI.app.app.queuePrompt(0, 1); });
    await page.waitForFunction((id) => {
      const s = window.comfyAPI.app.app.graph.getNodeById(id)?.prequantPanel?.dataset.state;
      return s === "done" || s === "failed";
    }, cfg.loaderId);
    await page.waitForTimeout(1000); // the error dialog, if any
    const r = await page.evaluate((id) => {
      clearInterval(window.__pqSampler);
      const p = window.comfyAPI.app.app.graph.getNodeById(id).prequantPanel;
      // ComfyUI's own error display: a dialog in the 0.3.x front ends, a toast or a side panel in newer ones
      const dialogs = [...document.querySelectorAll(".p-dialog, [role='dialog'], .p-toast-message, [role='alert'], " +
        "[role='status'], [class*='toast' i]")]
        .map((d) => d.innerText).filter((t) => t && t.trim());
      return { seen: window.__pqSeen, events: window.__pqEvents, final: p.innerText, state: p.dataset.state,
        dialogs };
    }, cfg.loaderId);
    await page.screenshot({ path: `${cfg.shotDir}/${cfg.shotName}-${i + 1}.png` });
    result.runs.push(r);
    for (let k = 0; k < 3 && await page.locator(".p-dialog-mask").count(); k++) {
      await page.keyboard.press("Escape");
      await page.waitForTimeout(200);
    }
  }
  if (cfg.show) {
    result.shown = await page.evaluate(({ id, output }) => {
      const node = window.comfyAPI.app.app.graph.getNodeById(id);
      node.onExecuted(output);
      const p = node.prequantPanel;
      return { text: p.innerText, state: p.dataset.state, kept: node.properties?.prequant_last_result ?? null };
    }, { id: cfg.loaderId, output: cfg.show });
    await page.waitForTimeout(300);
    await page.screenshot({ path: `${cfg.shotDir}/${cfg.shotName}-shown.png` });
  }
});
