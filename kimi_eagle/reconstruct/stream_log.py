"""Logged chunk streams (``stream: true`` answers) read as API records, for ``kimi-eagle convert --from openai-stream``.

A file is either raw SSE as it came off the wire (``data: {...}`` lines, ``:`` comments, ``data: [DONE]``;
blank lines between events optional) or JSONL, one payload per line. Payloads are read in order:

- a **chunk** (``object: "chat.completion.chunk"``, or ``choices[].delta``, or a mid-stream ``error`` event) joins
  the stream of its ``id``: one or many answers per file, interleaved or not, each assembled by
  :func:`kimi_eagle.reconstruct.stream.assemble_chunks` -- the OpenAI SDK's ``ChatCompletionChunk.model_dump()``
  and OpenRouter's chunks alike;
- a **request** (an object with ``messages`` and no ``choices``) belongs to the next stream that starts after it;
- a **logged stream** ``{"request": {...}, "chunks": [chunk, ...]}`` (or the request's own fields beside
  ``chunks``) is one answer; ``stream`` may stand for ``chunks``, and be the raw SSE text instead of a list.

Each answer becomes ``{"id", "dataset", "request", "response", "id_from"?, "stream": {"chunks", "done"}}``
through :func:`kimi_eagle.reconstruct.log_shapes.api_record_from_log` (the id: the record's own, else the
chunks' ``id``). An answer that cannot be used keeps what it has and carries an ``error`` instead of being
dropped: no request logged before it, no ``finish_reason`` (``stream_incomplete``), an error event, a chunk
that cannot be merged, a line that is not JSON.
"""
from __future__ import annotations

import json
import os
import re
from collections import deque
from typing import Any, Iterator

from kimi_eagle.io import UTF8_BOM, check_encoding, read_jsonl
from kimi_eagle.reconstruct.log_shapes import LogShapeError, api_record_from_log
from kimi_eagle.reconstruct.stream import DONE, SSEDecoder, StreamAssembler, StreamError, chunk_payloads, parse_sse

SOURCE = "openai-stream"
STREAM_KEYS = ("chunks", "stream")
SSE_LINE = re.compile(rb"(?m)^data:")  # a file with such a line is an SSE log (a request line may come first)


def is_chunk(obj: Any) -> bool:
    if not isinstance(obj, dict):
        return False
    if obj.get("object") == "chat.completion.chunk":
        return True
    choices = obj.get("choices")
    return (isinstance(choices, list) and any(isinstance(c, dict) and "delta" in c for c in choices)) or (
        "error" in obj and "id" in obj and "messages" not in obj)


def as_request(obj: Any) -> dict | None:
    """The request a payload logs on its own (``{"request": {...}}`` or the request's fields), else None."""
    if not isinstance(obj, dict):
        return None
    if set(obj) <= {"id", "dataset", "request"} and isinstance(obj.get("request"), dict):
        return obj["request"]
    if "messages" in obj and "choices" not in obj and not any(k in obj for k in STREAM_KEYS):
        return obj
    return None


def _payloads(path: str | os.PathLike) -> Iterator[tuple[str, Any, str | None]]:
    """``(where, payload, error)`` for every payload of the file, raw SSE or JSONL."""
    check_encoding(path)
    with open(path, "rb") as f:
        head = f.read(1 << 16).removeprefix(UTF8_BOM).lstrip()
    if head.startswith((b"data:", b":", b"event:", b"id:")) or SSE_LINE.search(head):
        decoder = SSEDecoder(loose=True)  # a request logged as a JSON line between events is read too
        k = 0
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                for event in decoder.feed(block):
                    k += 1
                    yield from _event_payload(event, k)
        for event in decoder.close():
            k += 1
            yield from _event_payload(event, k)
        return
    for line in read_jsonl(path):
        yield f"line {line.lineno}", line.obj, line.error


def _event_payload(event: Any, k: int) -> Iterator[tuple[str, Any, str | None]]:
    if event.data is None:
        return
    if event.data.strip() == DONE:
        yield f"event {k}", DONE, None
        return
    try:
        yield f"event {k}", json.loads(event.data), None
    except (ValueError, RecursionError) as e:
        yield f"event {k}", None, f"event {k}: data is not JSON ({str(e)[:80]})"


class _Stream:
    def __init__(self, where: str, request: Any, answer: int = 1) -> None:
        self.where, self.request, self.answer = where, request, answer
        self.request_after = False  # a request was logged after this stream started
        self.assembler = StreamAssembler()
        self.error: str | None = None
        self.done = False

    def add(self, chunk: Any) -> None:
        if self.error is None:
            try:
                self.assembler.add(chunk)
            except StreamError as e:
                self.error = f"{self.where}: {e}"


