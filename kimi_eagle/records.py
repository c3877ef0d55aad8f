"""Record schemas shared across the kit (JSONL reading is in :mod:`kimi_eagle.io`).

Engine record: ``{"id", "output_ids": [...], "prompt_ids"?: [...]}``. SGLang ``/generate``
output (``output_ids`` + ``meta_info``) and vLLM ``return_token_ids`` output
(``choices[0].token_ids``, ``prompt_token_ids``) are accepted as they are. Every field the kit
keeps is checked here: a wrong shape or an out-of-range number is a :class:`RecordError` naming
the field, never an exception from deeper down.
"""
from __future__ import annotations

import re
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable

INT64_MAX = 2**63 - 1
TOKEN_ID_LIMIT = 2**31  # token IDs are stored as int32
RESERVED_ID = re.compile(r"<(?:engine )?line \d+(?: value \d+)?>\Z")  # synthetic ids of unreadable lines (reconstruct, diff)


class RecordError(ValueError):
    """One record is malformed; the message says why."""


@dataclass(frozen=True)
class EngineRecord:
    id: str
    output_ids: list[int]
    prompt_ids: list[int] | None = None
    finish_reason: str | None = None


def kind(value: Any) -> str:
    """A JSON value's kind in words (``a list``, ``an integer`` ...), for error messages."""
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
             float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def storable_text(text: str) -> bool:
    """True when ``text`` can be written as UTF-8 (no lone surrogate)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def printable_id(value: Any) -> str:
    """An id as text that can always be stored (lone surrogates escaped as ``\\udXXX``)."""
    text = value if isinstance(value, str) else str(value)
    return text if storable_text(text) else text.encode("utf-8", "backslashreplace").decode("ascii", "replace")


def synthetic_id(lineno: int, value: int | None = None) -> str:
    """The id of a record whose own id cannot be read: ``<line N>`` (``<line N value K>`` for the K-th of
    several values on one line). Real ids of this form are refused, so the two never collide."""
    return f"<line {lineno}>" if value is None else f"<line {lineno} value {value}>"


def check_id(value: Any, what: str = "id") -> str:
    """A record id: a non-empty string (integers are accepted as their decimal text), storable, not reserved."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value:
        raise RecordError(f"{what} is {kind(value) if value != '' else 'an empty string'}, not a non-empty string")
    if not storable_text(value):
        raise RecordError(f"{what} {printable_id(value)!r} is not valid Unicode (lone surrogate)")
    if RESERVED_ID.match(value):
        raise RecordError(f"{what} {value!r} has the form reserved for unreadable lines")
    return value


