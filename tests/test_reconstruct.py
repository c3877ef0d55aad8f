"""``kimi-eagle reconstruct``: one row per input record, clear per-record errors, workers, kill + resume."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from kimi_eagle.assets import kimi_dir, stories_dir
from kimi_eagle.reconstruct.convert import convert_file
from kimi_eagle.reconstruct.job import JobOptions, read_rows, reconstruct_file, reconstruction_schema
from kimi_eagle.tokenize.tokenizer import ids_to_bytes

CONTRACT_COLUMNS = ["id", "dataset", "status", "error", "format", "prompt_ids", "completion_ids", "n_prompt_tokens",
                    "n_completion_tokens", "segments", "flags", "finish_reason", "billed_completion_tokens",
                    "billed_reasoning_tokens", "provider"]


def rec(rid, message=None, finish="stop", **response):
    message = {"role": "assistant", "content": "Hello!"} if message is None else {"role": "assistant", **message}
    return {"id": rid, "dataset": "unit", "request": {"model": "m", "messages": [{"role": "user", "content": "Hi"}]},
            "response": {"choices": [{"message": message, "finish_reason": finish}], **response}}


def line(obj) -> bytes:
    return json.dumps(obj).encode() + b"\n"


BAD_INPUTS = [  # (JSONL line, expected status, expected error or flag)
    (line(rec("good", usage={"completion_tokens": 4, "completion_tokens_details": {"reasoning_tokens": 0}}, provider="P")),
     "ok", None),
    (b"{not json\n", "error", "line 2: not JSON"),
    (line({"id": "no-choices", "request": {"messages": []}, "response": {}}), "error", "response has no choices"),
    (line({"id": "no-message", "request": {"messages": []}, "response": {"choices": [{"finish_reason": "stop"}]}}),
     "error", "response.choices[0] has no message"),
    (line(rec("empty", {"content": None, "reasoning": None})), "ok", "answer_empty"),
    (line(rec("bad-args", {"content": None, "tool_calls": [{"id": "c", "type": "function",
                                                           "function": {"name": "f", "arguments": "{oops"}}]}, "tool_calls")),
     "ok", "args_not_json"),
    (line(rec("weird-finish", finish="eos")), "error", "unknown finish_reason 'eos'"),
    (b'{"id": "surrogate", "request": {"messages": []}, "response": {"choices": [{"message": {"content": "a\\ud800b"}, '
     b'"finish_reason": "stop"}]}}\n', "error", "lone surrogate"),
    (b'{"id": "bad-utf8", "x": "\xff\xfe"}\n', "error", "line 11: invalid UTF-8 at byte 25"),
    (line(rec("too-long", {"content": "x" * 400_001})), "error", "over the 400,000-character limit"),
    (line(rec("good")), "error", "duplicate id 'good' (first at line 1)"),
    (line({"id": "converter-failed", "error": "conversation 7: tool call is not JSON"}), "error", "converter: conversation 7"),
]


@pytest.fixture(scope="module")
def bad_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("bad") / "in.jsonl"
    path.write_bytes(b"".join(raw for raw, _, _ in BAD_INPUTS[:2]) + b"\n  \n" + b"".join(raw for raw, _, _ in BAD_INPUTS[2:]))
    return path


def test_every_bad_input_is_one_clear_row_and_the_run_goes_on(bad_file, tmp_path):
    out = tmp_path / "out.parquet"
    counts = reconstruct_file(bad_file, out, kimi_dir(), "kimi-k2.5", JobOptions(progress=False))
    df = read_rows(out)
    assert len(df) == len(BAD_INPUTS) and counts == {"ok": 3, "error": len(BAD_INPUTS) - 3}
    assert list(df.columns[: len(CONTRACT_COLUMNS)]) == CONTRACT_COLUMNS
    for (_, status, reason), row in zip(BAD_INPUTS, df.itertuples()):
        assert row.status == status, (row.id, row.error)
        if status == "error":
            assert reason in row.error, (row.id, row.error)
            assert len(row.completion_ids) == 0 and row.n_completion_tokens == 0
        elif reason:
            assert reason in list(row.flags)
    assert df.line.tolist() == [1, 2, *range(5, 15)]  # blank lines are not records
    assert df.id[1] == "<line 2>" and df.id[8] == "bad-utf8"
    good = df.iloc[0]
    assert (good.billed_completion_tokens, good.billed_reasoning_tokens, good.provider) == (4, 0, "P")
    assert good.finish_reason == "stop" and good.format == "kimi-k2.5" and good.dataset == "unit"


def test_rows_follow_the_contract(tmp_path, kimi):
    src = tmp_path / "rtu.jsonl"
    convert_file("reason-tool-use", None, src, limit=10)
    out = tmp_path / "rtu.parquet"
    reconstruct_file(src, out, kimi_dir(), "kimi-k2.5", JobOptions(progress=False))
    schema = pq.read_schema(out)
    assert str(schema.field("segments").type) == (
        "list<element: struct<kind: string, byte_start: int64, byte_end: int64, tok_start: int64, tok_end: int64>>")
    df = read_rows(out)
    assert (df.status == "ok").all() and len(df) == sum(1 for _ in open(src))
    for row in df.itertuples():
        ids = list(row.completion_ids)
        assert row.n_completion_tokens == len(ids) and row.n_prompt_tokens == len(row.prompt_ids)
        segs = list(row.segments)
        assert segs[0]["tok_start"] == 0 and segs[-1]["tok_end"] == len(ids)
        assert all(a["tok_end"] == b["tok_start"] and a["byte_end"] == b["byte_start"] for a, b in zip(segs, segs[1:]))
        text = ids_to_bytes(kimi, ids)
        for s in segs:
            assert ids_to_bytes(kimi, ids[s["tok_start"]:s["tok_end"]]) == text[s["byte_start"]:s["byte_end"]]
        assert segs[-1]["kind"] == "im_end" and ids[-1] == 163586


def test_plain_format_over_stories_tokenizer(tmp_path, stories):
    src = tmp_path / "s.jsonl"
    src.write_bytes(line(rec("s1", {"content": " there was a cat."})) + line(rec("s2", {"content": "ce upon"}, "length")))
    out = tmp_path / "s.parquet"
    assert reconstruct_file(src, out, stories_dir(), "plain", JobOptions(progress=False)) == {"ok": 2}
    df = read_rows(out)
    assert list(df.prompt_ids[0]) == [1] + stories.encode("Hi")
    assert ids_to_bytes(stories, list(df.completion_ids[0])) == b" there was a cat.</s>"
    assert ids_to_bytes(stories, list(df.completion_ids[1])) == b"ce upon"


def test_empty_file_is_a_clear_error(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n \n")
    with pytest.raises(ValueError, match="is empty: no records"):
        reconstruct_file(empty, tmp_path / "o.parquet", kimi_dir(), "kimi-k2.5", JobOptions(progress=False))
    cli = subprocess.run([sys.executable, "-m", "kimi_eagle", "reconstruct", str(empty), "--tokenizer", str(kimi_dir()),
                          "-o", str(tmp_path / "o.parquet")], capture_output=True, text=True)
    assert cli.returncode == 3 and "is empty" in cli.stderr


@pytest.fixture(scope="module")
def sharegpt_records(tmp_path_factory):
    path = tmp_path_factory.mktemp("sg") / "sharegpt.jsonl"
    convert_file("sharegpt", None, path, limit=150)
    return path


def same_table(a, b) -> bool:
    return pq.read_table(a).equals(pq.read_table(b))


def test_two_workers_equal_one(sharegpt_records, tmp_path):
    one, two = tmp_path / "one.parquet", tmp_path / "two.parquet"
    reconstruct_file(sharegpt_records, one, kimi_dir(), "kimi-k2.5", JobOptions(workers=1, shard_size=200, progress=False))
    reconstruct_file(sharegpt_records, two, kimi_dir(), "kimi-k2.5", JobOptions(workers=2, shard_size=200, progress=False))
    assert len(read_rows(one)) == sum(1 for _ in open(sharegpt_records)) and same_table(one, two)
    assert not (tmp_path / "one.parquet.parts").exists()


def test_killed_run_resumes_to_the_uninterrupted_result(sharegpt_records, tmp_path):
    ref = tmp_path / "ref.parquet"
    reconstruct_file(sharegpt_records, ref, kimi_dir(), "kimi-k2.5", JobOptions(shard_size=10, progress=False))
    out = tmp_path / "out.parquet"
    parts = tmp_path / "out.parquet.parts"
    cmd = [sys.executable, "-m", "kimi_eagle", "reconstruct", str(sharegpt_records), "--tokenizer", str(kimi_dir()),
           "-o", str(out), "--shard-size", "10", "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and len(list(parts.glob("shard-*.arrow"))) < 3:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    n_done = len(list(parts.glob("shard-*.arrow")))
    n_shards = -(-sum(1 for _ in open(sharegpt_records)) // 10)
    assert not out.exists() and 3 <= n_done < n_shards, "the run must be killed half-way"
    # a leftover temp file from an interrupted write is ignored
    (parts / "shard-999999.arrow.tmp123").write_bytes(b"partial")
    resumed = subprocess.run(cmd + ["--resume"], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    lines = read_rows(out).line
    assert len(lines) == len(set(lines)) == sum(1 for _ in open(sharegpt_records)) and same_table(ref, out)
    assert not parts.exists()


def test_resume_names_a_manifest_an_older_version_wrote(sharegpt_records, tmp_path):
    out = tmp_path / "o.parquet"
    parts = tmp_path / "o.parquet.parts"
    parts.mkdir()
    (parts / "manifest.json").write_text(json.dumps({"sha256": "0" * 64, "format": "kimi-k2.5"}))
    with pytest.raises(ValueError, match="older kimi-eagle .a SHA-256 manifest.; run again without --resume"):
        reconstruct_file(sharegpt_records, out, kimi_dir(), "kimi-k2.5", JobOptions(resume=True, progress=False))


def test_resume_refuses_shards_of_an_older_row_schema(sharegpt_records, tmp_path):
    """Shards written before a column was added (billed_prompt_tokens) are never merged with new ones."""
    out = tmp_path / "o.parquet"
    parts = tmp_path / "o.parquet.parts"
    parts.mkdir()
    older = [c for c in reconstruction_schema().names if c not in ("billed_prompt_tokens", "prompt_count_offset")]
    (parts / "manifest.json").write_text(json.dumps({"format": "kimi-k2.5", "columns": older}))
    with pytest.raises(ValueError, match="written with other columns .an older kimi-eagle.; run again without --resume"):
        reconstruct_file(sharegpt_records, out, kimi_dir(), "kimi-k2.5", JobOptions(resume=True, progress=False))


def test_resume_refuses_changed_settings(sharegpt_records, tmp_path):
    out = tmp_path / "o.parquet"
    parts = tmp_path / "o.parquet.parts"
    parts.mkdir()
    (parts / "manifest.json").write_text(json.dumps({"format": "kimi-k2-instruct"}))
    with pytest.raises(ValueError, match="cannot resume"):
        reconstruct_file(sharegpt_records, out, kimi_dir(), "kimi-k2.5", JobOptions(resume=True, progress=False))


# --------------------------------------------------------------------------------------------
# the columnar writer against the reference (pyarrow.array per column, one row group per shard)


def _reference_output(src, out, shard_size):
    """What the file job wrote before the columnar writer: per shard, ``reconstruct_line`` rows converted by
    ``pyarrow.array`` per column, duplicates marked in order, streamed into one parquet (one row group a shard) whose
    schema carries the records' source (#46: :mod:`kimi_eagle.reconstruct.source`)."""
    from kimi_eagle.chat.encoder import PieceEncoder
    from kimi_eagle.chat.formats import get_format
    from kimi_eagle.reconstruct import job
    from kimi_eagle.reconstruct.record import ReconstructOptions, reconstruct_line

    tok = job.load_tokenizer(kimi_dir())
    fmt, enc, first = get_format("kimi-k2.5", tok), PieceEncoder(tok), {}
    n, starts, _ = job._shard_starts(src, shard_size)
    source = job.source_metadata(job.api_source(src))
    writer = pq.ParquetWriter(out, job.reconstruction_schema().with_metadata(source), use_dictionary=False)
    for offset, lineno in starts:
        rows = [r for ln, raw in job._read_shard(src, offset, lineno, shard_size)
                for r in reconstruct_line(raw, ln, tok, fmt, ReconstructOptions(), enc)]
        writer.write_table(job.mark_duplicates(job.reference_table(rows), first))
    writer.close()


