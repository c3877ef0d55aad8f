"""``make demo``: execute every notebook (two at a time, each kernel on one thread) on the bundled data into
``runs/demo/``,
then tiny-kimi (a small model over Kimi token IDs, ``kimi-eagle tiny-kimi --collect``) served and collected
into ``runs/demo/tiny_kimi/`` for the grid's real Kimi-format run, then every grid in ``notebooks/grids/`` with
``kimi-eagle batch`` into ``runs/demo/batch/<grid>/``.

tiny-kimi's model trains in a background process (one thread) while the notebooks run. What does not change between
runs is cached: the tiny-kimi model under ``--cache`` (``runs/cache/tiny_kimi/<key>/``,
keyed by its spec, training-data SHA-256 and code version), so a second ``make demo`` does not train it again. Every
step prints a heartbeat line at least every :data:`HEARTBEAT_S` seconds while it runs."""
from __future__ import annotations

import argparse
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from pathlib import Path

from kimi_eagle.apps.batch.grid import Grid, Run
from kimi_eagle.apps.batch.notebooks import NOTEBOOK_DIR, execute, notebook_runs
from kimi_eagle.apps.cli import POSITIVE_INT, add_option


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_option(p, "-o", "--output", aliases=("--out",), dest="out", default="runs/demo", help="output directory")
    p.add_argument("--batch-workers", type=POSITIVE_INT, default=2, help="parallel runs for the notebooks/grids batches")
    p.add_argument("--cache", default="runs/cache", help="cache of what does not change between runs (the tiny-kimi model)")


HEARTBEAT_S = 10.0  # the longest a demo step stays silent


@contextmanager
def heartbeat(what: str | Callable[[], str], every: float = HEARTBEAT_S) -> Iterator[None]:
    """Print ``[demo] <what>: still running, <N>s`` every ``every`` seconds until the block ends (``what`` may be a
    callable, asked at each beat)."""
    began = time.perf_counter()
    done = threading.Event()

    def beat() -> None:
        while not done.wait(every):
            print(f"[demo] {what() if callable(what) else what}: still running, {time.perf_counter() - began:.0f}s",
                  flush=True)

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
    from kimi_eagle.apps.tiny_kimi import cached_tiny_kimi

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as background:
        # tiny-kimi trains on one thread in its own process while the notebooks run
        model = background.submit(cached_tiny_kimi, Path(args.cache) / "tiny_kimi")
        print(f"[demo] tiny-kimi model: from {Path(args.cache) / 'tiny_kimi'}/, built in the background when missing",
              flush=True)
        failed = run_notebooks(out, args.batch_workers)
        tiny_kimi_status = run_tiny_kimi(out / "tiny_kimi", model)
    status = run_grids(out / "batch", args.batch_workers, demo_out=out) or tiny_kimi_status or (1 if failed else 0)
    print(f"[demo] finished in {(time.perf_counter() - began) / 60:.1f} min"
          f"{', failed: ' + ', '.join(failed) if failed else ''}. Open first:")
    for page in [*sorted(out.glob("*/*/report.html")), *sorted((out / "batch").glob("*/summary.html"))]:
        print(f"[demo]   {page}")
    return status


KERNEL_THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # the notebooks' kernels: one thread each, like tiny-kimi


def _execute_notebook(notebook: Path, out_dir: Path, params: dict) -> tuple[str, str, float]:
    """Run one notebook in a demo worker process: ``("ok", executed path, seconds)`` or ``("failed", one-line
    reason, seconds)``."""
    os.environ.update(KERNEL_THREADS)  # inherited by the kernel papermill starts
    print(f"[demo] {notebook.name} started", flush=True)
    start = time.perf_counter()
    try:
        return "ok", str(execute(notebook, out_dir, params, progress=False)), time.perf_counter() - start
    except Exception as exc:  # noqa: BLE001 - a failed notebook is reported by name; the other notebooks go on
        lines = str(exc).strip().splitlines()
        return "failed", f"{type(exc).__name__}: {lines[-1] if lines else ''}", time.perf_counter() - start


