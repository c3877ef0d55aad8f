"""``make demo``: execute every notebook, in order, on the bundled data into ``runs/demo/``,
then tiny-kimi (a small model over Kimi token IDs, ``kimi-eagle tiny-kimi --collect``) served and collected
into ``runs/demo/tiny_kimi/`` for the grid's real Kimi-format run, then every grid in ``notebooks/grids/`` with
``kimi-eagle batch`` into ``runs/demo/batch/<grid>/``.

What does not change between runs is cached: the tiny-kimi model under ``--cache`` (``runs/cache/tiny_kimi/<key>/``,
keyed by its spec, training-data SHA-256 and code version), so a second ``make demo`` does not train it again. Every
step prints a heartbeat line at least every :data:`HEARTBEAT_S` seconds while it runs."""
from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kimi_eagle.apps.batch.notebooks import NOTEBOOK_DIR, execute, notebook_runs
from kimi_eagle.apps.cli import POSITIVE_INT, add_option


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_option(p, "-o", "--output", aliases=("--out",), dest="out", default="runs/demo", help="output directory")
    p.add_argument("--batch-workers", type=POSITIVE_INT, default=2, help="parallel runs for the notebooks/grids batches")
    p.add_argument("--cache", default="runs/cache", help="cache of what does not change between runs (the tiny-kimi model)")


HEARTBEAT_S = 10.0  # the longest a demo step stays silent


@contextmanager
def heartbeat(what: str, every: float = HEARTBEAT_S) -> Iterator[None]:
    """Print ``[demo] <what>: still running, <N>s`` every ``every`` seconds until the block ends."""
    began = time.perf_counter()
    done = threading.Event()

    def beat() -> None:
        while not done.wait(every):
            print(f"[demo] {what}: still running, {time.perf_counter() - began:.0f}s", flush=True)

    thread = threading.Thread(target=beat, name="demo-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    began = time.perf_counter()
    for notebook, params in notebook_runs("demo"):
        start = time.perf_counter()
        print(f"[demo] {notebook.name} ...", flush=True)
        with heartbeat(notebook.name):
            executed = execute(notebook, out / notebook.stem, params, progress=False)
        print(f"[demo] {notebook.name} done in {time.perf_counter() - start:.1f}s -> {executed}", flush=True)
    print(f"[demo] all notebooks executed into {out}/")
    tiny_kimi_status = run_tiny_kimi(out / "tiny_kimi", Path(args.cache) / "tiny_kimi")
    status = run_grids(out / "batch", args.batch_workers) or tiny_kimi_status
    print(f"[demo] finished in {(time.perf_counter() - began) / 60:.1f} min. Open first:")
    for page in [*sorted(out.glob("*/*/report.html")), *sorted((out / "batch").glob("*/summary.html"))]:
        print(f"[demo]   {page}")
    return status


def run_tiny_kimi(out: Path, cache: Path, prompts: int = 48) -> int:
    """tiny-kimi from ``cache`` (built there when its spec, data or code changed: :func:`cached_tiny_kimi`), served and
    ``prompts`` glaive prompts collected into ``out`` (``responses.jsonl``, ``engine.jsonl``); the exit status."""
    from kimi_eagle.apps.tiny_kimi import cached_tiny_kimi, collect_tiny_kimi

    start = time.perf_counter()
    print(f"[demo] tiny-kimi: model from {cache}/ (built when missing) ...", flush=True)
    try:
        with heartbeat("tiny-kimi model"):
            model_dir, manifest, reused = cached_tiny_kimi(cache)
        how = "reused from the cache" if reused else f"built in {manifest['seconds']}s"
        print(f"[demo] tiny-kimi model {how}: {model_dir} ({time.perf_counter() - start:.1f}s)", flush=True)
        print(f"[demo] tiny-kimi: serve + collect {prompts} glaive prompts ...", flush=True)
        with heartbeat("tiny-kimi collect"):
            result = collect_tiny_kimi(model_dir, out, prompts)
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"[demo] tiny-kimi failed: {type(exc).__name__}: {exc}", flush=True)
        return 1
    print(f"[demo] tiny-kimi done in {time.perf_counter() - start:.1f}s: {result['responses_ok']}/{result['prompts']} "
          f"responses, {result['engine_records']} engine records -> {out}", flush=True)
    return 0 if result["engine_records"] else 3


def run_grids(out: Path, workers: int) -> int:
    """Every shipped grid through ``kimi-eagle batch``; non-zero when a run fails."""
    from kimi_eagle.apps.batch.grid import load_grid
    from kimi_eagle.apps.batch.run import run_batch

    failed = 0
    for path in sorted((NOTEBOOK_DIR / "grids").glob("*.yaml")):
        grid = load_grid(path)
        start = time.perf_counter()
        print(f"[demo] batch {path.name}: {grid.notebook.name} x {len(grid.runs)} runs ...", flush=True)
        with heartbeat(f"batch {path.name}"):
            result = run_batch(grid.notebook, grid, out / path.stem, workers=workers, progress=True)
        failed += len(result.failed)
        print(f"[demo] batch {path.name} done in {time.perf_counter() - start:.1f}s, {len(result.failed)} failed "
              f"-> {result.run_dir / 'summary.html'}", flush=True)
    return 1 if failed else 0
