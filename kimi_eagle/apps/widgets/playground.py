"""Playground widgets: ``TokenizerPlayground`` (text in, chips out, compared with a pasted ID list) and
``CompletionPlayground`` (a completion's engine IDs in, the API message a Kimi server returns out)."""
from __future__ import annotations

import html
import json
import re
from typing import Any

import ipywidgets as W

from kimi_eagle.apps.widgets.chips import CHIP_CSS
from kimi_eagle.apps.widgets.inspector import _chips, aligned_html, parse_ids
from kimi_eagle.apps.widgets.snapshot import SnapshotBox
from kimi_eagle.diff.align import AlignError
from kimi_eagle.diff.classify import RecordVerdict, classify
from kimi_eagle.tokenize.tokenizer import Tokenizer

# --------------------------------------------------------------------------------------------
# tokenizer playground


class TokenizerPlayground:
    """Type text, see its tokens; paste IDs to compare them with the text's encoding."""

    def __init__(self, tok: Tokenizer, text: str = "", ids: str = "") -> None:
        self.tok = tok
        self.text = W.Textarea(value=text, description="text", layout=W.Layout(width="90%", height="80px"))
        self.allow_special = W.Checkbox(value=True, description="special-token spellings become specials",
                                        indent=False, layout=W.Layout(width="auto"))
        self.ids = W.Textarea(value=ids, description="IDs", placeholder="paste IDs to compare: 1, 2, 3 or [1, 2, 3]",
                              layout=W.Layout(width="90%", height="60px"))
        self.html = W.HTML()
        self.record_verdict: RecordVerdict | None = None
        self.encoded: list[int] = []
        for w in (self.text, self.allow_special, self.ids):
            w.observe(lambda _: self._render(), names="value")
        for w, name in ((self.text, "text"), (self.allow_special, "allow-special"), (self.ids, "ids"), (self.html, "view")):
            w.add_class(f"ke-playground-{name}")  # stable hooks for browser tests
        self.widget = SnapshotBox([self.text, self.allow_special, self.ids, self.html], snapshot=self.snapshot_html)
        self._render()

    def snapshot_html(self) -> str:
        """The current view as static HTML: the text and pasted IDs as written, then the chips and comparison."""
        ids = f"<p>pasted IDs: <code>{html.escape(self.ids.value)}</code></p>" if self.ids.value.strip() else ""
        return f"<pre>{html.escape(self.text.value)}</pre>{ids}{self.html.value}"

    def _render(self) -> None:
        tok = self.tok
        self.encoded = tok.encode(self.text.value, allow_special=self.allow_special.value)
        nbytes = len(self.text.value.encode())
        out = [f"<p>{len(self.encoded)} tokens, {nbytes} bytes</p>", CHIP_CSS,
               '<div class="ke-chips">' + _chips(tok, self.encoded, 0, tok.special_ids) + "</div>"]
        self.record_verdict = None
        try:
            pasted = parse_ids(self.ids.value)
            if pasted:
                self.record_verdict = classify(tok, pasted, self.encoded)
        except (ValueError, AlignError) as e:
            message = re.sub(r"^a\[(\d+)\] = ", r"position \1: ", str(e))  # the aligner calls the pasted side "a"
            prefix = "" if message.lower().startswith(("ids", "pasted")) else "pasted IDs: "
            out.append(f'<p style="color:#d32f2f">{prefix}{html.escape(message)}</p>')
        if self.record_verdict is not None:
            v = self.record_verdict
            out.append(f"<p>pasted IDs (top) against the text's encoding (bottom): <b>{v.verdict}</b>"
                       f"{' (' + ', '.join(v.subclasses) + ')' if v.subclasses else ''}, {len(v.hunks)} hunks, "
                       f"token delta {v.token_delta:+d}</p>")
            out.append(aligned_html(tok, v, 0 if v.hunks else None, context=-1,
                                    top="pasted IDs", bottom="the text's encoding"))
        self.html.value = "".join(out)


# --------------------------------------------------------------------------------------------
# completion parser playground


class CompletionPlayground:
    """Paste a completion's engine IDs, see the API message a Kimi server returns for them
    (:func:`kimi_eagle.chat.parse.parse_completion`): reasoning, content, tool calls, finish reason, flags."""

    def __init__(self, tok: Tokenizer, ids: str = "", format_name: str = "kimi-k2.5") -> None:
        from kimi_eagle.chat.parse import PARSE_FORMATS

        self.tok = tok
        self.ids = W.Textarea(value=ids, description="IDs", placeholder="completion IDs: 1, 2, 3 or [1, 2, 3]",
                              layout=W.Layout(width="90%", height="80px"))
        self.format = W.Dropdown(options=list(PARSE_FORMATS), value=format_name, description="format")
        self.strip = W.Checkbox(value=False, description="strip whitespace as the servers do")
        self.html = W.HTML()
        self.parsed: Any = None
        for w in (self.ids, self.format, self.strip):
            w.observe(lambda _: self._render(), names="value")
        for w, name in ((self.ids, "ids"), (self.format, "format"), (self.strip, "strip"), (self.html, "view")):
            w.add_class(f"ke-completion-{name}")  # stable hooks for browser tests
        self.widget = SnapshotBox([self.ids, W.HBox([self.format, self.strip]), self.html], snapshot=self.snapshot_html)
        self._render()

    def snapshot_html(self) -> str:
        """The current view as static HTML: the pasted IDs as written, then the parsed message."""
        return f"<p>IDs: <code>{html.escape(self.ids.value)}</code></p>{self.html.value}"

    def _render(self) -> None:
        from kimi_eagle.chat.parse import ParseOptions, parse_completion

        self.parsed = None
        try:
            pasted = parse_ids(self.ids.value)
            bad = next((i for i in pasted if not 0 <= i < self.tok.n_vocab), None)
            if bad is not None:
                raise ValueError(f"{bad} is outside the vocabulary")
        except ValueError as e:
            self.html.value = f'<p style="color:#d32f2f">IDs: {html.escape(str(e))}</p>'
            return
        if not pasted:
            self.html.value = "<p>paste the IDs of a completion (what the engine generated after the prompt)</p>"
            return
        self.parsed = parse_completion(pasted, self.tok,
                                       ParseOptions(format_name=self.format.value, strip=self.strip.value))
        p = self.parsed
        self.html.value = "".join([
            f"<p>{len(pasted)} tokens &rarr; finish_reason <b>{html.escape(p.finish_reason)}</b>"
            f"{', flags ' + html.escape(', '.join(p.flags)) if p.flags else ''}</p>",
            CHIP_CSS, '<div class="ke-chips">' + _chips(self.tok, pasted, 0, self.tok.special_ids) + "</div>",
            "<pre>" + html.escape(json.dumps(p.message(), ensure_ascii=False, indent=1)) + "</pre>"])
