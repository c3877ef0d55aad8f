"""Streaming answers in the OpenAI / OpenRouter chunk form (``stream: true``), built from the non-streaming answer.

A stream is a sequence of server-sent events, each ``data: {chunk}`` and a blank line, closed by ``data: [DONE]``:

1. the **role chunk**: ``delta`` holds ``role`` and, for every other field of the final message but
   ``tool_calls``, its starting value (``""`` for a field that ends up a string, ``null`` for one that stays null);
2. ``reasoning`` deltas, then ``content`` deltas (one per sampled token where the format maps tokens to text,
   else pieces of the text), then ``tool_calls`` deltas by ``index``: the first names ``id``, ``type`` and
   ``function.name`` with empty ``arguments``, the next ones carry argument fragments;
3. the **finish chunk**: an empty ``delta`` with ``finish_reason`` and ``native_finish_reason``;
4. with ``stream_options.include_usage``: a **usage chunk** with ``choices: []`` and ``usage``
   (every earlier chunk then has ``"usage": null``, as OpenAI sends it);
5. ``data: [DONE]``.

Appending the deltas of each field in order gives the non-streaming message exactly. Logprob entries
(``choices[0].logprobs.content``) ride on the text chunks, in token order. ``: OPENROUTER PROCESSING``
comment lines (OpenRouter's keep-alive) may come before any chunk; clients must skip lines starting
with ``:``. A generation that fails after the stream started ends with OpenRouter's mid-stream error
chunk: a top-level ``error`` object and ``finish_reason: "error"``.
"""
from __future__ import annotations

import codecs
import json
from typing import Any, Iterable, Sequence

KEEPALIVE = b": OPENROUTER PROCESSING\n\n"
DONE = b"data: [DONE]\n\n"
TEXT_PIECE_CHARS = 16  # piece size where the stream cannot follow token boundaries


def event(obj: dict[str, Any]) -> bytes:
    """One server-sent event carrying ``obj``."""
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode("utf-8") + b"\n\n"


def token_text_pieces(token_bytes: Sequence[bytes]) -> list[str]:
    """Incremental UTF-8 decoding of the tokens (invalid bytes replaced): piece ``i`` is the text that token ``i``
    completes, so ``"".join(pieces)`` equals ``b"".join(token_bytes).decode("utf-8", "replace")``."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pieces = [decoder.decode(b) for b in token_bytes]
    tail = decoder.decode(b"", final=True)
    if tail:
        if pieces:
            pieces[-1] += tail
        else:
            pieces.append(tail)
    return pieces


def text_pieces(text: str, size: int = TEXT_PIECE_CHARS) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


def _role_delta(message: dict[str, Any]) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    for key, value in message.items():
        if key == "role":
            delta[key] = value
        elif key != "tool_calls":
            delta[key] = "" if isinstance(value, str) else None
    return delta


def message_deltas(message: dict[str, Any], content_pieces: list[str] | None = None) -> list[dict[str, Any]]:
    """The deltas after the role chunk that rebuild ``message``: reasoning, content (``content_pieces`` when
    given, e.g. one per token), then each tool call (id, type and name first, argument fragments after)."""
    deltas: list[dict[str, Any]] = []
    if isinstance(message.get("reasoning"), str):
        deltas += [{"reasoning": p} for p in text_pieces(message["reasoning"])]
    content = message.get("content")
    if isinstance(content, str):
        pieces = content_pieces if content_pieces is not None else text_pieces(content)
        deltas += [{"content": p} for p in pieces]
    for index, call in enumerate(message.get("tool_calls") or []):
        fn = call["function"]
        deltas.append({"tool_calls": [{"index": index, "id": call["id"], "type": call.get("type", "function"),
                                       "function": {"name": fn["name"], "arguments": ""}}]})
        deltas += [{"tool_calls": [{"index": index, "function": {"arguments": p}}]}
                   for p in text_pieces(fn.get("arguments") or "")]
    return deltas


def _shares(n_items: int, n_slots: int) -> list[tuple[int, int]]:
    """Split ``range(n_items)`` into ``n_slots`` consecutive ranges, in order, as evenly as possible."""
    return [(k * n_items // n_slots, (k + 1) * n_items // n_slots) for k in range(n_slots)]


def answer_chunks(response: dict[str, Any], content_pieces: list[str] | None = None,
                  include_usage: bool = False) -> list[dict[str, Any]]:
    """The chunk objects of a streamed chat answer equal to the non-streaming ``response``."""
    choice = response["choices"][0]
    message = choice["message"]
    head = {k: response[k] for k in ("id", "provider", "model", "created")}
    head["object"] = "chat.completion.chunk"
    usage_field = {"usage": None} if include_usage else {}
    logprobs = (choice.get("logprobs") or {}).get("content")

    def chunk(delta: dict[str, Any], finish: str | None = None, entries: list | None = None) -> dict[str, Any]:
        lp = None if entries is None else {"content": entries, "refusal": None}
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish,
                                     "native_finish_reason": finish, "logprobs": lp}], **usage_field}

    deltas = message_deltas(message, content_pieces)
    chunks = [chunk(_role_delta(message), entries=[] if logprobs is not None else None)]
    slots = _shares(len(logprobs), len(deltas)) if logprobs is not None and deltas else []
    for k, delta in enumerate(deltas):
        chunks.append(chunk(delta, entries=logprobs[slots[k][0]:slots[k][1]] if slots else None))
    if logprobs and not deltas:
        chunks.append(chunk({}, entries=logprobs))
    chunks.append(chunk({}, choice["finish_reason"]))
    chunks[-1]["choices"][0]["native_finish_reason"] = choice.get("native_finish_reason", choice["finish_reason"])
    if include_usage:
        chunks.append({**head, "choices": [], "usage": response["usage"]})
    return chunks


def error_chunk(response_id: str, model: str, provider: str, created: int, status: int, message: str) -> dict[str, Any]:
    """OpenRouter's mid-stream error event: the error at the top level, the choice finished with ``error``."""
    return {"id": response_id, "object": "chat.completion.chunk", "created": created, "model": model,
            "provider": provider, "error": {"code": status, "message": message},
            "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "error",
                         "native_finish_reason": "error", "logprobs": None}]}


def stream_bytes(chunks: Iterable[dict[str, Any]]) -> list[bytes]:
    """The events of ``chunks`` followed by ``[DONE]``."""
    return [event(c) for c in chunks] + [DONE]


CUT = None  # yielded by an event source to drop the connection there (fault injection)


class SSEResponse:
    """An ASGI ``text/event-stream`` reply fed by an async iterator of event bytes. An item :data:`CUT` stops
    without finishing the HTTP message, so the connection drops mid-stream."""

    def __init__(self, events: Any, headers: dict[str, str]) -> None:
        self.events = events
        self.headers = headers

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        headers = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
        headers += [(k.lower().encode(), v.encode()) for k, v in self.headers.items()]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        async for data in self.events:
            if data is CUT:
                return  # the HTTP message is never finished: the server closes the connection
            await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
