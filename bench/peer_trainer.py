"""The kit's EAGLE-3 trainer side by side with speculators' (the peer) on the same data: training speed and τ.

On stories260K: sample ``--samples`` completions with the local engine (plus ``--eval-prompts`` held out),
reconstruct their IDs from the API text, export the rows for speculators (``export-data --to speculators``:
Arrow rows, ``d2t``/``t2d``) and extract the target's hidden states once per layout from the same rows (kit
shards for ``kimi-eagle train``, ``hs_{row}.safetensors`` for speculators). Then, per seed:

1. the kit: :func:`~kimi_eagle.eagle3.train.train_drafter` (what ``kimi-eagle train`` runs);
2. the peer: speculators' ``Eagle3DraftModel`` with its own initialisation, data path (``ArrowDataset``,
   ``shift_batch``, packing ``CollateFn``), TTT forward and ``kl_div`` loss (:mod:`kimi_eagle.apps.interop.peer`;
   its ``Trainer`` needs a GPU, so a minimal loop drives it),

with the same draft vocabulary, TTT length and step weight, batch size, rows per step (the kit's
``batch_indices`` with the seed), AdamW settings, LR schedule and step count. The peer's drafter and TTT
settings are the runbook's (``configs.RECIPE``, the flags ``speculators.sh`` passes: no extra norms, full
attention, 7 TTT steps, decay 0.8); its attention is ``--peer-attn`` (default ``sdpa``, its fastest on CPU;
flex attention, its GPU default, has no CPU backward), packed like its ``CollateFn`` unless ``--no-pack``.

First a tokens/s table (forward + backward of one step on the same rows): one row and
``--batch-size`` rows (best of 5 after a warm-up), the kit against the peer with ``eager`` and ``sdpa``, packed and unpacked. Then the
training runs: tokens/s (real, unpadded tokens of the same rows, loop time only) for both, the ratio
kit/peer, and step 0's loss at every step on both sides (kit: soft cross-entropy; peer: KL, the same
minus the target's entropy). What the ratio means: CPU time per trained token of these two implementations
at stories260K size; not GPU speed (speculators' flex attention skips masked blocks on a GPU and its fused
losses need Triton; neither runs here). Both drafters are then
evaluated by the kit's ``evaluate_drafter`` on the same held-out prompts (the peer's saved checkpoint loaded
by ``load_drafter`` through :mod:`kimi_eagle.eagle3.speculators_checkpoint`), greedy and at temperature 1;
τ with 95 % two-way bootstrap intervals (seeds × prompts) and the paired difference kit − peer
(:func:`~kimi_eagle.eagle3.ablation.bootstrap_tau`). Prints one JSON summary with the wall time; files under ``--out``.

Block drafters (issue #36, ``--dflash``, on by default): a second table times one step of the kit's DFlash drafter
(:mod:`kimi_eagle.eagle3.dflash`; 1 draft layer, its default, and 5, speculators' shape) against speculators'
``dflash`` and ``dspark`` (the drafters ``speculators_dflash.sh``/``speculators_dspark.sh`` train:
:func:`~kimi_eagle.apps.interop.peer.build_block_model`) on the same rows with DFlash's 5 target layers, each as a
ratio to the kit's EAGLE-3 step measured in the same run (the baseline), contenders interleaved, best of 5.
speculators' fastest CPU setting is ``sdpa`` with ``max_anchors`` = the step's valid anchors; ``eager`` and its
default ``max_anchors`` (512, padded: 4,096 query tokens a step) are shown beside it.

    python bench/peer_trainer.py [--out runs/bench_peer] [--samples 32] [--max-tokens 48] [--steps 20] [--seeds 0,1]
                                 [--eval-prompts 8] [--peer-attn sdpa|eager] [--no-pack] [--scaling] [--no-dflash]
"""
from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from kimi_eagle.apps.interop.configs import BLOCK_HIDDEN_DIR, RECIPE
from kimi_eagle.apps.interop.export_data import export_data
from kimi_eagle.apps.interop.peer import PeerConfig, train_peer
from kimi_eagle.assets import stories_dir
from kimi_eagle.eagle3.ablation import bootstrap_tau
from kimi_eagle.eagle3.evaluate import EvaluateOptions, evaluate_drafter
from kimi_eagle.eagle3.extract import extract
from kimi_eagle.eagle3.hidden import load_rows, load_target
from kimi_eagle.eagle3.layouts import arrow_rows
from kimi_eagle.eagle3.model import load_drafter
from kimi_eagle.eagle3.readers import HiddenStates
from kimi_eagle.eagle3.train import TrainConfig, batch_indices, read_history, train_drafter
from kimi_eagle.engine.local import Engine, SamplingParams
from kimi_eagle.engine.pairs import generate_pairs
from kimi_eagle.engine.prompts import story_prompts
from kimi_eagle.io import write_json, write_jsonl
from kimi_eagle.reconstruct.job import JobOptions, reconstruct_file


