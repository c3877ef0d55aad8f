"""Serving profiles: each convention pinned per profile with hand-written vectors taken from the servers'
code (docs/reconstruct.md, "Serving profiles"), the ``template`` profile equal to the kit without
profiles, and a round trip per profile: render -> parse as the server -> reconstruct with the same
profile gives the engine's IDs back, or the row says why not."""
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kimi_eagle.chat.completion import CONTENT, SPECIAL
from kimi_eagle.chat.encoder import PieceEncoder
from kimi_eagle.chat.formats import count_tool_calls, get_format
from kimi_eagle.chat.parse import ParseOptions, api_record
from kimi_eagle.reconstruct.record import ReconstructOptions, reconstruct_record, serving_options
from kimi_eagle.records import RecordError
from kimi_eagle.serving.answer import parse_completion
from kimi_eagle.serving.profiles import PROFILES, ServingProfile, get_profile
from kimi_eagle.serving.request import deep_sort, preprocess_request
from kimi_eagle.tokenize.tokenizer import ids_to_bytes

S, SE = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
B, A, E = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
END = "<|im_end|>"


def parse(text: str, serving: str, history: int = 0, fmt: str = "kimi-k2.5"):
    return parse_completion(text, options=ParseOptions(format_name=fmt, serving=serving, history_tool_calls=history))


# --------------------------------------------------------------------------------------------
# Completion side: (convention, raw output, {profile: expected}) -- expected is
# (reasoning, content, [(id, name, arguments)], finish_reason)

PARSE_VECTORS = [
    ("section without a parsable call", f"r</think>{S}{B}bad id{A}{{}}{E}{SE}{END}", {
        "template": ("r", None, [], "stop"),
        "moonshot": ("r", None, [], "stop"),
        "vllm-legacy": ("r", None, [], "tool_calls"),
        "sglang-legacy": ("r", None, [], "tool_calls")}),
    ("length cut inside a call", f"r</think>{S}{B}functions.f:0{A}{{\"a\": 1", {
        "template": ("r", None, [("functions.f:0", "f", '{"a": 1')], "length"),
        "vllm-legacy": ("r", None, [], "tool_calls"),
        "sglang-legacy": ("r", None, [], "length")}),
    ("literal marker text", f"a</think>b</think>c{END}", {
        "template": ("a", "b</think>c", [], "stop"),
        "vllm-legacy": ("a", "b</think>c", [], "stop"),
        "sglang-legacy": ("a", "b</think>c", [], "stop")}),
    ("dotted tool name", f"</think>{S}{B}functions.ns.search:0{A}{{}}{E}{SE}{END}", {
        "template": (None, None, [("functions.ns.search:0", "ns.search", "{}")], "tool_calls"),
        "vllm-legacy": (None, None, [("functions.ns.search:0", "search", "{}")], "tool_calls"),
        "sglang-legacy": (None, None, [("functions.ns.search:3", "ns.search", "{}")], "tool_calls")}),
    ("sglang ids: history calls + position", f"</think>{S}{B}functions.f:7{A}{{}}{E}{B}g:9{A}{{}}{E}{SE}{END}", {
        "template": (None, None, [("functions.f:7", "f", "{}"), ("g:9", "g", "{}")], "tool_calls"),
        "vllm-legacy": (None, None, [("functions.f:7", "f", "{}"), ("g:9", "g", "{}")], "tool_calls"),
        "sglang-legacy": (None, None, [("functions.f:3", "f", "{}"), ("functions.g:4", "g", "{}")], "tool_calls")}),
    ("whitespace around ids and arguments", f"</think>{S}{B} f:0 {A} {{\"a\": 1}} \n{E}{SE}{END}", {
        "template": (None, None, [("f:0", "f", ' {"a": 1} \n')], "tool_calls"),
        "vllm-legacy": (None, None, [("f:0", "f", '{"a": 1}')], "tool_calls"),
        "sglang-legacy": (None, None, [("functions.f:3", "f", '{"a": 1}')], "tool_calls")}),
    ("reasoning before an implicit tool section", f"think more \n{S}{B}f:0{A}{{}}{E}{SE}{END}", {
        "template": ("think more \n", None, [("f:0", "f", "{}")], "tool_calls"),
        "vllm-legacy": ("think more \n", None, [("f:0", "f", "{}")], "tool_calls"),
        "sglang-legacy": ("think more", None, [("functions.f:3", "f", "{}")], "tool_calls")}),
    ("arguments over several lines or not an object", f"</think>{S}{B}f:0{A}{{\"a\":\n1}}{E}{B}g:1{A}[1]{E}{SE}{END}", {
        "template": (None, None, [("f:0", "f", '{"a":\n1}'), ("g:1", "g", "[1]")], "tool_calls"),
        "vllm-legacy": (None, None, [("f:0", "f", '{"a":\n1}'), ("g:1", "g", "[1]")], "tool_calls"),
        "sglang-legacy": (None, None, [], "tool_calls")}),
    ("content around the section", f"r</think> hi {S}{B}f:0{A}{{}}{E}{SE}{END}", {
        "template": ("r", " hi ", [("f:0", "f", "{}")], "tool_calls"),
        "vllm-legacy": ("r", " hi ", [("f:0", "f", "{}")], "tool_calls"),
        "sglang-legacy": ("r", "hi ", [("functions.f:3", "f", "{}")], "tool_calls")}),
    ("cut inside reasoning", "still thinking", {
        "template": ("still thinking", None, [], "length"),
        "vllm-legacy": ("still thinking", None, [], "length"),
        "sglang-legacy": ("still thinking", None, [], "length")}),
]


