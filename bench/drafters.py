"""EAGLE-3 beside DFlash: the rows curve with the modelled speedup (issue 45, the default), or ``--ablation``: the ID
effect and dose-response on the same rows (issue #36).

**The curve** (:func:`curve_main`; stories260K): both drafters (EAGLE-3, and DFlash under ``--dflash-recipe``, defaults
from :mod:`kimi_eagle.eagle3.recipes`) trained for the same ``--steps`` on the first 48 / 400 / 1,600 (``--rows``) of
the target's own sampled generations, ``--seeds`` seeds each; each evaluated on ``--eval-prompts`` held-out prompts
(a held-out generation's prompt + its first 8 tokens) by greedy speculative decoding with ``k`` drafts per round
(τ, two-way bootstrap 95 % interval over seeds × prompts) and by teacher-forced next-token accuracy on held-out rows
(EAGLE-3's step 0, DFlash's slot 1: the drafter's argmax = the target's, Wilson 95 % interval over the pooled
positions). The **modelled speedup** per round, ``τ · t(target, 1 token) / (t(draft) + t(verify k + 1 tokens))``,
uses times measured here on CPU: EAGLE-3 drafts with ``k`` sequential steps, DFlash with one block pass. Writes
``curve.json`` and prints the Markdown tables.

    python bench/drafters.py [--out runs/bench_curve] [--rows 48,400,1600] [--steps 120] [--seeds 0,1] [--eval-prompts 24]

**The ablation** (``--ablation``; issue #36): EAGLE-3 beside DFlash on the same rows: τ with 95 % intervals, the ID
effect, the dose-response.

For one target — stories260K (the default) or a tiny-kimi directory (``--target``; Kimi IDs in K2.5, collected
through the served API) — both drafters are trained on the same rows (engine IDs, reconstructed IDs, reconstructed
IDs with 1 / 5 / 20 % injected re-segmentations), ``--seeds`` seeds each, every drafter evaluated on the same
held-out prompts greedy and at temperature 1 with ``k`` drafts per round (DFlash: a block of ``k + 1``), on the
KV-cached verifier (`kimi_eagle.eagle3.ablation.run_ablation`). Prints three tables (Markdown) and writes
``drafters.json``:

1. τ of each drafter on engine IDs, 95 % two-way bootstrap interval (seeds × prompts), and DFlash / EAGLE-3 (the
   baseline measured in this run);
2. τ(engine IDs) − τ(reconstructed IDs) per drafter, with its paired 95 % interval (positive: reconstruction costs τ);
3. per drafter and dose, τ(recon + dose) − τ(engine IDs) (paired, as the ablation's reference): the first injected
   rate whose interval lies below 0.

The injected rates are simulated drift on toy-model generations: the tables measure the kit's drafters on toy
targets, never Kimi. Resumes from ``--out``.

    python bench/drafters.py --ablation [--target DIR] [--out runs/bench_drafters] [--samples 64] [--steps 150] [--seeds 0,1]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from kimi_eagle.eagle3.ablation import AblationSettings, Arm, dflash_arms, drafter_tables, run_ablation
from kimi_eagle.io import read_jsonl, write_json, write_jsonl

EAGLE_ARMS = (Arm("engine IDs · bf16"), Arm("recon IDs · bf16", ids="recon"),
              Arm("recon + 1% splits", ids="recon", inject_rate=0.01), Arm("recon + 5% splits", ids="recon", inject_rate=0.05),
              Arm("recon + 20% splits", ids="recon", inject_rate=0.20))


def stories_data(out: Path, samples: int, eval_prompts: int, max_tokens: int) -> tuple[str, list]:
    """stories260K: engine generations, their API text reconstructed (`plain`), held-out prompts."""
    from kimi_eagle.assets import stories_dir
    from kimi_eagle.engine.local import Engine, SamplingParams
    from kimi_eagle.engine.pairs import generate_pairs
    from kimi_eagle.engine.prompts import story_prompts
    from kimi_eagle.reconstruct.job import JobOptions, reconstruct_file

    target = str(stories_dir())
    engine = Engine.from_dir(target, "plain")
    records, api = generate_pairs(engine, story_prompts(samples + eval_prompts, 0), SamplingParams(1.0, 1.0, 0, max_tokens))
    write_jsonl(out / "engine.jsonl", records[:samples])
    write_jsonl(out / "api.jsonl", api[:samples])
    reconstruct_file(out / "api.jsonl", out / "recon.parquet", target, "plain", JobOptions(progress=False))
    return target, [(e["id"], e["prompt_ids"] + e["output_ids"][:8]) for e in records[samples:]]


def tiny_kimi_data(target: str, out: Path, samples: int, eval_prompts: int, max_tokens: int) -> tuple[str, list]:
    """tiny-kimi: served and collected through the API (K2.5, glaive prompts with tools), reconstructed
    (`kimi-k2.5`), held-out glaive prompts as model rows."""
    from kimi_eagle.apps.tiny_kimi import collect_tiny_kimi, kimi_prompt_lines
    from kimi_eagle.eagle3.hidden import load_rows
    from kimi_eagle.eagle3.row_space import model_ids, target_id_map
    from kimi_eagle.engine.local import Engine
    from kimi_eagle.reconstruct.job import JobOptions, reconstruct_file

    if not (out / "engine.jsonl").exists():
        collect_tiny_kimi(target, out, samples, max_tokens, 1.0, 0)
    order = {line.obj["id"]: i for i, line in enumerate(read_jsonl(out / "prompts.jsonl"))}
    for name in ("engine.jsonl", "responses.jsonl"):  # prompt order: the same rows every run
        lines = sorted((line.obj for line in read_jsonl(out / name)), key=lambda r: order.get(r.get("id"), len(order)))
        write_jsonl(out / name, lines)
    reconstruct_file(out / "responses.jsonl", out / "recon.parquet", target, "kimi-k2.5", JobOptions(progress=False))
    # the same records on both sides: a record whose reconstruction failed or holds an ID the model has no row for
    # (a canonical re-encoding can merge bytes into a Kimi token it never saw) is dropped from the engine rows too
    usable = {r.id for r in load_rows(out / "recon.parquet", target=target)[0]}
    kept = [line.obj for line in read_jsonl(out / "engine.jsonl") if line.obj.get("id") in usable]
    write_jsonl(out / "engine_same_records.jsonl", kept)
    engine, id_map = Engine.from_dir(target), target_id_map(target)
    held = kimi_prompt_lines(samples + eval_prompts, engine.tok)[samples:]
    return target, [(p["id"], model_ids(engine.prompt_ids(p["messages"], p.get("tools")), id_map)) for p in held]


def _ci(lo: float, hi: float) -> str:
    return f"[{lo:.3f}, {hi:.3f}]"


def markdown(t: dict) -> str:
    names = {"eagle3": "EAGLE-3", "dflash": "DFlash"}
    lines = ["| drafter | mode | k | τ (engine IDs) | 95 % CI | τ / τ(EAGLE-3) |", "|---|---|---|---|---|---|"]
    lines += [f"| {names[r['drafter']]} | {r['mode']} | {r['k']} | {r['tau']:.3f} | {_ci(*r['ci95'])} | {r['tau_over_eagle3']:.3f} |"
              for r in t["tau"]]
    lines += ["", "| drafter | mode | τ(engine IDs) − τ(recon IDs) | 95 % CI (paired) | significant |", "|---|---|---|---|---|"]
    lines += [f"| {names[r['drafter']]} | {r['mode']} | {r['engine_minus_recon']:+.3f} | {_ci(*r['ci95'])} | {r['significant']} |"
              for r in t["engine_minus_recon"]]
    lines += ["", "| drafter | mode | injected re-segmentation | τ | τ(recon + dose) − τ(engine IDs) | 95 % CI (paired) | significant |",
              "|---|---|---|---|---|---|---|"]
    lines += [f"| {names[r['drafter']]} | {r['mode']} | {100 * r['injected_rate']:g} % | {r['tau']:.3f} | {r['dose_minus_engine']:+.3f} | "
              f"{_ci(*r['ci95'])} | {r['significant']} |" for r in t["dose"]]
    lines += ["", "First injected rate that costs τ significantly: " + ", ".join(
        f"{names[k.split()[0]]} {k.split()[1]}: {'none up to 20 %' if v is None else f'{100 * v:g} %'}" for k, v in t["first_significant_rate"].items())]
    return "\n".join(lines)


def ablation_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", help="a tiny-kimi directory (kimi-eagle tiny-kimi); default: stories260K")
    p.add_argument("--out", default="runs/bench_drafters")
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--eval-prompts", type=int, default=12)
    p.add_argument("--eval-max-new-tokens", type=int, default=40)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--lr", type=float, default=None, help="default: each drafter's recipe (kimi_eagle.eagle3.recipes)")
    p.add_argument("--k", type=int, default=7, help="drafts per round: EAGLE-3's chain (and TTT steps), DFlash's block − 1")
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    start, out = time.perf_counter(), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.target:
        target, held_out = tiny_kimi_data(args.target, out, args.samples, args.eval_prompts, args.max_tokens)
    else:
        target, held_out = stories_data(out, args.samples, args.eval_prompts, args.max_tokens)
    settings = AblationSettings(seeds=tuple(int(s) for s in args.seeds.split(",")), steps=args.steps, ttt_steps=args.k, lr=args.lr,
                                batch_size=args.batch_size,
                                k=args.k, block_size=args.k + 1, max_new_tokens=args.eval_max_new_tokens,
                                arms=EAGLE_ARMS + dflash_arms(EAGLE_ARMS), reference=EAGLE_ARMS[0].name, progress=True)
    engine_rows = out / ("engine_same_records.jsonl" if args.target else "engine.jsonl")
    result = run_ablation(target, {"engine": engine_rows, "recon": out / "recon.parquet"}, held_out, out, settings=settings)
    t = drafter_tables(result["table"])
    write_json(out / "drafters.json", {"target": target, "data": "toy", "settings": result["settings"], "training_data": result["data"],
                                       "n_eval_prompts": len(held_out), **t, "wall_s": round(time.perf_counter() - start, 1)}, indent=1)
    print(markdown(t))
    print(f"\nwall {time.perf_counter() - start:.0f} s; {len(settings.seeds)} seeds × {len(held_out)} held-out prompts; {out / 'drafters.json'}")


def main() -> None:
    import sys

    argv = sys.argv[1:]
    if "--ablation" in argv:
        ablation_main([a for a in argv if a != "--ablation"])
    else:
        from drafter_curve import curve_main

        curve_main(argv)


if __name__ == "__main__":
    main()