def _record(stream: _Stream, extra: dict) -> dict:
    """The API record of one assembled stream, ``extra`` (the request, or its fields, an id) beside its response;
    an ``error`` field when it cannot be used."""
    asm = stream.assembler
    response = asm.response()
    info = {"chunks": asm.chunks, "done": stream.done}
    if asm.usage_conflict:
        info["usage_conflict"] = asm.usage_conflict
    if stream.answer > 1:
        info["id_collision"] = stream.answer  # the n-th answer logged under one chunk id (never merged)
    error = stream.error
    if error is None and asm.error is not None:
        error = f"the stream carried an error event: {json.dumps(asm.error, ensure_ascii=False)[:300]}"
    if error is None and not asm.finished:
        how = "[DONE] came before a finish_reason" if stream.done else "a cut or unfinished stream"
        error = f"stream_incomplete: no finish_reason after {asm.chunks} chunks ({how})"
    if error is None and not isinstance(stream.request, dict):
        error = ("no request logged before this stream: its prompt cannot be rendered (log the request line "
                 'before its chunks, or {"request": {...}, "chunks": [...]})')
    if error is None:
        try:
            return {**api_record_from_log({**extra, "response": response}, SOURCE), "stream": info}
        except LogShapeError as e:
            error = str(e)
    rid = extra.get("id") if isinstance(extra.get("id"), str) else response.get("id")
    shown = rid if isinstance(rid, str) and rid else stream.where.replace(" ", "-")
    return {"id": f"{SOURCE}:{shown}", "dataset": SOURCE, "request": stream.request, "response": response,
            "stream": info, "error": error if error.startswith(stream.where) else f"{stream.where}: {error}"}


def _logged_stream(item: dict, where: str) -> dict:
    """One ``{"request"?, ..., "chunks": [...] | "stream": "data: ..."}`` item as its API record."""
    extra = {k: v for k, v in item.items() if k not in STREAM_KEYS}
    stream = _Stream(where, item.get("request", {k: v for k, v in extra.items() if k not in ("id", "dataset")}))
    chunks: Any = item.get("chunks", item.get("stream"))
    if isinstance(chunks, str):
        try:
            chunks, stream.done = chunk_payloads(parse_sse(chunks.encode("utf-8", "surrogatepass")))
        except StreamError as e:
            chunks, stream.error = [], f"{where}: {e}"
    if not isinstance(chunks, list):
        stream.error = f"{where}: `chunks` must be a list of chunk objects or the raw SSE text"
        chunks = []
    for chunk in chunks:
        stream.add(chunk)
    return _record(stream, extra)


def logged_stream_record(item: dict, where: str = "item 1") -> dict:
    """The API record of one logged stream ``{"id"?, "request", "chunks": [chunk, ...]}`` (``stream`` for
    ``chunks``, or the raw SSE text), as ``convert --from openai-stream`` makes it of such a line; ``where`` names
    the item in an ``error``."""
    return _logged_stream(item, where)


def stream_log_records(path: str | os.PathLike) -> Iterator[tuple[int, dict]]:
    """``(answer index, API record)`` for every answer in a logged stream file (see the module docstring).

    Requests logged before their streams are matched first in, first out with the streams in the order they start
    (interleaved answers after several requests each get their own); a request no stream takes is an error record
    in its place; a chunk id used again by a new answer (after the first finished and ``[DONE]`` or a newer request)
    starts a new record (``#2`` added to its id), never a merge."""
    open_streams: dict[str, _Stream] = {}
    order: list[tuple[str, Any]] = []  # ("stream", _Stream), ("request", [where, request, taken]) or ("record", record)
    pending: deque = deque()  # requests no stream has taken yet, oldest first
    for where, obj, error in _payloads(path):
        if error is not None or not (obj == DONE or isinstance(obj, dict)):
            problem = error or f"{where}: a {type(obj).__name__}, not a chunk, request or logged stream"
            order.append(("record", _error_record(where, problem)))
        elif obj == DONE:
            for stream in open_streams.values():
                stream.done = True
        elif any(k in obj for k in STREAM_KEYS) and not is_chunk(obj):
            order.append(("record", _logged_stream(obj, where)))
        elif as_request(obj) is not None:
            for stream in open_streams.values():
                stream.request_after = True
            pending.append(entry := [where, as_request(obj), False])
            order.append(("request", entry))
        elif is_chunk(obj):
            _add_chunk(obj, where, open_streams, pending, order)
        else:
            order.append(("record", _error_record(where, f"{where}: neither a chunk, a request nor a logged stream "
                                                        f"(fields: {', '.join(sorted(map(str, obj)))[:200]})")))
    index = 0
    for kind, value in order:
        if kind == "request" and value[2]:
            continue
        if kind == "request":
            value = {**_error_record(value[0], f"{value[0]}: a request with no answer logged after it"),
                     "request": value[1]}
        elif kind == "stream":
            extra = {"request": value.request}
            if value.answer > 1:
                extra["id"] = f"{value.assembler.top.get('id')}#{value.answer}"
            value = _record(value, extra)
        yield index, value
        index += 1


def _error_record(where: str, problem: str) -> dict:
    return {"id": f"{SOURCE}:{where.replace(' ', '-')}", "dataset": SOURCE, "error": problem}


def _add_chunk(obj: dict, where: str, open_streams: dict[str, _Stream], pending: deque, order: list) -> None:
    """Add one chunk to the stream of its id: a new stream (taking the oldest request not yet taken) when the id is
    new, or when its answer has finished, then ``[DONE]`` or a newer request was logged, and this chunk brings new
    text or calls (another answer under the same id)."""
    rid = obj.get("id")
    if not isinstance(rid, str) or not rid:
        order.append(("record", _error_record(where, f"{where}: a chunk without a string `id` cannot be grouped")))
        return
    current = open_streams.get(rid)
    if current is None or ((current.done or current.request_after) and current.assembler.continues_finished(obj)):
        request = None
        if pending:
            taken = pending.popleft()
            taken[2], request = True, taken[1]
        current = open_streams[rid] = _Stream(where, request, current.answer + 1 if current else 1)
        order.append(("stream", current))
    current.add(obj)
