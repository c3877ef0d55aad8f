"""Inject non-canonical re-segmentations into training rows: the same bytes, different token IDs.

A re-segmentation replaces one completion token by two shorter vocabulary tokens that spell exactly its
bytes (``▁there`` → ``▁the`` + ``re``), the kind of drift an API's text → token reconstruction can
introduce. :func:`inject_rows` applies it to a chosen fraction of the completion tokens of every row, so
a drafter can be trained on a controlled dose of tokenization drift.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from kimi_eagle.eagle3.hidden import Row
from kimi_eagle.tokenize.tokenizer import Tokenizer


def two_token_splits(tok: Tokenizer) -> dict[int, tuple[int, int]]:
    """For every ordinary token that two ordinary tokens can spell, the split closest to the middle of its
    bytes (ties: the shorter first part): ``{id: (left_id, right_id)}`` with
    ``bytes(left) + bytes(right) == bytes(id)``."""
    by_bytes = tok.id_by_bytes
    splits: dict[int, tuple[int, int]] = {}
    for i, raw in enumerate(tok.token_table):
        if len(raw) < 2 or tok.is_special(i):
            continue
        cuts = sorted(range(1, len(raw)), key=lambda c: (abs(2 * c - len(raw)), c))
        for c in cuts:
            left, right = by_bytes.get(raw[:c]), by_bytes.get(raw[c:])
            if left is not None and right is not None:
                splits[i] = (left, right)
                break
    return splits


def split_positions(row: Row, positions: set[int], splits: dict[int, tuple[int, int]]) -> Row:
    """``row`` with the tokens at ``positions`` replaced by their two-token splits; both halves keep the
    token's mask value."""
    ids: list[int] = []
    mask: list[int] = []
    for t, (token, m) in enumerate(zip(row.input_ids, row.loss_mask)):
        parts = splits[token] if t in positions else (token,)
        ids.extend(parts)
        mask.extend([m] * len(parts))
    return Row(row.id, ids, mask)


def inject_rows(rows: Sequence[Row], tok: Tokenizer, rate: float, seed: int = 0, keep=None) -> tuple[list[Row], dict]:
    """The rows with ``round(rate · n)`` of their ``n`` completion tokens (drawn at random, over all rows,
    among the tokens that have a two-token split) each replaced by the split. Returns the rows and
    ``{rate, completion_tokens, split_tokens, achieved_rate, splittable_tokens}`` (achieved = split /
    original completion tokens; below ``rate`` only when too few tokens can be split). ``keep``: an id filter
    (e.g. ``id in id_map`` for a row-mapped tiny-kimi): only tokens that pass it, split into two halves that pass it (a
    token the model has no row for is never split into two it has: its row stays refused as before)."""
    splits = two_token_splits(tok)
    if keep is not None:
        splits = {t: pair for t, pair in splits.items() if keep(t) and keep(pair[0]) and keep(pair[1])}
    candidates = [(i, t) for i, row in enumerate(rows) for t, (token, m) in enumerate(zip(row.input_ids, row.loss_mask))
                  if m and token in splits]
    n_completion = sum(sum(r.loss_mask) for r in rows)
    want = min(len(candidates), int(round(rate * n_completion)))
    chosen = np.random.default_rng(seed).choice(len(candidates), size=want, replace=False) if want else []
    positions: dict[int, set[int]] = {}
    for j in chosen:
        i, t = candidates[int(j)]
        positions.setdefault(i, set()).add(t)
    out = [split_positions(row, positions.get(i, set()), splits) for i, row in enumerate(rows)]
    return out, {"rate": rate, "completion_tokens": n_completion, "split_tokens": want, "splittable_tokens": len(candidates),
                 "achieved_rate": round(want / n_completion, 5) if n_completion else 0.0}
