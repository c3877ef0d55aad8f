"""Playground widgets: ``TokenizerPlayground`` (text in, chips out, compared with a pasted ID list) and
``CompletionPlayground`` (a completion's engine IDs or raw text in, the API message a Kimi server returns
out, with the conventions it follows: what each serving profile returns, and the parser's flags)."""
from __future__ import annotations

import html
import json
import re
from typing import Any

import ipywidgets as W

from kimi_eagle.apps.widgets.chips import CHIP_CSS
from kimi_eagle.apps.widgets.inspector import _chips, aligned_html, parse_ids
from kimi_eagle.apps.widgets.snapshot import SnapshotBox
from kimi_eagle.chat.completion import tool_id_style
from kimi_eagle.chat.parse import PARSE_FORMATS, ParsedCompletion, ParseOptions
from kimi_eagle.diff.align import AlignError
from kimi_eagle.diff.classify import TOKEN_DELTA_SIGN, RecordVerdict, classify
from kimi_eagle.serving.answer import parse_completion
from kimi_eagle.serving.profiles import PROFILES, canonical_name
from kimi_eagle.tokenize.tokenizer import Tokenizer

# --------------------------------------------------------------------------------------------
# tokenizer playground


class TokenizerPlayground:
    """Type text, see its tokens; paste IDs to compare them with the text's encoding.

    IDs given with a sample (``ids`` here, or :meth:`load`) belong to that sample's text: once the text is edited
    they are cleared (and the view says so), so new text is never compared with the previous sample's IDs. IDs
    pasted by hand stay until replaced."""

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
        self.sample_ids = bool(ids.strip())  # the IDs came with the sample text, not pasted for the current text
        self.cleared = False  # the sample's IDs were cleared by the last text edit
        self._quiet = False  # set while load() rewrites both boxes
        self.text.observe(lambda _: self._text_edited(), names="value")
        self.ids.observe(lambda _: self._ids_edited(), names="value")
        self.allow_special.observe(lambda _: self._render(), names="value")
        for w, name in ((self.text, "text"), (self.allow_special, "allow-special"), (self.ids, "ids"), (self.html, "view")):
            w.add_class(f"ke-playground-{name}")  # stable hooks for browser tests
        self.widget = SnapshotBox([self.text, self.allow_special, self.ids, self.html], snapshot=self.snapshot_html)
        self._render()

    def load(self, text: str, ids: str = "") -> None:
        """Show a new sample: its text and (optionally) the IDs it is compared with."""
        self._quiet = True
        self.text.value, self.ids.value = text, ids
        self._quiet, self.sample_ids, self.cleared = False, bool(ids.strip()), False
        self._render()

    def _text_edited(self) -> None:
        if self._quiet:
            return
        if self.sample_ids and self.ids.value.strip():
            self._quiet = True
            self.ids.value = ""  # the sample's IDs describe the sample's text, not this one
            self._quiet, self.sample_ids, self.cleared = False, False, True
        self._render()

    def _ids_edited(self) -> None:
        if self._quiet:
            return
        self.sample_ids, self.cleared = False, False  # pasted by hand, for the text as it stands
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
        if self.cleared:
            out.append("<p>the sample's IDs were cleared when the text changed: paste IDs to compare with this text</p>")
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
                       f"token delta ({TOKEN_DELTA_SIGN}: the text's encoding − pasted IDs) {v.token_delta:+d}</p>")
            out.append(aligned_html(tok, v, 0 if v.hunks else None, context=-1,
                                    top="pasted IDs", bottom="the text's encoding"))
        self.html.value = "".join(out)


# --------------------------------------------------------------------------------------------
# completion parser playground

MODES = ("auto", "IDs", "text")
# auto reads as IDs what holds only numbers, separators and brackets, and everything else as raw text
_ID_LIKE = re.compile(r"[\s\[\],.+\-\d]*\d[\s\[\],.+\-\d]*")
# the ServingProfile fields that act on the completion (the rest shape the prompt)
COMPLETION_FIELDS = ("split_on", "finish_on_section", "unterminated_call", "name_rule", "id_chars", "args_object",
                     "id_rule", "strip", "strip_reasoning")
