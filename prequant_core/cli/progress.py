"""One progress bar for a build on the command line (tqdm, which huggingface_hub brings): the stages (quantize,
cast, write) take turns on the same bar, so a model of thousands of tensors draws one line, not one per tensor.
Piped (a log file, CI), where a redrawn bar is noise, each stage prints one line when it is done."""
from __future__ import annotations

import sys
import time

STAGE_WORDS = {"quantize": "quantizing", "cast": "casting", "write": "writing"}


class BuildBar:
    """A ``BuildProgress`` callable: ``(stage, done, total, key)``."""

    def __init__(self, quiet: bool = False, stream=None):
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.bar = None
        self.stage = None
        self.t0 = time.monotonic()

    def __enter__(self):
        return self

    def __call__(self, stage: str, done: int, total: int, key: str) -> None:
        if self.quiet:
            return
        word = STAGE_WORDS.get(stage, stage)
        if not self.tty:
            if stage != self.stage:
                self.stage, self.t0 = stage, time.monotonic()
            if done == total:
                self.stream.write(f"{word} {done}/{total} tensors: done in {time.monotonic() - self.t0:.1f} s\n")
                self.stream.flush()
                self.stage = None
            return
        if self.bar is None:
            from tqdm import tqdm
            self.stage = stage
            self.bar = tqdm(total=total, desc=word, file=self.stream, unit="tensor", dynamic_ncols=True,
                            leave=True, bar_format="{desc} {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} {unit}s "
                                                   "[{elapsed}<{remaining}]")
        if stage != self.stage:
            self.stage = stage
            self.bar.set_description_str(word, refresh=False)
            self.bar.reset(total=total)
        self.bar.n = done
        if done == total:
            self.bar.refresh()
        else:
            self.bar.update(0)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.close()
        return False
