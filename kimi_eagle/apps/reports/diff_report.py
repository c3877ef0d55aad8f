"""``kimi-eagle report DIFF_DIR -o REPORT_DIR``: summary.json, review charts, and report.html.

Rates come with Wilson 95% intervals. When the diff carries expected labels (from
``kimi-eagle simulate``), the summary and the report include the confusion table and each class's
precision and recall.

Every output says whether its numbers come from **simulated** data (a labelled benchmark whose
mismatch rates are set by how many effects were injected) or **real** engine/API pairs: the report's
header, every chart title and ``summary.json["data"]``. Charts are drawn on
:class:`matplotlib.figure.Figure` objects, so importing this module never touches pyplot's backend.

One bad record never takes down the report: :func:`screen_diff` leaves out every record or hunk whose
fields cannot be counted (NaN or None in a number an ok record needs, an unknown status or verdict, text
that is not valid UTF-8), and any unforeseen exception while drawing a chart, rendering a section or one
example hunk replaces that part with a visible note naming the record and the reason. ``summary.json``
counts what was left out (``left_out``) and lists why; the report shows the same list near its top.
"""
from __future__ import annotations

import base64
import html
import json
import math
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from kimi_eagle.diff.classify import LABELS, SUBCLASSES, VERDICTS
from kimi_eagle.diff.run import HUNK_SCHEMA, RECORD_SCHEMA, STATUSES, DiffResult
from kimi_eagle.io import write_figure, write_text
from kimi_eagle.records import printable_id, storable_text

if TYPE_CHECKING:
    from kimi_eagle.tokenize.tokenizer import Tokenizer

Z95 = 1.959963984540054
VERDICT_COLORS = {"exact": "#388e3c", "bpe_split": "#1976d2", "semantic": "#d32f2f"}
DATA_KINDS = ("simulated", "real")
DATA_NOTES = {
    "simulated": "SIMULATED data: a labelled benchmark with injected effects; its rates measure the classifier, "
                 "not how often real reconstructions differ (they are set by how many effects were injected).",
    "real": "REAL data: engine token IDs against IDs reconstructed from the API text for the same generations.",
}
CHARTS = ("mismatch_rate_by_dataset", "verdicts", "hunk_sizes", "token_delta", "first_divergence", "billing", "confusion")


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for ``k`` successes in ``n`` trials (``(0, 1)`` when ``n == 0``)."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def data_kind(records: pd.DataFrame) -> str:
    """``"simulated"`` when the diff carries expected labels (``kimi-eagle simulate``), else ``"real"``."""
    return "simulated" if "expected" in records and records["expected"].notna().any() else "real"


# --------------------------------------------------------------------------------------------
# screening: what cannot be counted is left out, named, and counted — never a crash

TEXT_FIELDS = ("id", "dataset", "status", "error", "verdict", "label", "expected", "provider", "format",
               "finish_reason", "engine_finish_reason")
OK_COUNTS = ("n_engine_tokens", "n_recon_tokens", "token_delta", "n_hunks")
OPTIONAL_COUNTS = ("first_divergence", "billing_explained", "reasoning_explained")
BILLED_COUNTS = {"billed_completion_tokens": ("billing_delta", "billing_unexplained"),
                 "billed_reasoning_tokens": ("recon_reasoning_tokens", "reasoning_delta", "reasoning_unexplained")}
HUNK_KINDS = ("split", "semantic")
HUNK_COUNTS = ("engine_tok_start", "engine_tok_end", "recon_tok_start", "recon_tok_end", "token_delta")
LEFT_OUT_PARTS = ("records", "hunks", "example_hunks", "charts", "sections")
MAX_NOTES = 100  # notes listed in summary.json and the report (the counts cover all of them)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, (float, np.floating)) and math.isnan(value))


def _whole_problem(value: Any, name: str) -> str | None:
    """Why ``value`` is not a whole number (missing, not a number, NaN, infinite, fractional), or None."""
    if _missing(value):
        return f"{name} is missing (null or NaN)"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        return f"{name} is a {type(value).__name__}, not a number"
    if not math.isfinite(value) or not float(value).is_integer():
        return f"{name} is {value!r}, not a whole number"
    return None