# what each flag of parse_completion says (docs/reconstruct.md, "The inverse parser")
FLAG_NOTES = {
    "invalid_utf8": "the bytes are not valid UTF-8 (a cut inside a character): the text holds U+FFFD",
    "other_special": "a special token that is not a Kimi marker: its spelling is kept in the text",
    "literal_marker": "marker text written as ordinary tokens: text here, but servers that split the decoded text "
                      "(vllm, sglang) split there",
    "text_after_im_end": "tokens after <|im_end|>: generation stops there, they are not part of the turn",
    "no_think_end": "no </think>: the reasoning runs straight into the tool section (K2.5 does this)",
    "stray_marker": "a marker with no role where it stands: its spelling is kept in the text",
    "truncated_in_reasoning": "cut inside the reasoning: everything is reasoning, no content",
    "reasoning_not_closed": "<|im_end|> with no </think> before it: everything is reasoning",
    "text_after_tool_section": "text after <|tool_calls_section_end|>: servers keep only what precedes the section",
    "text_in_tool_section": "text between calls: servers ignore it",
    "truncated_in_tool_id": "cut inside a call's id: that call is not returned",
    "malformed_tool_call": "a call whose markers are out of order: not returned",
    "truncated_in_tool_call": "cut inside the last call's arguments: returned with the arguments written so far",
    "whitespace_stripped": "whitespace the model wrote around an id, arguments or reasoning is stripped",
    "tool_id_unparsed": "a call id of neither shape functions.NAME:N nor NAME:N: servers skip that call",
    "dropped_by_server": "a call the model wrote (in full or cut) that this server does not return",
    "tool_id_renumbered": "the id returned is SGLang's functions.NAME:{history + position}, not the one written",
}
_DIFF_STYLE = "background:#fff3e0"
_PROFILES_CSS = ("<style>table.ke-profiles{font-size:12px;border-collapse:collapse}table.ke-profiles td,"
                 "table.ke-profiles th{text-align:left;vertical-align:top;padding:2px 6px}</style>")


def flag_note(flag: str) -> str:
    """One line saying what ``flag`` (of :class:`~kimi_eagle.chat.parse.ParsedCompletion`) means."""
    return FLAG_NOTES.get(flag.split(":", 1)[0], "")


def read_completion(tok: Tokenizer, text: str, mode: str = "auto") -> tuple[list[int], str]:
    """``(IDs, "IDs" | "text")``: ``text`` read as pasted IDs or, as raw completion text, encoded with
    specials allowed (``</think>``, ``<|im_end|>`` … become their special tokens). ``auto`` reads text of
    numbers and separators only as IDs. Raises ``ValueError`` with a one-line reason for bad IDs."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
    if mode == "text" or mode == "auto" and not _ID_LIKE.fullmatch(text):
        return tok.encode(text, allow_special=True), "text"
    ids = parse_ids(text)
    bad = next((i for i in ids if not 0 <= i < tok.n_vocab), None)
    if bad is not None:
        raise ValueError(f"{bad} is outside the vocabulary (n_vocab {tok.n_vocab})")
    return ids, "IDs"


def parse_by_profile(tok: Tokenizer, ids: list[int], format_name: str = "kimi-k2.5",
                     strip: bool = False) -> dict[str, ParsedCompletion]:
    """What every serving profile (:data:`~kimi_eagle.serving.request.PROFILES`) returns for ``ids``."""
    return {name: parse_completion(ids, tok, ParseOptions(format_name=format_name, strip=strip, serving=name))
            for name in PROFILES}


def _same_rules(name: str) -> str:
    return "only marker special tokens split the completion" if name == "template" else "completion read as template"


def _answer(p: ParsedCompletion) -> dict[str, Any]:
    return {"finish_reason": p.finish_reason, **p.message()}


def _cell(value: Any) -> str:
    return html.escape(json.dumps(value, ensure_ascii=False))


def profiles_html(by_profile: dict[str, ParsedCompletion]) -> str:
    """A table: one row per serving profile, its answer's fields (those that differ from ``template``'s
    highlighted), its completion rules that differ from ``template``'s, and its flags."""
    base = _answer(by_profile["template"])
    keys = ("finish_reason", "reasoning", "content", "tool_calls")
    groups: dict[str, list[str]] = {}
    for name, p in by_profile.items():
        groups.setdefault(json.dumps(_answer(p), sort_keys=True), []).append(name)
    rows = []
    for name, p in by_profile.items():
        answer = _answer(p)
        rules = ", ".join(f"{f}={getattr(PROFILES[name], f)}" for f in COMPLETION_FIELDS
                          if getattr(PROFILES[name], f) != getattr(PROFILES["template"], f))
        cells = "".join(f'<td style="{_DIFF_STYLE if answer.get(k) != base.get(k) else ""}"><code>'
                        f"{_cell(answer.get(k))}</code></td>" for k in keys)
        rows.append(f'<tr><td><b>{name}</b><br><span style="color:#777;font-size:11px">{html.escape(rules or _same_rules(name))}'
                    f"</span></td>{cells}<td>{html.escape(', '.join(p.flags)) or '–'}</td></tr>")
    same = " · ".join(" = ".join(names) for names in groups.values())
    return (f"<p><b>What each server returns</b> (same answer: {html.escape(same)}; fields that differ from "
            f"template's are highlighted)</p>{_PROFILES_CSS}<table class=\"ke-profiles\">"
            "<tr><th>profile</th>" + "".join(f"<th>{k}</th>" for k in keys) + "<th>flags</th></tr>" + "".join(rows)
            + "</table>")


