"""Record schemas shared across the kit (JSONL reading is in :mod:`kimi_eagle.io`).

Engine record: ``{"id", "output_ids": [...], "prompt_ids"?: [...]}``. SGLang ``/generate``
output (``output_ids`` + ``meta_info``) and vLLM ``return_token_ids`` output
(``choices[0].token_ids``, ``prompt_token_ids``) are accepted as they are.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class RecordError(ValueError):
    """One record is malformed; the message says why."""


@dataclass(frozen=True)
class EngineRecord:
    id: str
    output_ids: list[int]
    prompt_ids: list[int] | None = None
    finish_reason: str | None = None


def _int_list(value: Any, field: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise RecordError(f"{field} must be a list of integers")
    return value


def parse_engine_record(obj: Any) -> EngineRecord:
    """Normalise one engine record (native, SGLang or vLLM shape)."""
    if not isinstance(obj, dict):
        raise RecordError("engine record is not a JSON object")
    meta = obj.get("meta_info") or {}
    rid = obj.get("id", meta.get("id"))
    if rid is None:
        raise RecordError("engine record has no id")
    finish = None
    if "output_ids" in obj:
        output = _int_list(obj["output_ids"], "output_ids")
        prompt = obj.get("prompt_ids")
        fr = meta.get("finish_reason")
        finish = fr.get("type") if isinstance(fr, dict) else fr
        finish = obj.get("finish_reason", finish)
    elif isinstance(obj.get("choices"), list) and obj["choices"] and "token_ids" in obj["choices"][0]:
        choice = obj["choices"][0]
        output = _int_list(choice["token_ids"], "choices[0].token_ids")
        prompt = obj.get("prompt_token_ids", choice.get("prompt_token_ids"))
        finish = choice.get("finish_reason")
    else:
        raise RecordError("engine record has no output_ids or choices[0].token_ids")
    if prompt is not None:
        prompt = _int_list(prompt, "prompt_ids")
    return EngineRecord(str(rid), output, prompt, finish)
