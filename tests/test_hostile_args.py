"""Hostile arguments and record shapes: numeric flags validated by one argparse type, nothing coerced, nothing
merged or dropped in silence (n > 1 answers, tool names against their ids, foreign JSONL separators, a user's
folder at OUT.parts, impossible segments, a diff without its schema, labels without ids).

Each case is named after what it plants; a refusal is exit 2 with one message naming the flag or the file."""
from __future__ import annotations

import argparse
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import api, recon_row

from kimi_eagle.apps.cli import NONNEG_FLOAT, POSITIVE_INT, TEMPERATURES, TOP_P, main
from kimi_eagle.chat.formats import get_format
from kimi_eagle.diff.billing import reconcile_rows
from kimi_eagle.diff.run import diff_rows, read_diff, read_labels
from kimi_eagle.io import read_jsonl
from kimi_eagle.reconstruct.record import reconstruct_record

# (command line without the bad flag, flag, bad value); the commands never start: argparse refuses first
BASE = {
    "train": ["train", "hs", "--target", "t", "-o", "o"],
    "extract": ["extract", "rows.jsonl", "--target", "t", "-o", "o"],
    "evaluate": ["evaluate", "p.jsonl", "--target", "t"],
    "export-data": ["export-data", "r.parquet", "--to", "specforge", "-o", "o"],
    "generate": ["generate", "p.jsonl", "-o", "o", "--model-dir", "m"],
    "serve": ["serve", "--model-dir", "m"],
    "batch": ["batch", "nb.ipynb", "--grid", "g.yaml", "-o", "o"],
    "simulate": ["simulate", "-o", "o"],
    "tiny-kimi": ["tiny-kimi", "-o", "o"],
    "audit": ["audit", "p.jsonl", "-o", "o", "--base-url", "http://127.0.0.1:1/v1", "--model", "m"],
    "demo": ["demo", "-o", "o"],
    "collect": ["collect", "p.jsonl", "-o", "o", "--base-url", "http://127.0.0.1:1/v1", "--model", "m"],
}
BAD = [
    ("extract", "--shard-rows", "0"), ("extract", "--threads", "0"), ("extract", "--max-tokens", "-5"),
    ("train", "--ttt-steps", "0"), ("train", "--save-every", "0"), ("train", "--log-every", "0"),
    ("train", "--steps", "0"), ("train", "--steps", "1.5"), ("train", "--steps", "７"), ("train", "--steps", "1e3"),
    ("train", "--batch-size", "0"), ("train", "--lr", "0"), ("train", "--lr", "nan"), ("train", "--lr", "-1e-3"),
    ("train", "--step-weight", "inf"), ("train", "--threads", "-1"), ("train", "--stop-after", "0"),
    ("train", "--seed", "-1"), ("train", "--draft-vocab-size", "0"),
    ("evaluate", "--k", "0"), ("evaluate", "--max-new-tokens", "0"), ("evaluate", "--temperatures", "nan"),
    ("evaluate", "--temperatures", "0,-1"), ("evaluate", "--temperatures", "0,inf"), ("evaluate", "--temperatures", "0,,1"),
    ("evaluate", "--threads", "0"),
    ("export-data", "--max-length", "-3"), ("export-data", "--max-length", "0"), ("export-data", "--vocab-size", "0"),
    ("export-data", "--draft-vocab-size", "-1"),
    ("generate", "--temperature", "nan"), ("generate", "--temperature", "-0.5"), ("generate", "--temperature", "1e999"),
    ("generate", "--top-p", "0"), ("generate", "--top-p", "1.5"), ("generate", "--max-tokens", "0"),
    ("generate", "--seed", "-3"),
    ("serve", "--threads", "0"), ("serve", "--port", "70000"), ("serve", "--port", "-1"), ("serve", "--fault-429", "1.5"),
    ("serve", "--fault-500", "-0.1"), ("serve", "--fault-429-burst", "0"), ("serve", "--retry-after", "nan"),
    ("batch", "--workers", "0"), ("simulate", "--per-effect", "0"), ("tiny-kimi", "--steps", "0"),
    ("tiny-kimi", "--temperature", "nan"), ("tiny-kimi", "--threads", "0"), ("audit", "--repeats", "0"),
    ("audit", "--timeout", "0"), ("audit", "--concurrency", "0"), ("demo", "--batch-workers", "0"),
    # collect: every numeric flag, each refused by argparse before a prompt is read
    ("collect", "--limit", "0"), ("collect", "--concurrency", "0"), ("collect", "--concurrency", "-2"),
    ("collect", "--concurrency", "４"), ("collect", "--timeout", "0"), ("collect", "--timeout", "nan"),
    ("collect", "--response-timeout", "-1"), ("collect", "--response-timeout", "inf"),
    ("collect", "--max-body-bytes", "0"), ("collect", "--max-body-bytes", "1e6"), ("collect", "--max-attempts", "0"),
    ("collect", "--backoff-base", "-0.5"), ("collect", "--backoff-base", "nan"), ("collect", "--backoff-max", "inf"),
    ("collect", "--max-retry-after", "-1"), ("collect", "--temperature", "nan"), ("collect", "--temperature", "-1"),
    ("collect", "--top-p", "0"), ("collect", "--top-p", "1.5"), ("collect", "--max-tokens", "0"),
    ("collect", "--max-tokens", "٣"), ("collect", "--seed", "-1"), ("collect", "--top-logprobs", "-1"),
    ("collect", "--reasoning-max-tokens", "0"),
]


