"""Hostile streams and bodies for ``collect`` and ``convert --from openai-stream`` (issue 37), each case named after
what it plants: one bad answer costs one record (a lying ``Content-Encoding``, 5,000 nested ``data: [`` lines, a
body nested past the kit's limit -- never the run); streams assembled by what they are (colliding chunk ids in a log,
``[DONE]`` before a finish reason, BOMs, ``Text/Event-Stream``, argument fragments without
``index``, partial and conflicting usage); requests matched to their own streams and never lost; nothing coerced
(choice index 10^30 and -1, list-typed ``logprobs`` and usage details); readers linear in their input; and one
run per output for ``collect`` and ``convert``."""
import asyncio
import gzip
import io
import json
import threading
import time
from pathlib import Path

import pytest
from upstream_sse import ARGS, Upstream, answer, sse, stream_chunks

from kimi_eagle.apps.api.collect import CollectConfig, collect, scan_output
from kimi_eagle.io import iter_raw_lines, read_jsonl, write_jsonl
from kimi_eagle.reconstruct.convert import _convert_file, convert
from kimi_eagle.reconstruct.job import output_lock
from kimi_eagle.reconstruct.stream import SSEDecoder, StreamAssembler

pytestmark = pytest.mark.timeout(240)
STREAM = {"stream": True, "stream_options": {"include_usage": True}}
FAST = dict(concurrency=2, max_attempts=2, backoff_base=0.01, backoff_max=0.05, timeout=10, progress=False)
REQUEST = {"model": "m", "messages": [{"role": "user", "content": "Weather in Paris?"}]}


def _chunk(delta: dict | None = None, finish: str | None = None, cid: str = "gen-s", index: int = 0, **extra) -> dict:
    choices = [] if delta is None else [{"index": index, "delta": delta, "finish_reason": finish}]
    return {"id": cid, "object": "chat.completion.chunk", "model": "m", "choices": choices, **extra}


def _events(chunks: list[dict]) -> list[bytes]:
    return [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks]


USAGE = {"prompt_tokens": 12, "completion_tokens": 30, "total_tokens": 42, "cost": 0.00012}


