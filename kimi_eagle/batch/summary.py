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

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from ..io import atomic_path, write_text

BOUND_SUFFIXES = [("_ci", None), ("_lo", "_hi"), ("_low", "_high"), ("_ci_low", "_ci_high"), ("_ci_lo", "_ci_hi")]
MAX_CHARTS = 24
STATUS_ORDER = {"ok": 0, "failed": 1, "missing": 2}


def summary_frame(run_dir: Path, runs: list[tuple[str, dict[str, Any]]]) -> pd.DataFrame:
    """One row per ``(name, params)`` in ``runs``, read from ``RUN_DIR/<name>/run.json`` and ``metrics.json``."""
    rows = []
    for name, params in runs:
        state = _read_json(run_dir / name / "run.json") or {}
        status = state.get("status", "missing")
        if status == "running":  # an interrupted run: not finished, will be re-run by --resume
            status = "missing"
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


def write_summary(run_dir: Path, runs: list[tuple[str, dict[str, Any]]], title: str = "batch") -> pd.DataFrame:
    """Write ``summary.parquet``, ``charts/*.png`` and ``summary.html`` into ``run_dir`` (atomically)."""
    df = summary_frame(run_dir, runs)
    with atomic_path(run_dir / "summary.parquet") as tmp:
        df.to_parquet(tmp, index=False)
    charts = comparison_charts(df, run_dir / "charts")
    write_text(run_dir / "summary.html", summary_html(df, [c.relative_to(run_dir) for c in charts], title))
    return df


def comparison_charts(df: pd.DataFrame, out: Path) -> list[Path]:
    """Charts comparing runs: a bar per run for each numeric metric (error bars from its interval), one stacked
    bar per run for each mapping of counts (e.g. ``verdict``), a line per run for each list metric (e.g. per step).

    Metrics that are zero (or missing) in every run are left out: there is nothing to compare.
    """
    out.mkdir(parents=True, exist_ok=True)
    metrics = [c for c in df.columns if c.startswith("metric.")]
    bounds = {c for m in metrics for c in _interval_columns(df, m) or ()}
    numeric = [c for c in metrics if c not in bounds and df[c].notna().any()
               and all(_is_number(v) for v in df[c].dropna())]
    groups: dict[str, list[str]] = {}
    for c in numeric:
        if c.count(".") >= 2:
            groups.setdefault(c.rsplit(".", 1)[0], []).append(c)
    groups = {g: cols for g, cols in groups.items() if len(cols) >= 2}
    grouped = {c for cols in groups.values() for c in cols}

    paths: list[Path] = []
    for col in metrics:
        if len(paths) >= MAX_CHARTS or col in bounds or col in grouped:
            continue
        values = df[col]
        have = values.notna()
        name = col[len("metric."):]
        path = out / f"{re.sub(r'[^A-Za-z0-9._-]+', '_', name)}.png"
        if col in numeric and _nonzero(values):
            _bar_chart(df[have], col, name, _interval_columns(df, col), path)
        elif have.any() and all(_is_number_list(v) for v in values[have]):
            _line_chart(df[have], col, name, path)
        else:
            continue
        paths.append(path)
    for group, cols in groups.items():
        cols = [c for c in cols if _nonzero(df[c])]
        if cols and len(paths) < MAX_CHARTS:
            name = group[len("metric."):]
            path = out / f"{re.sub(r'[^A-Za-z0-9._-]+', '_', name)}.png"
            _stacked_chart(df[df[cols].notna().any(axis=1)], cols, name, path)
            paths.append(path)
    return paths


def _nonzero(values: pd.Series) -> bool:
    return any(_present(v) and (not _is_number(v) or v != 0) for v in values)


def _stacked_chart(df: pd.DataFrame, cols: list[str], name: str, path: Path) -> None:
    labels = [str(r) for r in df["run"]]
    fig, ax = plt.subplots(figsize=(8, max(2.2, 0.45 * len(labels) + 1.2)))
    left = [0.0] * len(labels)
    for col in cols:
        values = [float(v) if _is_number(v) else 0.0 for v in df[col]]
        bars = ax.barh(labels, values, left=left, label=col.rsplit(".", 1)[1])
        ax.bar_label(bars, labels=[_fmt(v) if v else "" for v in values], fontsize=8, label_type="center")
        left = [a + b for a, b in zip(left, values)]
    ax.invert_yaxis()
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set(title=f"{name} per run", xlabel=f"{name} (stacked)", ylabel="run")
    fig.tight_layout()
    _write_png(fig, path)


