"""The diff inspector widget and the pure HTML renderers it shares with the playgrounds.

``DiffInspector`` — dataset and record selectors, filters by verdict and subclass, both
sequences as aligned token chips (engine on top, reconstruction below; ID, text and bytes on hover,
whitespace visible, specials styled, hunks outlined, the current hunk outlined orange whatever its kind)
in a window around the current hunk, and previous/next hunk navigation. The playgrounds are in :mod:`kimi_eagle.apps.widgets.playground`.

All state lives in plain attributes and all HTML comes from pure functions, so the logic is
tested headlessly by setting widget values and reading ``.html.value``. Each ``.widget`` also carries a static
HTML snapshot of its first view (``text/html`` beside the live widget), which nbconvert and the batch's HTML
pages show where no widget state is saved.
"""
from __future__ import annotations

import html
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any, Mapping, Sequence

import ipywidgets as W
import pandas as pd

from kimi_eagle.apps.widgets.chips import CHIP_CSS, CURRENT, HUNK, chip, chip_legend_html
from kimi_eagle.apps.widgets.snapshot import SnapshotBox
from kimi_eagle.diff.align import AlignError
from kimi_eagle.diff.classify import SUBCLASSES, TOKEN_DELTA_SIGN, VERDICTS, RecordVerdict, classify
from kimi_eagle.diff.run import read_diff, read_engine, read_reconstructed
from kimi_eagle.tokenize.tokenizer import Tokenizer

ALL = "(all)"
SPLIT = ("#1976d2", "#e3f2fd")  # border, background of a hunk with the same bytes split otherwise
SEMANTIC_BG = "#ffebee"  # background of a hunk whose bytes or specials differ (border: chips.HUNK)
ALIGNED_CSS = f"""<style>
.ke-aligned{{display:flex;flex-wrap:wrap;align-items:stretch;gap:2px;padding:6px 2px;font-family:ui-monospace,monospace;font-size:12px}}
.ke-col{{display:flex;flex-direction:column;justify-content:space-between;border:1px solid transparent;padding:1px}}
.ke-col .ke-row{{min-height:22px;white-space:pre}}
.ke-col.ke-h{{border:2px solid {HUNK};background:{SEMANTIC_BG};max-width:100%;box-sizing:border-box}}
.ke-col.ke-h .ke-row{{white-space:pre-wrap;overflow-wrap:anywhere}}
.ke-col.ke-h.ke-split{{border-color:{SPLIT[0]};background:{SPLIT[1]}}}
.ke-col.ke-h.ke-cur{{outline:4px solid {CURRENT};outline-offset:2px;position:relative;z-index:1;margin:0 6px;max-width:calc(100% - 12px)}}
.ke-legend{{font-size:12px;color:#555;margin:4px 0;line-height:1.9}}
.ke-meta-box{{max-height:16em;overflow:auto}}
.ke-meta td{{padding:1px 8px;font-size:13px}}
</style>"""

Sequences = Mapping[str, tuple[Sequence[int], Sequence[int], Sequence[Mapping[str, Any]]]]
# one column of the aligned view before rendering: ("eq", a, b) an equal token at engine index a and
# reconstructed index b, ("hunk", n, 0) hunk n, ("gap", n_equal, first_hidden_hunk, last_hidden_hunk) elided
Column = tuple


# --------------------------------------------------------------------------------------------
# pure rendering


def _chips(tok: Tokenizer, ids: Sequence[int], start: int, specials: frozenset[int]) -> str:
    return "".join(chip(tok, t, start + k, "", specials) for k, t in enumerate(ids)) or "<i>∅</i>"


def legend_html(top: str = "engine IDs", bottom: str = "reconstructed IDs") -> str:
    """The aligned view's legend: every colour it draws, each shown with the very colours drawn."""
    def entry(key: str, style: str, text: str) -> str:
        return f'<span data-legend="{key}"><span class="ke-swatch" style="{style}"></span> {text}</span>'

    return (f'<div class="ke-legend">top row: {html.escape(top)} · bottom row: {html.escape(bottom)} · '
            + entry("semantic", f"border:2px solid {HUNK};background:{SEMANTIC_BG}", "hunk: bytes or specials differ")
            + " · " + entry("split", f"border:2px solid {SPLIT[0]};background:{SPLIT[1]}", "hunk: same bytes, other split")
            + " · " + entry("current", f"outline:3px solid {CURRENT};outline-offset:1px",
                            "current hunk (outlined, whatever its kind)")
            + "<br>" + chip_legend_html() + "</div>")


