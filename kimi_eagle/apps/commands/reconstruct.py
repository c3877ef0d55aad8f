"""``kimi-eagle reconstruct``: API records (JSONL) -> token IDs, one parquet row per input record."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kimi_eagle.apps.cli import POSITIVE_INT, add_option, serving_argument
from kimi_eagle.assets import kimi_dir
from kimi_eagle.chat.completion import TOOL_ID_POLICIES
from kimi_eagle.chat.formats import RECORD_FORMATS, TOOL_DECLARATIONS
from kimi_eagle.io import check_jsonl
from kimi_eagle.reconstruct.job import JobOptions, NothingToProcess, reconstruct_file
from kimi_eagle.reconstruct.record import serving_options
from kimi_eagle.records import EXIT_NOTHING_PROCESSED, exit_status
from kimi_eagle.serving.profiles import get_profile


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", metavar="INPUT", help="API records (JSONL, one object per line; the shapes `kimi-eagle convert "
                   "--help` lists for --from openai are read too)")
    p.add_argument("-o", "--output", required=True, help="output parquet")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer directory (Kimi or HF; default: the Kimi tokenizer in the assets)")
    p.add_argument("--format", default="auto", choices=RECORD_FORMATS,
                   help="chat format (default auto: each record's from the model it names, kimi-k2-0905 -> "
                        "kimi-k2-instruct, kimi-k2.5 -> kimi-k2.5, ...; kimi-k2.5 for a model not known, flag "
                        "format_assumed)")
    add_option(p, "--serving", type=serving_argument("auto"), metavar="PROFILE|PATH.toml|auto", default=None,
               help="what the provider's server did around the template (docs/reconstruct.md, 'Serving profiles'): "
                    "template (the jinja alone), moonshot (Moonshot's tokenizer: sorted TS tools), vllm, sglang "
                    "(their preprocessing and parsers), auto (per provider and dataset, the profile whose prompt "
                    "counts match the billed usage.prompt_tokens, then completion_tokens; template where a group has no "
                    "such evidence; evidence in OUTPUT.serving.json, written with --serving auto or when a group "
                    "gets another profile than template); the options below override one field each (default auto)")
    p.add_argument("--provider-table", default=None, metavar="PATH|none",
                   help="with --serving auto: the provider table (docs/providers.md) whose explained entry for a record's "
                        "provider, model and month renders its prompt and picks its profile before any group choice "
                        "(default: the shipped kimi_eagle/data/providers.toml; none: not used)")
    p.add_argument("--tool-declaration", choices=TOOL_DECLARATIONS, default=None,
                   help="K2.5 tools as compact JSON (the template default) or TypeScript (Moonshot's tools_ts_str); "
                        "default: the serving profile's")
    p.add_argument("--workers", type=POSITIVE_INT, default=1, help="worker processes (default 1)")
    p.add_argument("--resume", action="store_true", help="keep the finished shards of an interrupted run")
    p.add_argument("--shard-size", type=POSITIVE_INT, default=256, help="records per shard (the unit of resumption)")
    p.add_argument("--omit-think-end-before-tools", action="store_true",
                   help="no </think> before tool calls when a message has tool calls and no content (reasoning or not)")
    p.add_argument("--tool-ids", choices=TOOL_ID_POLICIES, default=None,
                   help="auto: keep ids the model could have written, replace server-made ones with functions.NAME:IDX; "
                        "normalise: always functions.NAME:IDX; keep: the API's ids (default: the profile's, auto)")
    p.add_argument("--keep-tool-ids", action="store_true", help="the same as --tool-ids keep")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


PARQUET_SUFFIXES = ("", ".parquet", ".pq")


def provider_table(args: argparse.Namespace) -> str | None:
    """The provider table ``--serving auto`` uses (its path, checked on load: a bad table is a one-line TableError, a
    ValueError, before anything else is loaded), or None for ``--provider-table none``. A table given under a named
    profile (not ``auto``) is checked all the same and not used: one line on stderr says so, never silently."""
    from kimi_eagle.serving.provider_table import TABLE_PATH, load_table

    if args.provider_table == "none" or (args.provider_table is None and args.serving not in (None, "auto")):
        return None
    path = str(args.provider_table or TABLE_PATH)
    load_table(path)
    if args.serving not in (None, "auto"):
        print(f"kimi-eagle reconstruct: warning: --provider-table {path} is not used: only --serving auto reads it "
              f"(--serving {args.serving} renders every record with that profile)", file=sys.stderr)
        return None
    return path


def auto_serving(args: argparse.Namespace, overrides: dict, tok: Any, table: str | None) -> tuple[Any, str]:
    """``--serving auto``: the provider table's entries first (per record), then each (provider, dataset)'s profile
    (kimi_eagle.reconstruct.prepass.auto_serving_options); the evidence goes to OUTPUT.serving.json, one line
    per entry and group to the screen; the options carry both. ``tok``: the run's one loaded tokenizer; ``table``:
    :func:`provider_table`'s."""
    from kimi_eagle.reconstruct.prepass import auto_serving_options

    options, tool_declaration, lines = auto_serving_options(
        args.input, args.output, tok, args.format, table, overrides, args.keep_tool_ids,
        always_write=args.serving == "auto")
    print("\n".join(lines))
    return options, tool_declaration


