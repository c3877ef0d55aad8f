"""Periods of a provider's answers: the month of ``response.created`` and the table's period ranges.

>>> period_of({"response": {"created": 1758707349}})
'2025-09'
>>> period_of({"response": {}})
'undated'
>>> in_period("2026-01", "2025-10..2026-03"), in_period("2025-09", "2025-10..2026-03"), in_period("2025-09", "all")
(True, False, True)
"""
from __future__ import annotations

from datetime import datetime, timezone

MONTH_FMT = "%Y-%m"


def period_of(record: dict) -> str:
    """The month (``YYYY-MM``, UTC) of the answer's ``created`` time, ``undated`` without one (months, not days:
    a day split fits noise, e.g. two records of one day)."""
    response = record.get("response") if isinstance(record, dict) else None
    created = response.get("created") if isinstance(response, dict) else None
    if isinstance(created, bool) or not isinstance(created, (int, float)) or not 0 < created < 2**40:
        return "undated"
    return datetime.fromtimestamp(created, tz=timezone.utc).strftime(MONTH_FMT)


def in_period(when: str, period: str) -> bool:
    """Whether a day or month (``YYYY-MM-DD``, ``YYYY-MM``) falls in a table period (``all``, a day or month, or
    ``FIRST..LAST``), compared at the shorter of the two precisions."""
    if period == "all":
        return True
    first, _, last = period.partition("..")
    last = last or first
    n = min(len(when), len(first), len(last))
    return first[:n] <= when[:n] <= last[:n]
