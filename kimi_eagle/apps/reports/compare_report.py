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
The page (``compare.html``), ``compare.md`` and ``compare.csv`` hold the same table and the same warnings (runs of
different data kinds, an interval that does not hold its value, two batch runs of one name, a run with other
parameters in B). Batch runs are matched by name when it is unique, else by name and parameters' digest. A summary
that is not one the kit writes (a list, a missing key, a negative count, NaN or Infinity) is refused in one line
naming the run and the file.
"""
from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from kimi_eagle.apps.reports.safe_text import csv_row, md_cell, md_text
from kimi_eagle.diff.summary import wilson
from kimi_eagle.io import write_text

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


MAX_SUMMARY_BYTES = 64 << 20  # a summary.json or meta.json larger than this is not one the kit wrote


class CompareInputError(ValueError):
    """One line naming the run (A or B), the file and what is wrong with it."""


def read_json_file(path: Path, run: str) -> Any:
    """A JSON file of run ``run`` (``"A"``/``"B"``), bounded in size; NaN and Infinity are refused (a summary the kit
    wrote holds neither). CompareInputError naming the run and file otherwise."""
    where = f"run {run}: {path}"
    if not path.is_file():
        raise CompareInputError(f"{where}: not a regular file")
    if path.stat().st_size > MAX_SUMMARY_BYTES:
        raise CompareInputError(f"{where}: {path.stat().st_size:,} bytes, more than any summary the kit writes")

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not a number JSON can hold")

    try:
        return json.loads(path.read_text(encoding="utf-8"), parse_constant=refuse)
    except UnicodeDecodeError as e:
        raise CompareInputError(f"{where}: not UTF-8 text (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise CompareInputError(f"{where}: not valid JSON (line {e.lineno} column {e.colno}: {e.msg})") from None
    except (ValueError, RecursionError) as e:
        raise CompareInputError(f"{where}: not valid JSON ({str(e)[:200]})") from None


def read_summary(folder: Path, run: str) -> dict[str, Any]:
    """``folder/summary.json`` as an object (CompareInputError naming run and file when it is not one)."""
    summary = read_json_file(folder / "summary.json", run)
    if not isinstance(summary, dict):
        raise CompareInputError(f"run {run}: {folder / 'summary.json'}: a JSON {type(summary).__name__}, not the "
                                "object `kimi-eagle report`/`billing` writes")
    return summary


def output_kind(path: Path, run: str = "A") -> str:
    """``diff``, ``billing`` or ``batch``: what ``path`` (a folder, or its ``summary.json``/``summary.parquet``) holds."""
    folder = path.parent if path.is_file() else path
    if (folder / "billing_records.parquet").exists():
        return "billing"
    if (folder / "summary.parquet").exists() and (folder / "batch.json").exists():
        return "batch"
    if (folder / "summary.json").exists() or (folder / "records.parquet").exists():
        if (folder / "summary.json").exists() and read_summary(folder, run).get("evidence") == "billing-only":
            return "billing"
        return "diff"
    raise ValueError(f"{path}: not a diff, report, billing or batch output (no summary.json, records.parquet, "
                     "billing_records.parquet or summary.parquet there)")


@dataclass
class Output:
    """One run's output as read: its kind, data kind, figures and what a reader must be warned about."""

    kind: str
    data: str
    figures: dict[str, Estimate]
    warnings: list[str]
    keys: dict[str, str] | None = None  # batch: figure -> the run's stable key (its parameters)


