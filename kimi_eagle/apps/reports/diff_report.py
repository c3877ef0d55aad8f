"""``kimi-eagle report DIFF_DIR -o REPORT_DIR``: summary.json, review charts, and report.html.

The numbers come from :mod:`kimi_eagle.diff.summary` (screening, rates with Wilson 95% intervals and, when the
diff carries expected labels from ``kimi-eagle simulate``, the confusion table with each class's precision and
recall); this module draws the charts and the page with the report toolkit (:mod:`kimi_eagle.apps.reports.toolkit`).

Every output says whether its numbers come from **simulated** data (a labelled benchmark whose
mismatch rates are set by how many effects were injected) or **real** engine/API pairs: the report's
header, every chart title and ``summary.json["data"]``. Charts are drawn on
:class:`matplotlib.figure.Figure` objects, so importing this module never touches pyplot's backend.

One bad record never takes down the report: :func:`~kimi_eagle.diff.summary.screen_diff` leaves out every record
or hunk whose fields cannot be counted, and any unforeseen exception while drawing a chart, rendering a section or
one example hunk replaces that part with a visible note naming the record and the reason. ``summary.json``
counts what was left out (``left_out``) and lists why; the report shows the same list near its top.
"""
from __future__ import annotations

import html
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from kimi_eagle.apps.reports.outputs import write_summary_tables
from kimi_eagle.apps.reports.toolkit import (
    SIGN_CONVENTION,
    TOY_NOTE,
    VERDICT_COLORS,
    chart_embedder,
    count_axis,
    draw_charts,
    figure,
    finding,
    html_page,
    html_table,
    integer_axis,
    left_out_section,
    no_data,
    plain,
    save,
    section,
    serving_evidence_html,
    title,
)
from kimi_eagle.diff.classify import LABELS, TOKEN_DELTA_SIGN
from kimi_eagle.diff.run import DiffResult
from kimi_eagle.diff.summary import (
    LEFT_OUT_PARTS,
    MAX_NOTES,
    confusion,
    data_kind,
    error_reason,
    left_out_counts,
    left_out_note,
    rates_by_dataset,
    screen_diff,
    summarize_diff,
)
from kimi_eagle.io import write_text
from kimi_eagle.serving.evidence import serving_by_provider, serving_evidence, serving_line

if TYPE_CHECKING:
    from kimi_eagle.tokenize.tokenizer import Tokenizer

DATA_NOTES = {
    "simulated": "SIMULATED data: a labelled benchmark with injected effects; its rates measure the classifier, "
                 "not how often real reconstructions differ (they are set by how many effects were injected).",
    "real": "REAL data: engine token IDs against IDs reconstructed from the API text for the same generations.",
    "toy": TOY_NOTE,
}
DATA_KINDS = tuple(DATA_NOTES)  # what ``data`` may be: simulated, real, or toy (a toy model on the real engine)
# the report's billing section: "not explained by hunks" (billed − engine), never "unexplained", which on the billing
# page means "not explained by a known provider convention"
BILLING_HEADERS = {"n_records_billed": "records billed", "billed_completion_tokens": "billed tokens",
                   "reconstructed_completion_tokens": "reconstructed tokens",
                   "delta": "gap (billed − reconstructed)", "explained_by_hunks": "explained by hunks (engine − reconstructed)",
                   "unexplained": "gap not explained by hunks (billed − engine)",
                   "n_records_unexplained": "records with a gap not explained by hunks",
                   "billed_reasoning_tokens": "billed reasoning tokens",
                   "reconstructed_reasoning_tokens": "reconstructed reasoning tokens"}
CHARTS = ("mismatch_rate_by_dataset", "verdicts", "hunk_sizes", "token_delta", "first_divergence", "billing", "confusion")
Image = Callable[[str, str], str]


def _ok(records: pd.DataFrame) -> pd.DataFrame:
    return records[records["status"] == "ok"]


# --------------------------------------------------------------------------------------------
# charts


