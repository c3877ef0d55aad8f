"""``kimi-eagle report DIFF_DIR -o REPORT_DIR``: summary.json, review charts, and report.html."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kimi_eagle.tokenize.tokenizer import Tokenizer

import argparse
import json
from pathlib import Path

from kimi_eagle.apps.cli import add_option
from kimi_eagle.apps.reports.diff_report import DATA_KINDS, write_report
from kimi_eagle.apps.reports.outputs import add_figure_options, refuse_other_report, use_figure_options
from kimi_eagle.data_kinds import settle
from kimi_eagle.diff.run import read_diff
from kimi_eagle.diff.summary import diff_data_kind
from kimi_eagle.io import FileKindRefused
from kimi_eagle.reconstruct.job import output_lock


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("diff_dir", metavar="DIFF_DIR", help="output directory of `kimi-eagle diff`")
    add_option(p, "-o", "--output", aliases=("--out",), dest="out", required=True,
               help="report directory (summary.json, *.png, report.html)")
    p.add_argument("--data", choices=DATA_KINDS, default=None,
                   help="override the data kind the diff's provenance gives (its meta.json's `data`, else simulated "
                        "when it has the expected labels of `kimi-eagle simulate`, toy when its meta names stories260K "
                        "or tiny-kimi, else real); an override never calls such data real")
    p.add_argument("--tokenizer", default=None,
                   help="the diff's tokenizer directory, to show token boundaries in example hunks (default: the "
                        "bundled Kimi tokenizer when the diff was made with it)")
    add_figure_options(p)


def _meta(diff_dir: str | Path) -> dict:
    """The diff folder's ``meta.json`` ({} when it has none or it does not read as an object)."""
    try:
        meta = json.loads((Path(diff_dir) / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _diff_tokenizer(diff_dir: str | Path, tokenizer: str | None) -> "Tokenizer | None":
    """The tokenizer named by ``--tokenizer``, else the bundled Kimi one when the diff's meta.json names it."""
    from kimi_eagle.assets import kimi_dir
    from kimi_eagle.tokenize.tokenizer import load_tokenizer

    if tokenizer:
        return load_tokenizer(tokenizer)
    if str(_meta(diff_dir).get("tokenizer", "")).startswith("kimi:"):
        try:
            return load_tokenizer(kimi_dir())
        except (OSError, ValueError):
            return None
    return None


def run(args: argparse.Namespace) -> int:
    use_figure_options(args)  # every chart this command (or a notebook it runs) writes
    if Path(args.diff_dir).is_file():
        raise FileKindRefused(f"{args.diff_dir}: this is a file; give the folder `kimi-eagle diff -o` wrote")
    refuse_other_report(args.out, "report")
    result = read_diff(args.diff_dir)
    data, note = settle(args.data, *diff_data_kind(result.records, _meta(args.diff_dir)))
    if note:
        print(f"note: {note}")
    with output_lock(Path(args.out)):  # one report per output directory at a time
        summary = write_report(result, args.out, data, _diff_tokenizer(args.diff_dir, args.tokenizer))
    v = summary["verdict"]
    print(f"{summary['data']} data: {summary['n_records']} records; exact {v['exact']}, bpe_split {v['bpe_split']}, semantic {v['semantic']}; "
          f"{len(summary['charts'])} charts -> {Path(args.out) / 'report.html'}")
    return 0
