"""The rows curve of ``bench/drafters.py`` (issue 45): τ, held-out next-token accuracy and the modelled speedup of
EAGLE-3 and DFlash over 48 / 400 / 1,600 training rows on stories260K. See ``bench/drafters.py``'s docstring."""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from kimi_eagle.eagle3.ablation import bootstrap_tau
from kimi_eagle.io import read_jsonl, write_json, write_jsonl

NAMES = {"eagle3": "EAGLE-3", "dflash": "DFlash", "ngram": "n-gram"}


def wilson(correct: float, n: float, z: float = 1.96) -> tuple[float, float]:
    """Wilson score 95 % interval of a proportion ``correct / n``."""
    if n <= 0:
        return (0.0, 1.0)
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def generations(out: Path, n_train: int, n_eval: int, n_held: int, max_tokens: int) -> dict:
    """The target's own sampled generations (story prompts, temperature 1): training rows, held-out rows (accuracy)
    and held-out prompts (τ: a held-out generation's prompt + its first 8 tokens)."""
    from kimi_eagle.assets import stories_dir
    from kimi_eagle.eagle3.hidden import Row
    from kimi_eagle.engine.local import Engine, SamplingParams
    from kimi_eagle.engine.pairs import generate_pairs
    from kimi_eagle.engine.prompts import story_prompts

    cache = out / f"generations-{n_train + n_held + n_eval}x{max_tokens}.jsonl"  # reused by a rerun (deterministic)
    if cache.exists():
        records = [line.obj for line in read_jsonl(cache)]
    else:
        engine = Engine.from_dir(str(stories_dir()), "plain")
        records, _ = generate_pairs(engine, story_prompts(n_train + n_held + n_eval, 0), SamplingParams(1.0, 1.0, 0, max_tokens))
        write_jsonl(cache, records)
    rows = [Row(r["id"], r["prompt_ids"] + r["output_ids"], [0] * len(r["prompt_ids"]) + [1] * len(r["output_ids"]))
            for r in records[: n_train + n_held]]
    prompts = [(r["id"], r["prompt_ids"] + r["output_ids"][:8]) for r in records[n_train + n_held:]]
    return {"train": rows[:n_train], "held": rows[n_train:], "prompts": prompts}


def held_out_accuracy(drafter, data, target_head: torch.Tensor, k: int) -> list[tuple[float, float]]:
    """Teacher-forced ``(correct, supervised)`` per draft position on held-out rows (the kit objective's statistics:
    EAGLE-3 step j, DFlash slot j + 1; the drafter's argmax against the target's)."""
    from kimi_eagle.eagle3.dflash import DFlashDrafter
    from kimi_eagle.eagle3.losses import DFlashLoss, TTTLoss
    from kimi_eagle.eagle3.train import collate

    head = target_head[drafter.draft_to_target].float()
    loss = DFlashLoss(drafter, head) if isinstance(drafter, DFlashDrafter) else TTTLoss(drafter, head, k, 0.8)
    total = torch.zeros(loss.stat_rows, 3)
    with torch.no_grad():
        for start in range(0, len(data), 16):
            b = collate([data[i] for i in range(start, min(start + 16, len(data)))])
            total += loss(b["aux"], b["input_ids"], b["loss_mask"], b["final"])[1]
    return [(float(c), float(n)) for _, c, n in total]


def timings(model, drafters: dict, k: int, context: list[int], repeats: int = 30) -> dict:
    """Median seconds on this CPU of: the target's cached forward of 1 token and of ``k + 1`` tokens after a
    ``len(context)``-token prefix (verification), and each drafter's round (EAGLE-3: ``k`` chained steps after one new
    committed position; DFlash: one block pass), both with their prefix caches warm."""
    from transformers import DynamicCache

    from kimi_eagle.eagle3.dflash import ContextCache, DFlashDrafter
    from kimi_eagle.eagle3.hidden import Extractor
    from kimi_eagle.eagle3.model import DraftCache

    ids = torch.tensor([context])
    out = {}
    with torch.no_grad():
        for name, n_new in (("target_1", 1), ("verify", k + 1)):
            times = []
            for _ in range(repeats):
                cache = DynamicCache()
                model(ids[:, :-n_new], past_key_values=cache, use_cache=True)
                t = time.perf_counter()
                model(ids[:, -n_new:], past_key_values=cache, use_cache=True)
                times.append(time.perf_counter() - t)
            out[name] = float(np.median(times))
        for name, drafter in drafters.items():
            ex = Extractor(model, drafter.config.aux_layer_ids)
            aux = ex(ids)[0][0].float()
            ex.close()
            n = aux.shape[0] - 1
            times = []
            for _ in range(repeats):
                if isinstance(drafter, DFlashDrafter):
                    cache = ContextCache()
                    drafter.propose(aux[: n - 1], context[n - 1], k, cache=cache)
                    t = time.perf_counter()
                    drafter.propose(aux[:n], context[n], k, cache=cache)
                else:
                    cache = DraftCache()
                    nxt = torch.tensor(context[1:])
                    drafter.propose(aux[: n - 1], nxt[: n - 1], k, cache=cache)
                    t = time.perf_counter()
                    drafter.propose(aux[:n], nxt[:n], k, cache=cache)
                times.append(time.perf_counter() - t)
            out[f"draft_{name}"] = float(np.median(times))
    return out


