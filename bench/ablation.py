"""The full drafter ablation (notebook 04's experiment at full size), printed as one JSON summary.

7 arms (bf16 / fp8 / online storage; engine / reconstructed / reconstructed + 1, 5, 20 % injected
re-segmentations) × ``--seeds`` training seeds, each drafter trained ``--steps`` steps and evaluated on
``--eval-prompts`` held-out prompts, greedy and at temperature 1; τ with 95 % bootstrap intervals and the
paired difference to ``engine IDs · bf16``. Resumes from ``--out``. The wall time is printed.

    python bench/ablation.py [--out runs/bench_ablation] [--samples 96] [--steps 120] [--seeds 0,1,2] [--eval-prompts 16]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from kimi_eagle.apps.reports.training_charts import plot_arms, plot_dose_response
from kimi_eagle.assets import stories_dir
from kimi_eagle.eagle3.ablation import AblationSettings, first_significant_rate, run_ablation
from kimi_eagle.engine.local import Engine, SamplingParams
from kimi_eagle.engine.pairs import generate_pairs
from kimi_eagle.engine.prompts import story_prompts
from kimi_eagle.io import write_jsonl
from kimi_eagle.reconstruct.job import JobOptions, reconstruct_file


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default="runs/bench_ablation")
    p.add_argument("--samples", type=int, default=96)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--eval-prompts", type=int, default=16)
    p.add_argument("--eval-max-new-tokens", type=int, default=48)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--ttt-steps", type=int, default=7)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    out = Path(args.out)
    target_dir = str(stories_dir())
    engine = Engine.from_dir(target_dir, "plain")
    engine_records, api_records = generate_pairs(engine, story_prompts(args.samples + args.eval_prompts, 0),
                                                 SamplingParams(1.0, 1.0, 0, args.max_tokens))
    write_jsonl(out / "engine.jsonl", engine_records[: args.samples])
    write_jsonl(out / "api.jsonl", api_records[: args.samples])
    reconstruct_file(out / "api.jsonl", out / "recon.parquet", target_dir, "plain", JobOptions(progress=False))
    held_out = [(e["id"], e["prompt_ids"] + e["output_ids"][:8]) for e in engine_records[args.samples:]]
    settings = AblationSettings(seeds=tuple(int(s) for s in args.seeds.split(",")), steps=args.steps, ttt_steps=args.ttt_steps,
                                max_new_tokens=args.eval_max_new_tokens, progress=True)
    result = run_ablation(target_dir, {"engine": out / "engine.jsonl", "recon": out / "recon.parquet"}, held_out, out,
                          settings=settings)
    plot_arms(result["table"], path=out / "tau_arms.png")
    plot_dose_response(result["table"], path=out / "tau_dose_response.png")
    print(json.dumps({"wall_s": round(time.perf_counter() - start, 1),
                      "first_significant_injected_rate": {m: first_significant_rate(result["table"], m) for m in ("greedy", "t=1")},
                      "table": [{k: r.get(k) for k in ("arm", "mode", "tau", "lo", "hi", "delta", "delta_lo", "delta_hi", "significant")}
                                for r in result["table"]]}, indent=1))


if __name__ == "__main__":
    main()