@pytest.mark.parametrize("convention,raw,expected", PARSE_VECTORS, ids=[v[0] for v in PARSE_VECTORS])
def test_each_profile_parses_like_its_server(convention, raw, expected):
    for serving, (reasoning, content, calls, finish) in expected.items():
        got = parse(raw, serving, history=3)
        assert (got.reasoning, got.content, got.finish_reason) == (reasoning, content, finish), (serving, got)
        assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in got.tool_calls] == calls, serving


def test_dropped_and_renumbered_calls_are_flagged():
    assert "dropped_by_server" in parse(f"</think>{S}{B}f:0{A}{{\"a\"", "vllm-legacy").flags
    assert "dropped_by_server" in parse(f"</think>{S}{B}f:0{A}[1]{E}{SE}{END}", "sglang-legacy").flags
    assert "dropped_by_server" not in parse(f"</think>{S}{B}f:0{A}{{}}{E}{SE}{END}", "vllm-legacy").flags
    assert "tool_id_renumbered" in parse(f"</think>{S}{B}f:5{A}{{}}{E}{SE}{END}", "sglang-legacy").flags
    assert "tool_id_renumbered" not in parse(f"</think>{S}{B}functions.f:0{A}{{}}{E}{SE}{END}", "sglang-legacy").flags


def test_template_profile_is_the_parse_without_profiles(kimi):
    raw = f"a \n{S}{B} functions.ns.x:0 {A} {{}} {E}{SE}t{END}"
    ids = kimi.encode(raw, allow_special=True)
    for source, tok in ((raw, None), (ids, kimi)):
        assert parse_completion(source, tok).to_dict() == parse_completion(
            source, tok, ParseOptions(serving="template")).to_dict()


def test_from_ids_servers_split_on_marker_text_the_kit_does_not(kimi):
    ids = kimi.encode("a", allow_special=True) + kimi.encode("</think>b") + kimi.encode(END, allow_special=True)
    kit = parse_completion(ids, kimi)
    served = parse_completion(ids, kimi, ParseOptions(serving="vllm-legacy"))
    assert (kit.reasoning, kit.content) == ("a</think>b", None) and "literal_marker" in kit.flags
    assert (served.reasoning, served.content) == ("a", "b") and "literal_marker" in served.flags


# --------------------------------------------------------------------------------------------
# Prompt side

CALL = {"id": "functions.f:0", "type": "function", "function": {"name": "f", "arguments": None}}


