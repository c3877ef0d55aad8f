"""``kimi-eagle batch``: run one notebook over a grid of parameters with papermill, in parallel, resumably."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kimi_eagle.apps.batch.grid import GridError, load_grid
from kimi_eagle.apps.batch.run import run_batch
from kimi_eagle.apps.cli import POSITIVE_INT, add_option
from kimi_eagle.apps.reports.outputs import add_figure_options, use_figure_options
from kimi_eagle.reuse import note_count, reused_line


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("notebook", nargs="?", metavar="NOTEBOOK", help="the notebook to run (default: the grid's `notebook:` entry)")
    p.add_argument("--grid", required=True, help="GRID.yaml: `fixed` parameters, `sweep` lists and/or explicit `runs`")
    add_option(p, "-o", "--output", aliases=("--out",), dest="out", required=True,
               help="RUN_DIR: one sub-directory per run plus the summary")
    p.add_argument("--workers", type=POSITIVE_INT, default=2, help="runs executed in parallel (default 2)")
    p.add_argument("--resume", action="store_true", help="execute only the runs that are not ok yet")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_figure_options(p)


def run(args: argparse.Namespace) -> int:
    use_figure_options(args)  # every chart this command (or a notebook it runs) writes
    grid = load_grid(args.grid)
    notebook = Path(args.notebook) if args.notebook else grid.notebook
    if notebook is None:
        raise GridError(f"{args.grid}: no NOTEBOOK given and the grid has no `notebook:` entry")
    try:
        result = run_batch(notebook, grid, args.out, workers=args.workers, resume=args.resume,
                           progress=not args.no_progress)
    except KeyboardInterrupt:
        print(f"batch: interrupted; finished runs are kept, `--resume` executes the rest ({args.out})", file=sys.stderr)
        return 130
    n = len(result.executed) + len(result.skipped)
    print(f"batch: {n - len(result.failed)}/{n} runs ok ({len(result.executed)} executed, "
          f"{len(result.skipped)} already ok), {len(result.failed)} failed -> {result.run_dir / 'summary.html'}")
    reused: dict[str, str] = {}
    note_count(reused, "runs", len(result.skipped), n)
    print(f"batch: {reused_line(reused)}")
    for name in result.failed:
        print(f"  failed: {name}: {result.errors.get(name)}", file=sys.stderr)
    return 0 if result.ok else 1