def _plan(v: RecordVerdict, current: int | None, context: int, window: bool) -> list[Column]:
    """Which columns the aligned view shows, in order (see ``Column``); elided runs become one gap each.

    ``window``: only engine tokens within ``context`` of the current hunk, and the hunks they touch;
    otherwise ``context`` equal tokens on each side of every hunk (``context < 0``: everything)."""
    hunks = v.hunks
    windowed = window and current is not None and context >= 0
    if windowed:
        cur = hunks[current].hunk
        lo, hi = cur.a_start - context, cur.a_end + context
    items: list[tuple[str, int, int, bool]] = []

    def equal_run(a0: int, a1: int, b0: int, lead: bool, trail: bool) -> None:
        n = a1 - a0
        for k in range(n):
            if windowed:
                keep = lo <= a0 + k < hi
            else:
                keep = context < 0 or n <= 2 * context or (lead and k < context) or (trail and k >= n - context)
            items.append(("eq", a0 + k, b0 + k, keep))

    ia = ib = 0
    for n, hv in enumerate(hunks):
        h = hv.hunk
        equal_run(ia, h.a_start, ib, lead=n > 0, trail=True)
        items.append(("hunk", n, 0, not windowed or n == current or (h.a_start < hi and h.a_end > lo)))
        ia, ib = h.a_end, h.b_end
    equal_run(ia, len(v.alignment.a), ib, lead=bool(hunks), trail=False)
    plan: list[Column] = []
    gap: list[int] = [0]  # hidden equal tokens, then the hidden hunks' numbers
    for kind, x, y, keep in items:
        if keep:
            if gap != [0]:
                plan.append(("gap", gap[0], *((gap[1], gap[-1]) if len(gap) > 1 else ())))
                gap = [0]
            plan.append((kind, x, y))
        elif kind == "eq":
            gap[0] += 1
        else:
            gap.append(x)
    if gap != [0]:
        plan.append(("gap", gap[0], *((gap[1], gap[-1]) if len(gap) > 1 else ())))
    return plan


def _gap_html(column: Column) -> str:
    n_equal, hidden = column[1], column[2:]
    text = f"…{n_equal} equal…"
    if hidden:
        first, last = hidden[0] + 1, hidden[1] + 1
        text = f"…{n_equal} equal and hunk{'s' if last > first else ''} {first}{'–' + str(last) if last > first else ''}…"
    return f'<div class="ke-col ke-gap"><div class="ke-row">{text}</div><div class="ke-row"></div></div>'


def _hunk_html(tok: Tokenizer, v: RecordVerdict, n: int, current: int | None, specials: frozenset[int]) -> str:
    hv, al = v.hunks[n], v.alignment
    h = hv.hunk
    cls = "ke-col ke-h" + (" ke-split" if hv.kind == "split" else "") + (" ke-cur" if n == current else "")
    title = html.escape(f"hunk {n + 1}: {hv.subclass or hv.kind} in {hv.segment or '?'}; "
                        f"engine tokens {h.a_start}:{h.a_end} bytes {h.a_byte_start}:{h.a_byte_end}; "
                        f"reconstructed tokens {h.b_start}:{h.b_end} bytes {h.b_byte_start}:{h.b_byte_end}")
    return (f'<div class="{cls}" title="{title}" data-hunk="{n}">'
            f'<div class="ke-row">{_chips(tok, al.a[h.a_start:h.a_end], h.a_start, specials)}</div>'
            f'<div class="ke-row">{_chips(tok, al.b[h.b_start:h.b_end], h.b_start, specials)}</div></div>')


def aligned_html(tok: Tokenizer, v: RecordVerdict, current: int | None = None, context: int = 40,
                 top: str = "engine IDs", bottom: str = "reconstructed IDs", window: bool = False) -> str:
    """Engine (top) and reconstruction (bottom) as aligned columns: one per equal token, one per hunk.

    Only ``context`` equal tokens around each hunk are shown (elided runs are counted);
    ``context < 0`` shows everything. With ``window`` only ``context`` tokens either side of the
    ``current`` hunk are shown, so the current hunk sits near the top of the view whatever its position.
    ``top``/``bottom`` name the two rows in the legend; the ``current`` hunk is outlined in
    :data:`~kimi_eagle.apps.widgets.chips.CURRENT` whatever its kind.
    """
    al, specials = v.alignment, tok.special_ids
    cols = []
    for column in _plan(v, current, context, window):
        if column[0] == "gap":
            cols.append(_gap_html(column))
        elif column[0] == "hunk":
            cols.append(_hunk_html(tok, v, column[1], current, specials))
        else:
            a, b = column[1], column[2]
            cols.append('<div class="ke-col">'
                        f'<div class="ke-row">{chip(tok, al.a[a], a, "", specials)}</div>'
                        f'<div class="ke-row">{chip(tok, al.b[b], b, "", specials)}</div></div>')
    return CHIP_CSS + ALIGNED_CSS + legend_html(top, bottom) + '<div class="ke-aligned">' + "".join(cols) + "</div>"


