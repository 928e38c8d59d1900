"""Text from a file, made safe to print: control characters become visible escapes.

A file's names and metadata reach a terminal (``info``, ``verify``), ComfyUI's log and the browser. An ANSI escape
in a ``family`` field could clear the screen and print a forged "Verdict VALID" line after the real verdict; a
bidirectional override could reorder what a reader sees. Every C0 / C1 control character, DEL, and the Unicode
format characters that reorder or hide text are shown as ``\\xNN`` / ``\\uNNNN`` instead; so is a lone surrogate
(a metadata string may hold one: printed raw it makes every UTF-8 writer, a terminal, a log or ComfyUI's JSON
history, raise, and ComfyUI's prompt worker dies on it).
"""
from __future__ import annotations

import re
import unicodedata

_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb]")


def _esc(m: re.Match) -> str:
    c = ord(m.group(0))
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def escape(value) -> str:
    """``str(value)`` with every control / format character escaped (newlines too)."""
    s = value if isinstance(value, str) else str(value)
    return _UNSAFE.sub(_esc, s)


def is_clean(s: str) -> bool:
    return _UNSAFE.search(s) is None and all(unicodedata.category(c) != "Cs" for c in s)


_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@]+@")


def redact(value) -> str:
    """``scheme://user:password@host`` -> ``scheme://***@host`` anywhere in the text: an address the user set (an
    ``HF_ENDPOINT`` with credentials) or one a library quotes back never shows its password in a message or a log."""
    return _CREDENTIALS.sub(r"\1***@", str(value))

