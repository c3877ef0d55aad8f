"""``evaluate``: KV-cached target + cached drafter vs the uncached reference vs the cached target alone, same run.

Three configurations of :func:`~kimi_eagle.eagle3.evaluate.evaluate_drafter` on the same drafter (an
untrained one — many rejections, the worst case for cropping), the n-gram baseline and the same prompts,
greedy and at temperature 1:

* ``uncached``: target and drafter re-run the whole sequence every round (the reference);
* ``target_cache``: KV-cached target, drafter step 0 still over the whole sequence;
* ``both_cached``: KV-cached target and the drafter's step-0 keys/values cached (the default).

All must give identical greedy outputs (also identical to target-only greedy) and the same τ. Repeats are
interleaved and the best of each kept. ``eagle3_s`` is the EAGLE-3 decoding time alone (greedy + t=1), the
part the drafter cache changes; the total also holds the n-gram runs and the target-only greedy references.

    python bench/evaluate_kv.py [--prompts 8] [--max-new-tokens 96] [--k 4] [--repeats 2]
    python bench/evaluate_kv.py --prompts 2 --max-new-tokens 448   # long sequences (stories260K holds 512)
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from kimi_eagle.assets import stories_dir
from kimi_eagle.eagle3 import draft_vocab
from kimi_eagle.eagle3.evaluate import EvaluateOptions, evaluate_drafter
from kimi_eagle.eagle3.hidden import load_target
from kimi_eagle.eagle3.model import Eagle3Drafter
from kimi_eagle.engine.prompts import STORY_OPENERS
from kimi_eagle.tokenize.tokenizer import HFTokenizer

CONFIGS = {"uncached": (False, False), "target_cache": (True, False), "both_cached": (True, True)}  # (target, drafter)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    target_dir = stories_dir()
    model = load_target(target_dir)
    tok = HFTokenizer.from_dir(target_dir)
    prompts = [(str(i), [1] + tok.encode(STORY_OPENERS[i % len(STORY_OPENERS)])) for i in range(args.prompts)]
    drafter = Eagle3Drafter.from_target(model, draft_vocab.build(torch.arange(512).flip(0), 256), [1, 2, 3], seed=0).eval()
    best = {name: float("inf") for name in CONFIGS}
    best_eagle = {name: float("inf") for name in CONFIGS}
    reports = {}
    for _ in range(args.repeats):
        for name, (cached, cached_drafter) in CONFIGS.items():
            t0 = time.perf_counter()
            options = EvaluateOptions(k=args.k, max_new_tokens=args.max_new_tokens, cached=cached, cached_drafter=cached_drafter)
            reports[name] = evaluate_drafter(target_dir, None, prompts, options, model=model, drafter=drafter)
            best[name] = min(best[name], time.perf_counter() - t0)
            best_eagle[name] = min(best_eagle[name], sum(e["seconds"] for e in reports[name]["methods"]["eagle3"].values()))
    ref = reports["uncached"]["methods"]
    same = {name: all(r["methods"][m][mode]["per_prompt_tau"] == ref[m][mode]["per_prompt_tau"]
                      for m in ref for mode in ref[m]) for name, r in reports.items()}
    print(json.dumps({
        "prompts": args.prompts, "max_new_tokens": args.max_new_tokens, "k": args.k, "repeats": args.repeats,
        "evaluate_s": {name: round(s, 2) for name, s in best.items()},
        "speedup_vs_uncached": {name: round(best["uncached"] / s, 2) for name, s in best.items()},
        "drafter_cache_vs_target_cache": round(best["target_cache"] / best["both_cached"], 2),
        "eagle3_tokens": {name: sum(e["tokens"] for e in r["methods"]["eagle3"].values()) for name, r in reports.items()},
        "eagle3_decode_s": {name: round(s, 2) for name, s in best_eagle.items()},
        "eagle3_decode_speedup_vs_uncached": {name: round(best_eagle["uncached"] / s, 2) for name, s in best_eagle.items()},
        "greedy_identical_to_target_only": {name: {m: r["methods"][m]["greedy"]["identical_to_target_greedy"] for m in r["methods"]}
                                            for name, r in reports.items()},
        "same_per_prompt_tau_as_uncached": same,
    }, indent=1))


if __name__ == "__main__":
    main()
