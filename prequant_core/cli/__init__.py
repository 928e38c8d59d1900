"""``python -m prequant_core`` (or ``python <pack>/prequant.py`` from any folder): inspect, verify and build
pre-quantized checkpoints without ComfyUI.

The parser is built from torch-free modules (``inspect_commands``, ``build_commands``, ``choices``), so ``--help``
and argument errors answer before torch and torchao load; each command imports what it drives when it runs.
"""
from __future__ import annotations

import argparse
import sys

from .. import __version__
from ..errors import PrequantError


def parser(prog: str = "python -m prequant_core") -> argparse.ArgumentParser:
    from . import build_commands, inspect_commands
    p = argparse.ArgumentParser(prog=prog,
                                description="Inspect, verify and build pre-quantized (torchao int8 / fp8 / nvfp4 / "
                                            "mxfp8, ComfyUI-native) diffusion transformer checkpoints and pre-cast "
                                            "fp8 text encoders. From outside the pack's folder: python "
                                            "<pack>/prequant.py COMMAND ...")
    p.add_argument("--version", action="version", version=f"prequant_core {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (inspect_commands, build_commands):
        module.add(sub)
    return p


def main(argv=None, prog: str = "python -m prequant_core") -> int:
    args = parser(prog).parse_args(argv)
    import logging
    # torchao registers an enum with torch's pytree at import, which torch 2.14 logs as a deprecation on every run
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    try:
        return int(args.func(args) or 0)
    except PrequantError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the safety net: a stranger's file never ends in a bare traceback
        from ..safe_text import escape
        print(f"error: unexpected {type(e).__name__} while running '{args.command}': {escape(str(e))[:400]}\n"
              "Fix: if a file was being read, it is damaged or not a checkpoint; otherwise please report this "
              "message.", file=sys.stderr)
        return 3
