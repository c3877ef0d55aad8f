"""Billing-only validation: every reconstructed row gets a billing verdict from the provider's own counts,
known conventions are named (per record and per provider), bad usage is ``no_billing`` and never dropped."""
from __future__ import annotations

import json
import re

import pyarrow.parquet as pq
import pytest
from helpers import api, row

from kimi_eagle.apps.cli import main
from kimi_eagle.apps.reports.billing_report import group_table, summarize_billing
from kimi_eagle.chat.completion import CompletionOptions
from kimi_eagle.chat.formats import get_format
from kimi_eagle.diff.billing import reconcile_rows
from kimi_eagle.diff.simulate import load_source_records, simulate_samples, write_samples
from kimi_eagle.reconstruct.job import JobOptions, reconstruct_file
from kimi_eagle.reconstruct.record import reconstruct_record

TOOL = {"id": "functions.get_weather:0", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}


def verdicts(kimi, rows):
    return dict(zip(*reconcile_rows(kimi, rows)[["id", "verdict"]].T.values))


def test_counts_equal_to_the_reconstruction_match(kimi):
    rows = [row(kimi, api("a")), row(kimi, api("b", reasoning="Look it up.", tool_calls=[TOOL], content=None))]
    assert verdicts(kimi, rows) == {"a": "match", "b": "match"}


def test_a_provider_that_does_not_count_the_end_of_turn_token_is_named_per_record_and_per_provider(kimi):
    rows = [row(kimi, api(f"n{i}", provider="NoEOT", content=f"Sunny, {i} degrees."), billed=-1) for i in range(3)]
    rows += [row(kimi, api(f"c{i}", provider="EOT", content=f"Rain, {i} mm."), billed=0) for i in range(2)]
    rows.append(row(kimi, api("c-off", provider="EOT", content="Snow."), billed=-1))  # the EOT provider's odd one out
    got = reconcile_rows(kimi, rows)
    v = dict(zip(got["id"], got["verdict"]))
    assert {v[f"n{i}"] for i in range(3)} == {"explained:eot_not_counted"}
    assert v["c0"] == v["c1"] == "match" and v["c-off"] == "unexplained"
    table = group_table(got, "provider").set_index("provider")
    assert table.loc["NoEOT", "end_of_turn"].startswith("not_counted (3/3")
    assert table.loc["EOT", "end_of_turn"].startswith("counted (2/3")


def test_reasoning_counted_with_the_think_end_token(kimi):
    rows = [row(kimi, api(f"r{i}", provider="Thinky", reasoning=f"Step {i}: check the city."), billed_reasoning=1)
            for i in range(2)]
    got = reconcile_rows(kimi, rows)
    assert set(got["verdict"]) == {"explained:reasoning_with_think_end"}
    assert group_table(got, "provider").set_index("provider").loc["Thinky", "reasoning_count"].startswith("with_think_end")


def test_reasoning_straight_into_tools_without_think_end(kimi):
    rec = api("t", reasoning="Call the tool.", tool_calls=[TOOL], content=None)
    others = [row(kimi, api(f"o{i}", content=f"Fine {i}.")) for i in range(2)]  # the provider counts the EOT
    assert verdicts(kimi, [row(kimi, rec, billed=-1), *others])["t"] == "explained:think_end_not_generated"


def test_length_truncation_explains_billed_tokens_missing_from_the_text_but_not_extra_text(kimi):
    cut = row(kimi, api("cut", content="Paris is sunny and the wind", finish="length"), billed=7)
    extra = row(kimi, api("extra", content="Paris is sunny and the wind", finish="length"), billed=-3)
    assert verdicts(kimi, [cut, extra]) == {"cut": "explained:length_truncation", "extra": "unexplained"}


