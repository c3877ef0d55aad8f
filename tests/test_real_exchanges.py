"""Real provider exchanges (``assets/data/real_api/kimi_recorded_exchanges.jsonl``, read in place) through the own-logs
converters and ``reconstruct_record``: every record gets a status, none fails unexpectedly, and the per-provider
agreement of reconstructed and billed counts is pinned. The loader and the Bedrock Converse mapping are also tested
on small synthetic exchanges (no assets needed)."""
import json
from collections import Counter

import pytest

from kimi_eagle.reconstruct.bedrock import BedrockError, converse_log
from kimi_eagle.reconstruct.recorded import (
    ExchangeError,
    chat_format,
    exchange_record,
    load_exchanges,
    measure_exchanges,
    provider_table,
)

N_EXCHANGES = 365

# MEASURED, not targets: regression pins of the current reconstruction (2026-12), to be updated when the
# calibration of providers improves. Per (provider, model): (records, ok,
#   template: (prompt_equal, prompt_compared, median prompt delta billed - reconstructed, completion_equal, completion_compared),
#   moonshot: (the same under the moonshot serving profile)).
MEASURED = {
    ('Amazon Bedrock (us-east-1)', 'moonshot.kimi-k2-thinking'): (2, 2, (0, 2, -12.5, 1, 2), (0, 2, -13.5, 1, 2)),
    ('AtlasCloud', 'moonshotai/kimi-k2-0905'): (1, 1, (0, 1, 1, 1, 1), (0, 1, 1, 1, 1)),
    ('AtlasCloud', 'moonshotai/kimi-k2.5-0127'): (10, 10, (0, 10, -1.0, 0, 10), (0, 10, -1.0, 0, 10)),
    ('Avian (direct)', 'moonshotai/kimi-k2.5'): (7, 7, (1, 7, -5, 0, 7), (1, 7, 7, 0, 7)),
    ('BaseTen', 'moonshotai/kimi-k2-0905'): (23, 23, (0, 23, 6, 23, 23), (0, 23, 7, 23, 23)),
    ('Chutes', 'moonshotai/kimi-k2-0905'): (31, 31, (1, 31, -4, 31, 31), (4, 31, -3, 31, 31)),
    ('Chutes', 'moonshotai/kimi-k2.5-0127'): (8, 8, (0, 8, -22.0, 8, 8), (7, 8, 0.0, 8, 8)),
    ('DeepInfra', 'moonshotai/kimi-k2-0905'): (34, 34, (9, 34, -12.0, 0, 34), (9, 34, -10.5, 0, 34)),
    ('Fireworks', 'moonshotai/kimi-k2-0905'): (24, 24, (6, 24, -1.0, 24, 24), (11, 24, 0.0, 24, 24)),
    ('Groq', 'moonshotai/kimi-k2-0905'): (11, 11, (4, 11, 0, 6, 11), (2, 11, 2, 6, 11)),
    ('Groq (direct)', 'moonshotai/kimi-k2-instruct-0905'): (50, 50, (14, 50, 0.0, 30, 50), (10, 50, 0.0, 30, 50)),
    ('HuggingFace router (groq)', 'moonshotai/kimi-k2-instruct-0905'): (10, 10, (2, 10, -4.0, 6, 10), (2, 10, -3.0, 6, 10)),
    ('Inceptron', 'moonshotai/kimi-k2.5-0127'): (1, 1, (1, 1, 0, 0, 1), (1, 1, 0, 0, 1)),
    ('ModelRun', 'moonshotai/kimi-k2.5-0127'): (1, 1, (1, 1, 0, 0, 1), (1, 1, 0, 0, 1)),
    ('Moonshot AI', 'moonshotai/kimi-k2-0905'): (57, 57, (14, 57, -22, 35, 57), (14, 57, -21, 35, 57)),
    ('Moonshot AI (direct API)', 'kimi-k2.5'): (2, 0, (0, 0, None, 0, 0), (0, 0, None, 0, 0)),
    ('Moonshot AI (direct API)', 'kimi-k2.6'): (2, 0, (0, 0, None, 0, 0), (0, 0, None, 0, 0)),
    ('Novita', 'moonshotai/kimi-k2-0905'): (27, 27, (6, 27, -22, 14, 27), (6, 27, -21, 14, 27)),
    ('SiliconFlow', 'moonshotai/kimi-k2-0905'): (24, 24, (0, 24, 6.0, 0, 24), (0, 24, 7.0, 0, 24)),
    ('Together', 'moonshotai/kimi-k2-0905'): (24, 24, (0, 24, 7.0, 15, 24), (0, 24, 9.0, 15, 24)),
    ('WandB', 'moonshotai/kimi-k2-0905'): (16, 16, (6, 16, 0.0, 16, 16), (11, 16, 0.0, 16, 16)),
}


