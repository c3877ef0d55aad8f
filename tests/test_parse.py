"""The inverse parser: raw K2.5 completions (IDs or text) -> the API message SGLang/vLLM return, and
back: reconstructing a well-formed parsed message gives the same bytes (and IDs)."""

import json
from functools import lru_cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kimi_eagle.apps.cli import main as cli_main
from kimi_eagle.chat.completion import CONTENT, SPECIAL
from kimi_eagle.chat.encoder import PieceEncoder
from kimi_eagle.chat.formats import count_tool_calls, get_format
from kimi_eagle.chat.messages import normalise_messages
from kimi_eagle.chat.parse import (
    ParseOptions,
    answer_conventions,
    api_record,
    reconstruction_options,
    think_end_before_tools,
)
from kimi_eagle.reconstruct.convert import convert
from kimi_eagle.reconstruct.record import reconstruct_record
from kimi_eagle.serving.answer import parse_completion

K25 = get_format("kimi-k2.5")
WEATHER = ('<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Beijing"}'
           '<|tool_call_end|>')


def ids(tok, raw: str) -> list[int]:
    return tok.encode(raw, allow_special=True)


# ---------------------------------------------------------------------------------------------
# What the servers return


def test_reasoning_then_content(kimi):
    parsed = parse_completion(ids(kimi, "Let me think.</think>Hello!<|im_end|>"), kimi)
    assert parsed.message() == {"role": "assistant", "content": "Hello!", "reasoning": "Let me think."}
    assert (parsed.finish_reason, parsed.think_end, parsed.flags) == ("stop", True, [])


def test_reasoning_straight_into_tools_ends_at_the_section(kimi):
    raw = "I should call it.<|tool_calls_section_begin|>" + WEATHER + "<|tool_calls_section_end|><|im_end|>"
    parsed = parse_completion(ids(kimi, raw), kimi)
    assert parsed.reasoning == "I should call it." and parsed.content is None
    assert parsed.tool_calls == [{"id": "functions.get_weather:0", "type": "function",
                                  "function": {"name": "get_weather", "arguments": '{"city": "Beijing"}'}}]
    assert (parsed.finish_reason, parsed.think_end) == ("tool_calls", False) and "no_think_end" in parsed.flags


def test_tools_straight_after_think_have_no_reasoning(kimi):
    parsed = parse_completion(ids(kimi, "<|tool_calls_section_begin|>" + WEATHER + "<|tool_calls_section_end|><|im_end|>"), kimi)
    assert parsed.reasoning is None and parsed.content is None and len(parsed.tool_calls) == 1
    assert parsed.think_end is False


def test_a_cut_inside_the_arguments_returns_the_partial_arguments(kimi):
    raw = '</think><|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Bei'
    parsed = parse_completion(ids(kimi, raw), kimi)
    assert parsed.finish_reason == "length" and "truncated_in_tool_call" in parsed.flags
    assert parsed.tool_calls[0]["function"]["arguments"] == '{"city": "Bei'


def test_a_cut_inside_the_id_returns_no_call(kimi):
    parsed = parse_completion(ids(kimi, "</think><|tool_calls_section_begin|><|tool_call_begin|>functions.get_we"), kimi)
    assert parsed.tool_calls == [] and "truncated_in_tool_id" in parsed.flags


def test_a_cut_inside_reasoning(kimi):
    parsed = parse_completion(ids(kimi, "I was thinking ab"), kimi)
    assert (parsed.reasoning, parsed.content, parsed.finish_reason) == ("I was thinking ab", None, "length")
    assert parsed.think_end is None and parsed.flags == ["truncated_in_reasoning"]


def test_names_come_from_the_ids_and_unparsable_ids_are_skipped(kimi):
    raw = ("</think><|tool_calls_section_begin|>"
           "<|tool_call_begin|>lookup:3<|tool_call_argument_begin|>{}<|tool_call_end|>"
           "<|tool_call_begin|>call_3<|tool_call_argument_begin|>{}<|tool_call_end|>"
           "<|tool_calls_section_end|><|im_end|>")
    parsed = parse_completion(ids(kimi, raw), kimi)
    assert [(c["id"], c["function"]["name"]) for c in parsed.tool_calls] == [("lookup:3", "lookup")]
    assert "tool_id_unparsed" in parsed.flags  # neither server parses an id without :N
    sglang = parse_completion(ids(kimi, raw), kimi, ParseOptions(tool_ids="sglang", history_tool_calls=2))
    assert sglang.tool_calls[0]["id"] == "functions.lookup:5"  # SGLang adds the history's count to the model's N