def test_an_empty_answer_billed_above_its_end_of_turn_is_the_answer_the_server_dropped(kimi):
    dropped = row(kimi, api("dropped", content=""), billed=31)  # Together, 2025-10-27: 32 tokens billed, "" returned
    nothing = row(kimi, api("nothing", content=""), billed=0)
    below = row(kimi, api("below", content=""), billed=-1)
    assert "answer_empty" in dropped["flags"]
    assert verdicts(kimi, [dropped, nothing, below]) == {"dropped": "explained:answer_dropped", "nothing": "match",
                                                         "below": "unexplained"}


def test_visible_text_alterations_rewritten_tool_ids_stripped_whitespace_replacement_char(kimi):
    call_id = {**TOOL, "id": "call_" + "9f3a" * 6}  # a server-made id, kept as the text shows it
    kept = row(kimi, api("id", tool_calls=[call_id], content=None), billed=-9, options=CompletionOptions(tool_ids="keep"))
    stripped = row(kimi, api("ws", tool_calls=[TOOL], content=None), billed=2)  # +2: more than one split
    fffd = row(kimi, api("fffd", content="Caf\ufffd au lait."), billed=-2)
    plain_plus_two = row(kimi, api("plain", content="Nothing special here."), billed=2)
    assert verdicts(kimi, [kept, stripped, fffd, plain_plus_two]) == {
        "id": "explained:tool_id_rewritten", "ws": "explained:whitespace_stripped",
        "fffd": "explained:replacement_char", "plain": "unexplained"}


def test_one_more_billed_token_is_a_non_canonical_split_and_with_arguments_billing_cannot_tell_which(kimi):
    """The engine sampled the same bytes in one more token: the canonical reconstruction is one short. With tool
    arguments the same +1 may be stripped whitespace: the verdict names both, never just the first that fits."""
    plain = row(kimi, api("plain", content="Nothing special here."), billed=1)
    tools = row(kimi, api("ws", tool_calls=[TOOL], content=None), billed=1)
    got = reconcile_rows(kimi, [plain, tools]).set_index("id")
    assert got.loc["plain", "verdict"] == "explained:non_canonical_split"
    assert got.loc["ws", "verdict"] == "explained:whitespace_stripped|non_canonical_split"
    assert list(got.loc["ws", "conventions"]) == ["whitespace_stripped", "non_canonical_split"]
    assert "billing alone cannot tell which" in got.loc["ws", "reason"]


# the billing cause of each injected effect: what a verdict must name (or list among alternatives)
EFFECT_CAUSE = {"none": "match", "literal_marker": "match", "non_canonical_split": "non_canonical_split",
                "args_whitespace_stripped": "whitespace_stripped", "tool_id_rewritten": "tool_id_rewritten",
                "args_reserialised": "args_reserialised", "think_end_missing": "think_end_not_generated",
                "length_truncation": "length_truncation", "partial_utf8": "replacement_char",
                "content_edited": "unexplained"}
PROVIDER_WIDE = {"eot_not_counted", "reasoning_with_think_end", "reasoning_not_reported"}


def test_on_the_labelled_benchmark_no_verdict_names_a_cause_other_than_the_injected_one(kimi):
    """#35: non-canonical splits were called whitespace_stripped and re-serialised arguments
    think_end_not_generated. Every explained verdict names the injected effect's cause, alone or among the
    alternatives billing cannot tell apart; an unexplained verdict is only ever a content edit."""
    samples = simulate_samples(load_source_records(["glaive", "reason-tool-use"]), kimi, per_effect=2, seed=5)
    fmt = get_format("kimi-k2.5", kimi)
    got = reconcile_rows(kimi, [reconstruct_record(s.api, kimi, fmt).to_dict() for s in samples])
    named = 0
    for s, verdict in zip(samples, got["verdict"]):
        cause = EFFECT_CAUSE[s.effect]
        if verdict.startswith("explained:"):
            alternatives = [{c for c in alt.split("+") if c not in PROVIDER_WIDE} for alt in verdict[10:].split("|")]
            assert {cause} in alternatives, (s.id, verdict)
            named += len(alternatives) == 1
        elif verdict == "unexplained":
            assert cause == "unexplained", (s.id, verdict)
    assert named >= 4  # not everything is ambiguous: length cuts and U+FFFD are named alone


