"""The ``metrics.json`` of a reconstruction run over several datasets (notebook 01b).

Rows are the reconstructed rows of every dataset in one table with a ``source`` column (the dataset
name), as :func:`~kimi_eagle.reconstruct.job.read_rows` reads them.
"""
from __future__ import annotations

from typing import Any, Sequence

import pandas as pd

from kimi_eagle.chat.completion import CompletionOptions
from kimi_eagle.data_kinds import REAL
from kimi_eagle.io import disjoint_union
from kimi_eagle.reconstruct.record import convention_flags


def dataset_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per dataset (index ``source``): records, ok, errors, prompt and completion tokens."""
    return rows.groupby("source").agg(
        records=("id", "size"), ok=("status", lambda s: int((s == "ok").sum())),
        errors=("status", lambda s: int((s == "error").sum())),
        prompt_tokens=("n_prompt_tokens", "sum"), completion_tokens=("n_completion_tokens", "sum"))


def rows_per_flag(rows: pd.DataFrame, datasets: Sequence[str], flags: Sequence[str]) -> dict[str, dict[str, int]]:
    """``{dataset: {flag: ok rows carrying it}}`` for every dataset and flag named."""
    ok_rows = rows[rows.status == "ok"]
    return {name: {flag: int(sum(flag in list(f) for f in ok_rows[ok_rows.source == name]["flags"])) for flag in flags}
            for name in datasets}


def reconstruct_metrics(rows: pd.DataFrame, timings: dict[str, float], format_name: str, tool_declaration: str,
                        limit: int | None, options: CompletionOptions) -> dict[str, Any]:
    """The run's settings, row counts per dataset and overall, the rows each convention flag
    (:func:`~kimi_eagle.reconstruct.record.convention_flags`) marks, and the completion tokens per second.

    ``timings``: seconds each dataset's reconstruction took, keyed by dataset in run order. ``data`` is ``real``:
    the bundled datasets are real conversations, reconstructed with the real Kimi tokenizer and template.
    """
    summary = dataset_summary(rows)
    return disjoint_union(
        {"data": REAL, "format": format_name, "tool_declaration": tool_declaration, "limit": limit},
        {"datasets": {name: {k: int(v) for k, v in summary.loc[name].items()} for name in summary.index},
         "records": int(len(rows)), "ok": int((rows.status == "ok").sum()), "errors": int((rows.status == "error").sum())},
        {"tool_ids": options.tool_id_policy, "omit_think_end_before_tools": options.omit_think_end_before_tools},
        {"rows_per_flag": rows_per_flag(rows, list(timings), convention_flags(options.tool_id_policy)),
         "completion_tokens_per_s": {name: float(summary.loc[name, "completion_tokens"] / seconds)
                                     for name, seconds in timings.items()}},
    )
