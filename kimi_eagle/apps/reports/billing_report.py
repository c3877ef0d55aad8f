"""``kimi-eagle billing``: billing-only validation of a reconstruction, for API users without an engine.

    kimi-eagle billing --reconstructed RECON.parquet -o BILLING_DIR [--tokenizer DIR] [--data real|simulated]

The provider's own counts (``usage.completion_tokens``, ``...reasoning_tokens``) are the only independent
check on a reconstruction when no engine token IDs exist. Every reconstructed row gets a billing verdict
(:func:`kimi_eagle.diff.billing.reconcile_rows`); this module aggregates them per provider and per dataset
(the gap in % of billed tokens with a bootstrap 95% interval, the unexplained-record rate with a Wilson 95%
interval, which conventions each provider follows), draws the charts and writes::

    BILLING_DIR/billing_records.parquet   one row per input row (verdict, reason, deltas)
    BILLING_DIR/summary.json              everything below, machine-readable
    BILLING_DIR/metrics.json              the headline numbers (flat), with "evidence": "billing-only"
    BILLING_DIR/*.png, report.html        charts and the self-contained report

Everything is labelled as billing-only evidence: a count can agree while the IDs differ (a split that
merges elsewhere) and a convention can hide a non-canonical split; only an engine diff sees IDs.

A chart, a report section or one record's segment table that fails (an unforeseen value) is replaced by a
visible note naming the record or part and the reason; the rest is written, and ``summary.json["left_out"]``
counts what was left out. Provider and dataset names are drawn as literal text (never mathtext) and escaped.
"""
from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from kimi_eagle import data_kinds
from kimi_eagle.apps.reports.outputs import write_summary_tables
from kimi_eagle.apps.reports.toolkit import (
    SIGN_CONVENTION,
    TOY_NOTE,
    VERDICT_COLORS,
    chart_embedder,
    count_axis,
    draw_charts,
    evidence_title,
    figure,
    figure_tag,
    finding,
    html_page,
    html_table,
    left_out_paragraph,
    left_out_section,
    no_data,
    number,
    plain,
    provider_table_html,
    save,
    section,
    serving_evidence_html,
    title,
)
from kimi_eagle.diff.billing import (
    BILLING_SCHEMA,
    PROMPT_NOT_RECORDED,
    PROMPT_VERDICTS,
    VERDICTS,
    provider_conventions,
    reconcile_rows,
    verdict_class,
)
from kimi_eagle.diff.billing_accuracy import billing_accuracy
from kimi_eagle.diff.summary import MAX_NOTES, error_reason, left_out_note, wilson
from kimi_eagle.io import atomic_path, write_json, write_text
from kimi_eagle.serving.evidence import (
    provider_rows,
    serving_by_provider,
    serving_evidence,
    serving_line,
    unexplained_finding,
)
from kimi_eagle.tokenize.tokenizer import Tokenizer

EVIDENCE = "billing-only"
EVIDENCE_TAG = "billing-only evidence"  # the second line of every chart title
DATA_LABELS = ("real", "simulated", "toy")  # "toy": a toy model on the real engine (tiny-kimi)
CLASS_COLORS = {c: VERDICT_COLORS[c] for c in ("match", "explained", "unexplained", "no_billing", "error")}  # the one scheme
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_MIN_N = 5  # fewer records: no interval ("n too small"), never a one-point "95% CI" (#35)


def bootstrap_ratio_ci(numerator: np.ndarray, denominator: np.ndarray, resamples: int = BOOTSTRAP_RESAMPLES,
                       seed: int = 0) -> tuple[float, float] | None:
    """Percentile bootstrap 95% interval of ``sum(numerator) / sum(denominator)`` over records; None when there are
    fewer than :data:`BOOTSTRAP_MIN_N` records (resampling one record gives one point, not an interval)."""
    num, den = np.asarray(numerator, dtype=float), np.asarray(denominator, dtype=float)
    if len(num) < BOOTSTRAP_MIN_N or den.sum() <= 0:
        return None
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(num), size=(resamples, len(num)))
    d = den[idx].sum(axis=1)
    ratios = np.where(d > 0, num[idx].sum(axis=1) / np.where(d > 0, d, 1), np.nan)
    lo, hi = np.nanpercentile(ratios, [2.5, 97.5])
    return float(lo), float(hi)