def chart_rates(rates: pd.DataFrame, data: str | None = None) -> Figure:
    fig, ax = figure((max(6.5, 1.6 * len(rates) + 2), 4.4))
    x = np.arange(len(rates))
    for off, what, color in ((-0.2, "mismatch", "#ff8f00"), (0.2, "semantic", "#d32f2f")):
        rate = rates[f"{what}_rate"].fillna(0).to_numpy(dtype=float)
        err = np.clip(np.array([rate - rates[f"{what}_lo"], rates[f"{what}_hi"] - rate], dtype=float), 0, None)
        bars = ax.bar(x + off, rate, 0.4, yerr=err, capsize=4, color=color,
                      label=f"{what} (not exact)" if what == "mismatch" else "semantic (bytes differ)")
        ax.bar_label(bars, labels=[f"{k}/{n}" for k, n in zip(rates[what], rates["n"])], padding=3, fontsize=8)
    ax.set_xticks(x, [plain(d) for d in rates["dataset"]])  # dataset names are data, never mathtext
    ax.set_ylim(0, 1.15)
    ax.set(xlabel="dataset", ylabel="share of ok records")
    title(ax, "Records whose reconstruction differs from the engine (Wilson 95% CI)", data)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return fig


def _count_bars(ax: Any, labels: list[str], counts: list[int], colors: list[str], empty: str) -> None:
    """Horizontal bars of ``counts`` (first label on top), each labelled with its count; ``empty`` when none."""
    if not labels:
        no_data(ax, empty)
        return
    bars = ax.barh(labels[::-1], counts[::-1], color=colors[::-1])
    ax.bar_label(bars, padding=3, fontsize=8)
    ax.margins(x=0.15)
    integer_axis(ax, "x")


def chart_verdicts(records: pd.DataFrame, hunks: pd.DataFrame, data: str | None = None) -> Figure:
    ok = _ok(records)
    fig, (ax1, ax2) = figure((12, 4.4), ncols=2)
    labels = [c for c in LABELS if (ok["label"] == c).any()]
    counts = [int((ok["label"] == c).sum()) for c in labels]
    verdict_of = {"exact": "exact", "bpe_split": "bpe_split"}  # every other label is a semantic difference
    _count_bars(ax1, labels, counts, [VERDICT_COLORS[verdict_of.get(c, "semantic")] for c in labels], "ok records")
    ax1.set(xlabel="records", ylabel="label")
    title(ax1, f"Record labels ({len(ok):,} ok records)", data)
    cls = hunks["subclass"].fillna(hunks["kind"]).value_counts()
    _count_bars(ax2, list(cls.index), [int(v) for v in cls.values],
                [VERDICT_COLORS["bpe_split" if c == "split" else "semantic"] for c in cls.index], "hunks")
    ax2.set(xlabel="hunks", ylabel="split or semantic subclass")
    title(ax2, f"Hunks by class ({len(hunks):,} hunks)", data)
    fig.tight_layout()
    return fig


def _side_by_side_hist(ax, groups: list[tuple[str, pd.Series, str]], bins: np.ndarray) -> None:
    """One histogram per group with bars side by side in each bin (none hidden behind another), counts on top."""
    groups = [(name, values, color) for name, values, color in groups if len(values)]
    if not groups:
        return
    counts, _, containers = ax.hist([g[1].to_numpy(dtype=float) for g in groups], bins=bins,
                                    color=[g[2] for g in groups], label=[f"{g[0]} ({len(g[1]):,})" for g in groups])
    counts = counts if len(groups) > 1 else [counts]
    containers = containers if len(groups) > 1 else [containers]
    for c, bars in zip(counts, containers):
        ax.bar_label(bars, labels=[f"{int(v)}" if v else "" for v in c], fontsize=7, padding=1)
    ax.legend(fontsize=8)
    ax.margins(y=0.12)
    integer_axis(ax, "y")


def chart_hunk_sizes(hunks: pd.DataFrame, data: str | None = None) -> Figure:
    fig, ax = figure((8.5, 4.2))
    if len(hunks):
        size = np.maximum(hunks["engine_tok_end"] - hunks["engine_tok_start"], hunks["recon_tok_end"] - hunks["recon_tok_start"])
        clipped = np.minimum(size, 30)
        _side_by_side_hist(ax, [(kind, clipped[hunks["kind"] == kind], color)
                                for kind, color in (("split", "#1976d2"), ("semantic", "#d32f2f"))],
                           np.arange(0.5, 31.5))
    else:
        no_data(ax, "hunks")
    integer_axis(ax, "x")
    ax.set(xlabel="tokens", ylabel="hunks")
    title(ax, "Hunk size (tokens on the longer side; 30 = 30 or more)", data)
    fig.tight_layout()
    return fig