def hunk_table_html(v: RecordVerdict, current: int | None) -> str:
    rows = []
    for n, hv in enumerate(v.hunks):
        h = hv.hunk
        mark = "▶" if n == current else ""
        rows.append(f"<tr><td>{mark}{n + 1}</td><td>{html.escape(hv.kind)}</td><td>{html.escape(hv.subclass or '')}</td>"
                    f"<td>{html.escape(hv.segment)}</td><td>{h.a_byte_start}:{h.a_byte_end}</td>"
                    f"<td>{h.b_byte_start}:{h.b_byte_end}</td><td>{h.token_delta:+d}</td>"
                    f"<td>{html.escape(repr(v.alignment.a.run_bytes(h.a_start, h.a_end))[:60])}</td>"
                    f"<td>{html.escape(repr(v.alignment.b.run_bytes(h.b_start, h.b_end))[:60])}</td></tr>")
    head = ("<tr><th>#</th><th>kind</th><th>subclass</th><th>segment</th><th>engine bytes</th><th>recon bytes</th>"
            f"<th>Δ tokens ({TOKEN_DELTA_SIGN})</th><th>engine</th><th>reconstructed</th></tr>")
    if not rows:
        return "<p>no hunks: the IDs are identical</p>"
    return f'<div class="ke-meta-box"><table class="ke-meta">{head}{"".join(rows)}</table></div>'


def parse_ids(text: str) -> list[int]:
    """IDs from pasted text: a JSON list of integers, or integers separated by commas/whitespace; anything else
    (``[1.5]``, ``[true]``, ``1.5``) raises ``ValueError`` with a one-line message."""
    text = text.strip()
    if not text:
        return []
    if text.startswith("["):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"not a JSON list of integers ({e})") from None
        if not isinstance(value, list):
            raise ValueError("not a JSON list of integers")
        bad = next((x for x in value if isinstance(x, bool) or not isinstance(x, int)), None)
        if bad is not None:  # nothing is coerced: [1.5] is not ID 1
            raise ValueError(f"IDs must be integers: {json.dumps(bad)} is not")
        return value
    try:
        return [int(x) for x in re.split(r"[\s,]+", text) if x != ""]
    except ValueError:
        raise ValueError("IDs must be integers separated by commas or spaces, or a JSON list") from None


# --------------------------------------------------------------------------------------------
# diff inspector


