"""What providers' servers do to a request's history and to an answer's count, as declared dimensions of the
calibration space (issue 34, kimi_eagle/serving/variants.py): each value is a plain function, specified here on
small requests, then on the recorded exchanges that needed it."""
import pytest

from kimi_eagle.chat.completion import ToolCall, Turn
from kimi_eagle.chat.k2_0905 import KimiK2Instruct0905
from kimi_eagle.reconstruct.record import rebuild_under
from kimi_eagle.reconstruct.recorded import exchange_record
from kimi_eagle.serving.calibration import VariantCounts, billed, calibrate
from kimi_eagle.serving.periods import deployment_of
from kimi_eagle.serving.provider_table import load_table, record_entry
from kimi_eagle.serving.variants import (
    Variant,
    chars_estimate,
    declaration,
    served_text_turn,
    with_history,
)

CALL = {"id": "weather:0", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Florence"}'}}
HISTORY = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"},
           {"role": "assistant", "content": "Checking.", "tool_calls": [CALL, {**CALL, "id": "weather:1"}]},
           {"role": "tool", "tool_call_id": "weather:0", "content": "40 C"},
           {"role": "tool", "tool_call_id": "weather:1", "content": "41 C"}]


def _text(messages, fmt=KimiK2Instruct0905()):
    return "".join(t for t, _ in fmt.prompt_pieces(messages, None))


def test_vllm_openai_content_is_printed_as_the_python_repr_of_its_parts():
    out = with_history(HISTORY, "as-sent", "as-sent", "openai-repr")
    assert out[3]["content"] == "[{'type': 'text', 'text': '40 C'}]"
    assert out[2]["content"] == "[{'type': 'text', 'text': 'Checking.'}]"  # beside tool calls
    assert out[0] == HISTORY[0] and out[1] == HISTORY[1]  # system and user turns are printed by parts
    empty = with_history([{**HISTORY[2], "content": None}, HISTORY[3]], "as-sent", "as-sent", "openai-repr")
    assert empty[0]["content"] is None  # an empty call turn prints nothing
    assert HISTORY[3]["content"] == "40 C"  # inputs are not mutated


def test_spaced_float_writes_every_integer_as_a_float():
    """Groq since 2025-10: earlier calls' arguments come back spaced with their integers as floats (+4 tokens for
    ``{"a":2,"b":3}``; the one-call requests, whose arguments hold no number, are unchanged)."""
    calls = [{"id": "0", "type": "function", "function": {"name": "add", "arguments": '{"a":2,"b":[3,true,1.5]}'}}]
    out = with_history([{"role": "assistant", "content": None, "tool_calls": calls}], "as-sent", "spaced-float")
    assert out[0]["tool_calls"][0]["function"]["arguments"] == '{"a": 2.0, "b": [3.0, true, 1.5]}'


def test_calls_counter_renumbers_the_calls_and_keeps_the_results_ids():
    out = with_history(HISTORY, "calls-counter", "as-sent")
    assert [c["id"] for c in out[2]["tool_calls"]] == ["functions.weather:0", "functions.weather:1"]
    assert [m["tool_call_id"] for m in out[3:]] == ["weather:0", "weather:1"]
    both = with_history(HISTORY, "counter", "as-sent")
    assert [m["tool_call_id"] for m in both[3:]] == ["functions.weather:0", "functions.weather:1"]


def test_reasoning_details_become_the_reasoning_of_a_turn_without_one():
    turn = {"role": "assistant", "content": "x", "reasoning_details": [{"type": "reasoning.text", "text": "Look"},
                                                                       {"type": "reasoning.text", "text": " again."}]}
    assert with_history([turn], "as-sent", "as-sent", reasoning="details")[0]["reasoning_content"] == "Look again."
    kept = {**turn, "reasoning_content": "own"}
    assert with_history([kept], "as-sent", "as-sent", reasoning="details")[0]["reasoning_content"] == "own"
    assert "reasoning_content" not in with_history([turn], "as-sent", "as-sent")[0]


def test_the_0905_template_revisions():
    plain = _text(HISTORY)
    assert "<|im_system|>system<|im_middle|>Be brief." in plain and "## Return of weather:0\n    40 C" in plain
    newline = _text(HISTORY, KimiK2Instruct0905(role_newline=True))
    assert "<|im_system|>system<|im_middle|>\nBe brief." in newline
    assert "<|im_system|>tool<|im_middle|>\n## Return of weather:0" in newline
    assert "<|im_user|>user<|im_middle|>Weather?" in newline  # user and assistant turns unchanged
    lines = _text(HISTORY, KimiK2Instruct0905(id_line=True))
    assert "<|im_middle|>weather:0\n40 C<|im_end|>\n<|im_system|>tool<|im_middle|>weather:1\n41 C" in lines
    default = _text(HISTORY[1:], KimiK2Instruct0905(role_newline=True))
    assert "<|im_middle|>You are Kimi" in default  # not after the template's own default system turn