def group_table(records: pd.DataFrame, by: str) -> pd.DataFrame:
    """Per value of ``by`` (and ``all``): counts per verdict class, the billed−reconstructed gap in % of billed
    tokens (bootstrap CI), the unexplained gap, the unexplained-record rate (Wilson CI) and, per provider,
    the conventions it follows."""
    rec = records.assign(**{by: records[by].fillna("(none)")})
    rows = []
    for name, g in [*rec.groupby(by, sort=True), ("all", rec)]:
        cls = g["verdict"].map(verdict_class)
        billed = g[g["billed_completion_tokens"].notna() & (g["status"] == "ok")]
        b = billed["billed_completion_tokens"].to_numpy(dtype=float)
        gap = billed["billing_delta"].to_numpy(dtype=float)
        residual = billed["unexplained_tokens"].fillna(0).to_numpy(dtype=float)
        n_unexplained = int((cls == "unexplained").sum())
        lo, hi = wilson(n_unexplained, len(billed))
        gap_ci = bootstrap_ratio_ci(gap, b)
        res_ci = bootstrap_ratio_ci(residual, b)
        row: dict[str, Any] = {by: name, "records": len(g), **{c: int((cls == c).sum()) for c in VERDICTS},
                               "rated": len(billed),  # the denominator of unexplained_rate: ok and billed
                               "billed_tokens": int(b.sum()), "reconstructed_tokens": int(billed["n_recon_tokens"].sum()),
                               "gap_pct": 100 * gap.sum() / b.sum() if b.sum() else None,
                               "gap_pct_lo": 100 * gap_ci[0] if gap_ci else None,
                               "gap_pct_hi": 100 * gap_ci[1] if gap_ci else None,
                               "unexplained_gap_pct": 100 * residual.sum() / b.sum() if b.sum() else None,
                               "unexplained_gap_pct_lo": 100 * res_ci[0] if res_ci else None,
                               "unexplained_gap_pct_hi": 100 * res_ci[1] if res_ci else None,
                               "unexplained_rate": n_unexplained / len(billed) if len(billed) else None,
                               "unexplained_lo": lo, "unexplained_hi": hi}
        if by == "provider" and name != "all":
            pc = provider_conventions(zip(g["provider"], g["eot_vote"], g["reasoning_vote"]))[name]
            row.update(end_of_turn=_convention(pc.eot, pc.eot_votes),
                       reasoning_count=_convention(pc.reasoning, pc.reasoning_votes))
        rows.append(row)
    return pd.DataFrame(rows)


def _convention(choice: str, votes: dict[str, int]) -> str:
    n = sum(votes.values())
    return f"{choice} ({votes.get(choice, 0)}/{n} records that can tell)" if n else "unknown (no record can tell)"


def prompt_counts(records: pd.DataFrame) -> dict[str, Any]:
    """Records per prompt verdict (:data:`~kimi_eagle.diff.billing.PROMPT_VERDICTS`), ``compared`` (a reconstructed
    and a billed count: equal, equal_by_table or differs), ``equal_total`` (equal + equal_by_table) and
    ``equal_rate`` = equal_total / compared with its Wilson 95% interval (None when nothing was compared), and
    ``both_differ``: the records whose prompt differs and whose completion is unexplained too (both billed counts
    off: the provider may have billed another request than the one it returned, docs/providers.md on DeepInfra)."""
    verdicts = records["prompt_verdict"] if "prompt_verdict" in records else pd.Series([], dtype=object)
    counts = {k: int((verdicts == k).sum()) for k in PROMPT_VERDICTS}
    completion = records["verdict"] if "verdict" in records else pd.Series([None] * len(verdicts), dtype=object)
    both = int(((verdicts == "differs") & (completion.values == "unexplained")).sum())
    compared = counts["equal"] + counts["equal_by_table"] + counts["differs"]
    total = counts["equal"] + counts["equal_by_table"]
    lo, hi = wilson(total, compared) if compared else (None, None)
    return {**counts, "compared": compared, "equal_total": total, "both_differ": both,
            "equal_rate": total / compared if compared else None, "equal_rate_lo": lo, "equal_rate_hi": hi}


def prompt_parity(records: pd.DataFrame, recorded: bool = True) -> dict[str, Any]:
    """The ``prompt_parity`` block: :func:`prompt_counts` of every record and per provider (one with only error rows,
    which have no prompt verdict, is left out); ``recorded`` False (the reconstruction has no ``billed_prompt_tokens``
    column) adds a ``note`` saying so (every prompt is then ``not_billed``)."""
    judged = records[records["prompt_verdict"].notna()] if "prompt_verdict" in records else records.iloc[:0]
    by_provider = {str(name): prompt_counts(g) for name, g in judged.groupby("provider", sort=True)} if len(judged) else {}
    return {"recorded": recorded, **({} if recorded else {"note": PROMPT_NOT_RECORDED}), **prompt_counts(records),
            "by_provider": by_provider}


def prompt_parity_line(parity: dict[str, Any] | None) -> str:
    """``prompts equal N/M`` for the terminal (N: equal_total; how many by the table's offsets, when any)."""
    if not parity:
        return "prompts equal: not compared"
    if not parity["recorded"]:
        return "prompts equal: billed prompt count not recorded"
    by_table = f" ({parity['equal_by_table']:,} by the provider table's count offsets)" if parity["equal_by_table"] else ""
    both = parity.get("both_differ")
    both = f"; {both:,} differ with the completion unexplained too" if both else ""
    return f"prompts equal {parity['equal_total']:,}/{parity['compared']:,}{by_table}{both}"


