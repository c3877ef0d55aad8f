"""Per-drafter training defaults in one place, and the DFlash reference recipes (``train --dflash-recipe``).

The CLI (``kimi-eagle train``), the notebooks (03, 04 through :mod:`kimi_eagle.eagle3.ablation`) and the benches read
their defaults here: a :class:`~kimi_eagle.eagle3.train.TrainConfig` field left ``None`` (``lr``, ``block_size``,
``draft_layers``) is filled by :func:`resolve` from the drafter's recipe before anything is built or compared with a
checkpoint.

Recipes (facts from the sources named; no code copied):

* ``kit`` — the kit's CPU recipe: soft cross-entropy to the target's draft-vocabulary distribution, weights
  ``0.8^(j-1)``, the sum of per-slot means, every anchor whose block predicts a supervised token, a trained
  ``lm_head``, 1 draft layer, block 8, lr 1e-2.
* ``speculators`` — speculators 0.9.0 ``speculators train --speculator-type dflash`` as resolved by its
  ``TrainConfig`` (``train/config/schema.py``) and trained by ``DFlashDraftModel`` (``models/dflash/core.py``,
  ``metrics.py``, ``losses/utils.py``): hard cross-entropy to the verifier's argmax (``loss_fn ce``) weighted by
  D-PACE (``per_position_loss_weight dpace``, ``dpace_alpha 0.5``; ``--per-position-loss-weight fixed-exp-decay``
  gives ``exp(-(j-1)/γ)``, ``dflash_decay_gamma 4``), one pooled mean over every supervised slot
  (``sum / (mask.sum() + eps)``), up to ``max_anchors 512`` sampled supervised anchors per step outside the last
  block, the verifier's ``lm_head`` rows frozen (``load_verifier_weights``), 5 draft layers, block 16, lr 1e-3.
* ``zlab`` — the DFlash paper's recipe (z-lab has not published its trainer; SpecForge's ``scripts/train_dflash.py``
  and ``specforge/core/dflash.py`` implement it): hard cross-entropy to the data's next token, decay
  ``exp(-(j-1)/γ)`` with γ = 4 for block 8 (7 for 16, 5 for 10), the weighted mean ``Σ w·ce / Σ w``, 512 sampled
  anchors per row, the target's ``lm_head`` frozen, lr 6e-4; block 8 and 6 draft layers as z-lab's Kimi-K2.5 drafter
  (``z-lab/Kimi-K2.5-DFlash``, docs/scale.md).

What no recipe changes: the optimizer (AdamW betas 0.9/0.95, warmup + cosine, clip ``TrainConfig.grad_clip``; the
references use AdamW or Muon with weight decay 0.01 and clip 1.0), the target layers (those ``extract --drafter
dflash`` stored: 5 by default; z-lab's K2.5 drafter reads 6) and the draft vocabulary (``--draft-vocab-size``; a
size of the full vocabulary gives the target's whole ``lm_head``, as z-lab drafts).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import torch

from kimi_eagle.eagle3.losses import BlockObjective, DFlashLoss, TTTLoss

DRAFTERS = ("eagle3", "dflash")


@dataclass(frozen=True)
class Recipe:
    """One drafter's training defaults: learning rate, and for DFlash the block, draft layers, objective and whether
    the ``lm_head`` (the target's draft-vocabulary rows at the start) is frozen."""

    name: str
    lr: float
    block_size: int | None = None
    draft_layers: int | None = None
    objective: BlockObjective | None = None
    freeze_lm_head: bool = False
    source: str = ""


EAGLE3 = Recipe("eagle3", lr=3e-3, source="the kit's EAGLE-3 (7 TTT steps, weights 0.8^k)")
DFLASH_RECIPES: dict[str, Recipe] = {
    "kit": Recipe("kit", lr=1e-2, block_size=8, draft_layers=1, objective=BlockObjective(),
                  source="kit (CPU): soft CE, 0.8^(j-1), per-slot means, every anchor, lm_head trained"),
    "speculators": Recipe("speculators", lr=1e-3, block_size=16, draft_layers=5,
                          objective=BlockObjective(ce="argmax", weighting="dpace", normalise="pooled", max_anchors=512),
                          freeze_lm_head=True, source="speculators 0.9.0 `train --speculator-type dflash` defaults"),
    "zlab": Recipe("zlab", lr=6e-4, block_size=8, draft_layers=6,
                   objective=BlockObjective(ce="data", weighting="exp", gamma=4.0, normalise="weighted", max_anchors=512),
                   freeze_lm_head=True, source="DFlash paper / SpecForge train_dflash.py; z-lab's Kimi-K2.5 shape"),
}
DFLASH_RECIPE = "kit"  # the default of `train --dflash-recipe`


def recipe(drafter: str, dflash_recipe: str = DFLASH_RECIPE) -> Recipe:
    """The defaults of ``drafter`` (``eagle3``, or ``dflash`` under ``dflash_recipe``)."""
    if drafter == "eagle3":
        return EAGLE3
    if drafter != "dflash":
        raise ValueError(f"unknown drafter {drafter!r}: {' or '.join(DRAFTERS)}")
    if dflash_recipe not in DFLASH_RECIPES:
        raise ValueError(f"unknown DFlash recipe {dflash_recipe!r}: {', '.join(DFLASH_RECIPES)}")
    return DFLASH_RECIPES[dflash_recipe]


def default_lr(drafter: str, dflash_recipe: str = DFLASH_RECIPE) -> float:
    return recipe(drafter, dflash_recipe).lr


# the stated range of each bounded training setting (``train --steps/--block-size/--draft-layers``): the references
# train blocks of 8 to 16 with 1 to 8 draft layers; 64 of either is far past them (and past a CPU's memory on Kimi)
RANGES = {"steps": (1, 10_000_000), "block_size": (2, 64), "draft_layers": (1, 64)}
OPTION = {"steps": "--steps", "block_size": "--block-size", "draft_layers": "--draft-layers"}


def check_ranges(cfg) -> None:
    """ValueError naming the option, its value and its range for a setting of ``cfg`` outside :data:`RANGES`
    (``None``: the recipe's, always inside)."""
    for name, (low, high) in RANGES.items():
        value = getattr(cfg, name)
        if value is not None and (type(value) is not int or not low <= value <= high):
            raise ValueError(f"{OPTION[name]} {value!r}: outside {low:,}..{high:,}")


def resolve(cfg):
    """``cfg`` (a TrainConfig) with ``lr``, ``block_size`` and ``draft_layers`` left ``None`` filled from its drafter's
    recipe (EAGLE-3 has no block: the DFlash kit recipe's values are kept so that configs compare equal); a setting
    outside :data:`RANGES` is refused first (before any data is read or memory taken)."""
    check_ranges(cfg)
    r = recipe(cfg.drafter, cfg.dflash_recipe)
    block = DFLASH_RECIPES[DFLASH_RECIPE] if r.block_size is None else r
    return replace(cfg, lr=r.lr if cfg.lr is None else cfg.lr,
                   block_size=block.block_size if cfg.block_size is None else cfg.block_size,
                   draft_layers=block.draft_layers if cfg.draft_layers is None else cfg.draft_layers)


def objective(cfg) -> BlockObjective:
    """The DFlash objective of ``cfg``: its recipe's, with ``step_weight`` (the kit's power weights) and any
    ``dflash_weighting``/``dflash_gamma``/``max_anchors`` override the config sets."""
    o = recipe("dflash", cfg.dflash_recipe).objective
    o = replace(o, step_weight=cfg.step_weight)
    if cfg.dflash_weighting is not None:
        o = replace(o, weighting=cfg.dflash_weighting)
    if cfg.dflash_gamma is not None:
        o = replace(o, gamma=cfg.dflash_gamma)
    if cfg.max_anchors is not None:
        o = replace(o, max_anchors=cfg.max_anchors or None)  # 0: every anchor
    return BlockObjective(**{k: getattr(o, k) for k in o.__dataclass_fields__})  # re-validated


def build_drafter(cfg, target_config, embed: torch.Tensor, lm_head: torch.Tensor, vocab, layer_ids: Sequence[int],
                  mask_token: int | None = None):
    """A fresh drafter of ``cfg`` (resolved) and its loss: EAGLE-3 with :class:`TTTLoss`, or DFlash (mask token
    ``mask_token``) with :class:`DFlashLoss` under its recipe, ``lm_head`` frozen where the recipe says so."""
    head = lm_head[vocab.draft_to_target].float()
    if cfg.drafter == "eagle3":
        from kimi_eagle.eagle3.model import Eagle3Drafter

        drafter = Eagle3Drafter.from_target_weights(target_config, embed, lm_head, vocab, layer_ids, seed=cfg.seed)
        return drafter, TTTLoss(drafter, head, cfg.ttt_steps, cfg.step_weight)
    from kimi_eagle.eagle3.dflash import BlockSpec

    return dflash_with_loss(target_config, embed, lm_head, vocab, layer_ids,
                            BlockSpec(cfg.block_size, int(mask_token), cfg.draft_layers), objective(cfg), cfg.seed,
                            recipe("dflash", cfg.dflash_recipe).freeze_lm_head)


def dflash_with_loss(target_config, embed: torch.Tensor, lm_head: torch.Tensor, vocab, layer_ids: Sequence[int], block,
                     objective: BlockObjective = BlockObjective(), seed: int = 0, freeze_lm_head: bool = False):
    """A fresh DFlash drafter (:class:`~kimi_eagle.eagle3.dflash.BlockSpec` ``block``) and its :class:`DFlashLoss`."""
    from kimi_eagle.eagle3.dflash import DFlashDrafter

    if block.block_size < 2 or block.num_draft_layers < 1:
        raise ValueError(f"a DFlash block needs the anchor and at least one mask token (block_size >= 2, got "
                         f"{block.block_size}) and at least one draft layer (got {block.num_draft_layers})")
    drafter = DFlashDrafter.from_target_weights(target_config, embed, lm_head, vocab, layer_ids, block, seed)
    if freeze_lm_head:
        drafter.lm_head.weight.requires_grad_(False)
    return drafter, DFlashLoss(drafter, lm_head[vocab.draft_to_target].float(), objective)


def recipe_table() -> list[dict]:
    """One row per recipe (EAGLE-3 and the DFlash ones): what docs/eagle3.md's table shows."""
    rows = []
    for r in (EAGLE3, *DFLASH_RECIPES.values()):
        o = r.objective
        rows.append({"recipe": r.name, "lr": r.lr, "block_size": r.block_size, "draft_layers": r.draft_layers,
                     "lm_head": "frozen" if r.freeze_lm_head else "trained",
                     "ce": o.ce if o else "soft", "weighting": o.weighting if o else "power",
                     "normalise": o.normalise if o else "per-slot",
                     "anchors": (o.max_anchors or "all") if o else "-", "source": r.source})
    return rows
