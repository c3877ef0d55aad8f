"""Formats: the registry, the TypeScript tool declaration, a HF tokenizer's own template, plain."""
import json

import jinja2.sandbox
import pytest

from kimi_eagle.assets import asset_path
from kimi_eagle.chat.formats import FORMATS, HFTemplateFormat, get_format, render
from kimi_eagle.chat.messages import normalise_messages
from kimi_eagle.chat.tool_decl import tools_to_typescript
from kimi_eagle.reconstruct.convert import convert
from kimi_eagle.reconstruct.record import reconstruct_record
from kimi_eagle.tokenize.tokenizer import ids_to_bytes

WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather.\n\nUse sparingly.",
    "parameters": {"type": "object", "required": ["city"], "properties": {
        "unit": {"type": "string", "enum": ["C", "F"], "default": "C", "description": "Unit"},
        "city": {"type": "string", "description": "The city", "maxLength": 50, "minLength": 1},
        "days": {"type": "integer", "minimum": 1},
        "tags": {"type": "array", "items": {"type": "string", "description": "a tag"}},
        "opts": {"type": "object", "properties": {"x": {"type": ["number", "null"]}}, "additionalProperties": False},
        "where": {"anyOf": [{"type": "string"}, {"$ref": "#/$defs/Loc"}]}},
        "$defs": {"Loc": {"type": "object", "description": "A place", "properties": {"lat": {"type": "number"}}}}}}},
    {"type": "retrieval"}]

WEATHER_TS = """# Tools

## functions
namespace functions {
// A place
interface Loc {
  lat?: number
}
// Get the weather.

// Use sparingly.
type get_weather = (_: {
  // The city
  // maxLength: 50, minLength: 1
  city: string,
  // minimum: 1
  days?: number,
  opts?: {
    x?: number | null,
    [k: string]: never
  },
  tags?: Array<
    // a tag
    string
  >,
  // Unit
  // Default: "C"
  unit?: "C" | "F",
  where?: string | Loc
}) => any;
}
"""


def test_registry_names_and_errors(kimi):
    for name in FORMATS:
        if name != "hf-template":
            assert get_format(name).name == name
    with pytest.raises(ValueError, match="unknown format 'kimi-k3'"):
        get_format("kimi-k3")
    with pytest.raises(ValueError, match="needs a tokenizer"):
        get_format("hf-template")
    with pytest.raises(ValueError, match="no chat template"):
        get_format("hf-template", kimi)
    with pytest.raises(ValueError, match="unknown tool declaration"):
        get_format("kimi-k2.5", tool_declaration="yaml")


def test_typescript_tool_declaration_layout():
    assert tools_to_typescript(WEATHER) == WEATHER_TS
    assert tools_to_typescript([{"type": "function", "function": {"name": "noop"}}]) == \
        "# Tools\n\n## functions\nnamespace functions {\ntype noop = (_: {}) => any;\n}\n"
    assert tools_to_typescript([]) == ""


def test_typescript_declaration_goes_where_the_template_puts_tools_ts_str():
    env = jinja2.sandbox.SandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, separators=None, **_: json.dumps(x, ensure_ascii=False, separators=separators)
    template = env.from_string(asset_path("kimi/templates/kimi-k2.5.jinja").read_text())
    fmt = get_format("kimi-k2.5", tool_declaration="ts")
    records = list(convert("reason-tool-use")) + list(convert("glaive"))[:200]
    for record in records + [{"request": {"messages": [{"role": "user", "content": "hi"}], "tools": WEATHER}}]:
        messages, tools = normalise_messages(record["request"]["messages"]), record["request"].get("tools")
        expected = template.render(messages=messages, tools=tools, tools_ts_str=tools_to_typescript(tools) if tools else None,
                                   add_generation_prompt=True)
        assert render(fmt.prompt_pieces(messages, tools)) == expected
    assert "namespace functions {" in render(fmt.prompt_pieces([], WEATHER))
    assert '"name":"get_weather"' in render(get_format("kimi-k2.5").prompt_pieces([], WEATHER))  # JSON is the default


def qwen_messages(record):
    return [{**m, "content": m.get("content") or ""} for m in normalise_messages(record["request"]["messages"])]


def test_hf_template_prompt_matches_transformers(qwen3):
    from transformers.utils.chat_template_utils import render_jinja_template

    fmt = get_format("hf-template", qwen3)
    records = [r for r in convert("sharegpt") if r["request"]["messages"]][:150] + list(convert("glaive"))[:100]
    for record in records:
        messages, tools = qwen_messages(record), record["request"].get("tools")
        hf = render_jinja_template([messages], tools=tools, chat_template=qwen3.chat_template, add_generation_prompt=True)
        hf = hf[0] if isinstance(hf, tuple) else hf
        assert render(fmt.prompt_pieces(messages, tools)) == (hf[0] if isinstance(hf, list) else hf)


def test_hf_template_completion_is_the_rendered_turn(qwen3):
    fmt = get_format("hf-template", qwen3)
    rec = {"id": "q", "request": {"messages": [{"role": "user", "content": "Weather?"}]},
           "response": {"choices": [{"message": {"reasoning": "Call it <|im_end|>", "content": "Sure.", "tool_calls": [
               {"id": "x", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]},
               "finish_reason": "tool_calls"}]}}
    row = reconstruct_record(rec, qwen3, fmt)
    text = ids_to_bytes(qwen3, row.completion_ids).decode()
    assert text == ('<think>\nCall it <|im_end|>\n</think>\n\nSure.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}'
                    '\n</tool_call><|im_end|>')
    im_end = qwen3.encode("<|im_end|>", allow_special=True)[0]
    assert row.completion_ids.count(im_end) == 1 and row.completion_ids[-1] == im_end  # the marker in reasoning is text
    assert [s["kind"] for s in row.segments] == ["reasoning", "think_end", "content", "im_end"]
    assert "literal_marker" in row.flags
    cut = dict(rec, response={"choices": [{"message": {"reasoning": "Hmm"}, "finish_reason": "length"}]})
    assert ids_to_bytes(qwen3, reconstruct_record(cut, qwen3, fmt).completion_ids) == b"<think>\nHmm\n"


def test_hf_template_errors_are_record_errors(qwen3):
    from kimi_eagle.records import RecordError

    fmt = HFTemplateFormat("{{ raise_exception('no system messages') }}", ["<|im_end|>"], "<|im_end|>")
    with pytest.raises(RecordError, match="no system messages"):
        fmt.prompt_pieces([{"role": "system", "content": "x"}])


def test_plain_prompt_is_bos_and_the_concatenated_contents(stories):
    fmt = get_format("plain", stories)
    pieces = fmt.prompt_pieces([{"role": "system", "content": "Once upon"}, {"role": "user", "content": [{"type": "text", "text": " a time"}]}])
    assert render(pieces) == "<s>Once upon a time"
    rec = {"id": "p", "request": {"messages": [{"role": "user", "content": "Once upon a time"}]},
           "response": {"choices": [{"message": {"content": " there"}, "finish_reason": "stop"}]}}
    row = reconstruct_record(rec, stories, fmt)
    assert row.prompt_ids == [1] + stories.encode("Once upon a time")
    assert row.completion_ids[-1] == 2 and [s["kind"] for s in row.segments] == ["content", "im_end"]