def prepare(out: Path, target_dir: str, args, model) -> tuple[Path, Path, list]:
    """Rows, the speculators export, hidden states in both layouts and held-out prompts (reused when present)."""
    recon = out / "recon.parquet"
    held_path = out / "held_out.jsonl"
    if not recon.exists() or not held_path.exists():
        engine = Engine.from_dir(target_dir, "plain")
        engine_records, api_records = generate_pairs(engine, story_prompts(args.samples + args.eval_prompts, 0),
                                                     SamplingParams(1.0, 1.0, 0, args.max_tokens))
        write_jsonl(out / "api.jsonl", api_records[: args.samples])
        reconstruct_file(out / "api.jsonl", recon, target_dir, "plain", JobOptions(progress=False))
        write_jsonl(held_path, [{"id": e["id"], "prompt_ids": e["prompt_ids"] + e["output_ids"][:8]}
                                for e in engine_records[args.samples:]])
    held_out = [(obj["id"], obj["prompt_ids"]) for obj in map(json.loads, held_path.read_text().splitlines())]
    rows, skipped = load_rows(recon)
    kit_dir, spec_dir = out / "hidden-kit", out / "spec"
    if not (kit_dir / "manifest.json").exists():
        extract(target_dir, rows, kit_dir, dtype="bf16", skipped=skipped, model=model)
    if not (spec_dir / "hidden_states" / "manifest.json").exists():
        cfg = model.config
        export_data(recon, "speculators", spec_dir, vocab_size=cfg.vocab_size, draft_vocab_size=args.draft_vocab_size,
                    target=target_dir, n_layers=cfg.num_hidden_layers, hidden_size=cfg.hidden_size)
        extract(target_dir, arrow_rows(spec_dir), spec_dir / "hidden_states", layout="speculators", dtype="bf16",
                rows_source=spec_dir, model=model)
    if args.dflash and not (out / "hidden-kit-dflash" / "manifest.json").exists():  # DFlash's layer set, both layouts
        extract(target_dir, rows, out / "hidden-kit-dflash", dtype="bf16", skipped=skipped, model=model, drafter="dflash")
    if args.dflash and not (spec_dir / BLOCK_HIDDEN_DIR / "manifest.json").exists():
        extract(target_dir, arrow_rows(spec_dir), spec_dir / BLOCK_HIDDEN_DIR, layout="speculators", dtype="bf16",
                rows_source=spec_dir, model=model, drafter="dflash")
    return kit_dir, spec_dir, held_out


def timed(step, repeats: int) -> float:
    """Best seconds of ``repeats`` calls of ``step`` (a forward returning the loss; backward included), after
    one untimed warm-up call."""
    best = float("inf")
    for k in range(repeats + 1):
        t0 = time.perf_counter()
        loss = step()
        if loss is not None:
            loss.backward()
        if k:
            best = min(best, time.perf_counter() - t0)
    return best


