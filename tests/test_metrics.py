"""Each stage's ``metrics.json`` builder: the measures the notebooks used to assemble by hand, never a key twice."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from kimi_eagle.chat.completion import CompletionOptions
from kimi_eagle.diff.metrics import billing_metrics, diff_metrics, engine_metrics
from kimi_eagle.diff.run import DiffResult
from kimi_eagle.io import disjoint_union
from kimi_eagle.reconstruct.metrics import dataset_summary, reconstruct_metrics, rows_per_flag
from kimi_eagle.reconstruct.record import convention_flags
from kimi_eagle.records import RESPONSE_COLUMNS, collect_metrics, response_rows
from kimi_eagle.tokenize.probe import probe, probe_metrics

BILLING = {"n_records": 4, "verdict_class": {"match": 2, "explained": 1, "unexplained": 1, "no_billing": 0, "error": 0},
           "all": {"gap_pct": 1.5, "gap_pct_lo": 0.5, "gap_pct_hi": 2.5, "unexplained_rate": 0.25,
                   "unexplained_lo": 0.05, "unexplained_hi": 0.7}}
REPORT = {"status": {"ok": 3, "missing_engine": 1, "missing_api": 0, "error": 0},
          "verdict": {"exact": 1, "bpe_split": 1, "semantic": 1}, "billing": {"unexplained": 7},
          "rates": [{"dataset": "demo", "mismatch_lo": 0.1, "mismatch_hi": 0.9},
                    {"dataset": "all", "mismatch_lo": 0.2, "mismatch_hi": 0.95}],
          "precision_recall": [{"precision": 1.0, "recall": 0.5}, {"precision": 0.75, "recall": 1.0}]}


def diff_result() -> DiffResult:
    records = pd.DataFrame({"id": list("abcd"), "status": ["ok", "ok", "ok", "missing_engine"],
                            "verdict": ["exact", "bpe_split", "semantic", None]})
    return DiffResult(records, pd.DataFrame({"id": ["b", "c", "c"]}))


def test_disjoint_union_keeps_order_and_refuses_a_key_written_twice():
    assert list(disjoint_union({"a": 1}, {"b": 2}, {"c": 3})) == ["a", "b", "c"]
    with pytest.raises(ValueError, match="key written twice: b"):
        disjoint_union({"a": 1, "b": 2}, {"b": 3})


def test_billing_only_metrics_name_the_evidence_and_every_billing_verdict():
    m = diff_metrics("real", BILLING)
    assert m == {"data": "real", "evidence": "billing-only", "n_records": 4, "billing_match": 2, "billing_explained": 1,
                 "billing_unexplained": 1, "billing_no_billing": 0, "billing_error": 0, "billing_gap_pct": 1.5,
                 "billing_gap_pct_ci": [0.5, 2.5], "billing_unexplained_rate": 0.25,
                 "billing_unexplained_rate_ci": [0.05, 0.7]}


def test_engine_metrics_add_the_byte_diff_without_overwriting_a_billing_measure():
    m = diff_metrics("simulated", BILLING, REPORT, diff_result())
    assert m["evidence"] == "engine" and m["billing_unexplained"] == 1  # the billing verdict count, not the diff's 7
    assert m["n_hunks"] == 3 and m["mismatch_rate"] == pytest.approx(2 / 3) and m["mismatch_rate_ci"] == [0.2, 0.95]
    assert (m["min_precision"], m["min_recall"]) == (0.75, 0.5)
    assert not set(billing_metrics("simulated", BILLING, "engine")) & set(engine_metrics(REPORT, diff_result()))


def test_engine_metrics_leave_out_what_the_report_does_not_have():
    report = {k: v for k, v in REPORT.items() if k not in ("precision_recall",)} | {"rates": []}
    m = engine_metrics(report, DiffResult(pd.DataFrame({"status": ["error"], "verdict": [None]}), pd.DataFrame()))
    assert m["mismatch_rate"] is None and "mismatch_rate_ci" not in m and "min_precision" not in m


def rows() -> pd.DataFrame:
    return pd.DataFrame([
        {"id": "a", "source": "one", "status": "ok", "n_prompt_tokens": 5, "n_completion_tokens": 10,
         "flags": ["tool_ids_auto", "literal_marker"]},
        {"id": "b", "source": "one", "status": "error", "n_prompt_tokens": 0, "n_completion_tokens": 0,
         "flags": []},
        {"id": "c", "source": "two", "status": "ok", "n_prompt_tokens": 3, "n_completion_tokens": 4,
         "flags": ["tool_ids_auto", "no_think_end"]},
    ])


def test_convention_flags_name_the_policy_in_force_and_the_literal_marker_flags():
    assert convention_flags("normalise") == ["truncated", "truncated_in_tool_call", "truncation_ambiguous", "no_think_end",
                                             "no_reasoning", "tool_ids_normalise", "tool_id_normalised", "args_not_json",
                                             "literal_marker", "prompt_literal_marker"]


def test_reconstruct_metrics_count_rows_per_dataset_and_ok_rows_per_convention_flag():
    m = reconstruct_metrics(rows(), {"one": 2.0, "two": 0.5}, "kimi-k2.5", "json", 3, CompletionOptions())
    assert m["datasets"] == {"one": {"records": 2, "ok": 1, "errors": 1, "prompt_tokens": 5, "completion_tokens": 10},
                             "two": {"records": 1, "ok": 1, "errors": 0, "prompt_tokens": 3, "completion_tokens": 4}}
    assert (m["records"], m["ok"], m["errors"], m["tool_ids"], m["omit_think_end_before_tools"]) == (3, 2, 1, "auto", False)
    assert m["rows_per_flag"]["one"]["literal_marker"] == 1 and m["rows_per_flag"]["two"]["no_think_end"] == 1
    assert list(m["rows_per_flag"]["one"]) == convention_flags("auto")
    assert m["completion_tokens_per_s"] == {"one": 5.0, "two": 8.0}
    json.dumps(m)  # plain JSON types only
    assert list(dataset_summary(rows()).index) == ["one", "two"]
    assert rows_per_flag(rows(), ["two"], ["tool_ids_auto"]) == {"two": {"tool_ids_auto": 1}}


def collected() -> list[dict]:
    ok = {"id": "p2", "status": "ok", "http_status": 200, "timing": {"attempts": 2, "latency_s": 0.5},
          "response": {"provider": "P", "usage": {"completion_tokens": 9},
                       "choices": [{"finish_reason": "length", "message": {"content": "x" * 100}}]}}
    error = {"id": "p1", "status": "error", "http_status": 400, "error": {"kind": "permanent", "message": "bad"}}
    return [ok, error]


def test_the_response_table_has_one_sorted_row_per_record_with_texts_cut_short():
    table = response_rows(collected())
    assert [r["id"] for r in table] == ["p1", "p2"] and all(tuple(r) == RESPONSE_COLUMNS for r in table)
    assert table[0]["error"] == "permanent" and table[0]["finish_reason"] is None and table[0]["error_message"] == "bad"
    assert table[1]["text"] == "x" * 80 and (table[1]["attempts"], table[1]["completion_tokens"]) == (2, 9)


def test_collect_metrics_count_finish_reasons_of_the_rows_and_rates_of_the_summary():
    summary = {"prompts": 2, "retries": 1, "requested": 3, "seconds": 2.0,
               "totals": {"ok": 1, "errors": 1, "prompt_tokens": 4, "completion_tokens": 9, "reasoning_tokens": 0,
                          "cost": 0.0}}
    m = collect_metrics(summary, response_rows(collected()), local_server=True)
    assert m["finish_reasons"] == {"length": 1} and m["requests_per_s"] == 1.5 and m["local_server"] is True
    assert collect_metrics({**summary, "seconds": 0}, [], local_server=False)["requests_per_s"] is None


def test_probe_metrics_count_named_specials_and_those_that_do_not_round_trip(kimi):
    report = probe(kimi)
    m = probe_metrics(report, sample_tokens=7)
    assert m["tokenizer"] == kimi.name and m["n_vocab"] == kimi.n_vocab and m["sample_tokens"] == 7
    assert 0 < m["n_named_specials"] < len(report.special_tokens) and m["n_not_roundtrip"] == 0


def test_every_convention_flag_is_one_the_reconstruction_writes():
    import inspect

    from kimi_eagle.chat import completion
    from kimi_eagle.reconstruct import record

    source = inspect.getsource(completion) + inspect.getsource(record)
    for flag in convention_flags("{policy}"):
        assert f'"{flag}"' in source or f'f"{flag}"' in source, flag


def test_wilson_bounds_at_zero_and_all_successes_are_exact():
    """A rate of 0/48 has the lower bound 0 (not 6.9e-18 from rounding) and 48/48 the upper bound 1."""
    from kimi_eagle.diff.summary import wilson

    assert wilson(0, 48)[0] == 0.0 and wilson(48, 48)[1] == 1.0
    lo, hi = wilson(0, 48)
    assert 0.07 < hi < 0.08  # 0.0741, as a table shows it
    assert wilson(3, 10) == pytest.approx((0.1078, 0.6032), abs=1e-4)
