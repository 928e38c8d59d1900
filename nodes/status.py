"""What a node is doing while the user waits: short status lines sent to the browser (web/prequant.js shows them on
the node) and ComfyUI's own progress bar for byte counts.

Messages go out as the custom websocket event ``prequant.status`` ({node, text[, done, total]}) to the client that
queued the prompt, through ComfyUI's ``PromptServer``; without a server (headless use, tests) nothing is sent. Every
text is escaped: names in it come from files and repos.
"""
from __future__ import annotations

import time

from prequant_core.safe_text import escape
from prequant_core.units import human_bytes

EVENT = "prequant.status"
MIN_INTERVAL_S = 0.25  # byte updates at most four times a second (the last one always)


def _server():
    try:
        from server import PromptServer
    except ImportError:  # pragma: no cover - ComfyUI not importable: headless use
        return None
    return getattr(PromptServer, "instance", None)


class NodeStatus:
    """``say(text)`` for a stage (connecting, checking, loading); ``bytes(done, total)`` while downloading or
    reading, with the rate. ``node_id``: ComfyUI's UNIQUE_ID of the node; None sends nothing."""

    def __init__(self, node_id):
        self.node_id = None if node_id is None else str(node_id)
        self.label = ""
        self._bar = None
        self._start = None
        self._last = 0.0

    def _emit(self, data: dict) -> None:
        if self.node_id is None:
            return
        data = {"node": self.node_id, **data}
        ps = _server()
        if ps is not None:
            ps.send_sync(EVENT, data, getattr(ps, "client_id", None))

    def say(self, text: str) -> None:
        self.label = escape(text)
        self._start = None
        self._emit({"text": self.label})

    def bytes(self, done: int, total: int) -> None:
        """Also drives ComfyUI's progress bar on the node."""
        done, total = max(int(done), 0), max(int(total), 1)
        self._progress_bar(done, total)
        now = time.monotonic()
        if self._start is None:
            self._start, self._start_bytes = now, done
        if done < total and now - self._last < MIN_INTERVAL_S:
            return
        self._last = now
        elapsed = now - self._start
        rate = (done - self._start_bytes) / elapsed if elapsed > 0.5 else 0
        text = f"{self.label or 'downloading'}: {human_bytes(done)} of {human_bytes(total)}"
        if rate > 0:
            text += f", {human_bytes(int(rate))}/s"
        self._emit({"text": text, "done": done, "total": total})

    def tensors(self, done: int, total: int) -> None:
        """A count instead of bytes (quantizing the dense fallback tensor by tensor)."""
        done, total = max(int(done), 0), max(int(total), 1)
        self._progress_bar(done, total)
        now = time.monotonic()
        if done < total and now - self._last < MIN_INTERVAL_S:
            return
        self._last = now
        self._emit({"text": f"{self.label or 'working'}: {done} of {total} tensors", "done": done, "total": total})

    def _progress_bar(self, done: int, total: int) -> None:
        try:
            import comfy.utils
        except ImportError:  # pragma: no cover
            return
        if self._bar is None:
            self._bar = comfy.utils.ProgressBar(total)
        self._bar.update_absolute(min(done, total), total)