@pytest.mark.parametrize("command,flag,value", BAD, ids=[f"{c}_{f.lstrip('-')}_{v}" for c, f, v in BAD])
def test_each_bad_numeric_flag_is_a_one_line_usage_error(command, flag, value, capsys):
    with pytest.raises(SystemExit) as stop:
        main([*BASE[command], f"{flag}={value}"])
    err = capsys.readouterr().err
    assert stop.value.code == 2
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"kimi-eagle {command}: error: argument {flag}") and "expected" in last, err


def test_the_validators_accept_what_they_should_and_return_the_number_unchanged():
    assert POSITIVE_INT("3") == 3 and isinstance(POSITIVE_INT("3"), int)
    assert NONNEG_FLOAT("0") == 0.0 and NONNEG_FLOAT(".5") == 0.5 and NONNEG_FLOAT("1e-3") == 0.001
    assert TOP_P("1") == 1.0 and TEMPERATURES("0,1,0.7") == (0.0, 1.0, 0.7)
    for bad in ["", " ", "0x10", "1_000", "+inf", "True"]:
        with pytest.raises(argparse.ArgumentTypeError):
            POSITIVE_INT(bad)


# ---- reconstruct: n > 1, tool names, JSONL framing, OUT.parts ----

def test_an_answer_with_two_choices_is_flagged_with_the_count(kimi):
    record = api("two")
    record["response"]["choices"].append(dict(record["response"]["choices"][0]))
    row = reconstruct_record(record, kimi, get_format("kimi-k2.5", kimi))
    assert "choices_dropped:1" in row.flags
    single = reconstruct_record(api("one"), kimi, get_format("kimi-k2.5", kimi))
    assert not any(f.startswith("choices_dropped") for f in single.flags)


def test_a_tool_name_that_disagrees_with_its_id_is_flagged(kimi):
    fmt = get_format("kimi-k2.5", kimi)
    call = {"id": "functions.get_weather:0", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}
    bad = reconstruct_record(api("x", content=None, tool_calls=[call], finish="tool_calls"), kimi, fmt)
    assert "tool_name_mismatch" in bad.flags
    call["function"]["name"] = "get_weather"
    ok = reconstruct_record(api("y", content=None, tool_calls=[call], finish="tool_calls"), kimi, fmt)
    assert "tool_name_mismatch" not in ok.flags
    call["id"] = "call_abc123"  # an OpenAI-style id names no function
    other = reconstruct_record(api("z", content=None, tool_calls=[call], finish="tool_calls"), kimi, fmt)
    assert "tool_name_mismatch" not in other.flags


@pytest.mark.parametrize("separator,named", [("\f", "U+000C form feed"), ("\v", "U+000B vertical tab"),
                                             ("\u2028", "U+2028 line separator"), ("\u2029", "U+2029 paragraph separator"),
                                             ("\x85", "U+0085 next line"), ("\x1e", "U+001E record separator")])
def test_records_joined_by_a_foreign_separator_are_one_error_row_each_naming_it(tmp_path, separator, named):
    path = tmp_path / "in.jsonl"
    path.write_bytes((json.dumps({"id": "a"}) + separator + json.dumps({"id": "b"}) + "\n").encode())
    lines = list(read_jsonl(path))
    assert [ln.partial["id"] for ln in lines] == ["a", "b"]
    assert all(named in ln.error and "only LF, CRLF or CR" in ln.error for ln in lines)


