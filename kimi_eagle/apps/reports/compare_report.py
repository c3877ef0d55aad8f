"""``kimi-eagle compare RUN_A RUN_B``: two outputs of the same kind side by side, each figure's change and its interval.

An output is read as a set of named figures (:class:`Estimate`: a value, its 95 % interval when the output has one,
its ``k/n`` when it is a share):

* a diff (``kimi-eagle diff`` folder, summarised here) or a report (``kimi-eagle report`` folder, its
  ``summary.json``): each verdict's share of the counted records, and per dataset the mismatch and semantic
  rates (Wilson intervals); hunks and records as counts;
* a billing folder (``kimi-eagle billing``): each verdict class's share of the records (Wilson), and per
  provider and dataset the billing gap, its unexplained part (their bootstrap intervals) and the unexplained
  rate (Wilson);
* a batch folder (``kimi-eagle batch``, its ``summary.parquet``): per finished run its mismatch rate, billing gap
  and unexplained rate with the intervals the run reported, and its record count.

The change of a figure is **B − A** (the second run minus the first). Its 95 % interval is the MOVER interval
(Zou & Donner 2008) built from the two runs' own 95 % intervals; for two shares with Wilson intervals that is
Newcombe's hybrid score interval (1998, method 10). The two runs are independent samples. A figure without an
interval in either run (a count) shows its change without one; a figure in one run only is listed as such.
The page (``compare.html``), ``compare.md`` and ``compare.csv`` hold the same table.
"""
from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from kimi_eagle.diff.summary import wilson

KINDS = ("diff", "billing", "batch")
SIGN = ("change = B − A (the second run minus the first); its 95 % interval: Newcombe's hybrid score interval for "
        "two shares (MOVER over their Wilson intervals), MOVER over the runs' own 95 % intervals for other figures; "
        "the runs are taken as independent samples")


@dataclass(frozen=True)
class Estimate:
    """One figure of one run: ``value`` with its 95 % interval (``lo``, ``hi``; None: the output holds none) and,
    for a share, its ``k/n``."""

    value: float
    lo: float | None = None
    hi: float | None = None
    counts: str | None = None

    @staticmethod
    def share(k: int, n: int) -> Estimate | None:
        """``k`` of ``n`` with its Wilson interval (None when ``n`` is 0: no share to state)."""
        if not n:
            return None
        lo, hi = wilson(int(k), int(n))
        return Estimate(k / n, lo, hi, f"{int(k)}/{int(n)}")


def mover(a: Estimate, b: Estimate) -> tuple[float, float] | None:
    """The 95 % interval of ``b.value − a.value`` from the two intervals (MOVER); None when either has none.

    >>> lo, hi = mover(Estimate.share(48, 80), Estimate.share(56, 70))  # Newcombe 1998: 56/70 − 48/80, 0.0524 to 0.3339
    >>> round(lo, 4), round(hi, 4)
    (0.0524, 0.3339)
    """
    if None in (a.lo, a.hi, b.lo, b.hi):
        return None
    d = b.value - a.value
    lower = d - math.sqrt((b.value - b.lo) ** 2 + (a.hi - a.value) ** 2)
    upper = d + math.sqrt((b.hi - b.value) ** 2 + (a.value - a.lo) ** 2)
    return lower, upper


# --------------------------------------------------------------------------------------------
# reading an output


def output_kind(path: Path) -> str:
    """``diff``, ``billing`` or ``batch``: what ``path`` (a folder, or its ``summary.json``/``summary.parquet``) holds."""
    folder = path.parent if path.is_file() else path
    if (folder / "billing_records.parquet").exists():
        return "billing"
    if (folder / "summary.parquet").exists() and (folder / "batch.json").exists():
        return "batch"
    if (folder / "summary.json").exists() or (folder / "records.parquet").exists():
        summary = folder / "summary.json"
        if summary.exists() and json.loads(summary.read_text()).get("evidence") == "billing-only":
            return "billing"
        return "diff"
    raise ValueError(f"{path}: not a diff, report, billing or batch output (no summary.json, records.parquet, "
                     "billing_records.parquet or summary.parquet there)")


