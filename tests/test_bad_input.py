"""Bad input, kind by kind: every malformed record is one row (or one per value) with the exact outcome,
the run goes on, and files that are not UTF-8 JSONL or arguments that make no sense are refused up front.

The corpus covers ``reconstruct`` (API records), ``convert`` (conversations), ``diff`` and ``probe``
(engine records); ``serve``'s malformed requests are in ``tests/test_serve*.py``.
"""
from __future__ import annotations

import fcntl
import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kimi_eagle.assets import kimi_dir
from kimi_eagle.io import EncodingRefused, read_jsonl
from kimi_eagle.reconstruct.convert import convert, convert_file
from kimi_eagle.reconstruct.job import JobOptions, read_rows, reconstruct_file

DEEP = "[" * 1000 + "]" * 1000
DEEPISH = "[" * 150 + "]" * 150


def api(rid="r", content="Hello!", finish="stop", messages=None, tools=None, message=None, **response):
    msg = {"role": "assistant", "content": content} if message is None else {"role": "assistant", **message}
    request = {"model": "m", "messages": messages or [{"role": "user", "content": "Hi"}]}
    if tools is not None:
        request["tools"] = tools
    return {"id": rid, "dataset": "unit", "request": request,
            "response": {"choices": [{"message": msg, "finish_reason": finish}], **response}}


def js(obj) -> bytes:
    """One JSONL line (``ensure_ascii``: lone surrogates travel as ``\\udXXX`` escapes, as in real files)."""
    return json.dumps(obj).encode()


def call(name="f", arguments='{"a": 1}', cid=None):
    return {"id": cid or f"functions.{name}:0", "type": "function", "function": {"name": name, "arguments": arguments}}


TOOL = {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}
ERR, OK = "error", "ok"

