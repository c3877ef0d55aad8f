"""The diff inspector widget and the pure HTML renderers it shares with the playgrounds.

``DiffInspector`` — dataset and record selectors, filters by verdict and subclass, both
sequences as aligned token chips (engine on top, reconstruction below; ID and bytes on hover,
whitespace visible, specials styled, hunks outlined, the current hunk marked) and previous/next
hunk navigation. The playgrounds are in :mod:`kimi_eagle.apps.widgets.playground`.

All state lives in plain attributes and all HTML comes from pure functions, so the logic is
tested headlessly by setting widget values and reading ``.html.value``. Each ``.widget`` also carries a static
HTML snapshot of its first view (``text/html`` beside the live widget), which nbconvert and the batch's HTML
pages show where no widget state is saved.
"""
from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import ipywidgets as W
import pandas as pd

from kimi_eagle.apps.widgets.chips import CHIP_CSS, chip
from kimi_eagle.apps.widgets.snapshot import SnapshotBox
from kimi_eagle.diff.align import AlignError
from kimi_eagle.diff.classify import SUBCLASSES, VERDICTS, RecordVerdict, classify
from kimi_eagle.diff.run import read_diff, read_engine, read_reconstructed
from kimi_eagle.tokenize.tokenizer import Tokenizer

ALL = "(all)"
ALIGNED_CSS = """<style>
.ke-aligned{display:flex;flex-wrap:wrap;align-items:stretch;gap:2px;font-family:ui-monospace,monospace;font-size:12px}
.ke-col{display:flex;flex-direction:column;justify-content:space-between;border:1px solid transparent;padding:1px}
.ke-col .ke-row{min-height:22px;white-space:pre}
.ke-col.ke-h{border:2px solid #d32f2f;background:#ffebee;max-width:100%;box-sizing:border-box}
.ke-col.ke-h .ke-row{white-space:pre-wrap;overflow-wrap:anywhere}
.ke-col.ke-h.ke-cur{border:3px solid #ff6f00;background:#fff3e0}
.ke-col.ke-h.ke-split{border-color:#1976d2;background:#e3f2fd}
.ke-legend{font-size:12px;color:#555;margin:4px 0}
.ke-meta td{padding:1px 8px;font-size:13px}
</style>"""

Sequences = Mapping[str, tuple[Sequence[int], Sequence[int], Sequence[Mapping[str, Any]]]]


# --------------------------------------------------------------------------------------------
# pure rendering


def _chips(tok: Tokenizer, ids: Sequence[int], start: int, specials: frozenset[int]) -> str:
    return "".join(chip(tok, t, start + k, "", specials) for k, t in enumerate(ids)) or "<i>∅</i>"


def aligned_html(tok: Tokenizer, v: RecordVerdict, current: int | None = None, context: int = 40,
                 top: str = "engine IDs", bottom: str = "reconstructed IDs") -> str:
    """Engine (top) and reconstruction (bottom) as aligned columns: one per equal token, one per hunk.

    Only ``context`` equal tokens around each hunk are shown (elided runs are counted);
    ``context < 0`` shows everything. ``top``/``bottom`` name the two rows in the legend.
    """
    al = v.alignment
    specials = tok.special_ids
    cols: list[str] = []
    ia = ib = 0

    def equal_run(a0: int, a1: int, b0: int, lead: bool, trail: bool) -> None:
        n = a1 - a0
        keep = range(n) if context < 0 or n <= 2 * context else None
        if keep is None:
            head = range(0, context) if lead else range(0)
            tail = range(n - context, n) if trail else range(0)
            keep = list(head) + [-1] + list(tail)
        for k in keep:
            if k == -1:
                hidden = n - (context if lead else 0) - (context if trail else 0)
                cols.append(f'<div class="ke-col"><div class="ke-row">…{hidden} equal…</div><div class="ke-row"></div></div>')
                continue
            t = al.a[a0 + k]
            cols.append('<div class="ke-col">'
                        f'<div class="ke-row">{chip(tok, t, a0 + k, "", specials)}</div>'
                        f'<div class="ke-row">{chip(tok, t, b0 + k, "", specials)}</div></div>')

    for n, hv in enumerate(v.hunks):
        h = hv.hunk
        equal_run(ia, h.a_start, ib, lead=n > 0, trail=True)
        cls = "ke-col ke-h" + (" ke-split" if hv.kind == "split" else "") + (" ke-cur" if n == current else "")
        title = html.escape(f"hunk {n + 1}: {hv.subclass or hv.kind} in {hv.segment or '?'}; "
                            f"engine tokens {h.a_start}:{h.a_end} bytes {h.a_byte_start}:{h.a_byte_end}; "
                            f"reconstructed tokens {h.b_start}:{h.b_end} bytes {h.b_byte_start}:{h.b_byte_end}")
        cols.append(f'<div class="{cls}" title="{title}" data-hunk="{n}">'
                    f'<div class="ke-row">{_chips(tok, al.a[h.a_start:h.a_end], h.a_start, specials)}</div>'
                    f'<div class="ke-row">{_chips(tok, al.b[h.b_start:h.b_end], h.b_start, specials)}</div></div>')
        ia, ib = h.a_end, h.b_end
    equal_run(ia, len(al.a), ib, lead=bool(v.hunks), trail=False)
    legend = (f'<div class="ke-legend">top row: {html.escape(top)} · bottom row: {html.escape(bottom)} · '
              '<span style="color:#1976d2">blue</span>: same bytes, other split · '
              '<span style="color:#d32f2f">red</span>: bytes or specials differ · '
              '<span style="color:#ff6f00">orange</span>: current hunk · hover a chip for its ID and bytes</div>')
    return CHIP_CSS + ALIGNED_CSS + legend + '<div class="ke-aligned">' + "".join(cols) + "</div>"


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
            "<th>Δ tokens</th><th>engine</th><th>reconstructed</th></tr>")
    return f'<table class="ke-meta">{head}{"".join(rows)}</table>' if rows else "<p>no hunks: the IDs are identical</p>"