def rows_per_serving(path: str) -> dict[str, int]:
    """``{profile: rows}`` of a written reconstruction (its ``serving`` column; error rows not counted), and
    ``provider table`` (rows rendered with a table variant, among them)."""
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=["serving", "serving_variant"])
    values = table.column("serving").to_pylist()
    out = {name: values.count(name) for name in sorted({v for v in values if v is not None})}
    by_table = sum(v is not None for v in table.column("serving_variant").to_pylist())
    return {**out, "of which by the provider table": by_table} if by_table else out


def run(args: argparse.Namespace) -> int:
    if Path(args.output).suffix.lower() not in PARQUET_SUFFIXES:
        raise ValueError(f"output {args.output}: reconstruct writes Parquet; name the file .parquet")
    if Path(args.input).exists():  # a missing input is named by reconstruct_file's own checks
        check_jsonl(args.input)  # a folder, Parquet, gzip, a JSON array: refused before any output
    table = provider_table(args)
    overrides = dict(tool_declaration=args.tool_declaration, tool_ids=args.tool_ids,
                     omit_think_end_before_tools=True if args.omit_think_end_before_tools else None)
    profile = get_profile("template" if args.serving in (None, "auto") else args.serving, **overrides)
    options, tool_declaration = serving_options(profile, keep_tool_ids=args.keep_tool_ids), profile.tool_declaration
    from kimi_eagle.tokenize.tokenizer import load_tokenizer

    tok = load_tokenizer(args.tokenizer or kimi_dir())  # once: the auto pre-pass, the job and its forked workers
    if args.serving in (None, "auto") and Path(args.input).is_file():  # no --serving: auto
        options, tool_declaration = auto_serving(args, overrides, tok, table)
    try:
        job = JobOptions(workers=args.workers, resume=args.resume, completion=options, shard_size=args.shard_size,
                         progress=not args.no_progress, tool_declaration=tool_declaration)
        counts = reconstruct_file(args.input, args.output, args.tokenizer or kimi_dir(), args.format, job, tok)
    except NothingToProcess as e:
        print(f"kimi-eagle reconstruct: nothing to process: {e}", file=sys.stderr)
        return EXIT_NOTHING_PROCESSED
    total = sum(counts.values())
    print(f"{args.output}: {total} rows, " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    print(f"{args.output}: rows per serving profile: "
          + (", ".join(f"{k} {v}" for k, v in rows_per_serving(args.output).items()) or "none"))
    return exit_status(counts, counts.errors)

