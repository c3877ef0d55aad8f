"""The shapes people log chat completions in, read as one API record ``{"id", "request", "response"}``.

Accepted (one object per JSONL line, or the items of a JSON array for ``kimi-eagle convert``):

- ``{"id"?, "request": {...}, "response": {...}}`` — the kit's API record (``kimi-eagle collect`` writes it);
  ``"completion"`` is read as another name for ``"response"``;
- ``{"model", "messages", "tools"?, ..., "response": {...}}`` — the request's fields themselves beside the
  response, e.g. ``{**kwargs, "response": client.chat.completions.create(**kwargs).model_dump()}``;
- the response may be the OpenAI SDK's ``model_dump()`` (``null`` fields included) or OpenRouter's response
  JSON (``provider``, ``native_finish_reason``, ``reasoning``, ``usage.cost``): it is kept as it is, so
  ``usage``, ``provider``, ``finish_reason`` and ``model`` reach ``reconstruct`` and ``billing`` unchanged.

The id is the record's own string ``id``; without one, the response's ``id`` (the provider's generation id,
``chatcmpl-…``/``gen-…``); without either, ``log:`` and 16 hex digits of the SHA-256 of the request and
response (stable across reruns); ``id_from`` says which (``"response.id"`` / ``"content sha256"``). A bare
response (no request) is refused with a message: its prompt cannot be rendered; so is a request logged without its
response, and usage whose counts are not counts (:func:`response_shape_problem`). With ``OPENROUTER_API_KEY`` set,
a provider or model name holding the key is replaced by a marker and named in ``key_redacted``
(:func:`kimi_eagle.redact.redact_key_fields`). Raises
:class:`LogShapeError` for anything else.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

from kimi_eagle.reconstruct.stream import MAX_CHOICES
from kimi_eagle.reconstruct.usage import usage_count_problems
from kimi_eagle.redact import redact_key_fields

RESPONSE_KEYS = ("response", "completion")
RECORD_KEYS = ("id", "dataset", "request", "error", "id_from", *RESPONSE_KEYS)  # not request fields when flat
ACCEPTED = ("{request, response}", "{model, messages, tools?, response} (request fields beside the response)")


class LogShapeError(ValueError):
    """A logged item is none of the accepted shapes; the message names what it has and what is missing."""


def is_api_log(item: Any) -> bool:
    """Whether ``item`` carries a response (any accepted shape), not a bare conversation of ``messages``."""
    return isinstance(item, dict) and any(isinstance(item.get(k), dict) for k in RESPONSE_KEYS)


def _response(item: dict) -> dict:
    for key in RESPONSE_KEYS:
        if isinstance(item.get(key), dict):
            return item[key]
    if "choices" in item:
        raise LogShapeError("a chat.completion response without its request: log the request beside it, "
                            'as {"request": {...}, "response": {...}}')
    raise LogShapeError(f"no response object (fields: {', '.join(sorted(map(str, item))) or 'none'}; "
                        f"accepted: {'; '.join(ACCEPTED)})")


def _request(item: dict, response: dict) -> dict:
    if "request" in item:
        if not isinstance(item["request"], dict):
            raise LogShapeError(f"request is a {type(item['request']).__name__}, not an object")
        request = dict(item["request"])
    elif "messages" in item:
        request = {k: v for k, v in item.items() if k not in RECORD_KEYS}
    else:
        raise LogShapeError("a response without its request (no `request` object and no `messages` beside it)")
    if "model" not in request and isinstance(response.get("model"), str):
        request["model"] = response["model"]
    return request


def response_shape_problem(response: dict, usage: bool = True) -> str | None:
    """Why a logged response's choices or usage cannot be read as they are (see the module docstring), or None:
    usage counts that are negative, not integers (``"7"`` included), not finite or beyond 10**9 are named, never
    stored as billed (:func:`~kimi_eagle.reconstruct.usage.usage_count_problems`; ``usage=False``: the choices
    alone)."""
    choices = response.get("choices")
    seen: set[int] = set()
    for i, choice in enumerate(choices if isinstance(choices, list) else []):
        if not isinstance(choice, dict):
            return f"choices[{i}] is a {type(choice).__name__}, not an object"
        index = choice.get("index", i)
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < MAX_CHOICES or index in seen:
            shown = json.dumps(index)[:40] if index is None or isinstance(index, (bool, int, float, str)) else type(index).__name__
            return f"choices[{i}].index is {shown}: not an integer 0..{MAX_CHOICES - 1} used once"
        seen.add(index)
        logprobs = choice.get("logprobs")
        if logprobs is not None and not isinstance(logprobs, dict):
            return f"choices[{i}].logprobs is a {type(logprobs).__name__}, not an object"
    return "; ".join(usage_count_problems(response.get("usage")) if usage else []) or None  # shape, then every count


def api_record_from_log(item: Any, dataset: str | None = None, usage: bool = True) -> dict:
    """``{"id", "dataset"?, "request", "response", "id_from"?}`` of one logged completion (see the module);
    ``usage=False``: its usage kept unchecked, for a reader that reports a broken usage on its own."""
    if not isinstance(item, dict):
        raise LogShapeError(f"a logged completion is a JSON object, not a {type(item).__name__}")
    response = _response(item)
    problem = response_shape_problem(response, usage)
    if problem:
        raise LogShapeError(problem)
    request = _request(item, response)
    record: dict[str, Any] = {}
    rid = item.get("id")
    if rid is not None and not isinstance(rid, str):
        raise LogShapeError(f"id is a {type(rid).__name__}, not a string")
    if rid:
        record["id"] = rid
    elif isinstance(response.get("id"), str) and response["id"]:
        record["id"], record["id_from"] = response["id"], "response.id"
    else:
        canonical = json.dumps([request, response], sort_keys=True, ensure_ascii=False, default=str)
        digest = hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        record["id"], record["id_from"] = f"log:{digest}", "content sha256"
    dataset = item.get("dataset", dataset)
    if dataset is not None:
        record["dataset"] = dataset
    record.update(request=request, response=response)
    return redact_key_fields(record)  # a key inside response.provider or .model: replaced and named


def as_api_record(record: Any) -> Any:
    """What ``kimi-eagle reconstruct`` reads of one JSONL record: ``record`` itself when it is already
    ``{"id", "request", "response"}`` or no logged completion at all (its own checks then say what is wrong);
    else :func:`api_record_from_log` of it, its usage unchecked (a broken usage is the row's ``usage_error``, as
    for a record already in the kit's shape) — but a record with no id of its own or of its response stays as it
    is (an error row: a reconstructed row has no place to say its id was made; ``convert`` makes and records one)."""
    if not is_api_log(record) or (isinstance(record.get("id"), str) and isinstance(record.get("request"), dict)
                                  and isinstance(record.get("response"), dict)):
        return redact_key_fields(record)
    try:
        shaped = api_record_from_log(record, usage=False)
    except LogShapeError:
        return record
    return record if shaped.get("id_from") == "content sha256" else shaped