def read_output(path: str | Path) -> tuple[str, str, dict[str, Estimate]]:
    """``(kind, data kind, {figure: Estimate})`` of one output (see the module docstring)."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no such file or folder")
    kind = output_kind(path)
    folder = path.parent if path.is_file() else path
    if kind == "batch":
        return kind, "see each run", batch_figures(pd.read_parquet(folder / "summary.parquet"))
    summary = _diff_summary(folder) if kind == "diff" else json.loads((folder / "summary.json").read_text())
    figures = diff_figures(summary) if kind == "diff" else billing_figures(summary)
    return kind, str(summary.get("data", "unstated")), figures


def _diff_summary(folder: Path) -> dict[str, Any]:
    """A report folder's ``summary.json``, or the summary of a ``kimi-eagle diff`` folder (as the report counts it)."""
    if (folder / "summary.json").exists():
        return json.loads((folder / "summary.json").read_text())
    from kimi_eagle.diff.run import read_diff
    from kimi_eagle.diff.summary import data_kind, screen_diff, summarize_diff

    result, _ = screen_diff(read_diff(folder))
    return {**summarize_diff(result), "data": data_kind(result.records)}


def diff_figures(summary: dict[str, Any]) -> dict[str, Estimate]:
    """A diff's figures: verdict shares of the counted (ok) records, per-dataset rates, counts."""
    counted = int(summary["status"].get("ok", 0))
    figures: dict[str, Estimate | None] = {"records": Estimate(summary["n_records"]),
                                           "hunks": Estimate(summary.get("n_hunks", 0))}
    for verdict, k in summary["verdict"].items():
        figures[f"share {verdict} (of counted records)"] = Estimate.share(k, counted)
    for row in summary.get("rates", []):
        for rate in ("mismatch", "semantic"):
            figures[f"{rate} rate · {row['dataset']}"] = Estimate.share(row[rate], row["n"])
    return {k: v for k, v in figures.items() if v is not None}


def billing_figures(summary: dict[str, Any]) -> dict[str, Estimate]:
    """A billing output's figures: verdict-class shares, and per provider and dataset the gaps and unexplained rate."""
    n = int(summary["n_records"])
    figures: dict[str, Estimate | None] = {"records": Estimate(n)}
    for verdict, k in summary["verdict_class"].items():
        figures[f"share {verdict}"] = Estimate.share(k, n)
    groups = [("provider", g) for g in summary.get("by_provider", [])] + [("dataset", g) for g in summary.get("by_dataset", [])]
    for by, g in groups:
        where = "all records" if g[by] == "all" else f"{by} {g[by]}"
        for gap in ("gap_pct", "unexplained_gap_pct"):
            if g.get(gap) is not None:
                figures[f"billing {gap.replace('_pct', '').replace('_', ' ')} % · {where}"] = Estimate(
                    g[gap], g.get(f"{gap}_lo"), g.get(f"{gap}_hi"))
        figures[f"unexplained rate · {where}"] = Estimate.share(g.get("unexplained", 0), g.get("rated", 0))
    return {k: v for k, v in figures.items() if v is not None}


BATCH_FIGURES = {"metric.mismatch_rate": "mismatch rate", "metric.billing_gap_pct": "billing gap %",
                 "metric.billing_unexplained_rate": "billing unexplained rate"}


def batch_figures(table: pd.DataFrame) -> dict[str, Estimate]:
    """A batch's figures: per finished run, the rates it reported with their intervals, and its record count."""
    figures: dict[str, Estimate] = {}
    for row in table[table["status"] == "ok"].to_dict("records"):
        run = row["run"]
        if _number(row.get("metric.n_records")) is not None:
            figures[f"records · {run}"] = Estimate(row["metric.n_records"])
        for column, name in BATCH_FIGURES.items():
            value = _number(row.get(column))
            if value is not None:
                figures[f"{name} · {run}"] = Estimate(value, _number(row.get(f"{column}_ci.0")),
                                                      _number(row.get(f"{column}_ci.1")))
    return figures


