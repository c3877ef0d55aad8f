"""The combined review of a batch: ``summary.parquet``, ``summary.html`` and comparison charts.

One row per planned run, whatever its state: ``run``, ``status`` (``ok`` / ``failed`` / ``missing``),
``duration_s``, ``attempts``, ``error``, ``failed_cell``, ``notebook`` and ``html`` (paths relative to
RUN_DIR), then ``param.<name>`` for every parameter and ``metric.<name>`` for every key of the run's
``metrics.json`` (nested mappings flattened with dots).

Intervals: a numeric metric ``m`` is drawn with an error bar when the same file holds ``m_ci`` (``[lo, hi]``),
``m_lo``/``m_hi``, ``m_low``/``m_high`` or ``m_ci_low``/``m_ci_high``.
"""
from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from kimi_eagle.apps.reports.toolkit import (
    DATA_TAGS,
    SHORT_TOKEN,
    STATUS_COLORS,
    TOY_NOTE,
    breakable,
    figure,
    finding,
    html_page,
    integer_axis,
    linked_figures,
    save,
    verdict_color,
)
from kimi_eagle.apps.reports.toolkit import title as chart_title
from kimi_eagle.diff.classify import TOKEN_DELTA_SIGN
from kimi_eagle.io import atomic_path, write_text

BOUND_SUFFIXES = [("_ci", None), ("_lo", "_hi"), ("_low", "_high"), ("_ci_low", "_ci_high"), ("_ci_lo", "_ci_hi")]
MAX_CHARTS = 24
STATUS_ORDER = {"ok": 0, "failed": 1, "missing": 2}
DATA_ORDER = {"simulated": 0, "real": 1, "toy": 3}  # display order: a toy model's runs last, apart from the rest
TOY = "toy"
TOY_COLOR = "#ad1457"
SIGN_GAP = "billed − reconstructed"  # the pages' one sign convention: reference − reconstructed
# billing verdict counts (``metric.billing_<class>``) drawn as one stacked bar per run, like ``verdict``
STACKED_SINGLES = {"billing verdict": ("billing_match", "billing_explained", "billing_unexplained", "billing_no_billing",
                                       "billing_error")}


def summary_frame(run_dir: Path, runs: list[tuple[str, dict[str, Any]]]) -> pd.DataFrame:
    """One row per ``(name, params)`` in ``runs``, read from ``RUN_DIR/<name>/run.json`` and ``metrics.json``; an ok
    run whose ``metrics.json`` no longer reads (NaN, corrupt) is a failed row saying so."""
    rows = []
    for name, params in runs:
        state = _read_json(run_dir / name / "run.json") or {}
        status = state.get("status", "missing")
        if status == "running":  # an interrupted run: not finished, will be re-run by --resume
            status = "missing"
        if status == "ok" and (problem := metrics_problem(run_dir / name)):  # corrupted since: never an ok row
            status, state = "failed", {**state, "error": f"{problem}; `batch --resume` runs it again"}
        metrics = _read_json(run_dir / name / "metrics.json") if status in ("ok", "failed") else None
        cell = state.get("failed_cell") or {}
        row = {
            "run": name, "status": status, "duration_s": state.get("duration_s"),
            "attempts": state.get("attempts", 0), "error": state.get("error"),
            "failed_cell": cell.get("source"), "failed_cell_index": cell.get("index"),
            "notebook": state.get("notebook"), "html": state.get("html"),
        }
        row.update({f"param.{k}": v for k, v in params.items()})
        row.update({f"metric.{k}": v for k, v in _flatten(metrics or {}).items()})
        rows.append(row)
    return _parquet_safe(pd.DataFrame(rows))


