"""`kimi-eagle compare` on hostile run folders (#47, #48): a summary that is not one the kit writes is refused in
one line naming the run and the file; intervals that do not hold their value, runs of different data kinds and two
batch runs of one name are said in every output (page, Markdown, CSV, terminal), never merged or silently used;
user strings cannot break the Markdown table or become spreadsheet formulas."""
import csv
import json
import re

import pandas as pd
import pytest

from kimi_eagle.apps import cli


def billing_summary(**over):
    summary = {"evidence": "billing-only", "data": "real", "n_records": 10,
               "verdict_class": {"match": 5, "explained": 3, "unexplained": 2},
               "by_provider": [{"provider": "all", "gap_pct": 1.0, "gap_pct_lo": 0.5, "gap_pct_hi": 1.5,
                                "unexplained": 2, "rated": 10}], "by_dataset": []}
    summary.update(over)
    return summary


def folder(tmp_path, name, summary):
    d = tmp_path / name
    d.mkdir()
    (d / "summary.json").write_text(summary if isinstance(summary, str) else json.dumps(summary))
    return d


def compare(tmp_path, a, b, capsys):
    code = cli.main(["compare", str(a), str(b), "-o", str(tmp_path / "out")])
    return code, capsys.readouterr()


@pytest.mark.parametrize("bad, says", [
    ("[1, 2]", "a JSON list, not the object"),
    (json.dumps({"evidence": "billing-only", "n_records": 10}), "lacks the key 'verdict_class'"),
    ('{"evidence": "billing-only", "n_records": Infinity, "verdict_class": {}}', "Infinity is not a number"),
    (json.dumps(billing_summary(n_records=-40)), "n_records = '-40', not a count"),
    (json.dumps(billing_summary(verdict_class={"match": 50})), "more than all"),
    ('{"evidence": "billing-only", "n_records": 1,', "not valid JSON (line 1 column"),
])
def test_a_summary_the_kit_does_not_write_is_refused_in_one_line_naming_run_and_file(tmp_path, capsys, bad, says):
    a = folder(tmp_path, "a", billing_summary())
    b = folder(tmp_path, "b", bad)
    code, io = compare(tmp_path, a, b, capsys)
    err = io.err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "Traceback" not in io.err, io.err
    assert "run B" in err[0] and str(b / "summary.json") in err[0] and says in err[0]
    assert not (tmp_path / "out" / "compare.csv").exists()


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_an_interval_that_does_not_hold_its_value_is_left_out_and_said_everywhere(tmp_path, capsys):
    group = {"provider": "all", "gap_pct": 5.0, "gap_pct_lo": 9.0, "gap_pct_hi": 1.0, "unexplained": 2, "rated": 10}
    a = folder(tmp_path, "a", billing_summary(by_provider=[group]))
    b = folder(tmp_path, "b", billing_summary(by_provider=[{**group, "gap_pct_lo": 4.0, "gap_pct_hi": 6.0}]))
    code, io = compare(tmp_path, a, b, capsys)
    assert code == 0
    rows = {r["figure"]: r for r in read_csv(tmp_path / "out" / "compare.csv")}
    gap = rows["billing gap % · all records"]
    assert gap["A 95% CI"] == "" and gap["change 95% CI"] == "" and gap["changed"] == ""  # never "changed"
    said = "the interval [9.0, 1.0] of 'billing gap % · all records' does not hold its value 5.0"
    assert said in rows["⚠ warning 1"]["note"]
    for text in (io.out, (tmp_path / "out" / "compare.md").read_text(), (tmp_path / "out" / "compare.html").read_text()):
        assert said in text.replace("&#x27;", "'")


def test_runs_of_different_data_kinds_are_warned_in_markdown_csv_and_terminal(tmp_path, capsys):
    a = folder(tmp_path, "a", billing_summary(data="simulated"))
    b = folder(tmp_path, "b", billing_summary(data="real"))
    code, io = compare(tmp_path, a, b, capsys)
    assert code == 0
    said = "the runs hold different kinds of data (A simulated, B real)"
    assert said in io.out
    assert said in (tmp_path / "out" / "compare.md").read_text()
    assert said in read_csv(tmp_path / "out" / "compare.csv")[0]["note"]
    assert said in (tmp_path / "out" / "compare.html").read_text()


