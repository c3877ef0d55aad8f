"""The seeded corpus the real servers are asked about: raw K2.5 completions (engine IDs) and chat requests.

Run with the kit's own environment (it encodes with the kit's tokenizer); ``collect_vllm.py`` and
``collect_sglang.py`` then run in the servers' environment and record what each server answers.

Answer cases: a request (messages, tools) and the IDs a K2.5 engine wrote after its generation prompt
(which ends in ``<think>``): reasoning, ``</think>`` or not, content, a tool section with 0-4 calls of every
id style, arguments of every shape, marker text written as ordinary tokens, unicode, and cuts (``length``)
at every kind of boundary. Prompt cases: requests with tools (dotted and hyphenated names, nested schemas),
multi-turn histories with tool calls (every id style, argument strings compact, spaced, empty, invalid,
non-object) and tool results (strings, text parts), reasoning history, ``None`` fields, unicode.

    python tools/server_vectors/corpus.py --answers 3000 --prompts 640 --seed 0 -o corpus.jsonl
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from kimi_eagle.assets import kimi_dir
from kimi_eagle.tokenize.tokenizer import Tokenizer, load_tokenizer

MARKERS = {"think": "<think>", "think_end": "</think>", "section": "<|tool_calls_section_begin|>",
           "section_end": "<|tool_calls_section_end|>", "call": "<|tool_call_begin|>",
           "arg": "<|tool_call_argument_begin|>", "call_end": "<|tool_call_end|>", "im_end": "<|im_end|>"}

NAMES = ["get_weather", "search", "ns.search", "web.fetch.page", "get-weather", "lookup", "run_code",
         "calc", "a", "Tool123", "read_file", "db.query-v2"]
WORDS = ["the", "weather", "in", "Paris", "is", "mild", "let", "me", "check", "first", "ok", "so",
         "answer", "北京", "天气", "😀", "naïve", "x", "42", "3.14", "tool", "call", "result"]
REASONING = ["The user wants the weather. Let me call the tool.", "Hmm.", "思考一下这个问题。",
             "I need to look this up: first search, then fetch.", "  leading spaces and trailing  ",
             "\nnewline first", "Line one.\n\nLine two.\n", "x", "Consider <think> as text here.",
             "Compute 2+2=4.", " ", "\n\n"]
CONTENTS = ["Sure.", "Here is the answer: 42.", " ", "\n", "  spaced content  ", "北京今天晴。",
            "Calling the tool now.\n", "Done 😀", "ok", "Use </think> literally?", "a\tb", "\n\nTwo lines\n"]


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _tool_id(rng: random.Random, name: str, idx: int) -> str:
    style = rng.choice(["kimi", "kimi", "kimi", "name_index", "bare", "name_underscore", "call_random",
                        "spaced", "kimi_unicode", "no_index"])
    return {"kimi": f"functions.{name}:{idx}", "name_index": f"{name}:{idx}", "bare": str(idx),
            "name_underscore": f"{name}_{idx}", "call_random": "call_" + "".join(
                rng.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJ0123456789") for _ in range(24)),
            "spaced": f" functions.{name}:{idx} ", "kimi_unicode": f"functions.{name}é:{idx}",
            "no_index": f"functions.{name}"}[style]


def _arguments(rng: random.Random) -> str:
    value = {"city": rng.choice(["Paris", "北京", "New York"]), "days": rng.randint(0, 9)}
    if rng.random() < 0.3:
        value["opts"] = {"unit": "c", "tags": ["a", "b"]}
    style = rng.choice(["compact", "spaced", "spaced", "pretty", "empty", "empty_object", "invalid", "list",
                        "padded", "newline_padded", "two_line", "ascii_escape", "number"])
    return {"compact": json.dumps(value, separators=(",", ":"), ensure_ascii=False),
            "spaced": json.dumps(value, ensure_ascii=False), "pretty": json.dumps(value, indent=2),
            "empty": "", "empty_object": "{}", "invalid": '{"city": "Par', "list": '[1, 2]',
            "padded": " " + json.dumps(value) + " ", "newline_padded": "\n" + json.dumps(value) + "\n",
            "two_line": '{"a": 1,\n"b": 2}', "ascii_escape": json.dumps(value, ensure_ascii=True),
            "number": "7"}[style]


def _calls(rng: random.Random, n: int, start: int) -> list[tuple[str, str]]:
    out = []
    for k in range(n):
        name = rng.choice(NAMES)
        out.append((_tool_id(rng, name, start + k), _arguments(rng)))
    return out


def completion_parts(rng: random.Random, start_index: int) -> list[tuple[str, str]]:
    """A K2.5 completion as ``(kind, text)`` parts: ``text`` (ordinary tokens), ``marker`` (a special
    token), ``literal`` (marker text written as ordinary tokens)."""
    parts: list[tuple[str, str]] = []
    reasoning = rng.choice(REASONING + [_words(rng, rng.randint(1, 12)), ""])
    if reasoning:
        parts.append(("text", reasoning))
    if rng.random() < 0.08:
        parts.append(("literal", rng.choice(list(MARKERS.values()))))
        parts.append(("text", _words(rng, 2)))
    n_calls = rng.choice([0, 0, 1, 1, 1, 2, 3, 4])
    if not n_calls or rng.random() < 0.75:
        parts.append(("marker", "think_end"))
        if rng.random() < 0.75:
            parts.append(("text", rng.choice(CONTENTS + [_words(rng, rng.randint(1, 8))])))
    if n_calls or rng.random() < 0.05:
        parts.append(("marker", "section"))
        if rng.random() < 0.05:
            parts.append(("text", " "))  # text between the section opener and the first call
        for tool_id, args in _calls(rng, n_calls, start_index):
            parts += [("marker", "call"), ("text", tool_id), ("marker", "arg")]
            if args:
                parts.append(("text", args))
            parts.append(("marker", "call_end"))
        parts.append(("marker", "section_end"))
        if rng.random() < 0.05:
            parts.append(("text", "trailing text"))
    return parts


def encode_parts(parts: list[tuple[str, str]], tok: Tokenizer) -> tuple[list[int], list[int]]:
    """The IDs of ``parts`` and the boundaries (token positions where a part starts)."""
    ids: list[int] = []
    bounds: list[int] = []
    for kind, text in parts:
        bounds.append(len(ids))
        if kind == "marker":
            ids.append(tok.special_id_by_text[MARKERS[text]])
        else:
            ids.extend(tok.encode(text))
    return ids, bounds


def _cut(rng: random.Random, ids: list[int], bounds: list[int]) -> list[int]:
    """A ``length`` cut: at a part boundary (half the time) or anywhere inside."""
    if rng.random() < 0.5 and len(bounds) > 1:
        at = rng.choice(bounds[1:] + [len(ids)])
    else:
        at = rng.randint(1, max(1, len(ids)))
    return ids[:max(1, at)]


TOOLS_POOL = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string", "description": "City name"},
                                          "days": {"type": "integer", "minimum": 0, "maximum": 9}},
                                          "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {
        "q": {"type": "string"}, "limit": {"type": "integer", "default": 5}}, "required": ["q"]}}},
    {"type": "function", "function": {"name": "ns.search", "description": "Namespaced search.\nTwo lines.",
                                      "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "get-weather", "strict": True, "parameters": {
        "type": "object", "properties": {"unit": {"type": "string", "enum": ["c", "f"]},
                                         "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["unit"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "run_code", "description": "运行代码", "parameters": {
        "type": "object", "properties": {"code": {"type": "string"}, "opts": {"type": "object", "properties": {
            "timeout": {"type": ["number", "null"]}}}}, "required": ["code"]}}},
    {"type": "function", "function": {"name": "noargs", "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "calc", "description": "Arithmetic",
                                      "parameters": {"type": "object", "properties": {
                                          "expr": {"anyOf": [{"type": "string"}, {"type": "number"}]}}}}},
]


def _tools(rng: random.Random) -> list[dict] | None:
    if rng.random() < 0.15:
        return None
    return rng.sample(TOOLS_POOL, rng.randint(1, 4))


def _history_turn(rng: random.Random, counter: list[int]) -> list[dict]:
    """One assistant turn with tool calls and their results, or a plain exchange."""
    if rng.random() < 0.3:
        return [{"role": "assistant", "content": rng.choice(CONTENTS)},
                {"role": "user", "content": _words(rng, 4)}]
    calls = []
    for tool_id, args in _calls(rng, rng.randint(1, 2), counter[0]):
        name = rng.choice(NAMES)
        calls.append({"id": tool_id.strip(), "type": "function", "function": {"name": name, "arguments": args}})
    counter[0] += len(calls)
    msg: dict = {"role": "assistant", "content": rng.choice(["", None, "Let me check."]), "tool_calls": calls}
    if rng.random() < 0.5:
        msg["reasoning_content"] = rng.choice(REASONING)
    out = [msg]
    for c in calls:
        body = rng.choice(['{"temp": 21}', "sunny", "", "北京 晴", "line1\nline2"])
        content: object = body
        if rng.random() < 0.25:
            content = [{"type": "text", "text": body}, {"type": "text", "text": "more"}]
        out.append({"role": "tool", "tool_call_id": c["id"], "content": content})
    return out


def request(rng: random.Random) -> dict:
    """A chat request: optional system prompt, 0-3 history turns with tool calls, a user question."""
    messages: list[dict] = []
    if rng.random() < 0.4:
        messages.append({"role": "system", "content": rng.choice(["You are helpful.", "系统提示", " spaced "])})
    messages.append({"role": "user", "content": rng.choice(["What's the weather in Paris?", "hi", "北京天气？",
                                                            _words(rng, 6)])})
    counter = [0]
    for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
        messages += _history_turn(rng, counter)
    if messages[-1]["role"] != "user" and rng.random() < 0.5:
        messages.append({"role": "user", "content": "continue"})
    body: dict = {"messages": messages}
    tools = _tools(rng)
    if tools:
        body["tools"] = tools
    return body


def answer_case(rng: random.Random, k: int, tok: Tokenizer) -> dict:
    req = request(rng)
    history = sum(len(m.get("tool_calls") or []) for m in req["messages"])
    parts = completion_parts(rng, history if rng.random() < 0.7 else 0)
    ids, bounds = encode_parts(parts, tok)
    if rng.random() < 0.3:
        ids, finish = _cut(rng, ids, bounds), "length"
    else:
        ids, finish = ids + [tok.special_id_by_text[MARKERS["im_end"]]], "stop"
    return {"case": f"a{k:05d}", "request": req, "completion_ids": ids, "finish_reason": finish}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--answers", type=int, default=3000)
    p.add_argument("--prompts", type=int, default=640)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-o", "--output", required=True)
    a = p.parse_args(argv)
    tok = load_tokenizer(kimi_dir())
    rng = random.Random(a.seed)
    with Path(a.output).open("w", encoding="utf-8") as f:
        for k in range(a.answers):
            f.write(json.dumps({"kind": "answer", **answer_case(rng, k, tok)}, ensure_ascii=False) + "\n")
        for k in range(a.prompts):
            f.write(json.dumps({"kind": "prompt", "case": f"p{k:05d}", "request": request(rng)},
                               ensure_ascii=False) + "\n")
    print(f"corpus: {a.answers} answers, {a.prompts} prompts (seed {a.seed}) -> {a.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