def metrics_problem(run_out: Path) -> str | None:
    """Why ``RUN/metrics.json`` does not read as a run's metrics (not JSON, not an object, a NaN or infinite
    number anywhere), or None (also when the run wrote none)."""
    path = Path(run_out) / "metrics.json"
    if not path.exists():
        return None

    def refuse(name: str) -> Any:
        raise ValueError(f"it holds {name}")

    try:
        metrics = json.loads(path.read_text(encoding="utf-8"), parse_constant=refuse)
    except (OSError, ValueError, RecursionError) as e:
        return f"metrics.json does not read ({str(e)[:120]})"
    if not isinstance(metrics, dict):
        return f"metrics.json is a JSON {type(metrics).__name__}, not an object"
    return None


def write_summary(run_dir: Path, runs: list[tuple[str, dict[str, Any]]], title: str = "batch") -> pd.DataFrame:
    """Write ``summary.parquet``, ``charts/*.png`` and ``summary.html`` into ``run_dir`` (atomically)."""
    df = summary_frame(run_dir, runs)
    with atomic_path(run_dir / "summary.parquet") as tmp:
        df.to_parquet(tmp, index=False)
    df = by_data_kind(df)
    charts = comparison_charts(df, run_dir / "charts")
    write_text(run_dir / "summary.html", summary_html(df, [c.relative_to(run_dir) for c in charts], title))
    return df


def comparison_charts(df: pd.DataFrame, out: Path) -> list[Path]:
    """Charts comparing runs: a bar per run for each numeric metric (error bars from its interval), one stacked
    bar per run for each mapping of counts (e.g. ``verdict``), a line per run for each list metric (e.g. per step).

    Metrics that are zero (or missing) in every run, and metrics with the same value in every run that has them
    (stated once in ``summary.html`` instead), are left out: there is nothing to compare. Run labels carry the
    run's data kind (``metrics.json["data"]``: ``simulated`` or ``real``) when it has one.
    """
    out.mkdir(parents=True, exist_ok=True)
    metrics = [c for c in _metric_columns(df) if c not in set(constant_metrics(df))]
    bounds = {c for m in metrics for c in _interval_columns(df, m) or ()}
    numeric = [c for c in metrics if c not in bounds and df[c].notna().any()
               and all(_is_number(v) for v in df[c].dropna())]
    groups: dict[str, list[str]] = {}
    for c in numeric:
        if c.count(".") >= 2:
            groups.setdefault(c.rsplit(".", 1)[0], []).append(c)
    groups = _stacked_groups(df, {g: cols for g, cols in groups.items() if len(cols) >= 2})
    grouped = {c for cols in groups.values() for c in cols}  # drawn stacked, not as bars of their own

    paths: list[Path] = []
    for col in metrics:
        if len(paths) >= MAX_CHARTS or col in bounds or col in grouped:
            continue
        values = df[col]
        have = values.notna()
        name = col[len("metric."):]
        path = out / f"{re.sub(r'[^A-Za-z0-9._-]+', '_', name)}.png"
        if col in numeric and _nonzero(values):  # every finished run, even one without it ("n/a")
            save(bar_chart(df[have | (df.status == "ok")], col, _interval_columns(df, col)), path, tight=False)
        elif have.any() and all(_is_number_list(v) for v in values[have]):
            save(line_chart(df[have], col), path, tight=False)
        else:
            continue
        paths.append(path)
    for group, cols in groups.items():
        cols = [c for c in cols if _nonzero(df[c])]
        if cols and len(paths) < MAX_CHARTS:
            name = group[len("metric."):]
            path = out / f"{re.sub(r'[^A-Za-z0-9._-]+', '_', name)}.png"
            save(stacked_chart(df[df.status == "ok"], cols, name), path, tight=False)  # every finished run, even
            paths.append(path)  # one without this group (a billing-only run has no engine verdicts: "n/a")
    return paths