def kit_eagle3_loss(data: HiddenStates, target_dir: str, args):
    """The kit's EAGLE-3 drafter and TTT loss for ``data`` (the runbook's TTT settings), and its draft vocabulary."""
    from types import SimpleNamespace

    from kimi_eagle.eagle3 import draft_vocab
    from kimi_eagle.eagle3.drafter_base import target_tensor
    from kimi_eagle.eagle3.losses import TTTLoss
    from kimi_eagle.eagle3.model import Eagle3Drafter

    counts = draft_vocab.supervised_counts(((r["input_ids"], r["loss_mask"]) for r in data), data.manifest["vocab_size"])
    vocab = draft_vocab.build(counts, args.draft_vocab_size)
    lm_head = target_tensor(target_dir, "lm_head.weight")
    tcfg = SimpleNamespace(**json.loads((Path(target_dir) / "config.json").read_text()))
    drafter = Eagle3Drafter.from_target_weights(tcfg, target_tensor(target_dir, "embed_tokens.weight"), lm_head, vocab,
                                                data.layer_ids)
    return TTTLoss(drafter, lm_head[vocab.draft_to_target].float(), RECIPE.ttt_steps, RECIPE.ttt_step_loss_decay), vocab


def best_of(steps: dict, repeats: int) -> dict[str, float]:
    """Best seconds of each step (a call running forward and backward) over ``repeats`` interleaved rounds, after one
    untimed warm-up round: a busy machine slows every contender alike."""
    best = {name: float("inf") for name in steps}
    for k in range(repeats + 1):
        for name, step in steps.items():
            t0 = time.perf_counter()
            step()
            if k:
                best[name] = min(best[name], time.perf_counter() - t0)
    return best


def block_scaling(kit_dir: Path, spec_dir: Path, target_dir: str, args, repeats: int = 5) -> list[dict]:
    """One step's time of each block drafter on the same rows (1 and ``--batch-size`` rows), as a ratio to the kit's
    EAGLE-3 step on those rows (``x_eagle3``), plus ``kit_dflash_5l_over_peer``: speculators' fastest ``dflash`` time
    over the kit's at the same shape (above 1: the kit is faster)."""
    from kimi_eagle.apps.interop.peer import (
        BlockPeerConfig,
        block_data,
        block_step,
        block_train_settings,
        build_block_model,
    )
    from kimi_eagle.eagle3.dflash import BlockSpec
    from kimi_eagle.eagle3.dflash_config import BLOCK_SIZE, mask_token_id
    from kimi_eagle.eagle3.drafter_base import target_tensor
    from kimi_eagle.eagle3.recipes import dflash_with_loss
    from kimi_eagle.eagle3.train import collate

    data, ddata = HiddenStates(kit_dir), HiddenStates(kit_dir.parent / "hidden-kit-dflash")
    eagle3, vocab = kit_eagle3_loss(data, target_dir, args)
    tcfg = SimpleNamespace(**json.loads((Path(target_dir) / "config.json").read_text()))
    embed, lm_head, mask = target_tensor(target_dir, "embed_tokens.weight"), target_tensor(target_dir, "lm_head.weight"), mask_token_id(target_dir)
    kits = {f"kit_dflash_{n}l": dflash_with_loss(tcfg, embed, lm_head, vocab, ddata.layer_ids, BlockSpec(BLOCK_SIZE, mask, n))[1]
            for n in (1, 5)}
    peers = {}
    for kind, impl, anchors in (("dflash", "sdpa", None), ("dflash", "eager", None), ("dflash", "sdpa", 512), ("dspark", "sdpa", None)):
        cfg = BlockPeerConfig(str(spec_dir), target_dir, kind, args.draft_vocab_size, attn_impl=impl, max_anchors=anchors)
        model = build_block_model(cfg, ddata.layer_ids, mask)
        peers[f"peer_{kind}_{impl}" + ("_512anchors" if anchors else "")] = (cfg, model, block_data(cfg, model), block_train_settings(cfg))
    index = {r.id: k for k, r in enumerate(arrow_rows(spec_dir))}
    out = []
    for n in sorted({1, args.batch_size}):
        rows = list(range(n))
        kb, db = collate([data[i] for i in rows]), collate([ddata[i] for i in rows])
        arrow = [index[ddata.row_ids[i]] for i in rows]
        steps = {"kit_eagle3": lambda: eagle3(kb["aux"], kb["input_ids"], kb["loss_mask"], kb["final"])[0].backward()}
        steps |= {name: (lambda f=f: f(db["aux"], db["input_ids"], db["loss_mask"], db["final"])[0].backward()) for name, f in kits.items()}
        steps |= {name: (lambda p=p: block_step(p[1], p[2], arrow, p[0], p[3])) for name, p in peers.items()}
        best = best_of(steps, repeats)
        tokens = sum(ddata.lengths()[i] for i in rows)
        cfg, model, pdata, settings = peers["peer_dflash_sdpa"]
        row = {"rows": n, "tokens": tokens, "eagle3_ms": round(best["kit_eagle3"] * 1e3, 1),
               "peer_anchors": block_step(model, pdata, arrow, cfg, settings)[2]}
        row |= {f"{name}_ms": round(best[name] * 1e3, 1) for name in best if name != "kit_eagle3"}
        row |= {f"{name}_x_eagle3": round(best[name] / best["kit_eagle3"], 2) for name in best if name != "kit_eagle3"}
        row["kit_dflash_5l_over_peer"] = round(best["peer_dflash_sdpa"] / best["kit_dflash_5l"], 2)
        out.append(row)
    return out


