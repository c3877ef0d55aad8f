"""The drafter's reduced vocabulary: the N target tokens most often *predicted* in the training data.

Counts are taken over supervised positions only (loss mask 1). Draft ids are the chosen target ids
in ascending order, stored the way EAGLE-3 engines load them:

* ``d2t`` int64 [N]: offsets, ``target_id = draft_id + d2t[draft_id]``;
* ``t2d`` bool [V]: whether a target id is in the draft vocabulary.

When N exceeds the number of distinct predicted tokens, the rest is filled with unseen target ids
(lowest first), so any N up to V works.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch


@dataclass
class DraftVocab:
    draft_to_target: torch.Tensor  # int64 [N], ascending target ids
    target_vocab_size: int
    counts: torch.Tensor  # int64 [V], supervised-token frequencies the choice was made from

    @property
    def size(self) -> int:
        return int(self.draft_to_target.numel())

    @property
    def d2t(self) -> torch.Tensor:
        return self.draft_to_target - torch.arange(self.size)

    @property
    def t2d(self) -> torch.Tensor:
        t2d = torch.zeros(self.target_vocab_size, dtype=torch.bool)
        t2d[self.draft_to_target] = True
        return t2d

    def coverage(self, counts: torch.Tensor | None = None) -> float:
        """Fraction of supervised positions whose target token is in the draft vocabulary."""
        counts = self.counts if counts is None else counts
        total = int(counts.sum())
        return float(counts[self.draft_to_target].sum()) / total if total else 0.0

    def report(self) -> dict:
        return {
            "draft_vocab_size": self.size, "target_vocab_size": self.target_vocab_size,
            "distinct_supervised_tokens": int((self.counts > 0).sum()),
            "supervised_positions": int(self.counts.sum()), "coverage": round(self.coverage(), 6),
        }


def supervised_counts(rows: Iterable[tuple[torch.Tensor, torch.Tensor]], vocab_size: int) -> torch.Tensor:
    """Frequencies of the tokens at supervised positions, from ``(input_ids, loss_mask)`` pairs."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ids, mask in rows:
        ids, mask = torch.as_tensor(ids, dtype=torch.long), torch.as_tensor(mask).bool()
        counts += torch.bincount(ids[mask], minlength=vocab_size)
    return counts


def build(counts: torch.Tensor, n: int) -> DraftVocab:
    """The top-``n`` tokens by count (ties: lower id first), as ascending target ids."""
    vocab = int(counts.numel())
    if not 1 <= n <= vocab:
        raise ValueError(f"draft vocab size must be in [1, {vocab}], got {n}")
    # stable descending sort by count keeps lower ids first among equal counts (zeros fill the tail)
    order = torch.sort(counts, descending=True, stable=True).indices
    chosen = torch.sort(order[:n]).values
    return DraftVocab(chosen.to(torch.long), vocab, counts.to(torch.long))


def from_tensors(d2t: torch.Tensor, t2d: torch.Tensor) -> DraftVocab:
    """Rebuild from the stored ``d2t``/``t2d`` (counts unknown: zeros)."""
    draft_to_target = d2t.to(torch.long) + torch.arange(d2t.numel())
    if not torch.equal(torch.nonzero(t2d).flatten(), draft_to_target):
        raise ValueError("d2t and t2d disagree")
    return DraftVocab(draft_to_target, int(t2d.numel()), torch.zeros(int(t2d.numel()), dtype=torch.long))