def _text_problem(value: Any, name: str) -> str | None:
    """Why ``value`` is not storable text, or None (missing text is fine: null, or pandas' NaN for it)."""
    if _missing(value):
        return None
    if not isinstance(value, str):
        return f"{name} is a {type(value).__name__}, not text"
    if not storable_text(value):
        return f"{name} is not valid UTF-8 text (a lone surrogate)"
    return None


def record_problem(row: Mapping[str, Any]) -> str | None:
    """Why one ``records.parquet`` row cannot enter the report's numbers, or None when it can."""
    if not isinstance(row.get("id"), str):
        return _text_problem(row.get("id"), "id") or "id is missing"
    for name in TEXT_FIELDS:
        if problem := _text_problem(row.get(name), name):
            return problem
    status = row.get("status")
    if status not in STATUSES:
        return f"status {status!r} is not one of {', '.join(STATUSES)}"
    if status != "ok":
        return None
    if row.get("verdict") not in VERDICTS:
        return f"verdict {row.get('verdict')!r} is not one of {', '.join(VERDICTS)}"
    if not isinstance(row.get("label"), str):
        return "label is missing"
    subclasses = row.get("subclasses")
    if not isinstance(subclasses, (list, tuple, np.ndarray)) or not all(isinstance(c, str) for c in subclasses):
        return f"subclasses is {subclasses!r}, not a list of names"
    for name in OK_COUNTS:
        if problem := _whole_problem(row.get(name), name):
            return problem
    for name in OPTIONAL_COUNTS:
        if not _missing(row.get(name)) and (problem := _whole_problem(row.get(name), name)):
            return problem
    frac = row.get("first_divergence_frac")
    if not _missing(frac) and (isinstance(frac, (bool, np.bool_)) or not isinstance(frac, (int, float, np.number))
                               or not 0 <= frac <= 1):
        return f"first_divergence_frac is {frac!r}, not a number in 0..1"
    for billed, needed in BILLED_COUNTS.items():
        if _missing(row.get(billed)):
            continue
        for name in (billed, *needed):
            if problem := _whole_problem(row.get(name), name):
                return problem
    if not _missing(row.get("engine_canonical")) and not isinstance(row.get("engine_canonical"), (bool, np.bool_)):
        return f"engine_canonical is {row.get('engine_canonical')!r}, not true or false"
    return None


def hunk_problem(hunk: Mapping[str, Any], counted_ids: set[str]) -> str | None:
    """Why one ``hunks.parquet`` row cannot enter the report's numbers, or None. ``counted_ids``: the ids of
    the ok records the report counts."""
    rid = hunk.get("id")
    if problem := _text_problem(rid, "id") or (None if isinstance(rid, str) else "id is missing"):
        return problem
    if rid not in counted_ids:
        return f"no ok record {printable_id(rid)!r} in the report"
    if hunk.get("kind") not in HUNK_KINDS:
        return f"kind {hunk.get('kind')!r} is not one of {', '.join(HUNK_KINDS)}"
    for name in ("subclass", "segment"):
        if problem := _text_problem(hunk.get(name), name):
            return problem
    for name in HUNK_COUNTS:
        if problem := _whole_problem(hunk.get(name), name):
            return problem
    return None


def _note(part: str, rid: Any, reason: str, **where: Any) -> dict[str, Any]:
    """One left-out part: ``part`` (record, hunk, example hunk, chart, section), the record's id, why."""
    return {"part": part, "id": None if rid is None else printable_id(rid), **where, "reason": printable_id(reason)}