def summarize_billing(records: pd.DataFrame, data: str = "real", prompt_recorded: bool = True) -> dict[str, Any]:
    """Everything ``summary.json`` holds; ``data`` says whether the responses are ``real`` or ``simulated``;
    ``prompt_recorded``: whether the reconstruction has the billed prompt count (:func:`prompt_parity`)."""
    cls = records["verdict"].map(verdict_class)
    conventions = records["conventions"].map(lambda c: list(c) if c is not None else [])
    by_provider, by_dataset = group_table(records, "provider"), group_table(records, "dataset")
    everything = by_provider.iloc[-1].to_dict()
    return {
        "evidence": EVIDENCE, "data": data, "n_records": len(records),
        "verdict_class": {c: int((cls == c).sum()) for c in VERDICTS},
        "verdict": {k: int(v) for k, v in records["verdict"].value_counts().items()},
        "records_with_convention": {k: int(v) for k, v in conventions.explode().dropna().value_counts().items()},
        "no_billing_reasons": {k: int(v) for k, v in records.loc[cls == "no_billing", "reason"].value_counts().items()},
        "errors": records.loc[cls == "error", ["id", "reason"]].head(20).to_dict("records"),
        "all": {k: everything[k] for k in ("rated", "billed_tokens", "reconstructed_tokens", "gap_pct", "gap_pct_lo", "gap_pct_hi",
                                            "unexplained_gap_pct", "unexplained_gap_pct_lo", "unexplained_gap_pct_hi",
                                            "unexplained_rate", "unexplained_lo", "unexplained_hi")},
        "by_provider": by_provider.replace({np.nan: None}).to_dict("records"),
        "by_dataset": by_dataset.replace({np.nan: None}).to_dict("records"),
        "worst": worst_records(records).to_dict("records"),
        "prompt_parity": prompt_parity(records, prompt_recorded),
    }


# reconstruction flags that leave a record's token count uncertain: an unexplained verdict names each one its row
# carries, so a record cut inside its tool-call arguments is never a bare "unexplained +94" (#46)
FLAG_CAUSES = {
    "args_not_json": "tool-call arguments that are not JSON, as when the record is cut inside them: their tokens are "
                     "the text's encoding, not necessarily the model's",
    "truncated_in_tool_call": "cut inside the tool section: how many closing markers follow the last call is chosen",
    "truncation_ambiguous": "cut inside the tool section, and no candidate ending matches the billed count",
    "dropped_by_server": "a cut tool call the server dropped: the billed tokens past the known text are not in it",
    "literal_marker": "marker text in the answer: the model may have written special tokens there",
    "reasoning_dropped": "the API dropped the reasoning: its tokens are billed but not in the text",
    "choices_dropped": "an n > 1 answer: only choices[0] is reconstructed",
}


def name_flags(records: pd.DataFrame) -> pd.DataFrame:
    """``records`` (:func:`~kimi_eagle.diff.billing.reconcile_rows`' frame) with the reason of every unexplained
    verdict naming the reconstruction flags of :data:`FLAG_CAUSES` its row carries, and what each means:
    ``…; +94 completion tokens that no known convention explains; the reconstruction flagged args_not_json
    (tool-call arguments that are not JSON …)``."""
    def said(row: pd.Series) -> Any:
        flags = [f for f in (list(row["flags"]) if row["flags"] is not None else []) if f.split(":")[0] in FLAG_CAUSES]
        if row["verdict"] != "unexplained" or not flags:
            return row["reason"]
        named = "; ".join(f"{f} ({FLAG_CAUSES[f.split(':')[0]]})" for f in flags)
        return f"{row['reason']}; the reconstruction flagged {named}"

    if len(records):
        records["reason"] = records.apply(said, axis=1)
    return records


def worst_records(records: pd.DataFrame, n: int = 10) -> pd.DataFrame:
    """The unexplained records with the largest |unexplained tokens| (ties: larger |delta| first)."""
    un = records[records["verdict"] == "unexplained"]
    order = un.assign(_k=un["unexplained_tokens"].abs(), _d=un["billing_delta"].abs()).sort_values(
        ["_k", "_d"], ascending=False, kind="stable")
    return order.head(n)[["id", "provider", "dataset", "finish_reason", "billed_completion_tokens", "n_recon_tokens",
                          "billing_delta", "unexplained_tokens", "reason"]]


def metrics(summary: dict[str, Any]) -> dict[str, Any]:
    """The flat headline numbers (``metrics.json``; ``kimi-eagle batch`` tabulates them)."""
    a = summary["all"]
    return {"evidence": EVIDENCE, "data": summary["data"], "n_records": summary["n_records"],
            **{f"billing_{k}": v for k, v in summary["verdict_class"].items()},
            "billing_gap_pct": a["gap_pct"], "billing_gap_pct_ci": [a["gap_pct_lo"], a["gap_pct_hi"]],
            "billing_unexplained_gap_pct": a["unexplained_gap_pct"],
            "billing_unexplained_rate": a["unexplained_rate"],
            "billing_unexplained_rate_ci": [a["unexplained_lo"], a["unexplained_hi"]],
            **({f"billing_accuracy_{k}": summary["accuracy"][k] for k in ("n_labelled", "explained", "wrong_cause",
                                                                        "ambiguous", "unseen_effects")}
               if summary.get("accuracy") else {}),
            **({"prompt_parity": summary["prompt_parity"]} if "prompt_parity" in summary else {})}


# --------------------------------------------------------------------------------------------
# charts


def chart_delta_histogram(records: pd.DataFrame, path: Path, data: str) -> Path:
    """Per-record billed − reconstructed completion tokens (clipped ±20), stacked by verdict class."""
    b = records[records["billing_delta"].notna()]
    fig, ax = figure((8.5, 4.2))
    bins = np.arange(-20.5, 21.5)
    if len(b):
        cls = b["verdict"].map(verdict_class)
        groups = [(c, b.loc[cls == c, "billing_delta"].clip(-20, 20)) for c in ("match", "explained", "unexplained")]
        groups = [(c, d) for c, d in groups if len(d)]
        counts, _, _ = ax.hist([d for _, d in groups], bins=bins, stacked=True, color=[CLASS_COLORS[c] for c, _ in groups],
                               label=[f"{c} ({len(d):,})" for c, d in groups])
        count_axis(ax, float(np.max(counts)))  # linear, integer ticks for small counts
        ax.legend(fontsize=8, loc="upper left")
        ax.margins(y=0.15)
    else:
        no_data(ax, "billed records")
        ax.set_ylabel("records")
    evidence_title(ax, f"Billed − reconstructed completion tokens per record ({len(b):,} billed; clipped ±20)", data,
                   EVIDENCE_TAG)
    ax.set(xlabel="billed (usage.completion_tokens) − reconstructed tokens")
    return save(fig, path)