def test_a_line_separator_inside_a_string_is_text(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes((json.dumps({"id": "a", "t": "x\u2028y"}, ensure_ascii=False) + "\n").encode())
    assert [ln.obj for ln in read_jsonl(path)] == [{"id": "a", "t": "x\u2028y"}]


@pytest.mark.parametrize("planted", ["a_user_file", "a_user_subfolder", "a_plain_file_named_parts"])
def test_a_folder_at_out_parts_that_reconstruct_did_not_make_is_refused_and_kept(tmp_path, planted, capsys):
    src = tmp_path / "api.jsonl"
    src.write_text(json.dumps(api("a")) + "\n")
    out = tmp_path / "out.parquet"
    parts = tmp_path / "out.parquet.parts"
    if planted == "a_plain_file_named_parts":
        parts.write_text("mine")
    elif planted == "a_user_file":
        parts.mkdir()
        (parts / "thesis.tex").write_text("mine")
    else:
        (parts / "photos").mkdir(parents=True)
    rc = main(["reconstruct", str(src), "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "out.parquet.parts" in err and ("move it away" in err), err
    assert parts.exists() and not out.exists()


# ---- diff and billing: impossible segments, flags as a string ----

def _ids(kimi, text="Paris is sunny."):
    return kimi.encode(text)


SEGMENTS = {
    "negative_start": [{"kind": "content", "byte_start": 0, "byte_end": 1, "tok_start": -1, "tok_end": 2}],
    "reversed": [{"kind": "content", "byte_start": 0, "byte_end": 1, "tok_start": 3, "tok_end": 1}],
    "past_the_end": [{"kind": "content", "byte_start": 0, "byte_end": 1, "tok_start": 0, "tok_end": 999}],
    "overlapping": [{"kind": "reasoning", "byte_start": 0, "byte_end": 1, "tok_start": 0, "tok_end": 3},
                    {"kind": "content", "byte_start": 1, "byte_end": 2, "tok_start": 2, "tok_end": 4}],
    "float_bound": [{"kind": "content", "byte_start": 0, "byte_end": 1, "tok_start": 0.0, "tok_end": 2}],
    "bool_bound": [{"kind": "content", "byte_start": 0, "byte_end": 1, "tok_start": False, "tok_end": 2}],
    "no_kind": [{"byte_start": 0, "byte_end": 1, "tok_start": 0, "tok_end": 2}],
    "a_string": "content",
}


@pytest.mark.parametrize("case", sorted(SEGMENTS))
def test_billing_refuses_impossible_segments_with_a_reason(kimi, case):
    ids = _ids(kimi)
    df = reconcile_rows(kimi, [recon_row("r", ids, SEGMENTS[case], billed=len(ids))])
    assert list(df["verdict"]) == ["error"] and "segment" in df.loc[0, "reason"], df.loc[0, "reason"]


@pytest.mark.parametrize("case", sorted(SEGMENTS))
def test_diff_refuses_impossible_segments_with_a_reason(kimi, case):
    ids = _ids(kimi)
    engine = {"r": type("E", (), {"id": "r", "line": 1, "output_ids": ids, "prompt_ids": None, "finish_reason": "stop",
                                  "error": None})()}
    result = diff_rows(kimi, engine, [recon_row("r", ids, SEGMENTS[case])])
    row = result.records.iloc[0]
    assert row["status"] == "error" and "segment" in row["error"], row["error"]


def test_flags_stored_as_a_string_are_refused_not_split_into_letters(kimi):
    ids = _ids(kimi)
    row = recon_row("r", ids, [{"kind": "content", "byte_start": 0, "byte_end": 1, "tok_start": 0, "tok_end": len(ids)}],
                    billed=len(ids))
    row["flags"] = "truncated"
    df = reconcile_rows(kimi, [row])
    assert df.loc[0, "verdict"] == "error" and "flags is a str" in df.loc[0, "reason"]
    assert list(df.loc[0, "flags"]) == []


def test_possible_segments_still_diff(kimi):
    ids = _ids(kimi)
    segs = [{"kind": "content", "byte_start": 0, "byte_end": 1, "tok_start": 0, "tok_end": len(ids)}]
    df = reconcile_rows(kimi, [recon_row("r", ids, segs, billed=len(ids))])
    assert df.loc[0, "verdict"] == "match"


@pytest.mark.parametrize("planted", ["records_without_verdict_columns", "hunks_of_another_schema", "records_wrong_type"])
def test_report_refuses_a_diff_without_its_schema(tmp_path, planted, capsys):
    from kimi_eagle.diff.run import HUNK_SCHEMA, RECORD_SCHEMA

    d = tmp_path / "diff"
    d.mkdir()
    records = pa.Table.from_pylist([], schema=RECORD_SCHEMA)
    hunks = pa.Table.from_pylist([], schema=HUNK_SCHEMA)
    if planted == "records_without_verdict_columns":
        records = pa.table({"id": ["a"], "status": ["ok"]})
    elif planted == "hunks_of_another_schema":
        hunks = pa.table({"x": [1]})
    else:
        records = records.set_column(records.schema.get_field_index("verdict"), "verdict", pa.array([], pa.int64()))
    pq.write_table(records, d / "records.parquet")
    pq.write_table(hunks, d / "hunks.parquet")
    with pytest.raises(ValueError, match="not the schema `kimi-eagle diff` writes"):
        read_diff(d)
    rc = main(["report", str(d), "-o", str(tmp_path / "rep")])
    assert rc == 2 and "not the schema" in capsys.readouterr().err


@pytest.mark.parametrize("planted,line", [("no_id", {"expected": "exact"}), ("int_id", {"id": 5, "expected": "exact"}),
                                          ("list_expected", {"id": "a", "expected": ["x"]}), ("not_an_object", [1, 2])])
def test_labels_without_a_string_id_are_refused_naming_the_line(tmp_path, planted, line):
    path = tmp_path / "labels.jsonl"
    path.write_text(json.dumps({"id": "ok", "expected": "exact"}) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(ValueError, match="label 2: needs a string id"):
        read_labels(path)


def test_labels_with_null_expected_are_kept(tmp_path):
    path = tmp_path / "labels.jsonl"
    path.write_text(json.dumps({"id": "a", "expected": None}) + "\n" + json.dumps({"id": "b", "expected": "exact"}) + "\n")
    assert read_labels(path) == {"a": None, "b": "exact"}