def chart_token_delta(records: pd.DataFrame, data: str | None = None) -> Figure:
    ok = _ok(records)
    diff = ok[ok["verdict"] != "exact"]
    fig, ax = figure((8.5, 4.2))
    if len(diff):
        d = diff["token_delta"].clip(-20, 20)  # the one sign: TOKEN_DELTA_SIGN, as stored in records.parquet
        counts, _, bars = ax.hist(d, bins=np.arange(-20.5, 21.5), color="#6a1b9a",
                                  label=f"differing records ({len(diff):,})")
        ax.bar_label(bars, labels=[f"{int(c)}" if c else "" for c in counts], fontsize=7, padding=1)
        ax.legend(fontsize=8)
        count_axis(ax, float(max(counts)))
    else:
        no_data(ax, "differing records")
        ax.set_ylabel("records")
    integer_axis(ax, "x")
    ax.set(xlabel=f"token delta: {TOKEN_DELTA_SIGN} tokens (clipped at ±20)")
    title(ax, f"Token-count delta per differing record ({len(diff):,} records)", data)
    fig.tight_layout()
    return fig


def chart_first_divergence(records: pd.DataFrame, data: str | None = None) -> Figure:
    ok = _ok(records)
    diff = ok[ok["first_divergence_frac"].notna()]
    fig, ax = figure((8.5, 4.2))
    if len(diff):
        _side_by_side_hist(ax, [(verdict, diff.loc[diff["verdict"] == verdict, "first_divergence_frac"],
                                 VERDICT_COLORS[verdict]) for verdict in ("bpe_split", "semantic")],
                           np.linspace(0, 1, 11))
    else:
        no_data(ax, "differing records")
    ax.set(xlabel="first differing token / engine tokens", ylabel="records")
    title(ax, "Where the first difference falls in the engine's completion", data)
    fig.tight_layout()
    return fig


LOG_SPAN = 30  # billing scatter: log axes when the largest count exceeds 30x the median


def chart_billing(records: pd.DataFrame, data: str | None = None) -> Figure:
    ok = _ok(records)
    b = ok[ok["billed_completion_tokens"].notna()]
    fig, ax = figure((7, 5.6))
    if len(b):
        both = pd.concat([b["billed_completion_tokens"], b["n_recon_tokens"]]).astype(float)
        hi = float(both.max()) * 1.05
        log = float(both.max()) > LOG_SPAN * max(1.0, float(both.median()))
        for verdict, color in VERDICT_COLORS.items():
            sel = b[b["verdict"] == verdict]
            if len(sel):
                ax.scatter(sel["billed_completion_tokens"], sel["n_recon_tokens"], s=14, alpha=0.7, color=color,
                           label=f"{verdict} ({len(sel):,})")
        lo = 0.8 if log else 0
        ax.plot([lo, hi], [lo, hi], color="#555", linewidth=0.8, linestyle="--", label="billed = reconstructed")
        if log:  # one long record must not squash the rest into a corner
            ax.set_xscale("log", nonpositive="clip")
            ax.set_yscale("log", nonpositive="clip")
        ax.legend(fontsize=8)
        n_off = int((b["billing_delta"] != 0).sum())
        title(ax, f"Billed vs reconstructed completion tokens ({len(b):,} records, {n_off:,} off the diagonal, "
                   f"{int((b['billing_unexplained'] != 0).sum()):,} with a gap not explained by hunks"
                   + ("; log axes: counts span " + f"{int(both.min()):,}–{int(both.max()):,}" if log else "") + ")",
               data)
    else:
        no_data(ax, "billed records")
        title(ax, "Billed vs reconstructed completion tokens", data)
    ax.set(xlabel="usage.completion_tokens (billed)", ylabel="reconstructed completion tokens")
    fig.tight_layout()
    return fig


