"""Tokens as coloured HTML chips: ID and bytes on hover, whitespace made visible, specials styled."""
from __future__ import annotations

import html
from typing import Iterable, Sequence

from kimi_eagle.tokenize.tokenizer import Tokenizer

PALETTE = ("#e3f2fd", "#fff3e0", "#e8f5e9", "#fce4ec", "#ede7f6", "#f1f8e9")
_VISIBLE_WS = {" ": "·", "\n": "↵\n", "\t": "→", "\r": "␍"}

CHIP_CSS = """<style>
.ke-chips{font-family:ui-monospace,monospace;font-size:13px;line-height:2;white-space:pre-wrap;word-break:break-all}
.ke-chip{border-radius:3px;padding:1px 2px;margin:0 1px;border:1px solid #ccc}
.ke-special{background:#263238!important;color:#fff;font-weight:bold}
.ke-partial{border:1px dashed #d32f2f}
.ke-hunk{outline:2px solid #d32f2f}
.ke-current{outline:3px solid #ff6f00}
</style>"""


def visible(text: str) -> str:
    """Whitespace made visible (space ·, newline ↵, tab →)."""
    return "".join(_VISIBLE_WS.get(c, c) for c in text)


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
    title = f"#{index} id {token_id} bytes {b.hex(' ')}" + (" (partial UTF-8)" if partial else "")
    return (
        f'<span class="{" ".join(classes)}" style="background:{PALETTE[index % len(PALETTE)]}" '
        f'title="{html.escape(title)}" data-id="{token_id}">{html.escape(visible(text))}</span>'
    )


def chips_html(tok: Tokenizer, ids: Sequence[int], highlight: Iterable[int] = (), current: Iterable[int] = (),
               css: bool = True) -> str:
    """HTML for ``ids``; token indexes in ``highlight`` are marked as hunks, ``current`` as the focused hunk."""
    hl, cur = set(highlight), set(current)
    parts = [chip(tok, t, i, "ke-current" if i in cur else ("ke-hunk" if i in hl else "")) for i, t in enumerate(ids)]
    return (CHIP_CSS if css else "") + '<div class="ke-chips">' + "".join(parts) + "</div>"