@pytest.mark.parametrize("usage, reason", [
    (..., "no usage in the response"),
    ({}, "usage.completion_tokens is missing"),
    ({"completion_tokens": "41"}, "usage.completion_tokens is '41', not a"),
    ({"completion_tokens": 4.5}, "usage.completion_tokens is 4.5, not a"),
    ("lots", "usage is a str, not an object"),
])
def test_missing_or_non_numeric_usage_is_no_billing_with_the_reason(kimi, usage, reason):
    rec = api("x", usage=usage)
    fmt = get_format("kimi-k2.5", kimi)
    r = reconstruct_record(rec, kimi, fmt).to_dict()
    got = reconcile_rows(kimi, [r, row(kimi, api("ok"))])
    assert list(got["id"]) == ["x", "ok"]
    assert got.loc[0, "verdict"] == "no_billing" and got.loc[0, "reason"].startswith(reason)
    assert got.loc[1, "verdict"] == "match"


def test_failed_duplicate_and_foreign_rows_are_kept_as_errors(kimi):
    good = row(kimi, api("a"))
    failed = {"id": "bad", "status": "error", "error": "line 2: not JSON", "dataset": None}
    foreign = {**row(kimi, api("big")), "completion_ids": [10**9]}
    got = reconcile_rows(kimi, [good, failed, dict(good), foreign])
    assert list(got["verdict"]) == ["match", "error", "error", "error"]
    assert got.loc[1, "reason"] == "reconstruction: line 2: not JSON"
    assert "duplicate id" in got.loc[2, "reason"] and "outside the tokenizer" in got.loc[3, "reason"]


def test_the_first_valid_row_of_an_id_counts_even_after_a_failed_one(kimi):
    failed = {"id": "a", "status": "error", "error": "line 1: not JSON", "dataset": None, "line": 1}
    good = {**row(kimi, api("a")), "line": 2}
    got = reconcile_rows(kimi, [failed, good, {**good, "line": 3}])
    assert list(got["verdict"]) == ["error", "match", "error"]
    assert got.loc[2, "reason"] == "duplicate id 'a' in the reconstructed input (first valid row: line 2)"


