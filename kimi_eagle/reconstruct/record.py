"""One API record -> one reconstructed row: parsing the API fields, rendering, encoding once.

``reconstruct_record`` turns one API record (``{"id", "request": {"messages", "tools"?}, "response"}``)
into a :class:`ReconstructedRow`: the rendered prompt's IDs, the completion's IDs encoded once as a
whole string, typed segments with byte and token spans, and flags. Bad input raises ``RecordError``.
``reconstruct_line`` does the same for one raw JSONL line and never raises: bad input becomes an
error row (``error_row``) naming the reason.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .completion import SPAN_FIELDS, CompletionOptions, ToolCall, Turn
from .encoder import PieceEncoder
from .formats import Format
from ..records import RecordError
from ..tokenize.tokenizer import Tokenizer

MAX_TEXT_CHARS = 400_000  # one reasoning/content/arguments string; the reference encodes in chunks of this size
FINISH_REASONS = ("stop", "tool_calls", "length")


@dataclass(frozen=True)
class ReconstructOptions(CompletionOptions):
    """Completion options (see :class:`~kimi_eagle.reconstruct.completion.CompletionOptions`)."""


@dataclass
class ReconstructedRow:
    """One row of the reconstruction (schema in docs/CONTRACTS.md)."""

    id: str
    dataset: str | None
    status: str
    error: str | None
    format: str
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    n_prompt_tokens: int = 0
    n_completion_tokens: int = 0
    segments: list[dict[str, Any]] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    billed_completion_tokens: int | None = None
    billed_reasoning_tokens: int | None = None
    provider: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The row as a dict (shallow: the ID lists are shared, not copied)."""
        return dict(self.__dict__)

    @property
    def loss_mask(self) -> list[int]:
        return [0] * self.n_prompt_tokens + [1] * self.n_completion_tokens


# --------------------------------------------------------------------------------------------
# Parsing an API record


def check_text(text: str, what: str) -> None:
    """Reject text the tokenizer cannot encode faithfully (lone surrogates, over-long strings)."""
    if len(text) > MAX_TEXT_CHARS:
        raise RecordError(f"{what} has {len(text):,} characters, over the {MAX_TEXT_CHARS:,}-character limit")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RecordError(f"{what} is not valid Unicode: lone surrogate {text[e.start]!r} at character {e.start}") from None


def _opt_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _reasoning(message: dict) -> str | None:
    """``reasoning``, else the text of ``reasoning_details``, else ``reasoning_content``."""
    r = message.get("reasoning")
    if isinstance(r, str) and r:
        return r
    details = message.get("reasoning_details")
    if isinstance(details, list):
        texts = [d["text"] for d in details if isinstance(d, dict) and isinstance(d.get("text"), str)]
        if texts:
            return "".join(texts)
    rc = message.get("reasoning_content")
    if isinstance(rc, str) and rc:
        return rc
    return None


def parse_turn(response: Any) -> Turn:
    """The generated message of an OpenRouter chat.completion response."""
    if not isinstance(response, dict):
        raise RecordError("response is not a JSON object")
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices:
        raise RecordError("response has no choices")
    choice = choices[0]
    if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
        raise RecordError("response.choices[0] has no message")
    msg = choice["message"]
    finish = choice.get("finish_reason")
    if finish not in FINISH_REASONS:
        raise RecordError(f"unknown finish_reason {finish!r} (expected one of {', '.join(FINISH_REASONS)})")
    reasoning = _reasoning(msg)
    text = msg.get("content")
    if text is not None and not isinstance(text, str):
        raise RecordError(f"message content is a {type(text).__name__}, not a string")
    calls = []
    for k, call in enumerate(msg.get("tool_calls") or []):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise RecordError(f"tool_calls[{k}] has no function name")
        args = fn.get("arguments", "")
        if isinstance(args, str):
            check_text(args, f"tool_calls[{k}] arguments")
        cid = call.get("id")
        calls.append(ToolCall(cid if isinstance(cid, str) else None, fn["name"], args))
    if not reasoning and not text and not calls:
        raise RecordError("message has no reasoning, no content and no tool calls")
    if reasoning:
        check_text(reasoning, "reasoning")
    if text:
        check_text(text, "content")
    return Turn(reasoning, text, calls, finish)


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
            for j, call in enumerate(calls):
                if not isinstance(call, dict) or not isinstance(call.get("function"), dict) or "name" not in call["function"]:
                    raise RecordError(f"request.messages[{i}].tool_calls[{j}] has no function name")
        if role == "assistant" and "reasoning_content" not in m and isinstance(m.get("reasoning"), str):
            m = {**m, "reasoning_content": m["reasoning"]}
        out.append(m)
    return out


