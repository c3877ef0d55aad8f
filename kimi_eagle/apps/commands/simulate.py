"""``kimi-eagle simulate``: a labelled benchmark for the diff, built from real converted conversations."""
from __future__ import annotations

import argparse
from pathlib import Path

from kimi_eagle.apps.cli import NONNEG_INT, POSITIVE_INT, add_option
from kimi_eagle.diff.simulate import (
    DEFAULT_FORMAT,
    DEFAULT_SOURCES,
    load_source_records,
    run_benchmark,
    simulate_samples,
    write_samples,
)
from kimi_eagle.tokenize.tokenizer import load_tokenizer


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_option(p, "-o", "--output", aliases=("--out",), dest="out", required=True,
               help="output directory (api.jsonl, engine.jsonl, labels.parquet)")
    p.add_argument("--source", action="append", default=None,
                   help=f"converted dataset to draw from (repeatable; default {' + '.join(DEFAULT_SOURCES)})")
    p.add_argument("--per-effect", type=POSITIVE_INT, default=10, help="records per effect (default 10)")
    p.add_argument("--seed", type=NONNEG_INT, default=0)
    p.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the Kimi tokenizer in the assets)")
    p.add_argument("--format", default=DEFAULT_FORMAT, help=f"chat format (default {DEFAULT_FORMAT})")
    p.add_argument("--run", action="store_true", help="also reconstruct and diff into OUT/diff (then `kimi-eagle report OUT/diff`)")


def run(args: argparse.Namespace) -> int:
    from kimi_eagle.assets import kimi_dir

    tok_dir = args.tokenizer or kimi_dir()
    tok = load_tokenizer(tok_dir)
    samples = simulate_samples(load_source_records(args.source or DEFAULT_SOURCES), tok, args.format, args.per_effect,
                               args.seed)
    paths = write_samples(samples, args.out)
    counts: dict[str, int] = {}
    for s in samples:
        counts[s.effect] = counts.get(s.effect, 0) + 1
    print(f"{len(samples)} simulated records {counts} -> {paths['api'].parent}")
    if args.run:
        result = run_benchmark(args.out, tok_dir, args.format)
        ok = result.records[result.records["expected"].notna()]
        correct = int((ok["label"] == ok["expected"]).sum())
        print(f"diff: {correct}/{len(ok)} records classified as expected -> {Path(args.out) / 'diff'}")
    return 0