def history(arguments):
    return [{"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": [{**CALL, "function": {"name": "f", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "functions.f:0", "content": [{"type": "text", "text": "a"},
                                                                           {"type": "text", "text": "b"}]}]


ARGUMENT_VECTORS = [  # (client's string, {profile: what the template writes, or None for a refused request})
    ('{"a":1}', {"template": '{"a":1}', "moonshot": '{"a":1}', "vllm-legacy": '{"a": 1}', "sglang-legacy": '{"a": 1}'}),
    ('{"c": "\\u5317", "n": 1.50}', {"template": '{"c": "\\u5317", "n": 1.50}', "vllm-legacy": '{"c": "北", "n": 1.5}',
                                     "sglang-legacy": '{"c": "北", "n": 1.5}'}),
    ('{\n  "a": [1,2]\n}', {"template": '{\n  "a": [1,2]\n}', "vllm-legacy": '{"a": [1, 2]}', "sglang-legacy": '{"a": [1, 2]}'}),
    ("", {"template": "", "vllm-legacy": "{}", "sglang-legacy": None}),
    ("not json", {"template": "not json", "moonshot": "not json", "vllm-legacy": None, "sglang-legacy": None}),
    ("[1, 2]", {"template": "[1, 2]", "vllm-legacy": "[1, 2]", "sglang-legacy": None}),
]


@pytest.mark.parametrize("arguments,expected", ARGUMENT_VECTORS, ids=[v[0] or "empty" for v in ARGUMENT_VECTORS])
def test_history_arguments_per_profile(arguments, expected):
    fmt = get_format("kimi-k2.5")
    for serving, written in expected.items():
        if written is None:
            with pytest.raises(RecordError, match="refuses"):
                preprocess_request(history(arguments), None, get_profile(serving))
            continue
        messages, _ = preprocess_request(history(arguments), None, get_profile(serving))
        text = "".join(t for t, _ in fmt.prompt_pieces(messages))
        assert f"<|tool_call_argument_begin|>{written}<|tool_call_end|>" in text, serving


def test_none_valued_keys_and_tool_parts():
    call = {**CALL, "function": {"name": "f", "arguments": "{}"}}
    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "content": "x", "reasoning_content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": None,
                 "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    fmt = get_format("kimi-k2.5")
    rendered = {name: "".join(t for t, _ in fmt.prompt_pieces(preprocess_request(messages, None, get_profile(name))[0]))
                for name in ("template", "moonshot", "vllm-legacy", "sglang-legacy")}
    assert "## Return of None\nab" in rendered["template"] and "<think>None</think>" in rendered["template"]
    for name in ("moonshot", "vllm-legacy", "sglang-legacy"):
        assert "None" not in rendered[name], name
    assert "## Return of \na b" in rendered["sglang-legacy"] and "## Return of \nab" in rendered["vllm-legacy"]


def test_tools_are_deep_sorted_and_declared_in_typescript():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "$defs": {"Z": {"type": "string"}, "A": {"type": "number"}},
        "properties": {"x": {"$ref": "#/$defs/Z"}}}}}]
    assert list(deep_sort(tools)[0]["function"]["parameters"]["$defs"]) == ["A", "Z"]
    fmt = get_format("kimi-k2.5", tool_declaration=get_profile("vllm-legacy").tool_declaration)
    _, sorted_tools = preprocess_request([], tools, get_profile("vllm-legacy"))
    text = "".join(t for t, _ in fmt.prompt_pieces([{"role": "user", "content": "q"}], sorted_tools))
    assert text.index("interface A") < text.index("interface Z") and "namespace functions" in text
    assert tools[0]["function"]["parameters"]["$defs"] is not sorted_tools[0]["function"]["parameters"]["$defs"]


def test_profiles_are_overridable_one_field_at_a_time():
    p = get_profile("vllm-legacy", tool_declaration="json", tool_ids=None)
    assert p.tool_declaration == "json" and p.split_on == "text" and get_profile("vllm-legacy").tool_declaration == "ts"
    with pytest.raises(ValueError, match="unknown serving profile"):
        get_profile("tgi")
    with pytest.raises(ValueError, match="split_on"):
        ServingProfile("x", split_on="bytes")


# --------------------------------------------------------------------------------------------
# Reconstruction: dropped calls are flagged, closers the model may not have written never appended

def dropped_record(finish, calls, billed):
    message = {"role": "assistant", "reasoning": "r", "content": None, "tool_calls": calls}
    return {"id": "d", "request": {"messages": [{"role": "user", "content": "q"}]},
            "response": {"choices": [{"message": message, "finish_reason": finish}],
                         "usage": {"completion_tokens": billed}}}


