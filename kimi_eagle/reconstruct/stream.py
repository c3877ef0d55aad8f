"""Streamed chat completions: the SSE wire format and the assembly of chunks into one ``chat.completion``.

Wire format (OpenAI, OpenRouter): events of ``data: {json}`` lines ended by a blank line, comment
lines starting with ``:`` (OpenRouter's ``: OPENROUTER PROCESSING`` keep-alives), and ``data: [DONE]``
at the end. :class:`SSEDecoder` reads it incrementally from bytes (LF, CRLF or CR line ends); a
``data:`` line that follows a complete JSON payload without the blank line between them (logged
streams often drop it) starts a new event.

Assembly (:class:`StreamAssembler`, :func:`assemble_chunks`): ``choices[].delta`` fragments are merged
per choice ``index`` -- strings (``content``, ``reasoning``, ``reasoning_content``, ``refusal``)
concatenated, ``tool_calls`` merged by their ``index`` (id, type and name from the fragments that
carry them: a name may come in a later fragment than its id and index, and an empty ``""`` id or name
repeated in later fragments, as some providers send, never erases the one already seen; ``arguments``
concatenated), ``reasoning_details`` blocks merged by their ``index`` (text fields concatenated) or
appended when they have none, ``logprobs`` lists concatenated; the last non-null
``finish_reason``/``native_finish_reason`` and ``usage`` win; other fields keep their first non-null
value. A ``usage`` sent inside a choice (Moonshot's own API puts the final usage in ``choices[0]``) is moved
to the response's ``usage`` when the stream sends none at the top level, and is never left in the choice.
Key order is fixed so that a stream and the non-streaming answer with the same content give the same bytes: the
response's keys as OpenRouter writes them (``id, provider, model, object, created, choices``, then any others in
first-seen order, ``usage`` last; ``object`` becomes ``chat.completion``), each choice as ``logprobs,
finish_reason, native_finish_reason, index, message`` then any other keys, the message as ``role, content,
refusal, reasoning, reasoning_content, reasoning_details, tool_calls`` then any other keys. A message key
appears when some delta carried it (``null`` included); tool calls lose their per-fragment ``index``. A chunk
carrying ``error`` (OpenRouter's mid-stream error event) is kept in :attr:`StreamAssembler.error`; nothing is
coerced: a fragment of the wrong type is a :class:`StreamError` naming the chunk.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Iterable

from kimi_eagle.io import MAX_DEPTH, json_depth

DONE = "[DONE]"
TEXT_FIELDS = ("content", "reasoning", "reasoning_content", "refusal")
TOP_ORDER = ("id", "provider", "model", "object", "created", "choices")  # then others first-seen, ``usage`` last
CHOICE_ORDER = ("logprobs", "finish_reason", "native_finish_reason", "index", "message")
MESSAGE_ORDER = ("role", "content", "refusal", "reasoning", "reasoning_content", "reasoning_details", "tool_calls")
PER_CHUNK_FIELDS = ("obfuscation",)  # random padding OpenAI adds to each chunk: not part of the answer
LAST_WINS = ("finish_reason", "native_finish_reason", "usage")
_EOL = re.compile(rb"\r\n|\r|\n")


class StreamError(ValueError):
    """A chunk that cannot be merged (a fragment of the wrong type, a choice without an index)."""


@dataclass
class SSEEvent:
    data: str | None  # the joined ``data:`` lines; None for a comment
    comment: str | None = None


class SSEDecoder:
    """Incremental SSE parser: ``feed(bytes)`` returns the events completed so far; ``close()`` the last one.

    Linear in what it reads: each byte is scanned for a line end once (a line still open is kept as a list of
    pieces, joined once when it ends), and whether an event is already a complete JSON value is asked only of its
    first line (a logged stream puts one JSON value on each ``data:`` line). A UTF-8 byte-order mark before the
    first line is skipped. ``loose``: a line that is a JSON object on its own (a request logged between the
    events of a stream log) is an event of its own instead of an unknown field."""

    def __init__(self, loose: bool = False) -> None:
        self._pieces: list[bytes] = []
        self._after_cr = False  # the last byte fed was a CR: a LF right after it ends nothing more
        self._started = False
        self._data: list[str] = []
        self._complete = False  # the event so far is one ``data:`` line holding a complete JSON value
        self.loose = loose
        self.comments = 0

    def feed(self, data: bytes) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        if self._after_cr and data.startswith(b"\n"):
            data = data[1:]
        self._after_cr = data.endswith(b"\r")
        pos = 0
        for m in _EOL.finditer(data):
            self._pieces.append(data[pos:m.start()])
            self._take(b"".join(self._pieces), events)
            self._pieces = []
            pos = m.end()
        if pos < len(data):
            self._pieces.append(data[pos:])
        return events

    def close(self) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        if self._pieces:
            self._take(b"".join(self._pieces), events)
            self._pieces = []
        self._dispatch(events)
        return events

    def _take(self, raw: bytes, events: list[SSEEvent]) -> None:
        if not self._started:
            self._started, raw = True, raw.removeprefix(b"\xef\xbb\xbf")
        self._line(raw.decode("utf-8", "surrogateescape"), events)

    def _line(self, line: str, events: list[SSEEvent]) -> None:
        if not line:
            self._dispatch(events)
        elif line.startswith(":"):
            if self._complete:
                self._dispatch(events)  # keep the order of a logged stream without blank lines
            self.comments += 1
            events.append(SSEEvent(None, line[1:].strip()))
        elif self.loose and line.startswith("{"):
            self._dispatch(events)
            events.append(SSEEvent(line))
        else:
            name, _, value = line.partition(":")
            if name == "data":
                value = value[1:] if value.startswith(" ") else value
                if self._complete:
                    self._dispatch(events)  # a logged stream without the blank line between events
                self._data.append(value)
                self._complete = len(self._data) == 1 and _complete_json(value)

    def _dispatch(self, events: list[SSEEvent]) -> None:
        if self._data:
            events.append(SSEEvent("\n".join(self._data)))
            self._data = []
        self._complete = False


def _complete_json(text: str) -> bool:
    if text.strip() == DONE:
        return True
    try:
        json.loads(text)
    except ValueError:
        return False
    except RecursionError:
        return True  # a whole value, nested too deep: its event is refused by name where it is read
    return True


def parse_sse(data: bytes) -> list[SSEEvent]:
    """Every event of a whole SSE body (comments included)."""
    decoder = SSEDecoder()
    return decoder.feed(data) + decoder.close()


def _concat(old: Any, new: Any, where: str) -> Any:
    if new is None:
        return old
    if not isinstance(new, str) or not (old is None or isinstance(old, str)):
        raise StreamError(f"{where}: expected a string fragment, got {type(new).__name__}")
    return new if old is None else old + new


def _target(items: list[dict], frag: dict, by_id: bool) -> dict | None:
    """The item a fragment continues: the one with its ``index``; without an index (``by_id``: tool calls), the
    one with its ``id``, a fragment with a new id starting a new one, and one with neither continuing the last."""
    index = frag.get("index")
    if index is not None:
        return next((it for it in items if it.get("index") == index), None)
    if not by_id:
        return None
    fid = frag.get("id")
    if not _blank(fid):
        return next((it for it in items if it.get("id") == fid), None)
    return items[-1] if items else None


def _merge_indexed(items: list[dict], fragments: Any, where: str, text_keys: tuple[str, ...],
                   by_id: bool = False) -> None:
    """Merge ``fragments`` (a list of dicts, each with an optional ``index``) into ``items`` in place (see
    :func:`_target` for a fragment without an index)."""
    if not isinstance(fragments, list):
        raise StreamError(f"{where}: expected a list, got {type(fragments).__name__}")
    for frag in fragments:
        if not isinstance(frag, dict):
            raise StreamError(f"{where}: expected objects, got {type(frag).__name__}")
        target = _target(items, frag, by_id)
        if target is None:
            items.append(target := {})
        for key, value in frag.items():
            if key in text_keys:
                target[key] = _concat(target.get(key), value, f"{where}.{key}")
            elif key == "function":
                if not isinstance(value, dict):
                    raise StreamError(f"{where}.function: expected an object, got {type(value).__name__}")
                fn = target.setdefault("function", {})
                for k, v in value.items():
                    fn[k] = _concat(fn.get(k), v, f"{where}.function.{k}") if k == "arguments" else (
                        _named(fn.get(k), v))
            elif target.get(key) is None or (target[key] == "" and not _blank(value)):
                target[key] = value  # the first id (type, ...) that is not blank


def _blank(value: Any) -> bool:
    """``None`` or ``""``: what providers put in the id and name of every later fragment of a call (some send
    ``"name": ""`` with each argument piece), which must not erase what an earlier fragment gave."""
    return value is None or value == ""


def _named(old: Any, new: Any) -> Any:
    """A call's ``function.name`` (or other non-argument field) after a fragment carrying ``new``: a later name
    replaces the one seen (also when it comes after the id and index), a blank one never erases it."""
    return old if new is None or (new == "" and not _blank(old)) else new


class _Choice:
    def __init__(self) -> None:
        self.fields: dict[str, Any] = {}
        self.message: dict[str, Any] = {}
        self.tool_calls: list[dict] = []
        self.details: list[dict] = []

    def add(self, choice: dict, where: str) -> None:
        delta = choice.get("delta") if "delta" in choice else choice.get("message")
        for key, value in choice.items():
            if key in ("delta", "message"):
                continue
            if key == "logprobs":
                self.fields[key] = _merge_logprobs(self.fields.get(key), value, f"{where}.logprobs")
            elif key in LAST_WINS:
                self.fields[key] = value if value is not None else self.fields.get(key)
            elif self.fields.get(key) is None:
                self.fields[key] = value
        if delta is None:
            return
        if not isinstance(delta, dict):
            raise StreamError(f"{where}.delta: expected an object, got {type(delta).__name__}")
        for key, value in delta.items():
            if key in TEXT_FIELDS:
                self.message[key] = _concat(self.message.get(key), value, f"{where}.delta.{key}")
            elif key == "tool_calls":
                self.message.setdefault(key, None)
                if value is not None:
                    _merge_indexed(self.tool_calls, value, f"{where}.delta.tool_calls", (), by_id=True)
            elif key == "reasoning_details":
                self.message.setdefault(key, None)
                if value is not None:
                    _merge_indexed(self.details, value, f"{where}.delta.reasoning_details",
                                   ("text", "summary", "data", "signature"))
            elif self.message.get(key) is None:
                self.message[key] = value

    def build(self) -> dict[str, Any]:
        message = dict(self.message)
        if self.tool_calls:
            message["tool_calls"] = [{k: v for k, v in call.items() if k != "index"} for call in self.tool_calls]
        if self.details:
            message["reasoning_details"] = self.details
        fields = {**self.fields, "message": _ordered(message, MESSAGE_ORDER)}
        return _ordered(fields, CHOICE_ORDER)


MAX_CHOICES = 1024  # a choice index is an integer 0 <= i < MAX_CHOICES (OpenAI's ``n`` is at most 128)


def _choice_index(choice: Any, n_choices: int, where: str) -> int:
    """The ``index`` of one streamed choice (0 when the chunk has one choice without it); refused by name when it
    is not an integer in ``0 .. MAX_CHOICES - 1`` (never coerced)."""
    index = choice.get("index", 0 if n_choices == 1 else None) if isinstance(choice, dict) else None
    if not isinstance(index, int) or isinstance(index, bool):
        raise StreamError(f"{where}: a choice needs an integer index")
    if not 0 <= index < MAX_CHOICES:
        raise StreamError(f"{where}: choice index {str(index)[:40]} is outside 0..{MAX_CHOICES - 1}")
    return index


def _grows(old: Any, new: Any) -> bool:
    """A count (or object of counts) that only grew: what cumulative usage reports look like."""
    if isinstance(old, dict) and isinstance(new, dict):
        return all(k in new and _grows(v, new[k]) for k, v in old.items())
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (old, new))
    return numbers and new >= old


def _merge_logprobs(old: Any, new: Any, where: str) -> Any:
    if new is None:
        return old
    if not isinstance(new, dict) or not (old is None or isinstance(old, dict)):
        raise StreamError(f"{where}: expected an object, got {type(new).__name__}")
    merged = dict(old or {})
    for key, value in new.items():
        if isinstance(value, list):
            prev = merged.get(key)
            merged[key] = (prev if isinstance(prev, list) else []) + value
        elif merged.get(key) is None:
            merged[key] = value
    return merged


def _ordered(d: dict[str, Any], order: tuple[str, ...]) -> dict[str, Any]:
    return {**{k: d[k] for k in order if k in d}, **{k: v for k, v in d.items() if k not in order}}


def carries_error(value: Any) -> bool:
    """Whether a chunk's ``error`` field says something: not null, not empty, not an object whose every field is
    null or empty (some servers send ``"error": {}`` or ``{"code": null, "message": null}`` on every chunk)."""
    if isinstance(value, dict):
        return any(carries_error(v) for v in value.values())
    return value is not None and value is not False and value != "" and value != []


class StreamAssembler:
    """Merges chunks one at a time (see the module docstring); ``response()`` is the answer so far."""

    def __init__(self) -> None:
        self.top: dict[str, Any] = {}
        self.choices: dict[int, _Choice] = {}
        self.chunks = 0
        self.error: Any = None  # the ``error`` of a mid-stream error event
        self.usage_conflict: str | None = None  # two usage reports that disagree (the fuller one is kept)

    def add(self, chunk: Any) -> None:
        where = f"chunk {self.chunks}"
        self.chunks += 1
        if not isinstance(chunk, dict):
            raise StreamError(f"{where}: expected a JSON object, got {type(chunk).__name__}")
        if json_depth(chunk) > MAX_DEPTH:
            raise StreamError(f"{where}: nested more than {MAX_DEPTH} levels deep")
        if carries_error(chunk.get("error")):  # `"error": {}` or all-null fields on a whole answer: no error event
            self.error = chunk["error"]
        for key, value in chunk.items():
            if key in PER_CHUNK_FIELDS or key == "error":
                continue
            if key == "choices":
                self.top.setdefault("choices", None)
                self._choices(value, where)
            elif key == "usage":
                self.top[key] = self._usage(self.top.get(key), value, where)
            elif key == "object":
                self.top.setdefault(key, "chat.completion")
            elif self.top.get(key) is None:
                self.top[key] = value

    def _choices(self, choices: Any, where: str) -> None:
        if not isinstance(choices, list):
            raise StreamError(f"{where}.choices: expected a list, got {type(choices).__name__}")
        for i, choice in enumerate(choices):
            index = _choice_index(choice, len(choices), f"{where}.choices[{i}]")
            self.choices.setdefault(index, _Choice()).add(choice, f"{where}.choices[{i}]")

    def continues_finished(self, chunk: Any) -> bool:
        """Whether ``chunk`` carries new text or calls for a choice that has already finished (an empty delta, a bare
        ``role`` or a usage chunk after the finish does not: OpenRouter's usage chunk repeats ``{"role": "assistant",
        "content": ""}``). Not by itself another answer: some providers send ``finish_reason`` with each tool call;
        a stream log reads it so only after ``[DONE]`` or a newer request (:mod:`kimi_eagle.reconstruct.stream_log`)."""
        choices = chunk.get("choices") if isinstance(chunk, dict) else None
        if not isinstance(choices, list):
            return False
        for choice in choices:
            index = choice.get("index", 0 if len(choices) == 1 else None) if isinstance(choice, dict) else None
            done = self.choices.get(index) if isinstance(index, int) and not isinstance(index, bool) else None
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if done is not None and done.fields.get("finish_reason") is not None and isinstance(delta, dict) and any(
                    not _blank(v) and v != [] for k, v in delta.items() if k != "role"):
                return True
        return False

    def _usage(self, old: Any, new: Any, where: str) -> Any:
        """The usage after another report: a partial one fills the fuller one's gaps; a growing one (the same
        fields, counts not smaller: cumulative usage) replaces it; one that disagrees is flagged, the fuller kept."""
        if new is None:
            return old
        if not isinstance(new, dict):
            raise StreamError(f"{where}.usage: expected an object, got {type(new).__name__}")
        if not isinstance(old, dict):
            return new
        clash = sorted(k for k, v in new.items() if v is not None and old.get(k) is not None and old[k] != v)
        if not clash:
            return {**old, **{k: v for k, v in new.items() if v is not None}}
        if set(new) == set(old) and all(_grows(old[k], new[k]) for k in clash):
            return new
        fuller, other = (new, old) if len(new) >= len(old) else (old, new)
        self.usage_conflict = (f"{where}: usage reports disagree on {', '.join(map(str, clash))[:200]}; "
                               f"the fuller report ({len(fuller)} fields) is kept")
        return {**{k: v for k, v in other.items() if v is not None}, **fuller}

    @property
    def finished(self) -> bool:
        """Every choice seen has a ``finish_reason`` (and at least one choice was seen)."""
        return bool(self.choices) and all(c.fields.get("finish_reason") is not None for c in self.choices.values())

    def response(self) -> dict[str, Any]:
        out = dict(self.top)
        if "choices" in out:
            out["choices"] = [self.choices[i].build() for i in sorted(self.choices)]
            in_choice = [c.pop("usage") for c in out["choices"] if isinstance(c.get("usage"), dict)]
            if out.get("usage") is None and in_choice:
                out["usage"] = in_choice[0]  # Moonshot's own API: the final usage inside choices[0]
        out = _ordered(out, TOP_ORDER)
        if "usage" in out:
            out["usage"] = out.pop("usage")
        return out


def assemble_chunks(chunks: Iterable[Any]) -> dict[str, Any]:
    """One ``chat.completion`` from the chunk objects of one streamed answer (in arrival order)."""
    assembler = StreamAssembler()
    for chunk in chunks:
        assembler.add(chunk)
    return assembler.response()


def chunk_payloads(events: Iterable[SSEEvent]) -> tuple[list[Any], bool]:
    """The JSON payloads of ``events`` (comments skipped) and whether ``[DONE]`` was among them; a payload that
    is not JSON is a :class:`StreamError`."""
    payloads, done = [], False
    for k, event in enumerate(events):
        if event.data is None:
            continue
        if event.data.strip() == DONE:
            done = True
            continue
        try:
            payloads.append(json.loads(event.data))
        except (ValueError, RecursionError) as e:
            raise StreamError(f"event {k}: data is not JSON ({str(e)[:80]})") from None
    return payloads, done