@pytest.fixture(scope="module")
def rows(exchanges, kimi):
    return measure_exchanges(exchanges, kimi)


def test_every_exchange_has_a_status_and_none_fails_unexpectedly(exchanges, rows):
    assert len(exchanges) == len(rows) == N_EXCHANGES
    assert [r["id"] for r in rows] == [ex.id for ex in exchanges]
    unexpected = [(r["id"], r["reason"]) for r in rows if r["status"] not in ("ok", "refused")]
    assert not unexpected
    assert all(r["reason"] for r in rows if r["status"] == "refused")
    refused = Counter(r["reason"] for r in rows if r["status"] == "refused")
    # the 4 vercel/ai fixtures kept only the answer; everything else converts and reconstructs
    assert refused == {"convert: no request recorded (the fixture kept only the answer): the prompt cannot be "
                       "rendered": 4}
    assert Counter(r["api_format"] for r in rows if r["status"] == "ok") == {"openai-chat-completions": 359,
                                                                             "bedrock-converse": 2}


def test_per_provider_agreement_with_billed_counts_is_as_measured(rows):
    table = provider_table(rows)
    measured: dict = {}
    for e in table:
        figures = (e["prompt_equal"], e["prompt_compared"], e["median_prompt_delta"], e["completion_equal"],
                   e["completion_compared"])
        measured.setdefault((e["provider"], e["model"]), [e["records"], e["ok"]]).append(figures)
    assert {k: tuple(v) for k, v in measured.items()} == MEASURED


def test_records_carry_the_provider_the_format_and_the_converters_output(exchanges):
    records = [exchange_record(ex) for ex in exchanges]
    for ex, record in zip(exchanges, records):
        assert record["id"] == ex.id and record["format"] == chat_format(ex.model)
        if "error" not in record:
            assert record["response"]["provider"] == ex.provider and record["dataset"] == "real_api"
            assert ("stream" in record) == ex.streamed
    streams = [r for r in records if "stream" in r]
    assert len(streams) == 183 and all(r["stream"]["done"] for r in streams)  # each ended with [DONE]


# --------------------------------------------------------------------------------------------
# Synthetic exchanges (no assets)