def chart_confusion(table: pd.DataFrame, data: str | None = None) -> Figure:
    fig, ax = figure((max(7.0, 0.75 * len(table.columns) + 3), 0.6 * len(table.index) + 2.8))
    values = table.to_numpy()
    ax.imshow(values > 0, cmap="Blues", vmin=0, vmax=1.6)
    for i in range(values.shape[0]):
        for j in range(values.shape[1]):
            if values[i, j]:
                ax.text(j, i, str(values[i, j]), ha="center", va="center", fontsize=9,
                        color="#b71c1c" if i != j else "#000")
    ax.set_xticks(range(len(table.columns)), [plain(c) for c in table.columns], rotation=35, ha="right", fontsize=8)
    ax.set_yticks(range(len(table.index)), [plain(i) for i in table.index], fontsize=8)
    ax.set(xlabel="label from the diff", ylabel="expected label")
    title(ax, f"Confusion: injected effect's expected label vs diff label ({int(values.sum())} records)", data)
    fig.tight_layout()
    return fig




def make_charts(result: DiffResult, out: Path, data: str | None = None,
                notes: list[dict[str, Any]] | None = None) -> dict[str, Path]:
    """Every review chart as a PNG in ``out``; titles say the data kind (``simulated``/``real``, from the
    records when ``data`` is None). With ``notes``, a chart that fails is left out and noted there
    (``{"part": "chart", "name", "reason"}``) while the others are drawn; without, the error propagates."""
    rec, hunks = result.records, result.hunks
    data = data or data_kind(rec)
    figures: dict[str, Callable[[], Figure | None]] = {
        "mismatch_rate_by_dataset": lambda: chart_rates(rates_by_dataset(rec), data),
        "verdicts": lambda: chart_verdicts(rec, hunks, data),
        "hunk_sizes": lambda: chart_hunk_sizes(hunks, data),
        "token_delta": lambda: chart_token_delta(rec, data),
        "first_divergence": lambda: chart_first_divergence(rec, data),
        "billing": lambda: chart_billing(rec, data),
        "confusion": lambda: None if (table := confusion(rec)) is None else chart_confusion(table, data),
    }

    def saved(build: Callable[[], Figure | None]) -> Callable[[Path], Path | None]:
        return lambda path: None if (fig := build()) is None else save(fig, path)

    return draw_charts({name: saved(build) for name, build in figures.items()}, out, notes)


# --------------------------------------------------------------------------------------------
# HTML


def token_run_text(ids: Any, raw: Any, tok: "Tokenizer | None" = None, limit: int = 120) -> str:
    """A hunk side with its token boundaries visible: each token's bytes quoted (``' a' 'n'``) when a tokenizer
    is given, else the bytes followed by the token IDs (``' an'  [2 tokens: 264, 77]``)."""
    ids = [int(t) for t in (ids if ids is not None else [])]
    if tok is not None:
        text = " ".join(repr(tok.token_bytes(t))[1:] for t in ids) or "∅"
    else:
        text = f"{repr(bytes(raw or b''))[1:]}  [{len(ids)} token{'s' if len(ids) != 1 else ''}: {', '.join(map(str, ids))}]"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _hunk_examples(hunks: pd.DataFrame, per_class: int = 3, tok: "Tokenizer | None" = None,
                   notes: list[dict[str, Any]] | None = None) -> pd.DataFrame:
    """Up to ``per_class`` example hunks per class. A hunk whose tokens cannot be shown (odd IDs or bytes) keeps
    its row with the reason in place of its tokens, and is noted in ``notes``."""
    cols = ["id", "class", "segment", "engine tokens", "reconstructed tokens"]
    if not len(hunks):
        return pd.DataFrame(columns=cols)
    h = hunks.assign(**{"class": hunks["subclass"].fillna(hunks["kind"])})
    rows = []
    for ex in h.groupby("class", sort=True).head(per_class).to_dict("records"):
        try:
            shown = [token_run_text(ex["engine_ids"], ex["engine_bytes"], tok),
                     token_run_text(ex["recon_ids"], ex["recon_bytes"], tok)]
        except Exception as e:
            note = left_out_note("example hunk", ex["id"], error_reason(e), hunk=ex.get("hunk"))
            if notes is not None:
                notes.append(note)
            shown = [f"⚠ not shown: {note['reason']}", ""]
        rows.append([ex["id"], ex["class"], ex["segment"], *shown])
    return pd.DataFrame(rows, columns=cols)