def parse_ids(text: str) -> list[int]:
    """IDs from pasted text: a JSON list, or integers separated by commas/whitespace."""
    text = text.strip()
    if not text:
        return []
    if text.startswith("["):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"not a JSON list of integers ({e})") from None
    else:
        value = re.split(r"[\s,]+", text)
    try:
        return [int(x) for x in value if x != ""]
    except (TypeError, ValueError):
        raise ValueError("IDs must be integers separated by commas or spaces, or a JSON list") from None


# --------------------------------------------------------------------------------------------
# diff inspector


class DiffInspector:
    """Browse a diff: filter records, pick one, step through its hunks."""

    def __init__(self, tok: Tokenizer, records: pd.DataFrame, sequences: Sequences, context: int = 40) -> None:
        self.tok = tok
        self.records = records[records["status"] == "ok"].reset_index(drop=True)
        self.sequences = sequences
        self.record_verdict: RecordVerdict | None = None
        self.hunk_index: int | None = None
        datasets = sorted(self.records["dataset"].dropna().unique().tolist())
        self.dataset = W.Dropdown(options=[ALL, *datasets], value=ALL, description="dataset")
        self.verdict_filter = W.Dropdown(options=[ALL, *VERDICTS], value=ALL, description="verdict")
        self.subclass_filter = W.Dropdown(options=[ALL, *SUBCLASSES], value=ALL, description="subclass")
        self.record = W.Dropdown(options=[], description="record", layout=W.Layout(width="480px"))
        self.prev_button = W.Button(description="◀ previous hunk", layout=W.Layout(width="150px"))
        self.next_button = W.Button(description="next hunk ▶", layout=W.Layout(width="150px"))
        self.context = W.IntSlider(value=context, min=5, max=200, step=5, description="context")
        self.position = W.HTML()
        self.html = W.HTML()
        for w in (self.dataset, self.verdict_filter, self.subclass_filter):
            w.observe(lambda _: self._refilter(), names="value")
        self._quiet = False
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

    @property
    def filtered_ids(self) -> list[str]:
        r = self.records
        mask = r["id"].isin(self.sequences.keys())
        if self.dataset.value != ALL:
            mask &= r["dataset"] == self.dataset.value
        if self.verdict_filter.value != ALL:
            mask &= r["verdict"] == self.verdict_filter.value
        if self.subclass_filter.value != ALL:
            mask &= r["subclasses"].map(lambda s: self.subclass_filter.value in list(s))
        return r.loc[mask, "id"].tolist()

    @property
    def current_id(self) -> str | None:
        return self.record.value

    def _refilter(self) -> None:
        labels = self.records.set_index("id")["label"]
        ids = self.filtered_ids
        self._quiet = True
        try:
            self.record.options = [(f"{i} [{labels[i]}]", i) for i in ids]
            verdicts = self.records.set_index("id")["verdict"]
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

    def step(self, delta: int) -> None:
        """Move to the previous (-1) or next (+1) hunk, wrapping around."""
        if self.record_verdict is None or not self.record_verdict.hunks:
            return
        n = len(self.record_verdict.hunks)
        self.hunk_index = ((self.hunk_index or 0) + delta) % n
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
            self.html.value = "<p>no record matches the filters</p>"
            return
        n = len(v.hunks)
        self.position.value = f"hunk {self.hunk_index + 1}/{n}" if n else "no hunks"
        self.prev_button.disabled = self.next_button.disabled = n == 0
        rid = html.escape(self.current_id or "")
        head = (f"<p><b>{rid}</b> — verdict <b>{v.verdict}</b>, label <b>{v.label}</b>"
                f"{' (' + ', '.join(v.subclasses) + ')' if v.subclasses else ''}; engine {v.n_engine} tokens, "
                f"reconstructed {v.n_recon} ({v.token_delta:+d}); {n} hunks"
                f"{'; engine canonical: ' + str(v.engine_canonical) if v.engine_canonical is not None else ''}</p>")
        self.html.value = head + hunk_table_html(v, self.hunk_index) + aligned_html(self.tok, v, self.hunk_index, self.context.value)
