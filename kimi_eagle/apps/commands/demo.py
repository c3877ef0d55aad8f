"""``make demo``: execute every notebook (two at a time, each kernel on one thread) on the bundled data into
``runs/demo/``,
then tiny-kimi (a small model over Kimi token IDs, ``kimi-eagle tiny-kimi --collect``) served and collected
into ``runs/demo/tiny_kimi/`` for the grid's real Kimi-format run, then every grid in ``notebooks/grids/`` with
``kimi-eagle batch`` into ``runs/demo/batch/<grid>/``.

tiny-kimi's model trains in a background process (one thread) while the notebooks run. What does not change between
runs is cached: the tiny-kimi model under ``--cache`` (``runs/cache/tiny_kimi/<key>/``,
keyed by its spec, training-data SHA-256 and code version), so a second ``make demo`` does not train it again. Every
step prints a heartbeat line naming what still runs at least every :data:`HEARTBEAT_S` seconds.

A rerun into the same output keeps what the notebooks find done (answered requests, extracted hidden states,
checkpoints, evaluations: :mod:`kimi_eagle.reuse`); each notebook says what it reused on screen and in its
``metrics.json``, and the demo's last lines say which steps ran fresh and what the others reused. ``--fresh`` first
removes the earlier outputs (never the tiny-kimi cache). Each executed notebook is rendered to ``NAME.html`` beside
it; the last lines list every page (:func:`demo_pages`, the same as README.md's table)."""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kimi_eagle.apps.batch.grid import Grid, Run
from kimi_eagle.apps.batch.notebooks import NOTEBOOK_DIR, execute, notebook_runs
from kimi_eagle.apps.batch.run import render_html
from kimi_eagle.apps.cli import POSITIVE_INT, add_option
from kimi_eagle.apps.reports.outputs import add_figure_options, use_figure_options
from kimi_eagle.reconstruct.workers import die_with_parent, parent_watch
from kimi_eagle.reuse import reused_line


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_option(p, "-o", "--output", aliases=("--out",), dest="out", default="runs/demo", help="output directory")
    p.add_argument("--batch-workers", type=POSITIVE_INT, default=2, help="parallel runs for the notebooks/grids batches")
    p.add_argument("--cache", default="runs/cache", help="cache of what does not change between runs (the tiny-kimi model)")
    p.add_argument("--fresh", action="store_true",
                   help="redo everything: first remove this demo's earlier outputs under OUTPUT (collections, "
                        "audits, trainings, batches); the tiny-kimi model under --cache is kept")
    add_figure_options(p)


HEARTBEAT_S = 10.0  # the longest a demo step stays silent


def elapsed(seconds: float) -> str:
    """``80.4`` -> ``"1m20s"``, ``7`` -> ``"7s"``."""
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


@contextmanager
def heartbeat(what: str | Callable[[], str], every: float = HEARTBEAT_S) -> Iterator[None]:
    """Print ``[demo] still running: <what> [<elapsed>]`` every ``every`` seconds until the block ends (``what`` may
    be a callable, asked at each beat, naming what runs now)."""
    began = time.perf_counter()
    done = threading.Event()

    def beat() -> None:
        while not done.wait(every):
            print(f"[demo] still running: {what() if callable(what) else what} "
                  f"[{elapsed(time.perf_counter() - began)}]", flush=True)

    thread = threading.Thread(target=beat, name="demo-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def run(args: argparse.Namespace) -> int:
    use_figure_options(args)  # every chart this command (or a notebook it runs) writes
    out = Path(args.out)
    began = time.perf_counter()
    from kimi_eagle.apps.tiny_kimi import cached_tiny_kimi

    if args.fresh:
        removed = clear_outputs(out, Path(args.cache))
        print(f"[demo] --fresh: removed {len(removed)} earlier output folder(s) under {out}/; the tiny-kimi model "
              f"cache {Path(args.cache) / 'tiny_kimi'}/ is kept", flush=True)
    ledger: dict[str, dict[str, str]] = {}  # step -> what it reused ({} : fresh)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=die_with_parent,
                             initargs=parent_watch()) as background:
        # tiny-kimi trains on one thread in its own process while the notebooks run
        model = background.submit(cached_tiny_kimi, Path(args.cache) / "tiny_kimi")
        print(f"[demo] tiny-kimi model: from {Path(args.cache) / 'tiny_kimi'}/, built in the background when missing",
              flush=True)
        failed = run_notebooks(out, args.batch_workers, ledger, background=model)
        tiny_kimi_status = run_tiny_kimi(out / "tiny_kimi", model, ledger)
    status = run_grids(out / "batch", args.batch_workers, demo_out=out, ledger=ledger) or tiny_kimi_status or (1 if failed else 0)
    print(f"[demo] finished in {(time.perf_counter() - began) / 60:.1f} min"
          f"{', failed: ' + ', '.join(failed) if failed else ''}.")
    for line in ledger_lines(ledger):
        print(f"[demo] {line}")
    print("[demo] Open first:")
    for page in demo_pages(out):
        print(f"[demo]   {page}{'' if page.exists() else '  (missing: its step failed)'}")
    return status