def _left_out_html(notes: list[dict[str, Any]]) -> list[str]:
    if not notes:
        return []
    counts = left_out_counts(notes)
    said = ", ".join(f"{counts[k]:,} {k.replace('_', ' ')}" for k in LEFT_OUT_PARTS if counts[k])
    return left_out_section(
        notes, f"{said} could not be counted or drawn; the rest of the report stands without them "
               f"(<code>summary.json[\"left_out\"]</code>){'; first ' + str(MAX_NOTES) + ' listed' if len(notes) > MAX_NOTES else ''}.",
        limit=MAX_NOTES)


def _counts_html(summary: dict[str, Any]) -> list[str]:
    return [f"<p>{summary['n_records']:,} records: " + ", ".join(f"{v:,} {k}" for k, v in summary["status"].items())
            + ".</p>"]


def _verdicts_html(summary: dict[str, Any], image: Image) -> list[str]:
    return ["<h2>Verdicts</h2>", html_table(pd.DataFrame([summary["verdict"]])), image("verdicts", "verdicts")]


RATE_HEADERS = {"n": "records (n)", **{f"{w}{s}": f"{w}{h}" for w in ("mismatch", "semantic") for s, h in
                (("", " (k)"), ("_rate", " rate"), ("_lo", " 95% low"), ("_hi", " 95% high"))}}


def _rates_html(summary: dict[str, Any], image: Image) -> list[str]:
    rates = pd.DataFrame(summary["rates"]).rename(columns=RATE_HEADERS)
    return ["<h2>Mismatch rate per dataset (Wilson 95% CI)</h2>",
            "<p>mismatch: the IDs are not identical (a BPE split or a semantic difference); semantic: the bytes "
            "differ. k of n ok records.</p>", html_table(rates), image("mismatch_rate_by_dataset", "mismatch rate")]


def _confusion_html(summary: dict[str, Any], image: Image) -> list[str]:
    if "confusion" not in summary:
        return []
    classes = summary["confusion"]["classes"]
    conf = pd.DataFrame(summary["confusion"]["matrix"], index=classes, columns=classes)
    conf.insert(0, "expected \\ diff", classes)
    return ["<h2>Labelled benchmark: confusion table</h2>", html_table(conf),
            html_table(pd.DataFrame(summary["precision_recall"])), image("confusion", "confusion")]


def _billing_html(summary: dict[str, Any], image: Image) -> list[str]:
    bill = summary["billing"]
    by_class = (["<p>Tokens explained by hunk class (engine − reconstructed):</p>",
                 html_table(pd.DataFrame([bill["explained_by_class"]]))] if bill["explained_by_class"] else
                ["<p>No hunk in the billed records: no tokens explained by hunks.</p>"])
    return [
        "<h2>Billing reconciliation</h2>",
        html_table(pd.DataFrame([{BILLING_HEADERS.get(k, k): v for k, v in bill.items() if not isinstance(v, dict)}])),
        *by_class,
        "<p>Reasoning tokens:</p>", html_table(pd.DataFrame([{BILLING_HEADERS.get(k, k): v for k, v in bill["reasoning"].items()}])),
        image("billing", "billing"),
    ]


def _hunk_charts_html(image: Image) -> list[str]:
    return ["<h2>Hunks</h2>", image("hunk_sizes", "hunk sizes"), image("token_delta", "token delta"),
            image("first_divergence", "first divergence")]


def _examples_html(hunks: pd.DataFrame, tok: "Tokenizer | None", notes: list[dict[str, Any]]) -> list[str]:
    return [
        "<h3>Example hunks</h3>",
        "<p>Each token quoted separately, so a split shows where the boundaries fall "
        + ("(engine <code>' a' 'n'</code> vs reconstructed <code>' an'</code>).</p>" if tok is not None else
           "(bytes, then the token IDs; pass a tokenizer to see each token's bytes).</p>"),
        html_table(_hunk_examples(hunks, tok=tok, notes=notes)),
    ]


def _errors_html(summary: dict[str, Any]) -> list[str]:
    return ["<h2>Errors (first 20)</h2>", html_table(pd.DataFrame(summary["errors"]))] if summary["errors"] else []


