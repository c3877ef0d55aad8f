"""User strings (provider names, model names, paths, ids) made safe for where the kit writes them.

* **terminal and pages** (:func:`visible`): control characters (C0 but tab and newline, DEL, C1: BEL, ESC, CR,
  backspace …) are written as ``\\xNN`` escapes, so a provider name cannot ring the bell, move the cursor, recolour
  the terminal or hide text on a page; :class:`VisibleStream` applies it to everything a command prints.
* **CSV** (:func:`csv_cell`): a text cell starting with ``=``, ``+``, ``-``, ``@``, tab or CR is neutralised with a
  leading ``'`` (OWASP's rule against spreadsheet formulas, e.g. ``=HYPERLINK(...)``); a cell that is a plain
  number (``-0.04``, ``+30``, ``-5``) is read by a spreadsheet as that number, never as a formula, and is kept as
  it is, as are numbers written as numbers.
* **Markdown** (:func:`md_cell`, :func:`md_text`): ``|``, backslashes, ``<``/``>`` and backticks are escaped and
  line breaks become spaces, so a string can neither end a table row or code span, nor start a heading or an
  HTML tag.

>>> visible("Moon\\x07shot\\x1b[31m")
'Moon\\\\x07shot\\\\x1b[31m'
>>> csv_cell("=HYPERLINK(1)"), csv_cell("-0.04"), csv_cell(-5), csv_cell("-5 tokens")
("'=HYPERLINK(1)", '-0.04', -5, "'-5 tokens")
>>> md_cell("a|b\\n## x")
'a\\\\|b ## x'
"""
from __future__ import annotations

import io
import re
from typing import Any

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # every control character but tab and newline
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?\Z")
MD_SPECIAL = re.compile(r"([\\|`<>])")


def visible(text: Any) -> str:
    """``text`` with every control character but tab and newline written as ``\\xNN``."""
    return CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))


def csv_cell(value: Any) -> Any:
    """``value`` safe for a spreadsheet: a text that would start a formula gets a leading ``'``; numbers, and texts
    that are plain numbers, are kept."""
    if isinstance(value, str) and value[:1] in FORMULA_START and not PLAIN_NUMBER.match(value):
        return "'" + value
    return value


def csv_row(values: Any) -> list[Any]:
    """Every cell of a row through :func:`csv_cell`."""
    return [csv_cell(v) for v in values]


def md_text(text: Any) -> str:
    """``text`` as literal Markdown on one line: control characters visible, line breaks as spaces, ``\\ | ` < >``
    backslash-escaped."""
    one_line = visible(str(text).replace("\r\n", " ").replace("\n", " ").replace("\r", " "))
    return MD_SPECIAL.sub(r"\\\1", one_line)


def md_cell(value: Any) -> str:
    """A Markdown table cell: ``–`` for nothing, else :func:`md_text`."""
    if value is None or value == "" or (isinstance(value, float) and value != value):
        return "–"
    return md_text(value)


class VisibleStream(io.TextIOBase):
    """A text stream that writes :func:`visible` text to ``stream`` (what a command prints to the terminal)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(visible(text))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return bool(getattr(self.stream, "isatty", lambda: False)())

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", "utf-8")
