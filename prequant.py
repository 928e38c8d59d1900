"""The pack's command line from any folder: ``python /path/to/ComfyUI-Prequant/prequant.py info FILE``.

Same commands as ``python -m prequant_core`` (which works from the pack's own folder only): the folder holding this
file goes first on the import path, so the pack's ``prequant_core`` is found wherever the command is run from."""
import os
import sys

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from prequant_core.cli import main
    sys.exit(main(prog=f"python {sys.argv[0]}"))
