"""More hostile kinds for issue 37, none a duplicate of test_hostile_streams / _keys / _integrity: logged streams in
odd but valid SSE (no space after ``data:``, CR-only lines, repeated ``[DONE]``, ``choices: []`` mid-stream, a null
``delta``) assembled right, and malformed chunks (a null ``function``, numeric arguments or content, a string usage,
``choices`` an object, a chunk that is an array or a string, a numeric id, an ``error`` event, an unfinished second
choice) kept as error records by name; JSONL lines that are arrays, strings, numbers or null; answers whose usage,
logprobs, finish reason, content or tool call are the wrong type through ``reconstruct_batch`` (flag, null or error
row -- never coerced, never a traceback); a 10 MB text bounded in time; duplicate ids through ``convert`` and
``reconstruct``; ``--serving auto`` on records without usable usage; the key inside tool-call arguments, a URL query
string, a 500 body and a nested ``\\u``-escaped argument string. ``KINDS`` counts the planted kinds."""
import json
import sys
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

from kimi_eagle.apps.api.redact import REDACTED, Redactor
from kimi_eagle.assets import kimi_dir
from kimi_eagle.reconstruct.batch import BatchOptions, reconstruct_batch
from kimi_eagle.reconstruct.convert import convert

sys.path.insert(0, str(Path(__file__).parent))
from test_hostile_keys import PREFIX, SECRET, leaks  # noqa: E402  (the independent checker of the key tests)

pytestmark = pytest.mark.timeout(120)
REQUEST = {"model": "m", "messages": [{"role": "user", "content": "q"}]}


def _chunk(delta=None, finish=None, cid="gen-s", **extra) -> dict:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"id": cid, "object": "chat.completion.chunk", "model": "m", "choices": choices, **extra}


def _ev(chunk) -> bytes:
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


OK = [_chunk({"role": "assistant", "content": ""}), _chunk({"content": "hi"}), _chunk({}, "stop")]
ROLE, HI, STOP = OK


def _choice(**fields) -> dict:
    return {**_chunk(), "choices": [{"index": 0, "finish_reason": None, **fields}]}


# ---- logged streams that are valid SSE, however odd: assembled to the one answer "hi"

VALID_STREAMS = {
    "data without a space": b"".join(b"data:" + json.dumps(c).encode() + b"\n\n" for c in OK),
    "CR-only line endings": b"".join(_ev(c).replace(b"\n", b"\r") for c in OK),
    "three [DONE]": b"".join(map(_ev, OK)) + b"data: [DONE]\n\n" * 3,
    "choices [] mid-stream": b"".join(map(_ev, [ROLE, _chunk({"content": "h"}), {**_chunk(), "choices": []},
                                                _chunk({"content": "i"}), STOP])),
    "null delta": b"".join(map(_ev, [ROLE, _choice(delta=None), HI, STOP])),
    "comment lines between events": b"".join(b": keep-alive\n\n" + _ev(c) for c in OK),
}


def _wire(tmp_path, body: bytes) -> list[dict]:
    path = tmp_path / "wire.txt"
    path.write_bytes(json.dumps(REQUEST).encode() + b"\n" + body)
    return list(convert("openai-stream", path))


@pytest.mark.parametrize("case", sorted(VALID_STREAMS))
def test_an_odd_but_valid_logged_stream_is_assembled_to_its_answer(tmp_path, case):
    (rec,) = _wire(tmp_path, VALID_STREAMS[case])
    assert "error" not in rec, rec.get("error")
    assert rec["response"]["choices"][0]["message"]["content"] == "hi"
    assert rec["response"]["choices"][0]["finish_reason"] == "stop" and rec["request"] == REQUEST


# ---- logged streams with a malformed chunk: an error record naming it; no record lost