# (kind, JSONL line, expected rows: [(status, id, error substring | flag | None)])
RECONSTRUCT = [
    ("valid record", js(api("good", usage={"completion_tokens": 4})), [(OK, "good", None)]),
    ("not JSON", b"{not json", [(ERR, "<line>", "line 2: not JSON (Expecting property name")]),
    ("torn last write", b'{"id": "torn", "req', [(ERR, "<line>", "line 3: not JSON (Unterminated string")]),
    ("two objects on one line", js(api("two-a")) + js(api("two-b")),
     [(ERR, "two-a", "line 4: 2 JSON values on one line (value 1 of 2)"),
      (ERR, "two-b", "line 4: 2 JSON values on one line (value 2 of 2)")]),
    ("two values without ids", b"1 2", [(ERR, "<line value 1>", "value 1 of 2"), (ERR, "<line value 2>", "value 2 of 2")]),
    ("top-level array", b"[1, 2]", [(ERR, "<line>", "record is not a JSON object")]),
    ("top-level null", b"null", [(ERR, "<line>", "record is not a JSON object")]),
    ("1000-deep field the kit ignores", b'{"id": "deep", "x": ' + DEEP.encode() + b"}",
     [(ERR, "<line>", "line 8: nested more than 100 levels deep")]),
    ("150-deep field", js({**api("deepish"), "x": json.loads(DEEPISH)}),
     [(ERR, "deepish", "line 9: nested more than 100 levels deep")]),
    ("5000-digit integer", b'{"id": "big", "n": ' + b"7" * 5000 + b"}",
     [(ERR, "<line>", "line 10: not JSON (Exceeds the limit (4300 digits)")]),
    ("invalid UTF-8 byte", b'{"id": "latin1", "x": "caf\xe9"}', [(ERR, "latin1", "line 11: invalid UTF-8 at byte 26")]),
    ("CESU-8 surrogate bytes", b'{"id": "cesu", "x": "\xed\xa0\x80"}', [(ERR, "cesu", "line 12: invalid UTF-8 at byte 21")]),
    ("lone surrogate in completion content", js(api("sur-content", "a\ud800b")),
     [(ERR, "sur-content", "content is not valid Unicode: lone surrogate")]),
    ("lone surrogate in a tool schema",
     js(api("sur-tool", tools=[{"type": "function", "function": {"name": "f", "description": "x\udc00"}}])),
     [(ERR, "sur-tool", "the prompt holds text that is not valid Unicode (a lone surrogate in request.tools[0].function.description)")]),
    ("lone surrogate in history tool-call arguments",
     js(api("sur-history", messages=[{"role": "user", "content": "Hi"},
                                     {"role": "assistant", "content": None, "tool_calls": [call(arguments='{"q": "\ud83d"}')]},
                                     {"role": "tool", "tool_call_id": "functions.f:0", "content": "r"}], tools=[TOOL])),
     [(ERR, "sur-history", "lone surrogate in request.messages[1].tool_calls[0].function.arguments")]),
    ("lone surrogate in a user message", js(api("sur-user", messages=[{"role": "user", "content": "\udfff"}])),
     [(ERR, "sur-user", "request.messages[0].content is not valid Unicode")]),
    ("lone surrogate in string arguments", js(api("sur-args", None, "tool_calls", message={"content": None, "tool_calls": [call(arguments='"\ud800"')]})),
     [(ERR, "sur-args", "tool_calls[0] arguments is not valid Unicode")]),
    ("lone surrogate in object arguments",
     js(api("sur-args-obj", None, "tool_calls", message={"content": None, "tool_calls": [call(arguments={"q": "\ud800"})]})),
     [(ERR, "sur-args-obj", "the completion holds text that is not valid Unicode (a lone surrogate in response.choices[0].message.tool_calls[0].function.arguments.q)")]),
    ("lone surrogate in a tool name", js(api("sur-name", None, "tool_calls", message={"content": None, "tool_calls": [call(name="f\ud800")]})),
     [(ERR, "sur-name", "the completion holds text that is not valid Unicode")]),
    ("lone surrogate in the id", js(api("id\ud800")), [(ERR, "<line>", "record id 'id\\\\ud800' is not valid Unicode")]),
    ("lone surrogate in the dataset", js({**api("sur-dataset"), "dataset": "d\ud800"}),
     [(ERR, "sur-dataset", "dataset is not valid Unicode")]),
    ("lone surrogate in the provider", js(api("sur-provider", provider="p\ud800")),
     [(ERR, "sur-provider", "response.provider is not valid Unicode")]),
    ("NaN in string arguments", js(api("nan-args", None, "tool_calls", message={"content": None, "tool_calls": [call(arguments='{"x": NaN}')]})),
     [(OK, "nan-args", "args_not_json")]),
    ("Infinity in object arguments",
     b'{"id": "inf-args", "request": {"messages": [{"role": "user", "content": "Hi"}]}, "response": {"choices": [{"finish_reason": '
     b'"tool_calls", "message": {"content": null, "tool_calls": [{"function": {"name": "f", "arguments": {"x": Infinity}}}]}}]}}',
     [(OK, "inf-args", "args_not_json")]),
    ("arguments that are not JSON", js(api("bad-args", None, "tool_calls", message={"content": None, "tool_calls": [call(arguments="{oops")]})),
     [(OK, "bad-args", "args_not_json")]),
    ("usage beyond int64", js(api("usage-big", usage={"completion_tokens": 2**64})), [(OK, "usage-big", None)]),
    ("negative usage", js(api("usage-neg", usage={"completion_tokens": -5, "completion_tokens_details": {"reasoning_tokens": -1}})),
     [(OK, "usage-neg", None)]),
    ("fractional usage", js(api("usage-float", usage={"completion_tokens": 4.5})), [(OK, "usage-float", None)]),
    ("boolean usage", js(api("usage-bool", usage={"completion_tokens": True})), [(OK, "usage-bool", None)]),
    ("usage that is a list", js(api("usage-list", usage=[4])), [(OK, "usage-list", None)]),
    ("unknown finish_reason", js(api("finish-eos", finish="eos")), [(ERR, "finish-eos", "unknown finish_reason 'eos'")]),
    ("non-string finish_reason", js(api("finish-int", finish=5)), [(ERR, "finish-int", "unknown finish_reason 5")]),
    ("choices: [5]", js({"id": "choices-5", "request": {"messages": []}, "response": {"choices": [5]}}),
     [(ERR, "choices-5", "response.choices[0] has no message")]),
    ("empty choices", js({"id": "choices-0", "request": {"messages": []}, "response": {"choices": []}}),
     [(ERR, "choices-0", "response has no choices")]),
    ("response that is a list", js({"id": "resp-list", "request": {"messages": []}, "response": []}),
     [(ERR, "resp-list", "response is not a JSON object")]),
    ("content that is a number", js(api("content-int", 5)), [(ERR, "content-int", "message content is a int, not a string")]),
    ("tool_calls that is a number", js(api("calls-int", None, "tool_calls", message={"content": None, "tool_calls": 5})),
     [(ERR, "calls-int", "message tool_calls is a int, not a list")]),
    ("tool call that is a string", js(api("call-str", None, "tool_calls", message={"content": None, "tool_calls": ["f"]})),
     [(ERR, "call-str", "tool_calls[0] has no function name")]),
    ("history tool_calls that is an object",
     js(api("hist-calls", messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "x", "tool_calls": {"a": 1}}])),
     [(ERR, "hist-calls", "request.messages[1].tool_calls is a dict, not a list")]),
    ("messages that is a string", js({**api("msgs-str"), "request": {"messages": "Hi"}}), [(ERR, "msgs-str", "request.messages is not a list")]),
    ("message without a role", js(api("no-role", messages=[{"content": "Hi"}])),
     [(ERR, "no-role", "request.messages[0] is not a message with a role")]),
    ("content parts that are not objects", js(api("parts", messages=[{"role": "user", "content": [1, 2]}])),
     [(ERR, "parts", "request.messages[0].content is neither a string nor a list of parts")]),
    ("tools that is an object", js(api("tools-obj", tools={"f": 1})), [(ERR, "tools-obj", "request.tools is not a list")]),
    ("no request", js({"id": "no-request", "response": {}}), [(ERR, "no-request", "record has no request object")]),
    ("no id", js({k: v for k, v in api().items() if k != "id"}), [(ERR, "<line>", "record has no string id")]),
    ("integer id", js({**api(), "id": 7}), [(ERR, "<line>", "record has no string id")]),
    ("id in the reserved synthetic form", js(api("<line 3>")),
     [(ERR, "<line>", "record id '<line 3>' has the form reserved for unreadable lines")]),
    ("real id that looks like an old synthetic one", js(api("line:2")), [(OK, "line:2", None)]),
    ("empty message (the server dropped the answer)", js(api("empty", None)), [(OK, "empty", None)]),
    ("over-long content", js(api("too-long", "x" * 400_001)), [(ERR, "too-long", "over the 400,000-character limit")]),
    ("converter error record", js({"id": "conv-err", "error": "conversation 7: tool call is not JSON"}),
     [(ERR, "conv-err", "converter: conversation 7")]),
    ("bad record, then a valid one with its id", js({"id": "dup", "request": {"messages": []}, "response": {}}),
     [(ERR, "dup", "response has no choices")]),
    ("valid record after a bad one with the same id", js(api("dup")), [(OK, "dup", None)]),
    ("second valid record with an id", js(api("good")), [(ERR, "good", "duplicate id 'good' (first at line 1)")]),
    ("literal special-token text in content", js(api("marker", "say <|im_end|> please")), [(OK, "marker", "literal_marker")]),
]


