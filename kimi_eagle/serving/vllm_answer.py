"""The API message today's servers return for a raw Kimi completion (engine IDs), as their code does it.

:func:`served_answer` decodes the IDs as the server's detokenizer does (:mod:`~kimi_eagle.serving.detokenizer`),
runs the Kimi-K2 state machine (:mod:`~kimi_eagle.serving.parser_engine`; text mode for non-streamed answers, ID
mode for streamed ones) and assembles the message by the rules of the profile's ``answer_rules``:

``vllm-0.33`` (vLLM 0.33's parser engine, read off its answers to the seeded corpus in ``tests/data/servers``):

- reasoning right-stripped; content kept as decoded, but whitespace-only content beside returned calls
  dropped (non-streamed);
- a call's id is its header stripped, up to the last ``:N`` (``functions.ns.search:0``); its name the id
  before the first ``:`` minus ``functions.`` (dotted names kept whole); a header without ``:N`` and
  without arguments becomes a call named after the header with a random ``chatcmpl-tool-...`` id; one
  with arguments is dropped unless the arguments name it (``{"name": ...}``);
- arguments stripped, ``{}`` when empty (non-streamed), as written (streamed); values whose JSON type
  disagrees with the declared tool's schema are coerced and the arguments re-serialised;
- a call cut by the length limit comes back with its cut arguments; ``stop`` becomes ``tool_calls`` when a
  call is returned, ``length`` stays.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from kimi_eagle.serving.detokenizer import DetokOptions, served_pieces
from kimi_eagle.serving.parser_engine import MARKER_TEXTS, RawCall, lex_ids, lex_text, run_machine
from kimi_eagle.tokenize.tokenizer import Tokenizer

_HEADER_ID = re.compile(r"(?P<id>.+:\d+)", re.S)
_NAME_IN_ARGS = re.compile(r'"name"\s*:\s*"([^"]*)"')
RANDOM_ID = "chatcmpl-tool-"  # the prefix of vLLM's random ids (the rest is not reproducible)


@dataclass(frozen=True)
class ServedOptions:
    """How one server version answers: its decode, the parser mode and the request context."""

    spaces: bool = True
    streaming: bool = False
    thinking: bool = True
    finish_reason: str = "stop"
    prompt_tail: tuple[int, ...] = (163606,)
    tools: tuple | None = ()  # the request's tools (``None``: unknown, calls returned, no coercion)
    stop_ids: frozenset[int] = frozenset({163585, 163586})
    kimi_ids: bool = False  # the model directory is a Kimi model type: made-up ids are functions.HEADER:N


@dataclass
class ServedAnswer:
    reasoning: str | None
    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str = "stop"
    calls_written: int = 0
    text: str = ""


def _special_tables(tok: Tokenizer) -> tuple[dict[int, str], frozenset[int], tuple[str, ...]]:
    """Marker IDs, the IDs of other named specials the parser drops, and their spellings."""
    by_text = tok.special_id_by_text
    markers = {by_text[m]: m for m in MARKER_TEXTS if m in by_text}
    drops = tok.skipped_special_ids - set(markers)
    return markers, drops, tuple(tok.special_text_by_id[i] for i in sorted(drops))


def served_answer(ids: Sequence[int], tok: Tokenizer, opts: ServedOptions) -> ServedAnswer:
    """What vLLM 0.33 (the ``vllm-0.33*`` profiles) returns for the engine's output ``ids``."""
    ids = list(ids)
    if opts.finish_reason == "stop" and ids and ids[-1] in opts.stop_ids:
        ids = ids[:-1]  # the token that stopped generation is not decoded
    markers, drop_ids, drop_texts = _special_tables(tok)
    pieces = served_pieces(ids, tok, DetokOptions(spaces=opts.spaces), opts.prompt_tail)
    units = lex_ids(pieces, ids, markers, drop_ids) if opts.streaming else lex_text("".join(pieces), drop_texts)
    machine = run_machine(units, thinking=opts.thinking)
    calls = _kimi_ids([c for c in (_call(raw, opts) for raw in machine.calls) if c is not None], opts)
    if opts.tools is not None and not opts.tools:
        calls = []  # no tools declared: the section is parsed out of the content, no call returned
    content = machine.content
    if machine.calls and not content.strip():
        content = ""  # whitespace-only content before a tool section is dropped (a call started, valid or not)
    finish = "tool_calls" if calls and opts.finish_reason == "stop" else opts.finish_reason
    return ServedAnswer(reasoning=machine.reasoning.rstrip() or None, content=content or None, tool_calls=calls,
                        finish_reason=finish, calls_written=len(machine.calls), text="".join(pieces))