def planted_stream(name: str) -> list[bytes]:
    """The SSE events of one planted stream (see :class:`Hostile`)."""
    full = stream_chunks(answer())
    if name == "bom":
        events = sse(full)
        return [b"\xef\xbb\xbf" + events[0], *events[1:]]
    if name == "done-before-finish":
        return sse([c for c in full if not c["choices"] or c["choices"][0]["finish_reason"] is None][:-1])
    if name == "deep":
        return [b"data: [\n" * 5000 + b"\n", *sse(full)]
    if name == "args-without-index":
        head = [_chunk({"role": "assistant", "content": ""}),
                _chunk({"tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}]})]
        parts = [_chunk({"tool_calls": [{"function": {"arguments": p}}]}) for p in (ARGS[:9], ARGS[9:20], ARGS[20:])]
        return sse(head + parts + [_chunk({}, "tool_calls"), _chunk(None, usage=USAGE)])
    if name in ("usage-partial", "usage-conflict"):
        second = {"completion_tokens": 30} if name == "usage-partial" else {"completion_tokens": 7}
        return sse([_chunk({"role": "assistant", "content": "hi"}), _chunk({}, "stop"), _chunk(None, usage=USAGE),
                    _chunk(None, usage=second)])
    if name == "error-empty":  # issue 47: a whole answer whose chunks carry an empty error object (or null fields)
        return sse([{**c, "error": {}} for c in full[:-1]] + [{**full[-1], "error": {"code": None, "message": None}}])
    if name in ("index-huge", "index-negative"):
        index = 10 ** 30 if name == "index-huge" else -1
        return sse([_chunk({"role": "assistant", "content": "hi"}, index=index), _chunk({}, "stop", index=index)])
    raise KeyError(name)


class Hostile(Upstream):
    """Plants one hostile answer per scenario (``gzip-lie``, ``deep-json``, ``deep-200``, ``media-case``, ``huge-line``,
    and the streams of :func:`planted_stream`); anything else is the test upstream's own."""

    def reply(self, scenario: str, attempt: int, stream: bool):
        from starlette.responses import Response, StreamingResponse

        if scenario == "gzip-lie":
            return Response(b"this is not gzip" * 8, media_type="application/json", headers={"Content-Encoding": "gzip"})
        if scenario == "gzip-bad-tail":
            return Response(gzip.compress(json.dumps(answer()).encode())[:-12] + b"garbage!!!!!",
                            media_type="application/json", headers={"Content-Encoding": "gzip"})
        if scenario == "deep-json":
            return Response(b"[" * 5000 + b"]" * 5000, media_type="application/json")
        if scenario == "deep-200":  # parses (under Python's limit) but deeper than the kit reads
            return Response(json.dumps({"choices": [{"x": json.loads("[" * 300 + "]" * 300)}]}).encode(),
                            media_type="application/json")
        if scenario == "media-case":
            return StreamingResponse(_iterate(sse(stream_chunks(answer()))), headers={"content-type": "Text/Event-Stream"})
        if scenario == "slow-ok":
            return StreamingResponse(_late(json.dumps(answer()).encode()), media_type="application/json")
        if scenario == "huge-line":
            return StreamingResponse(_one_line(), media_type="text/event-stream")
        if scenario.startswith("stream:"):
            return StreamingResponse(_iterate(planted_stream(scenario[7:])), media_type="text/event-stream")
        return super().reply(scenario, attempt, stream)


async def _iterate(events):
    for e in events:
        yield e


async def _late(body: bytes):
    await asyncio.sleep(1.5)
    yield body


async def _one_line():
    yield b'data: {"choices": "'
    block = b"a" * (1 << 20)
    for _ in range(500):  # one 500 MB data line
        yield block


@pytest.fixture(scope="module")
def hostile():
    with Hostile() as srv:
        yield srv


def run(upstream, tmp_path, scenarios, defaults=None, **config):
    prompts = tmp_path / "prompts.jsonl"
    write_jsonl(prompts, [{"id": s, "prompt": f"scenario:{s}"} for s in scenarios])
    summary = collect(prompts, tmp_path / "out.jsonl", CollectConfig(upstream.base_url, "m", defaults=defaults or {},
                                                                      **{**FAST, **config}), api_key="")
    return summary, {line.obj["id"]: line.obj for line in read_jsonl(tmp_path / "out.jsonl")}


# ---- one bad answer costs one record


def test_bad_bodies_are_their_prompts_error_records_and_the_run_goes_on(hostile, tmp_path):
    bad = ["gzip-lie", "gzip-bad-tail", "deep-json", "deep-200", "stream:deep"]
    summary, by = run(hostile, tmp_path, [*bad, "full"])
    assert by["full"]["status"] == "ok" and summary["ok"] == 1 and len(by) == len(bad) + 1
    for name in bad:
        rec = by[name]
        assert rec["status"] == "error" and rec["error"]["kind"] in ("exhausted", "stream_incomplete"), name
        assert len(rec["timing"]["attempt_log"]) == 2, name  # retried, then stored for the next run to redo
    assert "DecodingError" in by["gzip-lie"]["error"]["message"]
    assert "nested more than 100 levels deep" in by["deep-200"]["error"]["message"]
    assert "chunk 0" in by["stream:deep"]["error"]["message"]
    done, _ = scan_output(tmp_path / "out.jsonl")
    assert len(done) == 1  # a rerun redoes the five (and gets no further traceback)
    summary2, by2 = run(hostile, tmp_path, [*bad, "full"])
    assert summary2["requested"] == len(bad) and len(by2) == len(bad) + 1


def test_a_500_mb_data_line_stops_at_the_body_cap(hostile, tmp_path):
    t0 = time.monotonic()
    _, by = run(hostile, tmp_path, ["huge-line"], STREAM, max_attempts=1)
    assert "--max-body-bytes 67108864" in by["huge-line"]["error"]["message"]  # the default 64 MB cap, reached
    assert time.monotonic() - t0 < 60


# ---- streams assembled by what they are


def test_a_media_type_in_any_case_is_read_as_sse(hostile, tmp_path):
    _, by = run(hostile, tmp_path, ["media-case"], STREAM)
    assert by["media-case"]["status"] == "ok" and json.dumps(by["media-case"]["response"]) == json.dumps(answer())


def test_a_bom_before_the_first_event_drops_nothing(hostile, tmp_path):
    _, by = run(hostile, tmp_path, ["stream:bom"], STREAM)
    rec = by["stream:bom"]
    assert rec["status"] == "ok" and json.dumps(rec["response"]) == json.dumps(answer())


def test_a_complete_stream_with_empty_error_fields_is_an_ok_record(hostile, tmp_path):
    _, by = run(hostile, tmp_path, ["stream:error-empty"], STREAM)
    rec = by["stream:error-empty"]
    assert rec["status"] == "ok", rec.get("error")  # was: "stream carrying error None: None"
    assert json.dumps(rec["response"]) == json.dumps(answer())


def test_an_error_without_code_or_message_says_what_it_holds():
    from kimi_eagle.apps.api.collect import error_outcome

    said = error_outcome({"type": "overloaded"}, "stream carrying", {}).message
    assert "None" not in said and "(no code)" in said and "overloaded" in said, said
    assert "None" not in error_outcome({"code": None, "message": None}, "200 carrying", {}).message


@pytest.mark.parametrize("name, says", [
    ("done-before-finish", "[DONE] came before a finish_reason"),
    ("index-huge", "outside 0..1023"),
    ("index-negative", "choice index -1 is outside"),
])
def test_a_stream_that_is_not_one_whole_answer_is_an_error_record_retried(hostile, tmp_path, name, says):
    _, by = run(hostile, tmp_path, [f"stream:{name}"], STREAM)
    rec = by[f"stream:{name}"]
    assert rec["status"] == "error" and rec["error"]["kind"] in ("stream_incomplete", "exhausted"), rec["error"]
    assert says in rec["error"]["message"] and len(rec["timing"]["attempt_log"]) == 2
    assert not scan_output(tmp_path / "out.jsonl")[0]  # redone by the next run


def test_argument_fragments_without_index_make_one_call(hostile, tmp_path):
    _, by = run(hostile, tmp_path, ["stream:args-without-index"], STREAM)
    (call,) = by["stream:args-without-index"]["response"]["choices"][0]["message"]["tool_calls"]
    assert call == {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": ARGS}}


def test_a_partial_usage_chunk_never_replaces_the_full_one_and_a_conflict_is_flagged(hostile, tmp_path):
    _, by = run(hostile, tmp_path, ["stream:usage-partial", "stream:usage-conflict"], STREAM)
    partial, conflict = by["stream:usage-partial"], by["stream:usage-conflict"]
    assert partial["status"] == "ok" and partial["response"]["usage"] == USAGE
    assert "usage_conflict" not in partial["timing"]["stream"]
    assert conflict["response"]["usage"] == USAGE  # the fuller report kept
    assert "completion_tokens" in conflict["timing"]["stream"]["usage_conflict"]


def test_cumulative_usage_reports_keep_the_last():
    asm = StreamAssembler()
    for n in (1, 2, 3):
        asm.add(_chunk({"content": "x"}, usage={"prompt_tokens": 5, "completion_tokens": n}))
    asm.add(_chunk({}, "stop"))
    assert asm.response()["usage"] == {"prompt_tokens": 5, "completion_tokens": 3} and asm.usage_conflict is None


# ---- logged streams (convert --from openai-stream)


def _log(tmp_path, lines: list, name="log.jsonl") -> list[dict]:
    path = tmp_path / name
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return list(convert("openai-stream", path))


def _answer_chunks(cid: str, text: str, finish: bool = True) -> list[dict]:
    out = [_chunk({"role": "assistant", "content": ""}, cid=cid), _chunk({"content": text}, cid=cid)]
    return out + ([_chunk({}, "stop", cid=cid)] if finish else [])


def _request(text: str) -> dict:
    return {"request": {"model": "m", "messages": [{"role": "user", "content": text}]}}


def test_two_logged_answers_under_one_chunk_id_are_two_records(tmp_path):
    records = _log(tmp_path, [_request("q1"), *_answer_chunks("dup", "a1"), _request("q2"), *_answer_chunks("dup", "a2")])
    assert [r["id"] for r in records] == ["dup", "dup#2"] and not any("error" in r for r in records)
    assert [(r["request"]["messages"][0]["content"], r["response"]["choices"][0]["message"]["content"])
            for r in records] == [("q1", "a1"), ("q2", "a2")]
    assert records[1]["stream"]["id_collision"] == 2


def test_a_chunk_id_used_again_after_done_is_a_second_record(tmp_path):
    path = tmp_path / "wire.txt"
    one = b"".join(_events(_answer_chunks("dup", "first"))) + b"data: [DONE]\n\n"
    two = b"".join(_events(_answer_chunks("dup", "second"))) + b"data: [DONE]\n\n"
    path.write_bytes(json.dumps(REQUEST).encode() + b"\n" + one + json.dumps(REQUEST).encode() + b"\n" + two)
    records = list(convert("openai-stream", path))
    assert [(r["id"], r["response"]["choices"][0]["message"]["content"]) for r in records] == [
        ("dup", "first"), ("dup#2", "second")]


def test_a_finish_reason_sent_with_each_tool_call_keeps_one_answer(tmp_path):
    calls = [_chunk({"tool_calls": [{"index": i, "id": str(i), "type": "function",
                                     "function": {"name": "f", "arguments": "{}"}}]}, "tool_calls") for i in range(2)]
    records = _log(tmp_path, [_request("q"), _chunk({"role": "assistant", "content": ""}), *calls])
    assert [len(r["response"]["choices"][0]["message"]["tool_calls"]) for r in records] == [2]  # as DeepInfra sends


def test_requests_logged_before_interleaved_streams_get_their_own_answers(tmp_path):
    a, b = _answer_chunks("A", "answer A"), _answer_chunks("B", "answer B")
    records = _log(tmp_path, [_request("question A"), _request("question B"),
                              *[c for pair in zip(a, b) for c in pair]])
    assert [(r["request"]["messages"][0]["content"], r["response"]["choices"][0]["message"]["content"])
            for r in records] == [("question A", "answer A"), ("question B", "answer B")]


def test_a_request_without_an_answer_is_kept_as_an_error_record(tmp_path):
    records = _log(tmp_path, [_request("asked"), *_answer_chunks("A", "fine"), _request("never answered")])
    assert len(records) == 2 and "error" not in records[0]
    assert "a request with no answer" in records[1]["error"]
    assert records[1]["request"]["messages"][0]["content"] == "never answered"


@pytest.mark.parametrize("head", [b"\xef\xbb\xbf", json.dumps(REQUEST).encode() + b"\n",
                                  b"\xef\xbb\xbf" + json.dumps(REQUEST).encode() + b"\r\n"],
                         ids=["BOM", "request line first", "BOM and request line"])
def test_an_sse_log_with_a_bom_or_after_a_request_line_is_read_as_sse(tmp_path, head):
    path = tmp_path / "wire.txt"
    path.write_bytes(head + b"".join(sse(stream_chunks(answer()))))
    (rec,) = convert("openai-stream", path)
    assert json.dumps(rec["response"]) == json.dumps(answer())
    assert ("error" not in rec) == (b"{" in head), rec.get("error")  # with the request line, a whole record


@pytest.mark.parametrize("chunks, says", [
    (_answer_chunks("A", "cut", finish=False) + ["[DONE]"], "[DONE] came before a finish_reason"),
    ([_chunk({"content": "x"}, index=10 ** 30), _chunk({}, "stop", index=10 ** 30)], "outside 0..1023"),
    ([_chunk({"content": "x"}, index=-1), _chunk({}, "stop", index=-1)], "choice index -1 is outside"),
    ([_chunk({"content": "x"}), {**_chunk({}, "stop"), "choices": [{"index": 0, "delta": {}, "finish_reason": "stop",
                                                                     "logprobs": [1, 2]}]}], "logprobs: expected an object"),
    ([*_answer_chunks("gen-s", "x"), _chunk(None, usage={**USAGE, "completion_tokens_details": [1]})],
     "usage.completion_tokens_details is a list"),
    ([*_answer_chunks("gen-s", "x"), _chunk(None, usage=[1, 2])], "usage: expected an object"),
], ids=["DONE before finish", "index 10^30", "index -1", "list logprobs", "list usage details", "list usage"])
def test_a_logged_stream_that_is_not_one_whole_answer_is_an_error_record_by_name(tmp_path, chunks, says):
    (rec,) = _sse_log(tmp_path, chunks) if "[DONE]" in chunks else _log(tmp_path, [_request("q"), *chunks])
    assert says in rec["error"], rec["error"]


def _sse_log(tmp_path, chunks) -> list[dict]:
    path = tmp_path / "wire.txt"
    body = json.dumps(REQUEST).encode() + b"\n" + b"".join(
        b"data: [DONE]\n\n" if c == "[DONE]" else b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    path.write_bytes(body)
    return list(convert("openai-stream", path))


def test_a_logged_stream_with_5000_nested_data_lines_costs_one_record(tmp_path):
    path = tmp_path / "wire.txt"
    path.write_bytes(b"data: [\n" * 5000 + b"\n" + b"".join(sse(stream_chunks(answer()))))
    records = list(convert("openai-stream", path))
    assert "not JSON" in records[0]["error"] and records[1]["response"]["id"] == answer()["id"]


@pytest.mark.parametrize("index", [10 ** 30, -1, 1.5, "0", None, True], ids=["10^30", "-1", "1.5", "'0'", "null", "true"])
def test_a_logged_completion_with_a_choice_index_out_of_range_is_refused_by_name(tmp_path, index):
    response = answer()
    response["choices"][0]["index"] = index
    path = tmp_path / "log.jsonl"
    path.write_text(json.dumps({"request": REQUEST, "response": response}) + "\n")
    (rec,) = convert("openai", path)
    assert "choices[0].index is" in rec["error"] and "not an integer 0..1023" in rec["error"]


@pytest.mark.parametrize("field, value, says", [
    ("logprobs", [1, 2], "choices[0].logprobs is a list"),
    ("completion_tokens_details", [{"reasoning_tokens": 3}], "usage.completion_tokens_details is a list"),
    ("prompt_tokens_details", "4", "usage.prompt_tokens_details is a str"),
])
def test_list_typed_logprobs_and_usage_details_are_refused_by_name(tmp_path, field, value, says):
    response = answer()
    if field == "logprobs":
        response["choices"][0]["logprobs"] = value
    else:
        response["usage"][field] = value
    path = tmp_path / "log.jsonl"
    path.write_text(json.dumps({"request": REQUEST, "response": response}) + "\n")
    (rec,) = convert("openai", path)
    assert says in rec["error"]


# ---- linear readers


def _seconds(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def _read_line(size: int) -> None:
    data = b'{"x": "' + b"a" * size + b'"}\n{}\n'
    assert [len(line) for _, line in iter_raw_lines(io.BytesIO(data), 0, 1 << 14)] == [size + 9, 2]


def _read_event(lines: int) -> None:
    decoder = SSEDecoder()
    data, events = b"data: x\n" * lines + b"\n", []
    for i in range(0, len(data), 1 << 14):
        events += decoder.feed(data[i:i + (1 << 14)])
    assert len(events + decoder.close()) == 1


@pytest.mark.parametrize("reader, n", [(_read_line, 16 << 20), (_read_event, 200_000)], ids=["one long line", "many data lines"])
def test_readers_take_time_linear_in_their_input(reader, n):
    _seconds(reader, n // 8)  # warm up
    small, large = min(_seconds(reader, n) for _ in range(3)), min(_seconds(reader, 2 * n) for _ in range(3))
    # a re-scanning reader takes seconds here (and 4x per doubling); a few ms of scheduler noise on a fast linear
    # read must not count, hence the floor
    assert large < max(3.5 * small, 0.25), (small, large)


def test_the_sse_reader_takes_a_bom_and_crlf_split_anywhere():
    body = b"".join(sse(stream_chunks(answer())))
    expected = [e.data for e in SSEDecoder().feed(body)]
    variant = b"\xef\xbb\xbf" + body.replace(b"\n", b"\r\n")
    for step in (1, 2, 3, 5):
        decoder, events = SSEDecoder(), []
        for i in range(0, len(variant), step):
            events += decoder.feed(variant[i:i + step])
        assert [e.data for e in events + decoder.close()] == expected


# ---- one run per output


def test_a_second_collect_on_one_output_is_refused_and_sends_nothing(hostile, tmp_path):
    hostile.attempts.clear()
    out = tmp_path / "out.jsonl"
    with output_lock(out):
        with pytest.raises(ValueError, match="being written by another run"):
            run(hostile, tmp_path, ["full"])
    assert sum(hostile.attempts.values()) == 0
    _, by = run(hostile, tmp_path, ["full"])  # and once the first is over, it runs
    assert by["full"]["status"] == "ok"


def test_two_collects_at_once_bill_every_prompt_once(hostile, tmp_path):
    hostile.attempts.clear()
    scenarios = ["slow-ok"] + [f"ok-{i}" for i in range(5)]
    results: list = []

    def one():
        try:
            results.append(run(hostile, tmp_path, scenarios)[0]["requested"])
        except ValueError as e:
            results.append(str(e))

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert 6 in results and any("being written by another run" in str(r) for r in results), results
    assert sum(hostile.attempts.values()) == len(scenarios)


def test_a_second_convert_on_one_output_is_refused(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text(json.dumps({"request": REQUEST, "response": answer()}) + "\n")
    out = tmp_path / "api.jsonl"
    with output_lock(Path(out)):
        with pytest.raises(ValueError, match="being written by another run"):
            _convert_file("openai", path, out)
    assert not out.exists() and _convert_file("openai", path, out)[0] == 1
