"""The request side of a serving stack: what a server does to a chat request before and after the template.

vLLM and SGLang preprocess a request's messages and tools before Moonshot's ``apply_chat_template`` (arguments
re-serialised, tool text parts joined, ``None`` keys dropped, tools deep-sorted) and tokenize the rendered prompt
whole. :func:`preprocess_request` applies a :class:`~kimi_eagle.serving.profile.ServingProfile`'s prompt side to
request messages and tools, and :func:`served_prompt_pieces` to the rendered prompt pieces (``marker_text``).
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any, Iterable, Mapping

from kimi_eagle.chat.completion import CONTENT, SPECIAL, Piece
from kimi_eagle.records import RecordError
from kimi_eagle.serving.profile import ServingProfile

# --------------------------------------------------------------------------------------------
# Prompt side


def deep_sort(value: Any) -> Any:
    """Every mapping of ``value`` with its keys sorted, recursively (lists keep their order)."""
    if isinstance(value, dict):
        return {k: deep_sort(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [deep_sort(v) for v in value]
    return value


def _reserialised(arguments: Any, profile: ServingProfile, where: str) -> Any:
    """A history call's arguments after the server's ``json.loads`` (the template then writes ``tojson``)."""
    if not arguments:  # None or "": vLLM sets {}, SGLang's loads of "" fails (None is left alone)
        rule = profile.empty_arguments if arguments == "" or profile.empty_arguments == "empty_object" else "verbatim"
        value: Any = {}
    elif not isinstance(arguments, str):
        return arguments
    else:
        try:
            value = json.loads(arguments)
            rule = "parsed" if isinstance(value, dict) else profile.nonobject_arguments
        except ValueError:
            rule = profile.invalid_arguments
    if rule == "reject":
        raise RecordError(f"{where}: the {profile.name} server refuses these arguments ({arguments!r:.40})")
    if rule == "verbatim":
        return arguments
    return {} if rule == "empty_object" else value


def _history_calls(m: dict, profile: ServingProfile, i: int) -> dict:
    calls = []
    for j, call in enumerate(m["tool_calls"]):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict):
            calls.append(call)
            continue
        args = _reserialised(fn.get("arguments"), profile, f"request.messages[{i}].tool_calls[{j}].function.arguments")
        calls.append({**call, "function": {**fn, "arguments": args}})
    return {**m, "tool_calls": calls}


def _joined_text(m: dict, joiner: str, drop_empty: bool) -> dict:
    """``m`` with its content parts joined into one string (only when every part is text)."""
    c = m.get("content")
    if not isinstance(c, list) or not all(isinstance(p, str) or isinstance(p, dict) and p.get("type") == "text"
                                          for p in c):
        return m
    texts = [p if isinstance(p, str) else p.get("text", "") for p in c]
    if drop_empty:  # vLLM: a part whose text is None is skipped, an empty one is not appended
        texts = [t for t in texts if t is not None and t != ""]
    return {**m, "content": joiner.join(_text(t) for t in texts)}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


def preprocess_request(messages: list[dict], tools: list | None,
                       profile: ServingProfile) -> tuple[list[dict], list | None]:
    """``(messages, tools)`` as ``profile``'s server hands them to the template (inputs are not mutated).

    ``messages`` are the normalised request messages (:func:`~kimi_eagle.chat.messages.normalise_messages`);
    RecordError when the server would refuse the request (``reject`` rules).
    """
    if profile.sort_tools and tools:
        tools = deep_sort(tools)
    out = []
    for i, m in enumerate(messages):
        if profile.drop_none_keys:
            m = {k: v for k, v in m.items() if v is not None}
        if profile.history_arguments == "reserialise" and m.get("role") == "assistant" and isinstance(
                m.get("tool_calls"), list):
            m = _history_calls(m, profile, i)
        if profile.tool_part_join is not None and (profile.part_join_roles == "all" or m.get("role") == "tool"):
            m = _joined_text(m, profile.tool_part_join, profile.empty_parts == "drop")
        out.append(m)
    return out, tools


def served_prompt_pieces(pieces: Iterable[Piece], profile: ServingProfile,
                         specials: Mapping[str, int]) -> list[Piece]:
    """The rendered prompt ``pieces`` as ``profile``'s server tokenizes them (``specials``: the tokenizer's
    special spellings, e.g. ``tok.special_id_by_text``).

    ``marker_text = "text"``: unchanged. ``"special"``: the server tokenizes the rendered string whole, so every
    special spelling in its plain text (a ``</think>`` in content, a ``<|im_end|>`` in a tool result) becomes
    that special token; consecutive plain pieces are scanned as the one string they render to.

    >>> from kimi_eagle.chat.completion import TEXT
    >>> from kimi_eagle.serving.profiles import get_profile
    >>> served_prompt_pieces([("a</th", TEXT), ("ink>b", TEXT)], get_profile("template", marker_text="special"),
    ...                      {"</think>": 1})
    [('a', 2), ('</think>', 1), ('b', 2)]
    """
    if profile.marker_text == "text":
        return list(pieces)
    pattern = _special_pattern(frozenset(specials))
    out: list[Piece] = []
    run: list[Piece] = []

    def flush() -> None:
        text = "".join(t for t, _ in run)
        if pattern is None or pattern.search(text) is None:
            out.extend(run)
        else:
            at = 0
            for found in pattern.finditer(text):
                if found.start() > at:
                    out.append((text[at:found.start()], CONTENT))
                out.append((found.group(), SPECIAL))
                at = found.end()
            if at < len(text):
                out.append((text[at:], CONTENT))
        run.clear()

    for piece in pieces:
        if piece[1] == SPECIAL and piece[0] in specials:
            flush()
            out.append(piece)
        else:
            run.append(piece)
    flush()
    return out


@lru_cache(maxsize=8)
def _special_pattern(specials: frozenset[str]) -> re.Pattern | None:
    """One regex for the spellings, longest first (no spelling is a prefix of another at the same place)."""
    return re.compile("|".join(re.escape(t) for t in sorted(specials, key=len, reverse=True))) if specials else None


def history_call_count(messages: list[dict]) -> int:
    """Tool calls in the request's assistant messages (SGLang's ``history_tool_calls_cnt``)."""
    return sum(len(m.get("tool_calls") or []) for m in messages
               if isinstance(m, dict) and m.get("role") == "assistant" and isinstance(m.get("tool_calls"), list))
