"""``convert --from openai-stream``: logged chunk streams (raw SSE or JSONL of chunks, in the shapes the openai SDK's
``ChatCompletionChunk.model_dump()`` and OpenRouter produce, one or many answers per file) become API records;
the assembler agrees with the SDK's own stream accumulator; nothing in the file is dropped."""
import json

from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk
from upstream_sse import answer, sse, stream_chunks

from kimi_eagle.apps import cli
from kimi_eagle.chat.formats import get_format
from kimi_eagle.io import read_jsonl
from kimi_eagle.reconstruct.convert import convert
from kimi_eagle.reconstruct.record import reconstruct_record
from kimi_eagle.reconstruct.stream import assemble_chunks

REQUEST = {"model": "m", "messages": [{"role": "user", "content": "Weather in Paris?"}]}
ARGS = '{"city": "Paris"}'


def sdk_models(cid: str, text: str, with_tool: bool = True) -> list[ChatCompletionChunk]:
    """An OpenAI-shaped stream as the SDK's own chunk objects (as its client yields them)."""
    base = {"id": cid, "object": "chat.completion.chunk", "created": 1_800_000_000, "model": "gpt-x",
            "system_fingerprint": "fp_1", "obfuscation": "pad"}
    raw = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}]
    for word in text.split(" "):
        lp = {"content": [{"token": word, "logprob": -0.5, "bytes": list(word.encode()), "top_logprobs": []}],
              "refusal": None}
        raw.append({**base, "choices": [{"index": 0, "delta": {"content": word}, "logprobs": lp, "finish_reason": None}]})
    if with_tool:
        raw.append({**base, "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}]},
            "finish_reason": None}]})
        for part in (ARGS[:5], ARGS[5:11], ARGS[11:]):
            raw.append({**base, "choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 0, "function": {"arguments": part}}]}, "finish_reason": None}]})
    raw.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls" if with_tool else "stop"}]})
    raw.append({**base, "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 7, "total_tokens": 16}})
    return [ChatCompletionChunk.model_validate(c) for c in raw]


def sdk_chunks(cid: str, text: str, with_tool: bool = True) -> list[dict]:
    """The same stream as logged with ``chunk.model_dump()`` (every null field included)."""
    return [c.model_dump() for c in sdk_models(cid, text, with_tool)]


def test_the_assembler_agrees_with_the_openai_sdk_accumulator():
    chunks = sdk_chunks("chatcmpl-1", "It is sunny today")
    state = ChatCompletionStreamState()
    for c in sdk_models("chatcmpl-1", "It is sunny today"):
        state.handle_chunk(c)
    sdk = state.get_final_completion().model_dump()
    mine = assemble_chunks(chunks)
    for key in ("id", "created", "model", "system_fingerprint", "usage"):
        assert mine[key] == sdk[key], key
    ours, theirs = mine["choices"][0], sdk["choices"][0]
    assert ours["finish_reason"] == theirs["finish_reason"] == "tool_calls"
    assert ours["logprobs"]["content"] == theirs["logprobs"]["content"] and len(ours["logprobs"]["content"]) == 4
    assert ours["message"]["content"] == theirs["message"]["content"] == "Itissunnytoday"
    (call,) = ours["message"]["tool_calls"]
    (sdk_call,) = theirs["message"]["tool_calls"]
    assert call == {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ARGS}}
    assert (sdk_call["id"], sdk_call["function"]["name"], sdk_call["function"]["arguments"]) == ("call_1", "get_weather", ARGS)
    assert mine["object"] == "chat.completion" and "obfuscation" not in mine


def test_a_jsonl_of_sdk_chunks_with_many_interleaved_answers(tmp_path):
    a, b = sdk_chunks("chatcmpl-a", "one two"), sdk_chunks("chatcmpl-b", "three four five", with_tool=False)
    lines = [{"request": REQUEST}, a[0], {**REQUEST, "messages": [{"role": "user", "content": "again"}]}, b[0]]
    for i in range(1, max(len(a), len(b))):  # interleaved, as a proxy logging two streams at once writes them
        lines += [c[i] for c in (a, b) if i < len(c)]
    path = tmp_path / "chunks.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    first, second = convert("openai-stream", path)
    assert (first["id"], first["id_from"], second["id"]) == ("chatcmpl-a", "response.id", "chatcmpl-b")
    assert first["request"] == REQUEST and second["request"]["messages"][0]["content"] == "again"
    assert first["response"] == assemble_chunks(a) and second["response"] == assemble_chunks(b)
    assert second["response"]["choices"][0]["message"]["content"] == "threefourfive"
    assert first["stream"] == {"chunks": len(a), "done": False} and "error" not in first


def test_openrouter_sse_logged_with_its_request_is_the_non_streaming_answer_byte_for_byte(tmp_path):
    raw = b"".join(sse(stream_chunks(answer()), keepalive_every=3)).decode()
    path = tmp_path / "log.jsonl"
    path.write_text(json.dumps({"id": "mine-1", "request": REQUEST, "stream": raw}) + "\n"
                    + json.dumps({"request": REQUEST, "chunks": stream_chunks(answer("gen-2"))}) + "\n")
    one, two = convert("openai-stream", path)
    assert one["id"] == "mine-1" and json.dumps(one["response"]) == json.dumps(answer())
    assert one["stream"] == {"chunks": len(stream_chunks(answer())), "done": True}
    assert two["id"] == "gen-2" and json.dumps(two["response"]) == json.dumps(answer("gen-2"))


def test_raw_sse_files_one_answer_each_and_every_problem_kept(tmp_path):
    good = b"".join(sse(stream_chunks(answer("gen-ok"))))
    cut = b"".join(sse(stream_chunks(answer("gen-cut"))))[:900]  # a log that stops mid-stream
    cut = cut[:cut.rindex(b"\n\n") + 2]
    path = tmp_path / "wire.txt"
    path.write_bytes(b": OPENROUTER PROCESSING\n\n" + b'data: {"request": ' + json.dumps(REQUEST).encode()
                     + b"}\n\n" + good + cut + b"data: {not json\n\n" + b'data: {"choices": [{"delta": {}}]}\n\n')
    records = list(convert("openai-stream", path))
    assert [r["id"] for r in records] == ["gen-ok", "openai-stream:gen-cut", "openai-stream:event-28",
                                          "openai-stream:event-29"]  # events counted from 1, comments included
    ok, incomplete, not_json, no_id = records
    assert "error" not in ok and json.dumps(ok["response"]) == json.dumps(answer("gen-ok"))
    assert incomplete["error"].startswith("event ") and "stream_incomplete" in incomplete["error"]
    assert incomplete["response"]["choices"][0]["message"]["reasoning"]  # what the log holds is kept
    assert "not JSON" in not_json["error"] and "without a string `id`" in no_id["error"]


def test_a_stream_without_its_request_is_an_error_record_that_keeps_the_answer(tmp_path):
    path = tmp_path / "chunks.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in stream_chunks(answer())))
    (rec,) = convert("openai-stream", path)
    assert "no request logged before this stream" in rec["error"]
    assert json.dumps(rec["response"]) == json.dumps(answer())


def test_the_cli_converts_a_logged_stream(tmp_path, capsys):
    path = tmp_path / "chunks.jsonl"
    path.write_text(json.dumps({"request": REQUEST}) + "\n"
                    + "".join(json.dumps(c) + "\n" for c in sdk_chunks("chatcmpl-z", "hello there")))
    out = tmp_path / "api.jsonl"
    assert cli.main(["convert", str(path), "--from", "openai-stream", "-o", str(out)]) == 0
    (rec,) = [line.obj for line in read_jsonl(out)]
    assert rec["id"] == "chatcmpl-z" and rec["response"]["choices"][0]["message"]["content"] == "hellothere"
    assert "1 API records from openai-stream" in capsys.readouterr().out


# --------------------------------------------------------------------------------------------
# Answer shapes of real providers (minimal synthetic streams of each shape)

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}]


def _chunk(delta: dict | None = None, finish: str | None = None, cid: str = "gen-s", **extra) -> dict:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"id": cid, "object": "chat.completion.chunk", "model": "kimi", "choices": choices, **extra}


