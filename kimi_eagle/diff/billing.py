"""Billing reconciliation: the API's ``usage`` counts against the reconstructed and engine token counts.

Per record, ``billed - reconstructed`` splits into the part the hunks explain
(``engine - reconstructed``, the negated sum of the hunks' token deltas) and the rest
(``billed - engine``: the provider counted something the engine did not produce, e.g. a stop token).
Without an engine record nothing can be explained and the whole difference is reported as unexplained.
The same split is made for reasoning tokens over the ``reasoning`` segments.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

REASONING_KINDS = ("reasoning",)


@dataclass(frozen=True)
class Billing:
    billed: int | None
    reconstructed: int
    delta: int | None  # billed - reconstructed
    explained: int | None  # by hunks: engine - reconstructed
    unexplained: int | None  # delta - explained


def _split(billed: int | None, reconstructed: int, explained: int | None) -> Billing:
    if billed is None:
        return Billing(None, reconstructed, None, explained, None)
    delta = billed - reconstructed
    return Billing(billed, reconstructed, delta, explained, delta - (explained or 0))


def completion_billing(billed: int | None, n_recon: int, n_engine: int | None) -> Billing:
    """Completion tokens: explained part is ``engine - reconstructed`` when the engine record exists."""
    return _split(billed, n_recon, None if n_engine is None else n_engine - n_recon)


def reasoning_tokens(segments: Iterable[Mapping[str, Any]]) -> int:
    """Tokens in the reasoning segments of a reconstructed completion."""
    return sum(int(s["tok_end"]) - int(s["tok_start"]) for s in segments if s["kind"] in REASONING_KINDS)


def reasoning_billing(billed: int | None, segments: Sequence[Mapping[str, Any]],
                      hunk_deltas_in_reasoning: Iterable[int] | None) -> Billing:
    """Reasoning tokens: explained by the token deltas of hunks inside reasoning segments."""
    explained = None if hunk_deltas_in_reasoning is None else -sum(hunk_deltas_in_reasoning)
    return _split(billed, reasoning_tokens(segments), explained)