BAD_STREAMS = {  # body -> the words of the answer's error (every error record names its event)
    "tool call with a null function": (
        [ROLE, _chunk({"tool_calls": [{"index": 0, "id": "c", "type": "function", "function": None}]}),
         _chunk({}, "tool_calls")], "delta.tool_calls.function: expected an object, got NoneType"),
    "tool-call arguments a number": (
        [ROLE, _chunk({"tool_calls": [{"index": 0, "id": "c", "type": "function",
                                       "function": {"name": "f", "arguments": 5}}]}), _chunk({}, "tool_calls")],
        "arguments: expected a string fragment, got int"),
    "content a number": ([ROLE, _chunk({"content": 5}), STOP], "delta.content: expected a string fragment, got int"),
    "content a list": ([ROLE, _chunk({"content": ["a"]}), STOP], "delta.content: expected a string fragment, got list"),
    "usage a string": ([*OK, _chunk(None, usage="12")], "usage: expected an object, got str"),
    "choices an object": ([ROLE, {**_chunk(), "choices": {"0": 1}}, HI, STOP], "choices: expected a list, got dict"),
    "a second choice never finished": ([ROLE, {**_chunk(), "choices": [{"index": 1, "delta": {"content": "b"},
                                                                        "finish_reason": None}]}, HI, STOP],
                                       "stream_incomplete: no finish_reason"),
}


@pytest.mark.parametrize("case", sorted(BAD_STREAMS))
def test_a_logged_stream_with_a_malformed_chunk_is_an_error_record_by_name(tmp_path, case):
    chunks, says = BAD_STREAMS[case]
    (rec,) = _wire(tmp_path, b"".join(map(_ev, chunks)))
    assert says in rec["error"] and rec["error"].startswith("event "), rec["error"]
    assert rec["request"] == REQUEST  # the question kept beside the error


@pytest.mark.parametrize("planted, says", [([1, 2], "a list, not a chunk"), ("hello", "a str, not a chunk")],
                         ids=["an array event", "a string event"])
def test_an_event_that_is_not_a_chunk_is_its_own_error_record_and_the_answer_stays_whole(tmp_path, planted, says):
    records = _wire(tmp_path, b"".join(map(_ev, [ROLE, planted, HI, STOP])))
    assert len(records) == 2 and records[0]["response"]["choices"][0]["message"]["content"] == "hi"
    assert "error" not in records[0] and records[1]["error"] == f"event 3: {says}, request or logged stream"


def test_chunks_with_a_numeric_id_cannot_be_grouped_and_each_says_so(tmp_path):
    records = _wire(tmp_path, b"".join(_ev({**c, "id": 5}) for c in OK))
    assert len(records) == 4 and "a request with no answer" in records[0]["error"]  # the question, kept
    assert [r["error"] for r in records[1:]] == [f"event {i}: a chunk without a string `id` cannot be grouped"
                                                 for i in (2, 3, 4)]


def test_an_error_event_is_a_record_naming_its_fields(tmp_path):
    records = _wire(tmp_path, b"event: error\n" + _ev({"error": {"message": "overloaded", "code": 502}}))
    assert len(records) == 2 and "a request with no answer" in records[0]["error"]
    assert "fields: error" in records[1]["error"]


# ---- JSONL lines that are not objects; duplicate ids

def _rows(folder) -> list[dict]:
    from kimi_eagle.reconstruct.job import read_rows

    df = read_rows(folder)
    return df.astype(object).where(df.notna(), None).to_dict("records")


def _completion(rid: str, content: str = "hi") -> dict:
    return {"request": REQUEST, "response": {"id": rid, "choices": [{"index": 0, "finish_reason": "stop",
                                                                     "message": {"role": "assistant", "content": content}}]}}