def _headroom(ax: Any, tops: np.ndarray, bottoms: np.ndarray) -> None:
    """Room above the tallest bar (and below the lowest) for its label, inside the frame."""
    hi, lo = float(np.nanmax(tops, initial=0.0)), float(np.nanmin(bottoms, initial=0.0))
    span = (hi - lo) or 1.0
    ax.set_ylim(lo - (0.2 * span if lo < 0 else 0), hi + 0.2 * span)


def chart_gap(table: pd.DataFrame, by: str, path: Path, data: str) -> Path:
    """Left: gap in % of billed tokens (bootstrap 95% CI), all and not explained by conventions; right: the
    unexplained-record rate (Wilson). The data tag is the figure's suptitle, the panels' titles short, the legend
    below the panel: nothing overlaps."""
    t = table[table["billed_tokens"] > 0].reset_index(drop=True)
    fig, (ax1, ax2) = figure((max(10, 1.8 * len(t) + 4), 4.8), ncols=2, layout="constrained")
    x = np.arange(len(t))
    tops, bottoms = [], []
    for off, what, color, label in ((-0.2, "gap_pct", "#ff8f00", "gap: billed − reconstructed"),
                                    (0.2, "unexplained_gap_pct", "#d32f2f", "gap not explained by conventions")):
        v = t[what].astype(float).to_numpy()
        err = np.clip(np.array([v - t[f"{what}_lo"].astype(float), t[f"{what}_hi"].astype(float) - v]), 0, None)
        bars = ax1.bar(x + off, v, 0.4, yerr=err, capsize=4, color=color, label=label)
        ax1.bar_label(bars, labels=[number(val, "+.3f") + "%" + ("" if np.isfinite(e) else f"\n(n < {BOOTSTRAP_MIN_N}: no CI)")
                                    for val, e in zip(v, t[f"{what}_lo"].astype(float))], padding=3, fontsize=7)
        tops.append(v + np.nan_to_num(err[1]))
        bottoms.append(v - np.nan_to_num(err[0]))
    _headroom(ax1, np.concatenate(tops) if tops else np.zeros(1), np.concatenate(bottoms) if bottoms else np.zeros(1))
    ax1.axhline(0, color="#555", linewidth=0.8)
    ax1.set_xticks(x, [plain(v) for v in t[by]], rotation=20, ha="right")  # names are data, never mathtext
    title(ax1, f"Token gap per {by} (bootstrap 95% CI)")
    ax1.set(xlabel=by, ylabel="% of billed tokens (billed − reconstructed)")
    ax1.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncols=2, frameon=False)
    rate = t["unexplained_rate"].astype(float).fillna(0).to_numpy()
    err = np.clip(np.array([rate - t["unexplained_lo"], t["unexplained_hi"] - rate], dtype=float), 0, None)
    bars = ax2.bar(x, rate, 0.6, yerr=err, capsize=4, color=CLASS_COLORS["unexplained"])
    ax2.bar_label(bars, labels=[f"{k}/{n}" for k, n in zip(t["unexplained"], t["rated"])], padding=3, fontsize=8)
    ax2.set_xticks(x, [plain(v) for v in t[by]], rotation=20, ha="right")
    ax2.set_ylim(0, min(1.15, max(0.1, float((rate + err[1]).max()) * 1.3)) if len(t) else 1)
    title(ax2, f"Unexplained records per {by} (Wilson 95% CI)")
    ax2.set(xlabel=by, ylabel="share of rated records")
    figure_tag(fig, data, EVIDENCE_TAG)
    return save(fig, path)


def chart_verdicts(table: pd.DataFrame, by: str, path: Path, data: str) -> Path:
    """Records per verdict class for each value of ``by`` (stacked horizontal bars)."""
    t = table[table[by] != "all"]
    fig, ax = figure((9, 0.5 * len(t) + 2.2))
    left = np.zeros(len(t))
    y = np.arange(len(t))
    ax.set_yticks(y, [plain(v) for v in t[by]])  # names are data, never mathtext
    segments: list[tuple[int, str, int, Any]] = []  # (row, verdict class, count, bar) of every drawn segment
    for c in VERDICTS:
        v = t[c].to_numpy(dtype=float)
        if v.sum():
            bars = ax.barh(y, v, left=left, color=CLASS_COLORS[c], label=c)
            segments += [(i, c, int(k), bar) for i, (k, bar) in enumerate(zip(v, bars)) if k]
            left += v
    evidence_title(ax, f"Billing verdicts per {by}", data, EVIDENCE_TAG)
    ax.set(xlabel="records", ylabel=by)
    count_axis(ax, float(left.max(initial=0)), None, axis="x")
    if len(t):
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    _segment_counts(fig, ax, segments, y, left)
    return save(fig, path)