def conventions_html(parsed: ParsedCompletion, format_name: str) -> str:
    """The conventions the completion follows, one line each: how it ends, how the reasoning ends, the
    style of each tool-call id, and what each flag means."""
    lines = ["ends with <code>&lt;|im_end|&gt;</code>: a natural stop" if parsed.finish_reason != "length" else
             "no <code>&lt;|im_end|&gt;</code>: cut by the length limit, finish_reason <b>length</b>"]
    if PARSE_FORMATS[format_name] == "content":
        lines.append(f"{html.escape(format_name)} has no reasoning: the text before the tool section is content")
    elif parsed.think_end is not None:
        lines.append("<code>&lt;/think&gt;</code> closes the reasoning" if parsed.think_end else
                     "no <code>&lt;/think&gt;</code>: the reasoning runs straight into the tool section")
    lines += [f"tool call <code>{html.escape(c['id'])}</code>: id style <b>{tool_id_style(c['id'])}</b>, function "
              f"<code>{html.escape(c['function']['name'])}</code>" for c in parsed.tool_calls]
    lines += [f"flag <b>{html.escape(f)}</b>: {html.escape(flag_note(f))}" for f in parsed.flags]
    return "<p><b>Conventions</b></p><ul>" + "".join(f"<li>{line}</li>" for line in lines) + "</ul>"


class CompletionPlayground:
    """Paste a completion's engine IDs or its raw text (markers spelled out), see the API message a Kimi
    server returns for it (:func:`kimi_eagle.serving.answer.parse_completion`) and the conventions it follows:
    how it ends, the flags, and what each serving profile (:data:`~kimi_eagle.serving.request.PROFILES`) returns
    (``serving``: the one shown first, a name or an alias; the menu lists profile names)."""

    def __init__(self, tok: Tokenizer, ids: str = "", format_name: str = "kimi-k2.5", text: str = "",
                 serving: str = "template") -> None:
        self.tok = tok
        self.ids = W.Textarea(value=text or ids, description="completion",
                              placeholder="IDs (1, 2, 3 or [1, 2, 3]) or raw text with markers such as </think>",
                              layout=W.Layout(width="90%", height="80px"))
        self.mode = W.ToggleButtons(options=MODES, value="text" if text else "auto", description="read as")
        self.format = W.Dropdown(options=list(PARSE_FORMATS), value=format_name, description="format")
        self.serving = W.Dropdown(options=list(PROFILES), value=canonical_name(serving), description="server")
        self.strip = W.Checkbox(value=False, description="strip whitespace as the servers do")
        self.html = W.HTML()
        self.parsed: ParsedCompletion | None = None
        self.by_profile: dict[str, ParsedCompletion] = {}
        self.source_ids: list[int] = []
        self.read_as = ""
        for w in (self.ids, self.mode, self.format, self.serving, self.strip):
            w.observe(lambda _: self._render(), names="value")
        for w, name in ((self.ids, "ids"), (self.mode, "mode"), (self.format, "format"), (self.serving, "serving"),
                        (self.strip, "strip"), (self.html, "view")):
            w.add_class(f"ke-completion-{name}")  # stable hooks for browser tests
        self.widget = SnapshotBox([self.ids, self.mode, W.HBox([self.format, self.serving, self.strip]), self.html],
                                  snapshot=self.snapshot_html)
        self._render()

    def snapshot_html(self) -> str:
        """The current view as static HTML: the pasted completion as written, then the parsed message."""
        return f"<p>{self.read_as or 'completion'}: <code>{html.escape(self.ids.value)}</code></p>{self.html.value}"

    def _render(self) -> None:
        self.parsed, self.by_profile, self.source_ids, self.read_as = None, {}, [], ""
        if not self.ids.value.strip():
            self.html.value = ("<p>paste the IDs of a completion (what the engine generated after the prompt) "
                               "or its raw text</p>")
            return
        try:
            ids, self.read_as = read_completion(self.tok, self.ids.value, self.mode.value)
        except ValueError as e:
            prefix = "" if str(e).startswith("IDs") else "IDs: "
            self.html.value = f'<p style="color:#d32f2f">{prefix}{html.escape(str(e))}</p>'
            return
        self.source_ids = ids
        self.by_profile = parse_by_profile(self.tok, ids, self.format.value, self.strip.value)
        p = self.parsed = self.by_profile[self.serving.value]
        how = "IDs" if self.read_as == "IDs" else "raw text, encoded with specials allowed"
        self.html.value = "".join([
            f"<p>{len(ids)} tokens ({how}) &rarr; <b>{html.escape(self.serving.value)}</b> returns finish_reason "
            f"<b>{html.escape(p.finish_reason)}</b>{', flags ' + html.escape(', '.join(p.flags)) if p.flags else ''}</p>",
            CHIP_CSS, '<div class="ke-chips">' + _chips(self.tok, ids, 0, self.tok.special_ids) + "</div>",
            '<pre class="ke-message">' + html.escape(json.dumps(_answer(p), ensure_ascii=False, indent=1)) + "</pre>",
            conventions_html(p, self.format.value), profiles_html(self.by_profile)])