def test_simulated_responses_end_to_end_every_record_has_a_verdict(kimi, tmp_path):
    """The kit's simulate output (real conversations, injected effects, usage = engine counts) through
    reconstruct and `kimi-eagle billing`: one verdict per record, and the effects billing can see are named."""
    samples = simulate_samples(load_source_records(["glaive", "reason-tool-use"]), kimi, per_effect=2, seed=3)
    paths = write_samples(samples, tmp_path / "sim")
    recon = tmp_path / "recon.parquet"
    reconstruct_file(paths["api"], recon, None, "kimi-k2.5", JobOptions(progress=False), tokenizer=kimi)
    with open(paths["api"], "a") as f:  # plus a response without usage
        f.write(json.dumps(api("no-usage", usage=...)) + "\n")
    reconstruct_file(paths["api"], recon, None, "kimi-k2.5", JobOptions(progress=False), tokenizer=kimi)
    assert main(["billing", "--reconstructed", str(recon), "-o", str(tmp_path / "b"), "--data", "simulated"]) == 0
    got = pq.read_table(tmp_path / "b" / "billing_records.parquet").to_pandas()
    assert list(got["id"]) == [s.id for s in samples] + ["no-usage"]
    assert got["verdict"].notna().all() and got["reason"].notna().all()
    effect = {s.id: s.effect for s in samples}
    v = got.assign(effect=got["id"].map(effect)).groupby("effect")["verdict"].agg(set).to_dict()
    assert v["none"] == v["literal_marker"] == {"match"}
    assert v["think_end_missing"] == {"explained:think_end_not_generated"}
    assert v["length_truncation"] == {"explained:length_truncation"}
    assert v["partial_utf8"] <= {"explained:replacement_char", "match"}
    assert got.set_index("id").loc["no-usage", "verdict"] == "no_billing"
    metrics = json.loads((tmp_path / "b" / "metrics.json").read_text())
    assert metrics["evidence"] == "billing-only" and metrics["data"] == "simulated"
    assert metrics["n_records"] == len(samples) + 1
    report = (tmp_path / "b" / "report.html").read_text()
    assert "Billing-only evidence" in report and report.count("data:image/png;base64,") == 4
    for png in ("billing_delta", "billing_gap_by_provider", "billing_gap_by_dataset", "billing_verdicts_by_provider"):
        assert (tmp_path / "b" / f"{png}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_gap_is_billed_minus_reconstructed_in_percent_of_billed_with_an_interval(kimi):
    # +2 on a short record: more than a non-canonical split (at most 1 per 1,000 tokens) explains
    rows = [row(kimi, api(f"g{i}", content=f"Day {i} is fine."), billed=2 if i < 2 else 0) for i in range(8)]
    got = reconcile_rows(kimi, rows)
    s = summarize_billing(got, "real")["all"]
    billed = int(got["billed_completion_tokens"].sum())
    assert s["gap_pct"] == pytest.approx(100 * 4 / billed)
    assert s["gap_pct_lo"] <= s["gap_pct"] <= s["gap_pct_hi"]
    assert s["unexplained_rate"] == 2 / 8 and s["unexplained_lo"] < 0.25 < s["unexplained_hi"]


def test_a_provider_with_one_record_gets_no_one_point_interval(kimi):
    """#35: a one-record provider's gap had a "95% CI" of one point (resampling one record). Under 5 records the
    page says the n is too small; with more, the interval is a real one around the value."""
    from kimi_eagle.apps.reports.billing_report import BOOTSTRAP_MIN_N, GAP_HEADER, group_tables

    rows = [row(kimi, api("solo", provider="Solo", content="Sunny."), billed=2)]
    rows += [row(kimi, api(f"m{i}", provider="Many", content=f"Rain {i} mm."), billed=2 if i % 2 else 0) for i in range(6)]
    table = group_table(reconcile_rows(kimi, rows), "provider").set_index("provider")
    assert table.loc["Solo", "gap_pct_lo"] is None or table.loc["Solo", "gap_pct_lo"] != table.loc["Solo", "gap_pct_lo"]
    assert table.loc["Many", "gap_pct_lo"] < table.loc["Many", "gap_pct"] < table.loc["Many", "gap_pct_hi"]
    _, rates = group_tables(table.reset_index().to_dict("records"), "provider")
    shown = rates.set_index("provider")[GAP_HEADER]
    assert shown["Solo"].endswith("[n too small for an interval]") and BOOTSTRAP_MIN_N == 5
    assert re.fullmatch(r"\+[\d.]+% \[\+[\d.]+%, \+[\d.]+%\]", shown["Many"])


def test_notebook_02_without_engine_records_runs_billing_only(kimi, tmp_path):
    from kimi_eagle.apps.batch.notebooks import NOTEBOOK_DIR, execute

    samples = simulate_samples(load_source_records(["glaive"]), kimi, per_effect=1, seed=5,
                               effects=["none", "think_end_missing"])
    api_path = write_samples(samples, tmp_path / "sim")["api"]
    execute(NOTEBOOK_DIR / "02_bpe_diff_inspection.ipynb", tmp_path / "nb",
            {"simulate": False, "api_path": str(api_path), "sample_size": 100})
    metrics = json.loads((tmp_path / "nb" / "metrics.json").read_text())
    assert (metrics["evidence"], metrics["data"], metrics["n_records"]) == ("billing-only", "real", len(samples))
    assert not (tmp_path / "nb" / "diff").exists() and (tmp_path / "nb" / "billing" / "report.html").is_file()


def test_notebook_02_tags_a_toy_model_run_everywhere_and_takes_every_record(kimi, tmp_path):
    """The grid's tiny-kimi run: ``data_kind: toy`` reaches metrics.json and the pages; ``sample_size: None`` (as the
    grid passes it) takes every record, so the batch summary's record count is the run's real n."""
    from kimi_eagle.apps.batch.notebooks import NOTEBOOK_DIR, execute

    samples = simulate_samples(load_source_records(["glaive"]), kimi, per_effect=2, seed=3, effects=["none"])
    api_path = write_samples(samples, tmp_path / "sim")["api"]
    executed = execute(NOTEBOOK_DIR / "02_bpe_diff_inspection.ipynb", tmp_path / "nb",
                       {"simulate": False, "api_path": str(api_path), "sample_size": None, "data_kind": "toy"})
    assert "say nothing about Kimi" in executed.read_text(encoding="utf-8")  # the notebook says it before any number
    metrics = json.loads((tmp_path / "nb" / "metrics.json").read_text())
    assert (metrics["data"], metrics["n_records"]) == ("toy", len(samples))
    page = (tmp_path / "nb" / "billing" / "report.html").read_text(encoding="utf-8").replace("&#x27;", "'")
    assert "REAL engine, toy model (not Kimi's rates)" in page


def test_a_tool_cut_resolved_by_billing_is_not_reported_as_an_independent_match():
    from kimi_eagle.assets import kimi_dir
    from kimi_eagle.diff.billing import reconcile_rows
    from kimi_eagle.tokenize.tokenizer import load_tokenizer

    tok = load_tokenizer(kimi_dir())
    ids = tok.encode('{"city": "Beijing"}')
    segments = [{"kind": "tool_args", "byte_start": 0, "byte_end": 19, "tok_start": 0, "tok_end": len(ids)}]
    row = {"id": "r", "status": "ok", "dataset": "d", "provider": "p", "completion_ids": ids, "segments": segments,
           "flags": ["truncated_in_tool_call", "truncation_resolved_by_billing"], "finish_reason": "length",
           "billed_completion_tokens": len(ids), "billed_reasoning_tokens": None}
    verdict = reconcile_rows(tok, [row]).iloc[0]
    assert verdict["verdict"] == "explained:truncation_resolved_by_billing"
    assert "by construction" in verdict["reason"]


def _tabled(r, **conventions):
    values = {"completion_offset": 0, "tool_call_offset": 0, "answer_args": "as-answered", "reasoning": "counted",
              "tool_answer": "tokens", **conventions}
    return {**r, "count_conventions": [f"{k}={v}" for k, v in values.items()]}


def test_the_provider_tables_count_conventions_predict_the_billed_count(kimi):
    """A row carrying its provider table entry's count conventions (``reconstruct --serving auto``) is judged by them,
    not by the end-of-turn vote; what they predict is named with its values."""
    calls = api("calls", tool_calls=[TOOL], content="Looking.")
    rows = [_tabled(row(kimi, api("stop"), billed=-1), completion_offset=-1),
            _tabled(row(kimi, calls, billed=2), completion_offset=-1, tool_call_offset=3),
            _tabled(row(kimi, api("off"), billed=-2), completion_offset=-1),
            _tabled(row(kimi, api("same"), billed=0))]
    got = reconcile_rows(kimi, rows).set_index("id")
    assert got.loc["stop", "verdict"] == got.loc["calls", "verdict"] == "explained:provider_table"
    assert "completion_offset=-1, tool_call_offset=3" in got.loc["calls", "reason"]
    assert got.loc["off", "verdict"] == "unexplained" and got.loc["off", "unexplained_tokens"] == -1
    assert got.loc["same", "verdict"] == "match"
    spaced = {**TOOL, "function": {**TOOL["function"], "arguments": '{"city":"Paris","days":2}'}}
    extra = len(kimi.encode('{"city": "Paris", "days": 2}')) - len(kimi.encode('{"city":"Paris","days":2}'))
    args = row(kimi, api("args", tool_calls=[spaced], content=None), billed=extra)  # the model wrote them spaced
    assert reconcile_rows(kimi, [_tabled(args, answer_args="spaced")])["verdict"][0] == "explained:provider_table"
    estimate = row(kimi, api("chars", tool_calls=[TOOL], content="Checking the weather in Paris."), usage={
        "completion_tokens": (len("Checking the weather in Paris.") + 2) // 4 + len(kimi.encode('{"city": "Paris"}'))})
    assert reconcile_rows(kimi, [_tabled(estimate, tool_answer="chars-estimate")])["verdict"][0] == \
        "explained:provider_table"


def test_an_entry_that_does_not_explain_completions_counts_only_where_it_predicts_the_count_exactly(kimi):
    """DeepInfra from 2025-10-29 (its entry: completions 13/20 equal, tool_call_offset=-1): a row flagged
    ``provider_table_completion_unexplained`` is explained by its entry only on an exact prediction; any other gap
    is judged by the votes and record conventions, as without a table."""
    calls = api("calls", provider="D", tool_calls=[TOOL], content=None)
    weak = ["provider_table_completion_unexplained"]

    def flagged(r):
        return {**_tabled(r, completion_offset=-1, tool_call_offset=-1), "flags": [*r["flags"], *weak]}
    rows = [flagged(row(kimi, calls, billed=-2)), flagged(row(kimi, api("eot", provider="D"), billed=-1)),
            flagged(row(kimi, {**calls, "id": "near"}, billed=-1)), flagged(row(kimi, api("far", provider="D"), billed=-4))]
    got = reconcile_rows(kimi, rows).set_index("id")
    assert got.loc["calls", "verdict"] == got.loc["eot", "verdict"] == "explained:provider_table"
    assert got.loc["near", "verdict"] == "explained:eot_not_counted"  # the entry predicts -2: the votes judge -1
    assert got.loc["far", "verdict"] == "unexplained" and got.loc["far", "expected_delta"] == -1


def test_a_provider_whose_reasoning_counts_follow_no_convention_is_not_compared_on_them(kimi):
    """AtlasCloud's and Avian's K2.5 reasoning_tokens run from -11 to +18 of the text's: an estimate. When most of a
    provider's counts fit no convention, its reasoning count is not compared (and the page says so)."""
    rows = [row(kimi, api(f"r{i}", provider="Guess", reasoning=f"Think {i} about the city."), billed_reasoning=d)
            for i, d in enumerate((-4, 6, 9, 0))]
    got = reconcile_rows(kimi, rows)
    assert set(got["verdict"]) == {"explained:reasoning_count_not_comparable"}
    assert set(got["reasoning_vote"]) == {"unmatched", "without_think_end"}
    table = group_table(got, "provider").set_index("provider")
    assert table.loc["Guess", "reasoning_count"].startswith("not_comparable")


@pytest.mark.parametrize("conventions", [
    "completion_offset=-1", [1, 2], ["completion_offset=-1"], ["completion_offset=x", "tool_call_offset=0",
    "answer_args=as-answered", "reasoning=counted", "tool_answer=tokens"],
    ["completion_offset=0", "tool_call_offset=0", "answer_args=sideways", "reasoning=counted", "tool_answer=tokens"],
    ["completion_offset=0"] * 5], ids=["string", "ints", "partial", "not-a-number", "unknown-value", "repeated"])
def test_unreadable_count_conventions_fall_back_to_the_votes(kimi, conventions):
    """A row whose count_conventions are not the five known name=value strings is judged as if it had none."""
    rows = [{**row(kimi, api(f"n{i}", provider="NoEOT"), billed=-1), "count_conventions": conventions}
            for i in range(2)]
    assert set(reconcile_rows(kimi, rows)["verdict"]) == {"explained:eot_not_counted"}
