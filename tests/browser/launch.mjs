// Headless Chromium (Debian's /usr/bin/chromium, no downloaded browser) as every browser script here starts it:
// the flags keep it off the network (this machine's closed network refuses its background connections) and the
// viewport is the 1600x1000 the layout assertions are made at.
import fs from "node:fs";
import { chromium } from "playwright-core";

export const VIEWPORT = { width: 1600, height: 1000 };

export function launch(cfg, timeout) {
  return chromium.launchPersistentContext(cfg.userDataDir, {
    executablePath: cfg.chromium,
    headless: true,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    viewport: VIEWPORT,
    timeout,
  });
}

// In the page: the front end is up, this pack's extension was imported (/extensions/ComfyUI-Prequant/prequant.js),
// and the start-up workflow is open, so loading ours cannot race the front end's own restore.
export const frontEndReady = () => {
  const app = window.comfyAPI?.app?.app;
  return !!(app?.graph && app.extensions?.some((e) => e.name === "ComfyUI-Prequant.Info") &&
    app.extensionManager?.workflow?.activeWorkflow);
};

// The first page of `context`, its console and page errors collected into `log`, once the front end is ready.
export async function openComfy(context, cfg, log, timeout) {
  const page = context.pages()[0] ?? await context.newPage();
  page.setDefaultTimeout(timeout);
  page.on("console", (m) => log.push(`${m.type()}: ${m.text()}`.slice(0, 500)));
  page.on("pageerror", (e) => log.push(`pageerror: ${e.message}`.slice(0, 500)));
  await page.goto(cfg.url, { waitUntil: "domcontentloaded" });
  await page.waitForFunction(frontEndReady);
  return page;
}

// Put node `id` at zoom 1 clear of the side bar (left) and the tab bar and breadcrumb (top); returns the page
// rectangle that holds it, for a screenshot clip.
export function frameNode(page, id) {
  return page.evaluate((id) => {
    const app = window.comfyAPI.app.app;
    const b = app.graph.getNodeById(id).boundingRect;
    app.canvas.ds.scale = 1;
    app.canvas.ds.offset = [-b[0] + 100, -b[1] + 170];
    app.canvas.setDirty(true, true);
    const rect = app.canvas.canvas.getBoundingClientRect();
    return { x: rect.left + 90, y: rect.top + 160, width: Math.min(b[2] + 20, 1500), height: Math.min(b[3] + 20, 830) };
  }, id);
}

// A script's body, then, whatever happened: `result` written to cfg.out (by `save` where given) for the Python side
// to read, also after a failure (with a screenshot of the page at `failedShot`, where given), the browser closed,
// and the exit status 0 or 1.
export async function run(cfg, context, result, work, { failedShot, save } = {}) {
  try {
    await work();
    result.ok = true;
  } catch (e) {
    result.error = String(e?.stack || e).slice(0, 4000);
    try {
      const page = context.pages()[0];
      if (page && failedShot) await page.screenshot({ path: failedShot });
    } catch {}
  } finally {
    if (save) save(); else fs.writeFileSync(cfg.out, JSON.stringify(result, null, 2));
    await context.close();
  }
  process.exit(result.ok ? 0 : 1);
}
