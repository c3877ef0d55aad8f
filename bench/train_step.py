"""Drafter training throughput at a fixed configuration, and where the time goes.

Extracts hidden states for real text (Alpaca outputs through stories260K), then times, interleaved
and best-of-N over the same batches:

* a full training step (TTT unroll forward, backward, AdamW step) — the baseline;
* the soft targets alone: the target's frozen ``lm_head`` rows of the draft vocabulary over the
  final hidden states, softmax, for every unroll step;
* the kit's DFlash step (issue #36: :mod:`kimi_eagle.eagle3.dflash`, block 8, every anchor with a supervised token,
  forward, backward, AdamW) on the same rows with DFlash's 5 target layers, at each ``--dflash-layers`` draft-layer
  count (1: the kit's default; 5: speculators' ``dflash`` shape).

It prints training tokens/s, the soft targets' share of a step (the drafter takes the rest) and each DFlash step
as a ratio to the EAGLE-3 step measured in the same run (speculators' DFlash beside it: bench/peer_trainer.py).

    python bench/train_step.py [--rows 64] [--batch-size 8] [--ttt-steps 7] [--draft-vocab 256] [--repeats 5]
                               [--dflash-layers 1,5]
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from extract import real_rows  # noqa: E402

from kimi_eagle.assets import stories_dir  # noqa: E402
from kimi_eagle.eagle3 import draft_vocab  # noqa: E402
from kimi_eagle.eagle3.drafter_base import shift_left  # noqa: E402
from kimi_eagle.eagle3.extract import extract  # noqa: E402
from kimi_eagle.eagle3.hidden import load_target  # noqa: E402
from kimi_eagle.eagle3.losses import TTTLoss, soft_targets  # noqa: E402
from kimi_eagle.eagle3.model import Eagle3Drafter  # noqa: E402
from kimi_eagle.eagle3.readers import HiddenStates  # noqa: E402
from kimi_eagle.eagle3.train import collate  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--ttt-steps", type=int, default=7)
    p.add_argument("--draft-vocab", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dflash-layers", default="1,5", help="draft-layer counts of the DFlash steps ('' for none)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model = load_target(stories_dir())
    tmp = Path(tempfile.mkdtemp(prefix="bench_train_"))
    extract(stories_dir(), real_rows(args.rows, args.max_len), tmp, dtype="bf16", model=model)
    data = HiddenStates(tmp)
    counts = draft_vocab.supervised_counts(((r["input_ids"], r["loss_mask"]) for r in data), 512)
    vocab = draft_vocab.build(counts, args.draft_vocab)
    drafter = Eagle3Drafter.from_target(model, vocab, data.layer_ids)
    head = model.lm_head.weight[vocab.draft_to_target].detach().float()
    loss_fn = TTTLoss(drafter, head, args.ttt_steps, 0.8)
    opt = torch.optim.AdamW([q for q in drafter.parameters() if q.requires_grad], lr=1e-3)
    batches = [collate([data[i] for i in range(s, min(s + args.batch_size, len(data)))])
               for s in range(0, len(data), args.batch_size)]
    n_tokens = sum(int(b["input_ids"].numel()) for b in batches)

    def full_steps() -> None:
        for b in batches:
            loss, _ = loss_fn(b["aux"], b["input_ids"], b["loss_mask"], b["final"])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    def soft_only() -> None:
        with torch.no_grad():
            for b in batches:
                for k in range(args.ttt_steps):
                    soft_targets(shift_left(b["final"], 1 + k), head)

    timed = {"step": full_steps, "soft": soft_only,
             **dflash_steps(model, tmp, vocab, args, [int(n) for n in args.dflash_layers.split(",") if n])}
    for fn in timed.values():
        fn()  # warm up
    best = {name: float("inf") for name in timed}
    for _ in range(args.repeats):
        for name, fn in timed.items():  # interleaved: a busy machine slows every contender alike
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    shutil.rmtree(tmp, ignore_errors=True)
    share = best["soft"] / best["step"]
    print(f"{len(data)} rows, {n_tokens:,} padded tokens in {len(batches)} batches of {args.batch_size}; "
          f"TTT {args.ttt_steps} steps, draft vocab {args.draft_vocab}, hidden {model.config.hidden_size}")
    print(f"training step  {best['step'] * 1e3:8.1f} ms  -> {n_tokens / best['step']:,.0f} tokens/s")
    print(f"soft targets   {best['soft'] * 1e3:8.1f} ms  -> share of a step {share:.3f}; drafter {1 - share:.3f}")
    for name in (n for n in best if n.startswith("dflash")):
        print(f"{name:<14} {best[name] * 1e3:8.1f} ms  -> {n_tokens / best[name]:,.0f} tokens/s; "
              f"{best[name] / best['step']:.2f}x the EAGLE-3 step's time")
    return 0


def dflash_steps(model, tmp: Path, vocab, args, draft_layers: list[int]) -> dict:
    """``{"dflash_Nl": step}``: one training pass of the kit's DFlash drafter with ``N`` draft layers over the same
    rows (DFlash's layer set extracted into ``tmp/dflash``), forward + backward + AdamW per batch."""
    from kimi_eagle.eagle3.dflash import BlockSpec
    from kimi_eagle.eagle3.dflash_config import BLOCK_SIZE, mask_token_id
    from kimi_eagle.eagle3.recipes import dflash_with_loss

    if not draft_layers:
        return {}
    extract(stories_dir(), real_rows(args.rows, args.max_len), tmp / "dflash", dtype="bf16", model=model, drafter="dflash")
    data = HiddenStates(tmp / "dflash")
    batches = [collate([data[i] for i in range(s, min(s + args.batch_size, len(data)))])
               for s in range(0, len(data), args.batch_size)]
    embed, lm_head = model.model.embed_tokens.weight.detach(), model.lm_head.weight.detach()
    steps = {}
    for n in draft_layers:
        block = BlockSpec(BLOCK_SIZE, mask_token_id(stories_dir()), n)
        drafter, loss_fn = dflash_with_loss(model.config, embed, lm_head, vocab, data.layer_ids, block, seed=0)
        opt = torch.optim.AdamW([q for q in drafter.parameters() if q.requires_grad], lr=1e-3)

        def step(loss_fn=loss_fn, opt=opt) -> None:
            for b in batches:
                loss, _ = loss_fn(b["aux"], b["input_ids"], b["loss_mask"], b["final"])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()

        steps[f"dflash_{n}l"] = step
    return steps


if __name__ == "__main__":
    raise SystemExit(main())
