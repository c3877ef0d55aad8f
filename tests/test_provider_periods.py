"""Periods that start or end within a month (issue 44: servers changed mid-month on the agent traces): labels,
lookup by day, and the table file accepting them."""
from __future__ import annotations

import doctest
from datetime import datetime, timezone

import pytest

from kimi_eagle.serving import periods
from kimi_eagle.serving.periods import day_of, in_period, period_label
from kimi_eagle.serving.provider_table import TableError, load_table, record_entry


def test_the_docstring_examples_hold():
    result = doctest.testmod(periods)
    assert result.attempted > 0 and result.failed == 0


def _at(day: str) -> dict:
    stamp = datetime.strptime(day, "%Y-%m-%d").replace(hour=12, tzinfo=timezone.utc).timestamp()
    return {"response": {"created": int(stamp), "provider": "P", "model": "m"}}


def test_consecutive_labels_leave_no_day_out_and_no_day_in_two():
    runs = [["2025-09-10", "2025-10-01"], ["2025-10-13", "2025-10-20"], ["2025-10-27", "2025-11-12"],
            ["2025-12-04", "2026-03-25"]]
    labels = [period_label(run, runs[k - 1][-1] if k else None, runs[k + 1][0] if k + 1 < len(runs) else None)
              for k, run in enumerate(runs)]
    assert labels == ["2025-09..2025-10-12", "2025-10-13..2025-10-26", "2025-10-27..2025-11", "2025-12..2026-03"]
    for day in ("2025-09-01", "2025-10-12", "2025-10-13", "2025-10-26", "2025-10-27", "2025-11-30", "2025-12-01",
                "2026-03-31"):
        assert sum(in_period(day, label) for label in labels) == 1, day
    assert day_of(_at("2025-10-13")) == "2025-10-13" and day_of({"response": {}}) == "undated"


ENTRY = """[[provider]]
provider = "P"
model = "m"
period = "{period}"
status = "explained"
profile = "template"
conventions = {{ {conventions} }}
records = 12
prompt = [12, 12]
completion = [12, 12]
held_out_prompt = [6, 6]
held_out_completion = [6, 6]
prompt_residual = "-"
completion_residual = "-"
"""


def test_a_record_is_looked_up_by_its_day(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text(ENTRY.format(period="2025-10..2025-10-12", conventions='template = "k2-0905"') + "\n"
                    + ENTRY.format(period="2025-10-13..2025-11", conventions='tools = "json-compact"'))
    assert record_entry(_at("2025-10-01"), path).variant.template == "k2-0905"
    assert record_entry(_at("2025-10-13"), path).variant.tools == "json-compact"
    assert record_entry(_at("2025-11-30"), path).variant.tools == "json-compact"


@pytest.mark.parametrize("period", ["2025-10-32", "2025-02-30", "2025-10-13..2025-10-12", "2025-10-1", "2025-10-13..x"])
def test_bad_days_are_refused(tmp_path, period):
    path = tmp_path / "t.toml"
    path.write_text(ENTRY.format(period=period, conventions=""))
    with pytest.raises(TableError, match="is not all, undated, YYYY-MM"):
        load_table(path)