def summary_html(df: pd.DataFrame, charts: list[Path], title: str) -> str:
    counts = df["status"].value_counts().to_dict()
    head = ", ".join(f"{counts[s]} {s}" for s in sorted(counts, key=lambda s: (STATUS_ORDER.get(s, 9), s)))
    params = [c for c in df.columns if c.startswith("param.")]
    varying = [c for c in params if df[c].map(lambda v: repr(v) if _present(v) else "").nunique() > 1] or params
    metrics = [c for c in df.columns if c.startswith("metric.")]
    cols = ["run", "status", "duration_s", *varying, *metrics]
    groups = (f'<tr><th colspan="3"></th><th colspan="{len(varying)}">parameters</th>'
              f'<th colspan="{len(metrics)}">metrics</th><th></th></tr>') if varying or metrics else ""
    th = groups + "<tr>" + "".join(f"<th>{html.escape(c.split('.', 1)[-1])}</th>" for c in cols) + "<th>notebook</th></tr>"
    body = []
    for _, r in df.iterrows():
        cells = "".join(_cell(c, r[c]) for c in cols)
        links = " ".join(f'<a href="{html.escape(str(r[k]))}">{k}</a>' for k in ("html", "notebook") if _present(r[k]))
        body.append(f'<tr class="{html.escape(str(r["status"]))}">{cells}<td>{links}</td></tr>')
    failures = "".join(
        f"<h3>{html.escape(str(r['run']))}</h3><p><b>{html.escape(str(r['error']))}</b></p>"
        + (f"<p>failing cell (index {int(r['failed_cell_index'])}):</p><pre>{html.escape(str(r['failed_cell']))}</pre>"
           if _present(r["failed_cell"]) else "")
        for _, r in df[df.status == "failed"].iterrows())
    fixed = [c for c in params if c not in varying]
    fixed_html = "".join(f"<li><code>{html.escape(c[6:])}</code> = {html.escape(repr(df[c].iloc[0]))}</li>" for c in fixed)
    imgs = "".join(f'<figure><img src="{html.escape(str(p))}" alt="{html.escape(p.stem)}"></figure>' for p in charts)
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title><style>
body{{font-family:system-ui,sans-serif;margin:2em}} table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}} td:first-child{{text-align:left}}
tr.ok td:nth-child(2){{color:#2e7d32}} tr.failed td:nth-child(2){{color:#c62828;font-weight:bold}}
tr.missing td:nth-child(2){{color:#777}} pre{{background:#f5f5f5;padding:8px;overflow:auto}}
figure{{display:inline-block;margin:8px}} img{{max-width:640px}}</style></head><body>
<h1>{html.escape(title)}</h1><p>{len(df)} runs: {html.escape(head)}</p>
{f"<p>Fixed parameters:</p><ul>{fixed_html}</ul>" if fixed_html else ""}
<table>{th}{''.join(body)}</table>
{f"<h2>Failed runs</h2>{failures}" if failures else ""}
{f"<h2>Comparison across runs</h2>{imgs}" if imgs else ""}
</body></html>
"""


def _bar_chart(df: pd.DataFrame, col: str, name: str, interval: tuple[str, str] | None, path: Path) -> None:
    labels = [str(r) for r in df["run"]]
    values = [float(v) for v in df[col]]
    fig, ax = plt.subplots(figsize=(8, max(2.2, 0.45 * len(labels) + 1.2)))
    err = None
    if interval is not None:
        lo = [float(v) if _is_number(v) else val for v, val in zip(df[interval[0]], values)]
        hi = [float(v) if _is_number(v) else val for v, val in zip(df[interval[1]], values)]
        err = [[max(0.0, v - a) for v, a in zip(values, lo)], [max(0.0, b - v) for v, b in zip(values, hi)]]
    bars = ax.barh(labels, values, xerr=err, color="#1976d2", capsize=4, error_kw={"ecolor": "#333"})
    ax.bar_label(bars, labels=[_fmt(v) for v in values], fontsize=8, label_type="center", color="white")
    ax.invert_yaxis()
    ax.margins(x=0.2)
    note = f" (bars: {interval[0][7:]} … {interval[1][7:]})" if interval and interval[0] != interval[1] else \
        (" (error bars: interval)" if interval else "")
    ax.set(title=f"{name} per run{note}", xlabel=name, ylabel="run")
    fig.tight_layout()
    _write_png(fig, path)


def _line_chart(df: pd.DataFrame, col: str, name: str, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 4))
    for run, values in zip(df["run"], df[col]):
        ax.plot(range(len(values)), [float(v) for v in values], marker="o", markersize=3, label=str(run))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(title=f"{name} per run", xlabel="index (e.g. step)", ylabel=name)
    ax.legend(fontsize=7)
    fig.tight_layout()
    _write_png(fig, path)


def _write_png(fig: Figure, path: Path) -> None:
    """Write ``fig`` to ``path`` as a PNG (atomically) and close it."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


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


def _cell(col: str, value: Any) -> str:
    if col == "duration_s" and _is_number(value):
        text = f"{value:.1f}"
    elif _is_number(value):
        text = _fmt(float(value))
    else:
        text = "" if not _present(value) else str(value)
    if len(text) > 60:
        text = text[:57] + "…"
    return f"<td>{html.escape(text)}</td>"


def _fmt(v: float) -> str:
    if v == int(v) and abs(v) < 1e12:
        return f"{int(v):,}"
    return f"{v:.4g}"


def _present(v: Any) -> bool:
    if v is None:
        return False
    if isinstance(v, float) and math.isnan(v):
        return False
    return True


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and _present(v)


def _is_number_list(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and len(v) > 0 and all(_is_number(x) for x in v)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


