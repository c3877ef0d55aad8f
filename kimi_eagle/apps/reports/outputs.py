"""Which command's report a folder holds, so that no command replaces another's ``report.html``/``summary.json``.

``kimi-eagle report`` and ``kimi-eagle billing`` both write ``report.html``, ``summary.json`` and charts into their
``-o`` folder; each refuses a folder that already holds the other's (one line, exit 2, nothing written). The
folders are told apart by the files only one of them writes: billing's ``billing_records.parquet``; a report's
``summary.json`` without it.
"""
from __future__ import annotations

from pathlib import Path

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