def run_notebooks(out: Path, workers: int) -> list[str]:
    """Every notebook of ``notebooks/runs.yaml`` into ``out/<stem>/``, ``workers`` at a time (each kernel on one
    thread; the notebooks do not read each other's outputs); the names of those that failed."""
    pending: dict[Future, str] = {}
    failed: list[str] = []
    label = lambda: f"notebooks ({len(pending)} not finished)"  # noqa: E731
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool, heartbeat(label):
        for notebook, params in notebook_runs("demo"):
            pending[pool.submit(_execute_notebook, notebook, out / notebook.stem, params)] = notebook.name
        print(f"[demo] {len(pending)} notebooks queued, {workers} at a time", flush=True)
        for job in as_completed(list(pending)):
            name = pending.pop(job)
            status, detail, seconds = job.result()
            if status != "ok":
                failed.append(name)
            print(f"[demo] {name} {'done' if status == 'ok' else 'FAILED'} in {seconds:.1f}s -> {detail}", flush=True)
    print(f"[demo] {'all notebooks executed' if not failed else f'{len(failed)} notebook(s) failed'} into {out}/")
    return failed


def run_tiny_kimi(out: Path, model: Future, prompts: int = 48) -> int:
    """Wait for the tiny-kimi ``model`` (built beside the notebooks when its spec, data or code changed), serve it and
    collect ``prompts`` glaive prompts into ``out`` (``responses.jsonl``, ``engine.jsonl``); the exit status."""
    from kimi_eagle.apps.tiny_kimi import collect_tiny_kimi

    start = time.perf_counter()
    try:
        with heartbeat("tiny-kimi model"):
            model_dir, manifest, reused = model.result()
        how = "reused from the cache" if reused else f"built in {manifest['seconds']}s beside the notebooks"
        print(f"[demo] tiny-kimi model {how}: {model_dir} (waited {time.perf_counter() - start:.1f}s)", flush=True)
        print(f"[demo] tiny-kimi: serve + collect {prompts} glaive prompts ...", flush=True)
        with heartbeat("tiny-kimi collect"):
            result = collect_tiny_kimi(model_dir, out, prompts)
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"[demo] tiny-kimi failed: {type(exc).__name__}: {exc}", flush=True)
        return 1
    print(f"[demo] tiny-kimi done in {time.perf_counter() - start:.1f}s: {result['responses_ok']}/{result['prompts']} "
          f"responses, {result['engine_records']} engine records -> {out}", flush=True)
    return 0 if result["engine_records"] else 3


SHIPPED_DEMO_DIR = "runs/demo/"  # where the shipped grids find the demo's own collections


def demo_grid(grid: Grid, demo_out: Path) -> Grid:
    """``grid`` with every parameter under ``runs/demo/`` pointed at this demo's ``demo_out`` instead, so that
    ``kimi-eagle demo -o ELSEWHERE`` diffs its own fresh collections, never a stale ``runs/demo/`` from an older run.

    >>> g = Grid([Run("r", {"api_path": "runs/demo/00_collect/responses.jsonl", "seed": 0})])
    >>> demo_grid(g, Path("/tmp/d")).runs[0].params
    {'api_path': '/tmp/d/00_collect/responses.jsonl', 'seed': 0}
    """
    def moved(value: object) -> object:
        if isinstance(value, str) and value.startswith(SHIPPED_DEMO_DIR):
            return str(demo_out / value[len(SHIPPED_DEMO_DIR):])
        return value

    runs = [Run(r.name, {k: moved(v) for k, v in r.params.items()}) for r in grid.runs]
    return Grid(runs, grid.notebook)


def run_grids(out: Path, workers: int, demo_out: Path) -> int:
    """Every shipped grid through ``kimi-eagle batch`` on this demo's collections; non-zero when a run fails."""
    from kimi_eagle.apps.batch.grid import load_grid
    from kimi_eagle.apps.batch.run import run_batch

    failed = 0
    for path in sorted((NOTEBOOK_DIR / "grids").glob("*.yaml")):
        grid = demo_grid(load_grid(path), demo_out.resolve())
        start = time.perf_counter()
        print(f"[demo] batch {path.name}: {grid.notebook.name} x {len(grid.runs)} runs ...", flush=True)
        with heartbeat(f"batch {path.name}"):
            result = run_batch(grid.notebook, grid, out / path.stem, workers=workers, progress=True)
        failed += len(result.failed)
        print(f"[demo] batch {path.name} done in {time.perf_counter() - start:.1f}s, {len(result.failed)} failed "
              f"-> {result.run_dir / 'summary.html'}", flush=True)
    return 1 if failed else 0