class DiffInspector:
    """Browse a diff: filter records, pick one, step through its hunks.

    The three filters combine (a record is listed when it passes all of them). Each filter's options carry
    their counts among the records the other two let through; the subclass filter offers only the
    subclasses found there (and the one selected).
    The aligned view shows a window of ``context`` tokens around the current hunk, so stepping to a hunk
    brings it on screen (just below the controls) wherever it lies in the record."""

    def __init__(self, tok: Tokenizer, records: pd.DataFrame, sequences: Sequences, context: int = 40) -> None:
        self.tok = tok
        self.records = records[records["status"] == "ok"].reset_index(drop=True)
        self.sequences = sequences
        self.record_verdict: RecordVerdict | None = None
        self.hunk_index: int | None = None
        self._datasets = sorted(self.records["dataset"].dropna().unique().tolist())
        self.dataset = W.Dropdown(options=[ALL, *self._datasets], value=ALL, description="dataset")
        self.verdict_filter = W.Dropdown(options=[ALL, *VERDICTS], value=ALL, description="verdict")
        self.subclass_filter = W.Dropdown(options=[ALL, *SUBCLASSES], value=ALL, description="subclass")
        self.record = W.Dropdown(options=[], description="record", layout=W.Layout(width="480px"))
        self.prev_button = W.Button(description="◀ previous hunk", layout=W.Layout(width="150px"))
        self.next_button = W.Button(description="next hunk ▶", layout=W.Layout(width="150px"))
        self.context = W.IntSlider(value=context, min=5, max=200, step=5, description="context")
        self.position = W.HTML()
        self.html = W.HTML()
        self._quiet = False  # set while the filters' and the record's options are being rewritten
        self._facets: dict[str, list[tuple[str, str]]] = {}
        for w in (self.dataset, self.verdict_filter, self.subclass_filter):
            w.observe(lambda _: None if self._quiet else self._refilter(), names="value")
        self.record.observe(lambda _: None if self._quiet else self._select(), names="value")
        self.context.observe(lambda _: self._render(), names="value")
        self.prev_button.on_click(lambda _: self.step(-1))
        self.next_button.on_click(lambda _: self.step(+1))
        for w, name in ((self.dataset, "dataset"), (self.verdict_filter, "verdict"), (self.subclass_filter, "subclass"),
                        (self.record, "record"), (self.prev_button, "prev"), (self.next_button, "next"),
                        (self.position, "position"), (self.html, "view")):
            w.add_class(f"ke-inspector-{name}")  # stable hooks for browser tests
        self.widget = SnapshotBox([
            W.HBox([self.dataset, self.verdict_filter, self.subclass_filter]),
            W.HBox([self.record, self.prev_button, self.next_button, self.position]),
            self.context, self.html,
        ], snapshot=self.snapshot_html)
        self._refilter()

    @classmethod
    def from_files(cls, tok: Tokenizer, diff_dir: str | Path, engine_path: str | Path, recon_path: str | Path,
                   **kw: Any) -> "DiffInspector":
        """Load a diff directory and the two inputs it was made from."""
        records = read_diff(diff_dir).records
        engine = read_engine(engine_path, tok)
        seqs = {str(r["id"]): (engine[str(r["id"])].output_ids or [], r["completion_ids"] or [], r["segments"] or [])
                for r in read_reconstructed(recon_path) if str(r["id"]) in engine and r.get("status") == "ok"}
        return cls(tok, records, seqs, **kw)

    # -- state

    def _matching(self, skip: str = "") -> pd.DataFrame:
        """The records (with sequences) that pass every filter but ``skip`` ("dataset", "verdict", "subclass")."""
        r = self.records
        mask = r["id"].isin(self.sequences.keys())
        if skip != "dataset" and self.dataset.value != ALL:
            mask &= r["dataset"] == self.dataset.value
        if skip != "verdict" and self.verdict_filter.value != ALL:
            mask &= r["verdict"] == self.verdict_filter.value
        if skip != "subclass" and self.subclass_filter.value != ALL:
            sub = self.subclass_filter.value
            mask &= r["subclasses"].map(lambda s: s is not None and sub in list(s))
        return r[mask]

    @property
    def filtered_ids(self) -> list[str]:
        """The IDs of the records that pass all three filters, in the diff's order."""
        return self._matching()["id"].tolist()

    def facet_counts(self, name: str) -> tuple[int, Counter]:
        """For filter ``name``: how many records the other two filters let through, and per value of this
        one how many of those have it (a record with several subclasses counts once for each)."""
        rows = self._matching(name)
        if name == "subclass":
            values = [c for s in rows["subclasses"] if s is not None for c in list(s)]
        else:
            values = rows[name].dropna().tolist()
        return len(rows), Counter(values)

    def _update_facets(self) -> None:
        for name, w, order in (("dataset", self.dataset, self._datasets), ("verdict", self.verdict_filter, VERDICTS),
                               ("subclass", self.subclass_filter, SUBCLASSES)):
            total, counts = self.facet_counts(name)
            # datasets and verdicts are few: all are listed, zeros too; subclasses only where found (or selected)
            options = [(f"all ({total})", ALL)] + [(f"{x} ({counts[x]})", x) for x in order
                                                   if counts[x] or x == w.value or name != "subclass"]
            if self._facets.get(name) != options:
                self._facets[name] = options
                value = w.value
                with w.hold_sync():
                    w.options = options
                    w.value = value

    @property
    def current_id(self) -> str | None:
        return self.record.value

    def _refilter(self) -> None:
        labels = self.records.set_index("id")["label"]
        verdicts = self.records.set_index("id")["verdict"]
        self._quiet = True
        try:
            self._update_facets()
            ids = self.filtered_ids
            with self.record.hold_sync():
                self.record.options = [(f"{i} [{labels[i]}]", i) for i in ids]
                # open on the first record with something to see (an exact record has no hunks)
                self.record.value = next((i for i in ids if verdicts[i] != "exact"), ids[0] if ids else None)
        finally:
            self._quiet = False
        self._select()

    def _select(self) -> None:
        rid = self.record.value
        if rid is None:
            self.record_verdict, self.hunk_index = None, None
        else:
            engine_ids, recon_ids, segments = self.sequences[rid]
            try:
                self.record_verdict = classify(self.tok, list(engine_ids), list(recon_ids), list(segments))
            except AlignError as e:
                self.record_verdict = None
                self.html.value = f"<b>{html.escape(rid)}</b>: {html.escape(str(e))}"
                return
            self.hunk_index = 0 if self.record_verdict.hunks else None
        self._render()

    def _with_hunks(self) -> list[str]:
        """The listed records that have hunks to step through (every verdict but ``exact``), in the list's order."""
        verdicts = self.records.set_index("id")["verdict"]
        return [i for i in self.filtered_ids if verdicts[i] != "exact"]

    def _next_record(self, delta: int) -> str | None:
        """The record whose hunk ``step(delta)`` moves to when it leaves this record (past its last hunk, or before
        its first): the next (previous) listed record with hunks, wrapping around the list; None when this record
        is the only one with hunks."""
        ids = self._with_hunks()
        if not ids or ids == [self.current_id]:
            return None
        k = ids.index(self.current_id) if self.current_id in ids else (-1 if delta > 0 else 0)
        return ids[(k + delta) % len(ids)]

    def step(self, delta: int) -> None:
        """Move to the previous (-1) or next (+1) hunk. Past a record's last hunk "next" moves to the first hunk of
        the next listed record with hunks (before its first, "previous" to the previous record's last hunk),
        wrapping around the list; a record that is the only one with hunks wraps around its own hunks."""
        if self.record_verdict is None or not self.record_verdict.hunks:
            return
        n, k = len(self.record_verdict.hunks), (self.hunk_index or 0) + delta
        other = None if 0 <= k < n else self._next_record(delta)
        if other is None:
            self.hunk_index = k % n
            self._render()
            return
        self.record.value = other  # selects it (its first hunk)
        if delta < 0 and self.record_verdict is not None and self.record_verdict.hunks:
            self.hunk_index = len(self.record_verdict.hunks) - 1
            self._render()

    # -- view

    def snapshot_html(self) -> str:
        """The current view as static HTML: the filters and record as text, then the hunk table and chips."""
        state = (f"dataset <b>{html.escape(str(self.dataset.value))}</b> · verdict <b>{html.escape(str(self.verdict_filter.value))}</b>"
                 f" · subclass <b>{html.escape(str(self.subclass_filter.value))}</b> · {len(self.filtered_ids)} records"
                 f" · {html.escape(self.position.value)}")
        return f"<p>{state}</p>{self.html.value}"

    def _render(self) -> None:
        v = self.record_verdict
        if v is None:
            self.position.value = ""
            chosen = [f"{name} <b>{html.escape(str(w.value))}</b>" for name, w in (
                ("dataset", self.dataset), ("verdict", self.verdict_filter), ("subclass", self.subclass_filter))
                if w.value != ALL]
            self.html.value = f"<p>no record matches the filters{': ' + ' and '.join(chosen) if chosen else ''}</p>"
            return
        n = len(v.hunks)
        kind = n and (v.hunks[self.hunk_index].subclass or v.hunks[self.hunk_index].kind)
        alone = self._next_record(+1) is None  # stepping never leaves this record
        position = f"hunk {self.hunk_index + 1}/{n}: {kind}" if n else "no hunks"
        # a button that would change nothing (the only hunk of the only record with hunks) is disabled, and says so
        if n == 1 and alone:
            position += " (the only hunk of the listed records)"
        elif n and self.hunk_index == n - 1 and not alone:
            position += " (next ▶ goes to the next record)"
        rid = html.escape(self.current_id or "")
        head = (f"<p><b>{rid}</b> — verdict <b>{v.verdict}</b>, label <b>{v.label}</b>"
                f"{' (' + ', '.join(v.subclasses) + ')' if v.subclasses else ''}; engine {v.n_engine} tokens, "
                f"reconstructed {v.n_recon}; token delta ({TOKEN_DELTA_SIGN}) {v.token_delta:+d}; {n} hunks"
                f"{'; engine canonical: ' + str(v.engine_canonical) if v.engine_canonical is not None else ''}</p>")
        # the window around the current hunk first, right below the controls; the table of all hunks after it.
        # The view is set before the position line, so a page that sees the new position sees the new view.
        self.html.value = (head + aligned_html(self.tok, v, self.hunk_index, self.context.value, window=True)
                           + hunk_table_html(v, self.hunk_index))
        self.prev_button.disabled = self.next_button.disabled = n == 0 or (n == 1 and alone)
        self.position.value = position
