"""One error family for everything the pack refuses.

Every error carries the file (or source) it is about, what was expected, what was found and what to do,
so the ComfyUI node, the command line and the log all show the same actionable sentence.
"""
from __future__ import annotations

from .safe_text import escape, redact


class PrequantError(Exception):
    """Base class. ``str(err)`` is the full user-facing message."""


    def __init__(self, message: str, *, path: str | None = None, expected: str | None = None,
                 found: str | None = None, fix: str | None = None, reasons: list[str] | None = None):
        # credentials in an address (user:password@) never reach the node, the page, the CLI or the log
        self.message = redact(message)
        self.path = path
        self.expected = None if expected is None else redact(expected)
        self.found = None if found is None else redact(found)
        self.fix = None if fix is None else redact(fix)
        self.reasons = [redact(r) for r in reasons or []]
        super().__init__(self.render())

    def render(self) -> str:
        # Messages quote names and values from files: each part is escaped, so one line stays one line and no
        # terminal escape from a file reaches the log, the CLI or the UI.
        parts = [escape(self.message)]
        if self.path:
            parts.append(f"File: {escape(self.path)}")
        if self.expected is not None:
            parts.append(f"Expected: {escape(self.expected)}")
        if self.found is not None:
            parts.append(f"Found: {escape(self.found)}")
        for r in self.reasons:
            parts.append(f"- {escape(r)}")
        if self.fix:
            parts.append(f"Fix: {escape(self.fix)}")
        return "\n".join(parts)


class PathNotAllowedError(PrequantError):
    pass


class CheckpointNotFoundError(PrequantError):
    pass


class CorruptCheckpointError(PrequantError):
    """Truncated, not a checkpoint, malformed header, inconsistent tensors."""


class UnsafeCheckpointError(PrequantError):
    """The file asks for code execution (pickle globals outside the allowlist)."""


class UnsupportedFormatError(PrequantError):
    """A known container we deliberately do not load (v2/v3, per-tensor fp8, unknown ComfyUI quant formats)."""


class ValidationError(PrequantError):
    """Metadata does not match what the caller asked for; ``reasons`` lists every mismatch."""


class UnknownFamilyError(PrequantError):
    pass


class ComfyVersionError(PrequantError):
    """The running ComfyUI lacks what a family needs."""


class HubError(PrequantError):
    pass


class BuildError(PrequantError):
    pass


class MemoryBudgetError(PrequantError):
    pass


class DependencyError(PrequantError):
    """An optional extra the call needs is not installed (e.g. diffusers / accelerate for the diffusers loader)."""


class InternalError(PrequantError):
    """Something failed that is neither the file's fault nor the user's: a bug, or a ComfyUI this pack does not know
    (an API that changed, a file of ComfyUI's own missing). Says which step, and asks for a report."""


def _out_of_memory(exc) -> bool:
    if isinstance(exc, MemoryError):
        return True
    oom = getattr(__import__("sys").modules.get("torch"), "OutOfMemoryError", None)
    return (oom is not None and isinstance(exc, oom)) or \
        (isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower())


def _foreign_file(exc, path) -> str | None:
    """The file an OSError names, where it is not ``path`` (ComfyUI's own tokenizer, a config): not the checkpoint."""
    import os
    name = getattr(exc, "filename", None) if isinstance(exc, OSError) else None
    if not name or not path:
        return None
    try:
        return None if os.path.realpath(str(name)) == os.path.realpath(str(path)) else str(name)
    except (OSError, ValueError):
        return str(name)


class reading:
    """``with reading(path, what):`` types anything but the pack's own errors raised while a file is read, judged or
    turned into a model, by what really happened:

    - out of memory (``MemoryError``, torch's out-of-memory error): ``MemoryBudgetError`` saying what the step was;
    - an ``OSError`` about another file than this one (ComfyUI's own tokenizer, say): ``InternalError`` naming it;
    - with ``parsing`` (a reader parsing a stranger's bytes, which can make any library raise anything):
      ``CorruptCheckpointError`` naming the file, the original attached;
    - otherwise (the model build, after the file was read and judged: a bug, or a ComfyUI API this pack does not know):
      ``InternalError`` naming the step and asking for a report.

    None of it reaches the user as a bare traceback, nor takes ComfyUI's prompt worker down."""

    def __init__(self, path, what: str = "read", *, parsing: bool = True):
        self.path, self.what, self.parsing = path, what, parsing

    def __enter__(self):
        return self

    def __exit__(self, typ, exc, tb):
        if exc is None or isinstance(exc, (PrequantError, KeyboardInterrupt, SystemExit, GeneratorExit)) or \
                not isinstance(exc, (Exception, RecursionError, MemoryError)):
            return False
        found = f"{type(exc).__name__}: {str(exc)[:200]}"
        if _out_of_memory(exc):
            raise MemoryBudgetError(f"Ran out of memory while the checkpoint was {self.what}: the step needed more "
                                    "memory than was free.", path=str(self.path), found=found,
                                    fix="Free memory (ComfyUI's Unload Models, or close other programs and "
                                        "models), then queue again; or use a smaller scheme's file (int8 / fp8 -> "
                                        "nvfp4) or the lowvram / CPU offload options.") from exc
        other = _foreign_file(exc, self.path)
        if other:
            raise InternalError(f"A file this step needs, which is not the checkpoint, could not be read while the "
                                f"checkpoint was {self.what}: {other}.", path=str(self.path), found=found,
                                fix="The checkpoint is not at fault. If the file belongs to ComfyUI (a tokenizer, a "
                                    "config), update or reinstall ComfyUI; otherwise please report this with the "
                                    "log.") from exc
        if self.parsing:
            raise CorruptCheckpointError(f"The file could not be {self.what} as a checkpoint.", path=str(self.path),
                                         found=found, fix="Download or build the file again.") from exc
        raise InternalError(f"An unexpected error stopped the step in which the checkpoint was {self.what} (the file "
                            "itself was read and judged valid before it).", path=str(self.path), found=found,
                            fix="Please report this to ComfyUI-Prequant with the ComfyUI log and your ComfyUI "
                                "version; it is likely a bug or a ComfyUI change this version does not know.") \
            from exc