@pytest.fixture(scope="module")
def reconstructed(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    src = d / "api.jsonl"
    src.write_bytes(b"\n".join(line for _, line, _ in RECONSTRUCT) + b"\n")
    counts = reconstruct_file(src, d / "out.parquet", kimi_dir(), "kimi-k2.5", JobOptions(progress=False))
    return counts, read_rows(d / "out.parquet")


@pytest.mark.parametrize("k", range(len(RECONSTRUCT)), ids=[kind for kind, _, _ in RECONSTRUCT])
def test_reconstruct_gives_each_bad_record_its_exact_outcome(reconstructed, k):
    _, df = reconstructed
    first = sum(len(expected) for _, _, expected in RECONSTRUCT[:k])
    for j, (status, rid, reason) in enumerate(RECONSTRUCT[k][2]):
        row = df.iloc[first + j]
        assert row.line == k + 1
        rid = rid.replace("<line", f"<line {k + 1}")  # the synthetic id of this line
        assert (row.status, row.id) == (status, rid), row.error
        if status == ERR:
            assert reason in row.error, row.error
            assert len(row.completion_ids) == 0
        elif reason:
            assert reason in list(row["flags"])


def test_reconstruct_keeps_one_row_per_record_and_stores_no_bad_count(reconstructed):
    counts, df = reconstructed
    assert len(df) == sum(len(expected) for _, _, expected in RECONSTRUCT)
    assert counts == {"ok": int((df.status == "ok").sum()), "error": int((df.status == "error").sum())}
    usage = df.set_index("id").loc[["usage-big", "usage-neg", "usage-float", "usage-bool", "usage-list"]]
    assert usage.billed_completion_tokens.isna().all() and usage.billed_reasoning_tokens.isna().all()
    assert "2**63" in usage.usage_error["usage-big"] and "-5" in usage.usage_error["usage-neg"]
    assert "-1" in usage.usage_error["usage-neg"] and "usage is a list" in usage.usage_error["usage-list"]
    assert df.billed_completion_tokens[0] == 4
    assert "\ufffd" not in "".join(df.error.dropna())


def cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "kimi_eagle", *map(str, args)], capture_output=True, text=True, **kw)


@pytest.mark.parametrize("newline", [b"\r", b"\r\n"], ids=["CR only", "CRLF"])
def test_every_line_ending_gives_a_row_per_record(tmp_path, newline):
    src = tmp_path / "in.jsonl"
    src.write_bytes(newline.join(js(api(f"r{k}")) for k in range(3)) + newline)
    reconstruct_file(src, tmp_path / "o.parquet", kimi_dir(), "kimi-k2.5", JobOptions(progress=False, shard_size=2))
    df = read_rows(tmp_path / "o.parquet")
    assert df.id.tolist() == ["r0", "r1", "r2"] and df.line.tolist() == [1, 2, 3] and (df.status == "ok").all()


def test_a_utf8_byte_order_mark_is_read_past(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"\xef\xbb\xbf" + js(api("bom")) + b"\n")
    assert reconstruct_file(src, tmp_path / "o.parquet", kimi_dir(), "kimi-k2.5", JobOptions(progress=False)) == {"ok": 1}


@pytest.mark.parametrize("encoding, named", [("utf-16", "UTF-16-LE (byte-order mark ff fe)"), ("utf-16-be", "UTF-16/UTF-32 without"),
                                             ("utf-32", "UTF-32-LE")])
def test_a_file_that_is_not_utf8_is_refused_naming_the_encoding(tmp_path, encoding, named):
    src = tmp_path / "in.jsonl"
    src.write_bytes((json.dumps(api("a")) + "\n" + json.dumps(api("b")) + "\n").encode(encoding))
    with pytest.raises(EncodingRefused, match="JSONL must be UTF-8"):
        list(read_jsonl(src))
    out = cli("reconstruct", src, "--tokenizer", kimi_dir(), "-o", tmp_path / "o.parquet")
    assert out.returncode == 2 and named in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "o.parquet").exists() and not (tmp_path / "o.parquet.parts").exists()


