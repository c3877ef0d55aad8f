"""Periods of a provider's answers: the month of ``response.created`` and the table's period ranges.

>>> period_of({"response": {"created": 1758707349}})
'2025-09'
>>> period_of({"response": {}})
'undated'
>>> in_period("2026-01", "2025-10..2026-03"), in_period("2025-09", "2025-10..2026-03"), in_period("2025-09", "all")
(True, False, True)

Deployments: the family of ``response.system_fingerprint`` (a provider behind one name may run several servers):

>>> deployment_of({"response": {"system_fingerprint": "fpv0_ec889fbb"}}), deployment_of({"response": {}})
('fpv0', 'none')
>>> scope("all", "none"), scope("2025-09", "any")
('all, fingerprint none', '2025-09')
"""
from __future__ import annotations

import re
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


FAMILY = re.compile(r"[A-Za-z0-9.-]{1,32}")


def deployment_of(record: dict) -> str:
    """The family of the answer's ``system_fingerprint``: its part before the first ``_`` (``fpv0_ec889fbb`` is
    ``fpv0``), ``none`` when it is missing or empty, ``other`` when it is not a short plain name."""
    response = record.get("response") if isinstance(record, dict) else None
    fingerprint = response.get("system_fingerprint") if isinstance(response, dict) else None
    if not isinstance(fingerprint, str) or not fingerprint:
        return "none"
    family = fingerprint.partition("_")[0]
    return family if FAMILY.fullmatch(family) and family not in ("any", "none") else "other"


def scope(period: str, deployment: str = "any") -> str:
    """A table entry's period, and its deployment where it has one (``any``: every fingerprint)."""
    return period if deployment == "any" else f"{period}, fingerprint {deployment}"
