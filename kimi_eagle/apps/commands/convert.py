"""``kimi-eagle convert``: real datasets -> API records, one per assistant turn."""
from __future__ import annotations

import argparse

from kimi_eagle.reconstruct.convert import SOURCES, _convert_file
from kimi_eagle.records import exit_status, positive_int


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", nargs="?", metavar="INPUT", help="dataset file (default: the bundled dataset for --from)")
    p.add_argument("--from", dest="source", required=True, choices=SOURCES)
    p.add_argument("-o", "--output", required=True, help="output JSONL of API records")
    p.add_argument("--limit", type=positive_int, default=None, help="convert only the first N conversations")


def run(args: argparse.Namespace) -> int:
    n, errors = _convert_file(args.source, args.input, args.output, args.limit)
    print(f"{args.output}: {n} API records from {args.source}" + (f", {len(errors)} of them errors" if errors else ""))
    return exit_status({"ok": n - len(errors), "error": len(errors)}, errors)