@pytest.mark.parametrize("args, message", [
    (["--shard-size", "0"], "--shard-size: must be at least 1, not 0"),
    (["--shard-size", "-1"], "--shard-size: must be at least 1, not -1"),
    (["--workers", "0"], "--workers: must be at least 1, not 0"),
    (["--workers", "-3"], "--workers: must be at least 1, not -3"),
])
def test_sizes_and_counts_must_be_positive(tmp_path, args, message):
    src = tmp_path / "in.jsonl"
    src.write_bytes(js(api()) + b"\n")
    out = cli("reconstruct", src, "--tokenizer", kimi_dir(), "-o", tmp_path / "o.parquet", *args)
    assert out.returncode == 2 and message in out.stderr and not (tmp_path / "o.parquet").exists()


def test_an_output_folder_or_a_bad_tokenizer_is_refused_before_any_work(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(js(api()) + b"\n")
    folder = tmp_path / "out"
    folder.mkdir()
    out = cli("reconstruct", src, "--tokenizer", kimi_dir(), "-o", folder)
    assert out.returncode == 2 and "is a folder" in out.stderr and list(folder.iterdir()) == []
    out = cli("reconstruct", src, "--tokenizer", tmp_path / "nowhere", "-o", tmp_path / "o.parquet")
    assert out.returncode == 2 and "no tiktoken.model or tokenizer.json" in out.stderr and "reconstruct:" not in out.stderr.split("error:")[1]
    assert "Traceback" not in out.stderr and "rec/s" not in out.stderr  # refused before the progress bar and not (tmp_path / "o.parquet.parts").exists()


def test_empty_input_and_all_failed_exit_3_with_the_top_reasons(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"\r\n \n")
    out = cli("reconstruct", empty, "--tokenizer", kimi_dir(), "-o", tmp_path / "e.parquet")
    assert out.returncode == 3 and "nothing to process" in out.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"{x\n{y\n" + js(api("e", finish="eos")) + b"\n")
    out = cli("reconstruct", bad, "--tokenizer", kimi_dir(), "-o", tmp_path / "b.parquet", "--no-progress")
    assert out.returncode == 3 and "no record could be processed (3 of 3 in error)" in out.stderr
    assert "top error reasons (3 records in error, 2 kinds):" in out.stdout
    assert "2  line 1: not JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1)) (and alike)" in out.stdout
    assert len(read_rows(tmp_path / "b.parquet")) == 3  # every record is still in the output
    some = tmp_path / "some.jsonl"
    some.write_bytes(b"{x\n" + js(api()) + b"\n")
    out = cli("reconstruct", some, "--tokenizer", kimi_dir(), "-o", tmp_path / "s.parquet", "--no-progress")
    assert out.returncode == 0 and "1  line 1: not JSON" in out.stdout


def test_a_second_run_on_the_same_output_is_refused(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(js(api()) + b"\n")
    out = tmp_path / "o.parquet"
    with open(tmp_path / ".o.parquet.lock", "a+") as held:  # what a running reconstruct holds
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ValueError, match="being written by another run"):
            reconstruct_file(src, out, kimi_dir(), "kimi-k2.5", JobOptions(progress=False))
    assert not out.exists()
    assert reconstruct_file(src, out, kimi_dir(), "kimi-k2.5", JobOptions(progress=False)) == {"ok": 1}


def test_resume_sees_an_edit_past_the_first_mib_at_equal_size(tmp_path):
    src = tmp_path / "in.jsonl"
    pad = "x" * 2_000
    src.write_bytes(b"".join(js(api(f"r{k}", f"{pad} {k}")) + b"\n" for k in range(700)))
    assert src.stat().st_size > 1 << 20
    out = tmp_path / "o.parquet"
    parts = tmp_path / "o.parquet.parts"
    from kimi_eagle.reconstruct import job

    tok = job.load_tokenizer(kimi_dir())
    n, starts, sha = job._shard_starts(src, 100)
    parts.mkdir()
    (parts / "manifest.json").write_text(json.dumps(job._manifest(src, sha, str(kimi_dir()), "kimi-k2.5",
                                                                  JobOptions(shard_size=100)), indent=1))
    data = bytearray(src.read_bytes())
    data[-20] = ord("y") if data[-20] != ord("y") else ord("z")  # same size, last record changed
    src.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="cannot resume"):
        reconstruct_file(src, out, kimi_dir(), "kimi-k2.5", JobOptions(resume=True, shard_size=100, progress=False), tokenizer=tok)


# --------------------------------------------------------------------------------------------
# convert

CONVERSATION = {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]}