def _number(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


# --------------------------------------------------------------------------------------------
# the comparison


def compare_table(a: dict[str, Estimate], b: dict[str, Estimate]) -> pd.DataFrame:
    """One row per figure (A's order, then B's new ones): both values and intervals, the change B − A, its
    interval and whether the interval excludes 0 (``changed``: yes / no / None without an interval)."""
    rows = []
    for name in [*a, *(k for k in b if k not in a)]:
        ea, eb = a.get(name), b.get(name)
        change = eb.value - ea.value if ea is not None and eb is not None else None
        interval = mover(ea, eb) if change is not None else None
        rows.append({
            "figure": name, "A": _shown(ea), "A 95% CI": _interval(ea), "B": _shown(eb), "B 95% CI": _interval(eb),
            "change (B − A)": None if change is None else _signed(change),
            "change 95% CI": None if interval is None else f"[{interval[0]:.4f}, {interval[1]:.4f}]",
            "changed": None if interval is None else ("yes" if interval[0] > 0 or interval[1] < 0 else "no"),
            "note": None if change is not None else ("only in A" if eb is None else "only in B"),
        })
    return pd.DataFrame(rows)


def _signed(change: float) -> str:
    """A change with its sign: ``+30``, ``-0.04``, ``0``."""
    text = f"{change:+.4f}".rstrip("0").rstrip(".")
    return "0" if float(text) == 0 else text


def _shown(e: Estimate | None) -> str | None:
    if e is None:
        return None
    text = f"{e.value:.4f}".rstrip("0").rstrip(".") if e.value != int(e.value) else f"{int(e.value)}"
    return f"{text} ({e.counts})" if e.counts else text


def _interval(e: Estimate | None) -> str | None:
    return None if e is None or e.lo is None or e.hi is None else f"[{e.lo:.4f}, {e.hi:.4f}]"


def markdown_table(df: pd.DataFrame) -> str:
    """``df`` as a GitHub Markdown table (missing values as ``–``; ``|`` escaped)."""
    def cell(v: Any) -> str:
        return "–" if v is None or (isinstance(v, float) and math.isnan(v)) or v == "" else str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False, name=None)]
    return "\n".join(lines) + "\n"


def write_compare(run_a: str | Path, run_b: str | Path, out: str | Path) -> dict[str, Any]:
    """Compare two outputs of one kind into ``out`` (``compare.html``, ``compare.md``, ``compare.csv``); returns the
    facts (kinds, data kinds, rows, changed figures, paths). Outputs of different kinds are refused (ValueError)."""
    (kind_a, data_a, a), (kind_b, data_b, b) = read_output(run_a), read_output(run_b)
    if kind_a != kind_b:
        raise ValueError(f"cannot compare a {kind_a} output ({run_a}) with a {kind_b} output ({run_b}): give two of one kind")
    table = compare_table(a, b)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    facts = {"kind": kind_a, "a": str(run_a), "b": str(run_b), "data": {"A": data_a, "B": data_b},
             "figures": len(table), "changed": table.loc[table["changed"] == "yes", "figure"].tolist(), "sign": SIGN}
    table.to_csv(out / "compare.csv", index=False)
    (out / "compare.md").write_text(_markdown(facts, table))
    (out / "compare.html").write_text(_page(facts, table))
    return {**facts, "paths": [str(out / f"compare.{ext}") for ext in ("html", "md", "csv")]}


def _headline(facts: dict[str, Any]) -> str:
    changed = facts["changed"]
    return (f"{len(changed)} of {facts['figures']} figures changed (95 % interval of B − A excludes 0)"
            + (f": {', '.join(changed[:8])}{' …' if len(changed) > 8 else ''}" if changed else ""))


def _markdown(facts: dict[str, Any], table: pd.DataFrame) -> str:
    data = facts["data"]
    return (f"# Compare two {facts['kind']} outputs\n\nA: `{facts['a']}` ({data['A']} data)  \n"
            f"B: `{facts['b']}` ({data['B']} data)\n\n{_headline(facts)}.\n\n{SIGN}.\n\n{markdown_table(table)}")


def _page(facts: dict[str, Any], table: pd.DataFrame) -> str:
    from kimi_eagle.apps.reports.toolkit import finding, html_page, html_table

    data = facts["data"]
    warn = ("" if data["A"] == data["B"] else
            f"<p class='left-out'>⚠ the runs hold different kinds of data (A {html.escape(data['A'])}, "
            f"B {html.escape(data['B'])}): a change between them is not a change of one quantity</p>")
    body = [f"<h1>Compare two {html.escape(facts['kind'])} outputs</h1>",
            f"<p class='data'>A: <code>{html.escape(facts['a'])}</code> ({html.escape(data['A'])} data)<br>"
            f"B: <code>{html.escape(facts['b'])}</code> ({html.escape(data['B'])} data)</p>", warn,
            finding(html.escape(_headline(facts))), f"<p class='sign'>{html.escape(SIGN)}.</p>",
            html_table(table, float_format="{:.4f}"),
            "<p class='sign'>The same table: compare.md (Markdown) and compare.csv beside this page.</p>"]
    return html_page(f"compare: {facts['a']} vs {facts['b']}", body, "report")