def _segment_counts(fig: Any, ax: Any, segments: list[tuple[int, str, int, Any]], y: np.ndarray,
                    ends: np.ndarray) -> None:
    """Each segment's count inside it (white) when it fits there; the counts of segments too narrow for theirs
    (``1`` of 48 records) beside the bar's end, with their verdict (``1 unexplained``), the axis widened so that
    they stay inside the frame: a count is never cut by its segment's edge (#46)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig.tight_layout()
    renderer = FigureCanvasAgg(fig).get_renderer()
    beside: dict[int, list[str]] = {}
    for row, cls, k, bar in segments:
        text = ax.text(bar.get_x() + bar.get_width() / 2, y[row], f"{k}", ha="center", va="center", fontsize=8,
                       color="#fff")
        if text.get_window_extent(renderer).width + 8 > bar.get_window_extent(renderer).width:  # 4 px each side
            text.remove()
            beside.setdefault(row, []).append(f"{k} {cls}")
    notes = [ax.annotate(", ".join(said), (ends[row], y[row]), xytext=(4, 0), textcoords="offset points",
                         ha="left", va="center", fontsize=8, color="#333") for row, said in beside.items()]
    for _ in range(6):  # widen until the notes fit (a symlog axis moves them, so again)
        frame = ax.get_window_extent(renderer)
        over = max((n.get_window_extent(renderer).x1 - frame.x1 for n in notes), default=0.0)
        if over <= -2:
            break
        ax.set_xlim(right=ax.transData.inverted().transform((frame.x1 + over + 6, 0))[0])


def make_charts(records: pd.DataFrame, summary: dict[str, Any], out: Path,
                notes: list[dict[str, Any]] | None = None) -> dict[str, Path]:
    """Every billing chart as a PNG in ``out``. With ``notes``, a chart that fails is left out and noted there
    (``{"part": "chart", "name", "reason"}``) while the others are drawn; without, the error propagates."""
    data = summary["data"]
    prov, ds = pd.DataFrame(summary["by_provider"]), pd.DataFrame(summary["by_dataset"])
    builders: dict[str, Callable[[Path], Path]] = {
        "billing_delta": lambda path: chart_delta_histogram(records, path, data),
        "billing_gap_by_provider": lambda path: chart_gap(prov, "provider", path, data),
        "billing_gap_by_dataset": lambda path: chart_gap(ds, "dataset", path, data),
        "billing_verdicts_by_provider": lambda path: chart_verdicts(prov, "provider", path, data),
    }
    return draw_charts(builders, out, notes)


# --------------------------------------------------------------------------------------------
# HTML


def segments_table(tok: Tokenizer, row: dict[str, Any], preview: int = 60) -> pd.DataFrame:
    """A reconstructed row's segments: kind, token span, token count and the start of its text."""
    ids = list(row.get("completion_ids") if row.get("completion_ids") is not None else [])
    out = []
    for s in row.get("segments") if row.get("segments") is not None else []:
        raw = b"".join(tok.token_bytes(int(i)) for i in ids[int(s["tok_start"]) : int(s["tok_end"])])
        text = raw.decode("utf-8", errors="backslashreplace")
        out.append({"kind": s["kind"], "tokens": int(s["tok_end"]) - int(s["tok_start"]),
                    "tok_span": f"{int(s['tok_start'])}–{int(s['tok_end'])}",
                    "text": text[:preview] + ("…" if len(text) > preview else "")})
    return pd.DataFrame(out, columns=["kind", "tokens", "tok_span", "text"])


def _table(df: pd.DataFrame) -> str:
    return html_table(df, "{:.4g}")


Image = Callable[[str, str], str]


def _pct(v: float | None) -> str:
    return "–" if v is None or v != v else number(v, "+.3f") + "%"


def _headline_html(summary: dict[str, Any]) -> list[str]:
    a = summary["all"]
    return [f"<p>{summary['n_records']:,} records: " + ", ".join(f"{v:,} {k}" for k, v in summary["verdict_class"].items())
            + f". Gap (billed − reconstructed): <b>{_pct(a['gap_pct'])}</b> of {a['billed_tokens']:,} billed tokens ("
            + (f"95% CI {_pct(a['gap_pct_lo'])} … {_pct(a['gap_pct_hi'])}" if a["gap_pct_lo"] is not None else
               f"fewer than {BOOTSTRAP_MIN_N} rated records: n too small for an interval")
            + "); not explained by known conventions: "
            f"<b>{_pct(a['unexplained_gap_pct'])}</b>.</p>"]


def _verdicts_html(summary: dict[str, Any], image: Image) -> list[str]:
    conventions = summary["records_with_convention"]
    return ["<h2>Verdicts</h2>", "<p>Records per verdict:</p>", _table(pd.DataFrame([summary["verdict"]])),
            *(["<p>Records per known provider convention that explains their gap:</p>",
               _table(pd.DataFrame([conventions]))] if conventions else
              ["<p>No record's gap is explained by a known provider convention (no <i>explained</i> records).</p>"]),
            image("billing_delta", "delta histogram")]


COUNT_HEADERS = {"records": "records", **{c: c.replace("_", " ") for c in VERDICTS}, "rated": "rated",
                 "billed_tokens": "billed tokens", "reconstructed_tokens": "reconstructed tokens"}