REPORT_PAGES = ("02_bpe_diff_inspection/report/report.html", "02_bpe_diff_inspection/billing/report.html",
                "05_provider_audit/audit/report.html")  # the report pages the notebooks write, under the demo's output


def demo_pages(out: Path) -> list[Path]:
    """Every page the demo writes, in the order its last lines list them (and README.md's table): the report
    pages, each grid's batch summary, then each executed notebook rendered to HTML."""
    grids = sorted((NOTEBOOK_DIR / "grids").glob("*.yaml"))
    return ([out / page for page in REPORT_PAGES] + [out / "batch" / g.stem / "summary.html" for g in grids]
            + [out / nb.stem / f"{nb.stem}.html" for nb, _ in notebook_runs("demo")])


def ledger_lines(ledger: dict[str, dict[str, str]]) -> list[str]:
    """The demo's closing account: which steps ran fresh, and what each of the others reused."""
    fresh = [step for step, reused in ledger.items() if not reused]
    lines = [f"fresh: {', '.join(fresh) if fresh else 'nothing'}"]
    kept = {step: reused for step, reused in ledger.items() if reused}
    lines.append("reused: " + ("nothing (every step ran fresh)" if not kept else
                               "; ".join(f"{step} ({reused_line(r)[len('reused: '):]})" for step, r in kept.items())))
    if kept:
        lines.append("(kimi-eagle demo --fresh redoes everything; the tiny-kimi model cache is kept)")
    return lines


def clear_outputs(out: Path, cache: Path) -> list[Path]:
    """``--fresh``: remove what an earlier demo wrote under ``out`` (each notebook's folder, tiny-kimi's collection,
    each grid's batch), never ``cache``; the folders removed. Refused when ``cache`` lies inside one of them."""
    grids = sorted((NOTEBOOK_DIR / "grids").glob("*.yaml"))
    targets = ([out / nb.stem for nb, _ in notebook_runs("demo")] + [out / "tiny_kimi"]
               + [out / "batch" / g.stem for g in grids])
    for target in targets:
        if cache.resolve().is_relative_to(target.resolve()):
            raise ValueError(f"--fresh would remove {target}, which holds the cache {cache}; give another --cache")
    removed = [t for t in targets if t.is_dir()]
    for target in removed:
        shutil.rmtree(target)
    return removed


KERNEL_THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # the notebooks' kernels: one thread each, like tiny-kimi


def _execute_notebook(notebook: Path, out_dir: Path, params: dict, started: Any = None) -> tuple[str, str, float]:
    """Run one notebook in a demo worker process and render it to HTML beside it: ``("ok", executed path,
    seconds)`` or ``("failed", one-line reason, seconds)``. ``started``: a shared mapping told when it starts."""
    os.environ.update(KERNEL_THREADS)  # inherited by the kernel papermill starts
    if started is not None:
        started[notebook.name] = time.time()
    print(f"[demo] {notebook.name} started", flush=True)
    start = time.perf_counter()
    try:
        executed = execute(notebook, out_dir, params, progress=False)
        render_html(executed)
        return "ok", str(executed), time.perf_counter() - start
    except Exception as exc:  # noqa: BLE001 - a failed notebook is reported by name; the other notebooks go on
        partial = out_dir / notebook.name
        if partial.exists():  # papermill writes the partially executed notebook: its page shows the failing cell
            try:
                render_html(partial)
            except Exception:  # noqa: BLE001,S110 - the failure below is what the demo reports
                pass
        lines = str(exc).strip().splitlines()
        return "failed", f"{type(exc).__name__}: {lines[-1] if lines else ''}", time.perf_counter() - start


