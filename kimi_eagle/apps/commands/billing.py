"""``kimi-eagle billing``: billing-only validation of a reconstruction, for API users without an engine."""
from __future__ import annotations

import argparse
from pathlib import Path

from kimi_eagle.apps.cli import add_main_input, add_option
from kimi_eagle.apps.reports.billing_report import DATA_LABELS, write_billing
from kimi_eagle.apps.reports.outputs import refuse_other_report
from kimi_eagle.diff.run import read_reconstructed
from kimi_eagle.io import check_parquet
from kimi_eagle.tokenize.tokenizer import load_tokenizer


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_main_input(p, "reconstructed", alias="--reconstructed",
                   help="reconstructed rows (parquet from `kimi-eagle reconstruct`)")
    add_option(p, "-o", "--output", aliases=("--out",), dest="out", required=True,
               help="output directory (billing_records.parquet, summary.json, metrics.json, charts, report.html)")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the Kimi tokenizer in the assets)")
    p.add_argument("--data", choices=DATA_LABELS, default="real", help="label for the charts: real or simulated responses")


def run(args: argparse.Namespace) -> int:
    from kimi_eagle.assets import kimi_dir

    check_parquet(args.reconstructed, "`kimi-eagle reconstruct`")  # a folder, JSONL, gzip: refused by name
    refuse_other_report(args.out, "billing")
    rows = read_reconstructed(args.reconstructed)  # refuse a bad file before loading the tokenizer
    tok = load_tokenizer(args.tokenizer or kimi_dir())
    summary = write_billing(tok, rows, args.out, args.data, {"reconstructed": str(args.reconstructed), "tokenizer": tok.name})
    a = summary["all"]
    gap = "n/a" if a["gap_pct"] is None else f"{a['gap_pct']:+.3f}% (95% CI {a['gap_pct_lo']:+.3f} … {a['gap_pct_hi']:+.3f})"
    print(f"billing-only evidence: {summary['n_records']} records {summary['verdict_class']}; gap {gap} of "
          f"{a['billed_tokens']:,} billed tokens -> {Path(args.out) / 'report.html'}")
    return 0
