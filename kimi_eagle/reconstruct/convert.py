"""``kimi-eagle convert``: real datasets -> API records, one per assistant turn.

Sources: ``glaive`` (LLaMA-Factory ShareGPT with ``function_call``/``observation`` turns and a
``tools`` JSON string), ``reason-tool-use`` (``messages`` with ``reasoning``/``text``/``tool_call``
parts), ``sharegpt`` (``conversations`` of ``from``/``value``; JSON array or JSONL) and ``openai``: your own
logs, one object per line or a JSON array, each either a logged completion — ``{"id"?, "request",
"response"}``, or the request's fields beside the ``response`` (the OpenAI SDK's ``model_dump()`` or
OpenRouter's response JSON), kept as logged with its ``usage``, ``provider``, ``finish_reason`` and ``model``
(see :mod:`kimi_eagle.reconstruct.log_shapes`) — or a conversation ``{"id"?, "messages", "tools"?}`` in
OpenAI chat format, one record per assistant turn.

Each assistant turn j becomes ``{"id": "SOURCE:CONV:j", "dataset", "request": {"model", "messages":
messages[:j], "tools"?}, "response": <chat.completion with that turn>}``. Tool calls get the ids the
model writes itself, ``functions.{name}:{idx}`` (idx counted over the conversation), and tool results
point at them. History assistant messages carry their reasoning as ``reasoning_content``.
A conversation that cannot be converted yields one record with an ``error`` field instead, so no
input is lost: ``kimi-eagle reconstruct`` turns it into an error row. Input is read by
:mod:`kimi_eagle.io` (universal newlines, UTF-8 only, nesting limit); a JSON array file is read item by
item, so one bad item is one error record.
"""
from __future__ import annotations

import itertools
import json
import os
import re
from pathlib import Path
from typing import Any, Iterator

from kimi_eagle.assets import data_path
from kimi_eagle.io import MAX_DEPTH, UTF8_BOM, atomic_path, check_encoding, json_depth, loads_checked, read_jsonl
from kimi_eagle.reconstruct.log_shapes import api_record_from_log, is_api_log
from kimi_eagle.reconstruct.stream_log import stream_log_records

SOURCES = ("glaive", "reason-tool-use", "sharegpt", "openai", "openai-stream")
MODEL = "moonshotai/kimi-k2.5"


class ConvertError(ValueError):
    """One conversation cannot be converted."""


def read_items(path: str | os.PathLike) -> Iterator[tuple[int, Any, str | None]]:
    """``(index, item, error)`` for a JSON array file or a JSONL file (error set for bad lines or items).

    A file that is not UTF-8 at all (UTF-16/32) raises ``EncodingRefused``; anything else wrong is per item.
    """
    check_encoding(path)
    with open(path, "rb") as f:
        head = f.read(4096)
    if head.removeprefix(UTF8_BOM).lstrip()[:1] == b"[":
        with open(path, "rb") as f:
            data = f.read().removeprefix(UTF8_BOM)
        for i, (item, error) in enumerate(_array_items(data)):
            yield i, item, error
        return
    for i, line in enumerate(read_jsonl(path)):
        yield i, line.obj if line.error is None else None, line.error


_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{},]')
_RAW_BYTE = re.compile("[\udc80-\udcff]")  # bytes that are not UTF-8, kept by surrogateescape


def _value_end(text: str, start: int) -> int | None:
    """Where the JSON value (well-formed or not) starting at ``start`` ends: the ``,`` or ``]`` after it at depth 0."""
    depth = 0
    for m in _TOKEN.finditer(text, start):
        t = m.group()
        if t in "[{":
            depth += 1
        elif t in "]}":
            if depth == 0:
                return m.start()
            depth -= 1
        elif t == "," and depth == 0:
            return m.start()
    return None


