"""``python -m prequant_core``: inspect, verify and build pre-quantized checkpoints without ComfyUI.

Each command lives beside the code it drives: ``info`` / ``verify`` in report.py, ``build`` in the build package; every
module exposes ``add_cli(subparsers)`` which registers its commands with a ``func(args) -> exit code``.
"""
from __future__ import annotations

import argparse
import sys

from . import __version__
from .errors import PrequantError


def parser() -> argparse.ArgumentParser:
    from . import build, report
    from .build import text_encoder
    p = argparse.ArgumentParser(prog="python -m prequant_core",
                                description="Inspect, verify and build pre-quantized (torchao int8 / fp8 / nvfp4 / "
                                            "mxfp8) diffusion transformer checkpoints and pre-cast fp8 text "
                                            "encoders.")
    p.add_argument("--version", action="version", version=f"prequant_core {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (report, build, text_encoder):
        if hasattr(module, "add_cli"):
            module.add_cli(sub)
    return p


def main(argv=None) -> int:
    import logging
    # torchao registers an enum with torch's pytree at import, which torch 2.14 logs as a deprecation on every run
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    args = parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except PrequantError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the safety net: a stranger's file never ends in a bare traceback
        from .safe_text import escape
        print(f"error: unexpected {type(e).__name__} while running '{args.command}': {escape(str(e))[:400]}\n"
              "Fix: if a file was being read, it is damaged or not a checkpoint; otherwise please report this "
              "message.", file=sys.stderr)
        return 3