def _reason(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def screen_diff(result: DiffResult) -> tuple[DiffResult, list[dict[str, Any]]]:
    """The records and hunks the report can count (every schema column present), and a note for each one left
    out: ``{"part": "record" | "hunk", "id", "reason"}`` (hunks also carry ``hunk``, their index)."""
    notes: list[dict[str, Any]] = []
    records = result.records.reindex(columns=list(dict.fromkeys([*result.records.columns, *RECORD_SCHEMA.names])))
    hunks = result.hunks.reindex(columns=list(dict.fromkeys([*result.hunks.columns, *HUNK_SCHEMA.names])))
    keep = []
    for row in records.to_dict("records"):
        try:
            problem = record_problem(row)
        except Exception as e:  # a value no check foresaw
            problem = f"unexpected {_reason(e)}"
        keep.append(problem is None)
        if problem is not None:
            notes.append(_note("record", row.get("id"), problem))
    records = records[np.array(keep, dtype=bool)] if len(records) else records
    counted = set(records.loc[records["status"] == "ok", "id"])
    keep = []
    for k, hunk in enumerate(hunks.to_dict("records")):
        try:
            problem = hunk_problem(hunk, counted)
        except Exception as e:
            problem = f"unexpected {_reason(e)}"
        keep.append(problem is None)
        if problem is not None:
            notes.append(_note("hunk", hunk.get("id"), problem, hunk=hunk.get("hunk") if not _missing(hunk.get("hunk")) else k))
    hunks = hunks[np.array(keep, dtype=bool)] if len(hunks) else hunks
    return DiffResult(records.reset_index(drop=True), hunks.reset_index(drop=True)), notes


def left_out_counts(notes: list[dict[str, Any]]) -> dict[str, Any]:
    """``summary.json["left_out"]``: how many records, hunks, example hunks, charts and sections were left out,
    and the first notes saying which and why."""
    parts = {"record": "records", "hunk": "hunks", "example hunk": "example_hunks", "chart": "charts",
             "section": "sections"}
    counts = {name: sum(n["part"] == part for n in notes) for part, name in parts.items()}
    return {**counts, "notes": notes[:MAX_NOTES]}


# --------------------------------------------------------------------------------------------
# numbers


def _ok(records: pd.DataFrame) -> pd.DataFrame:
    return records[records["status"] == "ok"]


def rates_by_dataset(records: pd.DataFrame) -> pd.DataFrame:
    """Per dataset (and ``all``): ok records, mismatches (not exact), semantic ones, rates and Wilson CIs."""
    ok = _ok(records).assign(dataset=lambda d: d["dataset"].fillna("(none)"))
    rows = []
    for name, group in [*ok.groupby("dataset", sort=True), ("all", ok)]:
        n = len(group)
        row: dict[str, Any] = {"dataset": name, "n": n}
        for what, mask in (("mismatch", group["verdict"] != "exact"), ("semantic", group["verdict"] == "semantic")):
            k = int(mask.sum())
            lo, hi = wilson(k, n)
            row.update({f"{what}": k, f"{what}_rate": k / n if n else None, f"{what}_lo": lo, f"{what}_hi": hi})
        rows.append(row)
    return pd.DataFrame(rows)


def confusion(records: pd.DataFrame) -> pd.DataFrame | None:
    """Expected (rows) against predicted label (columns) for records with an expected label."""
    if "expected" not in records or records["expected"].isna().all():
        return None
    lab = records[records["expected"].notna()]
    predicted = lab["label"].where(lab["status"] == "ok", "status:" + lab["status"].astype(str))
    classes = [c for c in LABELS if c in set(lab["expected"]) | set(predicted)]
    classes += sorted((set(lab["expected"]) | set(predicted)) - set(classes))
    return pd.crosstab(lab["expected"], predicted).reindex(index=classes, columns=classes, fill_value=0)


def precision_recall(table: pd.DataFrame) -> pd.DataFrame:
    """Per class: support, precision, recall (None where undefined)."""
    rows = []
    for c in table.index:
        tp = int(table.loc[c, c]) if c in table.columns else 0
        predicted = int(table[c].sum()) if c in table.columns else 0
        support = int(table.loc[c].sum())
        rows.append({"class": c, "support": support, "predicted": predicted,
                     "precision": tp / predicted if predicted else None, "recall": tp / support if support else None})
    return pd.DataFrame(rows)


def billing_summary(records: pd.DataFrame, hunks: pd.DataFrame) -> dict[str, Any]:
    """Aggregate billed vs reconstructed tokens, the part hunks explain (by hunk class) and the rest."""
    ok = _ok(records)
    billed = ok[ok["billed_completion_tokens"].notna()]
    out: dict[str, Any] = {
        "n_records_billed": len(billed),
        "billed_completion_tokens": int(billed["billed_completion_tokens"].sum()),
        "reconstructed_completion_tokens": int(billed["n_recon_tokens"].sum()),
        "delta": int(billed["billing_delta"].sum()),
        "explained_by_hunks": int(billed["billing_explained"].fillna(0).sum()),
        "unexplained": int(billed["billing_unexplained"].sum()),
        "n_records_unexplained": int((billed["billing_unexplained"] != 0).sum()),
    }
    in_billed = hunks[hunks["id"].isin(set(billed["id"]))]
    cls = in_billed["subclass"].fillna(in_billed["kind"])
    out["explained_by_class"] = {k: int(-v) for k, v in in_billed.groupby(cls)["token_delta"].sum().items()}
    r = ok[ok["billed_reasoning_tokens"].notna()]
    out["reasoning"] = {
        "n_records_billed": len(r),
        "billed_reasoning_tokens": int(r["billed_reasoning_tokens"].sum()),
        "reconstructed_reasoning_tokens": int(r["recon_reasoning_tokens"].sum()),
        "delta": int(r["reasoning_delta"].sum()),
        "explained_by_hunks": int(r["reasoning_explained"].fillna(0).sum()),
        "unexplained": int(r["reasoning_unexplained"].sum()),
    }
    return out


def summarize_diff(result: DiffResult) -> dict[str, Any]:
    """Everything ``summary.json`` holds."""
    rec, hunks = result.records, result.hunks
    ok = _ok(rec)
    summary: dict[str, Any] = {
        "n_records": len(rec),
        "status": {s: int((rec["status"] == s).sum()) for s in STATUSES},
        "errors": rec.loc[rec["status"] == "error", ["id", "error"]].head(20).to_dict("records"),
        "verdict": {v: int((ok["verdict"] == v).sum()) for v in VERDICTS},
        "label": {k: int(v) for k, v in ok["label"].value_counts().items()},
        "records_with_subclass": {c: int(ok["subclasses"].map(lambda s, c=c: c in list(s)).sum()) for c in SUBCLASSES},
        "n_hunks": len(hunks),
        "hunks_by_class": {k: int(v) for k, v in hunks["subclass"].fillna(hunks["kind"]).value_counts().items()},
        "hunks_by_segment": {k: int(v) for k, v in hunks["segment"].value_counts().items()},
        "rates": rates_by_dataset(rec).replace({np.nan: None}).to_dict("records"),
        "token_delta": {"sum": int(ok["token_delta"].sum()), "mean": float(ok["token_delta"].mean()) if len(ok) else None,
                        "min": int(ok["token_delta"].min()) if len(ok) else None,
                        "max": int(ok["token_delta"].max()) if len(ok) else None},
        "engine_canonical": {"true": int((ok["engine_canonical"] == True).sum()),  # noqa: E712
                             "false": int((ok["engine_canonical"] == False).sum())},  # noqa: E712
        "billing": billing_summary(rec, hunks),
    }
    table = confusion(rec)
    if table is not None:
        pr = precision_recall(table)
        summary["confusion"] = {"classes": list(table.index), "matrix": table.values.tolist()}
        summary["precision_recall"] = pr.replace({np.nan: None}).to_dict("records")
    return summary


# --------------------------------------------------------------------------------------------
# charts


def _figure(figsize: tuple[float, float], ncols: int = 1):
    """A figure detached from pyplot (no backend involved) and its axes."""
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(1, ncols)


def _title(ax, text: str, data: str | None, fontsize: float = 10.5) -> None:
    """Set ``ax``'s title, prefixed with the data kind, wrapped to the axes' width so it is never clipped."""
    full = f"[{data.upper()} data] {text}" if data else text
    fig = ax.figure
    width_pt = ax.get_position().width * fig.get_figwidth() * 72
    chars = max(20, int(width_pt / (fontsize * 0.55)))
    ax.set_title("\n".join(textwrap.wrap(full, chars)), fontsize=fontsize)


def _save(fig: Figure, path: Path) -> Path:
    """Write ``fig`` as a PNG to ``path`` (atomically)."""
    fig.tight_layout()
    write_figure(fig, path, dpi=110)
    return path


def _plain(label: Any) -> str:
    """``label`` as literal text for matplotlib: ``$`` escaped so that a name like ``$\\frac{$`` is not read as mathtext."""
    return str(label).replace("$", r"\$")


def _no_data(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what}", ha="center", va="center", transform=ax.transAxes, color="#777")


def chart_rates(rates: pd.DataFrame, data: str | None = None) -> Figure:
    fig, ax = _figure((max(6.5, 1.6 * len(rates) + 2), 4.4))
    x = np.arange(len(rates))
    for off, what, color in ((-0.2, "mismatch", "#ff8f00"), (0.2, "semantic", "#d32f2f")):
        rate = rates[f"{what}_rate"].fillna(0).to_numpy(dtype=float)
        err = np.clip(np.array([rate - rates[f"{what}_lo"], rates[f"{what}_hi"] - rate], dtype=float), 0, None)
        bars = ax.bar(x + off, rate, 0.4, yerr=err, capsize=4, color=color,
                      label=f"{what} (not exact)" if what == "mismatch" else "semantic (bytes differ)")
        ax.bar_label(bars, labels=[f"{k}/{n}" for k, n in zip(rates[what], rates["n"])], padding=3, fontsize=8)
    ax.set_xticks(x, [_plain(d) for d in rates["dataset"]])  # dataset names are data, never mathtext
    ax.set_ylim(0, 1.15)
    ax.set(xlabel="dataset", ylabel="share of ok records")
    _title(ax, "Records whose reconstruction differs from the engine (Wilson 95% CI)", data)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return fig


def chart_verdicts(records: pd.DataFrame, hunks: pd.DataFrame, data: str | None = None) -> Figure:
    ok = _ok(records)
    fig, (ax1, ax2) = _figure((12, 4.4), ncols=2)
    labels = [c for c in LABELS if (ok["label"] == c).any()]
    counts = [int((ok["label"] == c).sum()) for c in labels]
    colors = [VERDICT_COLORS["exact"] if c == "exact" else VERDICT_COLORS["bpe_split"] if c == "bpe_split"
              else VERDICT_COLORS["semantic"] for c in labels]
    if labels:
        bars = ax1.barh(labels[::-1], counts[::-1], color=colors[::-1])
        ax1.bar_label(bars, padding=3, fontsize=8)
        ax1.margins(x=0.15)
    else:
        _no_data(ax1, "ok records")
    ax1.set(xlabel="records", ylabel="label")
    _title(ax1, f"Record labels ({len(ok):,} ok records)", data)
    cls = hunks["subclass"].fillna(hunks["kind"]).value_counts()
    if len(cls):
        bars = ax2.barh(list(cls.index[::-1]), list(cls.values[::-1]),
                        color=["#1976d2" if c == "split" else "#d32f2f" for c in cls.index[::-1]])
        ax2.bar_label(bars, padding=3, fontsize=8)
        ax2.margins(x=0.15)
    else:
        _no_data(ax2, "hunks")
    ax2.set(xlabel="hunks", ylabel="split or semantic subclass")
    _title(ax2, f"Hunks by class ({len(hunks):,} hunks)", data)
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


def chart_hunk_sizes(hunks: pd.DataFrame, data: str | None = None) -> Figure:
    fig, ax = _figure((8.5, 4.2))
    if len(hunks):
        size = np.maximum(hunks["engine_tok_end"] - hunks["engine_tok_start"], hunks["recon_tok_end"] - hunks["recon_tok_start"])
        clipped = np.minimum(size, 30)
        _side_by_side_hist(ax, [(kind, clipped[hunks["kind"] == kind], color)
                                for kind, color in (("split", "#1976d2"), ("semantic", "#d32f2f"))],
                           np.arange(0.5, 31.5))
    else:
        _no_data(ax, "hunks")
    ax.set(xlabel="tokens", ylabel="hunks")
    _title(ax, "Hunk size (tokens on the longer side; 30 = 30 or more)", data)
    fig.tight_layout()
    return fig


def chart_token_delta(records: pd.DataFrame, data: str | None = None) -> Figure:
    ok = _ok(records)
    diff = ok[ok["verdict"] != "exact"]
    fig, ax = _figure((8.5, 4.2))
    if len(diff):
        d = diff["token_delta"].clip(-20, 20)
        counts, _, bars = ax.hist(d, bins=np.arange(-20.5, 21.5), color="#6a1b9a",
                                  label=f"differing records ({len(diff):,})")
        ax.bar_label(bars, labels=[f"{int(c)}" if c else "" for c in counts], fontsize=7, padding=1)
        ax.legend(fontsize=8)
    else:
        _no_data(ax, "differing records")
    ax.set(xlabel="reconstructed tokens − engine tokens (clipped at ±20)", ylabel="records")
    _title(ax, f"Token-count delta per differing record ({len(diff):,} records)", data)
    fig.tight_layout()
    return fig


def chart_first_divergence(records: pd.DataFrame, data: str | None = None) -> Figure:
    ok = _ok(records)
    diff = ok[ok["first_divergence_frac"].notna()]
    fig, ax = _figure((8.5, 4.2))
    if len(diff):
        _side_by_side_hist(ax, [(verdict, diff.loc[diff["verdict"] == verdict, "first_divergence_frac"],
                                 VERDICT_COLORS[verdict]) for verdict in ("bpe_split", "semantic")],
                           np.linspace(0, 1, 11))
    else:
        _no_data(ax, "differing records")
    ax.set(xlabel="first differing token / engine tokens", ylabel="records")
    _title(ax, "Where the first difference falls in the engine's completion", data)
    fig.tight_layout()
    return fig


LOG_SPAN = 30  # billing scatter: log axes when the largest count exceeds 30x the median


def chart_billing(records: pd.DataFrame, data: str | None = None) -> Figure:
    ok = _ok(records)
    b = ok[ok["billed_completion_tokens"].notna()]
    fig, ax = _figure((7, 5.6))
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
        _title(ax, f"Billed vs reconstructed completion tokens ({len(b):,} records, {n_off:,} off the diagonal, "
                   f"{int((b['billing_unexplained'] != 0).sum()):,} not explained by hunks"
                   + ("; log axes: counts span " + f"{int(both.min()):,}–{int(both.max()):,}" if log else "") + ")",
               data)
    else:
        _no_data(ax, "billed records")
        _title(ax, "Billed vs reconstructed completion tokens", data)
    ax.set(xlabel="usage.completion_tokens (billed)", ylabel="reconstructed completion tokens")
    fig.tight_layout()
    return fig


def chart_confusion(table: pd.DataFrame, data: str | None = None) -> Figure:
    fig, ax = _figure((max(7.0, 0.75 * len(table.columns) + 3), 0.6 * len(table.index) + 2.8))
    values = table.to_numpy()
    ax.imshow(values > 0, cmap="Blues", vmin=0, vmax=1.6)
    for i in range(values.shape[0]):
        for j in range(values.shape[1]):
            if values[i, j]:
                ax.text(j, i, str(values[i, j]), ha="center", va="center", fontsize=9,
                        color="#b71c1c" if i != j else "#000")
    ax.set_xticks(range(len(table.columns)), [_plain(c) for c in table.columns], rotation=35, ha="right", fontsize=8)
    ax.set_yticks(range(len(table.index)), [_plain(i) for i in table.index], fontsize=8)
    ax.set(xlabel="label from the diff", ylabel="expected label")
    _title(ax, f"Confusion: injected effect's expected label vs diff label ({int(values.sum())} records)", data)
    fig.tight_layout()
    return fig


def make_charts(result: DiffResult, out: Path, data: str | None = None,
                notes: list[dict[str, Any]] | None = None) -> dict[str, Path]:
    """Every review chart as a PNG in ``out``; titles say the data kind (``simulated``/``real``, from the
    records when ``data`` is None). With ``notes``, a chart that fails is left out and noted there
    (``{"part": "chart", "name", "reason"}``) while the others are drawn; without, the error propagates."""
    rec, hunks = result.records, result.hunks
    data = data or data_kind(rec)
    builders: dict[str, Callable[[], Figure | None]] = {
        "mismatch_rate_by_dataset": lambda: chart_rates(rates_by_dataset(rec), data),
        "verdicts": lambda: chart_verdicts(rec, hunks, data),
        "hunk_sizes": lambda: chart_hunk_sizes(hunks, data),
        "token_delta": lambda: chart_token_delta(rec, data),
        "first_divergence": lambda: chart_first_divergence(rec, data),
        "billing": lambda: chart_billing(rec, data),
        "confusion": lambda: None if (table := confusion(rec)) is None else chart_confusion(table, data),
    }
    charts: dict[str, Path] = {}
    for name, build in builders.items():
        try:
            fig = build()
            if fig is not None:
                charts[name] = _save(fig, out / f"{name}.png")
        except Exception as e:
            if notes is None:
                raise
            notes.append(_note("chart", None, _reason(e), name=name))
    return charts


# --------------------------------------------------------------------------------------------
# HTML


def _table_html(df: pd.DataFrame, floats: str = "{:.3f}") -> str:
    return df.to_html(index=False, border=0, classes="t", na_rep="–",
                      float_format=lambda v: floats.format(v), escape=True)


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
            note = _note("example hunk", ex["id"], _reason(e), hunk=ex.get("hunk"))
            if notes is not None:
                notes.append(note)
            shown = [f"⚠ not shown: {note['reason']}", ""]
        rows.append([ex["id"], ex["class"], ex["segment"], *shown])
    return pd.DataFrame(rows, columns=cols)


def _section(notes: list[dict[str, Any]], name: str, build: Callable[[], list[str]]) -> list[str]:
    """``build()``'s HTML parts, or, when it raises, a visible note naming the section and the reason."""
    try:
        return build()
    except Exception as e:
        note = _note("section", None, _reason(e), name=name)
        notes.append(note)
        return [f"<p class='left-out'>⚠ section “{html.escape(name)}” left out: {html.escape(note['reason'])}</p>"]


def _left_out_html(notes: list[dict[str, Any]]) -> list[str]:
    if not notes:
        return []
    counts = left_out_counts(notes)
    said = ", ".join(f"{counts[k]:,} {k.replace('_', ' ')}" for k in LEFT_OUT_PARTS if counts[k])
    rows = pd.DataFrame([{"part": n["part"], "record": n["id"] if n["id"] is not None else "–",
                          "where": n.get("name", n.get("hunk", "")), "reason": n["reason"]} for n in notes[:MAX_NOTES]])
    return ["<h2>Left out of this report</h2>",
            f"<p class='left-out'>⚠ {said} could not be counted or drawn; the rest of the report stands without them "
            f"(<code>summary.json[\"left_out\"]</code>){'; first ' + str(MAX_NOTES) + ' listed' if len(notes) > MAX_NOTES else ''}.</p>",
            _table_html(rows)]


def chart_embedder(charts: dict[str, Path], notes: list[dict[str, Any]]):
    """``image(name, alt)``: the chart's PNG inlined as an ``<img>``, or a visible note saying why it was left out."""
    img = {k: base64.b64encode(Path(p).read_bytes()).decode() for k, p in charts.items()}

    def image(name: str, alt: str) -> str:
        if name in img:
            return f"<img alt='{html.escape(alt, quote=True)}' src='data:image/png;base64,{img[name]}'>"
        why = next((n["reason"] for n in notes if n["part"] == "chart" and n.get("name") == name), "not drawn")
        return f"<p class='left-out'>⚠ chart “{html.escape(name)}” left out: {html.escape(why)}</p>"

    return image


def render_html(summary: dict[str, Any], result: DiffResult, charts: dict[str, Path],
                tok: "Tokenizer | None" = None, notes: list[dict[str, Any]] | None = None) -> str:
    """The self-contained report. Each section is rendered on its own: one that fails becomes a visible note
    (and a ``section`` entry in ``notes``); ``notes`` (with those of :func:`screen_diff` and the charts) are listed
    near the top under “Left out of this report”."""
    notes = notes if notes is not None else []
    image = chart_embedder(charts, notes)
    data = summary.get("data") or data_kind(result.records)

    def verdicts() -> list[str]:
        return ["<h2>Verdicts</h2>", _table_html(pd.DataFrame([summary["verdict"]])), image("verdicts", "verdicts")]

    def rates() -> list[str]:
        return ["<h2>Mismatch rate per dataset (Wilson 95% CI)</h2>", _table_html(pd.DataFrame(summary["rates"])),
                image("mismatch_rate_by_dataset", "mismatch rate")]

    def confusion_table() -> list[str]:
        if "confusion" not in summary:
            return []
        classes = summary["confusion"]["classes"]
        conf = pd.DataFrame(summary["confusion"]["matrix"], index=classes, columns=classes)
        conf.insert(0, "expected \\ diff", classes)
        return ["<h2>Labelled benchmark: confusion table</h2>", _table_html(conf),
                _table_html(pd.DataFrame(summary["precision_recall"])), image("confusion", "confusion")]

    def billing() -> list[str]:
        bill = summary["billing"]
        return [
            "<h2>Billing reconciliation</h2>",
            _table_html(pd.DataFrame([{k: v for k, v in bill.items() if not isinstance(v, dict)}])),
            "<p>Explained by hunk class (engine − reconstructed tokens):</p>",
            _table_html(pd.DataFrame([bill["explained_by_class"]]) if bill["explained_by_class"] else pd.DataFrame([{"none": 0}])),
            "<p>Reasoning tokens:</p>", _table_html(pd.DataFrame([bill["reasoning"]])), image("billing", "billing"),
        ]

    def hunk_charts() -> list[str]:
        return ["<h2>Hunks</h2>", image("hunk_sizes", "hunk sizes"), image("token_delta", "token delta"),
                image("first_divergence", "first divergence")]

    def examples() -> list[str]:
        return [
            "<h3>Example hunks</h3>",
            "<p>Each token quoted separately, so a split shows where the boundaries fall "
            + ("(engine <code>' a' 'n'</code> vs reconstructed <code>' an'</code>).</p>" if tok is not None else
               "(bytes, then the token IDs; pass a tokenizer to see each token's bytes).</p>"),
            _table_html(_hunk_examples(result.hunks, tok=tok, notes=notes)),
        ]

    def errors() -> list[str]:
        return ["<h2>Errors (first 20)</h2>", _table_html(pd.DataFrame(summary["errors"]))] if summary["errors"] else []

    def counts() -> list[str]:
        return [f"<p>{summary['n_records']:,} records: " + ", ".join(f"{v:,} {k}" for k, v in summary["status"].items())
                + ".</p>"]

    body: list[str] = []
    for name, build in (("records", counts), ("verdicts", verdicts), ("mismatch rate", rates),
                        ("confusion table", confusion_table), ("billing", billing), ("hunks", hunk_charts),
                        ("example hunks", examples), ("errors", errors)):
        body += _section(notes, name, build)
    return "\n".join([
        f"<!doctype html><html><head><meta charset='utf-8'><title>kimi-eagle diff report ({data} data)</title><style>",
        "body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}table.t{border-collapse:collapse;font-size:13px}",
        "table.t td,table.t th{border:1px solid #ddd;padding:3px 8px;text-align:right}h2{margin-top:1.6em}",
        "img{max-width:100%;border:1px solid #eee}.data{padding:8px 12px;border-radius:4px;font-size:15px}",
        ".data.simulated{background:#fff3e0;border:2px solid #ef6c00}.data.real{background:#e8f5e9;border:2px solid #2e7d32}",
        ".left-out{background:#ffebee;border:2px solid #c62828;padding:6px 10px;border-radius:4px}",
        "</style></head><body>",
        f"<h1>Engine IDs vs reconstructed IDs — {data} data</h1>",
        f"<p class='data {data}'>{DATA_NOTES.get(data, data)}</p>",
        *_left_out_html(notes), *body, "</body></html>",
    ])


def write_report(result: DiffResult, out_dir: str | Path, data: str | None = None,
                 tok: "Tokenizer | None" = None) -> dict[str, Any]:
    """Write summary.json, the charts and report.html into ``out_dir``; return the summary.

    ``data`` (``"simulated"`` or ``"real"``; default: :func:`data_kind` of the records) is stated in the
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
    charts = make_charts(screened, out, data, notes)
    summary["charts"] = {k: p.name for k, p in charts.items()}
    page = render_html(summary, screened, charts, tok, notes)
    summary["left_out"] = left_out_counts(notes)
    write_text(out / "summary.json", json.dumps(summary, indent=2, default=str))
    write_text(out / "report.html", page)
    return summary


# --------------------------------------------------------------------------------------------
# CLI
