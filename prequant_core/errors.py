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


class reading:
    """``with reading(path):`` turns anything but the pack's own typed errors, raised while a file's contents are
    being read or judged, into a ``CorruptCheckpointError`` naming the file, with the original attached: a
    stranger's bytes can make any library raise anything, and none of that may reach the user as a bare traceback
    (or take ComfyUI's prompt worker down)."""

    def __init__(self, path, what: str = "read"):
        self.path, self.what = path, what

    def __enter__(self):
        return self

    def __exit__(self, typ, exc, tb):
        if exc is None or isinstance(exc, (PrequantError, KeyboardInterrupt, SystemExit, GeneratorExit)) or \
                not isinstance(exc, (Exception, RecursionError)):
            return False
        raise CorruptCheckpointError(f"The file could not be {self.what} as a checkpoint.", path=str(self.path),
                                     found=f"{type(exc).__name__}: {str(exc)[:200]}",
                                     fix="Download or build the file again.") from exc
