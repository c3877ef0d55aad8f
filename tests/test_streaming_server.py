"""``serve`` answers ``stream: true`` in the OpenAI/OpenRouter chunk form; the assembled stream is the non-streaming
answer; keep-alive comments, usage chunks, mid-stream errors and injected stream cuts behave as OpenRouter's do."""
import json

import httpx
import pytest

from kimi_eagle.apps.api.faults import FaultConfig
from kimi_eagle.apps.api.server import LocalServer
from kimi_eagle.apps.api.sse import answer_chunks, message_deltas, token_text_pieces
from kimi_eagle.assets import stories_dir
from kimi_eagle.io import read_jsonl

pytestmark = pytest.mark.timeout(180)
MESSAGES = [{"role": "user", "content": "Once upon a time"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    records = tmp_path_factory.mktemp("stream") / "engine.jsonl"
    with LocalServer(stories_dir(), records, "--admin", "--logprobs") as srv:
        srv.records_path = records
        yield srv


def raw_stream(server, record_id=None, **params) -> list[str]:
    """The response's lines (blank separators dropped), read to the end."""
    body = {"model": "stories260K", "messages": MESSAGES, "stream": True, **params}
    headers = {"X-Record-Id": record_id} if record_id else {}
    with httpx.stream("POST", server.base_url + "/chat/completions", json=body, headers=headers, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        return [line for line in r.iter_lines() if line]


def chunks_of(lines: list[str]) -> list[dict]:
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[len("data: "):]) for line in lines[:-1] if line.startswith("data: ")]


def assemble(chunks: list[dict]) -> dict:
    """An independent assembler: start from the role chunk's delta, append string deltas, tool calls by index."""
    message: dict = {}
    calls: dict[int, dict] = {}
    choice: dict = {}
    logprobs = None
    for c in chunks:
        for ch in c["choices"]:
            for key, value in ch["delta"].items():
                if key == "tool_calls":
                    for d in value:
                        call = calls.setdefault(d["index"], {"id": None, "type": "function",
                                                             "function": {"name": "", "arguments": ""}})
                        call["id"] = d.get("id") or call["id"]
                        call["function"]["name"] += d.get("function", {}).get("name", "")
                        call["function"]["arguments"] += d.get("function", {}).get("arguments", "")
                elif key not in message or message[key] is None:
                    message[key] = value
                elif value is not None:
                    message[key] += value
            if ch["logprobs"] is not None:
                logprobs = (logprobs or []) + ch["logprobs"]["content"]
            if ch["finish_reason"] is not None:
                choice = {"finish_reason": ch["finish_reason"], "native_finish_reason": ch["native_finish_reason"]}
    if calls:
        message["tool_calls"] = [calls[k] for k in sorted(calls)]
    return {"message": message, **choice, "logprobs": logprobs,
            "usage": next((c["usage"] for c in chunks if c.get("usage")), None)}


def whole(server, **params) -> dict:
    body = {"model": "stories260K", "messages": MESSAGES, **params}
    return httpx.post(server.base_url + "/chat/completions", json=body, timeout=60).json()


@pytest.mark.parametrize("params", [{"seed": 4, "max_tokens": 40}, {"seed": 9, "max_tokens": 200, "temperature": 1.0},
                                    {"seed": 2, "max_tokens": 30, "logprobs": True, "top_logprobs": 3}])
def test_the_assembled_stream_is_the_non_streaming_answer(server, params):
    answer = whole(server, **params)
    lines = raw_stream(server, **params, stream_options={"include_usage": True})
    chunks = chunks_of(lines)
    got = assemble(chunks)
    choice = answer["choices"][0]
    assert got["message"] == choice["message"]
    assert (got["finish_reason"], got["native_finish_reason"]) == (choice["finish_reason"], choice["native_finish_reason"])
    assert got["usage"] == answer["usage"]
    assert got["logprobs"] == (choice["logprobs"]["content"] if choice["logprobs"] else None)
    assert {c["id"] for c in chunks} == {chunks[0]["id"]} and chunks[0]["id"].startswith("gen-")
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "stories260K" for c in chunks)
    # one content delta per sampled token (the final stop token has no text)
    n_tokens = answer["usage"]["completion_tokens"] - (choice["finish_reason"] == "stop")
    assert sum("content" in c["choices"][0]["delta"] for c in chunks[1:-2]) == n_tokens


def test_chunk_order_role_first_finish_then_usage_then_done(server):
    lines = raw_stream(server, seed=1, max_tokens=8, stream_options={"include_usage": True})
    assert lines[0] == ": OPENROUTER PROCESSING"  # the keep-alive comment comes before any chunk
    chunks = chunks_of(lines)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None, "reasoning": None}
    assert chunks[-2]["choices"][0]["delta"] == {} and chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 8
    assert all(c["usage"] is None for c in chunks[:-1])
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-2])