def _convert_chunks(tmp_path, chunks: list[dict], request: dict = REQUEST) -> dict:
    path = tmp_path / "log.jsonl"
    path.write_text(json.dumps({"request": request, "chunks": chunks}) + "\n")
    (record,) = convert("openai-stream", path)
    return record


def _reconstructed(record: dict, tok):
    return reconstruct_record(record, tok, get_format("kimi-k2-instruct"))


def test_a_tool_call_name_that_arrives_after_its_id_and_index_is_assembled(tmp_path, kimi):
    chunks = [_chunk({"role": "assistant", "content": ""}),
              _chunk({"tool_calls": [{"index": 0, "id": "functions.lookup:0", "type": "function",
                                      "function": {"arguments": ""}}]}),
              _chunk({"tool_calls": [{"index": 0, "function": {"name": "lookup"}}]}),
              _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"q": 1}'}}]}),
              _chunk({}, "tool_calls")]
    record = _convert_chunks(tmp_path, chunks, {**REQUEST, "tools": TOOLS})
    (call,) = record["response"]["choices"][0]["message"]["tool_calls"]
    assert call == {"id": "functions.lookup:0", "type": "function", "function": {"arguments": '{"q": 1}', "name": "lookup"}}
    assert _reconstructed(record, kimi).status == "ok"


