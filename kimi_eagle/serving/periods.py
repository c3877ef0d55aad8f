"""Periods of a provider's answers: the month (or day) of ``response.created`` and the table's period ranges.

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
from datetime import datetime, timedelta, timezone

MONTH_FMT = "%Y-%m"
DAY_FMT = "%Y-%m-%d"


def period_of(record: dict) -> str:
    """The month (``YYYY-MM``, UTC) of the answer's ``created`` time, ``undated`` without one (the unit of the
    table's periods; calibration splits within a month only where a server changed mid-month and the split pays:
    :func:`day_of`, :func:`period_label`)."""
    response = record.get("response") if isinstance(record, dict) else None
    created = response.get("created") if isinstance(response, dict) else None
    if isinstance(created, bool) or not isinstance(created, (int, float)) or not 0 < created < 2**40:
        return "undated"
    return datetime.fromtimestamp(created, tz=timezone.utc).strftime(MONTH_FMT)


def day_of(record: dict) -> str:
    """The day (``YYYY-MM-DD``, UTC) of the answer's ``created`` time, ``undated`` without one: what a record is
    looked up by in a table whose periods may start or end within a month (a server changed mid-month)."""
    month = period_of(record)
    if month == "undated":
        return month
    return datetime.fromtimestamp(record["response"]["created"], tz=timezone.utc).strftime(DAY_FMT)


def _cmp(when: str, bound: str) -> tuple[str, str]:
    n = min(len(when), len(bound))
    return when[:n], bound[:n]


def in_period(when: str, period: str) -> bool:
    """Whether a day or month (``YYYY-MM-DD``, ``YYYY-MM``) falls in a table period (``all``, a day or month, or
    ``FIRST..LAST``, each a day or a month), each bound compared at the shorter of its and ``when``'s precision.

    >>> in_period("2025-10-20", "2025-10..2025-10-12"), in_period("2025-10-05", "2025-10..2025-10-12")
    (False, True)
    """
    if period == "all":
        return True
    first, _, last = period.partition("..")
    last = last or first
    low, high = _cmp(when, first), _cmp(when, last)
    return low[1] <= low[0] and high[0] <= high[1]


def period_end(period: str) -> str:
    """A sort key of a period's last day: the latest period sorts last (a month ends after each of its days).

    >>> sorted(["2025-10-13..2025-12", "2025-10..2025-10-12", "2025-12-04"], key=period_end)
    ['2025-10..2025-10-12', '2025-12-04', '2025-10-13..2025-12']
    """
    if period == "all":
        return ""
    last = period.rpartition("..")[2]
    return last if len(last) > 7 else last + "-32"


def period_label(days: list[str], before: str | None, after: str | None) -> str:
    """The table period of a run of ``days`` (sorted ``YYYY-MM-DD``) between the previous run's last day ``before``
    and the next run's first day ``after`` (None at either end): whole months where the neighbours lie in other
    months (``2025-09``, ``2025-10..2026-03``), else days, the run ending the day before the next one starts, so that
    consecutive periods leave no day out (``2025-10..2025-10-12``, ``2025-10-13..2025-11``).

    >>> period_label(["2025-10-01", "2025-10-02"], "2025-09-20", "2025-10-13")
    '2025-10..2025-10-12'
    >>> period_label(["2025-10-13", "2025-11-12"], "2025-10-02", "2025-12-04")
    '2025-10-13..2025-11'
    """
    first = days[0][:7] if before is None or before[:7] != days[0][:7] else days[0]
    if after is None or after[:7] != days[-1][:7]:
        last = days[-1][:7]
    else:
        last = (datetime.strptime(after, DAY_FMT) - timedelta(days=1)).strftime(DAY_FMT)
    return first if first == last else f"{first}..{last}"


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
