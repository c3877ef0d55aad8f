"""``kimi-eagle compare RUN_A RUN_B -o OUT``: two diff, report, billing or batch outputs side by side on one page
(``compare.html``, ``compare.md``, ``compare.csv``), each figure's change B − A with its 95 % interval
(:mod:`kimi_eagle.apps.reports.compare_report`)."""
from __future__ import annotations

import argparse
from pathlib import Path

from kimi_eagle.apps.cli import add_option
from kimi_eagle.apps.reports.compare_report import write_compare


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_a", metavar="RUN_A", help="the first output (A): a `kimi-eagle diff`, `report`, `billing` or "
                                                  "`batch` folder, e.g. last week's")
    p.add_argument("run_b", metavar="RUN_B", help="the second output (B) of the same kind, e.g. today's; changes are B − A")
    add_option(p, "-o", "--output", dest="out", required=True,
               help="folder for compare.html, compare.md and compare.csv")


def run(args: argparse.Namespace) -> int:
    facts = write_compare(args.run_a, args.run_b, args.out)
    changed = facts["changed"]
    print(f"{facts['kind']} outputs compared: {facts['figures']} figures, {len(changed)} changed (95 % interval of "
          f"B − A excludes 0){': ' + ', '.join(changed[:5]) + (' …' if len(changed) > 5 else '') if changed else ''} "
          f"-> {Path(args.out) / 'compare.html'} (and compare.md, compare.csv)")
    for warning in facts["warnings"]:  # every warning of the page, on the terminal too
        print(f"⚠ {warning}")
    return 0