def test_whitespace_is_kept_unless_stripping_like_the_servers(kimi):
    raw = "plan \n<|tool_calls_section_begin|><|tool_call_begin|> functions.f:0 <|tool_call_argument_begin|> {} \n<|tool_call_end|><|tool_calls_section_end|><|im_end|>"
    exact = parse_completion(ids(kimi, raw), kimi)
    assert exact.reasoning == "plan \n" and exact.tool_calls[0]["function"]["arguments"] == " {} \n"
    assert exact.tool_calls[0]["id"] == "functions.f:0" and "whitespace_stripped" in exact.flags
    stripped = parse_completion(ids(kimi, raw), kimi, ParseOptions(strip=True))
    assert stripped.reasoning == "plan" and stripped.tool_calls[0]["function"]["arguments"] == "{}"


def test_from_ids_marker_text_stays_text_but_from_text_it_is_a_marker(kimi):
    enc = PieceEncoder(kimi)
    out = enc.encode([("the tag </think> ends it", CONTENT), ("</think>", SPECIAL), ("ok", CONTENT), ("<|im_end|>", SPECIAL)])
    parsed = parse_completion(out, kimi)
    assert (parsed.reasoning, parsed.content) == ("the tag </think> ends it", "ok") and "literal_marker" in parsed.flags
    as_text = parse_completion("the tag </think> ends it</think>ok<|im_end|>")
    assert (as_text.reasoning, as_text.content) == ("the tag ", " ends it</think>ok")  # what a server would return


def test_text_between_and_after_calls_is_ignored_and_flagged(kimi):
    raw = "</think><|tool_calls_section_begin|>" + WEATHER + "\n" + WEATHER + "<|tool_calls_section_end|>bye<|im_end|>"
    parsed = parse_completion(ids(kimi, raw), kimi)
    assert len(parsed.tool_calls) == 2 and {"text_in_tool_section", "text_after_tool_section"} <= set(parsed.flags)


def test_other_formats(kimi):
    assert parse_completion(ids(kimi, "Hi<|im_end|>"), kimi, ParseOptions(format_name="kimi-k2.5-nothink")).content == "Hi"
    k2 = parse_completion(ids(kimi, "<think>hm</think>Hi<|im_end|>"), kimi, ParseOptions(format_name="kimi-k2-thinking"))
    assert (k2.reasoning, k2.content) == ("hm", "Hi")
    with pytest.raises(ValueError, match="cannot parse format"):
        parse_completion("x", options=ParseOptions(format_name="plain"))
    with pytest.raises(ValueError, match="needs the tokenizer"):
        parse_completion([1, 2])


# ---------------------------------------------------------------------------------------------
# Round trip: parse, then reconstruct


def roundtrip(tok, completion_ids, messages, tools=None) -> list[int]:
    parsed = parse_completion(completion_ids, tok)
    row = reconstruct_record(api_record(parsed, messages, tools), tok, K25, reconstruction_options(parsed))
    return row.completion_ids


HISTORY = [{"role": "user", "content": "go"},
           {"role": "assistant", "content": None, "tool_calls": [
               {"id": "functions.lookup:0", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]},
           {"role": "tool", "tool_call_id": "functions.lookup:0", "content": "ok"}]

texts = st.lists(st.sampled_from(list("ab \n\t.{}\"':é世🚀") + ["</think>", "<|im_end|>", "<|tool_call_begin|>", "<think>"]),
                 max_size=12).map("".join)
json_args = st.sampled_from(['{}', '{"city": "Beijing"}', '{"a": [1, 2], "b": "x y"}', "[]"])


@st.composite
def k25_outputs(draw):
    """A well-formed K2.5 output as pieces, possibly cut by a length limit where the API can tell."""
    reasoning = draw(texts)
    content = draw(texts)
    n_calls = draw(st.integers(0, 3))
    omit = n_calls > 0 and not content and draw(st.booleans())
    pieces = [(reasoning, CONTENT)] if reasoning else []
    if not omit:
        pieces.append(("</think>", SPECIAL))
    if content:
        pieces.append((content, CONTENT))
    first = count_tool_calls(HISTORY)
    calls = []
    for k in range(n_calls):
        name = draw(st.sampled_from(["lookup", "get_weather", "ns.search"]))
        tool_id = draw(st.sampled_from([f"functions.{name}:{first + k}", f"{name}:{first + k}"]))
        args = draw(json_args | texts)
        calls.append([("<|tool_call_begin|>", SPECIAL), (tool_id, CONTENT), ("<|tool_call_argument_begin|>", SPECIAL)]
                     + ([(args, CONTENT)] if args else []) + [("<|tool_call_end|>", SPECIAL)])
    if calls:
        pieces.append(("<|tool_calls_section_begin|>", SPECIAL))
        for c in calls:
            pieces += c
        pieces.append(("<|tool_calls_section_end|>", SPECIAL))
    pieces.append(("<|im_end|>", SPECIAL))
    if draw(st.booleans()):  # a length cut
        if calls:  # after the section, after the last call, or inside/after its arguments
            pieces = pieces[:len(pieces) - 1 - draw(st.integers(0, 2))]
            text, kind = pieces[-1]
            if kind == CONTENT and len(text) > 1 and draw(st.booleans()):
                pieces[-1] = (text[:draw(st.integers(1, len(text) - 1))], CONTENT)
        elif content:
            pieces = pieces[:-2] + [(content[:draw(st.integers(1, len(content)))], CONTENT)]
        elif reasoning and not omit:
            pieces = [(reasoning[:draw(st.integers(1, len(reasoning)))], CONTENT)]
    assume_message = reasoning or content or calls
    return pieces if assume_message else [("</think>", SPECIAL), ("x", CONTENT), ("<|im_end|>", SPECIAL)]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=k25_outputs())