CONVERT = [  # (kind, input file bytes, [(expected id, error substring or None)])
    ("valid conversation", js(CONVERSATION), [("sharegpt:0:1", None)]),
    ("not JSON", b"{oops", [("sharegpt:0", "line 1: not JSON")]),
    ("two conversations on one line", js(CONVERSATION) + js(CONVERSATION),
     [("sharegpt:0", "2 JSON values on one line (value 1 of 2)"), ("sharegpt:1", "(value 2 of 2)")]),
    ("1000-deep conversation", b'{"conversations": ' + DEEP.encode() + b"}", [("sharegpt:0", "nested more than 100 levels deep")]),
    ("conversation that is a list", b"[[1]]", [("sharegpt:0:0", "conversation is not a JSON object")]),
    ("value that is not a string", js({"conversations": [{"from": "human", "value": 5}]}),
     [("sharegpt:0:0", "value is a int, not a string")]),
    ("unknown turn kind", js({"conversations": [{"from": "robot", "value": "x"}]}), [("sharegpt:0:0", "unknown turn kind 'robot'")]),
    ("missing field (wrong --from)", js({"messages": []}), [("sharegpt:0:0", "missing field 'conversations' (is this a sharegpt file? check --from)")]),
    ("invalid UTF-8", b'{"conversations": "\xff"}', [("sharegpt:0", "line 1: invalid UTF-8 at byte 19")]),
    ("CR-only line endings", js(CONVERSATION) + b"\r" + js(CONVERSATION), [("sharegpt:0:1", None), ("sharegpt:1:1", None)]),
    ("JSON array with a bad item", b'[' + js(CONVERSATION) + b', {bad}, ' + js(CONVERSATION) + b']',
     [("sharegpt:0:1", None), ("sharegpt:1", "item 1: not JSON"), ("sharegpt:2:1", None)]),
    ("JSON array with a 1000-deep item", b'[' + DEEP.encode() + b', ' + js(CONVERSATION) + b']',
     [("sharegpt:0", "item 0: nested more than 100 levels deep"), ("sharegpt:1:1", None)]),
    ("JSON array with invalid UTF-8 in an item", b'[{"x": "\xff"}, ' + js(CONVERSATION) + b']',
     [("sharegpt:0", "item 0: invalid UTF-8"), ("sharegpt:1:1", None)]),
    ("truncated JSON array", b'[' + js(CONVERSATION) + b', {"conv', [("sharegpt:0:1", None), ("sharegpt:1", "item 1: not JSON")]),
]


@pytest.mark.parametrize("k", range(len(CONVERT)), ids=[kind for kind, _, _ in CONVERT])
def test_convert_gives_each_bad_conversation_its_exact_outcome(tmp_path, k):
    src = tmp_path / "in.json"
    src.write_bytes(CONVERT[k][1])
    records = list(convert("sharegpt", src))
    assert [(r["id"], r.get("error")) for r in records] == [(rid, r.get("error")) for (rid, _), r in zip(CONVERT[k][2], records)]
    assert len(records) == len(CONVERT[k][2])
    for (rid, reason), r in zip(CONVERT[k][2], records):
        assert (reason in r["error"]) if reason else "error" not in r, r


@pytest.mark.parametrize("source, payload, tool_error", [
    ("glaive", {"conversations": [{"from": "human", "value": "Hi"}, {"from": "function_call", "value": "{nope"}]},
     "tool call is not JSON"),
    ("glaive", {"conversations": [{"from": "human", "value": "Hi"}], "tools": "[" * 1000 + "]" * 1000}, "nested more than 100 levels deep"),
    ("reason-tool-use", {"messages": [{"role": "assistant", "content": [{"type": "tool_call", "value": '{"name": 5}'}]}]},
     "tool call has no name"),
])
def test_convert_tool_fields_that_are_bad_are_errors(tmp_path, source, payload, tool_error):
    src = tmp_path / "in.jsonl"
    src.write_bytes(js(payload))
    [record] = list(convert(source, src))
    assert tool_error in record["error"]


def test_convert_cli_wrong_source_empty_input_and_bad_arguments(tmp_path):
    sharegpt = tmp_path / "sg.jsonl"
    sharegpt.write_bytes(js(CONVERSATION) + b"\n" + js(CONVERSATION))
    out = cli("convert", sharegpt, "--from", "reason-tool-use", "-o", tmp_path / "o.jsonl")
    assert out.returncode == 3 and "2 of them errors" in out.stdout
    assert "2  conversation 0: missing field 'messages' (is this a reason-tool-use file? check --from) (and alike)" in out.stdout
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"\n\n")
    out = cli("convert", empty, "--from", "sharegpt", "-o", tmp_path / "e.jsonl")
    assert out.returncode == 3 and "no record to process" in out.stderr
    out = cli("convert", sharegpt, "--from", "sharegpt", "-o", tmp_path)
    assert out.returncode == 2 and "is a folder" in out.stderr
    out = cli("convert", sharegpt, "--from", "sharegpt", "-o", tmp_path / "l.jsonl", "--limit", "0")
    assert out.returncode == 2 and "--limit: must be at least 1" in out.stderr
    utf16 = tmp_path / "u.jsonl"
    utf16.write_bytes(json.dumps(CONVERSATION).encode("utf-16"))
    out = cli("convert", utf16, "--from", "sharegpt", "-o", tmp_path / "u.out")
    assert out.returncode == 2 and "UTF-16-LE" in out.stderr