def train_one(cfg_fields: dict) -> Path:
    from kimi_eagle.eagle3.train import TrainConfig, train_drafter

    summary = train_drafter(TrainConfig(**cfg_fields))
    return Path(summary["out"]) / "drafter"


def curve_rows(args, out: Path, data: dict, model) -> tuple[list[dict], dict]:
    """Train and evaluate every (drafter, rows, seed); returns the table rows and one trained drafter per kind."""
    from kimi_eagle.assets import stories_dir
    from kimi_eagle.eagle3.drafters import load_any_drafter
    from kimi_eagle.eagle3.evaluate import EvaluateOptions, evaluate_drafter
    from kimi_eagle.eagle3.extract import extract
    from kimi_eagle.eagle3.readers import HiddenStates

    target = str(stories_dir())
    table, last = [], {}
    options = EvaluateOptions(k=args.k, max_new_tokens=args.eval_max_new_tokens, temperatures=(0.0,), ngram=False)
    for drafter_kind in ("eagle3", "dflash"):
        held_dir = out / "hidden" / f"held-{drafter_kind}"
        extract(target, data["held"], held_dir, model=model, drafter=drafter_kind, dtype="bf16")
        held = HiddenStates(held_dir)
        for n_rows in args.rows:
            hdir = out / "hidden" / f"rows{n_rows}-{drafter_kind}"
            extract(target, data["train"][:n_rows], hdir, model=model, drafter=drafter_kind, dtype="bf16")
            per_seed = {"acc": [], "rounds": [], "positions": []}
            for seed in args.seeds:
                run = out / "train" / f"{drafter_kind}-rows{n_rows}" / f"seed{seed}"
                eval_path = run.parent / f"eval-seed{seed}.json"
                draft_dir = train_one({"data": str(hdir), "target": target, "out": str(run), "steps": args.steps,
                                       "ttt_steps": args.k, "batch_size": 8, "draft_vocab_size": 256, "seed": seed,
                                       "drafter": drafter_kind, "dflash_recipe": args.dflash_recipe, "progress": False,
                                       "log_every": max(1, args.steps // 10), "save_every": args.steps})
                drafter = load_any_drafter(draft_dir)
                if not eval_path.exists():
                    write_json(eval_path, evaluate_drafter(target, draft_dir, data["prompts"], options, model=model))
                greedy = json.loads(eval_path.read_text())["methods"][drafter_kind]["greedy"]
                per_seed["acc"].append(greedy["per_prompt_accepted"])
                per_seed["rounds"].append(greedy["per_prompt_rounds"])
                per_seed["positions"].append(held_out_accuracy(drafter, held, model.lm_head.weight.detach(), args.k))
                last[drafter_kind] = drafter
            table.append(summarise(drafter_kind, n_rows, per_seed, args))
            print(f"[curve] {NAMES[drafter_kind]} rows {n_rows}: τ {table[-1]['tau']:.3f} {table[-1]['tau_ci95']}, "
                  f"acc {table[-1]['next_token_acc']:.3f}", flush=True)
    return table, last


def summarise(kind: str, n_rows: int, per_seed: dict, args) -> dict:
    boot = bootstrap_tau(np.array(per_seed["acc"]), np.array(per_seed["rounds"]))
    pos = np.array(per_seed["positions"])  # [seeds, positions, (correct, n)]
    c, n = pos[:, 0, 0].sum(), pos[:, 0, 1].sum()
    per_position = (pos[:, :, 0].sum(0) / np.maximum(pos[:, :, 1].sum(0), 1)).tolist()
    return {"drafter": kind, "rows": n_rows, "seeds": list(args.seeds), "n_prompts": int(np.array(per_seed["acc"]).shape[1]),
            "tau": boot["tau"], "tau_ci95": [round(boot["lo"], 3), round(boot["hi"], 3)],
            "next_token_acc": float(c / max(n, 1)), "next_token_acc_ci95": [round(x, 3) for x in wilson(c, n)],
            "held_out_positions": int(n), "acc_per_position": [round(a, 4) for a in per_position]}


def speedups(table: list[dict], t: dict) -> list[dict]:
    """Modelled speedup per round: τ · t(target, 1 token) / (t(draft round) + t(verify)), per table row."""
    rows = []
    for r in table:
        draft = t[f"draft_{r['drafter']}"]
        per_round = draft + t["verify"]
        rows.append({"drafter": r["drafter"], "rows": r["rows"], "tau": r["tau"], "draft_ms": 1e3 * draft,
                     "verify_ms": 1e3 * t["verify"], "target_token_ms": 1e3 * t["target_1"],
                     "speedup": r["tau"] * t["target_1"] / per_round,
                     "speedup_ci95": [round(x * t["target_1"] / per_round, 3) for x in r["tau_ci95"]]})
    return rows


def markdown(table: list[dict], speed: list[dict], args) -> str:
    lines = [f"| drafter | training rows | τ greedy (k = {args.k}) | 95 % CI | held-out next-token acc | 95 % CI (Wilson) |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {NAMES[r['drafter']]} | {r['rows']} | {r['tau']:.3f} | [{r['tau_ci95'][0]:.3f}, {r['tau_ci95'][1]:.3f}] | "
              f"{r['next_token_acc']:.3f} | [{r['next_token_acc_ci95'][0]:.3f}, {r['next_token_acc_ci95'][1]:.3f}] |" for r in table]
    lines += ["", "| drafter | training rows | τ | draft ms / round | verify ms (k + 1 tokens) | target ms / token | "
              "modelled speedup / round (CPU) | 95 % CI |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {NAMES[s['drafter']]} | {s['rows']} | {s['tau']:.3f} | {s['draft_ms']:.2f} | {s['verify_ms']:.2f} | "
              f"{s['target_token_ms']:.2f} | {s['speedup']:.2f}× | [{s['speedup_ci95'][0]:.2f}, {s['speedup_ci95'][1]:.2f}] |"
              for s in speed]
    return "\n".join(lines)


def curve_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description="the rows curve (bench/drafters.py)")
    p.add_argument("--out", default="runs/bench_curve")
    p.add_argument("--rows", default="48,400,1600")
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--k", type=int, default=7, help="drafts per round (EAGLE-3's TTT steps; DFlash's block is k + 1)")
    p.add_argument("--eval-prompts", type=int, default=24)
    p.add_argument("--held-out-rows", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--eval-max-new-tokens", type=int, default=40)
    p.add_argument("--dflash-recipe", default="kit")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    args.rows = [int(x) for x in args.rows.split(",")]
    args.seeds = [int(x) for x in args.seeds.split(",")]
    torch.set_num_threads(args.threads)
    from kimi_eagle.assets import stories_dir
    from kimi_eagle.eagle3.hidden import load_target

    start, out = time.perf_counter(), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = generations(out, max(args.rows), args.eval_prompts, args.held_out_rows, args.max_tokens)
    print(f"[curve] {len(data['train'])} training rows, {len(data['held'])} held-out rows, {len(data['prompts'])} "
          f"held-out prompts in {time.perf_counter() - start:.0f} s", flush=True)
    model = load_target(stories_dir())
    table, drafters = curve_rows(args, out, data, model)
    t = timings(model, drafters, args.k, data["prompts"][0][1] + data["held"][0].input_ids[:48])
    speed = speedups(table, t)
    write_json(out / "curve.json", {"target": "stories260K", "data": "toy", "device": "CPU (1 torch thread)",
                                    "settings": {k: v for k, v in vars(args).items()}, "curve": table, "timings_s": t,
                                    "speedup": speed, "wall_s": round(time.perf_counter() - start, 1)}, indent=1)
    print(markdown(table, speed, args))
    print(f"\nwall {time.perf_counter() - start:.0f} s; {out / 'curve.json'}")