GAP_HEADER = "gap: billed − reconstructed, % of billed [95% CI]"
RESIDUAL_HEADER = "gap not explained by conventions, % of billed [95% CI]"
RATE_HEADER = "unexplained records of rated [Wilson 95% CI]"
CONVENTION_HEADERS = {"end_of_turn": "end of turn (convention followed)",
                      "reasoning_count": "reasoning count (convention followed)"}


def _with_ci(v: float | None, lo: float | None, hi: float | None) -> str:
    if _pct(v) == "–":
        return "–"
    return f"{_pct(v)} [n too small for an interval]" if _pct(lo) == "–" else f"{_pct(v)} [{_pct(lo)}, {_pct(hi)}]"


def _share(v: float | None) -> str:
    return "–" if v is None or v != v else number(100 * v, ".1f") + "%"


def group_tables(rows: list[dict[str, Any]], by: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A per-provider or per-dataset table (:func:`group_table`'s rows) as two narrow tables that fit the page:
    the counts (records per verdict class, billed and reconstructed tokens), and the rates (gap and the part not
    explained by conventions with their intervals, the unexplained-record rate as ``k/n (share) [CI]``, and per
    provider the conventions followed). ``rated`` records (a reconstruction and a billed count) are the
    denominator of the rate."""
    t = pd.DataFrame(rows)
    counts = t[[by, *COUNT_HEADERS]].rename(columns=COUNT_HEADERS)
    rates = pd.DataFrame({by: t[by],
                          GAP_HEADER: [_with_ci(v, lo, hi) for v, lo, hi in
                                       zip(t["gap_pct"], t["gap_pct_lo"], t["gap_pct_hi"])],
                          RESIDUAL_HEADER: [_with_ci(v, lo, hi) for v, lo, hi in
                                            zip(t["unexplained_gap_pct"], t["unexplained_gap_pct_lo"],
                                                t["unexplained_gap_pct_hi"])],
                          RATE_HEADER: [f"{k}/{n} ({_share(r)}) [{_share(lo)}, {_share(hi)}]" if n else "0/0 (none rated)" for k, n, r, lo, hi in
                                        zip(t["unexplained"], t["rated"], t["unexplained_rate"], t["unexplained_lo"],
                                            t["unexplained_hi"])]})
    for key, header in CONVENTION_HEADERS.items():
        if key in t:
            rates[header] = t[key]
    return counts, rates


def _groups_html(summary: dict[str, Any], by: str) -> list[str]:
    counts, rates = group_tables(summary[f"by_{by}"], by)
    return [f"<p>Records and tokens per {by} (rated: a reconstruction and a billed count):</p>", _table(counts),
            f"<p>Gap and unexplained records per {by}:</p>", _table(rates)]


def _providers_html(summary: dict[str, Any], image: Image) -> list[str]:
    return ["<h2>Per provider: gap, unexplained records, conventions followed</h2>", *_groups_html(summary, "provider"),
            image("billing_gap_by_provider", "gap per provider"), image("billing_verdicts_by_provider", "verdicts per provider")]


PARITY_HEADERS = {"equal": "equal", "equal_by_table": "equal by the table's offsets", "differs": "differs",
                  "both_differ": "differs, completion unexplained too", "not_billed": "not billed",
                  "compared": "compared"}
PARITY_RATE_HEADER = "equal (incl. by the table's offsets) of compared [Wilson 95% CI]"


def prompt_parity_table(parity: dict[str, Any]) -> pd.DataFrame:
    """Per provider and ``all``: records per prompt verdict and the equal share as ``k/n (share) [CI]``."""
    groups = [*parity["by_provider"].items(), ("all", parity)]
    return pd.DataFrame([{"provider": name, **{h: c[k] for k, h in PARITY_HEADERS.items()},
                          PARITY_RATE_HEADER: f"{c['equal_total']}/{c['compared']} ({_share(c['equal_rate'])}) "
                          f"[{_share(c['equal_rate_lo'])}, {_share(c['equal_rate_hi'])}]" if c["compared"]
                          else "0/0 (none compared)"} for name, c in groups])


def _prompt_parity_html(summary: dict[str, Any]) -> list[str]:
    parity = summary.get("prompt_parity")
    if not parity:
        return []
    head = ["<h2>Prompt parity: billed usage.prompt_tokens vs the reconstructed prompt</h2>"]
    if not parity["recorded"]:
        return [*head, f"<p class='prompt-parity'>{html.escape(parity['note'])}</p>"]
    return [*head, "<p>Per record: <i>equal</i> when the billed prompt count is the reconstructed prompt's IDs, "
            "<i>equal by the table's offsets</i> when it is once the count offsets of the provider table variant that "
            "rendered the prompt are added (count conventions, not tokens in the IDs), else <i>differs</i>; "
            "<i>differs, completion unexplained too</i>: both billed counts of the record are off (the provider may "
            "have billed another request than the one it returned); "
            "<i>not billed</i>: no usable usage.prompt_tokens. Error rows are not counted.</p>",
            _table(prompt_parity_table(parity))]


def _datasets_html(summary: dict[str, Any], image: Image) -> list[str]:
    return ["<h2>Per dataset</h2>", *_groups_html(summary, "dataset"), image("billing_gap_by_dataset", "gap per dataset")]


WORST_HEADERS = {"id": "id", "provider": "provider", "dataset": "dataset", "finish_reason": "finish reason",
                 "billed_completion_tokens": "billed tokens", "n_recon_tokens": "reconstructed tokens",
                 "billing_delta": "billed − reconstructed", "unexplained_tokens": "not explained by conventions (tokens)",
                 "reason": "reason"}


def _worst_html(summary: dict[str, Any]) -> list[str]:
    return ["<h2>Worst unexplained records</h2>",
            _table(pd.DataFrame(summary["worst"]).rename(columns=WORST_HEADERS)) if summary["worst"] else "<p>none</p>"]


def _segments_html(segments: dict[str, pd.DataFrame | str]) -> list[str]:
    out = []
    for rid, seg in segments.items():
        out.append(f"<h3>Segments of {html.escape(rid)}</h3>")
        out.append(_table(seg) if isinstance(seg, pd.DataFrame) else
                   left_out_paragraph(f"segments of record {html.escape(rid)} left out: {html.escape(str(seg))}"))
    return out


def _reasons_html(summary: dict[str, Any]) -> list[str]:
    if not summary["no_billing_reasons"]:
        return []
    return ["<h2>No billing (why)</h2>",
            _table(pd.DataFrame([{"reason": k, "records": v} for k, v in summary["no_billing_reasons"].items()]))]


ACCURACY_HEADERS = {"cause": "cause (from the label)", "support": "labelled records", "predicted": "verdicts naming it",
                    "correct": "correct"}


def accuracy_tables(acc: dict[str, Any]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The confusion (label cause rows, verdict cause columns) and per cause its precision and recall as
    ``k/n (share) [Wilson 95% CI]``, and how many of its records got an ambiguous verdict."""
    conf = pd.DataFrame(acc["matrix"], index=acc["labels"], columns=acc["verdicts"])
    conf.insert(0, "label \\ billing verdict", acc["labels"])
    rows = []
    for r in acc["per_cause"]:
        rows.append({**{h: r[k] for k, h in ACCURACY_HEADERS.items()},
                     "precision [Wilson 95% CI]": f"{r['correct']}/{r['predicted']} ({_share(r['precision'])}) "
                     f"[{_share(r['precision_lo'])}, {_share(r['precision_hi'])}]" if r["predicted"] else "– (never named)",
                     "recall [Wilson 95% CI]": f"{r['correct']}/{r['support']} ({_share(r['recall'])}) "
                     f"[{_share(r['recall_lo'])}, {_share(r['recall_hi'])}]",
                     "ambiguous verdicts": r["ambiguous"]})
    return conf, pd.DataFrame(rows)


def _accuracy_html(summary: dict[str, Any]) -> list[str]:
    acc = summary.get("accuracy")
    if not acc:
        return []
    conf, per = accuracy_tables(acc)
    return ["<h2>Labelled input: billing verdicts against the labels</h2>",
            f"<p class='accuracy'>{acc['n_labelled']:,} labelled records; {acc['explained']:,} explained verdicts, "
            f"{acc['wrong_cause']:,} of them naming a single cause that is not the label's; {acc['ambiguous']:,} "
            f"ambiguous (several causes fit the counts, all named); {acc['unseen_effects']:,} labelled effects left the "
            "billed count equal to the reconstruction, so billing alone cannot see them (they count as misses).</p>",
            "<p>Confusion: the label's billing cause (rows) against the cause the billing verdict names (columns):</p>",
            _table(conf), "<p>Per cause: precision and recall of the billing verdicts:</p>", _table(per)]


def _errors_html(summary: dict[str, Any]) -> list[str]:
    return ["<h2>Errors (first 20)</h2>", _table(pd.DataFrame(summary["errors"]))] if summary["errors"] else []


BANNER = ("<p class='banner'><b>Billing-only evidence.</b> No engine token IDs were compared: each record's "
          "<code>usage.completion_tokens</code> (and reasoning tokens) is checked against the reconstruction. A matching "
          "count does not prove the same IDs, and a named convention can hide a non-canonical split; only an engine diff "
          "(<code>kimi-eagle diff --engine</code>) sees IDs. Data: <b>{data}</b>.</p>")


def kind_note(data: str) -> list[str]:
    """The page's note under the banner for data that are not Kimi's (toy model, stand-in providers), or none."""
    kind = data_kinds.base_kind(data)
    text = TOY_NOTE if kind == data_kinds.TOY else data_kinds.describe(data) if kind == data_kinds.STAND_IN else None
    return [f"<p class='data {kind}'>{html.escape(text)}</p>"] if text else []


def billing_finding(summary: dict[str, Any]) -> str:
    """The page's one-line finding in plain words, from the verdict classes. The unexplained share is of the
    *rated* records (a reconstruction and a billed count), the denominator every page uses; error rows and
    records without a usable billed count are not rated, and said so."""
    c = summary["verdict_class"]
    n, rated = summary["n_records"], summary["all"]["rated"]
    not_rated = (f"{n:,} records in all; {c.get('error', 0):,} error rows and {c.get('no_billing', 0):,} without a usable "
                 "billed count not rated")
    if not rated:
        return f"no record could be rated ({not_rated})."
    u = c.get("unexplained", 0)
    return (f"of {rated:,} rated records (a reconstruction and a billed count; {not_rated}), the provider's billed count "
            f"equals the reconstruction for {c.get('match', 0):,}, differs by a known provider convention for "
            f"{c.get('explained', 0):,}, and is unexplained for {u:,} of {rated:,} ({u / rated:.0%}).")


def render_html(summary: dict[str, Any], charts: dict[str, Path], segments: dict[str, pd.DataFrame | str] | None = None,
                notes: list[dict[str, Any]] | None = None) -> str:
    """The self-contained report. Each section is rendered on its own: one that fails becomes a visible note
    (and a ``section`` entry in ``notes``); every note is listed under “Left out of this report”."""
    notes = notes if notes is not None else []
    image = chart_embedder(charts, notes)
    data = summary["data"]
    sections: tuple[tuple[str, Callable[[], list[str]]], ...] = (
        ("headline", lambda: _headline_html(summary)), ("verdicts", lambda: _verdicts_html(summary, image)),
        ("per provider", lambda: _providers_html(summary, image)),
        ("prompt parity", lambda: _prompt_parity_html(summary)), ("per dataset", lambda: _datasets_html(summary, image)),
        ("worst records", lambda: _worst_html(summary)), ("segments", lambda: _segments_html(segments or {})),
        ("accuracy", lambda: _accuracy_html(summary)),
        ("no billing", lambda: _reasons_html(summary)), ("errors", lambda: _errors_html(summary)))
    body: list[str] = []
    for name, build in sections:
        body += section(notes, name, build)
    left_out = left_out_section(notes, f"{len(notes):,} part(s) could not be drawn or rendered; the rest of the report "
                                       "stands without them (<code>summary.json[\"left_out\"]</code>).")
    return html_page("kimi-eagle billing-only report", [
        f"<h1>Billing-only evidence: provider counts vs reconstructed tokens ({html.escape(data)} data)</h1>",
        *[finding(html.escape(t)) for t in [unexplained_finding(summary.get("providers") or [])] if t],
        finding(html.escape(billing_finding(summary))),
        BANNER.format(data=html.escape(data)), *kind_note(data),
        f"<p class='sign'>{html.escape(SIGN_CONVENTION)}</p>", *left_out,
        *[f"<p class='serving'>{html.escape(t)}</p>" for t in [serving_line(summary.get("serving_by_provider"))] if t],
        *serving_evidence_html(summary.get("serving_evidence")),
        *provider_table_html(summary.get("providers")),
        *body,
    ], "billing")

# --------------------------------------------------------------------------------------------
# files


def write_billing(tok: Tokenizer, recon_rows: list[dict[str, Any]], out_dir: str | Path, data: str | None = None,
                  meta: dict[str, Any] | None = None, labels: Mapping[str, str | None] | None = None) -> dict[str, Any]:
    """Reconcile every row, write the records, summary, metrics, charts and report into ``out_dir``; return the summary.
    With ``labels`` (``{id: expected diff label}``), the summary and page carry the verdicts' accuracy. ``data``
    (default: ``simulated`` with ``labels``, else ``real``) never says ``real`` beside a benchmark's labels."""
    data = data or ("simulated" if labels else "real")
    if labels and data == "real":
        raise ValueError("data 'real' with the labels of a simulated benchmark: these are simulated data")
    if data not in DATA_LABELS and data_kinds.base_kind(data) != data_kinds.STAND_IN:  # ValueError naming the kinds
        raise ValueError(f"data must be one of {DATA_LABELS} or 'stand-in: <what>', not {data!r}")
    out = Path(out_dir)
    records = name_flags(reconcile_rows(tok, recon_rows))
    with atomic_path(out / "billing_records.parquet") as tmp:
        pq.write_table(pa.Table.from_pandas(records, schema=BILLING_SCHEMA, preserve_index=False), tmp)
    summary = summarize_billing(records, data, any("billed_prompt_tokens" in r for r in recon_rows))
    if labels and (acc := billing_accuracy(records, labels)):
        summary["accuracy"] = acc
    if by_serving := serving_by_provider(recon_rows):  # the reconstruction's `serving` column (issue 23)
        summary["serving_by_provider"] = by_serving
    if evidence := serving_evidence((meta or {}).get("reconstructed")):  # --serving auto's choice and evidence
        summary["serving_evidence"] = evidence
    if providers := provider_rows((meta or {}).get("reconstructed")):  # the per-provider table (provider table, groups)
        summary["providers"] = providers
    notes: list[dict[str, Any]] = []
    charts = make_charts(records, summary, out, notes)
    by_id: dict[str, dict[str, Any]] = {}
    for r in recon_rows:
        by_id.setdefault(str(r.get("id")), r)
    segments: dict[str, pd.DataFrame | str] = {}
    for w in summary["worst"][:3]:
        if w["id"] in by_id:
            try:
                segments[w["id"]] = segments_table(tok, by_id[w["id"]])
            except Exception as e:  # one record's odd segments never take down the report
                notes.append(left_out_note("segments", w["id"], error_reason(e)))
                segments[w["id"]] = notes[-1]["reason"]
    summary["charts"] = {k: p.name for k, p in charts.items()}
    summary["meta"] = meta or {}
    page = render_html(summary, charts, segments, notes)
    summary["left_out"] = {**{k: sum(n["part"] == part for n in notes) for part, k in
                              (("chart", "charts"), ("section", "sections"), ("segments", "segments"))},
                           "notes": notes[:MAX_NOTES]}
    write_json(out / "summary.json", json.loads(json.dumps(summary, default=str)))
    write_summary_tables(json.loads(json.dumps(summary, default=str)), out / "summary.json")  # summary.md, .csv
    write_json(out / "metrics.json", metrics(summary))
    write_text(out / "report.html", page)
    return summary
