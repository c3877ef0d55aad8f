"""Every drafter objective in one module: the soft targets, EAGLE-3's training-time test (:class:`TTTLoss`) and the
DFlash block objective (:class:`DFlashLoss`) with the choices the reference recipes make (:class:`BlockObjective`;
presets in :mod:`kimi_eagle.eagle3.recipes`).

Both losses wrap their drafter so that one ``forward(aux, input_ids, loss_mask, final) -> (loss, stats)`` is one DDP
step; ``stats`` [rows, 3] holds per unroll step / block slot ``(CE sum, correct, supervised)`` for the Trainer's log.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from kimi_eagle.eagle3.drafter_base import shift_left


def soft_targets(final: torch.Tensor, target_head_rows: torch.Tensor) -> torch.Tensor:
    """The target's next-token distribution restricted to the draft vocabulary and renormalised."""
    return torch.softmax(final @ target_head_rows.float().T, dim=-1)


def supervised_mask(loss_mask: torch.Tensor, step: int) -> torch.Tensor:
    """Float mask [B,T] of the positions supervised at unroll ``step``: ``loss_mask[t + 2 + step]``."""
    return shift_left(loss_mask, 2 + step).float()


def expected_tau(acc: Sequence[float]) -> float:
    """Acceptance length if step ``k`` is accepted with probability ``acc[k]`` given all earlier ones were:
    ``1 + sum_k prod_{j<=k} acc[j]``."""
    tau, run = 1.0, 1.0
    for a in acc:
        run *= a
        tau += run
    return tau


# ------------------------------------------------------------------------------------------
# EAGLE-3


class TTTLoss(nn.Module):
    """The EAGLE-3 drafter plus its training-time-test objective: step ``k`` predicts ``x[t+2+k]`` with the soft
    targets of ``final[t+1+k]``, per-step mean over supervised positions, weight ``step_weight ** k``."""

    def __init__(self, drafter: nn.Module, target_head: torch.Tensor, steps: int, step_weight: float):
        super().__init__()
        self.drafter = drafter
        self.register_buffer("target_head", target_head, persistent=False)  # [Vd, H] rows of the target lm_head
        self.steps, self.step_weight = steps, step_weight
        self.stat_rows = steps  # rows of the per-step statistics forward returns

    def forward(self, aux, input_ids, loss_mask, final):
        """Returns ``(loss, stats)``; ``stats[k] = (CE sum, correct, supervised)`` of step k."""
        logits_per_step = self.drafter.unroll(aux, input_ids, self.steps)
        loss = aux.new_zeros((), dtype=torch.float)
        stats = []
        for k, logits in enumerate(logits_per_step):
            with torch.no_grad():
                p = soft_targets(shift_left(final, 1 + k).float(), self.target_head)
            mask = supervised_mask(loss_mask, k)
            ce = -(p * F.log_softmax(logits.float(), dim=-1)).sum(-1)
            n = mask.sum()
            step_loss = (ce * mask).sum() / n.clamp(min=1)
            loss = loss + self.step_weight**k * step_loss
            correct = ((logits.argmax(-1) == p.argmax(-1)).float() * mask).sum()
            stats.append(torch.stack([(ce * mask).sum().detach(), correct, n]))
        return loss, torch.stack(stats)


# ------------------------------------------------------------------------------------------
# DFlash

CE_TARGETS = ("soft", "argmax", "data")
WEIGHTINGS = ("power", "exp", "dpace")
NORMALISATIONS = ("per-slot", "pooled", "weighted")


