"""``make demo``: execute every notebook, in order, on the bundled data into ``runs/demo/``,
then tiny-kimi (a small model over Kimi token IDs, ``kimi-eagle tiny-kimi --collect``) served and collected
into ``runs/demo/tiny_kimi/`` for the grid's real Kimi-format run, then every grid in ``notebooks/grids/`` with
``kimi-eagle batch`` into ``runs/demo/batch/<grid>/``."""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from kimi_eagle.apps.batch.notebooks import NOTEBOOK_DIR, execute, notebook_runs
from kimi_eagle.apps.cli import POSITIVE_INT, add_option


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_option(p, "-o", "--output", aliases=("--out",), dest="out", default="runs/demo", help="output directory")
    p.add_argument("--batch-workers", type=POSITIVE_INT, default=2, help="parallel runs for the notebooks/grids batches")


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    began = time.perf_counter()
    for notebook, params in notebook_runs("demo"):
        start = time.perf_counter()
        print(f"[demo] {notebook.name} ...", flush=True)
        executed = execute(notebook, out / notebook.stem, params, progress=False)
        print(f"[demo] {notebook.name} done in {time.perf_counter() - start:.1f}s -> {executed}", flush=True)
    print(f"[demo] all notebooks executed into {out}/")
    tiny_kimi_status = run_tiny_kimi(out / "tiny_kimi")
    status = run_grids(out / "batch", args.batch_workers) or tiny_kimi_status
    print(f"[demo] finished in {(time.perf_counter() - began) / 60:.1f} min. Open first:")
    for page in [*sorted(out.glob("*/*/report.html")), *sorted((out / "batch").glob("*/summary.html"))]:
        print(f"[demo]   {page}")
    return status


def run_tiny_kimi(out: Path, prompts: int = 48) -> int:
    """Build tiny-kimi into ``out/model`` (kept when already built with the same spec and data) and collect ``prompts``
    glaive prompts through its server into ``out`` (``responses.jsonl``, ``engine.jsonl``); the exit status."""
    start = time.perf_counter()
    print(f"[demo] tiny-kimi: build + serve + collect {prompts} glaive prompts ...", flush=True)
    status = subprocess.run([sys.executable, "-m", "kimi_eagle", "tiny-kimi", "-o", str(out / "model"), "--reuse",
                             "--collect", str(prompts), "--collect-dir", str(out), "--no-progress"]).returncode
    print(f"[demo] tiny-kimi done in {time.perf_counter() - start:.1f}s (exit {status}) -> {out}", flush=True)
    return status


def run_grids(out: Path, workers: int) -> int:
    """Every shipped grid through ``kimi-eagle batch``; non-zero when a run fails."""
    from kimi_eagle.apps.batch.grid import load_grid
    from kimi_eagle.apps.batch.run import run_batch

    failed = 0
    for path in sorted((NOTEBOOK_DIR / "grids").glob("*.yaml")):
        grid = load_grid(path)
        start = time.perf_counter()
        print(f"[demo] batch {path.name}: {grid.notebook.name} x {len(grid.runs)} runs ...", flush=True)
        result = run_batch(grid.notebook, grid, out / path.stem, workers=workers, progress=True)
        failed += len(result.failed)
        print(f"[demo] batch {path.name} done in {time.perf_counter() - start:.1f}s, {len(result.failed)} failed "
              f"-> {result.run_dir / 'summary.html'}", flush=True)
    return 1 if failed else 0
