"""Serving profiles against what the servers render and return, on a seeded mix (and the bundled data).

1. Prompt byte parity: N generated multi-turn requests with tools. The server's prompt is that server's
   preprocessing (kimi_eagle.serving.request.preprocess_request) feeding the *official* K2.5 template through
   the kit's sandboxed jinja (tools_ts_str for the TypeScript declaration); the kit's prompt is the native
   renderer. "before" renders with the template profile (today's default), "after" with the server's.
2. Parser agreement per field (reasoning, content, tool calls, finish reason) between the kit's default
   parse and each server profile's parse of N generated answers (the server profiles' parsers are pinned
   to the servers' code by tests/test_serving_profiles.py; agreement of a profile with itself is 1 by
   construction and not printed).
3. End to end: the server's message for each answer is reconstructed with the template options (before)
   and with the server's profile (after); the rate of rows whose completion IDs equal the engine's.
4. Bundled datasets (glaive, reason-tool-use): rows whose prompt or completion IDs change per profile.

Usage: python bench/serving_profiles.py [--n 2000] [--seed 0]
"""
from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

from kimi_eagle.assets import kimi_dir
from kimi_eagle.chat.completion import CONTENT, SPECIAL
from kimi_eagle.chat.encoder import PieceEncoder
from kimi_eagle.chat.formats import HFTemplateFormat, count_tool_calls, get_format, render
from kimi_eagle.chat.parse import ParseOptions, api_record
from kimi_eagle.chat.tool_decl import typescript_or_none
from kimi_eagle.reconstruct.convert import convert
from kimi_eagle.reconstruct.record import ReconstructOptions, reconstruct_record, serving_options
from kimi_eagle.records import RecordError
from kimi_eagle.serving.answer import parse_completion
from kimi_eagle.serving.profiles import get_profile
from kimi_eagle.serving.request import preprocess_request
from kimi_eagle.tokenize.tokenizer import load_tokenizer

SERVERS = ("moonshot", "vllm", "sglang")
S, SE = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
B, A, E, END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<|im_end|>"
ARGUMENTS = ['{"city":"Paris"}', '{"city": "Paris", "n": 2}', '{"q": "\\u5317\\u4eac"}', '{"x": 1.50}',
             '{\n  "a": [1,2]\n}', '{"k": {"b": 1, "a": 2}}']
ODD_ARGUMENTS = ["", "not json", "[1, 2]"]  # 1 history call in 20: refused by SGLang (and vLLM for invalid JSON)
WORDS = ["Paris", "weather", "北京", "🚀", " ", "\n", "ok", "let me check", "{}", "a.b"]


def tool(rng: random.Random, k: int) -> dict:
    params: dict[str, Any] = {"type": "object", "properties": {"z": {"type": "string"}, "a": {"type": "integer"}},
                              "required": ["z"]}
    if rng.random() < 0.3:
        params["$defs"] = {"Zeta": {"type": "string"}, "Alpha": {"type": "number"}}
        params["properties"]["r"] = {"$ref": "#/$defs/Zeta"}
    return {"type": "function", "function": {"name": f"tool_{k}", "description": "does a thing", "parameters": params}}


def request(rng: random.Random) -> tuple[list[dict], list[dict]]:
    tools = [tool(rng, k) for k in range(rng.randint(1, 3))]
    messages: list[dict] = [{"role": "user", "content": rng.choice(WORDS) + "?"}]
    n = 0
    for _ in range(rng.randint(1, 3)):
        calls = []
        for _ in range(rng.randint(1, 2)):
            calls.append({"id": f"functions.tool_0:{n}", "type": "function",
                          "function": {"name": "tool_0", "arguments": rng.choice(
                              ODD_ARGUMENTS if rng.random() < 0.05 else ARGUMENTS)}})
            n += 1
        messages.append({"role": "assistant", "content": None, "tool_calls": calls,
                         "reasoning_content": rng.choice([None, "thinking"])})
        for c in calls:
            body: Any = rng.choice(["ok", [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]])
            messages.append({"role": "tool", "tool_call_id": rng.choice([c["id"], None]) if rng.random() < 0.1 else c["id"],
                             "content": body})
    return messages, tools


def server_prompt(template: HFTemplateFormat, messages: list[dict], tools: list, serving: str) -> str | None:
    """The server's prompt text: its preprocessing, then the official template; None when it refuses."""
    profile = get_profile(serving)
    try:
        messages, tools = preprocess_request(messages, tools, profile)
    except RecordError:
        return None
    ts = typescript_or_none(tools) if profile.tool_declaration == "ts" else None
    return template.template.render(messages=messages, tools=tools, tools_ts_str=ts, add_generation_prompt=True,
                                    preserve_thinking=False)


def kit_prompt(messages: list[dict], tools: list, serving: str) -> str | None:
    profile = get_profile(serving)
    try:
        messages, tools = preprocess_request(messages, tools, profile)
    except RecordError:
        return None
    return render(get_format("kimi-k2.5", tool_declaration=profile.tool_declaration).prompt_pieces(messages, tools))


def prompt_parity(n: int, seed: int, template: HFTemplateFormat) -> dict[str, Any]:
    rng = random.Random(seed)
    reqs = [request(rng) for _ in range(n)]
    out: dict[str, Any] = {}
    for serving in SERVERS:
        truth = [server_prompt(template, m, t, serving) for m, t in reqs]
        served = [k for k, p in enumerate(truth) if p is not None]
        before = sum(kit_prompt(*reqs[k], "template") == truth[k] for k in served)
        after = sum(kit_prompt(*reqs[k], serving) == truth[k] for k in served)
        out[serving] = {"requests": n, "refused_by_server": n - len(served), "before": before / len(served),
                        "after": after / len(served)}
    return out