def test_without_include_usage_there_is_no_usage_chunk(server):
    chunks = chunks_of(raw_stream(server, seed=1, max_tokens=8))
    assert all("usage" not in c for c in chunks) and chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_a_streamed_answer_is_logged_under_its_record_id(server):
    chunks = chunks_of(raw_stream(server, record_id="streamed-1", seed=3, max_tokens=10))
    rec = {line.obj["id"]: line.obj for line in read_jsonl(server.records_path)}["streamed-1"]
    assert rec["response_id"] == chunks[0]["id"] and len(rec["output_ids"]) == 10


def test_an_error_after_the_stream_started_is_openrouters_mid_stream_error(server):
    long = [{"role": "user", "content": "a b " * 600}]  # over stories260K's 512-token context
    body = {"model": "stories260K", "messages": long, "stream": True}
    with httpx.stream("POST", server.base_url + "/chat/completions", json=body, timeout=60) as r:
        lines = [line for line in r.iter_lines() if line]
    chunks = chunks_of(lines)
    assert len(chunks) == 1 and chunks[0]["error"]["code"] == 400 and "context length" in chunks[0]["error"]["message"]
    assert chunks[0]["choices"][0]["finish_reason"] == "error"


def test_stream_cut_drops_the_connection_halfway_and_logs_nothing(server):
    server.admin("/admin/faults", {**FaultConfig().to_dict(), "rate_stream_cut": 1.0, "seed": 0})
    body = {"model": "stories260K", "messages": MESSAGES, "stream": True, "seed": 5, "max_tokens": 30}
    lines: list[str] = []
    try:
        with pytest.raises(httpx.RemoteProtocolError):
            with httpx.stream("POST", server.base_url + "/chat/completions", json=body,
                              headers={"X-Record-Id": "cut-1"}, timeout=60) as r:
                lines.extend(line for line in r.iter_lines() if line)
        with pytest.raises(httpx.RemoteProtocolError):  # a non-streaming request under stream_cut is dropped
            httpx.post(server.base_url + "/chat/completions", headers={"X-Record-Id": "cut-2"}, timeout=60,
                       json={"model": "stories260K", "messages": MESSAGES, "max_tokens": 5})
        assert server.admin("/admin/stats")["faults"]["stream_cut"] == 2
    finally:
        server.admin("/admin/faults", FaultConfig().to_dict())
    assert "data: [DONE]" not in lines and 5 < len(lines) < 30
    assert not any("finish_reason\": \"length" in line for line in lines)
    ids = {line.obj["id"] for line in read_jsonl(server.records_path)}
    assert not ids & {"cut-1", "cut-2"}


def test_logprobs_are_ignored_without_serve_logprobs(tmp_path):
    with LocalServer(stories_dir(), tmp_path / "e.jsonl") as srv:
        answer = httpx.post(srv.base_url + "/chat/completions", timeout=60, json={
            "model": "stories260K", "messages": MESSAGES, "max_tokens": 4, "logprobs": True}).json()
        card = httpx.get(srv.base_url + "/models").json()["data"][0]
    assert answer["choices"][0]["logprobs"] is None and "logprobs" not in card["supported_parameters"]


def test_reasoning_and_tool_calls_stream_in_order_and_assemble_exactly():
    message = {"role": "assistant", "content": None, "refusal": None, "reasoning": "Check the weather first. " * 3,
               "tool_calls": [{"id": "functions.get_weather:0", "type": "function",
                               "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris, France"})}},
                              {"id": "functions.get_time:1", "type": "function",
                               "function": {"name": "get_time", "arguments": "{}"}}]}
    response = {"id": "gen-x", "provider": "p", "model": "m", "created": 1, "usage": {"completion_tokens": 9},
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls",
                             "native_finish_reason": "tool_calls", "logprobs": None}]}
    chunks = answer_chunks(response, include_usage=True)
    kinds = [next(iter(c["choices"][0]["delta"]), None) for c in chunks[1:-2]]
    assert kinds == sorted(kinds, key=["reasoning", "tool_calls"].index) and "reasoning" in kinds
    firsts = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks[:-1] if "tool_calls" in c["choices"][0]["delta"]]
    assert firsts[0] == {"index": 0, "id": "functions.get_weather:0", "type": "function",
                         "function": {"name": "get_weather", "arguments": ""}}
    assert all("id" not in d and "name" not in d["function"] for d in firsts[1:] if d["index"] == 0)
    got = assemble(chunks)
    assert got["message"] == message and got["finish_reason"] == "tool_calls"


def test_token_text_pieces_follow_partial_utf8_tokens():
    toks = [b"\xe2", b"\x80", b"\x94 a", b"\xff", b"\xf0\x9f"]
    pieces = token_text_pieces(toks)
    assert pieces[:3] == ["", "", "\u2014 a"] and "".join(pieces) == b"".join(toks).decode("utf-8", "replace")
    assert message_deltas({"role": "assistant", "content": ""}) == []


def test_stream_cut_is_a_fault_kind_with_the_others():
    with pytest.raises(ValueError, match="sum to at most 1"):
        FaultConfig.from_dict({"rate_stream_cut": 0.6, "rate_drop": 0.6})
    with pytest.raises(ValueError, match="probability"):
        FaultConfig.from_dict({"rate_stream_cut": 1.5})
    assert FaultConfig.from_dict({"rate_stream_cut": 0.2}).enabled