def test_converted_errors_reconstruct_to_error_rows(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(js(CONVERSATION) + b"\n{oops\n")
    convert_file("sharegpt", src, tmp_path / "api.jsonl")
    reconstruct_file(tmp_path / "api.jsonl", tmp_path / "o.parquet", kimi_dir(), "kimi-k2.5", JobOptions(progress=False))
    df = read_rows(tmp_path / "o.parquet")
    assert df.status.tolist() == ["ok", "error"] and "converter: line 2: not JSON" in df.error[1]


# --------------------------------------------------------------------------------------------
# engine records: diff and probe

ENGINE = [  # (kind, engine JSONL line, id of the diff row, error substring)
    ("meta_info that is a list", js({"id": "e1", "output_ids": [1], "meta_info": [1]}), "e1", "meta_info is a list, not an object"),
    ("choices: [5]", js({"id": "e2", "choices": [5]}), "e2", "choices[0] is an integer, not an object"),
    ("non-string finish_reason", js({"id": "e3", "output_ids": [1], "finish_reason": 5}), "e3", "finish_reason is an integer, not a string"),
    ("finish_reason object in meta_info", js({"id": "e4", "output_ids": [1], "meta_info": {"finish_reason": {"type": []}}}), "e4",
     "meta_info.finish_reason is a list, not a string"),
    ("token ID beyond int64", js({"id": "e5", "output_ids": [2**70]}), "e5", "output_ids[0] is 1180591620717411303424, not a token ID"),
    ("negative token ID", js({"id": "e6", "output_ids": [5, -1]}), "e6", "output_ids[1] is -1, not a token ID"),
    ("token ID outside the vocabulary", js({"id": "e7", "output_ids": [200_000]}), "e7", "outside the vocabulary"),
    ("empty output", js({"id": "e8", "output_ids": []}), "e8", "engine output_ids is empty"),
    ("prompt_ids that is a string", js({"id": "e9", "output_ids": [1], "prompt_ids": "1 2"}), "e9", "prompt_ids must be a list of integers"),
    ("1000-deep engine record", b'{"id": "e10", "output_ids": [1], "x": ' + DEEP.encode() + b"}", "<engine line 10>",
     "nested more than 100 levels deep"),
    ("engine line that is not JSON", b"{nope", "<engine line 11>", "line 11: not JSON"),
    ("id that is a list", js({"id": [1], "output_ids": [1]}), "<engine line 12>", "engine record id is a list"),
    ("id in the reserved form", js({"id": "<engine line 1>", "output_ids": [1]}), "<engine line 13>", "has the form reserved"),
    ("token_ids that is not a list", js({"id": "e14", "choices": [{"token_ids": 5}]}), "e14", "choices[0].token_ids must be a list"),
]


@pytest.fixture(scope="module")
def engine_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("engine") / "engine.jsonl"
    path.write_bytes(b"\n".join(line for _, line, _, _ in ENGINE) + b"\n")
    return path


@pytest.fixture(scope="module")
def diffed(engine_file, kimi):
    from kimi_eagle.diff.run import diff_rows, read_engine

    recon = [{"id": rid, "status": "ok", "completion_ids": [1], "segments": [], "prompt_ids": [1]}
             for _, _, rid, _ in ENGINE if not rid.startswith("<")]
    return diff_rows(kimi, read_engine(engine_file, kimi), recon).records.set_index("id")


@pytest.mark.parametrize("k", range(len(ENGINE)), ids=[kind for kind, _, _, _ in ENGINE])
def test_diff_gives_each_bad_engine_record_its_exact_outcome(diffed, k):
    _, _, rid, reason = ENGINE[k]
    row = diffed.loc[rid]
    assert row.status == "error" and reason in row.error and row.engine_line == k + 1


@pytest.mark.parametrize("k", range(len(ENGINE)), ids=[kind for kind, _, _, _ in ENGINE])
def test_probe_gives_each_bad_engine_record_its_reason(engine_file, kimi, k):
    from kimi_eagle.tokenize.probe import engine_stats

    stats = engine_stats(kimi, engine_file)
    by_line = {int(e.split(":")[0].split()[1]): e for e in stats.all_errors}
    if ENGINE[k][3] in ("engine output_ids is empty",):  # an empty generation is not malformed for the probe
        assert k + 1 not in by_line
    else:
        assert ENGINE[k][3] in by_line[k + 1]


def test_probe_cli_prints_the_reasons_and_exits_3_when_no_engine_record_is_usable(engine_file, tmp_path):
    out = cli("probe", "--tokenizer", kimi_dir(), "--engine-outputs", engine_file, "--json")
    assert out.returncode == 0  # the empty generation is usable
    report = json.loads(out.stdout)
    assert report["engine"]["n_records"] == len(ENGINE) and "top error reasons" in out.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"{nope\n" + js({"id": "x", "meta_info": []}) + b"\n")
    out = cli("probe", "--tokenizer", kimi_dir(), "--engine-outputs", bad)
    assert out.returncode == 3 and "no engine record could be read (2 of 2 in error)" in out.stderr


def test_two_engine_values_on_one_line_are_two_error_rows(tmp_path, kimi):
    from kimi_eagle.diff.run import read_engine

    path = tmp_path / "e.jsonl"
    path.write_bytes(b'{"id": "a", "output_ids": [1]} {"id": "b", "output_ids": [2]}\n')
    entries = read_engine(path, kimi)
    assert sorted(entries) == ["<engine line 1 value 2>", "<engine line 1>"]
    assert all("2 JSON values on one line" in e.error for e in entries.values())


def test_report_draws_a_dataset_name_that_looks_like_mathtext(tmp_path, kimi):
    from kimi_eagle.apps.reports.diff_report import make_charts
    from kimi_eagle.diff.run import HUNK_SCHEMA, RECORD_SCHEMA, DiffResult

    row = {f.name: None for f in RECORD_SCHEMA}
    row.update(id="a", status="ok", verdict="exact", label="exact", subclasses=[], flags=[], dataset="$\\frac{$",
               n_engine_tokens=3, n_recon_tokens=3, token_delta=0, n_hunks=0)
    records = pa.Table.from_pylist([row], schema=RECORD_SCHEMA).to_pandas()
    hunks = pa.Table.from_pylist([], schema=HUNK_SCHEMA).to_pandas()
    charts = make_charts(DiffResult(records, hunks), tmp_path)
    assert charts["mismatch_rate_by_dataset"].read_bytes().startswith(b"\x89PNG")