def _call(raw: RawCall, opts: ServedOptions) -> dict[str, Any] | None:
    """The API call vLLM returns for one raw call, or ``None`` when it returns none."""
    if not raw.header and not raw.args:
        return None
    m = _HEADER_ID.match(raw.header.strip())
    if m:
        tool_id = m.group("id").strip()
        name = tool_id.split(":")[0].removeprefix("functions.")
    elif raw.args:
        named = _NAME_IN_ARGS.search(raw.args)
        if not named or not named.group(1):
            return None
        tool_id, name = RANDOM_ID, named.group(1)
    else:
        tool_id, name = RANDOM_ID, raw.header if opts.streaming else raw.header.strip()
        if not name:
            return None
        if opts.kimi_ids:
            tool_id = RANDOM_ID + raw.header  # the header as decoded names the made-up id (_kimi_ids)
    args = raw.args if opts.streaming else (raw.args.strip() or "{}")
    if not opts.streaming:
        args = coerce_arguments(args, name, opts.tools or ())
    return {"id": tool_id, "type": "function", "function": {"name": name, "arguments": args}}


def _kimi_ids(calls: list[dict[str, Any]], opts: ServedOptions) -> list[dict[str, Any]]:
    """For a Kimi model type, vLLM makes up ``functions.NAME:N`` ids (NAME the header as decoded, spaces included; N
    counting the made-up ids of the answer from 0, whatever the request's history: recorded from vLLM 0.34) where
    other models get a random ``chatcmpl-tool-...`` id."""
    if not opts.kimi_ids:
        return calls
    out, k = [], 0
    for c in calls:
        if c["id"].startswith(RANDOM_ID):
            made = c["id"][len(RANDOM_ID):] or c["function"]["name"]
            c = {**c, "id": f"functions.{made}:{k}"}
            k += 1
        out.append(c)
    return out


# --------------------------------------------------------------------------------------------
# Schema coercion (vLLM corrects argument values whose type disagrees with the declared tool)


def _schema_types(schema: Any) -> set[str]:
    if not isinstance(schema, dict):
        return {"string"}
    types: set[str] = set()
    t = schema.get("type")
    types.update([t] if isinstance(t, str) else [x for x in t if isinstance(x, str)] if isinstance(t, list) else [])
    for v in schema.get("enum") or [] if isinstance(schema.get("enum"), list) else []:
        types.add("null" if v is None else "boolean" if isinstance(v, bool) else "integer" if isinstance(v, int)
                  else "number" if isinstance(v, float) else "string" if isinstance(v, str)
                  else "array" if isinstance(v, list) else "object")
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list):
            for choice in schema[key]:
                types |= _schema_types(choice)
    return types or {"string"}


def _from_string(value: str, types: set[str]) -> Any:
    """A string value read as the first of the schema's types it parses as (null, integer, number, ...)."""
    for t in ("null", "integer", "number", "boolean", "object", "array", "string"):
        if t not in types:
            continue
        got = _try_type(value, t)
        if got is not _NO:
            return got
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    return parsed if _finite(parsed) else value


_NO = object()


def _try_type(value: str, t: str) -> Any:
    if t == "string":
        return value
    if t == "null":
        return None if value.lower() == "null" else _NO
    if t in ("integer", "number"):
        try:
            return int(value)
        except ValueError:
            pass
        if t == "integer":
            return _NO
        try:
            f = float(value)
        except ValueError:
            return _NO
        return _NO if f != f or f in (float("inf"), float("-inf")) else (f if f != int(f) else int(f))
    if t == "boolean":
        low = value.lower().strip()
        return True if low in ("true", "1") else False if low in ("false", "0") else _NO
    try:
        parsed = json.loads(value)
    except ValueError:
        return _NO
    return parsed if _finite(parsed) else _NO


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return value == value and value not in (float("inf"), float("-inf"))
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    return True


def _coerce(value: Any, schema: dict) -> tuple[Any, bool]:
    if isinstance(value, str):
        got = _from_string(value, _schema_types(schema))
        return got, got is not value
    if isinstance(value, dict):
        props = schema.get("properties")
        return value, isinstance(props, dict) and _coerce_dict(value, props)
    if isinstance(value, list):
        items = schema.get("items")
        changed = False
        if isinstance(items, dict):
            for k, item in enumerate(value):
                new, c = _coerce(item, items)
                if c:
                    value[k], changed = new, True
        return value, changed
    got = _from_string(json.dumps(value, ensure_ascii=False), _schema_types(schema))
    return got, type(got) is not type(value) or got != value


def _coerce_dict(args: dict, props: dict) -> bool:
    changed = False
    for key, value in args.items():
        if isinstance(props.get(key), dict):
            new, c = _coerce(value, props[key])
            if c:
                args[key], changed = new, True
    return changed