@dataclass(frozen=True)
class BlockObjective:
    """How a DFlash block is supervised (slot ``j = 1..S-1`` predicts ``x[a + j]``).

    * ``ce``: ``soft`` — cross-entropy to the target's distribution over the draft vocabulary (the kit);
      ``argmax`` — hard cross-entropy to the target's argmax (speculators' ``ce``); ``data`` — hard cross-entropy to
      the row's own next token (SpecForge's DFlash trainer, z-lab's paper); a token outside the draft vocabulary is
      not supervised.
    * ``weighting``: ``power`` — ``step_weight ** (j-1)`` (the kit); ``exp`` — ``exp(-(j-1)/gamma)`` (the paper's
      decay, speculators' ``fixed-exp-decay``); ``dpace`` — D-PACE (speculators' default for ``dflash``, needs a hard
      ``ce``): the suffix sum of smoothed cumulative confidences ``prod_{i<=j} ((1-alpha) q_i + alpha)``, detached.
    * ``normalise``: ``per-slot`` — the sum over slots of each slot's mean (the kit); ``pooled`` — one mean over
      every supervised slot, weights in the numerator only (speculators); ``weighted`` — ``sum(w·ce) / sum(w)``
      (SpecForge).
    * ``max_anchors``: None — every anchor whose block predicts a supervised token (the kit); ``N`` — anchors drawn
      at random (torch's global generator, so resumes are exact) from supervised positions at least one block
      before the row's end, at most ``N`` distinct positions per step (speculators and SpecForge: 512).
    """

    ce: str = "soft"
    weighting: str = "power"
    step_weight: float = 0.8
    gamma: float = 4.0
    dpace_alpha: float = 0.5
    normalise: str = "per-slot"
    max_anchors: int | None = None

    def __post_init__(self):
        for name, allowed in (("ce", CE_TARGETS), ("weighting", WEIGHTINGS), ("normalise", NORMALISATIONS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"DFlash objective: {name} {getattr(self, name)!r} is not one of {', '.join(allowed)}")
        if self.weighting == "dpace" and self.ce == "soft":
            raise ValueError("DFlash objective: D-PACE weights need a hard cross-entropy (ce argmax or data)")
        if not 0.0 < self.dpace_alpha <= 1.0 or self.gamma <= 0 or (self.max_anchors is not None and self.max_anchors < 1):
            raise ValueError("DFlash objective: dpace_alpha in (0, 1], gamma > 0 and max_anchors >= 1 (or None)")


def block_anchors(loss_mask: torch.Tensor, block_size: int) -> torch.Tensor:
    """The anchor positions [A] worth training in a batch ``loss_mask`` [B,T]: every ``a`` whose block predicts a
    supervised token (``loss_mask[b, a + j] == 1`` for some row ``b`` and slot ``1 <= j < block_size``)."""
    t = loss_mask.shape[1]
    hit = torch.zeros(t, dtype=torch.bool)
    supervised = loss_mask.bool().any(0)
    for j in range(1, block_size):
        hit[: max(0, t - j)] |= supervised[j:]
    anchors = hit.nonzero().flatten()
    return anchors if anchors.numel() else torch.zeros(1, dtype=torch.long)


def sampled_anchors(loss_mask: torch.Tensor, block_size: int, max_anchors: int) -> tuple[torch.Tensor, torch.Tensor]:
    """speculators' anchors for a padded batch: per row, supervised positions ``a`` with ``a < end - block_size``
    (``end``: one past the row's last supervised position; the last block never anchors); at most ``max_anchors``
    distinct positions drawn uniformly without replacement, sorted. Returns ``(anchors [A], valid [B, A])``."""
    b, t = loss_mask.shape
    mask = loss_mask.bool()
    ends = torch.where(mask.any(1), t - mask.flip(1).long().argmax(1), torch.zeros(b, dtype=torch.long))
    valid = mask & (torch.arange(t)[None, :] < (ends - block_size)[:, None])
    candidates = valid.any(0).nonzero().flatten()
    if candidates.numel() == 0:
        return torch.zeros(1, dtype=torch.long), torch.zeros(b, 1, dtype=torch.bool)
    if candidates.numel() > max_anchors:
        candidates = candidates[torch.randperm(candidates.numel())[:max_anchors]].sort().values
    return candidates, valid[:, candidates]


def dpace_weights(confidence: torch.Tensor, mask: torch.Tensor, alpha: float) -> torch.Tensor:
    """D-PACE weights [..., S-1] of a block's slots from the draft's confidence in its label ``exp(-CE)``: smoothed
    ``(1 - alpha) q + alpha`` (1 where unsupervised), prefix products, suffix sums over supervised slots."""
    smooth = torch.where(mask > 0, (1.0 - alpha) * confidence + alpha, torch.ones_like(confidence))
    prefix = torch.cumprod(smooth, dim=-1)
    return torch.flip(torch.cumsum(torch.flip(prefix * mask, dims=[-1]), dim=-1), dims=[-1]) * mask


class DFlashLoss(nn.Module):
    """The DFlash drafter plus its objective (:class:`BlockObjective`; one ``forward`` is one DDP step), with
    :class:`TTTLoss`'s interface: ``forward(aux, input_ids, loss_mask, final) -> (loss, stats)``, ``stats`` [S-1, 3]
    per slot ``j = 1..S-1`` (CE of the objective's target, agreement with the target's argmax, supervised)."""

    def __init__(self, drafter: nn.Module, target_head: torch.Tensor, objective: BlockObjective | float = BlockObjective()):
        super().__init__()
        self.drafter = drafter
        self.register_buffer("target_head", target_head, persistent=False)  # [Vd, H] rows of the target lm_head
        self.objective = objective if isinstance(objective, BlockObjective) else BlockObjective(step_weight=float(objective))
        self.stat_rows = drafter.config.block_size - 1

    def _anchors(self, loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        s, cap = self.drafter.config.block_size, self.objective.max_anchors
        return (block_anchors(loss_mask, s), None) if cap is None else sampled_anchors(loss_mask, s, cap)

    def _labels(self, input_ids, index, p) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Hard labels [B,A,S-1] in draft ids (None for soft targets) and where they exist (1 = in the draft vocab)."""
        if self.objective.ce == "soft":
            return None, torch.ones(p.shape[:-1])
        if self.objective.ce == "argmax":
            return p.argmax(-1), torch.ones(p.shape[:-1])
        tokens = input_ids[:, index]
        t2d = self.drafter.t2d
        to_draft = torch.cumsum(t2d.long(), 0) - 1
        return to_draft[tokens].clamp(min=0), t2d[tokens].float()

    def _slot_weights(self, ce: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        o, s = self.objective, self.drafter.config.block_size
        j = torch.arange(s - 1, dtype=torch.float)  # slot j + 1
        if o.weighting == "power":
            return (o.step_weight ** j).expand_as(mask)
        if o.weighting == "exp":
            return torch.exp(-j / o.gamma).expand_as(mask)
        with torch.no_grad():
            return dpace_weights(torch.exp(-ce.detach() * mask), mask, o.dpace_alpha)

    def _reduce(self, ce: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        norm = self.objective.normalise
        if norm == "per-slot":
            return ((ce * mask * weights).sum((0, 1)) / mask.sum((0, 1)).clamp(min=1)).sum()
        if norm == "pooled":
            return (ce * mask * weights).sum() / (mask.sum() + 1e-6)
        return (ce * mask * weights).sum() / ((mask * weights).sum() + 1e-6)

    def forward(self, aux, input_ids, loss_mask, final):
        t, s = input_ids.shape[1], self.drafter.config.block_size
        anchors, valid = self._anchors(loss_mask)
        logits = self.drafter(aux, input_ids, anchors)[:, :, 1:].float()  # [B,A,S-1,Vd]: slot j predicts x[a + j]
        predicted = anchors[:, None] + torch.arange(1, s)  # [A,S-1]
        index = predicted.clamp(max=t - 1)
        mask = loss_mask[:, index].float() * (predicted < t)  # [B,A,S-1]
        if valid is not None:
            mask = mask * valid[:, :, None]
        with torch.no_grad():  # the target's distribution of x[a + j] over the draft vocabulary
            p = soft_targets(final[:, index - 1].float(), self.target_head)
        labels, exists = self._labels(input_ids, index, p)
        mask = mask * exists
        logp = F.log_softmax(logits, dim=-1)
        ce = -(p * logp).sum(-1) if labels is None else -logp.gather(-1, labels[..., None])[..., 0]
        loss = self._reduce(ce, mask, self._slot_weights(ce, mask))
        correct = ((logits.argmax(-1) == p.argmax(-1)).float() * mask).sum((0, 1))
        return loss, torch.stack([(ce * mask).sum((0, 1)).detach(), correct, mask.sum((0, 1))], dim=1)


def slot_weight_table(objective: BlockObjective, block_size: int) -> list[float] | None:
    """The fixed per-slot weights of ``objective`` (None for D-PACE, whose weights depend on the draft)."""
    j = range(block_size - 1)
    if objective.weighting == "power":
        return [objective.step_weight**i for i in j]
    if objective.weighting == "exp":
        return [math.exp(-i / objective.gamma) for i in j]
    return None