def test_well_formed_outputs_round_trip_byte_for_byte(kimi, pieces):
    enc = PieceEncoder(kimi)
    original = enc.encode(pieces)
    assert roundtrip(kimi, original, HISTORY) == original, "".join(t for t, _ in pieces)


@lru_cache
def kit_records():
    return [r for source in ("glaive", "reason-tool-use") for r in convert(source)]


def test_the_kits_own_data_round_trips(kimi):
    """Every glaive and reasoning-tool-use turn: reconstruct, parse the IDs, get the API message back,
    reconstruct that again: the same IDs."""
    enc = PieceEncoder(kimi)
    n_calls = 0
    for record in kit_records():
        row = reconstruct_record(record, kimi, K25, encoder=enc)
        parsed = parse_completion(row.completion_ids, kimi)
        msg = record["response"]["choices"][0]["message"]
        assert parsed.reasoning == (msg.get("reasoning") or None), record["id"]
        assert parsed.content == (msg.get("content") or None), record["id"]
        assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in parsed.tool_calls] == \
            [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in msg.get("tool_calls") or []], record["id"]
        messages = normalise_messages(record["request"]["messages"])
        again = reconstruct_record(api_record(parsed, messages, record["request"].get("tools")), kimi, K25,
                                   reconstruction_options(parsed), encoder=enc)
        assert again.completion_ids == row.completion_ids, record["id"]
        n_calls += len(parsed.tool_calls)
    assert len(kit_records()) == 957 + 112 and n_calls > 100


# ---------------------------------------------------------------------------------------------
# Conventions of an API answer, for the diff report


def test_answer_conventions_against_the_engine_output(kimi):
    engine = parse_completion(ids(kimi, "plan \n<|tool_calls_section_begin|>" + WEATHER + "<|tool_calls_section_end|><|im_end|>"), kimi)
    api = {"reasoning": "plan", "content": None,
           "tool_calls": [{"id": "chatcmpl-tool-9f8e", "function": {"name": "get_weather", "arguments": '{"city": "Beijing"}'}}]}
    assert answer_conventions(api, engine) == {"tool_id_styles": ["chatcmpl_tool"], "tool_ids_as_written": False,
                                               "think_end_before_tools": False, "whitespace_stripped": True}
    faithful = parse_completion(ids(kimi, "plan \n</think><|tool_calls_section_begin|>" + WEATHER + "<|tool_calls_section_end|><|im_end|>"), kimi)
    same = answer_conventions(faithful.message(), faithful)
    assert same == {"tool_id_styles": ["kimi"], "tool_ids_as_written": True, "think_end_before_tools": True,
                    "whitespace_stripped": False}
    assert think_end_before_tools(ids(kimi, "Hi<|im_end|>"), kimi) is None


# ---------------------------------------------------------------------------------------------
# Command line


def test_parse_completion_command(kimi, capsys):
    raw = "hm</think><|tool_calls_section_begin|>" + WEATHER + "<|tool_calls_section_end|><|im_end|>"
    assert cli_main(["parse-completion", "--ids", ",".join(map(str, ids(kimi, raw)))]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["message"]["tool_calls"][0]["id"] == "functions.get_weather:0" and out["finish_reason"] == "tool_calls"
    assert cli_main(["parse-completion", "--text", "cut short"]) == 0
    assert json.loads(capsys.readouterr().out)["finish_reason"] == "length"
    assert cli_main(["parse-completion", "--ids", "1, 999999"]) == 2
    assert "outside the vocabulary" in capsys.readouterr().err


def test_the_playground_shows_the_api_message_of_pasted_ids(kimi):
    from kimi_eagle.apps.widgets.playground import CompletionPlayground

    raw = "hm<|tool_calls_section_begin|>" + WEATHER + "<|tool_calls_section_end|><|im_end|>"
    pg = CompletionPlayground(kimi, ids=str(ids(kimi, raw)))
    assert pg.parsed.tool_calls[0]["function"]["name"] == "get_weather"
    assert "&quot;get_weather&quot;" in pg.html.value and "no_think_end" in pg.html.value
    pg.ids.value = "1, 999999"
    assert pg.parsed is None and "outside the vocabulary" in pg.html.value
