"""Billing names the table variant behind a systematic gap (issue 44): a provider whose every record is off by one
same count is explained by one constant count convention, not by a cause per record."""
from __future__ import annotations

from helpers import api, row

from kimi_eagle.diff.billing import SYSTEMATIC_MIN, reconcile_rows, systematic_gaps


def _rows(kimi, provider, deltas):
    return [row(kimi, api(f"{provider}{i}", provider=provider, content=f"Cloudy, {i} degrees in the hills."),
                billed=d) for i, d in enumerate(deltas)]


def test_every_record_one_over_names_the_completion_offset_variant(kimi):
    got = reconcile_rows(kimi, _rows(kimi, "Plus", [1] * SYSTEMATIC_MIN)).set_index("id")
    assert set(got["verdict"]) == {"explained:systematic_offset"}
    assert all("completion_offset=1" in reason and f"{SYSTEMATIC_MIN} records" in reason for reason in got["reason"])
    assert (got["unexplained_tokens"] == 0).all() and (got["expected_delta"] == 1).all()


def test_a_gap_outside_the_space_is_named_as_a_constant(kimi):
    got = reconcile_rows(kimi, _rows(kimi, "Three", [3] * 4))
    assert set(got["verdict"]) == {"explained:systematic_offset"}
    assert all("a constant +3" in reason for reason in got["reason"])


def test_no_systematic_gap_without_enough_records_or_with_mixed_gaps(kimi):
    rows = _rows(kimi, "Few", [1] * (SYSTEMATIC_MIN - 1)) + _rows(kimi, "Mixed", [1, 1, 2, 1])
    rows += _rows(kimi, "Exact", [0, 0, 0])
    got = reconcile_rows(kimi, rows)
    assert "explained:systematic_offset" not in set(got["verdict"])
    assert systematic_gaps(got.to_dict("records")) == {}
