"""The one redaction of the API key from anything ``collect`` stores or prints.

:class:`Redactor` finds the key in every form an upstream body can echo it in -- as is, with any of
its characters JSON-escaped (``\\u0073``, ``\\/``, the backslash itself doubled by nested JSON),
percent-encoded (``%73``, either case), or a mix of these -- and replaces it with ``[REDACTED]``.
:meth:`Redactor.cut` redacts *before* it truncates, then replaces any prefix of the key of
``MIN_PREFIX`` or more characters (in any of those forms, a half-written escape included) that the
cut left at the end. Keys shorter than ``MIN_PREFIX`` characters are still redacted whole.
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

REDACTED = "[REDACTED]"
MIN_PREFIX = 6
_PARTIAL_ESCAPE = r"(?:\\+(?:u[0-9A-Fa-f]{0,3})?|%[0-9A-Fa-f]?)?"


def _char_pattern(c: str) -> str:
    """A regex for one character of the key in any of its forms."""
    forms = [re.escape(c)]
    units = c.encode("utf-16-be")
    hex_units = [units[i:i + 2].hex() for i in range(0, len(units), 2)]
    forms.append("".join(r"\\+u" + "".join(f"[{h.lower()}{h.upper()}]" if h.isalpha() else h for h in unit)
                         for unit in hex_units))
    forms.append("".join("%" + "".join(f"[{h.lower()}{h.upper()}]" if h.isalpha() else h for h in f"{b:02x}")
                         for b in c.encode("utf-8")))
    if c == "/":
        forms.append(r"\\+/")
    elif c in '"\\':
        forms.append(r"\\+" + re.escape(c))
    return "(?:" + "|".join(forms) + ")"


@lru_cache(maxsize=8)
def _patterns(secret: str) -> tuple[re.Pattern, re.Pattern | None]:
    chars = [_char_pattern(c) for c in secret]
    whole = re.compile("".join(chars))
    if len(secret) <= MIN_PREFIX:
        return whole, None
    # a prefix of MIN_PREFIX+ characters at the very end: the first MIN_PREFIX, then each further one optional
    tail = "".join(chars[:MIN_PREFIX]) + "".join("(?:" + c for c in chars[MIN_PREFIX:-1]) + ")?" * (len(chars) - 1 - MIN_PREFIX)
    return whole, re.compile(f"(?:{tail}){_PARTIAL_ESCAPE}\\Z")


class Redactor:
    """Redacts one secret (None or empty: a no-op)."""

    def __init__(self, secret: str | None) -> None:
        self.secret = secret or None

    def __call__(self, text: str) -> str:
        if not self.secret or not isinstance(text, str):
            return text
        return _patterns(self.secret)[0].sub(REDACTED, text)

    def cut(self, text: str, limit: int) -> str:
        """``text`` redacted, then cut to ``limit`` characters, with a key prefix left at the end replaced too (the
        cut, or the upstream's own, may have split an echoed key)."""
        text = self(text)[:limit]
        prefix = _patterns(self.secret)[1] if self.secret else None
        if prefix is not None:
            m = prefix.search(text[-(len(self.secret) * 12 + 16):])
            if m:
                text = text[:len(text) - (m.end() - m.start())] + REDACTED
        return text

    def value(self, value: Any) -> Any:
        """``value`` (JSON-like) with the secret redacted from every string and key."""
        if not self.secret:
            return value
        if isinstance(value, str):
            return self(value)
        if isinstance(value, dict):
            return {self.value(k): self.value(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.value(v) for v in value]
        return value

    def bytes_cut(self, data: bytes, limit: int) -> str:
        """An upstream body's first ``limit`` characters as text (invalid UTF-8 replaced), redacted before the cut."""
        window = data[:(limit + 12 * len(self.secret or "") + 16) * 4]  # any key crossing the cut lies inside
        return self.cut(window.decode("utf-8", errors="replace"), limit)