def read_output(path: str | Path, run: str = "A") -> Output:
    """One output (see the module docstring); CompareInputError naming the run and file for a summary that is not
    one the kit writes (a list, a missing key, a negative count, Infinity)."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no such file or folder")
    kind = output_kind(path, run)
    folder = path.parent if path.is_file() else path
    warnings: list[str] = []
    if kind == "batch":
        figures, data, keys = batch_figures(_batch_table(folder, run), run, warnings)
        return Output(kind, data, checked(figures, run, warnings), warnings, keys)
    summary = _diff_summary(folder, run) if kind == "diff" else read_summary(folder, run)
    where = f"run {run}: {folder / 'summary.json'}"
    try:
        figures = diff_figures(summary) if kind == "diff" else billing_figures(summary)
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
        why = f"lacks the key {e}" if isinstance(e, KeyError) else str(e) if isinstance(e, ValueError) else (
            f"holds a value of the wrong type ({type(e).__name__}: {str(e)[:160]})")
        raise CompareInputError(f"{where}: not a summary the kit writes: it {why}") from None
    return Output(kind, str(summary.get("data", "unstated")), checked(figures, run, warnings), warnings)


def _batch_table(folder: Path, run: str) -> pd.DataFrame:
    try:
        table = pd.read_parquet(folder / "summary.parquet")
    except Exception as e:  # noqa: BLE001 — any unreadable parquet is this run's file, named
        raise CompareInputError(f"run {run}: {folder / 'summary.parquet'}: not readable ({type(e).__name__})") from None
    missing = [c for c in ("run", "status") if c not in table.columns]
    if missing:
        raise CompareInputError(f"run {run}: {folder / 'summary.parquet'}: lacks the column(s) {', '.join(missing)}")
    return table


def _diff_summary(folder: Path, run: str = "A") -> dict[str, Any]:
    """A report folder's ``summary.json``, or the summary of a ``kimi-eagle diff`` folder (as the report counts it),
    with its data kind from its provenance (:func:`~kimi_eagle.diff.summary.diff_data_kind`)."""
    if (folder / "summary.json").exists():
        return read_summary(folder, run)
    from kimi_eagle.diff.run import read_diff
    from kimi_eagle.diff.summary import diff_data_kind, screen_diff, summarize_diff

    meta = read_json_file(folder / "meta.json", run) if (folder / "meta.json").is_file() else {}
    records = read_diff(folder)
    result, _ = screen_diff(records)
    return {**summarize_diff(result), "data": diff_data_kind(records.records, meta if isinstance(meta, dict) else {})[0]}


def count(value: Any, name: str) -> int:
    """``value`` as a count: a whole number from 0 to 10**15 (ValueError naming ``name`` otherwise)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value != int(value) or not 0 <= value <= 10**15:
        raise ValueError(f"holds {name} = {str(value)[:40]!r}, not a count (a whole number from 0)")
    return int(value)


def share(k: Any, n: Any, name: str) -> Estimate | None:
    """``k`` of ``n`` as a share (:meth:`Estimate.share`); ValueError when either is not a count or ``k > n``."""
    k, n = count(k, f"{name} (count)"), count(n, f"{name} (of)")
    if k > n:
        raise ValueError(f"holds {name} = {k} of {n}: more than all")
    return Estimate.share(k, n)


def diff_figures(summary: dict[str, Any]) -> dict[str, Estimate]:
    """A diff's figures: verdict shares of the counted (ok) records, per-dataset rates, counts."""
    counted = count(summary["status"].get("ok", 0), "status.ok")
    figures: dict[str, Estimate | None] = {"records": Estimate(count(summary["n_records"], "n_records")),
                                           "hunks": Estimate(count(summary.get("n_hunks", 0), "n_hunks"))}
    for verdict, k in summary["verdict"].items():
        figures[f"share {verdict} (of counted records)"] = share(k, counted, f"verdict.{verdict}")
    for row in summary.get("rates", []):
        for rate in ("mismatch", "semantic"):
            figures[f"{rate} rate · {row['dataset']}"] = share(row[rate], row["n"], f"rates.{rate}")
    return {k: v for k, v in figures.items() if v is not None}


