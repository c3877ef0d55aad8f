"""What a client assembles from a streamed chat answer: shared by both collectors (stdlib only)."""
from __future__ import annotations


def assemble(chunks: list[dict], reasoning_key: str = "reasoning") -> dict:
    """The message a client assembles from streamed deltas (tool calls by ``index``; ``reasoning_key``: the
    server's reasoning field, ``reasoning`` for vLLM, ``reasoning_content`` for SGLang)."""
    reasoning, content, calls, finish = [], [], {}, None
    for chunk in chunks:
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get(reasoning_key) is not None:
                reasoning.append(delta[reasoning_key])
            if delta.get("content") is not None:
                content.append(delta["content"])
            for tc in delta.get("tool_calls") or []:
                slot = calls.setdefault(tc.get("index", len(calls)), {"id": None, "name": None, "arguments": ""})
                fn = tc.get("function") or {}
                slot["id"] = tc.get("id") or slot["id"]
                slot["name"] = fn.get("name") or slot["name"]
                slot["arguments"] += fn.get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    return {"message": {"reasoning": "".join(reasoning) if reasoning else None,
                        "content": "".join(content) if content else None,
                        "tool_calls": [calls[k] for k in sorted(calls)]},
            "finish_reason": finish}