def test_the_parquet_of_a_hostile_run_is_readable(reconstructed):
    _, df = reconstructed
    table = pa.Table.from_pandas(df, preserve_index=False)
    pq.write_table(table, pa.BufferOutputStream())


# duplicate ids in `diff`: the first *valid* record of each input wins, every other one is its own error row

DUP_ENGINE = [
    {"id": "a", "output_ids": []},  # 1: invalid, claims nothing
    {"id": "a", "output_ids": [1]},  # 2: first valid "a"
    {"id": "a", "output_ids": [2]},  # 3: later valid "a"
    {"id": "b", "output_ids": [1]},  # 4: first valid "b"
    {"id": "b", "output_ids": [200_000]},  # 5: invalid "b"
    {"id": "c", "output_ids": [1]},  # 6: engine only
    {"id": "c", "output_ids": [1]},  # 7: engine only, later valid
]


def dup_recon(rid, line, status="ok", error=None):
    return {"id": rid, "status": status, "error": error, "completion_ids": [1] if status == "ok" else [],
            "segments": [], "prompt_ids": [1], "line": line}


DUP_RECON = [dup_recon("a", 1, ERR, "response has no choices"), dup_recon("a", 2), dup_recon("a", 3),
             dup_recon("b", 4), dup_recon("d", 5), dup_recon("d", 6)]

DUP_OUTCOME = [  # (id, status, engine line, error)
    ("a", ERR, None, "reconstruction: response has no choices"),
    ("a", OK, 2, None),
    ("a", ERR, None, "duplicate id 'a' in the reconstructed input (first valid row: line 2)"),
    ("b", OK, 4, None),
    ("d", "missing_engine", None, "no engine record with this id"),
    ("d", ERR, None, "duplicate id 'd' in the reconstructed input (first valid row: line 5)"),
    ("a", ERR, 1, "engine output_ids is empty"),
    ("a", ERR, 3, "duplicate id 'a' in the engine input (first valid record at engine line 2)"),
    ("b", ERR, 5, "outside the vocabulary"),
    ("c", "missing_api", 6, "no reconstructed row with this id"),
    ("c", ERR, 7, "duplicate id 'c' in the engine input (first valid record at engine line 6)"),
]


def test_diff_duplicate_ids_first_valid_wins_and_every_record_has_a_row(tmp_path, kimi):
    from kimi_eagle.diff.run import diff_rows, read_engine

    path = tmp_path / "engine.jsonl"
    path.write_bytes(b"".join(js(e) + b"\n" for e in DUP_ENGINE))
    records = diff_rows(kimi, read_engine(path, kimi), DUP_RECON).records
    got = [(r["id"], r["status"], r["engine_line"], r["error"])
           for r in pa.Table.from_pandas(records, preserve_index=False).to_pylist()]
    assert len(got) == len(DUP_RECON) + len(DUP_ENGINE) - 2  # two pairs; nothing dropped
    for (rid, status, line, error), want in zip(got, DUP_OUTCOME):
        assert (rid, status, line) == want[:3] and (error == want[3] if want[3] is None else want[3] in error), want
    assert records.loc[records["status"] == OK, "verdict"].tolist() == ["exact", "exact"]


def test_read_engine_maps_each_id_to_its_first_valid_record(tmp_path, kimi):
    from kimi_eagle.diff.run import read_engine

    path = tmp_path / "engine.jsonl"
    path.write_bytes(b"".join(js(e) + b"\n" for e in DUP_ENGINE))
    entries = read_engine(path, kimi)
    assert {rid: e.line for rid, e in entries.items()} == {"a": 2, "b": 4, "c": 6}
    assert [e.line for e in entries.all] == list(range(1, 8))
    assert [e.line for e in entries.all if e.error] == [1, 3, 5, 7]


def test_diff_cli_keeps_the_valid_row_when_reconstruct_marked_a_later_duplicate(tmp_path):
    recon = [dup_recon("x", 1), dup_recon("x", 2, ERR, "duplicate id 'x' (first at line 1)")]
    pq.write_table(pa.Table.from_pylist(recon), tmp_path / "recon.parquet")
    (tmp_path / "engine.jsonl").write_bytes(js({"id": "x", "output_ids": [1]}) + b"\n")
    out = cli("diff", "--engine", tmp_path / "engine.jsonl", "--reconstructed", tmp_path / "recon.parquet",
              "-o", tmp_path / "diff")
    assert out.returncode == 0, out.stderr
    records = pq.read_table(tmp_path / "diff" / "records.parquet").to_pylist()
    assert [(r["id"], r["status"], r["error"]) for r in records] == [
        ("x", OK, None), ("x", ERR, "reconstruction: duplicate id 'x' (first at line 1)")]


# `report`: a record, hunk or part that cannot be counted or drawn is left out with a visible note, never a crash