def test_jsonl_lines_that_are_arrays_strings_numbers_or_null_are_error_records(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text("\n".join([json.dumps(_completion("a")), "[1, 2]", '"just text"', "42", "null",
                               json.dumps(_completion("b"))]) + "\n")
    records = list(convert("openai", path))
    assert [r["id"] for r in records][::5] == ["a", "b"] and len(records) == 6
    assert [r["error"] for r in records[1:5]] == [f"conversation {i}: conversation is not a JSON object"
                                                  for i in (1, 2, 3, 4)]


def test_duplicate_ids_survive_convert_and_reconstruct_keeps_the_first_and_names_the_second(tmp_path, capsys):
    from kimi_eagle.apps.cli import main

    path = tmp_path / "log.jsonl"
    path.write_text(json.dumps(_completion("same", "first")) + "\n" + json.dumps(_completion("same", "second")) + "\n")
    assert main(["convert", "--from", "openai", str(path), "-o", str(tmp_path / "api.jsonl")]) == 0
    assert [json.loads(x)["id"] for x in (tmp_path / "api.jsonl").read_text().splitlines()] == ["same", "same"]
    main(["reconstruct", str(tmp_path / "api.jsonl"), "-o", str(tmp_path / "rec"), "--no-progress"])
    rows = _rows(tmp_path / "rec")
    assert [r["status"] for r in rows] == ["ok", "error"] and "duplicate id 'same' (first at line 1)" in rows[1]["error"]
    assert "Traceback" not in capsys.readouterr().err


# ---- answers of the wrong type through reconstruct_batch: a flag, a null with its reason, or an error row

def _record(change) -> str:
    rec = {"id": "r", "request": {"messages": [{"role": "user", "content": "hi"}]},
           "response": {"provider": "P", "usage": {"prompt_tokens": 10, "completion_tokens": 3},
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": "Hello there"}}]}}
    change(rec["response"], rec["response"]["choices"][0])
    return json.dumps(rec)


def _entries(*pairs):
    return {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in pairs]}


RECORDS = {  # change to the answer -> what its row must say (a column and its value, or error words)
    "usage completion_tokens negative": (lambda r, c: r["usage"].update(completion_tokens=-3),
                                         ("usage_error", "usage.completion_tokens is -3, not a count")),
    "usage completion_tokens a string": (lambda r, c: r["usage"].update(completion_tokens="3"),
                                         ("usage_error", "usage.completion_tokens is '3', not a count")),
    "usage completion_tokens true": (lambda r, c: r["usage"].update(completion_tokens=True),
                                     ("usage_error", "usage.completion_tokens is True, not a count")),
    "usage completion_tokens 2**63": (lambda r, c: r["usage"].update(completion_tokens=2 ** 63),
                                      ("usage_error", "not a count")),
    "usage a string": (lambda r, c: r.update(usage="12"), ("usage_error", "usage is a str, not an object")),
    "finish_reason unknown": (lambda r, c: c.update(finish_reason="banana"), "unknown finish_reason 'banana'"),
    "finish_reason a number": (lambda r, c: c.update(finish_reason=7), "unknown finish_reason 7"),
    "content a number": (lambda r, c: c["message"].update(content=5), "message content is a int, not a string"),
    "tool call with a null function": (lambda r, c: c["message"].update(
        tool_calls=[{"id": "a", "type": "function", "function": None}]), "tool_calls[0] has no function name"),
    "logprobs content a string": (lambda r, c: c.update(logprobs={"content": "Hello there"}),
                                  ("flags", "logprobs_unreadable")),
    "logprobs a number": (lambda r, c: c.update(logprobs=3), ("flags", "logprobs_unreadable")),
    "logprob entries strings": (lambda r, c: c.update(logprobs={"content": ["Hello", " there"]}),
                                ("flags", "logprobs_unreadable")),
    "logprob bytes past 255": (lambda r, c: c.update(logprobs={"content": [{"token": "Hello", "logprob": -0.1,
                                                                            "bytes": [300]}]}),
                               ("flags", "logprobs_unreadable")),
    "logprob entries without bytes, short": (lambda r, c: c.update(logprobs={"content": [{"token": "Hel", "logprob": -1}]}),
                                             ("flags", "logprobs_mismatch")),
    "content of 10 MB": (lambda r, c: c["message"].update(content="word " * 2_000_000),
                         "over the 400,000-character limit"),
}


@pytest.mark.parametrize("case", sorted(RECORDS))
def test_an_answer_of_the_wrong_type_is_flagged_nulled_with_a_reason_or_an_error_row(case):
    change, expect = RECORDS[case]
    t0 = time.monotonic()
    (row,) = reconstruct_batch(pa.table({"text": [_record(change)], "line": [1]}),
                               BatchOptions(str(kimi_dir()))).to_pylist()
    assert time.monotonic() - t0 < 30  # bounded, the 10 MB text too
    if isinstance(expect, str):
        assert row["status"] == "error" and expect in row["error"], row["error"]
        return
    column, value = expect
    assert row["status"] == "ok", row["error"]
    assert value in row[column], (column, row[column])
    if column == "usage_error":
        assert row["billed_completion_tokens"] is None  # null with its reason, never coerced
    else:
        assert row["ids_source"] == "text"  # the unreadable logprobs not used


# ---- --serving auto on records without usable usage

def test_serving_auto_on_records_without_usable_usage_chooses_nothing_silently(tmp_path, capsys):
    from kimi_eagle.apps.cli import main

    def rec(i, usage):
        r = json.loads(_record(lambda r, c: r.update(usage=usage)))
        return json.dumps({**r, "id": f"r{i}"})

    path = tmp_path / "api.jsonl"
    usages = [None, {"prompt_tokens": 0, "completion_tokens": 0}, {"prompt_tokens": True, "completion_tokens": True},
              {"completion_tokens": "3"}]
    path.write_text("\n".join(rec(i, u) for i, u in enumerate(usages)) + "\n")
    code = main(["reconstruct", str(path), "-o", str(tmp_path / "rec"), "--serving", "auto", "--no-progress"])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    rows = _rows(tmp_path / "rec")
    assert code == 0 and len(rows) == len(usages) and all(r["status"] == "ok" for r in rows)
    assert [r["billed_completion_tokens"] for r in rows] == [None, 0, None, None]
    assert all(r["serving"] == "template" for r in rows)  # no evidence: the template, never a guess
    assert [r["usage_error"] is None for r in rows] == [False, True, False, False]


# ---- the key where a server might put it

KEY_PLACES = {
    "inside tool-call arguments": lambda k: json.dumps({"api_key": k, "city": "Paris"}),
    "in a URL query string, percent-encoded": lambda k: "https://x.test/v1?key=" + "".join(f"%{b:02X}" for b in k.encode()),
    "in a 500 body's error message": lambda k: json.dumps({"error": {"code": 500, "message": f"upstream said: {k}"}}),
    "\\u-escaped in a JSON string in arguments": lambda k: json.dumps({"token": "".join(f"\\u{ord(c):04x}" for c in k)}),
}


@pytest.mark.parametrize("place", sorted(KEY_PLACES))
def test_the_key_is_redacted_wherever_in_an_answer_it_is_placed(place):
    planted = KEY_PLACES[place](SECRET)
    answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "done", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": planted}}]}}]}
    assert leaks(json.dumps(answer))  # the test can fail
    cleaned = Redactor(SECRET).record(answer)
    args = cleaned["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert leaks(json.dumps(cleaned)) == [] and leaks(args) == [] and REDACTED in args


def test_the_key_reversed_or_a_different_key_of_the_same_prefix_is_left_alone():
    other = PREFIX + uuid.uuid4().hex + uuid.uuid4().hex[:8]
    text = f"echo {SECRET[::-1]} and {other}"
    assert Redactor(SECRET)(text) == text  # redaction is of this key's forms, not of everything key-shaped


KINDS = (len(VALID_STREAMS) + len(BAD_STREAMS) + 2 + 1 + 1 + 1 + 1 + len(RECORDS) + 1 + len(KEY_PLACES) + 1)
