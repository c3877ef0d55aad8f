"""Prompt parity: a reconstructed row keeps the provider's billed prompt count (``usage.prompt_tokens``) and the count
offsets of the provider table variant that rendered its prompt, and ``kimi-eagle billing`` says how many prompts equal
the billed count (as they are, or by the table's offsets) overall and per provider; a reconstruction made before these
columns existed still bills, saying the billed prompt count was not recorded."""
from __future__ import annotations

import csv
import json
import math
import re
from collections import Counter

import pyarrow.parquet as pq
import pytest
from helpers import api, row

from kimi_eagle.apps.cli import main
from kimi_eagle.chat.formats import get_format
from kimi_eagle.diff.billing import reconcile_rows
from kimi_eagle.reconstruct.job import reconstruction_schema, rows_table
from kimi_eagle.reconstruct.record import ReconstructOptions, rebuild_under, reconstruct_line, reconstruct_record
from kimi_eagle.serving.calibration import VariantCounts
from kimi_eagle.serving.provider_table import record_entry

NEW_COLUMNS = ["billed_prompt_tokens", "prompt_count_offset"]
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


def table_file(path, conventions):
    """A provider table of one explained entry for provider ``P`` serving model ``m``."""
    path.write_text(f"""[[provider]]
provider = "P"
model = "m"
period = "all"
status = "explained"
profile = "template"
conventions = {{ {conventions} }}
records = 10
prompt = [10, 10]
completion = [10, 10]
held_out_prompt = [5, 5]
held_out_completion = [5, 5]
prompt_residual = "median +0 (range +0..+0)"
completion_residual = "median +0 (range +0..+0)"
""", encoding="utf-8")
    return path


def served_by_p(rid, content="Paris is sunny today.", messages=None, tools=None):
    """An API record answered by provider ``P`` with model ``m`` (the test table's entry)."""
    record = api(rid, provider="P", content=content)
    record["response"]["model"] = "m"
    if messages is not None:
        record["request"]["messages"] = messages
    if tools is not None:
        record["request"]["tools"] = tools
    return record


def billed(kimi, record, prompt, options=ReconstructOptions(), completion_extra=0, **extra):
    """``record`` with ``usage``: its completion billed as reconstructed (+ ``completion_extra``), its prompt
    ``prompt(n_prompt_tokens)``."""
    first = reconstruct_record(record, kimi, get_format("kimi-k2.5", kimi), options)
    record["response"]["usage"] = {"completion_tokens": first.n_completion_tokens + completion_extra,
                                   "prompt_tokens": prompt(first.n_prompt_tokens), **extra}
    return record


# --------------------------------------------------------------------------------------------
# the reconstructed row


def test_a_reconstructed_row_carries_the_billed_prompt_count(kimi):
    r = row(kimi, api("a"), usage={"completion_tokens": 7, "prompt_tokens": 12})
    assert r["billed_prompt_tokens"] == 12
    assert r["prompt_count_offset"] is None  # no provider table variant rendered it


@pytest.mark.parametrize("bad", [True, False, -1, "12", 12.0, None, 2**63], ids=repr)
def test_a_billed_prompt_count_that_is_not_a_count_is_null_never_coerced(kimi, bad):
    r = row(kimi, api("a"), usage={"completion_tokens": 7, "prompt_tokens": bad})
    assert r["billed_prompt_tokens"] is None and r["billed_completion_tokens"] == 7


def test_an_error_row_has_null_prompt_columns(kimi):
    rows = reconstruct_line(b'{"id": "x", "request": {"messages": []}}', 1, kimi, get_format("kimi-k2.5", kimi),
                            ReconstructOptions())
    assert rows[0]["status"] == "error"
    assert [rows[0][c] for c in NEW_COLUMNS] == [None, None]


def test_the_two_columns_come_last_in_the_schema_as_nullable_int64():
    schema = reconstruction_schema()
    assert schema.names[-3:] == ["count_conventions", *NEW_COLUMNS]
    assert all(str(schema.field(c).type) == "int64" and schema.field(c).nullable for c in NEW_COLUMNS)


