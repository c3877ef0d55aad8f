"""What the report commands write besides their pages: whose report a folder holds, chart files, summary tables.

Which command's report a folder holds, so that no command replaces another's ``report.html``/``summary.json``:

``kimi-eagle report`` and ``kimi-eagle billing`` both write ``report.html``, ``summary.json`` and charts into their
``-o`` folder; each refuses a folder that already holds the other's (one line, exit 2, nothing written). The
folders are told apart by the files only one of them writes: billing's ``billing_records.parquet``; a report's
``summary.json`` without it.

Chart files (:func:`write_chart`): PNG, plus ``--figure-format svg|pdf`` beside it, at ``--dpi``. Summary tables
(:func:`write_summary_tables`): ``summary.md`` and ``summary.csv`` beside every ``summary.json``; a confusion matrix
is a table of its own (a row per expected class); user text is escaped for Markdown and neutralised for spreadsheets
(:mod:`kimi_eagle.apps.reports.safe_text`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kimi_eagle.apps.reports.safe_text import csv_row, md_cell, md_text

REPORT_COMMANDS = ("report", "billing")


def report_owner(out_dir: str | Path) -> str | None:
    """``"billing"``, ``"report"`` or None: whose report ``out_dir`` holds."""
    d = Path(out_dir)
    if (d / "billing_records.parquet").exists():
        return "billing"
    if (d / "summary.json").exists() and (d / "report.html").exists():
        return "report"
    return None


def refuse_other_report(out_dir: str | Path, command: str) -> None:
    """ValueError when ``out_dir`` holds the report of the other of :data:`REPORT_COMMANDS` than ``command``."""
    if command not in REPORT_COMMANDS:
        raise ValueError(f"unknown report command {command!r}")
    owner = report_owner(out_dir)
    if owner is not None and owner != command:
        raise ValueError(f"{out_dir} holds the output of `kimi-eagle {owner}` (its report.html and summary.json); "
                         f"give `kimi-eagle {command}` another -o folder")


# --------------------------------------------------------------------------------------------
# chart files: every chart is written as a PNG (the pages embed it) and, with --figure-format svg|pdf, also in
# that format beside it; --dpi sets the resolution of every chart. Both travel in the environment, so that the
# notebooks a batch or the demo runs (their own kernels) write their charts the same way.

FIGURE_FORMATS = ("png", "svg", "pdf")
FORMAT_ENV, DPI_ENV = "KIMI_EAGLE_FIGURE_FORMAT", "KIMI_EAGLE_FIGURE_DPI"


def figure_settings() -> tuple[str, int | None]:
    """``(format, dpi)`` from the environment (``("png", None)`` when unset: each chart's own dpi)."""
    import os

    fmt = os.environ.get(FORMAT_ENV, "png").strip().lower() or "png"
    if fmt not in FIGURE_FORMATS:
        raise ValueError(f"{FORMAT_ENV}={fmt!r}: the figure format must be one of {', '.join(FIGURE_FORMATS)}")
    dpi = os.environ.get(DPI_ENV, "").strip()
    if dpi and not (dpi.isdigit() and 20 <= int(dpi) <= 1200):
        raise ValueError(f"{DPI_ENV}={dpi!r}: the dpi must be a whole number from 20 to 1200")
    return fmt, int(dpi) if dpi else None


def add_figure_options(p) -> None:
    """``--figure-format png|svg|pdf`` and ``--dpi N`` on a command that writes charts."""
    from kimi_eagle.apps.cli import Number

    p.add_argument("--figure-format", choices=FIGURE_FORMATS, default=None,
                   help="also write every chart in this format beside its PNG (the pages embed the PNG; "
                        "default: PNG only)")
    p.add_argument("--dpi", type=Number(int, 20, 1200), default=None,
                   help="resolution of every chart in dots per inch, 20..1200 (default: each chart's own, 110 or 120)")


def use_figure_options(args) -> None:
    """Apply a command's ``--figure-format``/``--dpi`` to every chart it (or a notebook it runs) writes."""
    import os

    if getattr(args, "figure_format", None):
        os.environ[FORMAT_ENV] = args.figure_format
    if getattr(args, "dpi", None):
        os.environ[DPI_ENV] = str(args.dpi)


def chart_files(path: str | Path, dpi: int = 110) -> list[tuple[Path, int]]:
    """The files one chart is written to, each with its dpi: ``path`` (PNG) and, with ``--figure-format svg|pdf``,
    the same name in that format; ``dpi`` unless ``--dpi`` says otherwise."""
    fmt, chosen = figure_settings()
    path = Path(path)
    files = [(path, chosen or dpi)]
    if fmt != "png" and path.suffix.lower() == ".png":
        files.append((path.with_suffix(f".{fmt}"), chosen or dpi))
    return files


def write_chart(fig, path: str | Path, dpi: int = 110) -> Path:
    """Write ``fig`` to every one of :func:`chart_files` (atomically); returns ``path``."""
    from kimi_eagle.io import write_figure

    for target, at in chart_files(path, dpi):
        write_figure(fig, target, dpi=at)
    return Path(path)


# --------------------------------------------------------------------------------------------
# summary.md and summary.csv beside every summary.json: the same numbers, to paste into a review (Markdown) or a
# spreadsheet (CSV, one line per number: section, row, field, value)


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as dotted keys; a list of plain values as one comma-separated text; anything else as is."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(value, list) and not any(isinstance(v, (dict, list)) for v in value):
        return {prefix: ", ".join(str(v) for v in value)}
    if isinstance(value, list):
        return {prefix: json.dumps(value, default=str)}
    return {prefix: value}


def summary_sections(summary: dict[str, Any]) -> list[tuple[str, list[tuple[str, dict[str, Any]]]]]:
    """``[(section, [(row, {field: value})])]``: the top-level plain values as section ``summary`` (one row), each
    dict as its own section (one row, dotted fields), each list of records as a section of one row per record
    (named by its first text field, else its position)."""
    top = {k: v for k, v in summary.items() if not isinstance(v, (dict, list)) or
           (isinstance(v, list) and not any(isinstance(x, (dict, list)) for x in v))}
    sections = [("summary", [("", _flat(top))])] if top else []
    for key, value in summary.items():
        if matrix := _matrix_rows(value):
            sections.append((key, matrix))
        elif isinstance(value, dict) and value:
            sections.append((key, [("", _flat(value))]))
        elif isinstance(value, list) and value and all(isinstance(r, dict) for r in value):
            rows = []
            for i, record in enumerate(value):
                name = next((str(v) for v in record.values() if isinstance(v, str)), str(i))
                rows.append((name, _flat(record)))
            sections.append((key, rows))
    return sections


def _matrix_rows(value: Any) -> list[tuple[str, dict[str, Any]]] | None:
    """A confusion matrix (``{"classes": [...], "matrix": [[...]]}``) as one row per expected class, one field per
    class it was given (its first field ``expected`` names the row); None for anything else."""
    if not isinstance(value, dict) or set(value) != {"classes", "matrix"}:
        return None
    classes, matrix = value["classes"], value["matrix"]
    if not (isinstance(classes, list) and isinstance(matrix, list) and len(matrix) == len(classes)
            and all(isinstance(r, list) and len(r) == len(classes) for r in matrix)):
        return None
    return [(str(c), {"expected": str(c), **{str(col): n for col, n in zip(classes, row)}})
            for c, row in zip(classes, matrix)]


def _md_value(v: Any) -> str:
    if isinstance(v, float) and v == v:
        v = v + 0.0  # -0.0 is written 0
        return f"{v:.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    return md_cell(v)


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    """A GitHub Markdown table (missing values as ``–``, user text escaped (:func:`~kimi_eagle.apps.reports.
    safe_text.md_cell`), floats to 4 significant digits)."""
    lines = ["| " + " | ".join(md_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_md_value(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_summary_tables(summary: dict[str, Any], json_path: str | Path) -> tuple[Path, Path]:
    """``summary.md`` and ``summary.csv`` beside ``json_path`` (``X.summary.json`` gets ``X.summary.md``/``.csv``)
    holding every number of ``summary`` (:func:`summary_sections`); returns their paths."""
    import csv
    import io

    from kimi_eagle.io import write_text

    json_path = Path(json_path)
    stem = json_path.name[: -len(".json")] if json_path.name.endswith(".json") else json_path.name
    sections = summary_sections(summary)
    md = [f"# {md_text(stem)} ({md_text(json_path.name)})\n"]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["section", "row", "field", "value"])
    for section, rows in sections:
        fields = list(dict.fromkeys(f for _, r in rows for f in r))
        if len(rows) == 1 and rows[0][0] == "":
            body = markdown_table(["field", "value"], [[f, rows[0][1].get(f)] for f in fields])
        else:
            body = markdown_table(fields, [[r.get(f) for f in fields] for _, r in rows])
        md.append(f"## {md_text(section)}\n\n{body}")
        for name, r in rows:
            for field, value in r.items():
                value = value + 0.0 if isinstance(value, float) else value  # -0.0 is written 0.0
                writer.writerow(csv_row([section, name, field, "" if value is None else value]))
    return (write_text(json_path.with_name(stem + ".md"), "\n".join(md)),
            write_text(json_path.with_name(stem + ".csv"), buffer.getvalue()))
