"""Usage details an answer reports beside its token counts, carried into the reconstructed rows for billing.

``usage.prompt_tokens_details.cached_tokens`` -> ``billed_cached_tokens``; ``usage.cost`` (OpenRouter's
credits) -> ``cost``. A value that is not what it says (a negative or float count, a non-finite or boolean
cost) is null, never coerced; ``usage_problem`` (kimi_eagle.reconstruct.record) reports the counts.
:func:`usage_shape_problem` names a usage whose parts are not the objects they must be (a list where
``completion_tokens_details`` is an object): ``convert`` refuses such a record by name rather than read it as empty.
"""
from __future__ import annotations

import math
from typing import Any

from kimi_eagle.records import count_field


def _object(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def usage_details(response: Any) -> dict[str, Any]:
    """``{"billed_cached_tokens", "cost"}`` of a response (None where not reported or not valid)."""
    usage = _object(response.get("usage") if isinstance(response, dict) else None)
    cost = usage.get("cost")
    valid_cost = isinstance(cost, (int, float)) and not isinstance(cost, bool) and math.isfinite(cost) and cost >= 0
    return {"billed_cached_tokens": count_field(_object(usage.get("prompt_tokens_details")).get("cached_tokens")),
            "cost": float(cost) if valid_cost else None}


DETAIL_FIELDS = ("prompt_tokens_details", "completion_tokens_details")


def usage_shape_problem(usage: Any) -> str | None:
    """Why ``usage`` is not the shape it must be (an object, its ``*_tokens_details`` objects or null), or None."""
    if usage is None:
        return None
    if not isinstance(usage, dict):
        return f"usage is a {type(usage).__name__}, not an object"
    wrong = [f"usage.{name} is a {type(usage[name]).__name__}, not an object" for name in DETAIL_FIELDS
             if usage.get(name) is not None and not isinstance(usage[name], dict)]
    return "; ".join(wrong) or None


MAX_USAGE_COUNT = 10**9  # tokens in one answer's usage: no model's context comes near; more is a broken count
USAGE_COUNTS = ("prompt_tokens", "completion_tokens", "total_tokens")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}…({len(text)} characters)"


def usage_count_problems(usage: Any) -> list[str]:
    """Why the counts of ``usage`` cannot be stored as billed (empty when they can): each of ``prompt_tokens``,
    ``completion_tokens``, ``total_tokens`` and every ``*_tokens`` of its details must be a whole number (an
    integer, never a string such as ``"7"``, a float or a boolean) from 0 to :data:`MAX_USAGE_COUNT`, and ``cost`` a
    finite number from 0. Usage given in another shape is :func:`usage_shape_problem`'s.

    >>> usage_count_problems({"prompt_tokens": -5, "completion_tokens": "7", "cost": float("inf")})
    ['usage.prompt_tokens is -5, not a count (a whole number 0..10**9)', "usage.completion_tokens is '7', not a count (a whole number 0..10**9)", 'usage.cost is inf, not a finite cost from 0']
    """
    if shape := usage_shape_problem(usage):
        return [shape]
    usage = _object(usage)
    fields = [(f"usage.{name}", usage[name]) for name in USAGE_COUNTS if usage.get(name) is not None]
    for detail in DETAIL_FIELDS:
        fields += [(f"usage.{detail}.{k}", v) for k, v in _object(usage.get(detail)).items()
                   if str(k).endswith("_tokens") and v is not None]
    problems = [f"{name} is {_shown(v)}, not a count (a whole number 0..10**9)" for name, v in fields
                if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_USAGE_COUNT]
    cost = usage.get("cost")
    if cost is not None and (isinstance(cost, bool) or not isinstance(cost, (int, float)) or not math.isfinite(cost)
                             or cost < 0):
        problems.append(f"usage.cost is {_shown(cost)}, not a finite cost from 0")
    return problems