def _stacked_groups(df: pd.DataFrame, groups: dict[str, list[str]]) -> dict[str, list[str]]:
    """The stacked charts: each group of counts, and :data:`STACKED_SINGLES` (e.g. the billing verdict classes)."""
    out = dict(groups)
    for name, keys in STACKED_SINGLES.items():
        cols = [f"metric.{k}" for k in keys if f"metric.{k}" in df.columns
                and all(_is_number(v) for v in df[f"metric.{k}"].dropna())]
        if len(cols) >= 2:
            out[f"metric.{name}"] = cols
    return out


def by_data_kind(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` ordered by data kind (simulated, real, other kinds, then a toy model's runs), the plan's order within."""
    if "metric.data" not in df:
        return df
    rank = [DATA_ORDER.get(str(d), 2) if _present(d) else 4 for d in df["metric.data"]]
    return df.assign(_rank=rank).sort_values("_rank", kind="stable").drop(columns="_rank")


def _is_toy(df: pd.DataFrame) -> list[bool]:
    return [str(d) == TOY for d in df["metric.data"]] if "metric.data" in df else [False] * len(df)


def _mark_toy(ax: Any, df: pd.DataFrame) -> None:
    """A dashed line above a toy model's runs (drawn last: :func:`by_data_kind`), so they stand apart."""
    toy = _is_toy(df)
    if any(toy) and not all(toy):
        ax.axhline(toy.index(True) - 0.5, color=TOY_COLOR, linestyle="--", linewidth=1)


def readable(name: str) -> str:
    """A metric column as a reader would say it: ``metric.mismatch_rate_ci.0`` -> ``mismatch rate (CI low)``,
    ``metric.verdict.exact`` -> ``verdict › exact``."""
    name = name[len("metric."):] if name.startswith("metric.") else name
    name = name[len("param."):] if name.startswith("param.") else name
    for suffix, say in ((r"_ci\.0$", " (CI low)"), (r"_ci\.1$", " (CI high)"), (r"_(lo|low|ci_low|ci_lo)$", " (CI low)"),
                        (r"_(hi|high|ci_high|ci_hi)$", " (CI high)")):
        name = re.sub(suffix, say, name)
    said = name.replace(".", " › ").replace("_", " ")
    return said + SIGNED.get(name, "")


SIGNED = {"billing_gap_pct": f" ({SIGN_GAP})", "token_delta": f" ({TOKEN_DELTA_SIGN})"}  # a difference says its sign


def constant_metrics(df: pd.DataFrame) -> dict[str, Any]:
    """Metric columns with one value in every finished run (at least two): ``{column: value}``. A value missing
    from some finished run is not "the same in every run" (#35): it stays in the tables, where the gap shows."""
    finished = df[df["status"] == "ok"] if "status" in df else df
    out: dict[str, Any] = {}
    for c in _metric_columns(df):
        values = list(finished[c])
        if len(values) >= 2 and all(_present(v) for v in values):
            first = _native(values[0])
            if all(_same(_native(v), first) for v in values[1:]):
                out[c] = first
    return out


def run_labels(df: pd.DataFrame) -> list[str]:
    """Each run's name, with its data kind (``simulated``/``real``) in brackets when its metrics say; a toy model's
    run (``toy``) says it on a second line: ``[REAL engine, toy model (not Kimi's rates)]``."""
    data = df["metric.data"] if "metric.data" in df else pd.Series([None] * len(df), index=df.index)
    return [f"{r}\n{DATA_TAGS[TOY]}" if str(d) == TOY else f"{r} [{d}]" if _present(d) else str(r)
            for r, d in zip(df["run"], data)]


def _metric_columns(df: pd.DataFrame) -> list[str]:
    return [c for c in df.columns if c.startswith("metric.") and c != "metric.data"]


def _nonzero(values: pd.Series) -> bool:
    return any(_present(v) and (not _is_number(v) or v != 0) for v in values)


def _run_figure(n_runs: int) -> tuple[Figure, Any]:
    """A figure tall enough for one horizontal bar per run, a wrapped title above and a legend below."""
    return figure((8, max(3.0, 0.45 * n_runs + 2.0)))  # room for a two-line title and a legend below (#35)


def stacked_chart(df: pd.DataFrame, cols: list[str], name: str) -> Figure:
    """One horizontal stacked bar per run, one segment per column (e.g. the counts of a ``verdict`` mapping)."""
    labels = run_labels(df)
    fig, ax = _run_figure(len(labels))
    left = [0.0] * len(labels)
    for col in cols:
        values = [float(_native(v)) if _is_number(v) else 0.0 for v in df[col]]
        key = col.rsplit(".", 1)[1]
        color = STATUS_COLORS.get(key) if name == "status" else verdict_color(key.removeprefix("billing_"))
        bars = ax.barh(labels, values, left=left, label=readable(key), color=color)  # the reports' colours
        ax.bar_label(bars, labels=[_fmt(v) if v else "" for v in values], fontsize=8, label_type="center")
        left = [a + b for a, b in zip(left, values)]
    for i, absent in enumerate(df[cols].isna().all(axis=1)):
        if absent:  # the run is shown, and says it has none of these counts
            ax.text(0, i, "  n/a (not measured in this run)", va="center", fontsize=8, color="#555")
    _mark_toy(ax, df)
    ax.invert_yaxis()
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    integer_axis(ax, "x")
    ax.set(xlabel=f"{readable(name)} (stacked counts)", ylabel="run")
    chart_title(ax, f"{readable(name)} per run", wrap_to="figure")
    fig.tight_layout()
    return fig


def bar_chart(df: pd.DataFrame, col: str, interval: tuple[str, str] | None = None) -> Figure:
    """One horizontal bar per run (error bars from ``interval``'s two columns). Shares and rates — every value
    and bound within [0, 1] — get a 0–1 axis; other metrics start at zero (or end there when negative)."""
    labels = run_labels(df)
    missing = [not _is_number(v) for v in df[col]]
    values = [0.0 if m else float(_native(v)) for v, m in zip(df[col], missing)]
    fig, ax = _run_figure(len(labels))
    err = None
    lo = hi = values
    if interval is not None:
        lo = [float(_native(v)) if _is_number(v) else val for v, val in zip(df[interval[0]], values)]
        hi = [float(_native(v)) if _is_number(v) else val for v, val in zip(df[interval[1]], values)]
        err = [[max(0.0, v - a) for v, a in zip(values, lo)], [max(0.0, b - v) for v, b in zip(values, hi)]]
    toy = _is_toy(df)
    bars = ax.barh(labels, values, xerr=err, color=[TOY_COLOR if t else "#1976d2" for t in toy], capsize=4,
                   error_kw={"ecolor": "#333"}, label=readable(col) + (" (95% interval)" if interval else ""))
    ax.bar_label(bars, labels=["n/a (not measured in this run)" if m else _fmt(v) for v, m in zip(values, missing)],
                 fontsize=8, padding=4, color="#333")
    if all(v == int(v) for v in values):  # counts (records, hunks): whole-number ticks
        integer_axis(ax, "x")
    if any(toy):
        from matplotlib.patches import Patch

        ax.legend(handles=[Patch(color=TOY_COLOR, label=DATA_TAGS[TOY])], fontsize=7, loc="upper left",
                  bbox_to_anchor=(0, -0.25 - 0.6 / len(labels)))
        _mark_toy(ax, df)
    ax.invert_yaxis()
    everything = [*values, *lo, *hi]
    if all(0.0 <= v <= 1.0 for v in everything):
        ax.set_xlim(0, 1.0)
    else:
        low, high = min(0.0, *everything), max(0.0, *everything)
        pad = 0.15 * (high - low or 1.0)
        ax.set_xlim(low - (pad if low < 0 else 0), high + (pad if high > 0 else 0))
    ax.set(xlabel=readable(col), ylabel="run")
    chart_title(ax, f"{readable(col)} per run" + (" (error bars: 95% interval)" if interval else ""), wrap_to="figure")
    fig.tight_layout()
    return fig


def line_chart(df: pd.DataFrame, col: str) -> Figure:
    """One line per run for a list-valued metric (e.g. a value per training step)."""
    fig, ax = figure((8, 4))
    for label, values in zip(run_labels(df), df[col]):
        ax.plot(range(len(values)), [float(v) for v in values], marker="o", markersize=3, label=label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="index (e.g. step)", ylabel=readable(col))
    chart_title(ax, f"{readable(col)} per run", wrap_to="figure")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


TABLE_METRIC_COLUMNS = 8  # metric columns per table, so every table fits a 1,400 px page


def _data_note(df: pd.DataFrame) -> str:
    """The page's note on how many runs used simulated and real data ("" when no run says)."""
    if "metric.data" not in df or not df["metric.data"].map(_present).any():
        return ""
    kinds = df["metric.data"][df["metric.data"].map(_present)].map(str).value_counts().to_dict()
    return ("<p class='data'>Data: " + ", ".join(f"{n} run{'s' if n != 1 else ''} on <b>{html.escape(k)}</b> data"
                                               for k, n in kinds.items())
            + ". Simulated runs measure the classifier on injected effects; their mismatch rates are set by "
              "the simulator, not by real reconstructions.</p>"
            + (f"<p class='data toy'><b>Toy-model runs (listed last, apart)</b> — {html.escape(TOY_NOTE)}</p>"
               if TOY in kinds else ""))


KIND_SAY = {"simulated": "simulated data (rates set by the injected effects)", "real": "real data",
            TOY: "the toy model (REAL engine, not Kimi's rates)"}


def _range(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.0%}" if f"{lo:.0%}" == f"{hi:.0%}" else f"{lo:.0%}–{hi:.0%}"


RATES_SAID = (  # the finding's two rates: (rate column, what it says, numerator keys, denominator keys, not counted)
    ("metric.mismatch_rate", "the reconstruction differs from the engine in", "compared records",
     lambda m: (m("status.ok") - m("verdict.exact"), m("status.ok")), ()),
    ("metric.billing_unexplained_rate", "the billed count is unexplained for", "rated records",
     lambda m: (m("billing_unexplained"), m("billing_match") + m("billing_explained") + m("billing_unexplained")),
     (("billing_error", "error rows"), ("billing_no_billing", "without a billed count"))),
)


def _rate_said(rows: pd.DataFrame, col: str, what: str, unit: str, counts: Any, skipped: Any) -> str | None:
    """``what`` with its share of ``unit`` (one run: ``k of n unit (share)``, several: the range of shares) and
    the rows not counted; None when no run has the rate."""
    values = [float(_native(v)) for v in rows[col] if _is_number(v)] if col in rows else []
    if not values:
        return None
    if len(values) == 1:
        r = rows[rows[col].map(_is_number)].iloc[0]

        def m(key: str) -> float:
            v = _native(r.get(f"metric.{key}"))
            if not _is_number(v):
                raise KeyError(key)
            return float(v)
        try:
            k, n = counts(m)
            left = [f"{int(m(key)):,} {say}" for key, say in skipped if _is_number(_native(r.get(f"metric.{key}")))
                    and m(key)]
            return (f"{what} {int(k):,} of {int(n):,} {unit} ({values[0]:.0%}; 1 run"
                    + (f"; {' and '.join(left)} not rated" if left else "") + ")")
        except KeyError:
            pass
    return f"{what} {_range(values)} of {unit} ({len(values)} run{'s' if len(values) != 1 else ''})"


def batch_finding(df: pd.DataFrame) -> str:
    """The page's one-line finding in plain words: how many runs finished, and per data kind the engine mismatch
    rate (of compared records) and the billing unexplained rate (of rated records: a reconstruction and a billed
    count, the billing page's denominator) over its finished runs: ``k of n`` for one run, the range for several."""
    ok = df[df.status == "ok"]
    parts = [f"{len(ok):,} of {len(df):,} runs finished"]
    kinds = ok["metric.data"] if "metric.data" in ok else pd.Series([None] * len(ok), index=ok.index)
    for kind in sorted({str(k) for k in kinds if _present(k)}, key=lambda k: DATA_ORDER.get(k, 2)):
        rows = ok[kinds.map(str) == kind]
        said = [t for col, what, unit, counts, skipped in RATES_SAID
                if (t := _rate_said(rows, col, what, unit, counts, skipped))]
        if said:
            parts.append(f"on {KIND_SAY.get(kind, kind + ' data')}, " + " and ".join(said))
    return "; ".join(parts) + "."


def _toy_row(df: pd.DataFrame, i: int, ncols: int) -> str:
    """A header row before the first toy-model run of a table (runs are ordered by :func:`by_data_kind`)."""
    toy = _is_toy(df)
    if toy[i] and (i == 0 or not toy[i - 1]):
        return f"<tr class='group toy'><th colspan='{ncols}'>{html.escape(DATA_TAGS[TOY])}</th></tr>"
    return ""


def _runs_table(df: pd.DataFrame, run_cols: list[str]) -> str:
    """One row per run: its status, data kind, duration and varying parameters, and links to its pages."""
    names = {"metric.data": "data", "metric.n_records": "records (n)", "duration_s": "duration (s)"}
    th = ("<tr>" + "".join(f"<th>{breakable(names.get(c) or readable(c))}</th>" for c in run_cols)
          + "<th>pages</th></tr>")
    body = []
    for i, (_, r) in enumerate(df.iterrows()):
        cells = "".join(_cell(c, r[c]) for c in run_cols)
        links = " ".join(f'<a href="{html.escape(str(r[k]))}">{k}</a>' for k in ("html", "notebook") if _present(r[k]))
        body.append(_toy_row(df, i, len(run_cols) + 1)
                    + f'<tr class="{html.escape(str(r["status"]))}">{cells}<td>{links}</td></tr>')
    return f"<table>{th}{''.join(body)}</table>"


def _metric_chunks(metrics: list[str]) -> list[tuple[str, list[str]]]:
    """Metric columns in tables of at most :data:`TABLE_METRIC_COLUMNS`: single metrics first, then each group
    (``metric.<group>.<name>``) on its own."""
    by_group: dict[str, list[str]] = {}
    for c in metrics:
        by_group.setdefault(c.split(".")[1] if c.count(".") >= 2 else "", []).append(c)
    singles = by_group.pop("", [])
    chunks = [("", singles[i:i + TABLE_METRIC_COLUMNS]) for i in range(0, len(singles), TABLE_METRIC_COLUMNS)]
    for group, cols in by_group.items():
        chunks += [(group, cols[i:i + TABLE_METRIC_COLUMNS]) for i in range(0, len(cols), TABLE_METRIC_COLUMNS)]
    return chunks


def _metric_tables(df: pd.DataFrame, metrics: list[str], intervals: dict[str, tuple[str, str]]) -> list[str]:
    """The metrics of every run that has any, in narrow tables; a metric with an interval shows it beside it."""
    tables = []
    for group, cols in _metric_chunks(metrics):
        label = f"{readable(group)}" if group else "metrics"
        th = (f'<tr><th></th><th colspan="{len(cols)}">{html.escape(label)}</th></tr><tr><th>run</th>'
              + "".join(f"<th>{breakable(readable(c.split('.', 2)[2] if group else c))}"
                        f"{' (95% interval)' if c in intervals else ''}</th>" for c in cols) + "</tr>")
        rows = "".join(_toy_row(df, i, len(cols) + 1) + f'<tr class="{html.escape(str(r["status"]))}">{_cell("run", r["run"])}'
                       + "".join(_cell(c, r[c], [r[b] for b in intervals[c]] if c in intervals else None) for c in cols)
                       + "</tr>" for i, (_, r) in enumerate(df.iterrows())
                       if r["status"] == "ok" or any(_present(r[c]) for c in cols))
        tables.append(f"<table class='metrics'>{th}{rows}</table>")
    return tables


def _failures_html(df: pd.DataFrame) -> str:
    """Each failed run: its error and the cell that failed."""
    return "".join(
        f"<h3>{html.escape(str(r['run']))}</h3><p><b>{html.escape(str(r['error']))}</b></p>"
        + (f"<p>failing cell (index {int(r['failed_cell_index'])}):</p><pre>{html.escape(str(r['failed_cell']))}</pre>"
           if _present(r["failed_cell"]) else "")
        for _, r in df[df.status == "failed"].iterrows())


def summary_html(df: pd.DataFrame, charts: list[Path], title: str) -> str:
    """The batch's page: status per run, varying parameters, metrics grouped into narrow tables, values that are
    the same in every run stated once, failures with their cell, and the comparison charts."""
    counts = df["status"].value_counts().to_dict()
    head = ", ".join(f"{counts[s]} {s}" for s in sorted(counts, key=lambda s: (STATUS_ORDER.get(s, 9), s)))
    params = [c for c in df.columns if c.startswith("param.")]
    varying = [c for c in params if df[c].map(lambda v: _show(v) if _present(v) else "").nunique() > 1] or params
    constant = constant_metrics(df)
    metrics = [c for c in _metric_columns(df) if c not in constant]
    intervals = {m: iv for m in metrics if (iv := _interval_columns(df, m))}  # shown with their metric
    bounds = {c for iv in intervals.values() for c in iv}
    metrics = [c for c in metrics if c not in bounds]
    data_note = _data_note(df)
    run_cols = ["run", "status", *(["metric.data"] if data_note else []),
                *(["metric.n_records"] if "metric.n_records" in df else []), "duration_s",
                *[c for c in varying if not (data_note and c == "param.data_kind")]]  # the data column says it
    metric_tables = _metric_tables(df, metrics, intervals)
    failures = _failures_html(df)
    fixed_html = "".join(f"<li><code>{html.escape(c[6:])}</code> = {html.escape(_show(df[c].iloc[0]))}</li>"
                         for c in params if c not in varying)
    same_html = "".join(f"<li>{html.escape(readable(c))} = <b>{html.escape(_show(v))}</b></li>" for c, v in constant.items())
    imgs = linked_figures(charts)
    return html_page(title, [
        f"<h1>{html.escape(title)}</h1>", finding(html.escape(batch_finding(df))),
        f"<p>{len(df)} runs: {html.escape(head)}</p>",
        data_note,
        f"<p>Fixed parameters:</p><ul>{fixed_html}</ul>" if fixed_html else "",
        f"<h2>Runs</h2>{_runs_table(df, run_cols)}",
        "<h2>Metrics</h2>" + "".join(metric_tables) if metric_tables else "",
        f"<p>The same in every run (not charted):</p><ul>{same_html}</ul>" if same_html else "",
        f"<h2>Failed runs</h2>{failures}" if failures else "",
        f"<h2>Comparison across runs</h2>{imgs}" if imgs else "",
    ], "batch")


def _interval_columns(df: pd.DataFrame, col: str) -> tuple[str, str] | None:
    for lo_suffix, hi_suffix in BOUND_SUFFIXES:
        if hi_suffix is None:
            ci = f"{col}{lo_suffix}"
            if f"{ci}.0" in df.columns and f"{ci}.1" in df.columns:
                return f"{ci}.0", f"{ci}.1"
        elif f"{col}{lo_suffix}" in df.columns and f"{col}{hi_suffix}" in df.columns:
            return f"{col}{lo_suffix}", f"{col}{hi_suffix}"
    return None


def _flatten(obj: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings become dotted keys; a two-number list named ``*_ci`` becomes ``.0`` / ``.1``."""
    flat: dict[str, Any] = {}
    for k, v in obj.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            flat.update(_flatten(v, f"{key}."))
        elif str(k).endswith("_ci") and isinstance(v, list) and len(v) == 2 and all(_is_number(x) for x in v):
            flat[f"{key}.0"], flat[f"{key}.1"] = float(v[0]), float(v[1])
        else:
            flat[key] = v
    return flat


def _parquet_safe(df: pd.DataFrame) -> pd.DataFrame:
    """Columns whose values mix types (or hold non-numeric lists) become JSON text, so any metrics.json fits."""
    for col in df.columns:
        present = [v for v in df[col] if _present(v)]
        if not present:
            continue
        if all(_is_number_list(v) for v in present):
            continue
        kinds = {"number" if _is_number(v) else type(v).__name__ for v in present}
        if len(kinds) > 1 or kinds & {"list", "dict", "tuple"}:
            df[col] = [json.dumps(v, default=str) if _present(v) else None for v in df[col]]
    return df


def _cell(col: str, value: Any, interval: list[Any] | None = None) -> str:
    value = _native(value)
    if col == "duration_s" and _is_number(value):
        text = f"{value:.1f}"
    else:
        text = _show(value) if _present(value) else ""
    if text and interval and all(_is_number(v) for v in interval):
        text += f" [{_fmt(float(_native(interval[0])))}, {_fmt(float(_native(interval[1])))}]"
    full = text
    if len(text) > 120:
        text = text[:117] + "…"
    title = f' title="{html.escape(full)}"' if full != text else ""
    if _is_number(value) or (interval and text):
        return f"<td class='num'{title}>{html.escape(text)}</td>"
    if len(text) <= SHORT_TOKEN and not any(c.isspace() for c in text):  # a short name or id: kept whole
        return f"<td class='tok'{title}>{html.escape(text)}</td>"
    return f"<td{title}>{breakable(text)}</td>"


def _native(v: Any) -> Any:
    """numpy scalars and arrays as plain Python values (``np.int64(5)`` -> ``5``, ``np.True_`` -> ``True``)."""
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return [_native(x) for x in v.tolist()]
    if isinstance(v, (list, tuple)):
        return [_native(x) for x in v]
    return v


def _show(v: Any) -> str:
    """A value as a reader expects it: numbers formatted, strings bare, lists and mappings as JSON."""
    v = _native(v)
    if _is_number(v):
        return _fmt(float(v))
    if isinstance(v, str):
        return v
    if v is None or isinstance(v, bool):
        return str(v)
    try:
        return json.dumps(v, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(v)


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b) and type(a) is type(b) or (_is_number(a) and _is_number(b) and float(a) == float(b))
    except (TypeError, ValueError):
        return False


def _fmt(v: float) -> str:
    """``5``, ``1,234``, ``234,549`` (no exponent below 10^12), ``0.25``, ``0.0001234``."""
    if not math.isfinite(v):
        return str(v)
    if v == int(v) and abs(v) < 1e12:
        return f"{int(v):,}"
    if 1000 <= abs(v) < 1e12:
        return f"{v:,.0f}"
    return f"{v:.4g}"


def _present(v: Any) -> bool:
    v = _native(v)
    if isinstance(v, list):
        return True
    if v is None:
        return False
    if isinstance(v, float) and math.isnan(v):
        return False
    return True


def _is_number(v: Any) -> bool:
    v = _native(v)
    return isinstance(v, (int, float)) and not isinstance(v, bool) and _present(v)


def _is_number_list(v: Any) -> bool:
    v = _native(v)
    return isinstance(v, (list, tuple)) and len(v) > 0 and all(_is_number(x) for x in v)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