def scaling(kit_dir: Path, spec_dir: Path, target_dir: str, args, repeats: int = 5) -> list[dict]:
    """Training tokens/s (forward + backward of one step, best of ``repeats``) of both trainers on the same rows,
    one row and ``--batch-size`` rows a step. The kit pads rows into ``[B, T]`` and attends within each row; the
    peer (speculators' model, the runbook's drafter) runs with ``eager`` and ``sdpa`` attention, packed (its
    ``CollateFn``: one sequence of ``Σ T`` tokens with document masks) and unpacked (one row at a time)."""
    from types import SimpleNamespace

    from speculators.losses import resolve_loss_config

    from kimi_eagle.apps.interop.peer import PeerData, build_model, peer_step
    from kimi_eagle.eagle3 import draft_vocab
    from kimi_eagle.eagle3.drafter_base import target_tensor
    from kimi_eagle.eagle3.losses import TTTLoss
    from kimi_eagle.eagle3.model import Eagle3Drafter
    from kimi_eagle.eagle3.train import collate

    data = HiddenStates(kit_dir)
    index = {r.id: k for k, r in enumerate(arrow_rows(spec_dir))}
    counts = draft_vocab.supervised_counts(((r["input_ids"], r["loss_mask"]) for r in data), data.manifest["vocab_size"])
    vocab = draft_vocab.build(counts, args.draft_vocab_size)
    lm_head = target_tensor(target_dir, "lm_head.weight")
    tcfg = SimpleNamespace(**json.loads((Path(target_dir) / "config.json").read_text()))
    kit = TTTLoss(Eagle3Drafter.from_target_weights(tcfg, target_tensor(target_dir, "embed_tokens.weight"), lm_head, vocab,
                                                    data.layer_ids), lm_head[vocab.draft_to_target].float(),
                  RECIPE.ttt_steps, RECIPE.ttt_step_loss_decay)
    peers = {}
    for impl in ("eager", "sdpa"):
        cfg = PeerConfig(str(spec_dir), target_dir, "", draft_vocab_size=args.draft_vocab_size, attn_impl=impl)
        peers[impl] = (cfg, build_model(cfg, data.layer_ids))
    peer_data, loss_config = PeerData(spec_dir, peers["sdpa"][1].hidden_size), resolve_loss_config("kl_div", "eager")
    out = []
    for n in sorted({1, args.batch_size}):
        rows = list(range(n))
        kb = collate([data[i] for i in rows])
        arrow = [index[data.row_ids[i]] for i in rows]
        tokens = sum(data.lengths()[i] - 1 for i in rows)  # the tokens both sides train on (the last has no next)
        kit_s = timed(lambda: kit(kb["aux"], kb["input_ids"], kb["loss_mask"], kb["final"])[0], repeats)
        row = {"rows": n, "tokens": tokens, "kit_tokens_per_s": round(tokens / kit_s, 1)}
        for impl, (cfg, model) in peers.items():
            for pack in ((True, False) if n > 1 else (True,)):
                run = PeerConfig(**{**cfg.__dict__, "pack": pack})
                peer_s = timed(lambda: peer_step(model, peer_data, arrow, run, loss_config) and None, repeats)  # backward inside
                name = f"peer_{impl}" + ("" if n == 1 else ("_packed" if pack else "_unpacked"))
                row[f"{name}_tokens_per_s"] = round(tokens / peer_s, 1)
                row[f"kit_over_{name}"] = round(peer_s / kit_s, 2)
        out.append(row)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/bench_peer")
    p.add_argument("--samples", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--eval-prompts", type=int, default=8)
    p.add_argument("--eval-max-new-tokens", type=int, default=32)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--peer-attn", choices=("sdpa", "eager"), default="sdpa", help="the peer's attention in the training runs")
    p.add_argument("--no-pack", action="store_true", help="the peer trains one row at a time instead of packing a step's rows")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--draft-vocab-size", type=int, default=256)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--scaling", action="store_true", help="only the tokens/s table (1 and --batch-size rows, eager/sdpa, packed/unpacked)")
    p.add_argument("--no-dflash", dest="dflash", action="store_false", help="skip the block-drafter table (issue #36)")
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target_dir = str(stories_dir())
    model = load_target(target_dir)
    kit_dir, spec_dir, held_out = prepare(out, target_dir, args, model)
    prep_s = time.perf_counter() - start
    speed_table = scaling(kit_dir, spec_dir, target_dir, args)
    print(json.dumps({"tokens_per_s": speed_table}), flush=True)
    block_table = block_scaling(kit_dir, spec_dir, target_dir, args) if args.dflash else []
    if block_table:
        print(json.dumps({"block_drafters": block_table}), flush=True)
        write_json(out / "block_drafters.json", {"settings": {"batch_size": args.batch_size, "threads": args.threads},
                                                 "table": block_table}, indent=1)
    if args.scaling:
        return

    kit_data = HiddenStates(kit_dir)
    lengths = kit_data.lengths()
    arrow_index = {r.id: k for k, r in enumerate(arrow_rows(spec_dir))}
    seeds = [int(s) for s in args.seeds.split(",")]
    runs: dict[str, list[dict]] = {"kit": [], "peer": []}
    for seed in seeds:
        steps = [batch_indices(len(kit_data), args.batch_size, 1, 0, s, seed) for s in range(args.steps)]
        real_tokens = sum(lengths[i] for b in steps for i in b)
        padded_tokens = sum(len(b) * max(lengths[i] for i in b) for b in steps)
        kit_out = out / "kit" / f"seed{seed}"
        t0 = time.perf_counter()
        summary = train_drafter(TrainConfig(
            data=str(kit_dir), target=target_dir, out=str(kit_out), steps=args.steps, ttt_steps=RECIPE.ttt_steps,
            step_weight=RECIPE.ttt_step_loss_decay, batch_size=args.batch_size, lr=args.lr,
            draft_vocab_size=args.draft_vocab_size, seed=seed, save_every=args.steps, log_every=1, progress=False,
            resume=False))  # fresh each run: it measures speed
        kit_wall = time.perf_counter() - t0
        kit_loop = padded_tokens / summary["train_tokens_per_s"]  # train_drafter counts padded tokens over its loop
        history = read_history(kit_out / "train_log.jsonl")
        peer_out = out / "peer" / f"seed{seed}"
        t0 = time.perf_counter()
        peer = train_peer(PeerConfig(str(spec_dir), target_dir, str(peer_out), steps=args.steps, batch_size=args.batch_size,
                                     lr=args.lr, draft_vocab_size=args.draft_vocab_size, seed=seed,
                                     attn_impl=args.peer_attn, pack=not args.no_pack),
                          kit_data.layer_ids, [[arrow_index[kit_data.row_ids[i]] for i in b] for b in steps])
        peer_wall = time.perf_counter() - t0
        kit_drafter, peer_drafter = load_drafter(kit_out / "drafter"), load_drafter(peer_out / "drafter", target_dir)
        assert torch.equal(kit_drafter.d2t, peer_drafter.d2t), "the two drafters must share the draft vocabulary"
        for name, path, loop, wall, extra in (
                ("kit", kit_out / "drafter", kit_loop, kit_wall,
                 {"final_loss0": history[-1]["loss"], "final_acc0": history[-1]["acc"][0],
                  "loss0_per_step": [round(h["loss"], 4) for h in history]}),
                ("peer", peer_out / "drafter", peer["seconds"], peer_wall,
                 {"final_loss0": round(float(np.mean(peer["losses"][-max(1, args.steps // 10):])), 4),
                  "final_acc0": round(float(np.mean(peer["acc0"][-max(1, args.steps // 10):])), 4),
                  "loss0_per_step": [round(x, 4) for x in peer["losses"]]})):
            t0 = time.perf_counter()
            options = EvaluateOptions(k=args.k, max_new_tokens=args.eval_max_new_tokens, temperatures=(0.0, 1.0), seed=seed,
                                      ngram=False)
            report = evaluate_drafter(target_dir, path, held_out, options, model=model)
            eval_s = time.perf_counter() - t0
            write_json(out / "eval" / name / f"seed{seed}.json", report, indent=1)
            runs[name].append({"seed": seed, "loop_s": round(loop, 2), "wall_s": round(wall, 2), "tokens": real_tokens,
                               "tokens_per_s": round(real_tokens / loop, 1), "eval_s": round(eval_s, 1), **extra,
                               "report": {m: {k: e[k] for k in ("tau", "per_prompt_accepted", "per_prompt_rounds",
                                                                "identical_to_target_greedy") if k in e}
                                          for m, e in report["methods"]["eagle3"].items()}})
        print(json.dumps({"seed": seed, **{n: {k: runs[n][-1][k] for k in ("tokens_per_s", "wall_s", "eval_s", "final_loss0", "final_acc0")}
                                           | {m: e["tau"] for m, e in runs[n][-1]["report"].items()} for n in runs}}), flush=True)

    table = []
    for mode in ("greedy", "t=1"):
        arr = {n: (np.array([r["report"][mode]["per_prompt_accepted"] for r in runs[n]]),
                   np.array([r["report"][mode]["per_prompt_rounds"] for r in runs[n]])) for n in runs}
        kit_stats = bootstrap_tau(*arr["kit"], reference=arr["peer"])  # delta = kit - peer, paired by seed and prompt
        peer_stats = bootstrap_tau(*arr["peer"])
        table.append({"mode": mode, "kit": {k: round(kit_stats[k], 3) for k in ("tau", "lo", "hi")},
                      "peer": {k: round(peer_stats[k], 3) for k in ("tau", "lo", "hi")},
                      "kit_minus_peer": {k: round(kit_stats[k], 3) for k in ("delta", "delta_lo", "delta_hi")}
                      | {"significant": kit_stats["significant"]}})
    speed = {n: round(sum(r["tokens"] for r in runs[n]) / sum(r["loop_s"] for r in runs[n]), 1) for n in runs}
    result = {
        "wall_s": round(time.perf_counter() - start, 1), "prepare_s": round(prep_s, 1),
        "settings": {k: getattr(args, k) for k in ("samples", "max_tokens", "eval_prompts", "eval_max_new_tokens", "steps",
                                                   "batch_size", "lr", "draft_vocab_size", "k", "seeds", "threads",
                                                   "peer_attn", "no_pack")} | {"runbook_flags": " ".join(RECIPE.flags())},
        "tokens_per_s_table": speed_table,
        "train_tokens_per_s": speed, "speed_ratio_kit_over_peer": round(speed["kit"] / speed["peer"], 2),
        # step 0's loss at every step of seed 0: kit soft cross-entropy, peer KL (= CE minus the target's entropy)
        "loss0_per_step_seed0": {n: runs[n][0]["loss0_per_step"] for n in runs},
        # step 0 of the last tenth of training: kit soft cross-entropy, peer KL (= CE minus the target's entropy)
        "final_loss0": {n: [r["final_loss0"] for r in runs[n]] for n in runs},
        "final_acc0": {n: [r["final_acc0"] for r in runs[n]] for n in runs},
        "greedy_identical": {n: [r["report"]["greedy"]["identical_to_target_greedy"] for r in runs[n]] for n in runs},
        "tau": table,
    }
    write_json(out / "peer_trainer.json", {**result, "runs": runs}, indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
