"""The request side of a serving stack: what a server does to a chat request before and after the template.

vLLM and SGLang preprocess a request's messages and tools before Moonshot's ``apply_chat_template`` (arguments
re-serialised, tool text parts joined, ``None`` keys dropped, tools deep-sorted) and tokenize the rendered prompt
whole. :func:`preprocess_request` applies a :class:`~kimi_eagle.serving.profiles.ServingProfile`'s prompt side to
request messages and tools, and :func:`served_prompt_pieces` to the rendered prompt pieces (``marker_text``).
"""
from __future__ import annotations

import json
import re
from dataclasses import replace
from functools import lru_cache
from typing import Any, Iterable, Mapping

from kimi_eagle.chat.completion import CONTENT, SPECIAL, Piece
from kimi_eagle.chat.messages import normalise_messages
from kimi_eagle.records import RecordError
from kimi_eagle.serving.profiles import ServingProfile
from kimi_eagle.serving.refusal import LONE_SURROGATE

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
        raise RecordError(f"{profile.name} would answer 400: {where}: it refuses these arguments ({arguments!r:.40})")
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


def _request_rules(name: str) -> tuple[Any, Any]:
    """``(check, served)`` of a server version's request side: its refusals, then what it hands on."""
    if name == "sglang-0.5":
        from kimi_eagle.serving import sglang_request as rules

        return rules.check, rules.served_request
    from kimi_eagle.serving import vllm_request as rules

    return (lambda request: rules.check(request, version=name)), rules.served_request


def serve_request(request: dict, profile: ServingProfile) -> tuple[dict, list[dict], list | None]:
    """``(request, messages, tools)`` as ``profile``'s server hands them to the template: its request checks first
    (``request_rules``: a refused request is a RecordError ``<profile> would answer <status>: <reason>``), then
    the kit's message normalisation and :func:`preprocess_request`."""
    if profile.request_rules != "none":
        check, served = _request_rules(profile.request_rules)
        try:
            request = served(check(request))
        except ValueError as e:
            status = getattr(e, "status", 400)
            raise RecordError(f"{profile.name} would answer {status}: {e}") from None
        request = _surrogates_replaced(request)
    messages = normalise_messages(request.get("messages"))
    tools = request.get("tools")
    if isinstance(request.get(SERVED), dict) and request[SERVED].get("no_tools"):
        tools = None  # tool_choice "none": the server declares no tools
    if tools is not None and not isinstance(tools, list):
        raise RecordError("request.tools is not a list")
    messages, tools = preprocess_request(messages, tools, profile)
    return request, messages, tools


SERVED = "_served"  # what a server version decided about a request beyond its messages (request_rules)


def _replaced(value: Any) -> tuple[Any, bool]:
    """``value`` with every lone surrogate in its strings replaced by U+FFFD, and whether one was (a copy where so;
    request JSON is depth-bounded where it is read)."""
    if isinstance(value, str):
        return (LONE_SURROGATE.sub("\ufffd", value), True) if LONE_SURROGATE.search(value) else (value, False)
    if isinstance(value, list):
        pairs = [_replaced(v) for v in value]
        return ([v for v, _ in pairs], True) if any(c for _, c in pairs) else (value, False)
    if isinstance(value, dict):
        pairs = {k: _replaced(v) for k, v in value.items()}
        return ({k: v for k, (v, _) in pairs.items()}, True) if any(c for _, c in pairs.values()) else (value, False)
    return value, False


def _surrogates_replaced(request: dict) -> dict:
    """Both servers read a lone surrogate in a message (valid JSON, not valid Unicode) as U+FFFD; the request says
    so under ``_served`` (flag ``lone_surrogate_replaced`` on the row)."""
    messages, changed = _replaced(request.get("messages"))
    if not changed:
        return request
    served = request.get(SERVED) if isinstance(request.get(SERVED), dict) else {}
    return {**request, "messages": messages, SERVED: {**served, "surrogates_replaced": True}}


def prompt_pieces(fmt: Any, messages: list[dict], tools: list | None, request: dict) -> list[Piece]:
    """The prompt pieces as the server renders them: the template settings the request passed
    (``chat_template_kwargs`` ``thinking`` and ``preserve_thinking``, for formats that have them); without the
    generation prompt where the request asks (``add_generation_prompt: false``); a final message continued
    (``continue_final_message``: the prompt ends where that message's text ends, RecordError where the text is not
    in the prompt); or the text of a continued assistant message after the generation prompt (SGLang's
    ``assistant_prefix``, opened with ``</think>`` where the prompt leaves a reasoning block open)."""
    served = request.get(SERVED) if isinstance(request.get(SERVED), dict) else {}
    settings = {k: served[k] for k in ("thinking", "preserve_thinking")
                if isinstance(served.get(k), bool) and hasattr(fmt, k)}
    if settings:
        fmt = replace(fmt, **settings)
    pieces = list(fmt.prompt_pieces(messages, tools))
    if served.get("add_generation_prompt") is False or served.get("continue_final_message"):
        ends = [i for i, piece in enumerate(pieces) if piece == ("<|im_end|>", SPECIAL)]
        pieces = pieces[:ends[-1] + 1] if ends else pieces
    if served.get("continue_final_message"):
        return _continued(pieces, messages)
    prefix = served.get("assistant_prefix")
    if isinstance(prefix, str) and prefix:
        opener = ""
        pieces.append((opener + prefix, CONTENT))
    return pieces


def _continued(pieces: list[Piece], messages: list[dict]) -> list[Piece]:
    """The rendered prompt cut right after the final message's text (Hugging Face's ``continue_final_message``),
    as one string the server tokenizes whole."""
    final = (messages[-1].get("content") or "") if messages else None  # no content: the server's empty text
    if isinstance(final, list):
        texts = [p.get("text") for p in final if isinstance(p, dict) and isinstance(p.get("text"), str)]
        final = texts[-1] if texts else None
    if not isinstance(final, str):
        raise RecordError("continue_final_message: the final message has no text to continue")
    if not final.strip():  # nothing to find: the prompt ends where the final message's (empty) text would
        ends = [i for i, piece in enumerate(pieces) if piece == ("<|im_end|>", SPECIAL)]
        return [("".join(t for t, _ in (pieces[:ends[-1]] if ends else pieces)), CONTENT)]
    text = "".join(t for t, _ in pieces)
    at = text.rfind(final.strip())
    if at < 0:
        raise RecordError("continue_final_message: the final message's text is not in the rendered prompt")
    kept = len(final.lstrip()) if text[at:at + len(final.lstrip())] == final else len(final.strip())
    cut = at + kept
    return [(text[:cut], CONTENT)]