def test_a_revision_of_the_0905_template_needs_that_template():
    assert Variant(template="k2-0905", role_newline="system-tool").role_newline == "system-tool"
    with pytest.raises(ValueError, match="needs template = k2-0905"):
        Variant(tool_result="id-line")


def test_json_lines_declares_one_spaced_object_per_tool():
    tools = [{"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"name": "b"}}]
    assert declaration(tools, "json-lines", "kimi-k2-instruct", "json") == (
        '{"type": "function", "function": {"name": "a"}}\n{"type": "function", "function": {"name": "b"}}')


def test_served_text_spaces_are_taken_away_and_what_that_loses_is_flagged():
    """A detokenizer that spaces Kimi's markers and strips nothing (Avian): the reasoning's last space, the content's
    first one and, before calls, all the content's trailing whitespace are the server's."""
    call = ToolCall("functions.add:0", "add", '{"a": 2}')
    turn, flags = served_text_turn(Turn("I add. ", " Adding.   ", [call], "tool_calls"), "spaced-unstripped")
    assert (turn.reasoning, turn.content, flags) == ("I add.", "Adding.", ["content_end_unknown"])
    plain, flags = served_text_turn(Turn(None, " Hi ", [], "stop"), "spaced-unstripped")
    assert (plain.content, flags) == ("Hi ", [])
    assert served_text_turn(turn, "as-served") == (turn, [])


@pytest.fixture(scope="module")
def records(exchanges):  # conftest.py: the recorded real exchanges
    return [r for r in (exchange_record(ex) for ex in exchanges) if "error" not in r]


def _by_id(records, prefix):
    return next(r for r in records if r["id"].startswith(prefix))


def test_deepinfra_bills_tool_call_answers_by_characters_not_tokens(records, kimi):
    """Two DeepInfra answers with 12-token contents and the same 10-token call are billed 25 and 26: no count of their
    tokens can tell them apart; their contents have 61 and 65 characters (round(chars / 4) = 15 and 16)."""
    counts = VariantCounts(kimi, rebuild_under)
    a = _by_id(records, "fantasy:gen-1758698444-PaNno")
    b = _by_id(records, "fantasy:gen-1758709846-1RnWt")
    contents = [r["response"]["choices"][0]["message"]["content"] for r in (a, b)]
    assert [len(kimi.encode(c)) for c in contents] == [12, 12] and [len(c) for c in contents] == [61, 65]
    assert counts.completion(a, "template")[0] == counts.completion(b, "template")[0]
    assert [billed(r, "completion_tokens") for r in (a, b)] == [25, 26]
    v = Variant(tool_answer="chars-estimate")
    assert [counts.completion_count(r, v) for r in (a, b)] == [25, 26] == [chars_estimate(len(c), 10) for c in contents]


def test_novita_runs_two_deployments_told_apart_by_their_fingerprints(records, kimi):
    novita = [r for r in records if r["response"].get("provider") == "Novita"]
    assert sorted({deployment_of(r) for r in novita}) == ["fpv0", "none"]
    rows = [r for r in calibrate(novita, VariantCounts(kimi, rebuild_under)) if r["provider"] == "Novita"]
    # both thin under the evidence rule (issue 44): fpv0's tool_call_offset=1 names no mechanism, none has 3 records
    assert sorted((r["deployment"], r["records"], r["status"]) for r in rows) == [
        ("fpv0", 24, "thin"), ("none", 3, "thin")]
    shipped = load_table()
    for r in novita:  # the shipped table's entry of each record: its period's, its own deployment's where it splits
        entry = record_entry(r)
        split = {e.deployment for e in shipped if e.provider == "Novita" and e.period == entry.period} != {"any"}
        assert entry.deployment == (deployment_of(r) if split else "any"), r["id"]
    assert any(record_entry(r).deployment == "none" for r in novita)


@pytest.mark.parametrize("fingerprint, family", [
    ("fpv0_ec889fbb", "fpv0"), ("", "none"), (None, "none"), (7, "none"), (["fpv0"], "none"),
    ("x" * 10_000, "other"), ("fp v0_1", "other"), ("any_1", "other"), ("none", "other"), ("fp_\u2028", "fp")])
def test_a_fingerprint_family_is_a_short_plain_name_or_says_it_is_not(fingerprint, family):
    assert deployment_of({"response": {"system_fingerprint": fingerprint}}) == family
