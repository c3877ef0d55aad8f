"""Exact completion IDs from an answer's logprobs, when the provider returned them.

Text alone cannot say how the model segmented what it wrote (a sampled ``▁the`` ``re`` reads as ``▁there``);
``choices[0].logprobs.content[]`` can: one entry per sampled token with its ``bytes`` (the raw bytes as
integers) and ``token`` (its text). :func:`logprob_ids` maps every entry to an ID:

- ``token`` spelling one of the tokenizer's special tokens (``<|im_end|>``, ``<think>``) -> that special's ID
  (when ``bytes`` is absent or spells the same text);
- else ``bytes`` through the tokenizer's byte table (``id_by_bytes``);
- else (no ``bytes``) the UTF-8 of ``token`` through the same table.

:func:`prefer_logprob_ids` then checks the IDs against the text reconstruction: their bytes must join to
the rendered completion's bytes (a final end-of-turn token the entries leave out, as OpenAI's do for the stop
token, is taken from the rendering), and every segment boundary of the rendering must fall between two of
them. If so the row's ``completion_ids`` are the logprob IDs (``ids_source: "logprobs"``), segment token spans
recomputed from byte offsets; if not, the text IDs stay (``ids_source: "text"``) with the flag
``logprobs_unreadable`` (an entry that maps to no token), ``logprobs_mismatch`` (the bytes disagree) or
``logprobs_conflict`` (an entry's ``token`` text contradicts its own ``bytes``, even for a special token such as
``<|im_end|>``: which one was sampled is unknown, so neither is used).
"""
from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate
from typing import Any, Sequence

from kimi_eagle.chat.completion import Span
from kimi_eagle.tokenize.tokenizer import Tokenizer

IDS_SOURCES = ("logprobs", "text")
LOGPROB_FLAGS = ("logprobs_unreadable", "logprobs_mismatch", "logprobs_conflict")


class LogprobError(ValueError):
    """Logprob entries that do not map to token IDs (the message says which entry and why)."""


class LogprobConflict(LogprobError):
    """A logprob entry whose ``token`` text and ``bytes`` name different text (which one the model sampled is
    unknown: neither is used)."""


def logprob_entries(response: Any) -> list | None:
    """``choices[0].logprobs.content`` of a response, or None when the answer carries no logprobs."""
    choices = response.get("choices") if isinstance(response, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    return content if isinstance(content, list) else None


def _unreadable_logprobs(response: Any) -> bool:
    """Whether ``choices[0]`` carries logprobs that are not ``{"content": [entries]}``: a string ``content``, a
    number, a list (of entries or of anything, even empty) for ``logprobs``, or an object with no ``content`` but other
    fields (the legacy completions shape ``{"tokens", "token_logprobs"}``): there, but not readable, so flagged
    rather than taken for "no logprobs"."""
    choices = response.get("choices") if isinstance(response, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    logprobs = choice.get("logprobs")
    if logprobs is None:
        return False
    if not isinstance(logprobs, dict):
        return True
    content = logprobs.get("content")
    if content is None:  # OpenAI's ``refusal`` beside a null content is the refusal's: no content entries
        return any(v not in (None, [], {}) for k, v in logprobs.items() if k not in ("content", "refusal"))
    return not isinstance(content, list)


def _entry_bytes(entry: dict, k: int) -> bytes | None:
    raw = entry.get("bytes")
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(isinstance(b, int) and not isinstance(b, bool) and 0 <= b < 256 for b in raw):
        raise LogprobError(f"logprobs entry {k}: bytes is not a list of integers 0..255")
    return bytes(raw)


def _text_spells(text: str, raw: bytes) -> bool:
    """Whether an entry's ``token`` text can be the text of its ``bytes``: their UTF-8, their decoding with
    replacement characters (a token holding part of a character), or OpenAI's ``bytes:\\xNN`` spelling."""
    return (text.encode("utf-8", "surrogatepass") == raw or text == raw.decode("utf-8", "replace")
            or text.startswith("bytes:"))


def entry_id(entry: Any, k: int, tok: Tokenizer) -> int:
    """The token ID of logprob entry ``k`` (see the module docstring for the rules)."""
    if not isinstance(entry, dict):
        raise LogprobError(f"logprobs entry {k} is not an object")
    text, raw = entry.get("token"), _entry_bytes(entry, k)
    if isinstance(text, str) and raw is not None and not _text_spells(text, raw):
        raise LogprobConflict(f"logprobs entry {k}: token {text[:40]!r} contradicts its bytes {raw[:40]!r}")
    if isinstance(text, str) and text in tok.special_id_by_text and (raw is None or raw == text.encode("utf-8")):
        return tok.special_id_by_text[text]
    if raw is None:
        if not isinstance(text, str):
            raise LogprobError(f"logprobs entry {k} has neither bytes nor token text")
        raw = text.encode("utf-8", errors="surrogatepass")
    found = tok.id_by_bytes.get(raw)
    if found is None:
        raise LogprobError(f"logprobs entry {k}: {raw[:40]!r} is not a token of {tok.name}")
    return found


def logprob_ids(entries: Sequence[Any], tok: Tokenizer) -> list[int]:
    """The token IDs of ``entries`` (``logprobs.content``), in order; ``LogprobError`` for an unusable entry."""
    return [entry_id(e, k, tok) for k, e in enumerate(entries)]


def respan(spans: Sequence[Span], tok: Tokenizer, ids: Sequence[int]) -> list[Span] | None:
    """``spans`` (byte offsets kept) with token spans over ``ids``; None when a boundary falls inside a token."""
    ends = list(accumulate(len(tok.token_bytes(i)) for i in ids))
    starts = [0] + ends[:-1]
    total = ends[-1] if ends else 0

    def index(offset: int) -> int | None:
        at = bisect_left(starts, offset) if offset < total else len(ids)
        return at if at == len(ids) or starts[at] == offset else None

    out = []
    for span in spans:
        start, end = index(span.byte_start), index(span.byte_end)
        if start is None or end is None:
            return None
        out.append(Span(span.kind, span.byte_start, span.byte_end, start, max(start, end)))
    return out


def prefer_logprob_ids(response: Any, tok: Tokenizer, text_ids: list[int],
                       spans: list[Span]) -> tuple[list[int], list[Span], str, list[str]]:
    """``(completion_ids, spans, ids_source, flags)``: the logprob IDs when the answer has logprobs that match the
    rendered completion (``text_ids``, ``spans``), else the text's, flagged when logprobs were there but unusable."""
    entries = logprob_entries(response)
    if not entries:
        return text_ids, spans, "text", ["logprobs_unreadable"] if _unreadable_logprobs(response) else []
    try:
        ids = logprob_ids(entries, tok)
    except LogprobConflict:
        return text_ids, spans, "text", ["logprobs_conflict"]
    except LogprobError:
        return text_ids, spans, "text", ["logprobs_unreadable"]
    text_ids = text_ids.tolist() if hasattr(text_ids, "tolist") else text_ids  # a packing encoder's numpy IDs
    rendered = b"".join(tok.token_bytes(i) for i in text_ids)
    got = b"".join(tok.token_bytes(i) for i in ids)
    if got != rendered and text_ids and text_ids[-1] in tok.special_ids and (ids[-1:] != text_ids[-1:]):
        ids = ids + [text_ids[-1]]  # the stop token, left out of the entries as its text is not in the answer
        got += tok.token_bytes(text_ids[-1])
    new_spans = respan(spans, tok, ids) if got == rendered else None
    if new_spans is None:
        return text_ids, spans, "text", ["logprobs_mismatch"]
    return ids, new_spans, "logprobs", []