def _exchange(**fields) -> dict:
    base = {"id": "x:1", "model": "moonshotai/kimi-k2.5", "provider": "P", "api_format": "openai-chat-completions",
            "request": {"model": "moonshotai/kimi-k2.5", "messages": [{"role": "user", "content": "hi"}]},
            "response": {"id": "gen-1", "object": "chat.completion", "choices": [
                {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hello"}}]}}
    return {**base, **fields}


def _file(tmp_path, *lines) -> str:
    path = tmp_path / "ex.jsonl"
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return str(path)


@pytest.mark.parametrize("line, reason", [
    ("{nope", "not JSON"), (_exchange(stream_chunks=[]), "holds both `response` and `stream_chunks`"),
    (_exchange(api_format="soap"), "api_format 'soap' is not one of"), (_exchange(), "id 'x:1' repeats line 1"),
    (_exchange(id="x:2", request="hi"), "`request` is neither an object nor null"), ([1], "not a JSON object")],
    ids=["not-json", "both-shapes", "api-format", "repeated-id", "request", "not-an-object"])
def test_a_bad_line_is_an_error_naming_its_line(tmp_path, line, reason):
    assert [ex.id for ex in load_exchanges(_file(tmp_path, _exchange()))] == ["x:1"]
    with pytest.raises(ExchangeError, match=r"ex\.jsonl: line 2: ") as caught:
        load_exchanges(_file(tmp_path, _exchange(), line))
    assert reason in str(caught.value)


def test_statuses_of_synthetic_exchanges(tmp_path):
    no_request, unknown_model = _exchange(id="x:2", request=None), _exchange(id="x:3", model="acme/other-1")
    chunks = [{"id": "gen-2", "object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": {"role": "assistant", "content": "hel"}, "finish_reason": None}]},
        {"id": "gen-2", "object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]}]
    streamed = {k: v for k, v in _exchange(id="x:4", stream_chunks=chunks, stream_done_marker=True).items()
                if k != "response"}
    plain, none, unknown, stream = (exchange_record(ex) for ex in load_exchanges(
        _file(tmp_path, _exchange(), no_request, unknown_model, streamed)))
    assert plain["response"]["provider"] == "P" and plain["format"] == "kimi-k2.5" and "error" not in plain
    assert none["error"].startswith("no request recorded") and "other-1" in unknown["error"]
    assert stream["response"]["choices"][0]["message"]["content"] == "hello"
    assert stream["stream"] == {"chunks": 2, "done": True} and stream["response"]["provider"] == "P"


def test_chat_formats_of_the_recorded_models():
    assert [chat_format(m) for m in ("moonshotai/kimi-k2-0905", "moonshotai/kimi-k2-instruct-0905", "kimi-k2.5",
                                     "moonshotai/kimi-k2.5-0127", "kimi-k2.6", "moonshot.kimi-k2-thinking")] == [
        "kimi-k2-instruct", "kimi-k2-instruct", "kimi-k2.5", "kimi-k2.5", "kimi-k2.5", "kimi-k2-thinking"]
    assert chat_format("gpt-x") is None


CONVERSE_REQUEST = {
    "system": [{"text": "Be brief."}],
    "messages": [{"role": "user", "content": [{"text": "Weather?"}]},
                 {"role": "assistant", "content": [{"text": "Checking."},
                                                   {"toolUse": {"toolUseId": "t1", "name": "w", "input": {"c": "Rome"}}}]},
                 {"role": "user", "content": [{"toolResult": {"toolUseId": "t1", "content": [{"text": "Sunny"}]}}]}],
    "toolConfig": {"tools": [{"toolSpec": {"name": "w", "description": "weather",
                                           "inputSchema": {"json": {"type": "object"}}}}]}}


def test_a_converse_exchange_maps_to_a_chat_completion():
    answer = {"output": {"message": {"role": "assistant", "content": [
        {"reasoningContent": {"reasoningText": {"text": " Look again."}}},
        {"toolUse": {"toolUseId": "t2", "name": "w", "input": {"c": "Zürich"}}}]}},
        "stopReason": "tool_use", "usage": {"inputTokens": 30, "outputTokens": 12, "totalTokens": 42}}
    log = converse_log(CONVERSE_REQUEST, answer, "m")
    assert log["request"] == {"model": "m", "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "w", "arguments": '{"c": "Rome"}'}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "Sunny"}],
        "tools": [{"type": "function", "function": {"name": "w", "description": "weather",
                                                    "parameters": {"type": "object"}}}]}
    (choice,) = log["response"]["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["reasoning_content"] == " Look again."
    assert choice["message"]["tool_calls"][0]["function"]["arguments"] == '{"c": "Zürich"}'
    assert log["response"]["usage"] == {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42}


def test_converse_parts_without_a_chat_equivalent_are_refused_by_name(tmp_path):
    image = {"role": "user", "content": [{"image": {"format": "png"}}]}
    with pytest.raises(BedrockError, match=r"request.messages\[0\].content\[0\]: a 'image' block"):
        converse_log({"messages": [image]}, {"stopReason": "end_turn", "output": {"message": {"content": []}}})
    with pytest.raises(BedrockError, match="stopReason 'guardrail_intervened'"):
        converse_log(CONVERSE_REQUEST, {"stopReason": "guardrail_intervened"})
    ex = _exchange(api_format="bedrock-converse", model="moonshot.kimi-k2-thinking", request={"messages": [image]},
                   response={"stopReason": "end_turn", "output": {"message": {"content": [{"text": "x"}]}}})
    (loaded,) = load_exchanges(_file(tmp_path, ex))
    record = exchange_record(loaded)
    assert record["error"].startswith("bedrock-converse: request.messages[0].content[0]") and record["id"] == "x:1"
