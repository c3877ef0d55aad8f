"""``kimi-eagle reconstruct``: API records (JSONL) -> token IDs, one parquet row per input record."""
from __future__ import annotations

import argparse
import sys

from kimi_eagle.assets import kimi_dir
from kimi_eagle.chat.completion import TOOL_ID_POLICIES
from kimi_eagle.chat.formats import FORMATS, TOOL_DECLARATIONS
from kimi_eagle.reconstruct.job import JobOptions, NothingToProcess, reconstruct_file
from kimi_eagle.reconstruct.record import ReconstructOptions
from kimi_eagle.records import EXIT_NOTHING_PROCESSED, exit_status, positive_int


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", metavar="INPUT", help="API records (JSONL)")
    p.add_argument("-o", "--output", required=True, help="output parquet")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer directory (Kimi or HF; default: the Kimi tokenizer in the assets)")
    p.add_argument("--format", default="kimi-k2.5", choices=FORMATS, help="chat format (default kimi-k2.5)")
    p.add_argument("--tool-declaration", choices=TOOL_DECLARATIONS, default="json",
                   help="K2.5 tools as compact JSON (the template default) or TypeScript (Moonshot's tools_ts_str)")
    p.add_argument("--workers", type=positive_int, default=1, help="worker processes (default 1)")
    p.add_argument("--resume", action="store_true", help="keep the finished shards of an interrupted run")
    p.add_argument("--shard-size", type=positive_int, default=256, help="records per shard (the unit of resumption)")
    p.add_argument("--omit-think-end-before-tools", action="store_true",
                   help="no </think> before tool calls when a message has tool calls and no content (reasoning or not)")
    p.add_argument("--tool-ids", choices=TOOL_ID_POLICIES, default="auto",
                   help="auto: keep ids the model could have written, replace server-made ones with functions.NAME:IDX; "
                        "normalise: always functions.NAME:IDX; keep: the API's ids (default auto)")
    p.add_argument("--keep-tool-ids", action="store_true", help="the same as --tool-ids keep")
    p.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> int:
    options = ReconstructOptions(omit_think_end_before_tools=args.omit_think_end_before_tools,
                                 tool_ids="keep" if args.keep_tool_ids else args.tool_ids)
    try:
        job = JobOptions(workers=args.workers, resume=args.resume, completion=options, shard_size=args.shard_size,
                         progress=not args.no_progress, tool_declaration=args.tool_declaration)
        counts = reconstruct_file(args.input, args.output, args.tokenizer or kimi_dir(), args.format, job)
    except NothingToProcess as e:
        print(f"kimi-eagle reconstruct: nothing to process: {e}", file=sys.stderr)
        return EXIT_NOTHING_PROCESSED
    total = sum(counts.values())
    print(f"{args.output}: {total} rows, " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return exit_status(counts, counts.errors)