def diff_result(records, hunks=()):
    from kimi_eagle.diff.run import HUNK_SCHEMA, RECORD_SCHEMA, DiffResult

    rows = []
    for r in records:
        row = {f.name: None for f in RECORD_SCHEMA}
        row.update(status="ok", verdict="exact", label="exact", subclasses=[], flags=[], dataset="unit",
                   n_engine_tokens=3, n_recon_tokens=3, token_delta=0, n_hunks=0)
        rows.append({**row, **r})
    hunk_rows = []
    for h in hunks:
        row = {f.name: None for f in HUNK_SCHEMA}
        row.update(hunk=0, kind="split", segment="content", engine_tok_start=0, engine_tok_end=2, recon_tok_start=0,
                   recon_tok_end=1, engine_ids=[1, 2], recon_ids=[3], engine_bytes=b"ab", recon_bytes=b"ab", token_delta=-1)
        hunk_rows.append({**row, **h})
    return DiffResult(pa.Table.from_pylist(rows, schema=RECORD_SCHEMA).to_pandas(),
                      pa.Table.from_pylist(hunk_rows, schema=HUNK_SCHEMA).to_pandas())


def test_report_leaves_out_what_it_cannot_count_and_says_so(tmp_path):
    from kimi_eagle.apps.reports.diff_report import write_report

    split = dict(verdict="bpe_split", label="bpe_split", subclasses=[], token_delta=-1, n_recon_tokens=2, n_hunks=1,
                 first_divergence=0, first_divergence_frac=0.0)
    result = diff_result(
        [{"id": "good", "dataset": "<b>markup</b>"}, {"id": "math", "dataset": "$\\frac{$", **split},
         {"id": "nan", "n_recon_tokens": None}, {"id": "weird", "verdict": "weird"},
         {"id": "billed", "billed_completion_tokens": 3}, {"id": "err", "status": "error", "error": "boom <i>"},
         {"id": "sur"}],
        [{"id": "math", "engine_ids": [None, 5]}, {"id": "ghost"}, {"id": "nan"}])
    result.records["dataset"] = result.records["dataset"].astype(object)  # only an object column holds a lone surrogate
    result.records.loc[6, "dataset"] = "bad \udc80 name"
    summary = write_report(result, tmp_path)
    assert [(n["part"], n["id"], n["reason"]) for n in summary["left_out"]["notes"]] == [
        ("record", "nan", "n_recon_tokens is missing (null or NaN)"),
        ("record", "weird", "verdict 'weird' is not one of exact, bpe_split, semantic"),
        ("record", "billed", "billing_delta is missing (null or NaN)"),
        ("record", "sur", "dataset is not valid UTF-8 text (a lone surrogate)"),
        ("hunk", "ghost", "no ok record 'ghost' in the report"),
        ("hunk", "nan", "no ok record 'nan' in the report"),
        ("example hunk", "math", "ValueError: cannot convert float NaN to integer"),  # a null token ID
    ]
    assert {k: v for k, v in summary["left_out"].items() if k != "notes"} == {
        "records": 4, "hunks": 2, "example_hunks": 1, "charts": 0, "sections": 0}
    assert summary["n_records"] == 7 and summary["status"] == {"ok": 2, "missing_engine": 0, "missing_api": 0, "error": 1}
    assert summary["verdict"] == {"exact": 1, "bpe_split": 1, "semantic": 0} and summary["n_hunks"] == 1
    assert len(summary["charts"]) == 6
    page = (tmp_path / "report.html").read_text()
    assert "Left out of this report" in page and "4 records, 2 hunks, 1 example hunks could not be counted" in page
    assert "⚠ not shown: ValueError" in page and "&lt;b&gt;markup&lt;/b&gt;" in page and "<b>markup" not in page
    assert "boom &lt;i&gt;" in page and page.count("data:image/png;base64,") == 6
    assert json.loads((tmp_path / "summary.json").read_text())["left_out"]["records"] == 4


def test_report_of_an_empty_diff_renders_with_nothing_left_out(tmp_path):
    from kimi_eagle.apps.reports.diff_report import write_report

    summary = write_report(diff_result([]), tmp_path)
    assert summary["n_records"] == 0 and summary["status"]["ok"] == 0 and summary["verdict"]["exact"] == 0
    assert summary["left_out"] == {"records": 0, "hunks": 0, "example_hunks": 0, "charts": 0, "sections": 0, "notes": []}
    assert len(summary["charts"]) == 6 and "Left out" not in (tmp_path / "report.html").read_text()


def test_billing_report_draws_provider_names_with_markup_as_text(tmp_path, kimi):
    from helpers import api as billed_api
    from helpers import row

    from kimi_eagle.apps.reports.billing_report import write_billing

    rows = [row(kimi, billed_api("a", provider="$\\frac{$")), row(kimi, billed_api("b", provider="<b>P</b>"), billed=3)]
    summary = write_billing(kimi, rows, tmp_path)
    assert summary["left_out"] == {"charts": 0, "sections": 0, "segments": 0, "notes": []}
    assert len(summary["charts"]) == 4 and [p["provider"] for p in summary["by_provider"]] == ["$\\frac{$", "<b>P</b>", "all"]
    page = (tmp_path / "report.html").read_text()
    assert "&lt;b&gt;P&lt;/b&gt;" in page and "<b>P</b>" not in page and page.count("data:image/png;base64,") == 4
