"""``kimi-eagle evaluate PROMPTS --target DIR --draft DIR [--k 4]``: measured acceptance length."""
from __future__ import annotations

import argparse
import time

import torch

from kimi_eagle.apps.cli import NONNEG_INT, POSITIVE_INT, TEMPERATURES, add_main_input, add_option
from kimi_eagle.eagle3.evaluate import EvaluateOptions, evaluate_drafter, load_prompts
from kimi_eagle.io import write_json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, help="HF target model directory")
    p.add_argument("--draft", help="drafter directory (kimi-eagle train output, an SGLang/vLLM export or a speculators checkpoint); omit for the n-gram baseline only")
    add_main_input(p, "prompts", alias="--prompts", help=".jsonl with prompt / prompt_ids (for a tiny-kimi target "
                   "also messages + tools, rendered in K2.5), one prompt per line, or a hidden-state directory")
    p.add_argument("--k", type=POSITIVE_INT, default=4, help="draft chain length")
    p.add_argument("--max-new-tokens", type=POSITIVE_INT, default=64)
    p.add_argument("--temperatures", type=TEMPERATURES, default="0,1", help="comma-separated; 0 = greedy")
    p.add_argument("--seed", type=NONNEG_INT, default=0)
    p.add_argument("--no-ngram", action="store_true", help="leave out the n-gram (prompt lookup) baseline")
    add_option(p, "-o", "--output", aliases=("--out",), dest="out", help="write the report JSON here as well")
    p.add_argument("--threads", type=POSITIVE_INT, default=1, help="torch CPU threads (1 is fastest for small targets on a busy machine)")


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    prompts = load_prompts(args.prompts, args.target)
    if not prompts:  # issue 48: nothing to measure is named, never a report of zero rounds
        raise ValueError(f"{args.prompts}: no prompts in it (an empty file or folder)")
    t0 = time.perf_counter()
    options = EvaluateOptions(k=args.k, max_new_tokens=args.max_new_tokens, seed=args.seed, ngram=not args.no_ngram,
                              temperatures=tuple(args.temperatures))
    report = evaluate_drafter(args.target, args.draft, prompts, options)
    report["seconds"] = round(time.perf_counter() - t0, 2)
    if args.out:
        write_json(args.out, report, indent=1)
    for name, per in report["methods"].items():
        for mode, e in per.items():
            extra = f"  identical to target greedy: {e['identical_to_target_greedy']}" if "identical_to_target_greedy" in e else ""
            print(f"{name:8s} {mode:7s} tau={e['tau']}  rounds={e['rounds']}  tokens={e['tokens']}{extra}")
    return 0