def _tool_properties(tools: Sequence[Any], name: str) -> dict:
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if isinstance(fn, dict) and fn.get("name") == name:
            params = fn.get("parameters") or {}
            return params.get("properties") or {} if isinstance(params, dict) else {}
    return {}


def coerce_arguments(args: str, name: str, tools: Sequence[Any]) -> str:
    """``args`` with values coerced to the declared tool's schema (re-serialised only when one changed)."""
    props = _tool_properties(tools, name) if tools and name else {}
    if not props:
        return args
    try:
        value = json.loads(args)
    except ValueError:
        return args
    if not isinstance(value, dict) or not _coerce_dict(value, props):
        return args
    return json.dumps(value, ensure_ascii=False)


# --------------------------------------------------------------------------------------------
# As a ParsedCompletion, with flags naming what the server changed


def served_flags(answer: ServedAnswer, written: Any, spaces: bool) -> list[str]:
    """What the server's answer lost or changed against what the model wrote (``written``: the
    :class:`~kimi_eagle.chat.parse.ParsedCompletion` of the IDs as written, ``serving="template"``)."""
    flags: list[str] = []
    calls = answer.tool_calls
    if len(calls) < len(written.tool_calls) or len(calls) < answer.calls_written:
        flags.append("dropped_by_server")  # a call written (no tools declared, an id it could not read) not returned
    if any(c["id"] == RANDOM_ID for c in calls):
        flags.append("tool_id_random")  # a made-up chatcmpl-tool-<random> id: the model's header is lost
    elif len(calls) > len([c for c in written.tool_calls if _HEADER_ID.match(c.get("id", "").strip())]):
        flags.append("tool_id_made_up")  # functions.HEADER:N made up for a header without :N (Kimi model types)
    model_args = [c["function"]["arguments"] for c in written.tool_calls]
    if any(c["function"]["arguments"] not in (a, a.strip()) for c, a in zip(calls, model_args)):
        flags.append("arguments_rewritten")  # {} for empty arguments, or values coerced to the tool's schema
    if _stripped(answer, written, model_args):
        flags.append("whitespace_stripped")
    if spaces:
        flags.append("detokenizer_spaces")  # spaces_between_special_tokens: the text has spaces the model did not write
    return flags


def _stripped(answer: ServedAnswer, written: Any, model_args: list[str]) -> bool:
    """Did the server drop whitespace the model wrote (trailing reasoning, whitespace-only content, around arguments)?"""
    r = written.reasoning or ""
    c = written.content or ""
    return (r != r.rstrip() or (c and not c.strip() and answer.content is None)
            or any(a != a.strip() for a in model_args))


def parse_served(ids: Sequence[int], tok: Tokenizer, profile: Any, options: Any, written: Any,
                 start: str) -> tuple[ServedAnswer, list[str]]:
    """The answer of ``profile``'s server version for ``ids`` and the flags of what it changed.

    ``options``: the :class:`~kimi_eagle.chat.parse.ParseOptions`; ``written``: the IDs parsed as written
    (``serving="template"``); ``start``: where the format's completion begins (``reasoning``, ``think_begin``,
    ``content``). Called by :func:`~kimi_eagle.serving.answer.parse_completion` for ``answer_rules = "vllm-0.33"``
    (SGLang's: :func:`kimi_eagle.serving.sglang_answer.parse_sglang`).
    """
    finish = options.finish_reason or ("stop" if ids and ids[-1] in ServedOptions.stop_ids else "length")
    opts = ServedOptions(spaces=profile.spaces_between_special_tokens, streaming=profile.streaming,
                         thinking=start != "content", finish_reason=finish, prompt_tail=prompt_tail(tok, start),
                         tools=tuple(options.tools) if options.tools is not None else None,
                         kimi_ids=profile.tool_id_type == "kimi_k2")
    answer = served_answer(ids, tok, opts)
    flags = [f for f in written.flags if f not in ("whitespace_stripped",)]
    return answer, flags + served_flags(answer, written, opts.spaces)


# the generation prompt's last token, per where the completion starts (all are added tokens: a space follows)
PROMPT_TAIL = {"reasoning": "<think>", "think_begin": "<|im_middle|>", "content": "</think>"}


def prompt_tail(tok: Tokenizer, start: str) -> tuple[int, ...]:
    """The generation prompt's last token where the completion begins at ``start`` (an added token: a space
    follows it in a spaced decode); empty for a tokenizer without it (a non-Kimi tokenizer: nothing to seed)."""
    tail = tok.special_id_by_text.get(PROMPT_TAIL[start])
    return (tail,) if tail is not None else ()
