"""The ``metrics.json`` of a diff run (notebook 02): billing evidence always, the engine diff when it ran.

Each stage's measures come from one function and are joined with :func:`~kimi_eagle.io.disjoint_union`,
so a measure can never silently overwrite another of the same name.
"""
from __future__ import annotations

from typing import Any

import pandas as pd

from kimi_eagle.diff.run import DiffResult
from kimi_eagle.io import disjoint_union


def billing_metrics(data: str, billing: dict[str, Any], evidence: str) -> dict[str, Any]:
    """What the data was, the evidence used, and the billing-only validation of every record.

    ``billing``: the summary of the billing report (``n_records``, ``verdict_class``, ``all``).
    """
    bill = billing["all"]
    return disjoint_union(
        {"data": data, "evidence": evidence, "n_records": billing["n_records"]},
        {f"billing_{k}": v for k, v in billing["verdict_class"].items()},
        {"billing_gap_pct": bill["gap_pct"], "billing_gap_pct_ci": [bill["gap_pct_lo"], bill["gap_pct_hi"]],
         "billing_unexplained_rate": bill["unexplained_rate"],
         "billing_unexplained_rate_ci": [bill["unexplained_lo"], bill["unexplained_hi"]]},
    )


def engine_metrics(report: dict[str, Any], result: DiffResult) -> dict[str, Any]:
    """The engine diff by bytes: status and verdict counts, hunks, the mismatch rate with its Wilson 95%
    interval (drawn as error bars by ``kimi-eagle batch``) and, with labels, the worst precision and recall.

    ``report``: the diff report's summary (``status``, ``verdict``, ``rates``, ``precision_recall``?).
    """
    ok = result.records[result.records.status == "ok"]
    out: dict[str, Any] = {"status": report["status"], "verdict": report["verdict"], "n_hunks": int(len(result.hunks)),
                           "mismatch_rate": float((ok.verdict != "exact").mean()) if len(ok) else None}
    all_rates = next((r for r in report["rates"] if r["dataset"] == "all"), None)
    if all_rates is not None:
        out["mismatch_rate_ci"] = [all_rates["mismatch_lo"], all_rates["mismatch_hi"]]
    if "precision_recall" in report:
        pr = pd.DataFrame(report["precision_recall"])
        out["min_precision"], out["min_recall"] = float(pr.precision.min()), float(pr.recall.min())
    return out


def diff_metrics(data: str, billing: dict[str, Any], report: dict[str, Any] | None = None,
                 result: DiffResult | None = None) -> dict[str, Any]:
    """``metrics.json`` of a diff run: :func:`billing_metrics`, then :func:`engine_metrics` when the engine
    diff ran (``report`` and ``result`` given). ValueError if two stages write the same key."""
    engine = report is not None and result is not None
    return disjoint_union(billing_metrics(data, billing, "engine" if engine else "billing-only"),
                          engine_metrics(report, result) if engine else {})