# --------------------------------------------------------------------------------------------
# One record


def reconstruct_record(record: Any, tok: Tokenizer, fmt: Format, options: CompletionOptions = ReconstructOptions(),
                       encoder: PieceEncoder | None = None) -> ReconstructedRow:
    """Reconstruct one API record; raises RecordError with a clear message for bad input.

    ``encoder``: a :class:`PieceEncoder` of ``tok`` shared by the calls of a loop (its run cache makes
    a conversation's later prompts cheap); without one, a fresh encoder is built for this record.
    """
    if not isinstance(record, dict):
        raise RecordError("record is not a JSON object")
    if record.get("error"):
        raise RecordError(f"converter: {record['error']}")
    rid = record.get("id")
    if not isinstance(rid, str) or not rid:
        raise RecordError("record has no string id")
    request, response = record.get("request"), record.get("response")
    if not isinstance(request, dict):
        raise RecordError("record has no request object")
    messages = normalise_messages(request.get("messages"))
    tools = request.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise RecordError("request.tools is not a list")
    turn = parse_turn(response)
    enc = encoder if encoder is not None else PieceEncoder(tok)
    if enc.tok is not tok:
        raise ValueError("the encoder belongs to another tokenizer")
    flags: list[str] = []
    try:
        prompt_pieces = fmt.prompt_pieces(messages, tools)
    except RecordError:
        raise
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise RecordError(f"cannot render the prompt: {type(e).__name__}: {e}") from None
    prompt_ids, prompt_marker = enc.encode_marked(prompt_pieces)
    if prompt_marker:
        flags.append("prompt_literal_marker")
    segments, seg_flags = fmt.completion_segments(turn, messages, options)
    completion_ids, spans, marker = enc.encode_segments_marked(segments, continuation=fmt.continuation)
    if marker:
        flags.append("literal_marker")
    flags = seg_flags + flags
    usage = response.get("usage") if isinstance(response.get("usage"), dict) else {}
    details = usage.get("completion_tokens_details") if isinstance(usage.get("completion_tokens_details"), dict) else {}
    provider = response.get("provider")
    return ReconstructedRow(
        id=rid, dataset=record.get("dataset") if isinstance(record.get("dataset"), str) else None,
        status="ok", error=None, format=fmt.name,
        prompt_ids=prompt_ids, completion_ids=completion_ids,
        n_prompt_tokens=len(prompt_ids), n_completion_tokens=len(completion_ids),
        segments=[dict(zip(SPAN_FIELDS, s)) for s in spans], flags=flags, finish_reason=turn.finish_reason,
        billed_completion_tokens=_opt_int(usage.get("completion_tokens")),
        billed_reasoning_tokens=_opt_int(details.get("reasoning_tokens")),
        provider=provider if isinstance(provider, str) else None,
    )


def error_row(rid: str, error: str, fmt_name: str, record: Any = None) -> ReconstructedRow:
    """The row of a record that could not be reconstructed: its id, dataset and the reason."""
    dataset = record.get("dataset") if isinstance(record, dict) and isinstance(record.get("dataset"), str) else None
    return ReconstructedRow(id=rid, dataset=dataset, status="error", error=error, format=fmt_name)


def record_id(record: Any, lineno: int) -> str:
    """The record's id, or ``line:N`` when it has none."""
    rid = record.get("id") if isinstance(record, dict) else None
    return rid if isinstance(rid, str) and rid else f"line:{lineno}"


def reconstruct_line(raw: bytes, lineno: int, tok: Tokenizer, fmt: Format, options: CompletionOptions,
                     encoder: PieceEncoder | None = None) -> dict[str, Any]:
    """One JSONL line -> one row dict (never raises for bad input), with its ``line`` number."""
    try:
        record = json.loads(raw)
    except UnicodeDecodeError as e:
        try:  # keep the id if the rest of the line is readable
            rid = record_id(json.loads(raw.decode("utf-8", "replace")), lineno)
        except json.JSONDecodeError:
            rid = f"line:{lineno}"
        row = error_row(rid, f"line {lineno}: invalid UTF-8 at byte {e.start}", fmt.name)
    except json.JSONDecodeError as e:
        row = error_row(f"line:{lineno}", f"line {lineno}: not JSON ({e})", fmt.name)
    else:
        try:
            row = reconstruct_record(record, tok, fmt, options, encoder)
        except RecordError as e:
            row = error_row(record_id(record, lineno), str(e), fmt.name, record)
        except Exception as e:  # a record the checks did not foresee must not stop the run
            row = error_row(record_id(record, lineno), f"unexpected {type(e).__name__}: {e}", fmt.name, record)
    d = row.to_dict()
    d["line"] = lineno
    return d
