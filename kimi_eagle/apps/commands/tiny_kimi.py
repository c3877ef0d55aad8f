"""``kimi-eagle tiny-kimi``: a small Llama-style model over Kimi token IDs, trained on CPU in minutes."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kimi_eagle.apps.cli import NONNEG_FLOAT, NONNEG_INT, POSITIVE_INT
from kimi_eagle.apps.tiny_kimi import DEFAULT_SEED, DEFAULT_STEPS, TinyKimiSpec, build_tiny_kimi, collect_tiny_kimi


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", required=True, help="model directory to write (HF weights, kimi_ids.json, manifest)")
    p.add_argument("--steps", type=POSITIVE_INT, default=DEFAULT_STEPS, help="training steps (about 3 minutes on 2 CPU cores)")
    p.add_argument("--seed", type=NONNEG_INT, default=DEFAULT_SEED, help="seeds the initialisation and the training windows")
    p.add_argument("--sharegpt-conversations", type=NONNEG_INT, default=TinyKimiSpec.sharegpt_conversations,
                   help="ShareGPT conversations to train on (glaive and reason-tool-use are used whole)")
    p.add_argument("--threads", type=POSITIVE_INT, default=TinyKimiSpec.threads, help="torch CPU threads for training")
    p.add_argument("--tokenizer", help="Kimi tokenizer directory (default: the assets)")
    p.add_argument("--reuse", action="store_true", help="keep a model already in -o built with the same spec and data")
    g = p.add_argument_group("collect (serve the model and collect glaive prompts through the API)")
    g.add_argument("--collect", type=POSITIVE_INT, metavar="N", help="collect N glaive prompts (with their tools) after building")
    g.add_argument("--collect-dir", help="where the collection goes (default: OUTPUT/collect)")
    g.add_argument("--max-tokens", type=POSITIVE_INT, default=128)
    g.add_argument("--temperature", type=NONNEG_FLOAT, default=1.0)
    g.add_argument("--max-prompt-tokens", type=POSITIVE_INT, default=384, help="skip glaive turns whose K2.5 prompt is longer")
    g.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def run(args: argparse.Namespace) -> int:
    """Build (or with ``--reuse`` keep) tiny-kimi in ``args.output``; with ``--collect N`` serve it and collect."""
    spec = TinyKimiSpec(steps=args.steps, seed=args.seed, sharegpt_conversations=args.sharegpt_conversations,
                        threads=args.threads)
    manifest = build_tiny_kimi(args.output, spec, args.tokenizer, progress=not args.no_progress, reuse=args.reuse)
    print(f"tiny-kimi: {manifest['n_rows']} rows ({manifest['n_special_rows']} specials), "
          f"{manifest['n_training_tokens']} training tokens, {manifest['steps']} steps, final loss "
          f"{manifest['final_loss']:.3f}, {manifest['seconds']}s -> {args.output}", file=sys.stderr)
    if args.collect:
        collect_dir = args.collect_dir or str(Path(args.output) / "collect")
        result = collect_tiny_kimi(args.output, collect_dir, args.collect, args.max_tokens, args.temperature,
                                   args.seed, args.max_prompt_tokens, progress=not args.no_progress)
        print(f"tiny-kimi: collected {result['responses_ok']}/{result['prompts']} responses, "
              f"{result['engine_records']} engine records paired, {result['seconds']}s -> {collect_dir}",
              file=sys.stderr)
        return 0 if result["engine_records"] else 3
    return 0