def test_a_row_rendered_by_a_table_variant_with_prompt_offset_1_is_equal_by_table(kimi, tmp_path):
    options = ReconstructOptions(provider_table=str(table_file(tmp_path / "t.toml", "prompt_offset = 1")))
    record = billed(kimi, served_by_p("t"), lambda n: n + 1, options)
    r = reconstruct_record(record, kimi, get_format("kimi-k2.5", kimi), options)
    assert r.serving_variant == "template + prompt_offset=1"
    assert r.prompt_count_offset == 1 and r.billed_prompt_tokens == r.n_prompt_tokens + 1
    same = reconstruct_record(billed(kimi, served_by_p("same"), lambda n: n, options), kimi,
                              get_format("kimi-k2.5", kimi), options)
    off = reconstruct_record(billed(kimi, served_by_p("off"), lambda n: n + 5, options), kimi,
                             get_format("kimi-k2.5", kimi), options)
    got = reconcile_rows(kimi, [r.to_dict(), same.to_dict(), off.to_dict()]).set_index("id")
    assert list(got["prompt_verdict"]) == ["equal_by_table", "equal", "differs"]
    assert list(got["prompt_residual"]) == [0, 0, 4]  # billed − (reconstructed + offset)
    assert got.loc["t", "verdict"] == "match"  # the completion side is judged as before


def test_the_offset_is_the_calibrations_sum_of_prompt_history_call_and_tool_turn_offsets(kimi, tmp_path):
    """prompt_offset 1 + history_call_offset 1 per earlier call (2) + tool_turn_offset −1 (tools declared) = 2: what
    VariantCounts.prompt adds, so billed == n_prompt_tokens + prompt_count_offset is the calibration's equal."""
    conventions = "prompt_offset = 1, history_call_offset = 1, tool_turn_offset = -1"
    options = ReconstructOptions(provider_table=str(table_file(tmp_path / "t.toml", conventions)))
    calls = [{"id": f"functions.get_weather:{k}", "type": "function",
              "function": {"name": "get_weather", "arguments": json.dumps({"city": c})}} for k, c in enumerate("AB")]
    messages = [{"role": "user", "content": "Weather in A and B?"},
                {"role": "assistant", "content": "", "tool_calls": calls},
                {"role": "tool", "tool_call_id": calls[0]["id"], "content": "sunny"},
                {"role": "tool", "tool_call_id": calls[1]["id"], "content": "rain"}]
    record = served_by_p("h", messages=messages, tools=[TOOL])
    r = reconstruct_record(record, kimi, get_format("kimi-k2.5", kimi), options)
    assert r.prompt_count_offset == 2
    variant = record_entry(record, options.provider_table).variant
    counts = VariantCounts(kimi, rebuild_under).prompt({**record, "format": "kimi-k2.5"}, variant)
    assert counts == r.n_prompt_tokens + r.prompt_count_offset
    no_tools = reconstruct_record(served_by_p("n", messages=messages), kimi, get_format("kimi-k2.5", kimi), options)
    assert no_tools.prompt_count_offset == 3  # no tool turn: its offset is not added


# --------------------------------------------------------------------------------------------
# billing


def test_billing_of_a_reconstruction_without_the_new_columns_runs_and_says_the_prompt_count_was_not_recorded(
        kimi, tmp_path, capsys):
    rows = [{**row(kimi, api(f"o{i}", content=f"Day {i} is fine.")), "line": i + 1} for i in range(3)]
    old = rows_table(rows).drop_columns(NEW_COLUMNS)  # as kimi-eagle wrote it before they existed
    pq.write_table(old, tmp_path / "old.parquet")
    assert main(["billing", str(tmp_path / "old.parquet"), "-o", str(tmp_path / "bill")]) == 0
    printed = capsys.readouterr().out
    assert "prompts equal: billed prompt count not recorded" in printed
    summary = json.loads((tmp_path / "bill" / "summary.json").read_text())
    parity = summary["prompt_parity"]
    assert parity["recorded"] is False and "billed prompt count not recorded" in parity["note"]
    assert (parity["not_billed"], parity["compared"], parity["equal_rate"]) == (3, 0, None)
    assert "billed prompt count not recorded" in (tmp_path / "bill" / "report.html").read_text(encoding="utf-8")
    assert summary["verdict_class"]["match"] == 3  # the completion side is billed as before