def _array_items(data: bytes) -> Iterator[tuple[Any, str | None]]:
    """``(item, error)`` for each item of a JSON array, read one item at a time (a bad item is its own error)."""
    text = data.decode("utf-8", "surrogateescape")
    decoder = json.JSONDecoder()
    ws = re.compile(r"\s*")
    i = ws.match(text, text.index("[") + 1).end()
    k, error = 0, None
    while i < len(text) and text[i] != "]":
        start = i
        try:
            item, i = decoder.raw_decode(text, start)
            bad = _RAW_BYTE.search(text, start, i)
            error = (f"item {k}: invalid UTF-8 at character {bad.start() - start} of the item" if bad
                     else f"item {k}: nested more than {MAX_DEPTH} levels deep" if json_depth(item) > MAX_DEPTH else None)
        except RecursionError:
            end = _value_end(text, start)
            item, error, i = None, f"item {k}: nested more than {MAX_DEPTH} levels deep", end if end is not None else len(text)
        except ValueError as e:
            end = _value_end(text, start)
            item, error, i = None, f"item {k}: not JSON ({e})", end if end is not None else len(text)
        yield (None if error else item), error
        k += 1
        i = ws.match(text, i).end()
        if i < len(text) and text[i] == ",":
            i = ws.match(text, i + 1).end()
        elif i < len(text) and text[i] != "]":
            yield None, f"item {k}: expected ',' or ']' at character {i}; the rest of the file cannot be read"
            return
    if i >= len(text) and error is None:
        yield None, f"item {k}: the array is not closed (a truncated file?)"


def api_record(rid: str, dataset: str, messages: list[dict], tools: list | None, message: dict) -> dict:
    """An API record whose response is ``message`` (an OpenAI assistant message)."""
    request: dict[str, Any] = {"model": MODEL, "messages": [dict(m) for m in messages]}
    if tools:
        request["tools"] = tools
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    response = {"id": f"gen-{rid}", "object": "chat.completion", "model": MODEL, "provider": None,
                "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish,
                             "native_finish_reason": finish}]}
    return {"id": rid, "dataset": dataset, "request": request, "response": response}


class _Conversation:
    """Accumulates messages and emits one API record per assistant turn."""

    def __init__(self, source: str, conv_id: str, tools: list | None) -> None:
        self.source, self.conv_id, self.tools = source, conv_id, tools
        self.messages: list[dict] = []
        self.n_calls = 0
        self.pending: list[str] = []  # ids of calls awaiting a result

    def call(self, name: str, arguments: Any) -> dict:
        if not isinstance(name, str) or not name:
            raise ConvertError("tool call has no name")
        args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        tool_id = f"functions.{name}:{self.n_calls}"
        self.n_calls += 1
        self.pending.append(tool_id)
        return {"id": tool_id, "type": "function", "function": {"name": name, "arguments": args}}

    def assistant(self, content: str | None, reasoning: str | None = None, tool_calls: list | None = None) -> dict:
        message: dict[str, Any] = {"content": content}
        if reasoning:
            message["reasoning"] = reasoning
        if tool_calls:
            message["tool_calls"] = tool_calls
        record = api_record(f"{self.source}:{self.conv_id}:{len(self.messages)}", self.source,
                            self.messages, self.tools, message)
        history: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning:
            history["reasoning_content"] = reasoning
        if tool_calls:
            history["tool_calls"] = tool_calls
        self.messages.append(history)
        return record

    def tool_result(self, content: str, tool_call_id: str | None = None) -> None:
        if tool_call_id is None:
            tool_call_id = self.pending.pop(0) if self.pending else f"functions.unknown:{self.n_calls}"
        elif tool_call_id in self.pending:
            self.pending.remove(tool_call_id)
        self.messages.append({"role": "tool", "tool_call_id": tool_call_id, "content": content})

    def plain(self, role: str, content: str) -> None:
        self.messages.append({"role": role, "content": content})


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ConvertError(f"{what} is a {type(value).__name__}, not a string")
    return value


def _tools(value: Any) -> list | None:
    """A ``tools`` field (JSON string or list) as OpenAI tools (``{"type": "function", "function": ...}``)."""
    if value in (None, "", "[]"):
        return None
    tools = loads_checked(value) if isinstance(value, str) else value
    if not isinstance(tools, list):
        raise ConvertError("tools is not a list")
    return [t if isinstance(t, dict) and t.get("type") == "function" and "function" in t
            else {"type": "function", "function": t} for t in tools] or None


def _call_json(value: str) -> tuple[str, Any]:
    try:
        call = loads_checked(value)
    except ValueError as e:
        raise ConvertError(f"tool call is not JSON ({e})") from None
    if not isinstance(call, dict) or "name" not in call:
        raise ConvertError("tool call has no name")
    return call["name"], call.get("arguments", {})


