"""``kimi-eagle train``: train an EAGLE-3 drafter (training-time test) or a DFlash block drafter (``--dflash-recipe``)
on extracted hidden states; defaults per drafter and recipe come from :mod:`kimi_eagle.eagle3.recipes`."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

import torch

from kimi_eagle.apps.cli import (
    NONNEG_FLOAT,
    NONNEG_INT,
    POSITIVE_FLOAT,
    POSITIVE_INT,
    Number,
    add_main_input,
    add_option,
)
from kimi_eagle.apps.reports.outputs import add_figure_options, use_figure_options
from kimi_eagle.apps.reports.training_charts import write_train_curves
from kimi_eagle.eagle3.losses import WEIGHTINGS
from kimi_eagle.eagle3.recipes import DFLASH_RECIPE, DFLASH_RECIPES, EAGLE3, RANGES
from kimi_eagle.eagle3.train import TrainConfig, train_drafter
from kimi_eagle.reconstruct.job import output_lock
from kimi_eagle.reuse import note_training, reused_line


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = TrainConfig("", "", "")
    add_main_input(p, "data", alias="--data",
                   help="hidden-state directory from `kimi-eagle extract` (with --online: the rows, as for extract)")
    p.add_argument("--online", action="store_true", help="run the target in each step instead of reading stored hidden states")
    p.add_argument("--layers", help="with --online: comma-separated aux block-output ids (default: EAGLE-3's low/mid/high)")
    p.add_argument("--target", required=True, help="HF target model directory")
    add_option(p, "-o", "--output", aliases=("--out",), dest="out", required=True,
               help="output directory (drafter/, checkpoint/)")
    p.add_argument("--steps", type=_ranged("steps"), default=d.steps, help="optimizer steps (at most 10,000,000)")
    p.add_argument("--ttt-steps", type=POSITIVE_INT, default=d.ttt_steps)
    p.add_argument("--drafter", choices=("eagle3", "dflash"), default=d.drafter,
                   help="eagle3 (a chain drafter) or dflash (a block drafter; extract its layer set with "
                        "`extract --drafter dflash`; docs/eagle3.md)")
    recipes = "; ".join(f"{r.name}: lr {r.lr:g}, block {r.block_size}, {r.draft_layers} draft layer(s), "
                        f"{r.objective.ce} CE, {r.objective.weighting} weights, {r.objective.normalise} mean, "
                        f"anchors {r.objective.max_anchors or 'all'}, lm_head {'frozen' if r.freeze_lm_head else 'trained'}"
                        for r in DFLASH_RECIPES.values())
    p.add_argument("--dflash-recipe", choices=tuple(DFLASH_RECIPES), default=DFLASH_RECIPE,
                   help=f"dflash: whose training recipe sets the defaults below (docs/eagle3.md) — {recipes}")
    p.add_argument("--block-size", type=_ranged("block_size"), default=d.block_size,
                   help="dflash: the anchor plus mask tokens per block, 2 to 64 (default: the recipe's)")
    p.add_argument("--draft-layers", type=_ranged("draft_layers"), default=d.draft_layers,
                   help="dflash: decoder layers of the drafter, 1 to 64 (default: the recipe's)")
    p.add_argument("--dflash-weighting", choices=WEIGHTINGS, default=d.dflash_weighting,
                   help="dflash: slot weights — power (step-weight^(j-1)), exp (exp(-(j-1)/gamma)), dpace (D-PACE, "
                        "hard CE only); default: the recipe's")
    p.add_argument("--dflash-gamma", type=POSITIVE_FLOAT, default=d.dflash_gamma, help="dflash: γ of the exp weights (default 4)")
    p.add_argument("--max-anchors", type=NONNEG_INT, default=d.max_anchors,
                   help="dflash: anchors sampled per step (0: every anchor; default: the recipe's)")
    p.add_argument("--step-weight", type=NONNEG_FLOAT, default=d.step_weight)
    p.add_argument("--batch-size", type=POSITIVE_INT, default=d.batch_size, help="rows per process per step")
    p.add_argument("--lr", type=POSITIVE_FLOAT, default=d.lr,
                   help=f"learning rate (default: the drafter's recipe — eagle3 {EAGLE3.lr:g}, dflash "
                        + ", ".join(f"{r.name} {r.lr:g}" for r in DFLASH_RECIPES.values()) + ")")
    p.add_argument("--draft-vocab-size", type=POSITIVE_INT, default=d.draft_vocab_size)
    p.add_argument("--seed", type=NONNEG_INT, default=d.seed)
    p.add_argument("--save-every", type=POSITIVE_INT, default=d.save_every)
    p.add_argument("--log-every", type=POSITIVE_INT, default=d.log_every)
    start = p.add_mutually_exclusive_group()
    start.add_argument("--resume", action="store_true", default=None,
                       help="continue OUTPUT's checkpoint; refused when it was trained with other settings or data "
                            "(default: continue it when they are equal, else start fresh in OUTPUT.run2, .run3, ...)")
    start.add_argument("--fresh", dest="resume", action="store_false", help="start fresh in OUTPUT, replacing its run")
    p.add_argument("--stop-after", type=POSITIVE_INT, help="stop after this many steps (checkpointed), e.g. to test resuming")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--threads", type=POSITIVE_INT, default=1, help="torch CPU threads (1 is fastest for small targets on a busy machine)")
    add_figure_options(p)


def _ranged(setting: str) -> Number:
    """The argparse type of a bounded training setting (:data:`kimi_eagle.eagle3.recipes.RANGES`)."""
    low, high = RANGES[setting]
    return Number(int, low, high)


def run(args: argparse.Namespace) -> int:
    use_figure_options(args)  # every chart this command (or a notebook it runs) writes
    torch.set_num_threads(args.threads)
    cfg = TrainConfig(
        data=args.data, target=args.target, out=args.out, steps=args.steps, ttt_steps=args.ttt_steps,
        step_weight=args.step_weight, batch_size=args.batch_size, lr=args.lr, draft_vocab_size=args.draft_vocab_size,
        seed=args.seed, save_every=args.save_every, log_every=args.log_every, resume=args.resume,
        stop_after=args.stop_after, progress=not args.no_progress, online=args.online,
        layer_ids=[int(x) for x in args.layers.split(",")] if args.layers else None,
        drafter=args.drafter, block_size=args.block_size, draft_layers=args.draft_layers,
        dflash_recipe=args.dflash_recipe, dflash_weighting=args.dflash_weighting, dflash_gamma=args.dflash_gamma,
        max_anchors=args.max_anchors,
    )
    rank0 = int(os.environ.get("RANK", "0")) == 0
    with output_lock(Path(args.out)) if rank0 else contextlib.nullcontext():  # one run per OUTPUT (rank 0 holds it)
        summary = train_drafter(cfg)
        if rank0:  # rank 0 draws the curves of the log it wrote
            write_train_curves(summary["out"])
    if rank0:
        reused: dict[str, str] = {}
        note_training(reused, "training", summary)
        print(f"kimi-eagle train: {summary['start']} in {summary['out']}; {reused_line(reused)}"
              + (f" ({summary['start_note']})" if summary["start_note"] else ""), file=sys.stderr)
        print(json.dumps({k: summary[k] for k in ("start", "start_note", "out", "step", "finished", "world_size",
                                                  "train_tokens_per_s")}
                         | {"final": summary.get("final")}))
    return 0