def wilson(k, n, z=1.959963984540054):
    """The Wilson score interval, computed here from its formula."""
    p = k / n
    centre, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - half) / (1 + z * z / n), (centre + half) / (1 + z * z / n)


def recount(rows, completions=None):
    """Per provider and in all: prompt verdicts recounted from the reconstruction's own columns; with
    ``completions`` (id -> billing's completion verdict), ``both_differ`` too."""
    counts: dict[str, Counter] = {}
    seen = set()
    for r in rows:
        if r["status"] != "ok" or r["id"] in seen:
            continue
        seen.add(r["id"])
        n, b, o = r["n_prompt_tokens"], r["billed_prompt_tokens"], r["prompt_count_offset"]
        verdict = "not_billed" if b is None else "equal" if b == n else \
            "equal_by_table" if o and b == n + o else "differs"
        both = completions is not None and verdict == "differs" and completions[r["id"]] == "unexplained"
        for key in (r["provider"] or "(unknown)", "all"):
            counts.setdefault(key, Counter())[verdict] += 1
            counts[key]["both_differ"] += both if completions is not None else 0
    return counts


def completion_verdicts(run):
    return {r["id"]: r["verdict"] for r in pq.read_table(run / "bill" / "billing_records.parquet").to_pylist()}


def expected_block(c):
    equal = c["equal"] + c["equal_by_table"]
    compared = equal + c["differs"]
    lo, hi = wilson(equal, compared)
    return {"equal": c["equal"], "equal_by_table": c["equal_by_table"], "differs": c["differs"],
            "not_billed": c["not_billed"], "compared": compared, "equal_total": equal, "both_differ": c["both_differ"],
            "equal_rate": equal / compared, "equal_rate_lo": lo, "equal_rate_hi": hi}


@pytest.fixture(scope="module")
def billed_run(kimi, tmp_path_factory):
    """reconstruct (with a provider table for P) and billing of providers A, B and P through the CLI."""
    tmp = tmp_path_factory.mktemp("parity")
    table = table_file(tmp / "t.toml", "prompt_offset = 1")
    options = ReconstructOptions(provider_table=str(table))
    plan = {"A": [0, 0, 0, 3, "12"], "B": [0, 0, -2], "P": [1, 1, 0, 5]}  # billed − reconstructed prompt tokens
    records = []
    for provider, deltas in plan.items():
        for k, d in enumerate(deltas):
            record = served_by_p(f"{provider}{k}", content=f"{provider} says {k}: sunny.")
            record["response"]["provider"] = provider
            records.append(billed(kimi, record, lambda n, d=d: d if isinstance(d, str) else n + d,
                                  options if provider == "P" else ReconstructOptions(),
                                  completion_extra=5 if (provider, k) == ("B", 2) else 0))  # both counts off
    lines = [json.dumps(r) for r in records] + ["not JSON"]
    (tmp / "api.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["reconstruct", str(tmp / "api.jsonl"), "-o", str(tmp / "rec.parquet"), "--no-progress",
                 "--format", "kimi-k2.5", "--provider-table", str(table)]) == 0
    assert main(["billing", str(tmp / "rec.parquet"), "-o", str(tmp / "bill")]) == 0
    return tmp


def test_every_verdict_occurs_in_the_planned_records(billed_run):
    counts = recount(pq.read_table(billed_run / "rec.parquet").to_pylist())
    assert counts["A"] == Counter(equal=3, differs=1, not_billed=1)
    assert counts["B"] == Counter(equal=2, differs=1)
    assert counts["P"] == Counter(equal_by_table=2, equal=1, differs=1)


