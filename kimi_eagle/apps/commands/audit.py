"""``kimi-eagle audit``: does each API provider return what the model itself would produce?"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kimi_eagle.apps.audit.run import AuditOptions, audit, matrix_text
from kimi_eagle.apps.cli import NONNEG_INT, POSITIVE_FLOAT, POSITIVE_INT, add_option, serving_argument
from kimi_eagle.apps.reports.outputs import add_figure_options, use_figure_options
from kimi_eagle.reuse import reused_line


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompts", metavar="PROMPTS", help="prompts JSONL (the collector's format: {id, messages} or {id, prompt})")
    add_option(p, "-o", "--output", aliases=("--out",), dest="out", required=True,
               help="output directory (rerun to resume)")
    p.add_argument("--base-url", required=True, help="e.g. https://openrouter.ai/api/v1 or a local `kimi-eagle serve`")
    p.add_argument("--model", required=True, help="API model name sent with every request (not a directory)")
    p.add_argument("--providers", required=True, help="comma-separated provider names, each pinned with provider.only")
    p.add_argument("--reference", help="engine records (JSONL) of the same prompt ids from the reference engine")
    p.add_argument("--repeats", type=POSITIVE_INT, default=2, help="requests per prompt and provider (default 2)")
    p.add_argument("--seed", type=NONNEG_INT, default=0, help="the fixed seed sent with every request")
    p.add_argument("--max-tokens", type=POSITIVE_INT, default=64, help="max_tokens for prompts that set none (default 64)")
    p.add_argument("--tokenizer", help="tokenizer directory (default: the Kimi tokenizer in the assets)")
    p.add_argument("--format", default="kimi-k2.5", help="reconstruction chat format (default kimi-k2.5; plain for stories260K)")
    p.add_argument("--concurrency", type=POSITIVE_INT, default=4)
    p.add_argument("--max-attempts", type=POSITIVE_INT, default=8)
    p.add_argument("--timeout", type=POSITIVE_FLOAT, default=120.0)
    p.add_argument("--serving", type=serving_argument(), metavar="PROFILE|PATH.toml", default="template",
                   help="serving profile the answers are reconstructed with (kimi_eagle.serving.request)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    add_figure_options(p)


def run(args: argparse.Namespace) -> int:
    use_figure_options(args)  # every chart this command (or a notebook it runs) writes
    providers = [p.strip() for p in args.providers.split(",") if p.strip()]
    options = AuditOptions(args.base_url, args.model, tuple(providers), args.reference, args.repeats, args.seed,
                           args.max_tokens, args.tokenizer, args.format, args.concurrency, args.max_attempts,
                           args.timeout, progress=not args.no_progress, serving=args.serving)
    summary = audit(args.prompts, args.out, options)
    print(matrix_text(summary))
    print(json.dumps({"completions": summary["completions"], "divergence_ranking": summary["divergence_ranking"]},
                     indent=2))
    print(f"charts and page -> {Path(args.out) / 'report.html'}")
    print(f"kimi-eagle audit: {summary['requested']} requests this run; {reused_line(summary['reused'])}")
    if summary["aborted"]:
        print(f"kimi-eagle audit: stopped: {summary['aborted']}", file=sys.stderr)
        return 3
    return 1 if any(c["exhausted"] for c in summary["collect"].values()) else 0
