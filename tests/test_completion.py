"""Completions: segments from API fields, whole-string encoding, spans that partition bytes and IDs."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kimi_eagle.chat.completion import CompletionOptions, ToolCall, Turn, kimi_completion
from kimi_eagle.chat.encoder import PieceEncoder
from kimi_eagle.chat.formats import get_format
from kimi_eagle.reconstruct.record import ReconstructOptions, reconstruct_record
from kimi_eagle.records import RecordError
from kimi_eagle.tokenize.tokenizer import ids_to_bytes

MARKERS = ["</think>", "<think>", "<|im_end|>", "<|tool_call_begin|>", "<|im_", "|>", "[EOS]"]


def api_record(message: dict, finish: str = "stop", messages=None, **extra) -> dict:
    return {"id": "r1", "request": {"model": "moonshotai/kimi-k2.5", "messages": messages or [{"role": "user", "content": "hi"}]},
            "response": {"choices": [{"message": {"role": "assistant", **message}, "finish_reason": finish}], **extra}}


def kinds(row) -> list[str]:
    return [s["kind"] for s in row.segments]


def completion_text(tok, row) -> str:
    return ids_to_bytes(tok, row.completion_ids).decode()


def test_reasoning_content_and_tool_call_segments(kimi):
    msg = {"reasoning": "Let me call f.", "content": "Calling.",
           "tool_calls": [{"id": "call_9", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]}
    row = reconstruct_record(api_record(msg, "tool_calls"), kimi, get_format("kimi-k2.5"))
    assert kinds(row) == ["reasoning", "think_end", "content", "tool_section_begin", "tool_call_begin", "tool_id",
                          "tool_arg_begin", "tool_args", "tool_call_end", "tool_section_end", "im_end"]
    assert completion_text(kimi, row) == (
        "Let me call f.</think>Calling.<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
        '<|tool_call_argument_begin|>{"x": 1}<|tool_call_end|><|tool_calls_section_end|><|im_end|>')
    assert row.completion_ids[-1] == 163586 and 163607 in row.completion_ids
    assert row.flags == ["tool_ids_auto", "tool_id_normalised"]  # call_9: no such style in the history
    assert row.loss_mask == [0] * row.n_prompt_tokens + [1] * row.n_completion_tokens


def test_tool_ids_count_over_the_whole_conversation_and_can_be_kept(kimi):
    history = [{"role": "user", "content": "go"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "functions.a:0", "type": "function", "function": {"name": "a", "arguments": "{}"}},
                   {"id": "functions.b:1", "type": "function", "function": {"name": "b", "arguments": "{}"}}]},
               {"role": "tool", "tool_call_id": "functions.a:0", "content": "1"},
               {"role": "tool", "tool_call_id": "functions.b:1", "content": "2"}]
    msg = {"tool_calls": [{"id": "chatcmpl-tool-77", "type": "function", "function": {"name": "c", "arguments": "{}"}}]}
    rec = api_record(msg, "tool_calls", messages=history)
    assert "functions.c:2" in completion_text(kimi, reconstruct_record(rec, kimi, get_format("kimi-k2.5")))
    kept = reconstruct_record(rec, kimi, get_format("kimi-k2.5"), ReconstructOptions(keep_tool_ids=True))
    assert "chatcmpl-tool-77" in completion_text(kimi, kept) and "tool_id_normalised" not in kept.flags


def test_no_reasoning_starts_with_think_end(kimi):
    row = reconstruct_record(api_record({"content": "Hi!"}), kimi, get_format("kimi-k2.5"))
    assert completion_text(kimi, row) == "</think>Hi!<|im_end|>"
    assert row.completion_ids[0] == 163607 and "no_reasoning" in row.flags


def test_thinking_off_has_no_think_tokens(kimi):
    row = reconstruct_record(api_record({"content": "Hi!"}), kimi, get_format("kimi-k2.5-nothink"))
    assert completion_text(kimi, row) == "Hi!<|im_end|>"
    assert kimi.decode(row.prompt_ids).endswith("<|im_assistant|>assistant<|im_middle|><think></think>")


def test_length_cut_inside_reasoning_has_no_think_end_and_no_im_end(kimi):
    row = reconstruct_record(api_record({"reasoning": "I was thinking ab"}, "length"), kimi, get_format("kimi-k2.5"))
    assert completion_text(kimi, row) == "I was thinking ab"
    assert kinds(row) == ["reasoning"] and "truncated" in row.flags
    cut_in_content = reconstruct_record(api_record({"reasoning": "r", "content": "Hal"}, "length"), kimi, get_format("kimi-k2.5"))
    assert completion_text(kimi, cut_in_content) == "r</think>Hal"


def test_option_omits_think_end_before_tools(kimi):
    msg = {"reasoning": "call it", "tool_calls": [{"id": "x", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    default = reconstruct_record(api_record(msg, "tool_calls"), kimi, get_format("kimi-k2.5"))
    omitted = reconstruct_record(api_record(msg, "tool_calls"), kimi, get_format("kimi-k2.5"),
                                 ReconstructOptions(omit_think_end_before_tools=True))
    assert completion_text(kimi, default).startswith("call it</think><|tool_calls_section_begin|>")
    assert completion_text(kimi, omitted).startswith("call it<|tool_calls_section_begin|>")
    assert "no_think_end" in omitted.flags


def test_arguments_string_verbatim_object_as_tojson_and_not_json_flagged(kimi):
    def args_text(arguments):
        msg = {"tool_calls": [{"id": "x", "type": "function", "function": {"name": "f", "arguments": arguments}}]}
        row = reconstruct_record(api_record(msg, "tool_calls"), kimi, get_format("kimi-k2.5"))
        seg = next(s for s in row.segments if s["kind"] == "tool_args")
        return ids_to_bytes(kimi, row.completion_ids[seg["tok_start"]:seg["tok_end"]]).decode(), row.flags

    assert args_text('{"b":1,  "a": "é"}') == ('{"b":1,  "a": "é"}', ["no_reasoning", "tool_ids_auto", "tool_id_normalised"])
    assert args_text({"b": 1, "a": "é"}) == ('{"b": 1, "a": "é"}', ["no_reasoning", "tool_ids_auto", "tool_id_normalised"])
    assert args_text("{not json") == ("{not json", ["no_reasoning", "tool_ids_auto", "tool_id_normalised", "args_not_json"])


def test_literal_markers_are_plain_text_and_flagged(kimi):
    msg = {"reasoning": "the tag </think> ends it", "content": "say <|im_end|> now"}
    row = reconstruct_record(api_record(msg), kimi, get_format("kimi-k2.5"))
    assert row.completion_ids.count(163607) == 1 and row.completion_ids.count(163586) == 1
    assert completion_text(kimi, row) == "the tag </think> ends it</think>say <|im_end|> now<|im_end|>"
    assert "literal_marker" in row.flags


def test_plain_completion_is_a_continuation_with_eos_on_stop(stories):
    fmt = get_format("plain", stories)
    rec = api_record({"content": " there was a girl"}, messages=[{"role": "user", "content": "Once upon a time,"}])
    row = reconstruct_record(rec, stories, fmt)
    assert row.prompt_ids[0] == 1 and row.prompt_ids[1:] == stories.encode("Once upon a time,")
    assert ids_to_bytes(stories, row.completion_ids[:-1]) == b" there was a girl" and row.completion_ids[-1] == 2
    glued = reconstruct_record(api_record({"content": "there"}, "length"), stories, fmt)
    assert ids_to_bytes(stories, glued.completion_ids) == b"there"  # no dummy-prefix space
    assert kinds(glued) == ["content"] and "truncated" in glued.flags


def test_hf_continuation_encode_has_no_dummy_prefix(stories):
    assert stories.token_bytes(stories.encode("Once")[0]).startswith(b" ")
    for text in ["Once", "a b", " x", "ünï"]:
        assert ids_to_bytes(stories, stories.encode(text, continuation=True)) == text.encode()


@pytest.mark.parametrize("message", [{}, {"content": ""}, {"content": None, "reasoning": ""}])
def test_an_empty_answer_is_its_end_of_turn_alone_and_says_the_server_dropped_it(kimi, message):
    """A server that returns no reasoning, content or tool calls for a billed answer (a real Together record bills 32
    completion tokens for ``content: ""``) loses what the model generated: the prompt is still exact, the completion
    is what the format closes an answer with, and the row says the answer is missing."""
    k2 = reconstruct_record(api_record(message), kimi, get_format("kimi-k2-instruct"))
    assert ids_to_bytes(kimi, k2.completion_ids) == b"<|im_end|>" and k2.flags == ["answer_empty"]
    k25 = reconstruct_record(api_record(message), kimi, get_format("kimi-k2.5"))
    assert ids_to_bytes(kimi, k25.completion_ids) == b"</think><|im_end|>" and "answer_empty" in k25.flags


@pytest.mark.parametrize("message,finish,reason", [
    ({"content": "x"}, "content_filter", "unknown finish_reason"),
    ({"content": "x"}, None, "unknown finish_reason"),
    ({"content": "a\ud800b"}, "stop", "lone surrogate"),
    ({"reasoning": "x" * 400_001}, "stop", "over the 400,000-character limit"),
    ({"tool_calls": [{"id": "x", "function": {"arguments": "{}"}}]}, "tool_calls", "no function name"),
])
def test_bad_messages_raise_clear_record_errors(kimi, message, finish, reason):
    with pytest.raises(RecordError, match=reason):
        reconstruct_record(api_record(message, finish), kimi, get_format("kimi-k2.5"))


def test_bad_records_raise_clear_record_errors(kimi):
    fmt = get_format("kimi-k2.5")
    with pytest.raises(RecordError, match="no choices"):
        reconstruct_record({"id": "a", "request": {"messages": []}, "response": {}}, kimi, fmt)
    with pytest.raises(RecordError, match="no message"):
        reconstruct_record({"id": "a", "request": {"messages": []}, "response": {"choices": [{}]}}, kimi, fmt)
    with pytest.raises(RecordError, match="no string id"):
        reconstruct_record({"request": {"messages": []}}, kimi, fmt)
    with pytest.raises(RecordError, match=r"messages\[1\] is not a message with a role"):
        reconstruct_record(api_record({"content": "x"}, messages=[{"role": "user", "content": "a"}, {"content": "b"}]),
                           kimi, fmt)
    with pytest.raises(RecordError, match=r"messages\[0\].content is neither a string nor a list"):
        reconstruct_record(api_record({"content": "x"}, messages=[{"role": "user", "content": 5}]), kimi, fmt)
    bad_schema = api_record({"content": "x"})
    bad_schema["request"]["tools"] = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"description": "no type"}}}}}]
    # a schema Moonshot's TypeScript conversion cannot take: JSON is declared instead, as its tokenizer does, and said
    fallback = reconstruct_record(bad_schema, kimi, get_format("kimi-k2.5", tool_declaration="ts"))
    as_json = reconstruct_record(bad_schema, kimi, fmt)
    assert fallback.prompt_ids == as_json.prompt_ids and "tool_declaration_json_fallback" in fallback.flags
    assert "tool_declaration_json_fallback" not in as_json.flags  # the JSON declaration takes any schema


# ---------------------------------------------------------------------------------------------
# Properties

texts = st.lists(st.sampled_from(list("ab \n\t.{}\"'é世🚀") + MARKERS), max_size=20).map("".join)


@st.composite
def turns(draw):
    reasoning = draw(st.none() | texts)
    text = draw(st.none() | texts)
    calls = [ToolCall(draw(st.none() | st.just("call_1")), draw(st.sampled_from(["f", "get_x"])), draw(texts))
             for _ in range(draw(st.integers(0, 2)))]
    if not (reasoning or text or calls):
        text = "x"
    return Turn(reasoning, text, calls, draw(st.sampled_from(["stop", "length", "tool_calls"])))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(turn=turns(), thinking=st.booleans(), omit=st.booleans(), first=st.integers(0, 5))
def test_whole_string_encoding_properties(kimi, turn, thinking, omit, first):
    enc = PieceEncoder(kimi)
    segs, _ = kimi_completion(turn, first, CompletionOptions(omit_think_end_before_tools=omit), thinking=thinking)
    ids, spans = enc.encode_segments(segs)
    text = "".join(s.text for s in segs).encode()
    # the bytes of the IDs are the completion string's bytes
    assert ids_to_bytes(kimi, ids) == text
    # whole-string encoding equals the concatenation of per-segment encodings
    assert ids == [i for s in segs for i in enc.encode(s.pieces)]
    # spans partition bytes and IDs, and each span's IDs are exactly its segment's bytes
    assert [s.kind for s in spans] == [s.kind for s in segs]
    assert spans[0].byte_start == 0 and spans[0].tok_start == 0 if spans else ids == []
    for a, b in zip(spans, spans[1:]):
        assert (a.byte_end, a.tok_end) == (b.byte_start, b.tok_start)
    if spans:
        assert spans[-1].byte_end == len(text) and spans[-1].tok_end == len(ids)
    for span in spans:
        assert ids_to_bytes(kimi, ids[span.tok_start:span.tok_end]) == text[span.byte_start:span.byte_end]
    # a special token appears exactly where the format put one, never from text
    n_specials = sum(1 for s in segs for _, kind in s.pieces if kind == 1)
    assert sum(1 for i in ids if kimi.is_special(i)) == n_specials


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
# SentencePiece reads a literal "\u2581" in text as a space, so it is left out: a real, documented limitation.
@given(text=st.lists(st.sampled_from(list("Once upon a time, \n.!é🚀") + ["</s>", "<s>"]), min_size=1, max_size=30).map("".join))
def test_plain_completion_bytes_equal_content_bytes(stories, text):
    row = reconstruct_record(api_record({"content": text}, "length"), stories, get_format("plain", stories))
    assert ids_to_bytes(stories, row.completion_ids) == text.encode()
    assert 2 not in row.completion_ids and 1 not in row.completion_ids