def test_a_call_the_server_dropped_is_flagged_and_nothing_is_appended(kimi):
    fmt = get_format("kimi-k2.5")
    one = [{"id": "functions.f:0", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    vllm = serving_options(get_profile("vllm-legacy"))
    # vLLM: finish tool_calls, billing says more tokens than the message holds: a second call was cut
    row = reconstruct_record(dropped_record("tool_calls", one, 40), kimi, fmt, vllm)
    text = ids_to_bytes(kimi, row.completion_ids).decode()
    assert "dropped_by_server" in row.flags and text.endswith(E) and END not in text and SE not in text
    # the same message whose billing matches the whole turn: nothing was dropped
    full = reconstruct_record(dropped_record("tool_calls", one, None), kimi, fmt, vllm)
    row = reconstruct_record(dropped_record("tool_calls", one, full.n_completion_tokens), kimi, fmt, vllm)
    assert "dropped_by_server" not in row.flags and ids_to_bytes(kimi, row.completion_ids).decode().endswith(SE + END)
    # a section that returned no call
    row = reconstruct_record(dropped_record("tool_calls", [], 40), kimi, fmt, vllm)
    assert "dropped_by_server" in row.flags and ids_to_bytes(kimi, row.completion_ids).decode().endswith(S)
    # SGLang length cut: every returned call complete, no section end, no <|im_end|>
    row = reconstruct_record(dropped_record("length", one, 40), kimi, fmt, serving_options(get_profile("sglang-legacy")))
    text = ids_to_bytes(kimi, row.completion_ids).decode()
    assert "dropped_by_server" in row.flags and text.endswith(E) and "truncated_in_tool_call" not in row.flags
    # the template profile keeps today's reading: the last call was cut inside its arguments
    row = reconstruct_record(dropped_record("length", one, None), kimi, fmt, ReconstructOptions())
    assert "truncated_in_tool_call" in row.flags


def test_template_profile_reconstructs_as_without_profiles(kimi):
    fmt = get_format("kimi-k2.5")
    rec = {"id": "t", "request": {"messages": history('{"a":1}')[:2] + [{"role": "tool", "tool_call_id": None,
                                                                          "content": "x"}]},
           "response": {"choices": [{"message": {"role": "assistant", "content": "ok", "reasoning": "r"},
                                     "finish_reason": "stop"}]}}
    base = reconstruct_record(rec, kimi, fmt)
    same = reconstruct_record(rec, kimi, fmt, serving_options(PROFILES["template"]))
    assert (base.prompt_ids, base.completion_ids, base.flags) == (same.prompt_ids, same.completion_ids, same.flags)
    served = reconstruct_record(rec, kimi, fmt, serving_options(get_profile("vllm-legacy")))
    assert served.prompt_ids != base.prompt_ids and served.completion_ids == base.completion_ids


# --------------------------------------------------------------------------------------------
# Round trip per profile

HISTORY = [{"role": "user", "content": "go"},
           {"role": "assistant", "content": None, "tool_calls": [
               {"id": "functions.lookup:0", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]},
           {"role": "tool", "tool_call_id": "functions.lookup:0", "content": "ok"}]
words = st.lists(st.sampled_from(list("ab.:é世🚀{}") + [" x", "\ny"]), min_size=1, max_size=8).map("".join)
marker_words = st.lists(st.sampled_from(list("ab ") + ["</think>", "<think>", B, S]), min_size=1, max_size=6).map("".join)
json_args = st.sampled_from(['{}', '{"city": "Beijing"}', '{"a": [1, 2], "b": "x y"}', "[]", '{"a":\n1}'])


@st.composite
def outputs(draw, text=words, cut=True):
    """A K2.5 output as pieces: reasoning, optional content, 0-3 calls of every id style, maybe a cut."""
    reasoning, content = draw(text).strip() or "r", draw(st.one_of(st.just(""), text.map(str.strip)))
    n_calls = draw(st.integers(0, 3))
    pieces = [(reasoning, CONTENT), ("</think>", SPECIAL)]
    if content:
        pieces.append((content, CONTENT))
    first = count_tool_calls(HISTORY)
    if n_calls:
        pieces.append((S, SPECIAL))
        for k in range(n_calls):
            name = draw(st.sampled_from(["lookup", "get_weather", "ns.search"]))
            tool_id = draw(st.sampled_from([f"functions.{name}:{first + k}", f"{name}:{first + k}", f"functions.{name}:9"]))
            pieces += [(B, SPECIAL), (tool_id, CONTENT), (A, SPECIAL), (draw(json_args), CONTENT), (E, SPECIAL)]
        pieces.append((SE, SPECIAL))
    pieces.append((END, SPECIAL))
    end = draw(st.integers(0, len(pieces) - 1)) if cut and draw(st.booleans()) else len(pieces)
    return pieces[:max(end, 1)]


def roundtrip(kimi, pieces, serving):
    ids = PieceEncoder(kimi).encode(pieces)
    profile = get_profile(serving)
    parsed = parse_completion(ids, kimi, ParseOptions(serving=profile, history_tool_calls=count_tool_calls(HISTORY)))
    if not (parsed.reasoning or parsed.content or parsed.tool_calls):
        return ids, None, parsed
    record = api_record(parsed, HISTORY)
    record["response"]["usage"] = {"completion_tokens": len(ids)}
    options = serving_options(get_profile(profile, omit_think_end_before_tools=parsed.think_end is False))
    return ids, reconstruct_record(record, kimi, get_format("kimi-k2.5"), options), parsed


# what a row or a parse says when the IDs cannot come back: the server dropped or renumbered something,
# marker text the servers split on, a cut inside reasoning or a character, closers chosen by billing; a row
# without any of these either has the engine's IDs or a completion count that differs from the billed one
TELLS = {"dropped_by_server", "literal_marker", "tool_id_renumbered", "truncated_in_reasoning", "invalid_utf8",
         "truncation_resolved_by_billing", "truncation_ambiguous",
         # what today's server versions lose (chat/unserve.py; measured against the real servers in test_server_roundtrip)
         "reasoning_end_unknown", "before_tools_unknown", "arguments_whitespace_unknown", "empty_arguments_ambiguous",
         "tool_id_unknown", "content_end_unknown"}


@pytest.mark.parametrize("serving", list(PROFILES))
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=outputs())
def test_render_parse_reconstruct_gives_the_ids_back_or_says_why(kimi, serving, pieces):
    ids, row, parsed = roundtrip(kimi, pieces, serving)
    if row is not None and not TELLS & set(parsed.flags + row.flags):  # else: exact, or the billed count disagrees
        assert row.completion_ids == ids or row.billed_completion_tokens != row.n_completion_tokens, (serving, "".join(t for t, _ in pieces),
                                           json.dumps(parsed.message(), ensure_ascii=False), row.flags)


@pytest.mark.parametrize("serving", list(PROFILES))
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=outputs(cut=False))
def test_finished_outputs_come_back_exactly_unless_the_server_lost_something(kimi, serving, pieces):
    ids, row, parsed = roundtrip(kimi, pieces, serving)
    if row is not None and not TELLS & set(parsed.flags + row.flags):
        assert row.completion_ids == ids, (serving, "".join(t for t, _ in pieces), row.flags)


@pytest.mark.parametrize("serving", ["vllm-legacy", "sglang-legacy"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=outputs(text=marker_words))
def test_marker_text_the_servers_split_on_is_always_flagged(kimi, serving, pieces):
    ids, row, parsed = roundtrip(kimi, pieces, serving)
    if row is not None and row.completion_ids != ids and row.billed_completion_tokens == row.n_completion_tokens:
        assert TELLS & set(parsed.flags + row.flags), (serving, "".join(t for t, _ in pieces))


# --------------------------------------------------------------------------------------------
# --serving auto: the profile whose prompt counts match the billed ones, per provider


def billed_record(kimi, rid, provider, serving, messages, tools, answer_ids=("functions.get:1",)):
    profile = get_profile(serving)
    fmt = get_format("kimi-k2.5", tool_declaration=profile.tool_declaration)
    served, served_tools = preprocess_request(messages, tools, profile)
    n_prompt = len(PieceEncoder(kimi).encode(fmt.prompt_pieces(served, served_tools)))
    calls = [{"id": i, "type": "function", "function": {"name": "get", "arguments": "{}"}} for i in answer_ids]
    return {"id": rid, "request": {"messages": messages, "tools": tools},
            "response": {"provider": provider, "usage": {"prompt_tokens": n_prompt, "completion_tokens": 5},
                         "choices": [{"finish_reason": "tool_calls",
                                      "message": {"role": "assistant", "content": None, "tool_calls": calls}}]}}


TOOLS = [{"type": "function", "function": {"name": "get", "description": "d", "parameters": {
    "type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "integer"}}}}}]
MULTI = [{"role": "user", "content": "q"},
         {"role": "assistant", "content": None, "tool_calls": [
             {"id": "functions.get:0", "type": "function", "function": {"name": "get", "arguments": '{"a":1}'}}]},
         {"role": "tool", "tool_call_id": "functions.get:0", "content": "ok"}]


def test_auto_picks_each_providers_profile_from_its_billed_prompt_counts(kimi):
    from kimi_eagle.serving.auto import choose_profiles, describe

    records = [billed_record(kimi, "a", "A", "template", MULTI, TOOLS),
               billed_record(kimi, "b", "B", "moonshot", MULTI, TOOLS),
               billed_record(kimi, "c", "C", "vllm-legacy", MULTI, TOOLS, answer_ids=("call_x",)),
               billed_record(kimi, "d", "D", "sglang-legacy", MULTI, TOOLS),
               {**billed_record(kimi, "e", "E", "vllm-legacy", MULTI, TOOLS), "response": {"provider": "E", "choices": []}}]
    got = {c["provider"]: c for c in choose_profiles(records, kimi)}
    # C and D render alike under every vLLM and SGLang version: the tie goes to the newest vLLM, and to the newest
    # SGLang where every returned id is SGLang's renumbered one
    assert {p: c["profile"] for p, c in got.items()} == {"A": "template", "B": "moonshot", "C": "vllm-0.33",
                                                          "D": "sglang-0.5", "E": "template"}
    assert got["C"]["prompt_matched"] == {"template": 0, "moonshot": 0, "vllm-0.33": 1, "vllm-0.33-nospace": 1,
                                          "vllm-legacy": 1, "sglang-0.5": 1, "sglang-legacy": 1}
    assert describe(got["C"]).startswith("provider C: vllm-0.33 profile, prompt counts matched 1/1")
    assert describe(got["E"]) == "provider E: template profile (no billed prompt_tokens to compare)"


def test_reconstruct_serving_auto_writes_the_evidence_and_renders_per_provider(kimi, tmp_path):
    import pyarrow.parquet as pq

    from kimi_eagle.apps.cli import main

    records = [billed_record(kimi, "a", "A", "template", MULTI, TOOLS),
               billed_record(kimi, "b", "B", "vllm-legacy", MULTI, TOOLS, answer_ids=("chatcmpl-tool-1",))]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "out.parquet"
    assert main(["reconstruct", str(src), "-o", str(out), "--serving", "auto", "--no-progress"]) == 0
    evidence = json.loads((tmp_path / "out.parquet.serving.json").read_text())
    assert {g["provider"]: g["profile"] for g in evidence["groups"]} == {"A": "template", "B": "vllm-0.33"}
    rows = {r["id"]: r for r in pq.read_table(out).to_pylist()}
    assert [rows[r["id"]]["n_prompt_tokens"] for r in records] == [r["response"]["usage"]["prompt_tokens"] for r in records]


def test_the_engine_renders_and_answers_through_its_profile(kimi):
    from kimi_eagle.engine.kimi_format import KimiPromptRenderer, kimi_chat_answer

    record = billed_record(kimi, "v", "V", "vllm-legacy", MULTI, TOOLS)
    for serving in PROFILES:
        row = reconstruct_record(record, kimi, get_format("kimi-k2.5", tool_declaration=get_profile(serving).tool_declaration),
                                 serving_options(get_profile(serving)))
        assert KimiPromptRenderer(kimi, serving).prompt_ids(MULTI, TOOLS) == row.prompt_ids, serving
    cut = kimi.encode(f"r</think>{S}{B}functions.get:1{A}{{\"a\":", allow_special=True)
    assert kimi_chat_answer(cut, kimi, "length").finish_reason == "length"
    served = kimi_chat_answer(cut, kimi, "length", "vllm-legacy")
    assert served.finish_reason == "tool_calls" and "tool_calls" not in served.message
    assert kimi_chat_answer(cut, kimi, "length", "sglang-legacy").finish_reason == "length"


# --------------------------------------------------------------------------------------------
# --serving auto as the default: completion counts as secondary evidence, template without evidence,
# the `serving` column and the per-provider record


def call_answer_record(rid, provider, finish, call_id="call_1"):
    """A request with tools and no history (moonshot, vllm and sglang render it alike), answered with one call."""
    calls = [{"id": call_id, "type": "function", "function": {"name": "get", "arguments": "{}"}}]
    return {"id": rid, "request": {"messages": [{"role": "user", "content": "q"}], "tools": TOOLS},
            "response": {"provider": provider, "choices": [{"finish_reason": finish, "message": {
                "role": "assistant", "reasoning": "r", "content": None, "tool_calls": calls}}]}}


def billed(record, counts, prompt_serving, completion_tokens):
    prompt = counts[get_profile(prompt_serving).name][0]  # the counts are keyed by profile name (vllm -> vllm-legacy)
    record["response"]["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion_tokens}
    return record


def test_auto_breaks_prompt_ties_with_the_billed_completion_counts(kimi):
    from kimi_eagle.reconstruct.prepass import reconstruct_counter
    from kimi_eagle.serving.auto import choose_profiles, describe

    counter = reconstruct_counter(kimi, "kimi-k2.5")
    counts = counter(call_answer_record("x", "X", "tool_calls"))
    assert counts["moonshot"][0] == counts["vllm-legacy"][0] == counts["sglang-legacy"][0] != counts["template"][0]
    full = counts["moonshot"][1]
    # billed the whole turn: every profile agrees, nothing to tell them apart -> the first tied (moonshot)
    m = billed(call_answer_record("m", "M", "tool_calls"), counts, "moonshot", full)
    # billed more than the turn holds after a complete call: a second call was cut and dropped, as vLLM and SGLang
    # do; the kit's template reading has no such tokens -> vllm (its ids), sglang (SGLang's renumbered ids)
    v = billed(call_answer_record("v", "V", "tool_calls"), counts, "vllm-legacy", full + 9)
    s = billed(call_answer_record("s", "S", "tool_calls", call_id="functions.get:0"), counts, "sglang-legacy", full + 9)
    t = billed(call_answer_record("t", "T", "tool_calls"), counts, "template", full + 9)  # the prompt decides first
    with_dropped = counter(v)
    assert with_dropped["vllm-legacy"][2] and not with_dropped["moonshot"][2] and with_dropped["vllm-legacy"][1] < full + 9
    got = {c["provider"]: c for c in choose_profiles([m, v, s, t], kimi, counter=counter)}
    assert {p: c["profile"] for p, c in got.items()} == {"M": "moonshot", "V": "vllm-legacy", "S": "sglang-legacy",
                                                          "T": "template"}
    assert got["M"]["completion_compared"] == 0
    assert got["V"]["completion_matched"] == {"template": 0, "moonshot": 0, "vllm-0.33": 0, "vllm-0.33-nospace": 0,
                                              "vllm-legacy": 1, "sglang-0.5": 0, "sglang-legacy": 1}
    assert describe(got["V"]) == ("provider V: vllm-legacy profile, prompt counts matched 1/1, completion counts "
                                  "matched 1/1, answers consistent 1/1")
    # prompts only (the chat-layer default counter): vllm's group ties with moonshot, which comes first
    assert {c["provider"]: c["profile"] for c in choose_profiles([v], kimi)} == {"V": "moonshot"}
    # billed prompts no candidate renders (another tokenizer): the completion counts are no evidence either
    other = billed(call_answer_record("o", "O", "tool_calls"), counts, "vllm-legacy", full + 9)
    other["response"]["usage"]["prompt_tokens"] = 7
    (c,) = choose_profiles([other], kimi, counter=counter)
    assert c["profile"] == "template" and c["completion_matched"]["vllm-legacy"] == 1
    assert describe(c) == ("provider O: template profile (no profile's prompt count equals a billed one (0/1: another "
                           "tokenizer or format?))")


def test_auto_without_evidence_is_template(kimi):
    from kimi_eagle.serving.auto import choose_profiles, describe

    plain = {"id": "p", "request": {"messages": [{"role": "user", "content": "hi"}]},
             "response": {"provider": "P", "usage": {"prompt_tokens": 1, "completion_tokens": 1},
                          "choices": [{"finish_reason": "stop", "message": {"role": "assistant", "content": "x"}}]}}
    (c,) = choose_profiles([plain], kimi)
    assert (c["profile"], c["compared"], c["tool_relevant"], c["prompts_differ"]) == ("template", 1, False, False)
    assert describe(c) == ("provider P: template profile (no tools or tool history, and every profile renders the "
                           "prompts and completions alike)")
    # a format the profiles do not change: template whatever the counts say
    vllm = billed_record(kimi, "c", "C", "vllm-legacy", MULTI, TOOLS, answer_ids=("call_x",))
    (c,) = choose_profiles([vllm], kimi, "plain")
    assert c["profile"] == "template" and c["no_evidence"] == "the chat format is not one the profiles change"


def test_cli_defaults_to_auto_and_records_the_profile_per_row_and_provider(kimi, tmp_path, capsys):
    import pyarrow.parquet as pq

    from kimi_eagle.apps.cli import main
    from kimi_eagle.serving.evidence import serving_by_provider, serving_line

    records = [billed_record(kimi, "a", "A", "template", MULTI, TOOLS),
               billed_record(kimi, "b", "B", "vllm-legacy", MULTI, TOOLS, answer_ids=("chatcmpl-tool-1",)),
               billed_record(kimi, "b2", "B", "vllm-legacy", MULTI, TOOLS, answer_ids=("chatcmpl-tool-2",)), "not an object"]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "out.parquet"
    assert main(["reconstruct", str(src), "-o", str(out), "--no-progress"]) == 0  # no --serving: auto
    printed = capsys.readouterr().out
    assert "provider A: template profile, prompt counts matched 1/1, completion counts matched 0/1" in printed
    assert "provider B: vllm-0.33 profile, prompt counts matched 2/2, completion counts matched 0/2" in printed
    assert f"{out}: rows per serving profile: template 1, vllm-0.33 2" in printed
    rows = pq.read_table(out).to_pylist()
    assert [r["serving"] for r in rows] == ["template", "vllm-0.33", "vllm-0.33", None]  # canonical names
    by = serving_by_provider(rows)
    assert by == {"A": {"template": 1}, "B": {"vllm-0.33": 2}}
    assert serving_line(by) == ("serving profiles (kimi-eagle reconstruct --serving): provider A: template profile "
                                "(1 rows); provider B: vllm-0.33 profile (2 rows)")
    evidence = json.loads((tmp_path / "out.parquet.serving.json").read_text())
    assert [g["no_evidence"] for g in evidence["groups"]] == [None, None]
    # billing report: the line on the page and a new summary key (the other keys unchanged)
    bill = tmp_path / "bill"
    assert main(["billing", str(out), "-o", str(bill)]) == 0
    summary = json.loads((bill / "summary.json").read_text())
    assert summary["serving_by_provider"] == by
    assert serving_line(by) in (bill / "report.html").read_text()
    # an explicit profile is the same for every row; an alias is written as the profile it stands for
    assert main(["reconstruct", str(src), "-o", str(tmp_path / "t.parquet"), "--serving", "sglang-legacy", "--no-progress"]) == 0
    assert [r["serving"] for r in pq.read_table(tmp_path / "t.parquet").to_pylist()] == ["sglang-legacy"] * 3 + [None]


def test_diff_report_names_the_profile_per_provider(tmp_path):
    import pyarrow as pa

    from kimi_eagle.apps.reports.diff_report import write_report
    from kimi_eagle.diff.run import HUNK_SCHEMA, RECORD_SCHEMA, DiffResult
    from kimi_eagle.serving.evidence import serving_line

    rows = [{**{f.name: None for f in RECORD_SCHEMA}, "id": rid, "provider": p, "status": "ok", "verdict": "exact",
             "label": "exact", "subclasses": [], "flags": [], "dataset": "unit", "n_engine_tokens": 3,
             "n_recon_tokens": 3, "token_delta": 0, "n_hunks": 0} for rid, p in (("a", "A"), ("b", "B"), ("c", "B"))]

    def result():
        return DiffResult(pa.Table.from_pylist(rows, schema=RECORD_SCHEMA).to_pandas(),
                          pa.Table.from_pylist([], schema=HUNK_SCHEMA).to_pandas())

    plain = write_report(result(), tmp_path / "plain")
    assert "serving_by_provider" not in plain and "serving profiles" not in (tmp_path / "plain" / "report.html").read_text()
    served = result()
    served.records["serving"] = ["vllm-legacy", "sglang-legacy", "sglang-legacy"]
    summary = write_report(served, tmp_path / "served")
    assert summary["serving_by_provider"] == {"A": {"vllm-legacy": 1}, "B": {"sglang-legacy": 2}}
    assert set(summary) - set(plain) == {"serving_by_provider"}
    assert serving_line(summary["serving_by_provider"]) in (tmp_path / "served" / "report.html").read_text()


BUNDLED = ("glaive", "reason-tool-use", "sharegpt")


@pytest.mark.parametrize("dataset", BUNDLED)
def test_auto_on_the_bundled_datasets_is_template_byte_for_byte(dataset, tmp_path, capsys):
    """`kimi-eagle convert` output carries no billed counts: auto (the default) must reconstruct it exactly as
    --serving template, and write nothing more than before (the evidence file only with --serving auto)."""
    from kimi_eagle.apps.cli import main

    api = tmp_path / "api.jsonl"
    assert main(["convert", "--from", dataset, "-o", str(api)]) == 0
    auto, template = tmp_path / "auto.parquet", tmp_path / "template.parquet"
    capsys.readouterr()
    assert main(["reconstruct", str(api), "-o", str(auto), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert main(["reconstruct", str(api), "-o", str(template), "--serving", "template", "--no-progress"]) == 0
    assert auto.read_bytes() == template.read_bytes()
    assert f"provider (none) (dataset {dataset}): template profile (no billed prompt_tokens to compare)" in printed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["api.jsonl", "auto.parquet", "template.parquet"]
    assert main(["reconstruct", str(api), "-o", str(auto), "--serving", "auto", "--no-progress"]) == 0
    assert auto.read_bytes() == template.read_bytes()
    evidence = json.loads((tmp_path / "auto.parquet.serving.json").read_text())
    assert [(g["profile"], g["no_evidence"]) for g in evidence["groups"]] == [
        ("template", "no billed prompt_tokens to compare")]


def test_diff_report_shows_the_auto_choice_and_its_evidence(tmp_path):
    """A diff folder made from a reconstruction whose OUT.serving.json exists: the evidence lines on the page."""
    import pyarrow as pa

    from kimi_eagle.apps.reports.diff_report import write_report
    from kimi_eagle.diff.run import HUNK_SCHEMA, RECORD_SCHEMA, DiffResult
    from kimi_eagle.serving.auto import describe

    recon = tmp_path / "recon.parquet"
    group = {"provider": "B", "dataset": None, "profile": "vllm-0.33", "no_evidence": None, "compared": 4,
             "prompt_matched": {"vllm-0.33": 4}, "completion_compared": 0, "completion_matched": {},
             "answer_compared": 3, "answer_matched": {"vllm-0.33": 3}}
    Path(f"{recon}.serving.json").write_text(json.dumps({"rule": "auto", "groups": [group]}))
    out = tmp_path / "diff"
    out.mkdir()
    (out / "meta.json").write_text(json.dumps({"reconstructed": str(recon)}))
    row = {**{f.name: None for f in RECORD_SCHEMA}, "id": "b", "provider": "B", "status": "ok", "verdict": "exact",
           "label": "exact", "subclasses": [], "flags": [], "dataset": "unit", "n_engine_tokens": 3,
           "n_recon_tokens": 3, "token_delta": 0, "n_hunks": 0}
    result = DiffResult(pa.Table.from_pylist([row], schema=RECORD_SCHEMA).to_pandas(),
                        pa.Table.from_pylist([], schema=HUNK_SCHEMA).to_pandas())
    summary = write_report(result, out)
    line = "provider B: vllm-0.33 profile, prompt counts matched 4/4, answers consistent 3/3"
    assert summary["serving_evidence"] == [describe(group)] == [line]
    assert line in (out / "report.html").read_text()
