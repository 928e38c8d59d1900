"""Worker process for ``test_hostile_files.py``: reads file paths from stdin, runs every entry point on each, and
writes one JSON line per file to the result pipe (fd in argv[1]).

A crash (SIGSEGV from C recursion, the OOM killer) ends this process, not the test run: the parent sees the exit
signal and which file was being read. Peak memory per file is the kernel's high-water mark (``VmHWM``), reset
before each file through ``/proc/self/clear_refs``, minus the resident size before the file.
"""
from __future__ import annotations

import contextlib
import ctypes
import gc
import io
import json
import os
import resource
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import logging  # noqa: E402

logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)

from prequant_core import cli, errors, formats, report
from prequant_core.load import opening, memory_check  # noqa: E402
from prequant_core.load.metadata import Request  # noqa: E402

SAFETY_NET = 6 * 2**30  # address space beyond start-up: an attack that slips through fails here, not the machine


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _settle() -> None:
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _call(fn, *args, **kwargs) -> str:
    try:
        out = fn(*args, **kwargs)
        if isinstance(out, report.Report):
            json.dumps(out.to_dict(), allow_nan=False)
            out.to_text()
        return "ok"
    except errors.PrequantError as e:
        assert str(e)
        return type(e).__name__
    except Exception as e:  # noqa: BLE001 - exactly what the test looks for
        return f"UNCAUGHT {type(e).__name__}: {str(e)[:200]} | {traceback.format_exc(limit=-3)[-600:]}"


def _cli(args: list[str]) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli.main(args)
        except SystemExit:
            pass
    return out.getvalue(), err.getvalue()


def run_one(path: str) -> dict:
    folder = os.path.dirname(path)
    outcomes = {
        "read": _call(formats.read, path),
        "info": _call(report.info, path, None, True),
        "verify": _call(report.info, path, Request(base_model_id="Tongyi-MAI/Z-Image-Turbo", scheme="fp8"), False),
        "load": _call(opening.open_checkpoint, path, Request(), model_dirs=[folder], strict=False),
        "declared": _call(memory_check.declared_bytes, path),
    }
    text_out, text_err = _cli(["info", path])
    json_out, _ = _cli(["info", "--json", path])
    strict = True
    if json_out.strip():
        try:
            json.loads(json_out, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
        except ValueError:
            strict = False
    printed = text_out + text_err + json_out
    return {"outcomes": outcomes, "escape_in_text": "\x1b" in printed,
            "surrogate_in_text": any("\ud800" <= c <= "\udfff" for c in printed),
            "json_strict": strict, "text": (text_out + text_err)[:2000]}


def main() -> None:
    result_fd = int(sys.argv[1])
    vsize = _status("VmSize")
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (vsize + SAFETY_NET, resource.RLIM_INFINITY))
    with os.fdopen(result_fd, "w", buffering=1) as results:
        results.write(json.dumps({"ready": True}) + "\n")
        for line in sys.stdin:
            path = line.rstrip("\n")
            if not path:
                continue
            _settle()
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            before = _status("VmRSS")
            t0 = time.perf_counter()
            rec = run_one(path)
            rec["seconds"] = round(time.perf_counter() - t0, 3)
            rec["peak_growth_bytes"] = max(0, _status("VmHWM") - before)
            rec["file"] = os.path.basename(path)
            rec["file_bytes"] = os.path.getsize(path)
            results.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
