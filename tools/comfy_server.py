"""A real ComfyUI server on 127.0.0.1 with this pack installed, driven over HTTP like the browser does."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request

from .comfy_headless import COMFY, COMFY_PYTHON, ROOT, is_package_layout, link_pack  # noqa: F401  (ROOT: re-exported)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ComfyServer:
    def __init__(self, base_dir: str, *, port: int | None = None, env: dict | None = None, extra_args=(),
                 python: str = COMFY_PYTHON, cpu: bool = True):
        self.base_dir = os.path.abspath(base_dir)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, **(env or {})}
        self.extra_args = list(extra_args)
        self.python = python
        self.cpu = cpu  # False: ComfyUI picks its device (bench/gpu_check_comfy.py on a CUDA machine)
        self.proc = None
        self.log_path = os.path.join(self.base_dir, "server.log")

    def start(self, timeout: float = 120.0) -> "ComfyServer":
        if os.environ.get("PREQUANT_NO_COMFYUI") == "1":  # the core test tier (tests/no_comfyui.py)
            raise RuntimeError("ComfyUI is absent in the core test tier: this test belongs to the ComfyUI tier")
        for d in ("custom_nodes", "models", "input", "output", "temp", "user"):
            os.makedirs(os.path.join(self.base_dir, d), exist_ok=True)
        link_pack(self.base_dir)
        self._log = open(self.log_path, "ab")
        if is_package_layout():
            # ComfyUI 0.12.1's pip-installable layout: started as a module, in BASE (so no stray
            # extra_model_paths.yaml is read); its front end is not served (see scripts/test.sh)
            front = os.path.join(self.base_dir, "front_end_empty")
            os.makedirs(front, exist_ok=True)
            cmd, cwd = [self.python, "-m", "comfy.cmd.main", "--front-end-root", front], self.base_dir
        else:
            cmd, cwd = [self.python, "main.py"], COMFY
        self.proc = subprocess.Popen(
            [*cmd, *(["--cpu"] if self.cpu else []), "--listen", "127.0.0.1", "--port", str(self.port),
             "--base-directory", self.base_dir, "--disable-auto-launch", *self.extra_args],
            cwd=cwd, env=self.env, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ComfyUI exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                self.get("/system_stats", timeout=2)
                return self
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                time.sleep(0.5)
        raise RuntimeError(f"ComfyUI did not start in {timeout}s:\n{self.log_tail()}")

    def log_tail(self, n: int = 6000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if getattr(self, "_log", None):
            self._log.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def _request(self, path, data=None, timeout=30, method=None):
        body = None if data is None else json.dumps(data).encode()
        req = urllib.request.Request(self.url + path, data=body, method=method,
                                     headers={"Content-Type": "application/json"} if body else {})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
        return json.loads(raw) if raw else None

    def get(self, path, timeout=30):
        return self._request(path, timeout=timeout)

    def post(self, path, data, timeout=30):
        return self._request(path, data=data, timeout=timeout, method="POST")

    def queue(self, graph: dict) -> str:
        try:
            return self.post("/prompt", {"prompt": graph, "client_id": "prequant-tests"})["prompt_id"]
        except urllib.error.HTTPError as e:
            raise PromptRejected(json.loads(e.read() or b"{}")) from None

    def wait(self, prompt_id: str, timeout: float = 600.0) -> dict:
        deadline = time.time() + timeout
        while time.time() < deadline:
            h = self.get(f"/history/{prompt_id}")
            if h and prompt_id in h and h[prompt_id].get("status", {}).get("completed") is not None:
                if h[prompt_id]["status"].get("status_str") in ("success", "error"):
                    return h[prompt_id]
            if self.proc.poll() is not None:
                raise RuntimeError(f"ComfyUI died:\n{self.log_tail()}")
            time.sleep(0.3)
        raise TimeoutError(f"prompt {prompt_id} not done in {timeout}s:\n{self.log_tail()}")

    def run(self, graph: dict, timeout: float = 600.0) -> dict:
        return self.wait(self.queue(graph), timeout)

    def free(self, unload_models=True, free_memory=True, *, until_log: str | None = None, timeout: float = 60.0):
        """POST /free. ComfyUI's prompt worker acts on it only when it next looks at its flags (after a prompt, or at
        once when idle), so a prompt queued right after may run first; ``until_log`` waits until the server's log
        shows that text after the request, the one way to know the unload really happened."""
        start = os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0
        self.post("/free", {"unload_models": unload_models, "free_memory": free_memory})
        if until_log is None:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(self.log_path, "rb") as f:
                f.seek(start)
                if until_log in f.read().decode("utf-8", "replace"):
                    return
            time.sleep(0.1)
        raise TimeoutError(f"/free: {until_log!r} not in the server's log after {timeout:.0f} s:\n{self.log_tail()}")


class PromptRejected(Exception):
    def __init__(self, body):
        self.body = body
        super().__init__(json.dumps(body)[:2000])


def execution_error(entry: dict) -> str | None:
    """The exception message of a failed prompt, from its history entry."""
    for msg in entry.get("status", {}).get("messages", []):
        if isinstance(msg, str):  # ComfyUI 0.12.1's distribution: "kind: message" strings
            kind, _, text = msg.partition(": ")
            if kind == "execution_error":
                return text
        elif msg[0] == "execution_error":  # upstream: [kind, data]
            return msg[1].get("exception_message", "")
    return None
