"""Peak growth of this process's resident memory, sampled in a thread (the demo and the benchmarks share it)."""
from __future__ import annotations

import threading


class RssPeak:
    """Peak resident memory growth in bytes over the level when started, sampled every ``interval_s``."""

    def __init__(self, interval_s: float = 0.002):
        import psutil
        self.proc = psutil.Process()
        self.base = self.peak = self.proc.memory_info().rss
        self._interval = interval_s
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            self._stop.wait(self._interval)

    def growth(self) -> int:
        self.peak = max(self.peak, self.proc.memory_info().rss)
        return self.peak - self.base

    def mb(self) -> float:
        return self.growth() / 2**20

    def stop(self) -> int:
        self._stop.set()
        self._t.join()
        return self.growth()
