"""``reasoning_details``: OpenRouter's typed reasoning blocks, read beside ``message.reasoning``.

A block is ``{"type": "reasoning.text", "text"}`` (the reasoning itself), ``{"type": "reasoning.summary",
"summary"}`` (a provider's summary of it) or ``{"type": "reasoning.encrypted", "data"}`` (opaque). The
reasoning text of an answer is its ``reasoning.text`` blocks joined in order. :func:`reasoning_details_flags`
cross-checks that text with ``message.reasoning`` (flag ``reasoning_details_mismatch`` when both are there and
differ) and refuses, by name, an answer whose reasoning is encrypted or only summarised: the model's reasoning
tokens are then not in the answer, and a row built from what is there would be silently short.
"""
from __future__ import annotations

from typing import Any

from kimi_eagle.records import RecordError

REASONING_FLAGS = ("reasoning_details_mismatch",)


def reasoning_blocks(message: Any) -> list[dict]:
    """The ``reasoning_details`` blocks of a message (objects only; anything else is no block)."""
    details = message.get("reasoning_details") if isinstance(message, dict) else None
    return [d for d in details if isinstance(d, dict)] if isinstance(details, list) else []


def reasoning_details_text(message: Any) -> str | None:
    """The ``reasoning.text`` blocks' text joined in order, or None when there are none."""
    texts = [b["text"] for b in reasoning_blocks(message) if b.get("type") == "reasoning.text"
             and isinstance(b.get("text"), str)]
    return "".join(texts) if texts else None


def reasoning_details_flags(message: Any) -> list[str]:
    """Flags from checking ``reasoning_details`` against ``reasoning``; ``RecordError`` when the reasoning is
    encrypted (wholly or in part) or present only as a summary."""
    blocks = reasoning_blocks(message)
    kinds = {b.get("type") for b in blocks}
    if "reasoning.encrypted" in kinds:
        part = "partly " if "reasoning.text" in kinds else ""
        raise RecordError(f"reasoning is {part}encrypted: the model's reasoning tokens are not in the answer "
                          "(reasoning_details has reasoning.encrypted blocks)")
    text = reasoning_details_text(message)
    if text is None and "reasoning.summary" in kinds:
        raise RecordError("reasoning is summary-only: the model's reasoning tokens are not in the answer "
                          "(reasoning_details has reasoning.summary blocks and no reasoning.text)")
    reasoning = message.get("reasoning") if isinstance(message, dict) else None
    if text is not None and isinstance(reasoning, str) and reasoning and reasoning != text:
        return ["reasoning_details_mismatch"]
    return []