# --------------------------------------------------------------------------------------------


def _glaive(conv: _Conversation, item: dict) -> Iterator[dict]:
    for turn in item["conversations"]:
        who, value = turn["from"], _text(turn["value"], "value")
        if who == "human":
            conv.plain("user", value)
        elif who == "system":
            conv.plain("system", value)
        elif who == "gpt":
            yield conv.assistant(value)
        elif who == "function_call":
            yield conv.assistant(None, tool_calls=[conv.call(*_call_json(value))])
        elif who == "observation":
            conv.tool_result(value)
        else:
            raise ConvertError(f"unknown turn kind {who!r}")


def _sharegpt(conv: _Conversation, item: dict) -> Iterator[dict]:
    roles = {"human": "user", "user": "user", "system": "system"}
    for turn in item["conversations"]:
        who, value = turn["from"], _text(turn["value"], "value")
        if who in ("gpt", "assistant", "chatgpt", "bing", "bard"):
            yield conv.assistant(value)
        elif who in roles:
            conv.plain(roles[who], value)
        else:
            raise ConvertError(f"unknown turn kind {who!r}")


def _tool_results(conv: _Conversation, text: str) -> None:
    """A reason-tool-use tool message: one result, or a JSON list with one result per pending call."""
    n = len(conv.pending)
    try:
        parsed = loads_checked(text)
    except ValueError:
        parsed = None
    if n > 1 and isinstance(parsed, list) and len(parsed) == n and all(isinstance(r, dict) and "content" in r for r in parsed):
        for r in parsed:
            c = r["content"]
            conv.tool_result(c if isinstance(c, str) else json.dumps(c, ensure_ascii=False))
    else:
        conv.tool_result(text)


def _reason_tool_use(conv: _Conversation, item: dict) -> Iterator[dict]:
    for m in item["messages"]:
        parts = m["content"]
        if isinstance(parts, str):
            parts = [{"type": "text", "value": parts}]
        by_type: dict[str, list[str]] = {}
        for p in parts:
            by_type.setdefault(p["type"], []).append(_text(p["value"], f"{p['type']} part"))
        unknown = set(by_type) - {"text", "reasoning", "tool_call"}
        if unknown:
            raise ConvertError(f"unknown content part types {sorted(unknown)}")
        text = "".join(by_type.get("text", []))
        if m["role"] == "assistant":
            calls = [conv.call(*_call_json(v)) for v in by_type.get("tool_call", [])]
            yield conv.assistant(text or None, "".join(by_type.get("reasoning", [])) or None, calls or None)
        elif m["role"] == "tool":
            _tool_results(conv, text)
        elif m["role"] in ("user", "system"):
            conv.plain(m["role"], text)
        else:
            raise ConvertError(f"unknown role {m['role']!r}")


def _openai(conv: _Conversation, item: dict) -> Iterator[dict]:
    """A logged completion (see :mod:`~kimi_eagle.reconstruct.log_shapes`) is one record, kept as logged;
    a conversation of ``messages`` gives one record per assistant turn."""
    if is_api_log(item) or "choices" in item:
        yield api_record_from_log(item, conv.source)
        return
    if "request" in item and "messages" not in item:
        got = next((f"`{k}` is {'null' if item[k] is None else _a(type(item[k]).__name__)}" for k in
                    ("response", "completion") if k in item), "no `response` object")
        raise ConvertError(f"a request logged without its response ({got}): log the answer beside it, as "
                           '{"request": {...}, "response": {...}}')
    for m in item["messages"]:
        if m.get("role") == "assistant":
            reasoning = m.get("reasoning_content") or m.get("reasoning")
            message = {"content": m.get("content")}
            if reasoning:
                message["reasoning"] = reasoning
            if m.get("tool_calls"):
                message["tool_calls"] = m["tool_calls"]
            yield api_record(f"{conv.source}:{conv.conv_id}:{len(conv.messages)}", conv.source,
                             conv.messages, conv.tools, message)
            m = {k: v for k, v in m.items() if k != "reasoning"}
            if reasoning:
                m["reasoning_content"] = reasoning
        conv.messages.append(m)