def billing_figures(summary: dict[str, Any]) -> dict[str, Estimate]:
    """A billing output's figures: verdict-class shares, and per provider and dataset the gaps and unexplained rate."""
    n = count(summary["n_records"], "n_records")
    figures: dict[str, Estimate | None] = {"records": Estimate(n)}
    if not isinstance(summary["verdict_class"], dict):
        raise ValueError(f"holds verdict_class = {str(summary['verdict_class'])[:40]!r}, not an object of counts")
    for verdict, k in summary["verdict_class"].items():
        figures[f"share {verdict}"] = share(k, n, f"verdict_class.{verdict}")
    groups = [("provider", g) for g in _groups(summary, "by_provider")] + [("dataset", g) for g in _groups(summary, "by_dataset")]
    for by, g in groups:
        where = "all records" if g[by] == "all" else f"{by} {g[by]}"
        for gap in ("gap_pct", "unexplained_gap_pct"):
            if g.get(gap) is not None:
                name = f"by_{by}[{g[by]!r}].{gap}"
                figures[f"billing {gap.replace('_pct', '').replace('_', ' ')} % · {where}"] = Estimate(
                    _real(g[gap], name), _bound(g.get(f"{gap}_lo"), f"{name}_lo"), _bound(g.get(f"{gap}_hi"), f"{name}_hi"))
        figures[f"unexplained rate · {where}"] = share(g.get("unexplained", 0), g.get("rated", 0),
                                                       f"by_{by}.unexplained")
    return {k: v for k, v in figures.items() if v is not None}


