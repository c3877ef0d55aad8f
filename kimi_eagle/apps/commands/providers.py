"""``kimi-eagle providers``: per-provider calibration from billed counts: which server-side variant explains each provider.

Reads API records (the kit's shape, e.g. from ``kimi-eagle convert``; each record's ``format``, else the chat
format of its ``response.model``) or, with ``--recorded``, the recorded real exchanges of the assets
(``assets/data/real_api``), searches the declared space of server-side transformations
(kimi_eagle/serving/variants.py) per provider, model and period, and prints the table: the variant chosen,
prompt and completion parity in sample and held out, and the residual of what nothing explains (listed first).
``-o/--write-table PATH`` writes the table as the TOML data file ``--serving auto`` reads
(kimi_eagle/data/providers.toml is this command's output on ``--recorded``).
"""
from __future__ import annotations

import argparse
import sys

from kimi_eagle.apps.cli import add_option


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("log", nargs="?", default=None, metavar="LOG",
                   help="API records (JSONL); omit with --recorded")
    p.add_argument("--recorded", action="store_true",
                   help="calibrate on the assets' recorded real exchanges (assets/data/real_api) instead of LOG")
    add_option(p, "-o", "--output", "--write-table", dest="write_table", default=None,
               help="write the provider table (TOML) to this path (kimi_eagle/data/providers.toml format)")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the Kimi tokenizer in the assets)")


def _log_record(line) -> tuple[dict | None, str | None]:
    """One JSONL line as a calibratable record (its chat format set), or why it is left out."""
    from kimi_eagle.reconstruct.log_shapes import LogShapeError, as_api_record
    from kimi_eagle.reconstruct.recorded import chat_format
    from kimi_eagle.records import RecordError

    if line.error is not None:
        return None, line.error
    try:
        record = as_api_record(line.obj)
    except (LogShapeError, RecordError, ValueError) as e:
        return None, str(e)
    if not isinstance(record, dict) or not isinstance(record.get("request"), dict):
        return None, "not an API record with a request"
    fmt = record.get("format") or chat_format((record.get("response") or {}).get("model"))
    if fmt is None:
        return None, "no known chat format (no format field, response.model not a Kimi model)"
    return {**record, "format": fmt, "id": str(record.get("id", line.lineno))}, None


def _log_records(path: str) -> tuple[list[dict], list[str]]:
    """The usable records of a JSONL log, and one ``line N: reason`` for every line left out."""
    from kimi_eagle.io import read_jsonl

    records, left_out = [], []
    for line in read_jsonl(path):
        record, reason = _log_record(line)
        if record is None:
            left_out.append(reason if reason.startswith("line ") else f"line {line.lineno}: {reason}"[:200])
        else:
            records.append(record)
    return records, left_out


def run(args: argparse.Namespace) -> int:
    from kimi_eagle.assets import kimi_dir
    from kimi_eagle.reconstruct.record import rebuild_under
    from kimi_eagle.reconstruct.recorded import exchange_record, load_exchanges, recorded_path
    from kimi_eagle.serving.calibration import VariantCounts, calibrate, table_text
    from kimi_eagle.serving.provider_table import write_table
    from kimi_eagle.tokenize.tokenizer import load_tokenizer

    if args.recorded == (args.log is not None):
        print("kimi-eagle providers: give either LOG or --recorded", file=sys.stderr)
        return 2
    if args.recorded:
        source = "the recorded exchanges (assets/data/real_api/kimi_recorded_exchanges.jsonl)"
        records, skipped = [exchange_record(ex) for ex in load_exchanges(recorded_path())], 0
        skipped = sum("error" in r for r in records)
    else:
        source = args.log
        records, left_out = _log_records(args.log)
        skipped = len(left_out)
        for reason in left_out[:20]:
            print(f"left out: {reason}", file=sys.stderr)
        if len(left_out) > 20:
            print(f"left out: ... and {len(left_out) - 20} more line(s)", file=sys.stderr)
    tok = load_tokenizer(args.tokenizer or kimi_dir())
    rows = calibrate(records, VariantCounts(tok, rebuild_under))
    print(table_text(rows, skipped))
    if args.write_table:
        print(f"provider table -> {write_table(rows, args.write_table, source)}")
    return 0