_CONVERTERS = {"glaive": _glaive, "reason-tool-use": _reason_tool_use, "sharegpt": _sharegpt, "openai": _openai}
_FILE_READERS = {"openai-stream": stream_log_records}  # whole-file readers: one answer spans many lines


def convert(source_name: str, in_path: str | os.PathLike | None = None) -> Iterator[dict]:
    """API records from a dataset file (default: the bundled one), one per assistant turn."""
    for _, record in _convert(source_name, in_path):
        yield record


def _convert(source_name: str, in_path: str | os.PathLike | None) -> Iterator[tuple[int, dict]]:
    """``(conversation index, API record)`` pairs."""
    if source_name not in _CONVERTERS and source_name not in _FILE_READERS:
        raise ValueError(f"unknown source {source_name!r}; known: {', '.join(SOURCES)}")
    path = Path(in_path) if in_path is not None else data_path(source_name)
    if not path.exists():
        raise FileNotFoundError(f"input not found: {path}")
    check_encoding(path)  # a folder, Parquet, gzip, UTF-16: refused by name before anything is read
    if source_name in _FILE_READERS:  # logged chunk streams: see kimi_eagle.reconstruct.stream_log
        yield from _FILE_READERS[source_name](path)
        return
    fn = _CONVERTERS[source_name]
    for index, item, error in read_items(path):
        raw_id = item.get("id") if isinstance(item, dict) else None
        conv_id = str(raw_id) if isinstance(raw_id, (str, int)) and not isinstance(raw_id, bool) else str(index)
        if error is not None:
            yield index, {"id": f"{source_name}:{conv_id}", "dataset": source_name, "error": error}
            continue
        conv = _Conversation(source_name, conv_id, None)
        try:
            if not isinstance(item, dict):
                raise ConvertError("conversation is not a JSON object")
            conv.tools = _tools(item.get("tools"))
            for record in fn(conv, item):
                yield index, record
        except Exception as e:  # one conversation must never stop the file
            reason = _reason(e, source_name)
            yield index, {"id": f"{source_name}:{conv_id}:{len(conv.messages)}", "dataset": source_name,
                          "error": f"conversation {conv_id}: {reason}"}


def _a(noun: str) -> str:
    """``noun`` with its article: ``an openai``, ``an int``, ``a list``."""
    return f"{'an' if noun[:1] in 'aeiou' else 'a'} {noun}"


def _reason(e: Exception, source_name: str) -> str:
    """A readable reason for a conversation that failed (a missing field hints at the wrong ``--from``)."""
    if isinstance(e, ConvertError):
        return str(e)
    if isinstance(e, KeyError):
        return f"missing field {e.args[0]!r} (is this {_a(source_name)} file? check --from)"
    if isinstance(e, RecursionError):
        return f"nested more than {MAX_DEPTH} levels deep"
    return f"{type(e).__name__}: {e}"


def convert_file(source_name: str, in_path: str | os.PathLike | None, out_path: str | os.PathLike,
                 limit: int | None = None) -> int:
    """Write ``convert`` to JSONL atomically; ``limit`` keeps the first N conversations. Returns records written."""
    return _convert_file(source_name, in_path, out_path, limit)[0]


def _convert_file(source_name: str, in_path: str | os.PathLike | None, out_path: str | os.PathLike,
                  limit: int | None = None) -> tuple[int, list[str]]:
    """``convert_file`` that also returns the error of every error record."""
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be a positive integer, not {limit!r}")
    if Path(out_path).is_dir():
        raise ValueError(f"output {out_path} is a folder; give the path of the JSONL file to write")
    from kimi_eagle.reconstruct.job import output_lock

    records = _convert(source_name, in_path)
    first = next(records, None)  # the input's checks run before the output is opened
    n, errors = 0, []
    # one run per output (``.OUT.lock``, as reconstruct holds): a second convert on it is refused while one runs
    with output_lock(Path(out_path)), atomic_path(out_path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for index, record in itertools.chain([first] if first else [], records):
            if limit is not None and index >= limit:
                break
            # ensure_ascii keeps lone surrogates in the source as \\uXXXX escapes, for reconstruct to reject
            f.write(json.dumps(record) + "\n")
            n += 1
            if "error" in record:
                errors.append(record["error"])
    return n, errors