def test_summary_and_metrics_numbers_equal_a_count_recomputed_from_the_parquet(billed_run):
    counts = recount(pq.read_table(billed_run / "rec.parquet").to_pylist(), completion_verdicts(billed_run))
    assert counts["B"]["both_differ"] == counts["all"]["both_differ"] == 1
    summary = json.loads((billed_run / "bill" / "summary.json").read_text())
    metrics = json.loads((billed_run / "bill" / "metrics.json").read_text())
    for parity in (summary["prompt_parity"], metrics["prompt_parity"]):
        assert parity["recorded"] is True
        got_all = {k: parity[k] for k in expected_block(counts["all"])}
        assert got_all == pytest.approx(expected_block(counts["all"]))
        assert set(parity["by_provider"]) == {"A", "B", "P"}
        for provider, block in parity["by_provider"].items():
            assert block == pytest.approx(expected_block(counts[provider])), provider
    records = pq.read_table(billed_run / "bill" / "billing_records.parquet").to_pylist()
    assert Counter(r["prompt_verdict"] for r in records if r["prompt_verdict"]) == counts["all"] - Counter(both_differ=1)
    assert [r["prompt_verdict"] for r in records if r["status"] == "error"] == [None]


def test_summary_md_and_csv_hold_the_same_numbers(billed_run):
    counts = recount(pq.read_table(billed_run / "rec.parquet").to_pylist(), completion_verdicts(billed_run))
    with open(billed_run / "bill" / "summary.csv", newline="", encoding="utf-8") as f:
        cells = {r["field"]: r["value"] for r in csv.DictReader(f) if r["section"] == "prompt_parity"}
    md = (billed_run / "bill" / "summary.md").read_text(encoding="utf-8")
    section = md[md.index("## prompt_parity"):]
    for provider in ("A", "B", "P", "all"):
        block = expected_block(counts[provider])
        prefix = "" if provider == "all" else f"by_provider.{provider}."
        for key in ("equal", "equal_by_table", "differs", "both_differ", "not_billed", "compared", "equal_total"):
            assert int(cells[prefix + key]) == block[key], (provider, key)
            assert f"| {prefix}{key} | {block[key]} |" in section, (provider, key)
        assert float(cells[prefix + "equal_rate_lo"]) == pytest.approx(block["equal_rate_lo"])


def test_the_terminal_line_and_the_page_say_prompts_equal_n_of_m(billed_run, kimi, capsys):
    counts = recount(pq.read_table(billed_run / "rec.parquet").to_pylist(), completion_verdicts(billed_run))
    assert main(["billing", str(billed_run / "rec.parquet"), "-o", str(billed_run / "again")]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("billing-only evidence:"))
    block = expected_block(counts["all"])
    m = re.search(r"prompts equal (\d+)/(\d+) \((\d+) by the provider table's count offsets\)", line)
    assert m and tuple(map(int, m.groups())) == (block["equal_total"], block["compared"], block["equal_by_table"])
    assert line.count(f"; {block['both_differ']} differ with the completion unexplained too") == 1
    page = (billed_run / "again" / "report.html").read_text(encoding="utf-8").replace("<wbr>", "")
    assert "Prompt parity" in page
    for provider in ("A", "B", "P", "all"):
        b = expected_block(counts[provider])
        assert (f"<td class='tok'>{provider}</td><td class='num'>{b['equal']}</td><td class='num'>{b['equal_by_table']}"
                f"</td><td class='num'>{b['differs']}</td><td class='num'>{b['both_differ']}</td><td class='num'>"
                f"{b['not_billed']}</td><td class='num'>"
                f"{b['compared']}</td><td>{b['equal_total']}/{b['compared']} ({100 * b['equal_rate']:.1f}%) "
                f"[{100 * b['equal_rate_lo']:.1f}%, {100 * b['equal_rate_hi']:.1f}%]</td>") in page, provider
