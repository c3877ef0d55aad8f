"""The official ``openai`` Python SDK as a peer of ``serve``: it parses every answer (non-streaming, streaming,
logprobs, tool calls), and the stream it assembles equals the non-streaming answer on the same seed."""
import json

import httpx
import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState

from kimi_eagle.apps.api.server import LocalServer
from kimi_eagle.apps.api.sse import answer_chunks, stream_bytes
from kimi_eagle.apps.tiny_kimi import TinyKimiSpec, build_tiny_kimi
from kimi_eagle.assets import stories_dir

pytestmark = pytest.mark.timeout(300)
MESSAGES = [{"role": "user", "content": "Once upon a time"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
SPEC = TinyKimiSpec(steps=2, seed=0, sharegpt_conversations=2, hidden_size=32, intermediate_size=64, num_layers=1,
                    num_heads=2, seq_len=64, batch_size=2, max_positions=1024)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with LocalServer(stories_dir(), tmp_path_factory.mktemp("sdk") / "engine.jsonl", "--logprobs") as srv:
        yield openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=60)


def streamed(client, **params):
    """The SDK's own assembly of a stream (ChatCompletionStreamState), and the chunks it parsed."""
    state = ChatCompletionStreamState()
    chunks = []
    for chunk in client.chat.completions.create(stream=True, **params):
        chunks.append(chunk)
        state.handle_chunk(chunk)
    return state.current_completion_snapshot, chunks  # get_final_completion refuses finish_reason "length"


def test_models_and_a_plain_answer(client):
    assert [m.id for m in client.models.list()] == ["stories260K"]
    answer = client.chat.completions.create(model="stories260K", messages=MESSAGES, seed=1, max_tokens=12)
    choice = answer.choices[0]
    assert choice.finish_reason == "length" and choice.logprobs is None and choice.message.content
    assert answer.usage.completion_tokens == 12 and answer.model_extra["provider"] == "kimi-eagle-local"


def test_logprobs_parse_into_the_sdk_types(client):
    answer = client.chat.completions.create(model="stories260K", messages=MESSAGES, seed=2, max_tokens=10,
                                            logprobs=True, top_logprobs=3)
    content = answer.choices[0].logprobs.content
    assert len(content) == 10 and all(len(t.top_logprobs) == 3 for t in content)
    assert b"".join(bytes(t.bytes) for t in content).decode() == answer.choices[0].message.content


@pytest.mark.parametrize("params", [{"seed": 3, "max_tokens": 60}, {"seed": 4, "max_tokens": 25, "logprobs": True,
                                                                   "top_logprobs": 2}])
def test_the_sdks_assembled_stream_equals_the_non_streaming_answer(client, params):
    whole = client.chat.completions.create(model="stories260K", messages=MESSAGES, **params)
    final, chunks = streamed(client, model="stories260K", messages=MESSAGES, stream_options={"include_usage": True},
                             **params)
    assert final.choices[0].message.content == whole.choices[0].message.content
    assert final.choices[0].finish_reason == whole.choices[0].finish_reason
    assert final.usage.model_dump() == whole.usage.model_dump()
    got_lp = final.choices[0].logprobs
    assert (got_lp.content if got_lp else None) == (whole.choices[0].logprobs.content if whole.choices[0].logprobs else None)
    assert chunks[-1].choices == [] and chunks[-1].usage is not None


def test_the_sdk_stream_helper_reads_serve(client):
    with client.chat.completions.stream(model="stories260K", messages=MESSAGES, seed=5, max_tokens=20) as stream:
        text = "".join(e.delta for e in stream if e.type == "content.delta")
        final = stream.current_completion_snapshot
    whole = client.chat.completions.create(model="stories260K", messages=MESSAGES, seed=5, max_tokens=20)
    assert text == final.choices[0].message.content == whole.choices[0].message.content


def test_the_sdk_parses_streamed_tool_calls_and_reasoning():
    """The chunks serve builds for a K2.5 answer with reasoning and two tool calls, read by the real SDK."""
    message = {"role": "assistant", "content": None, "refusal": None, "reasoning": "I should look it up. " * 4,
               "tool_calls": [{"id": "functions.get_weather:0", "type": "function",
                               "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}},
                              {"id": "functions.get_weather:1", "type": "function",
                               "function": {"name": "get_weather", "arguments": json.dumps({"city": "Oslo"})}}]}
    response = {"id": "gen-t", "provider": "p", "model": "m", "created": 1, "object": "chat.completion",
                "usage": {"prompt_tokens": 5, "completion_tokens": 40, "total_tokens": 45},
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls",
                             "native_finish_reason": "tool_calls", "logprobs": None}]}
    body = b": OPENROUTER PROCESSING\n\n" + b"".join(stream_bytes(answer_chunks(response, include_usage=True)))

    def reply(request):
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    sdk = openai.OpenAI(base_url="http://test/v1", api_key="x", max_retries=0,
                        http_client=httpx.Client(transport=httpx.MockTransport(reply)))
    final, _ = streamed(sdk, model="m", messages=MESSAGES, tools=TOOLS)
    got = final.choices[0].message
    assert final.choices[0].finish_reason == "tool_calls"
    assert [(c.id, c.function.name, c.function.arguments) for c in got.tool_calls] == [
        (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]]
    assert got.model_extra["reasoning"] == message["reasoning"]


@pytest.fixture(scope="module")
def kimi_client(tmp_path_factory):
    model = tmp_path_factory.mktemp("tiny_kimi") / "model"
    build_tiny_kimi(model, SPEC)
    with LocalServer(model, tmp_path_factory.mktemp("kimi") / "engine.jsonl", "--logprobs") as srv:
        yield openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0, timeout=120), srv


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_kimi_format_server_with_tools_streams_what_it_answers(kimi_client, seed):
    client, srv = kimi_client
    name = client.models.list().data[0].id
    params = dict(model=name, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS, seed=seed,
                  max_tokens=48, temperature=1.0, logprobs=True)
    whole = client.chat.completions.create(**params)
    final, _ = streamed(client, **params)
    want, got = whole.choices[0], final.choices[0]
    assert got.finish_reason == want.finish_reason
    assert got.message.content == want.message.content
    assert got.message.model_extra.get("reasoning") == want.message.model_extra.get("reasoning")
    assert [c.model_dump() for c in got.message.tool_calls or []] == [c.model_dump() for c in want.message.tool_calls or []]
    assert got.logprobs.content == want.logprobs.content
