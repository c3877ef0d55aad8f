"""A request corpus the kit's own generator did not write: recorded and agent requests, chat datasets, and
property-based requests (hypothesis) over the OpenAI chat-completion schema, invalid shapes included.

Runs with the kit's ``.venv`` python (hypothesis is a dev dependency); reads the assets in place:

- ``recorded``: every OpenAI chat-completions request in ``real_api/kimi_recorded_exchanges.jsonl``;
- ``agent``: every request in ``real_api/kimi_agent_traces.jsonl`` (a coding agent's sessions: 11 tools,
  a long system prompt, growing histories);
- ``dataset:<name>``: the chat datasets turned into chat-completion requests, one per assistant turn (the
  request that turn answers): ``glaive_toolcall`` (tools, tool calls with history, tool results),
  ``reason_tool_use`` (reasoning, parallel calls, tool results), ``sharegpt`` (multi-turn), ``fastchat``
  (multi-turn), ``alpaca`` (instruction / input, some with a system prompt or a previous exchange);
- ``generated``: hypothesis strategies driven by ``st.data()`` under ``@seed(SEED)`` (database off, generate
  phase only), ``SIZE`` examples: null contents, ``name`` on any role, unknown and vendor roles, tool calls
  missing ``id``/``type``, dict or number arguments, empty ``tools``, schemas without ``type``, ``$ref``/``$defs``,
  ``anyOf``/``oneOf``, nested arrays of objects, mixed-type enums, multi-line and unicode descriptions, content
  parts of every type, lone surrogates, CR/FF/U+2028, marker spellings, request-supplied K2 templates.

Every choice is seeded, so the corpus is the same for the same assets, seed, size and hypothesis version.

    .venv/bin/python tools/server_vectors/outside_requests.py --seed 0 --generated 2500 -o corpus-requests.jsonl

Each line: ``{"id", "origin", "request"}``; the first line is ``{"meta": {...}}`` (seed, size, counts). Written
to a ``.gz`` path, the file is deterministic gzip and compacted (``shared.compact_requests``: a line may name an
earlier request's tools, ``tools_from``, or first N messages, ``messages_from``; ``shared.expand_requests``).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from collections import Counter
from pathlib import Path

ASSETS = Path(__file__).resolve().parents[2].parent / "shared" / "assets"
SHARED = ASSETS / "data"

# caps that keep the recorded vectors small (characters of message text per dataset request)
SHAREGPT_MAX_CHARS = 3000
SHAREGPT_MAX_REQUESTS = 1000


def short_hash(*parts) -> str:
    return hashlib.sha256("\x00".join(map(str, parts)).encode("utf-8", "surrogatepass")).hexdigest()[:24]


# ---------------------------------------------------------------------------------------------- (a) real API
def real_api() -> list[dict]:
    out = []
    for name, origin in (("kimi_recorded_exchanges.jsonl", "recorded"), ("kimi_agent_traces.jsonl", "agent")):
        for line in (SHARED / "real_api" / name).read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            if row.get("api_format") != "openai-chat-completions" or not (row.get("request") or {}).get("messages"):
                continue
            out.append({"id": f"{origin}:{row['id']}", "origin": origin, "request": row["request"]})
    return out


# ---------------------------------------------------------------------------------------------- (b) datasets
def call_id(rng: random.Random, name: str, k: int, seen: int) -> str:
    """Ids as real clients send back what their provider gave: OpenAI-style mostly, Kimi-style sometimes."""
    r = rng.random()
    if r < 0.6:
        return "call_" + short_hash(name, k, seen, rng.random())[:24]
    if r < 0.9:
        return f"functions.{name}:{seen}"
    return f"{name}:{seen}"


def glaive(rng: random.Random) -> list[dict]:
    rows = json.loads((SHARED / "llamafactory" / "glaive_toolcall_en_demo.json").read_text(encoding="utf-8"))
    out = []
    for i, row in enumerate(rows):
        tools = [{"type": "function", "function": t} for t in json.loads(row["tools"] or "[]")]
        messages, pending, seen = [], [], 0
        for turn in row["conversations"]:
            who, value = turn["from"], turn["value"]
            if who in ("gpt", "function_call"):
                req = {"messages": [dict(m) for m in messages]}
                if tools:
                    req["tools"] = tools
                out.append({"id": f"dataset:glaive_toolcall:{i}:{len(messages)}", "origin": "dataset:glaive_toolcall",
                            "request": json.loads(json.dumps(req))})
            if who == "human":
                messages.append({"role": "user", "content": value})
            elif who == "gpt":
                messages.append({"role": "assistant", "content": value})
            elif who == "function_call":
                call = json.loads(value)
                cid = call_id(rng, call["name"], i, seen)
                seen += 1
                args = call.get("arguments")
                messages.append({"role": "assistant", "content": None if rng.random() < 0.5 else "",
                                 "tool_calls": [{"id": cid, "type": "function", "function": {
                                     "name": call["name"],
                                     "arguments": args if isinstance(args, str) else json.dumps(args)}}]})
                pending = [cid]
            elif who == "observation":
                messages.append({"role": "tool", "tool_call_id": pending[0] if pending else "call_0", "content": value})
    return out


def reason_tool_use(rng: random.Random) -> list[dict]:
    out = []
    lines = (SHARED / "llamafactory" / "reason_tool_use_demo_50.jsonl").read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        row = json.loads(line)
        tools = json.loads(row["tools"]) if isinstance(row.get("tools"), str) else row.get("tools") or []
        messages, seen = [], 0
        for m in row["messages"]:
            parts = m["content"] if isinstance(m["content"], list) else [{"type": "text", "value": m["content"]}]
            if m["role"] == "assistant":
                req = {"messages": json.loads(json.dumps(messages)), "tools": tools}
                out.append({"id": f"dataset:reason_tool_use:{i}:{len(messages)}", "origin": "dataset:reason_tool_use",
                            "request": req})
                msg = {"role": "assistant", "content": ""}
                reasoning = "".join(p["value"] for p in parts if p["type"] == "reasoning")
                if reasoning:
                    msg["reasoning_content"] = reasoning
                msg["content"] = "".join(p["value"] for p in parts if p["type"] == "text")
                calls = [json.loads(p["value"]) for p in parts if p["type"] == "tool_call"]
                if calls:
                    msg["tool_calls"] = []
                    for c in calls:
                        msg["tool_calls"].append({"id": call_id(rng, c["name"], i, seen), "type": "function",
                                                  "function": {"name": c["name"],
                                                               "arguments": json.dumps(c.get("arguments", {}))}})
                        seen += 1
                messages.append(msg)
            elif m["role"] == "tool":
                text = "".join(p["value"] for p in parts if p["type"] == "text")
                last_calls = next((x.get("tool_calls") for x in reversed(messages) if x["role"] == "assistant"), None)
                try:
                    results = json.loads(text)
                except ValueError:
                    results = None
                if isinstance(results, list) and results and all(isinstance(r, dict) and "content" in r
                                                                 for r in results):
                    for k, r in enumerate(results):
                        cid = (last_calls[k]["id"] if last_calls and k < len(last_calls)
                               else r.get("tool_call_id", f"call_{k}"))
                        messages.append({"role": "tool", "tool_call_id": cid, "content": str(r["content"])})
                else:
                    cid = last_calls[0]["id"] if last_calls else "call_0"
                    # text parts, as some clients send tool results
                    messages.append({"role": "tool", "tool_call_id": cid, "content": [{"type": "text", "text": text}]})
            else:
                text = "".join(p["value"] for p in parts if p["type"] == "text")
                messages.append({"role": m["role"], "content": text})
    return out


ROLE = {"human": "user", "gpt": "assistant", "system": "system"}


def sharegpt_like(path: Path, name: str, rng: random.Random, max_chars: int | None, every_turn: bool,
                  limit: int | None) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        rows = json.loads(text)
    else:  # a JSONL file may end in a cut line
        rows = []
        for x in text.splitlines():
            try:
                rows.append(json.loads(x))
            except ValueError:
                continue
    out = []
    for i, row in enumerate(rows):
        conv = [t for t in row["conversations"] if t.get("from") in ROLE]
        messages, chars, cands = [], 0, []
        for turn in conv:
            role = ROLE[turn["from"]]
            if role == "assistant" and messages and messages[-1]["role"] == "user":
                cands.append(len(messages))
            messages.append({"role": role, "content": turn["value"]})
            chars += len(turn["value"])
            if max_chars and chars > max_chars:
                break
        cands = [k for k in cands if not max_chars or sum(len(m["content"]) for m in messages[:k]) <= max_chars]
        if not cands:
            continue
        picks = cands if every_turn else [rng.choice(cands)]
        for k in picks:
            out.append({"id": f"dataset:{name}:{row.get('id', i)}:{k}", "origin": f"dataset:{name}",
                        "request": {"messages": json.loads(json.dumps(messages[:k]))}})
        if limit and len(out) >= limit:
            break
    return out


def alpaca(rng: random.Random) -> list[dict]:
    rows = json.loads((SHARED / "llamafactory" / "alpaca_en_demo.json").read_text(encoding="utf-8"))
    out = []
    for i, row in enumerate(rows):
        user = row["instruction"] + (("\n\n" + row["input"]) if row.get("input") else "")
        messages = [{"role": "user", "content": user}]
        r = rng.random()
        if r < 0.33:
            messages.insert(0, {"role": "system", "content": "You are a helpful assistant."})
        elif r < 0.66 and i > 0:
            prev = rows[i - 1]
            messages[:0] = [{"role": "user", "content": prev["instruction"] + (("\n\n" + prev["input"]) if prev.get("input") else "")},
                            {"role": "assistant", "content": prev["output"]}]
        out.append({"id": f"dataset:alpaca:{i}", "origin": "dataset:alpaca", "request": {"messages": messages}})
    return out


def datasets(seed: int) -> list[dict]:
    rng = random.Random(seed)
    return (glaive(rng) + reason_tool_use(rng)
            + sharegpt_like(SHARED / "sharegpt_v3_first2000.jsonl", "sharegpt", rng, SHAREGPT_MAX_CHARS, False,
                            SHAREGPT_MAX_REQUESTS)
            + sharegpt_like(SHARED / "fastchat" / "dummy_conversation.json", "fastchat", rng, None, True, None)
            + alpaca(rng))


# ---------------------------------------------------------------------------------------------- (c) generated
def strategies():
    from hypothesis import strategies as st

    specials = ["\r", "\n", "\r\n", "\x0c", "\u2028", "\u2029", "\t", "\x00", "\ud800", "\udfff", "\U0001f600",
                "é", "中文", "ℕ", "<|im_end|>", "<|im_user|>", "<think>", "</think>", "<|tool_calls_section_begin|>",
                "<|tool_call_begin|>", "functions.x:0", "[EOS]", "<|media_pad|>", "  ", "{}", "\"", "\\"]
    words = ["hello", "weather", "Paris", "search", "the", "file", "path", "run", "ls -la", "What is 2+2?",
             "Please call the tool.", "x", "", " "]
    text = st.lists(st.one_of(st.sampled_from(words), st.sampled_from(specials),
                              st.text(max_size=12)), max_size=8).map("".join)
    short = st.one_of(st.sampled_from(words[:10]), st.text(min_size=1, max_size=8))
    ident = st.one_of(st.sampled_from(["get_weather", "search", "read_file", "bash", "a.b", "ns.tool-x", "f",
                                       "lookup_2", "日本語", "edit"]),
                      st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_.\-]{0,12}", fullmatch=True))
    description = st.one_of(st.none(), text, st.lists(text, min_size=2, max_size=4).map("\n".join),
                            st.sampled_from(["Line one.\nLine two.\n\n- bullet", "Unicode: ünïcödé — 中文 🚀",
                                             "CR\rLF\nFF\x0cLS\u2028end"]))

    scalar_type = st.one_of(st.sampled_from(["string", "number", "integer", "boolean", "null"]),
                            st.sampled_from(["string", "integer", "any", "str", "dict", "int"]))

    def schema_extend(children):
        obj = st.fixed_dictionaries(
            {"properties": st.dictionaries(ident, children, max_size=4)},
            optional={"type": st.sampled_from(["object", ["object", "null"]]), "description": description,
                      "required": st.lists(ident, max_size=3),
                      "additionalProperties": st.one_of(st.booleans(), children)})
        arr = st.fixed_dictionaries({"items": children},
                                    optional={"type": st.just("array"), "description": description,
                                              "minItems": st.integers(0, 3), "maxItems": st.integers(1, 9)})
        return st.one_of(obj, arr,
                         st.fixed_dictionaries({"anyOf": st.lists(children, min_size=1, max_size=3)},
                                               optional={"description": description}),
                         st.fixed_dictionaries({"oneOf": st.lists(children, min_size=1, max_size=3)},
                                               optional={"description": description}),
                         st.fixed_dictionaries({"allOf": st.lists(children, min_size=1, max_size=2)}))

    leaf = st.one_of(
        st.fixed_dictionaries({"type": scalar_type},
                              optional={"description": description, "default": st.one_of(st.none(), short, st.integers()),
                                        "maxLength": st.integers(0, 99), "minimum": st.integers(-5, 5),
                                        "pattern": st.just("^[a-z]+$"), "format": st.just("uri")}),
        st.fixed_dictionaries({"enum": st.lists(st.one_of(short, st.integers(-3, 3), st.booleans(), st.none(),
                                                          st.floats(allow_nan=False, allow_infinity=False)),
                                                min_size=1, max_size=4)},
                              optional={"type": st.sampled_from(["string", "integer", ["string", "null"],
                                                                 ["string", "integer", "null"]]),
                                        "description": description}),
        st.fixed_dictionaries({"const": st.one_of(short, st.integers())}),
        st.fixed_dictionaries({"$ref": st.sampled_from(["#/$defs/Item", "#/$defs/Missing", "#",
                                                        "#/definitions/Item"])}),
        st.fixed_dictionaries({"description": description}),
        st.just({}), st.booleans(),
        st.fixed_dictionaries({"type": st.lists(st.sampled_from(["string", "integer", "null", "array", "object"]),
                                                min_size=1, max_size=3, unique=True)}))
    schema = st.recursive(leaf, schema_extend, max_leaves=6)
    params = st.one_of(
        st.fixed_dictionaries({"type": st.just("object"), "properties": st.dictionaries(ident, schema, max_size=5)},
                              optional={"required": st.lists(ident, max_size=3), "description": description,
                                        "$defs": st.dictionaries(st.sampled_from(["Item", "Other", "Node"]), schema,
                                                                 max_size=2),
                                        "additionalProperties": st.booleans()}),
        st.fixed_dictionaries({"properties": st.dictionaries(ident, schema, max_size=3)}),  # no "type"
        schema, st.none(), st.just({}))
    function = st.fixed_dictionaries({"name": ident},
                                     optional={"description": description, "parameters": params,
                                               "strict": st.one_of(st.booleans(), st.none())})
    tool = st.one_of(
        st.fixed_dictionaries({"type": st.just("function"), "function": function}),
        st.fixed_dictionaries({"type": st.just("function"), "function": function}),
        st.fixed_dictionaries({"type": st.just("function"), "function": function}),
        st.fixed_dictionaries({"function": function}),  # missing type
        st.fixed_dictionaries({"type": st.sampled_from(["custom", "web_search", "builtin_function", "_plugin"]),
                               "function": function}),
        st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries({"name": ident})}))
    tools = st.one_of(st.none(), st.just([]), st.lists(tool, min_size=1, max_size=4))

    arguments = st.one_of(
        st.dictionaries(ident, st.one_of(short, st.integers(), st.booleans(), st.none()), max_size=3).map(json.dumps),
        st.sampled_from(["", "{}", " {\"a\": 1} ", "{\"a\":", "[1,2]", "\"str\"", "null", "42",
                         "{\"cmd\": \"</think>\"}", "{\"x\": \"<|tool_call_end|>\"}"]),
        st.dictionaries(ident, short, max_size=2),  # a dict, not a string
        st.integers(), st.none(), st.lists(st.integers(), max_size=2))
    tool_call = st.fixed_dictionaries(
        {"function": st.fixed_dictionaries({"name": ident}, optional={"arguments": arguments})},
        optional={"id": st.one_of(st.sampled_from(["call_abc123", "functions.get_weather:0", "get_weather:1", "0",
                                                   "tool_1", "functions.a.b:3", "x y", ""]), st.none(), short),
                  "type": st.one_of(st.just("function"), st.sampled_from(["tool", "custom"]), st.none()),
                  "index": st.integers(0, 3)})

    part = st.one_of(
        st.fixed_dictionaries({"type": st.just("text"), "text": text}),
        st.fixed_dictionaries({"type": st.just("text")}),
        st.fixed_dictionaries({"type": st.just("image_url"),
                               "image_url": st.fixed_dictionaries({"url": st.just("data:image/png;base64,iVBORw0KGgo=")})}),
        st.fixed_dictionaries({"type": st.just("input_audio"),
                               "input_audio": st.just({"data": "UklGRg==", "format": "wav"})}),
        st.fixed_dictionaries({"type": st.just("video_url"), "video_url": st.just({"url": "data:video/mp4;base64,AAAAIGZ0eXBpc29t"})}),
        st.fixed_dictionaries({"type": st.just("file"), "file": st.just({"file_id": "file-1"})}),
        st.fixed_dictionaries({"type": st.just("refusal"), "refusal": text}),
        st.fixed_dictionaries({"type": st.just("thinking"), "thinking": text}),
        st.fixed_dictionaries({"type": st.sampled_from(["input_text", "output_text", "image", "unknown"]),
                               "text": text}))
    # one_of picks its branches about evenly: the shapes a server refuses outright (unknown roles, numbers as
    # content, odd part types, non-function tools) are drawn at a set rate instead, so most requests get past
    # the first check and exercise the template
    common_role = st.sampled_from(["system", "user", "assistant", "tool", "user", "assistant", "user"])
    odd_role = st.sampled_from(["developer", "model", "ipython", "function", "tool_declare", "bot", "User"])
    good_content = st.one_of(text, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text}),
                                            min_size=1, max_size=3), st.just(""))
    odd_content = st.one_of(st.none(), st.lists(part, max_size=4), st.integers())

    @st.composite
    def message(draw):
        r = draw(odd_role if draw(st.integers(0, 11)) == 0 else common_role)
        msg = {"role": r}
        if draw(st.integers(0, 9)) > 0:
            msg["content"] = draw(odd_content if draw(st.integers(0, 5)) == 0 else good_content)
        if draw(st.integers(0, 5)) == 0:
            msg["name"] = draw(st.one_of(short, st.none(), st.integers(), st.just("")))
        if r == "assistant":
            if draw(st.integers(0, 2)) == 0:
                msg["tool_calls"] = draw(st.lists(tool_call, max_size=3))
            if draw(st.integers(0, 3)) == 0:
                msg[draw(st.sampled_from(["reasoning_content", "reasoning"]))] = draw(st.one_of(text, st.none()))
        if r in ("tool", "function") or draw(st.integers(0, 15)) == 0:
            if draw(st.integers(0, 5)) > 0:
                msg["tool_call_id"] = draw(st.one_of(st.sampled_from(["call_abc123", "functions.get_weather:0"]),
                                                     short, st.none(), st.integers()))
        return msg

    templates = [p.read_text(encoding="utf-8") for p in sorted((ASSETS / "kimi" / "templates").glob("*.jinja"))]

    @st.composite
    def request(draw):
        req = {"messages": draw(st.lists(message(), min_size=1, max_size=6))}
        t = draw(tools)
        if t is not None:
            req["tools"] = t
        # tool_choice mostly where tools are declared (else it is refused before anything else is looked at)
        if draw(st.integers(0, 2 if t else 19)) == 0:
            req["tool_choice"] = draw(st.one_of(st.sampled_from(["auto", "none", "required"]),
                                                st.fixed_dictionaries({"type": st.just("function"),
                                                                       "function": st.fixed_dictionaries({"name": ident})})))
        if draw(st.integers(0, 3)) == 0:
            req["chat_template_kwargs"] = draw(st.fixed_dictionaries(
                {}, optional={"thinking": st.booleans(), "preserve_thinking": st.booleans()}))
        if draw(st.integers(0, 4)) == 0:
            req["max_tokens"] = draw(st.one_of(st.integers(1, 4096), st.none()))
        if draw(st.integers(0, 6)) == 0:
            req["add_generation_prompt"] = draw(st.booleans())
        if draw(st.integers(0, 6)) == 0:
            req["continue_final_message"] = draw(st.booleans())
        if draw(st.integers(0, 9)) == 0:
            req["parallel_tool_calls"] = draw(st.booleans())
        if templates and draw(st.integers(0, 49)) == 0:
            req["chat_template"] = draw(st.sampled_from(templates))
        return req

    return request()


def generated(seed: int, size: int) -> list[dict]:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed
    from hypothesis import strategies as st

    # Hypothesis mixes in string and number constants it finds in the local modules loaded at the time (and
    # caches them on disk), which makes the drawn values depend on more than the seed: switch that pool off.
    from hypothesis.internal.conjecture import providers
    providers._get_local_constants = lambda: providers.Constants()

    req = strategies()
    found: list[dict] = []

    @hseed(seed)
    @settings(max_examples=size, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def draw(data):
        if len(found) < size:
            found.append(data.draw(req))

    draw()
    return [{"id": f"generated:{seed}:{i}", "origin": "generated", "request": r} for i, r in enumerate(found)]


def build(seed: int, size: int) -> tuple[dict, list[dict]]:
    import hypothesis

    rows = real_api() + datasets(seed) + generated(seed, size)
    ids = Counter(r["id"] for r in rows)
    dup = [k for k, n in ids.items() if n > 1]
    if dup:
        raise SystemExit(f"duplicate ids: {dup[:5]}")
    counts = Counter(r["origin"] for r in rows)
    outside = sum(n for o, n in counts.items() if o != "generated")
    meta = {"corpus": "requests", "seed": seed, "generated_size": size, "generated_drawn": counts["generated"],
            "hypothesis": hypothesis.__version__, "total": len(rows), "not_generated": outside,
            "composition": dict(sorted(counts.items())),
            "caps": {"sharegpt_max_chars": SHAREGPT_MAX_CHARS, "sharegpt_max_requests": SHAREGPT_MAX_REQUESTS},
            "command": f"tools/server_vectors/outside_requests.py --seed {seed} --generated {size}"}
    return meta, rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--generated", type=int, default=2500, help="how many hypothesis-generated requests")
    p.add_argument("-o", "--out", required=True)
    a = p.parse_args(argv)
    meta, rows = build(a.seed, a.generated)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from shared import compact_requests, dumps_line, write_jsonl_gz

    if a.out.endswith(".gz"):  # the committed form: gzip, deterministic, repeated tools and messages named once
        meta["compacted"] = "tools_from / messages_from name an earlier request's tools / first N messages"
        write_jsonl_gz(Path(a.out), [{"meta": meta}, *compact_requests(rows)])
    else:
        with open(a.out, "w", encoding="utf-8") as f:
            f.write(dumps_line({"meta": meta}) + "\n")
            for r in rows:
                f.write(dumps_line(r) + "\n")
    print(f"{len(rows)} requests ({meta['not_generated']} not generated) -> {a.out}: {meta['composition']}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
