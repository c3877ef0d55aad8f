"""Probe a tokenizer: which special tokens exist, which round-trip, which IDs really stop generation."""
from __future__ import annotations

import argparse
import sys

from kimi_eagle.records import EXIT_NOTHING_PROCESSED, error_table
from kimi_eagle.tokenize.probe import ProbeReport, probe
from kimi_eagle.tokenize.tokenizer import load_tokenizer


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer dir (tiktoken.model or tokenizer.json; default: the Kimi tokenizer in the assets)")
    p.add_argument("--engine-outputs", help="JSONL of engine records with output_ids")
    p.add_argument("--check-ids", default="", help="comma-separated IDs to describe, e.g. 163533,163586")
    p.add_argument("--json", action="store_true", help="print the full report as JSON")


def run(args: argparse.Namespace) -> int:
    from kimi_eagle.assets import kimi_dir

    tok = load_tokenizer(args.tokenizer or kimi_dir())
    ids = [int(x) for x in args.check_ids.split(",") if x.strip()]
    report = probe(tok, args.engine_outputs, ids)
    if args.json:
        print(report.to_json())
        return _engine_exit(report)
    print(f"tokenizer {report.tokenizer.split(':', 1)[-1]} ({report.tokenizer}) — n_vocab {report.n_vocab:,}, "
          f"n_ranks {report.n_ranks:,}")  # not `kimi:kimi:` (#35)
    named = [s for s in report.special_tokens if not s.text.startswith("<|reserved_token_")]
    print(f"{len(named)} named special tokens ({len(report.special_tokens)} slots):")
    for s in named:
        print(f"  {s.id:>7}  {s.text:<32} hf_special={s.hf_special!s:<5} roundtrip={s.roundtrip}")
    print(f"{len(report.marker_like_tokens)} ordinary tokens look like marker fragments, e.g.:")
    for t in report.marker_like_tokens[:10]:
        print(f"  {t.id:>7}  {t.text!r}")
    for note in report.notes:
        print("note:", note)
    if report.engine:
        print(f"engine outputs: {report.engine.n_records} records, {report.engine.n_errors} errors")
        print("  last tokens:", ", ".join(f"{r['id']} {r['text']!r} x{r['count']}" for r in report.engine.last_tokens))
    return _engine_exit(report)


def _engine_exit(report: ProbeReport) -> int:
    """0, or ``EXIT_NOTHING_PROCESSED`` when engine outputs were given and none could be read (the top
    error reasons go to stderr, so that ``--json`` output stays one JSON document)."""
    eng = report.engine
    if eng is None:
        return 0
    if eng.all_errors:
        print(error_table(e.split(": ", 1)[-1] for e in eng.all_errors), file=sys.stderr)
    if eng.n_records == eng.n_errors:
        print(f"no engine record could be read ({eng.n_errors} of {eng.n_records} in error)", file=sys.stderr)
        return EXIT_NOTHING_PROCESSED
    return 0
