// Headless Chromium (Debian's /usr/bin/chromium, no downloaded browser) as every browser script here starts it:
// the flags keep it off the network (this machine's closed network refuses its background connections) and the
// viewport is the 1600x1000 the layout assertions are made at.
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
