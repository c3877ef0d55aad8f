"""``evaluate`` with the KV-cached verifier vs the uncached one (whole prefix re-run each round), same run.

Both evaluate the same drafter (a short-trained one when ``--train-steps`` > 0, else an untrained one —
many rejections, the worst case for cropping) and the n-gram baseline on the same prompts, greedy and at
temperature 1, and must produce identical greedy outputs. Repeats are interleaved and the best of each kept.

    python bench/evaluate_kv.py [--prompts 8] [--max-new-tokens 96] [--k 4] [--repeats 2]
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from kimi_eagle.assets import stories_dir
from kimi_eagle.eagle3 import draft_vocab
from kimi_eagle.eagle3.evaluate import evaluate_drafter
from kimi_eagle.eagle3.hidden import load_target
from kimi_eagle.eagle3.model import Eagle3Drafter
from kimi_eagle.engine.prompts import STORY_OPENERS
from kimi_eagle.tokenize.tokenizer import HFTokenizer


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
    best = {True: float("inf"), False: float("inf")}
    reports = {}
    for _ in range(args.repeats):
        for cached in (False, True):
            t0 = time.perf_counter()
            reports[cached] = evaluate_drafter(target_dir, None, prompts, k=args.k, max_new_tokens=args.max_new_tokens,
                                               model=model, drafter=drafter, cached=cached)
            best[cached] = min(best[cached], time.perf_counter() - t0)
    same = all(reports[True]["methods"][m]["greedy"]["per_prompt_tau"] == reports[False]["methods"][m]["greedy"]["per_prompt_tau"]
               for m in reports[True]["methods"])
    print(json.dumps({
        "prompts": args.prompts, "max_new_tokens": args.max_new_tokens, "k": args.k,
        "uncached_s": round(best[False], 2), "cached_s": round(best[True], 2), "speedup": round(best[False] / best[True], 2),
        "greedy_identical": {m: reports[True]["methods"][m]["greedy"]["identical_to_target_greedy"] for m in reports[True]["methods"]},
        "same_tau_cached_vs_uncached": same,
    }))


if __name__ == "__main__":
    main()