def test_a_provider_name_cannot_inject_markdown_or_a_spreadsheet_formula(tmp_path, capsys):
    evil = "x | y\n## injected\n<script>"
    groups = [{"provider": "all", "unexplained": 1, "rated": 10}, {"provider": evil, "unexplained": 1, "rated": 5},
              {"provider": "=HYPERLINK(\"http://e\")", "unexplained": 0, "rated": 5}]
    a = folder(tmp_path, "a", billing_summary(by_provider=groups))
    b = folder(tmp_path, "b", billing_summary(by_provider=groups))
    assert compare(tmp_path, a, b, capsys)[0] == 0
    md = (tmp_path / "out" / "compare.md").read_text()
    assert not any(line.startswith("## ") for line in md.splitlines()) and "<script>" not in md
    table = [line for line in md.splitlines() if line.startswith("|")]
    assert len({len(re.findall(r"(?<!\\)\|", line)) for line in table}) == 1  # every row has the same columns
    assert "unexplained rate · provider x \\| y ## injected \\<script\\>" in md
    rows = read_csv(tmp_path / "out" / "compare.csv")
    assert not any(v.startswith(("=", "@")) for r in rows for v in r.values())


def batch(tmp_path, name, runs):
    d = tmp_path / name
    d.mkdir()
    (d / "batch.json").write_text("{}")
    pd.DataFrame([{"run": r, "status": "ok", "param.seed": seed, "metric.data": "simulated", "metric.mismatch_rate": v,
                   "metric.mismatch_rate_ci.0": lo, "metric.mismatch_rate_ci.1": hi}
                  for r, seed, v, lo, hi in runs]).to_parquet(d / "summary.parquet")
    return d


def test_two_batch_runs_of_one_name_are_kept_apart_by_their_parameters(tmp_path, capsys):
    runs = [("r1", 1, 0.9, 0.85, 0.95), ("r1", 2, 0.1, 0.05, 0.2)]
    a, b = batch(tmp_path, "a", runs), batch(tmp_path, "b", runs)
    code, io = compare(tmp_path, a, b, capsys)
    assert code == 0
    rows = [r for r in read_csv(tmp_path / "out" / "compare.csv") if r["figure"].startswith("mismatch rate")]
    assert len(rows) == 2 and len({r["figure"] for r in rows}) == 2  # two rows, never one merged row
    shown = sorted((r["A"], r["A 95% CI"]) for r in rows)
    assert shown == [("0.1", "[0.0500, 0.2000]"), ("0.9", "[0.8500, 0.9500]")]  # each value with its own interval
    assert all(r["change (B − A)"] == "0" for r in rows)
    assert "2 finished runs named 'r1'" in io.out


def test_a_batch_run_with_other_parameters_in_b_is_said(tmp_path, capsys):
    a = batch(tmp_path, "a", [("r1", 1, 0.5, 0.4, 0.6)])
    b = batch(tmp_path, "b", [("r1", 7, 0.5, 0.4, 0.6)])
    code, io = compare(tmp_path, a, b, capsys)
    assert code == 0 and "run(s) r1 have other parameters in B than in A" in io.out


def test_control_characters_in_a_provider_name_never_reach_the_terminal_or_the_page_raw(tmp_path, capsys):
    name = "Bell\x07Esc\x1b[2JCR\rDel\x7f"
    group = {"provider": name, "unexplained": 0, "rated": 100}
    a = folder(tmp_path, "a", billing_summary(by_provider=[group]))
    b = folder(tmp_path, "b", billing_summary(by_provider=[{**group, "unexplained": 100}]))
    code, io = compare(tmp_path, a, b, capsys)
    assert code == 0 and "unexplained rate · provider Bell\\x07Esc\\x1b[2JCR\\x0dDel\\x7f" in io.out  # changed: named
    for text in (io.out, (tmp_path / "out" / "compare.html").read_text(), (tmp_path / "out" / "compare.md").read_text()):
        assert not any(c in text for c in "\x07\x1b\r\x7f")