def answer(rng: random.Random, first: int) -> list[tuple[str, int]]:
    """A generated K2.5 output as pieces, with the conventions the servers read differently."""
    def text() -> str:
        return "".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4)))
    pieces = [(text(), CONTENT)]
    if rng.random() < 0.1:
        pieces.append(("</think>" + text(), CONTENT))  # marker text as ordinary tokens
    if rng.random() < 0.8:
        pieces.append(("</think>", SPECIAL))
    if rng.random() < 0.4:
        pieces.append((text(), CONTENT))
    if rng.random() < 0.7:
        pieces.append((S, SPECIAL))
        for k in range(rng.randint(0, 3)):
            name = rng.choice(["tool_0", "ns.search"])
            tool_id = rng.choice([f"functions.{name}:{first + k}", f"{name}:{first + k}", f" functions.{name}:{k} "])
            args = rng.choice(['{"a": 1}', ' {"a": 1} ', '{"a":\n1}', "[1]", "{}"])
            pieces += [(B, SPECIAL), (tool_id, CONTENT), (A, SPECIAL), (args, CONTENT), (E, SPECIAL)]
        pieces.append((SE, SPECIAL))
    pieces.append((END, SPECIAL))
    if rng.random() < 0.25:
        pieces = pieces[:rng.randint(1, len(pieces) - 1)]
    return pieces


FIELDS = ("reasoning", "content", "tool_calls", "finish_reason")
# what says that a row's IDs are not the engine's (tests/test_serving_profiles.py uses the same set)
TELLS = {"dropped_by_server", "literal_marker", "tool_id_renumbered", "truncated_in_reasoning", "invalid_utf8",
         "truncation_resolved_by_billing", "truncation_ambiguous", "whitespace_stripped", "tool_id_normalised"}


def fields_of(parsed) -> dict[str, Any]:
    m = parsed.message()
    return {"reasoning": m["reasoning"], "content": m["content"], "tool_calls": m.get("tool_calls", []),
            "finish_reason": parsed.finish_reason}


def parsers_and_round_trip(n: int, seed: int, tok) -> dict[str, Any]:
    rng = random.Random(seed + 1)
    history = [{"role": "user", "content": "go"},
               {"role": "assistant", "content": None, "tool_calls": [{"id": "functions.tool_0:0", "type": "function",
                                                                      "function": {"name": "tool_0", "arguments": "{}"}}]},
               {"role": "tool", "tool_call_id": "functions.tool_0:0", "content": "ok"}]
    first = count_tool_calls(history)
    enc, fmt = PieceEncoder(tok), get_format("kimi-k2.5")
    outputs = [enc.encode(answer(rng, first)) for _ in range(n)]
    out: dict[str, Any] = {}
    for serving in ("template", *SERVERS):
        profile = get_profile(serving)
        agree = dict.fromkeys(FIELDS, 0)
        e2e = {"rows": 0, **{f"{k}_{w}": 0 for k in ("before", "after") for w in ("exact", "silently_wrong")}}
        for ids in outputs:
            kit = parse_completion(ids, tok)
            served = parse_completion(ids, tok, ParseOptions(serving=profile, history_tool_calls=first))
            for f, v in fields_of(served).items():
                agree[f] += fields_of(kit)[f] == v
            if not (served.reasoning or served.content or served.tool_calls):
                continue
            record = api_record(served, history)
            record["response"]["usage"] = {"completion_tokens": len(ids)}
            e2e["rows"] += 1
            omit = served.think_end is False
            for key, options in (("before", ReconstructOptions(omit_think_end_before_tools=omit)),
                                 ("after", serving_options(get_profile(profile, omit_think_end_before_tools=omit)))):
                try:
                    row = reconstruct_record(record, tok, fmt, options)
                except RecordError:
                    continue
                told = TELLS & set(row.flags + (served.flags if key == "after" else []))
                e2e[f"{key}_exact"] += row.completion_ids == ids
                e2e[f"{key}_silently_wrong"] += row.completion_ids != ids and not told and (
                    row.n_completion_tokens == len(ids))  # a count unlike the billed one is caught by billing
        rows = e2e.pop("rows")
        out[serving] = {"answers": n, "kit_default_parse_agreement": {f: agree[f] / n for f in FIELDS},
                        "end_to_end_rows": rows, **{k: v / rows for k, v in e2e.items()}}
    return out


def bundled(tok) -> dict[str, Any]:
    records = [r for source in ("glaive", "reason-tool-use") for r in convert(source)]
    fmt = {d: get_format("kimi-k2.5", tool_declaration=d) for d in ("json", "ts")}
    enc = PieceEncoder(tok)

    def ids(record, serving):
        p = get_profile(serving)
        try:
            row = reconstruct_record(record, tok, fmt[p.tool_declaration], serving_options(p), enc)
        except RecordError as e:
            return ("error", str(e)[:40])
        return (tuple(row.prompt_ids), tuple(row.completion_ids))

    base = [ids(r, "template") for r in records]
    out: dict[str, Any] = {"rows": len(records)}
    for serving in SERVERS:
        got = [ids(r, serving) for r in records]
        out[serving] = {"changed": sum(a != b for a, b in zip(base, got)),
                        "prompt_changed": sum(a[0] != b[0] for a, b in zip(base, got)),
                        "errors": sum(b[0] == "error" for b in got)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    tok = load_tokenizer(kimi_dir())
    template = HFTemplateFormat((kimi_dir() / "templates" / "kimi-k2.5.jinja").read_text(), list(tok.special_id_by_text),
                                END)
    start = time.perf_counter()
    result = {"prompt_parity": prompt_parity(args.n, args.seed, template),
              "parsers": parsers_and_round_trip(args.n, args.seed, tok), "bundled": bundled(tok)}
    result["seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
