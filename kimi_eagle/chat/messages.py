"""Request messages as the chat formats read them: validated, with ``reasoning`` copied to ``reasoning_content``.

Both sides of the format use this: reconstruction (API records) and the engine (requests it serves).
"""
from __future__ import annotations

from typing import Any

from kimi_eagle.records import RecordError

MAX_TEXT_CHARS = 400_000  # one reasoning/content/arguments string; the reference encodes in chunks of this size


def check_text(text: str, what: str) -> None:
    """Reject text the tokenizer cannot encode faithfully (lone surrogates, over-long strings)."""
    if len(text) > MAX_TEXT_CHARS:
        raise RecordError(f"{what} has {len(text):,} characters, over the {MAX_TEXT_CHARS:,}-character limit")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RecordError(f"{what} is not valid Unicode: lone surrogate {text[e.start]!r} at character {e.start}") from None



def normalise_messages(messages: Any) -> list[dict]:
    """Validate request messages; copy ``reasoning`` to ``reasoning_content`` (the field templates read)."""
    if not isinstance(messages, list):
        raise RecordError("request.messages is not a list")
    out = []
    for i, m in enumerate(messages):
        role = m.get("role") if type(m) is dict else None
        if not isinstance(role, str) or not role:
            raise RecordError(f"request.messages[{i}] is not a message with a role")
        c = m.get("content")
        if type(c) is str:
            if not c.isascii() or len(c) > MAX_TEXT_CHARS:  # ASCII cannot hold a lone surrogate
                check_text(c, f"request.messages[{i}].content")
        elif c is not None and not (isinstance(c, list) and all(isinstance(p, dict) for p in c)):
            raise RecordError(f"request.messages[{i}].content is neither a string nor a list of parts")
        calls = m.get("tool_calls")
        if calls:
            if not isinstance(calls, list):
                raise RecordError(f"request.messages[{i}].tool_calls is a {type(calls).__name__}, not a list")
            for j, call in enumerate(calls):
                if not isinstance(call, dict) or not isinstance(call.get("function"), dict) or "name" not in call["function"]:
                    raise RecordError(f"request.messages[{i}].tool_calls[{j}] has no function name")
        if role == "assistant" and "reasoning_content" not in m and isinstance(m.get("reasoning"), str):
            m = {**m, "reasoning_content": m["reasoning"]}
        out.append(m)
    return out
