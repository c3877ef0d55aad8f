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