def test_an_empty_name_and_id_repeated_in_every_argument_fragment_never_erase_the_first(tmp_path, kimi):
    """Some providers send ``"id": ..., "function": {"name": ""}`` (or a null id) with every argument piece."""
    frag = lambda args, name="", cid="functions.lookup:0": {"index": 0, "id": cid, "type": "function",
                                                            "function": {"name": name, "arguments": args}}
    chunks = [_chunk({"role": "assistant", "content": ""}), _chunk({"tool_calls": [frag("", "lookup")]}),
              _chunk({"tool_calls": [frag('{"q"')]}), _chunk({"tool_calls": [frag(": 1}", cid=None)]}),
              _chunk({"tool_calls": [{**frag("", "lookup2", ""), "index": 1}]}),
              _chunk({"tool_calls": [{**frag("{}", "", "functions.lookup2:1"), "index": 1}]}), _chunk({}, "tool_calls")]
    record = _convert_chunks(tmp_path, chunks, {**REQUEST, "tools": TOOLS})
    calls = record["response"]["choices"][0]["message"]["tool_calls"]
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("functions.lookup:0", "lookup", '{"q": 1}'), ("functions.lookup2:1", "lookup2", "{}")]  # "" id replaced
    assert _reconstructed(record, kimi).status == "ok"


def test_usage_inside_choices_0_becomes_the_answers_usage(tmp_path):
    """Moonshot's own API streams its final usage inside ``choices[0]``, not at the top level."""
    usage = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15,
             "completion_tokens_details": {"reasoning_tokens": 1}}
    last = _chunk({}, "stop")
    last["choices"][0]["usage"] = usage
    chunks = [_chunk({"role": "assistant", "content": ""}), _chunk({"reasoning_content": ""}), _chunk({"content": "OK"}), last]
    response = _convert_chunks(tmp_path, chunks)["response"]
    assert response["usage"] == usage and "usage" not in response["choices"][0]
    assert list(response)[-1] == "usage"
    top = {**usage, "prompt_tokens": 13}
    both = assemble_chunks(chunks + [_chunk(usage=top)])  # a top-level usage too: the top level wins
    assert both["usage"] == top and "usage" not in both["choices"][0]


def test_real_provider_answer_shapes_are_kept_as_sent(tmp_path):
    """``reasoning_content`` beside ``reasoning_details``, leading spaces, every tool-id style: verbatim."""
    ids = ["functions.lookup:0", "lookup:1", "call_Zx81Qp0RtY5uWv3", "0", "lookup_1"]
    chunks = [_chunk({"role": "assistant", "content": ""}),
              _chunk({"reasoning_content": " I will", "reasoning_details": [{"type": "reasoning.text", "text": " I will",
                                                                              "index": 0}]}),
              _chunk({"reasoning_content": " look.", "reasoning_details": [{"type": "reasoning.text", "text": " look.",
                                                                             "index": 0}]}),
              _chunk({"content": " Sure."})]
    chunks += [_chunk({"tool_calls": [{"index": k, "id": i, "type": "function",
                                       "function": {"name": "lookup", "arguments": "{}"}}]}) for k, i in enumerate(ids)]
    chunks.append(_chunk({}, "tool_calls"))
    message = _convert_chunks(tmp_path, chunks, {**REQUEST, "tools": TOOLS})["response"]["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == (" I will look.", " Sure.")
    assert message["reasoning_details"] == [{"type": "reasoning.text", "text": " I will look.", "index": 0}]
    assert [c["id"] for c in message["tool_calls"]] == ids


def test_an_empty_streamed_answer_is_kept_as_it_is_and_flagged_by_name_by_reconstruct(tmp_path, kimi):
    """No content, no reasoning, no tool calls: the record keeps the empty message (nothing dropped);
    reconstruction rebuilds the end of turn alone and flags ``answer_empty`` (a server answers that when it could
    not parse a call: what the model wrote is lost)."""
    record = _convert_chunks(tmp_path, [_chunk({"role": "assistant", "content": ""}), _chunk({}, "stop")])
    assert "error" not in record and record["response"]["choices"][0]["message"] == {"role": "assistant", "content": ""}
    assert "answer_empty" in _reconstructed(record, kimi).flags