def count_field(value: Any) -> int | None:
    """A token count: a non-negative integer that fits int64, else None (absent or unusable)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= INT64_MAX:
        return value
    return None


def _int_list(value: Any, field: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise RecordError(f"{field} must be a list of integers")
    if value and (min(value) < 0 or max(value) >= TOKEN_ID_LIMIT):
        bad = next(k for k, i in enumerate(value) if not 0 <= i < TOKEN_ID_LIMIT)
        shown = str(value[bad]) if abs(value[bad]) < 10**30 else f"an integer of {len(str(abs(value[bad])))} digits"
        raise RecordError(f"{field}[{bad}] is {shown}, not a token ID (0 <= id < 2**31)")
    return value


def _finish(value: Any, field: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not storable_text(value):
        raise RecordError(f"{field} is {kind(value)}, not a string" if not isinstance(value, str)
                          else f"{field} is not valid Unicode (lone surrogate)")
    return value


def parse_engine_record(obj: Any) -> EngineRecord:
    """Normalise one engine record (native, SGLang or vLLM shape); RecordError names what is wrong."""
    if not isinstance(obj, dict):
        raise RecordError(f"engine record is {kind(obj)}, not a JSON object")
    meta = obj.get("meta_info")
    if meta is None:
        meta = {}
    elif not isinstance(meta, dict):
        raise RecordError(f"meta_info is {kind(meta)}, not an object")
    rid = obj.get("id", meta.get("id"))
    if rid is None:
        raise RecordError("engine record has no id")
    rid = check_id(rid, "engine record id")
    choices = obj.get("choices")
    if "output_ids" in obj:
        output = _int_list(obj["output_ids"], "output_ids")
        prompt = obj.get("prompt_ids")
        fr = meta.get("finish_reason")
        finish = _finish(fr.get("type") if isinstance(fr, dict) else fr, "meta_info.finish_reason")
        if "finish_reason" in obj:
            finish = _finish(obj["finish_reason"], "finish_reason")
    elif isinstance(choices, list) and choices:
        choice = choices[0]
        if not isinstance(choice, dict):
            raise RecordError(f"choices[0] is {kind(choice)}, not an object")
        if "token_ids" not in choice:
            raise RecordError("engine record has no output_ids or choices[0].token_ids")
        output = _int_list(choice["token_ids"], "choices[0].token_ids")
        prompt = obj.get("prompt_token_ids", choice.get("prompt_token_ids"))
        finish = _finish(choice.get("finish_reason"), "choices[0].finish_reason")
    else:
        raise RecordError("engine record has no output_ids or choices[0].token_ids")
    if prompt is not None:
        prompt = _int_list(prompt, "prompt_ids")
    return EngineRecord(rid, output, prompt, finish)


_VARIABLE = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|\d[\d,_.]*")


def error_kind(reason: str) -> str:
    """A reason with its particulars (quoted values, numbers) blanked, so that alike errors group together."""
    return _VARIABLE.sub(lambda m: "N" if m.group()[0].isdigit() else "'…'", reason)


def clip_words(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters: whole, or cut at the last space before the limit and ended by
    `` […]``, so a reason is never cut inside a word or a quoted value mid-way without saying so.

    >>> clip_words('line 3: "response": {"choices": []} is not an object', 30)
    'line 3: "response" […]'
    """
    if len(text) <= limit:
        return text
    head = text[: limit - 4]
    cut = head.rfind(" ")
    return (head[:cut] if cut > limit // 2 else head).rstrip(" :,;") + " […]"


def error_table(reasons: Iterable[str | None], top: int = 10) -> str:
    """A printable table of the most common error kinds (see :func:`error_kind`), most frequent first; each
    kind is shown by its first real reason (field names and digits as they were), with the count of alike ones."""
    counts: Counter[str] = Counter()
    example: dict[str, str] = {}
    for r in reasons:
        if r:
            counts[kind_ := error_kind(r)] += 1
            example.setdefault(kind_, r)
    if not counts:
        return ""
    lines = [f"top error reasons ({sum(counts.values())} records in error, {len(counts)} kinds):"]
    lines += [f"  {n:>7}  {clip_words(example[kind_], 160)}" + (" (and alike)" if n > 1 else "")
              for kind_, n in counts.most_common(top)]
    if len(counts) > top:
        lines.append(f"  {sum(n for _, n in counts.most_common()[top:]):>7}  ({len(counts) - top} other kinds)")
    return "\n".join(lines)


EXIT_NOTHING_PROCESSED = 3  # a command ran but no record could be processed (empty input, every record an error)



def exit_status(counts: dict[str, int], errors: list[str], ok: str = "ok") -> int:
    """A command's exit code from its per-record outcome: 0 when some record came through (the top error
    reasons are printed if any failed), ``EXIT_NOTHING_PROCESSED`` when none did."""
    if errors:
        print(error_table(errors))
    if not counts.get(ok):
        total = sum(counts.values())
        print(f"no record could be processed ({total} of {total} in error)" if total else "no record to process",
              file=sys.stderr)
        return EXIT_NOTHING_PROCESSED
    return 0


# --------------------------------------------------------------------------------------------
# Collected API records (``responses.jsonl`` of ``kimi-eagle collect``)

RESPONSE_COLUMNS = ("id", "status", "error", "http_status", "provider", "finish_reason", "completion_tokens", "attempts",
                    "latency_s", "text", "error_message")


def response_row(record: dict[str, Any]) -> dict[str, Any]:
    """One collected record as a table row (:data:`RESPONSE_COLUMNS`): status, finish reason, billed completion
    tokens, attempts, latency of the final attempt, the first 80 characters of the text, the error's kind and
    (already redacted by the collector) the first 120 characters of its message."""
    resp = record.get("response") or {}
    choice = (resp.get("choices") or [{}])[0]
    error, timing = record.get("error") or {}, record.get("timing") or {}
    return {
        "id": record["id"], "status": record["status"], "error": error.get("kind"),
        "http_status": record.get("http_status"), "provider": resp.get("provider"),
        "finish_reason": choice.get("finish_reason"),
        "completion_tokens": (resp.get("usage") or {}).get("completion_tokens"),
        "attempts": timing.get("attempts"), "latency_s": timing.get("latency_s"),
        "text": ((choice.get("message") or {}).get("content") or "")[:80],
        "error_message": (error.get("message") or "")[:120],
    }


def response_rows(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """:func:`response_row` of every record, sorted by id."""
    return sorted((response_row(r) for r in records), key=lambda row: row["id"])


def collect_metrics(summary: dict[str, Any], rows: list[dict[str, Any]], local_server: bool,
                    model: str = "stories260K", base_url: str | None = None) -> dict[str, Any]:
    """``metrics.json`` of a collection: prompts, ok/errors and tokens of the output file, this run's requests
    and retries, what it reused (:mod:`kimi_eagle.reuse`), cost, wall time and requests per second from the
    collector's ``summary``; finish reasons counted over ``rows`` (most frequent first); ``data``: the data kind
    (:mod:`kimi_eagle.data_kinds`): a local server of ``model`` stands in for a provider (the one the notebook
    started, ``local_server``, or any server on this machine at ``base_url``), else ``real``."""
    from kimi_eagle.data_kinds import REAL, provider_kind, stand_in
    from kimi_eagle.reuse import note_collect

    totals, wall = summary["totals"], summary["seconds"]
    finish = Counter(row["finish_reason"] for row in rows if row["finish_reason"] is not None)
    reused: dict[str, str] = {}
    note_collect(reused, "collect", summary)
    return {
        "prompts": summary["prompts"], "ok": totals["ok"], "errors": totals["errors"],
        "requested": summary["requested"], "retries": summary["retries"], "reused": reused,
        "prompt_tokens": totals["prompt_tokens"], "completion_tokens": totals["completion_tokens"],
        "reasoning_tokens": totals["reasoning_tokens"], "cost_usd": totals["cost"],
        "seconds": wall, "requests_per_s": round(summary["requested"] / wall, 3) if wall else None,
        "finish_reasons": {str(k): int(v) for k, v in finish.most_common()},
        "local_server": local_server, "data": stand_in(f"{model} served locally") if local_server
        else provider_kind(base_url, model) if base_url else REAL,
    }
