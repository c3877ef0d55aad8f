"""Tokens as coloured HTML chips: ID, text and bytes on hover, whitespace made visible, specials styled.

Every colour a chip view draws is a constant here, so the CSS and the legends are made from the same values."""
from __future__ import annotations

import html
from typing import Iterable, Sequence

from kimi_eagle.tokenize.tokenizer import Tokenizer

PALETTE = ("#e3f2fd", "#fff3e0", "#e8f5e9", "#fce4ec", "#ede7f6", "#f1f8e9")  # chip backgrounds, cycled per token
CHIP_BORDER = "#ccc"
SPECIAL = ("#263238", "#fff")  # background, text
PARTIAL = "#8e24aa"  # dashed border: the token's bytes are not valid UTF-8 alone
HUNK = "#d32f2f"  # bytes or specials differ
CURRENT = "#ff6f00"  # the focused hunk
_VISIBLE_WS = {" ": "·", "\n": "↵\n", "\t": "→", "\r": "␍"}
_TOOLTIP_ESCAPES = {" ": "␣", "\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\"}

CHIP_CSS = f"""<style>
.ke-chips{{font-family:ui-monospace,monospace;font-size:13px;line-height:2;white-space:pre-wrap;word-break:break-all}}
.ke-chip{{border-radius:3px;padding:1px 2px;margin:0 1px;border:1px solid {CHIP_BORDER}}}
.ke-special{{background:{SPECIAL[0]}!important;color:{SPECIAL[1]};font-weight:bold}}
.ke-partial{{border:1px dashed {PARTIAL}}}
.ke-hunk{{outline:2px solid {HUNK}}}
.ke-current{{outline:3px solid {CURRENT}}}
.ke-swatch{{display:inline-block;width:12px;height:12px;margin:0 1px;vertical-align:middle;box-sizing:border-box}}
</style>"""


def visible(text: str) -> str:
    """Whitespace made visible (space ·, newline ↵, tab →)."""
    return "".join(_VISIBLE_WS.get(c, c) for c in text)


def escaped(text: str) -> str:
    """``text`` on one line with nothing invisible: space ␣, ``\\n`` ``\\t`` ``\\r`` ``\\\\``, other control
    and format characters (C0, DEL, C1, zero-width, no-break space …) as ``\\xNN``/``\\uNNNN``."""
    out = []
    for c in text:
        if c in _TOOLTIP_ESCAPES:
            out.append(_TOOLTIP_ESCAPES[c])
        elif not c.isprintable():
            out.append(f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return "".join(out)


def tooltip(token_id: int, index: int, b: bytes, special: bool = False) -> str:
    """A chip's hover text: position and ID, the decoded text (:func:`escaped`, U+FFFD where the bytes are
    not valid UTF-8 alone) and the bytes in hex, one per line."""
    try:
        text, note = b.decode("utf-8"), ""
    except UnicodeDecodeError:
        text, note = b.decode("utf-8", errors="replace"), " (partial UTF-8)"
    kind = " (special token)" if special else ""
    return f"#{index} · id {token_id}{kind}\ntext “{escaped(text)}”{note}\nbytes {b.hex(' ') or '(none)'}"


def chip(tok: Tokenizer, token_id: int, index: int, extra_class: str = "",
         special_ids: frozenset[int] | None = None) -> str:
    """One token as a chip; special tokens (``special_ids``, default the tokenizer's) are styled as such."""
    special_ids = tok.special_ids if special_ids is None else special_ids
    b = tok.token_bytes(token_id)
    try:
        text, partial = b.decode("utf-8"), False
    except UnicodeDecodeError:
        text, partial = b.decode("utf-8", errors="replace"), True
    classes = ["ke-chip"]
    if token_id in special_ids:
        classes.append("ke-special")
    if partial:
        classes.append("ke-partial")
    if extra_class:
        classes.append(extra_class)
    title = tooltip(token_id, index, b, token_id in special_ids)
    return (
        f'<span class="{" ".join(classes)}" style="background:{PALETTE[index % len(PALETTE)]}" '
        f'title="{html.escape(title)}" data-id="{token_id}">{html.escape(visible(text))}</span>'
    )


def chip_legend_html() -> str:
    """Legend entries for what a chip can show, each drawn with the colours the chips use."""
    cycle = "".join(f'<span class="ke-swatch" style="background:{c};border:1px solid {CHIP_BORDER}"></span>'
                    for c in PALETTE)
    return (f'<span data-legend="chip">{cycle} one chip per token (backgrounds cycle to show token boundaries; '
            "hover a chip for its ID, text and bytes)</span> · "
            f'<span data-legend="special"><span class="ke-swatch" style="background:{SPECIAL[0]};color:{SPECIAL[1]};'
            f'border:1px solid {CHIP_BORDER}"></span> special token</span> · '
            f'<span data-legend="partial"><span class="ke-swatch" style="border:1px dashed {PARTIAL}"></span> '
            "bytes that are not valid UTF-8 alone</span>")


def chips_html(tok: Tokenizer, ids: Sequence[int], highlight: Iterable[int] = (), current: Iterable[int] = (),
               css: bool = True) -> str:
    """HTML for ``ids``; token indexes in ``highlight`` are marked as hunks, ``current`` as the focused hunk."""
    hl, cur = set(highlight), set(current)
    parts = [chip(tok, t, i, "ke-current" if i in cur else ("ke-hunk" if i in hl else "")) for i, t in enumerate(ids)]
    return (CHIP_CSS if css else "") + '<div class="ke-chips">' + "".join(parts) + "</div>"