def running_label(pending: dict[Future, str], started: Any, background: Future | None = None) -> str:
    """What runs now, for the heartbeat: ``notebook 03_eagle3_training (1m20s), ...; 2 notebooks queued``."""
    now = time.time()
    names = list(pending.values())
    running = [f"notebook {name.removesuffix('.ipynb')} ({elapsed(now - started[name])})"
               for name in names if name in started]
    queued = len(names) - len(running)
    parts = [", ".join(running) if running else "notebooks starting"]
    if queued:
        parts.append(f"{queued} notebook(s) queued")
    if background is not None and not background.done():
        parts.append("tiny-kimi model training in the background")
    return "; ".join(parts)


def run_notebooks(out: Path, workers: int, ledger: dict[str, dict[str, str]] | None = None,
                  background: Future | None = None) -> list[str]:
    """Every notebook of ``notebooks/runs.yaml`` into ``out/<stem>/`` (and its HTML page), ``workers`` at a time
    (each kernel on one thread; the notebooks do not read each other's outputs); the names of those that failed.
    ``ledger`` is told what each notebook reused (its ``metrics.json`` ``reused``; none: fresh)."""
    pending: dict[Future, str] = {}
    failed: list[str] = []
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, ProcessPoolExecutor(
            workers, mp_context=context, initializer=die_with_parent, initargs=parent_watch()) as pool:
        started = manager.dict()
        for notebook, params in notebook_runs("demo"):
            pending[pool.submit(_execute_notebook, notebook, out / notebook.stem, params, started)] = notebook.name
        print(f"[demo] {len(pending)} notebooks queued, {workers} at a time", flush=True)
        with heartbeat(lambda: running_label(pending, started, background)):
            for job in as_completed(list(pending)):
                name = pending.pop(job)
                status, detail, seconds = job.result()
                if status != "ok":
                    failed.append(name)
                reused = notebook_reused(out / Path(name).stem)
                if ledger is not None:
                    ledger[f"notebook {Path(name).stem}"] = reused
                print(f"[demo] {name} {'done' if status == 'ok' else 'FAILED'} in {seconds:.1f}s -> {detail}; "
                      f"{reused_line(reused)}", flush=True)
    print(f"[demo] {'all notebooks executed' if not failed else f'{len(failed)} notebook(s) failed'} into {out}/")
    return failed


def notebook_reused(folder: Path) -> dict[str, str]:
    """What a notebook said it reused (its ``metrics.json`` ``reused``; a notebook that keeps nothing says nothing)."""
    try:
        return dict(json.loads((folder / "metrics.json").read_text()).get("reused") or {})
    except (OSError, ValueError, AttributeError):
        return {}


def run_tiny_kimi(out: Path, model: Future, ledger: dict[str, dict[str, str]] | None = None,
                  prompts: int = 48) -> int:
    """Wait for the tiny-kimi ``model`` (built beside the notebooks when its spec, data or code changed), serve it and
    collect ``prompts`` glaive prompts into ``out`` (``responses.jsonl``, ``engine.jsonl``); the exit status."""
    from kimi_eagle.apps.tiny_kimi import collect_tiny_kimi

    start = time.perf_counter()
    try:
        with heartbeat("tiny-kimi model (training in the background)"):
            model_dir, manifest, reused = model.result()
        how = "reused from the cache" if reused else f"built in {manifest['seconds']}s beside the notebooks"
        if ledger is not None:
            ledger["tiny-kimi model"] = {"cache": str(model_dir)} if reused else {}
        print(f"[demo] tiny-kimi model {how}: {model_dir} (waited {time.perf_counter() - start:.1f}s)", flush=True)
        print(f"[demo] tiny-kimi: serve + collect {prompts} glaive prompts ...", flush=True)
        with heartbeat(f"tiny-kimi collect ({prompts} glaive prompts)"):
            result = collect_tiny_kimi(model_dir, out, prompts)
        if ledger is not None:
            ledger["tiny-kimi collect"] = {}  # a collection is one run: always fresh
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


def run_grids(out: Path, workers: int, demo_out: Path, ledger: dict[str, dict[str, str]] | None = None) -> int:
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
        if ledger is not None:
            ledger[f"batch {path.stem}"] = {}  # every run of the grid executes again
        print(f"[demo] batch {path.name} done in {time.perf_counter() - start:.1f}s, {len(result.failed)} failed "
              f"-> {result.run_dir / 'summary.html'}", flush=True)
    return 1 if failed else 0