@pytest.fixture(scope="module")
def bundled_records(tmp_path_factory, bad_file):
    path = tmp_path_factory.mktemp("bundled") / "in.jsonl"
    parts = []
    for name in ("sharegpt", "glaive"):
        convert_file(name, None, path.with_name(f"{name}.jsonl"), limit=120)
        parts.append(path.with_name(f"{name}.jsonl").read_bytes())
    path.write_bytes(b"".join(parts) + bad_file.read_bytes())
    return path


@pytest.mark.parametrize("workers", [1, 2])
def test_columnar_writer_is_byte_identical_to_the_reference(bundled_records, tmp_path, workers):
    ref, out = tmp_path / "ref.parquet", tmp_path / "out.parquet"
    _reference_output(bundled_records, ref, 64)
    counts = reconstruct_file(bundled_records, out, kimi_dir(), "kimi-k2.5",
                              JobOptions(workers=workers, shard_size=64, progress=False))
    assert out.read_bytes() == ref.read_bytes()
    table = pq.read_table(out)
    assert sum(counts.values()) == table.num_rows and counts["error"] == table.column("status").to_pylist().count("error")
    assert counts.errors == [e for e in table.column("error").to_pylist() if e]


def test_columnar_table_equals_the_general_conversion():
    from kimi_eagle.reconstruct.job import reconstruction_schema, reference_table, rows_table

    schema = reconstruction_schema()
    base = {f.name: None for f in schema}
    base.update(id="a", status="ok", format="f", prompt_ids=[1, 2], completion_ids=[2**31 - 1], n_prompt_tokens=2,
                n_completion_tokens=1, segments=[{"kind": "text", "byte_start": 0, "byte_end": 1, "tok_start": 0,
                                                  "tok_end": 1}], flags=["x", "y"], line=1)
    empty = {**base, "id": "b", "prompt_ids": [], "completion_ids": [], "segments": [], "flags": [], "line": 2}
    for rows in ([base, empty], [empty], []):
        assert rows_table(rows).equals(reference_table(rows))
    too_big = {**base, "id": "c", "completion_ids": [2**31]}  # not an int32: the record's error row, as before
    got, ref = rows_table([base, too_big]), reference_table([base, too_big])
    assert got.equals(ref) and got.column("status").to_pylist() == ["ok", "error"]
    assert "cannot store the row" in got.column("error")[1].as_py()