def diff_finding(summary: dict[str, Any]) -> str:
    """The page's one-line finding in plain words, from the summary's verdict counts."""
    v = summary["verdict"]
    n = sum(v.values())
    if not n:
        return f"no record could be compared ({summary['n_records']:,} records, none with both engine and reconstructed IDs)."
    return (f"of {n:,} records compared, {v['exact']:,} have identical token IDs, {v['bpe_split']:,} the same bytes "
            f"split into other tokens, and {v['semantic']:,} differ in bytes or a special token.")


def render_html(summary: dict[str, Any], result: DiffResult, charts: dict[str, Path],
                tok: "Tokenizer | None" = None, notes: list[dict[str, Any]] | None = None) -> str:
    """The self-contained report. Each section is rendered on its own: one that fails becomes a visible note
    (and a ``section`` entry in ``notes``); ``notes`` (with those of :func:`screen_diff` and the charts) are listed
    near the top under “Left out of this report”."""
    notes = notes if notes is not None else []
    image = chart_embedder(charts, notes)
    data = summary.get("data") or data_kind(result.records)
    sections: tuple[tuple[str, Callable[[], list[str]]], ...] = (
        ("records", lambda: _counts_html(summary)), ("verdicts", lambda: _verdicts_html(summary, image)),
        ("mismatch rate", lambda: _rates_html(summary, image)),
        ("confusion table", lambda: _confusion_html(summary, image)),
        ("billing", lambda: _billing_html(summary, image)), ("hunks", lambda: _hunk_charts_html(image)),
        ("example hunks", lambda: _examples_html(result.hunks, tok, notes)), ("errors", lambda: _errors_html(summary)))
    body: list[str] = []
    for name, build in sections:
        body += section(notes, name, build)
    return html_page(f"kimi-eagle diff report ({data} data)", [
        f"<h1>Engine IDs vs reconstructed IDs — {data} data</h1>",
        finding(html.escape(diff_finding(summary))),
        f"<p class='data {data}'>{DATA_NOTES.get(data, data)}</p>",
        f"<p class='sign'>{html.escape(SIGN_CONVENTION)}</p>",
        *[f"<p class='serving'>{html.escape(t)}</p>" for t in [serving_line(summary.get("serving_by_provider"))] if t],
        *serving_evidence_html(summary.get("serving_evidence")),
        *_left_out_html(notes), *body,
    ], "report")
def _reconstructed_path(out: Path) -> str | None:
    """The reconstruction a diff folder was made from (its ``meta.json``), or None."""
    try:
        return json.loads((out / "meta.json").read_text(encoding="utf-8")).get("reconstructed")
    except (OSError, ValueError, AttributeError):
        return None


def write_report(result: DiffResult, out_dir: str | Path, data: str | None = None,
                 tok: "Tokenizer | None" = None) -> dict[str, Any]:
    """Write summary.json, the charts and report.html into ``out_dir``; return the summary.

    ``data`` (``"simulated"``, ``"real"`` or ``"toy"`` for a toy model such as tiny-kimi; default: :func:`data_kind` of the records) is stated in the
    summary, the report's header and every chart title. With ``tok`` (the diff's tokenizer) the example-hunk
    table shows each token's bytes. Records and hunks that cannot be counted, and charts, sections or example
    hunks that fail, are left out with a visible note; ``summary["left_out"]`` counts them and says why
    (``n_records`` counts every input record, ``status`` the ones the report counts).
    """
    out = Path(out_dir)
    data = data or data_kind(result.records)
    if data not in DATA_KINDS:
        raise ValueError(f"data must be one of {DATA_KINDS}, not {data!r}")
    screened, notes = screen_diff(result)
    summary = {"data": data, **summarize_diff(screened), "n_records": len(result.records)}
    if by_serving := serving_by_provider(result.records):  # a `serving` column in the records (issue 23)
        summary["serving_by_provider"] = by_serving
    if evidence := serving_evidence(_reconstructed_path(out)):  # --serving auto's choice and evidence
        summary["serving_evidence"] = evidence
    charts = make_charts(screened, out, data, notes)
    summary["charts"] = {k: p.name for k, p in charts.items()}
    page = render_html(summary, screened, charts, tok, notes)
    summary["left_out"] = left_out_counts(notes)
    write_text(out / "summary.json", json.dumps(summary, indent=2, default=str))
    write_summary_tables(json.loads(json.dumps(summary, default=str)), out / "summary.json")  # summary.md, .csv
    write_text(out / "report.html", page)
    return summary