def _groups(summary: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """``summary[key]`` (``by_provider``/``by_dataset``): a list of objects, else a ValueError naming the field."""
    groups = summary.get(key, [])
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        raise ValueError(f"holds {key} = {str(groups)[:40]!r}, not a list of objects")
    return groups


def _real(v: Any, name: str) -> float:
    """``v`` as a number (an int or float, finite), else a ValueError naming the field ``name`` (issue 48: a string
    was converted, or ended in a message naming no field)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"holds {name} = {str(v)[:40]!r}, not a finite number")
    return float(v)


def _bound(v: Any, name: str = "an interval bound") -> float | None:
    return None if v is None else _real(v, name)


def checked(figures: dict[str, Estimate], run: str, warnings: list[str]) -> dict[str, Estimate]:
    """``figures`` with every value finite (CompareInputError otherwise) and every interval holding its value
    (``lo ≤ value ≤ hi``): an interval that does not is dropped, and ``warnings`` say so."""
    out = {}
    for name, e in figures.items():
        if not math.isfinite(e.value):
            raise CompareInputError(f"run {run}: the figure {name!r} is {e.value}, not a finite number")
        if e.lo is not None or e.hi is not None:
            lo, hi = e.lo, e.hi
            if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)) or not lo <= e.value <= hi:
                warnings.append(f"run {run}: the interval [{lo}, {hi}] of {name!r} does not hold its value "
                                f"{e.value}; it is left out (no change interval for this figure)")
                e = Estimate(e.value, None, None, e.counts)
        out[name] = e
    return out


BATCH_FIGURES = {"metric.mismatch_rate": "mismatch rate", "metric.billing_gap_pct": "billing gap %",
                 "metric.billing_unexplained_rate": "billing unexplained rate"}


def batch_figures(table: pd.DataFrame, run: str = "A", warnings: list[str] | None = None
                  ) -> tuple[dict[str, Estimate], str, dict[str, str]]:
    """A batch's figures: per finished run, the rates it reported with their intervals, and its record count;
    with the data kinds of its runs and each figure's run key. A run is keyed by its name when that is unique
    in the batch, else by its name and parameters (``r1 #3fa2c1``), and ``warnings`` say so: two runs of one
    name are never merged into one row."""
    warnings = [] if warnings is None else warnings
    figures: dict[str, Estimate] = {}
    keys: dict[str, str] = {}
    finished = table[table["status"] == "ok"].to_dict("records")
    names = pd.Series([str(r["run"]) for r in finished]).value_counts()
    for name in names[names > 1].index:
        warnings.append(f"run {run}: the batch holds {names[name]} finished runs named {name!r}; each is shown "
                        "with its parameters' digest (name #digest), never merged")
    for row in finished:
        key = str(row["run"]) if names[str(row["run"])] == 1 else f"{row['run']} #{_params_digest(row)}"
        params = _params_digest(row)
        if _number(row.get("metric.n_records")) is not None:
            figures[f"records · {key}"] = Estimate(_number(row["metric.n_records"]))
            keys[f"records · {key}"] = params
        for column, name in BATCH_FIGURES.items():
            value = _number(row.get(column))
            if value is None and not _missing(row.get(column)):  # issue 48: left out, and said
                warnings.append(f"run {run}: batch run {key!r} reports {column} = {str(row.get(column))[:40]!r}, not "
                                "a number; that figure is left out")
            if value is not None:
                figures[f"{name} · {key}"] = Estimate(value, _number(row.get(f"{column}_ci.0")),
                                                      _number(row.get(f"{column}_ci.1")))
                keys[f"{name} · {key}"] = params
    kinds = sorted({str(r["metric.data"]) for r in finished if isinstance(r.get("metric.data"), str)})
    return figures, (", ".join(kinds) + (" (mixed)" if len(kinds) > 1 else "")) if kinds else "unstated", keys


def _params_digest(row: dict[str, Any]) -> str:
    """Six hex digits of the run's parameters (its ``param.*`` columns): the run's stable key beside its name."""
    import hashlib

    params = {k: v for k, v in row.items() if str(k).startswith("param.") and not _missing(v)}
    return hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:6]


def _missing(v: Any) -> bool:
    try:
        return v is None or bool(pd.isna(v))
    except (TypeError, ValueError):
        return False


def _number(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):
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
            "change 95% CI": None if interval is None else f"[{_fixed(interval[0])}, {_fixed(interval[1])}]",
            "changed": None if interval is None else ("yes" if interval[0] > 0 or interval[1] < 0 else "no"),
            "note": None if change is not None else ("only in A" if eb is None else "only in B"),
        })
    return pd.DataFrame(rows, columns=COLUMNS)


COLUMNS = ["figure", "A", "A 95% CI", "B", "B 95% CI", "change (B − A)", "change 95% CI", "changed", "note"]


def _fixed(x: float) -> str:
    """``x`` to 4 decimals, never ``-0.0000``."""
    text = f"{x:.4f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def _signed(change: float) -> str:
    """A change with its sign: ``+30``, ``-0.04``, ``0``."""
    text = f"{change:+.4f}".rstrip("0").rstrip(".")
    return "0" if float(text) == 0 else text


def _shown(e: Estimate | None) -> str | None:
    if e is None:
        return None
    text = _fixed(e.value).rstrip("0").rstrip(".") if e.value != int(e.value) else f"{int(e.value)}"
    return f"{text} ({e.counts})" if e.counts else text


def _interval(e: Estimate | None) -> str | None:
    return None if e is None or e.lo is None or e.hi is None else f"[{_fixed(e.lo)}, {_fixed(e.hi)}]"


def markdown_table(df: pd.DataFrame) -> str:
    """``df`` as a GitHub Markdown table (missing values as ``–``; every cell escaped: ``|``, line breaks, ``<``,
    backticks, control characters (:func:`~kimi_eagle.apps.reports.safe_text.md_cell`))."""
    lines = ["| " + " | ".join(md_cell(c) for c in df.columns) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(md_cell(v) for v in row) + " |" for row in df.itertuples(index=False, name=None)]
    return "\n".join(lines) + "\n"


def compare_warnings(a: Output, b: Output) -> list[str]:
    """What a reader must know before reading a change: the runs' data kinds differ (or one batch mixes kinds),
    a run's figures or intervals were left out, a batch run of one name has other parameters in B than in A."""
    warnings = [*a.warnings, *b.warnings]
    if a.data != b.data:
        warnings.insert(0, f"the runs hold different kinds of data (A {a.data}, B {b.data}): a change between them "
                           "is not a change of one quantity")
    for out, run in ((a, "A"), (b, "B")):
        if out.data.endswith("(mixed)"):
            warnings.append(f"run {run} mixes data kinds ({out.data}): read each run's figures by its own kind")
    if a.keys and b.keys:
        differ = sorted({name.split(" · ", 1)[1] for name in set(a.keys) & set(b.keys) if a.keys[name] != b.keys[name]})
        if differ:
            warnings.append(f"run(s) {', '.join(differ[:8])} have other parameters in B than in A: their changes "
                            "compare two different runs")
    return warnings


def write_compare(run_a: str | Path, run_b: str | Path, out: str | Path) -> dict[str, Any]:
    """Compare two outputs of one kind into ``out`` (``compare.html``, ``compare.md``, ``compare.csv``); returns the
    facts (kinds, data kinds, rows, changed figures, warnings, paths). Outputs of different kinds are refused
    (ValueError); every warning of the page is in the Markdown and CSV too (``⚠ warning`` rows)."""
    a, b = read_output(run_a, "A"), read_output(run_b, "B")
    if a.kind != b.kind:
        raise ValueError(f"cannot compare a {a.kind} output ({run_a}) with a {b.kind} output ({run_b}): give two of one kind")
    table = compare_table(a.figures, b.figures)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    facts = {"kind": a.kind, "a": str(run_a), "b": str(run_b), "data": {"A": a.data, "B": b.data},
             "figures": len(table), "changed": table.loc[table["changed"] == "yes", "figure"].tolist(), "sign": SIGN,
             "warnings": compare_warnings(a, b)}
    write_text(out / "compare.csv", _csv(facts, table))
    write_text(out / "compare.md", _markdown(facts, table))
    write_text(out / "compare.html", _page(facts, table))
    return {**facts, "paths": [str(out / f"compare.{ext}") for ext in ("html", "md", "csv")]}


def _csv(facts: dict[str, Any], table: pd.DataFrame) -> str:
    """The table as CSV, each warning first as a row of its own (``⚠ warning N`` with the text as its note); every
    text cell neutralised for spreadsheets (:func:`~kimi_eagle.apps.reports.safe_text.csv_cell`)."""
    import csv
    import io

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)
    for i, text in enumerate(facts["warnings"], 1):
        writer.writerow(csv_row([f"⚠ warning {i}", *[""] * (len(COLUMNS) - 2), text]))
    for row in table.itertuples(index=False, name=None):
        writer.writerow(csv_row("" if v is None or (isinstance(v, float) and math.isnan(v)) else v for v in row))
    return buffer.getvalue()


def _headline(facts: dict[str, Any]) -> str:
    changed = facts["changed"]
    return (f"{len(changed)} of {facts['figures']} figures changed (95 % interval of B − A excludes 0)"
            + (f": {', '.join(changed[:8])}{' …' if len(changed) > 8 else ''}" if changed else ""))


def _markdown(facts: dict[str, Any], table: pd.DataFrame) -> str:
    data = facts["data"]
    warned = "".join(f"**⚠ {md_text(w)}**\n\n" for w in facts["warnings"])
    return (f"# Compare two {md_text(facts['kind'])} outputs\n\nA: {md_text(facts['a'])} ({md_text(data['A'])} data)  \n"
            f"B: {md_text(facts['b'])} ({md_text(data['B'])} data)\n\n{warned}{md_text(_headline(facts))}.\n\n"
            f"{SIGN}.\n\n{markdown_table(table)}")


def _page(facts: dict[str, Any], table: pd.DataFrame) -> str:
    from kimi_eagle.apps.reports.toolkit import finding, html_page, html_table

    data = facts["data"]
    warn = "".join(f"<p class='left-out'>⚠ {html.escape(w)}</p>" for w in facts["warnings"])
    body = [f"<h1>Compare two {html.escape(facts['kind'])} outputs</h1>",
            f"<p class='data'>A: <code>{html.escape(facts['a'])}</code> ({html.escape(data['A'])} data)<br>"
            f"B: <code>{html.escape(facts['b'])}</code> ({html.escape(data['B'])} data)</p>", warn,
            finding(html.escape(_headline(facts))), f"<p class='sign'>{html.escape(SIGN)}.</p>",
            html_table(table, float_format="{:.4f}"),
            "<p class='sign'>The same table: compare.md (Markdown) and compare.csv beside this page.</p>"]
    return html_page(f"compare: {facts['a']} vs {facts['b']}", body, "report")
