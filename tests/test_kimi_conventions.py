"""Kimi outputs as inference servers return them: each case is a hand-written K2.5 output (the raw
completion after the prompt's ``<think>``), the API message a server returns for it, and the bytes
the reconstruction must give back."""

import pytest

from kimi_eagle.chat.completion import (
    CompletionOptions,
    ToolCall,
    Turn,
    id_signature,
    kimi_completion,
    model_could_write,
    tool_id_style,
)
from kimi_eagle.chat.formats import get_format
from kimi_eagle.reconstruct.record import ReconstructOptions, reconstruct_record
from kimi_eagle.tokenize.tokenizer import ids_to_bytes

K25 = get_format("kimi-k2.5")


def record(message: dict, finish: str, messages=None, usage: dict | None = None) -> dict:
    response = {"choices": [{"message": {"role": "assistant", **message}, "finish_reason": finish}]}
    if usage is not None:
        response["usage"] = usage
    return {"id": "r", "request": {"messages": messages or [{"role": "user", "content": "weather in Beijing?"}]},
            "response": response}


def call(tool_id: str, name: str, arguments: str) -> dict:
    return {"id": tool_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def completion(tok, row) -> str:
    return ids_to_bytes(tok, row.completion_ids).decode()


def n_tokens(tok, raw: str) -> int:
    return len(tok.encode(raw, allow_special=True))


# ---------------------------------------------------------------------------------------------
# A length cut inside the tool section

CUT_IN_ARGS = ('I need the weather.</think><|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0'
               '<|tool_call_argument_begin|>{"city": "Bei')


def test_a_cut_inside_the_arguments_ends_where_the_text_ends(kimi):
    msg = {"reasoning": "I need the weather.", "content": None,
           "tool_calls": [call("functions.get_weather:0", "get_weather", '{"city": "Bei')]}
    row = reconstruct_record(record(msg, "length"), kimi, K25)
    assert completion(kimi, row) == CUT_IN_ARGS  # no <|tool_call_end|>, no section end, no <|im_end|>
    assert row.completion_ids == kimi.encode(CUT_IN_ARGS, allow_special=True)
    assert [s["kind"] for s in row.segments][-2:] == ["tool_arg_begin", "tool_args"]
    assert "truncated_in_tool_call" in row.flags and "truncation_ambiguous" not in row.flags


COMPLETE_ARGS = ('</think><|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0'
                 '<|tool_call_argument_begin|>{"city": "Beijing"}')


@pytest.mark.parametrize("closers", ["", "<|tool_call_end|>", "<|tool_call_end|><|tool_calls_section_end|>"])
def test_a_cut_after_complete_arguments_is_resolved_by_the_billed_tokens(kimi, closers):
    raw = COMPLETE_ARGS + closers
    msg = {"content": None, "tool_calls": [call("functions.get_weather:0", "get_weather", '{"city": "Beijing"}')]}
    row = reconstruct_record(record(msg, "length", usage={"completion_tokens": n_tokens(kimi, raw)}), kimi, K25)
    assert completion(kimi, row) == raw
    assert "truncated_in_tool_call" in row.flags and "truncation_ambiguous" not in row.flags
    assert row.n_completion_tokens == row.billed_completion_tokens


@pytest.mark.parametrize("usage", [None, {"completion_tokens": 999}])
def test_an_unresolvable_cut_is_flagged_ambiguous_and_left_open(kimi, usage):
    msg = {"content": None, "tool_calls": [call("functions.get_weather:0", "get_weather", '{"city": "Beijing"}')]}
    row = reconstruct_record(record(msg, "length", usage=usage), kimi, K25)
    assert completion(kimi, row) == COMPLETE_ARGS
    assert {"truncated_in_tool_call", "truncation_ambiguous"} <= set(row.flags)


def test_a_cut_inside_the_second_call_keeps_the_first_closed(kimi):
    raw = ('</think><|tool_calls_section_begin|><|tool_call_begin|>functions.a:0<|tool_call_argument_begin|>{}'
           '<|tool_call_end|><|tool_call_begin|>functions.b:1<|tool_call_argument_begin|>{"q": ')
    msg = {"tool_calls": [call("functions.a:0", "a", "{}"), call("functions.b:1", "b", '{"q": ')]}
    assert completion(kimi, reconstruct_record(record(msg, "length"), kimi, K25)) == raw


# ---------------------------------------------------------------------------------------------
# Tool calls straight after <think>

TOOLS_ONLY = ('<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>'
              '{"city": "Beijing"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>')


def test_tools_straight_after_think_need_the_omit_option(kimi):
    msg = {"content": None, "tool_calls": [call("functions.get_weather:0", "get_weather", '{"city": "Beijing"}')]}
    default = reconstruct_record(record(msg, "tool_calls"), kimi, K25)
    assert completion(kimi, default) == "</think>" + TOOLS_ONLY  # what the template writes
    omitted = reconstruct_record(record(msg, "tool_calls"), kimi, K25, ReconstructOptions(omit_think_end_before_tools=True))
    assert completion(kimi, omitted) == TOOLS_ONLY
    assert {"no_reasoning", "no_think_end"} <= set(omitted.flags)


def test_the_omit_option_leaves_a_message_with_content_alone(kimi):
    msg = {"reasoning": "r", "content": "Checking.", "tool_calls": [call("functions.f:0", "f", "{}")]}
    row = reconstruct_record(record(msg, "tool_calls"), kimi, K25, ReconstructOptions(omit_think_end_before_tools=True))
    assert completion(kimi, row).startswith("r</think>Checking.<|tool_calls_section_begin|>")
    assert "no_think_end" not in row.flags


# ---------------------------------------------------------------------------------------------
# Tool-call ids: the auto policy

def history_with(ids: list[str]) -> list[dict]:
    """A conversation whose earlier tool calls carry ``ids`` (as a client sent them back)."""
    return [{"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": [call(i, "lookup", "{}") for i in ids]},
            *({"role": "tool", "tool_call_id": i, "content": "ok"} for i in ids),
            {"role": "user", "content": "and again"}]


@pytest.mark.parametrize("history,api_id,written", [
    (["functions.lookup:0"], "functions.lookup:1", "functions.lookup:1"),          # the model's own style
    (["functions.lookup:0"], "functions.lookup:7", "functions.lookup:7"),          # its own counter, even if odd
    (["functions.lookup:0"], "lookup:1", "lookup:1"),                              # NAME:N
    (["functions.lookup:0"], "1", "1"),                                            # a bare counter
    (["call_1", "call_2"], "call_3", "call_3"),                                    # copied from a rewritten history
    (["call_Xy12ab34Cd56ef78Gh90ij12"], "call_Qw98er76Ty54ui32Op10as98", "call_Qw98er76Ty54ui32Op10as98"),
    (["toolu_01A09q90qw90lq917835lq9X"], "toolu_01B77x12ab34cd56ef78gh9Y", "toolu_01B77x12ab34cd56ef78gh9Y"),
    (["123e4567-e89b-12d3-a456-426614174000"], "9f0c1d2e-3a4b-4c5d-8e6f-7a8b9c0d1e2f",
     "9f0c1d2e-3a4b-4c5d-8e6f-7a8b9c0d1e2f"),                                      # UUIDs
    (["functions.lookup:0"], "chatcmpl-tool-3f2a9c0d1e2b4a5f8c7d6e5f4a3b2c1d", "functions.lookup:1"),  # server-made
    (["functions.lookup:0"], "call_Qw98er76Ty54ui32Op10as98", "functions.lookup:1"),  # OpenAI-style, not in history
    ([], "call_3", "functions.lookup:0"),                                          # no history to copy from
])
def test_auto_keeps_ids_the_model_could_have_written(kimi, history, api_id, written):
    messages = history_with(history) if history else [{"role": "user", "content": "go"}]
    msg = {"tool_calls": [call(api_id, "lookup", "{}")]}
    row = reconstruct_record(record(msg, "tool_calls", messages=messages), kimi, K25)
    assert f"<|tool_call_begin|>{written}<|tool_call_argument_begin|>" in completion(kimi, row)
    assert "tool_ids_auto" in row.flags
    assert ("tool_id_normalised" in row.flags) == (written != api_id)


def test_normalise_and_keep_stay_available_and_are_recorded(kimi):
    msg = {"tool_calls": [call("lookup:0", "lookup", "{}")]}
    normalised = reconstruct_record(record(msg, "tool_calls"), kimi, K25, ReconstructOptions(tool_ids="normalise"))
    assert "functions.lookup:0<|tool_call_argument_begin|>" in completion(kimi, normalised)
    assert {"tool_ids_normalise", "tool_id_normalised"} <= set(normalised.flags)
    made_up = {"tool_calls": [call("chatcmpl-tool-77", "lookup", "{}")]}
    kept = reconstruct_record(record(made_up, "tool_calls"), kimi, K25, ReconstructOptions(tool_ids="keep"))
    assert "chatcmpl-tool-77<|tool_call_argument_begin|>" in completion(kimi, kept) and "tool_ids_keep" in kept.flags
    assert reconstruct_record(record(made_up, "tool_calls"), kimi, K25, ReconstructOptions(keep_tool_ids=True)).flags == kept.flags
    with pytest.raises(ValueError, match="unknown tool-id policy"):
        CompletionOptions(tool_ids="sometimes")


def test_a_row_without_tool_calls_records_no_id_policy(kimi):
    assert not any(f.startswith("tool_ids_") for f in reconstruct_record(record({"content": "hi"}, "stop"), kimi, K25).flags)


def test_id_styles_and_signatures():
    assert [tool_id_style(i) for i in ["functions.get_weather:0", "get_weather:3", "12", "chatcmpl-tool-ab12",
                                       "call_abcdefghijklmnopqrstuvwx", "call_3", "toolu_01A0", "123e4567-e89b-12d3-a456-426614174000",
                                       "my-id"]] == \
        ["kimi", "name_index", "counter", "chatcmpl_tool", "call_random", "call_counter", "toolu", "uuid", "other"]
    assert id_signature("call_3") == id_signature("call_12") == "call_9"
    assert id_signature("123e4567-e89b-12d3-a456-426614174000") == "x8-x4-x4-x4-x12"
    assert not model_could_write("chatcmpl-tool-3f2a", ["functions.f:0"])
    assert model_could_write("chatcmpl-tool-3f2b", ["chatcmpl-tool-9a0c"])  # the history uses that style


# ---------------------------------------------------------------------------------------------
# No invented whitespace


def test_the_renderer_writes_nothing_between_markers_or_calls(kimi):
    turn = Turn(None, None, [ToolCall("functions.a:0", "a", ""), ToolCall("functions.b:1", "b", "{}"),
                             ToolCall("functions.c:2", "c", "")], "tool_calls")
    segs, _ = kimi_completion(turn, 0, CompletionOptions(), thinking=True)
    text = "".join(s.text for s in segs)
    assert text == ("</think><|tool_calls_section_begin|>"
                    "<|tool_call_begin|>functions.a:0<|tool_call_argument_begin|><|tool_call_end|>"
                    "<|tool_call_begin|>functions.b:1<|tool_call_argument_begin|>{}<|tool_call_end|>"
                    "<|tool_call_begin|>functions.c:2<|tool_call_argument_begin|><|tool_call_end|>"
                    "<|tool_calls_section_end|><|im_end|>")
    # every byte outside the API's own fields is a marker: no whitespace anywhere
    assert not any(c.isspace() for c in text)
    row = reconstruct_record(record({"tool_calls": [call("functions.a:0", "a", ""), call("functions.b:1", "b", "{}")]},
                                    "tool_calls"), kimi, K25)
    assert not any(c.isspace() for c in completion(kimi, row))


# ---------------------------------------------------------------------------------------------
# Marker text


def test_marker_text_in_reasoning_is_plain_text_and_flagged(kimi):
    msg = {"reasoning": "draft: <|tool_calls_section_begin|><|tool_call_begin|>functions.f:0 then </think>",
           "content": "done <|im_end|>"}
    row = reconstruct_record(record(msg, "stop"), kimi, K25)
    assert "literal_marker" in row.flags
    assert [i for i in row.completion_ids if kimi.is_special(i)] == [163607, 163586]  # only </think> and <|im_end|>


def test_rows_with_marker_text_are_left_out_of_training_unless_kept(kimi, tmp_path):
    from kimi_eagle.eagle3.hidden import LITERAL_MARKER_REASON, load_rows
    from kimi_eagle.reconstruct.job import write_rows

    rows = []
    for k, content in enumerate(["plain answer", "say <|im_end|> now"]):
        row = reconstruct_record({**record({"content": content}, "stop"), "id": f"r{k}"}, kimi, K25).to_dict()
        rows.append({**row, "line": k + 1})
    path = tmp_path / "rows.parquet"
    write_rows(rows, path)
    kept_rows, skipped = load_rows(path)
    assert [r.id for r in kept_rows] == ["r0"]
    assert skipped == [{"index": 1, "id": "r1", "reason": LITERAL_MARKER_REASON}]  # counted where extract's manifest lists skips
    assert [r.id for r in load_rows(path, keep_literal_marker=True)[0]] == ["r0", "r1"]
