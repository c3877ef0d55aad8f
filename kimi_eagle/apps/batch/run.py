"""``kimi-eagle batch``: run one notebook over a grid of parameters with papermill, in parallel, resumably.

    kimi-eagle batch NOTEBOOK --grid GRID.yaml -o RUN_DIR [--workers N] [--resume]

Every run executes into ``RUN_DIR/<run>/`` with that directory passed as ``output_dir``. Its state lives
in ``RUN_DIR/<run>/run.json`` (written atomically): ``running`` while it executes, then ``ok`` or
``failed`` with the error and the failing cell. A failed run never stops the others. ``--resume``
executes only the runs that are not ``ok`` (failed, interrupted, never started, whose parameters changed, or whose
``metrics.json`` no longer reads: not JSON, not an object, NaN or Infinity), so a batch killed at any moment is completed by running it again with ``--resume``.
At the end, ``summary.parquet`` and ``summary.html`` gather every run (see :mod:`kimi_eagle.apps.reports.batch_summary`).
Grid format and validation: :mod:`kimi_eagle.apps.batch.grid`.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing
import os
import shutil
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kimi_eagle.apps.batch.grid import Grid, GridError, Run, load_grid, validate
from kimi_eagle.io import write_json, write_text
from kimi_eagle.reconstruct.workers import die_with_parent, parent_watch


@dataclass
class BatchResult:
    run_dir: Path
    executed: list[str]  # runs executed by this invocation, in completion order
    skipped: list[str]  # runs already ok (with --resume)
    failed: list[str]  # runs whose latest attempt failed
    errors: dict[str, str]  # run -> error, for the failed runs

    @property
    def ok(self) -> bool:
        return not self.failed


def run_batch(notebook: str | Path, grid: Grid | str | Path, run_dir: str | Path, workers: int = 2,
              resume: bool = False, progress: bool = True, cwd: str | Path | None = None) -> BatchResult:
    """Validate every run, then execute the ones due (all, or with ``resume`` those not ok) and summarise.

    Raises :class:`GridError` before anything runs when a parameter is unknown, mistyped or a secret.
    ``cwd`` is the notebooks' working directory (default: the current one), so relative paths in the
    grid mean what they mean on the command line.
    """
    from kimi_eagle.apps.batch.notebooks import parameter_names

    notebook = Path(notebook).resolve()
    if not notebook.is_file():
        raise FileNotFoundError(f"notebook not found: {notebook}")
    if not isinstance(grid, Grid):
        grid = load_grid(grid)
    validate(grid.runs, parameter_names(notebook), notebook.name)
    if workers < 1:
        raise GridError("--workers must be at least 1")

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    executed: list[str] = []
    errors: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        stack.enter_context(_exclusive(run_dir))
        _write_manifest(run_dir, notebook, grid)
        due = [r for r in grid.runs if not (resume and _is_done(run_dir / r.name, r))]
        skipped = [r.name for r in grid.runs if r not in due]
        batch_id = uuid.uuid4().hex  # marks the states this invocation writes
        tasks = [(str(notebook), str(run_dir / r.name), r.name, r.params, str(cwd or os.getcwd()), batch_id)
                 for r in due]
        _preload()
        stack.enter_context(_terminate_on_sigterm())
        # workers first (forked before any thread exists), then the bar; leaving the block terminates the workers
        pool = stack.enter_context(_pool(min(workers, len(tasks)))) if tasks else None
        with _progress_bar(len(grid.runs), len(skipped), progress) as bar:
            from kimi_eagle.apps.reports.batch_summary import (
                write_summary,  # pandas, matplotlib: imported while the workers run
            )

            for state in _results(pool, tasks, run_dir, batch_id) if pool else ():
                executed.append(state["name"])
                if state["status"] != "ok":
                    errors[state["name"]] = state.get("error") or "unknown error"
                _advance(bar, len(executed) - len(errors) + len(skipped), len(errors), len(tasks) - len(executed))
        write_summary(run_dir, [(r.name, r.params) for r in grid.runs],
                      title=f"{notebook.name} over {len(grid.runs)} runs")
    return BatchResult(run_dir, executed, skipped, [r.name for r in grid.runs if r.name in errors], errors)


def _results(pool, tasks: list[tuple], run_dir: Path, batch_id: str):
    """The runs' final states as they finish. A run whose worker process died (its result will never come)
    is recorded as failed rather than waited for."""
    results = pool.imap_unordered(execute_run, tasks)
    pending = {t[2] for t in tasks}
    while pending:
        try:
            states = [results.next(timeout=1.0)]
        except multiprocessing.TimeoutError:
            states = [_worker_died(run_dir / name) for name in sorted(pending)
                      if _orphaned(read_state(run_dir / name), batch_id)]
        for state in states:
            pending.discard(state["name"])
            yield state


def _orphaned(state: dict[str, Any], batch_id: str) -> bool:
    if state.get("batch") != batch_id or state.get("status") != "running":
        return False
    try:
        os.kill(int(state["pid"]), 0)
    except ProcessLookupError:
        return True
    except (OSError, KeyError, TypeError, ValueError):
        return False
    return False


def _worker_died(run_out: Path) -> dict[str, Any]:
    state = read_state(run_out)
    state.update(status="failed", error=f"the worker process (pid {state.get('pid')}) died during the run",
                 failed_cell=None, finished_at=_iso(time.time()))
    write_state(run_out, state)
    return state


def execute_run(task: tuple[str, str, str, dict[str, Any], str, str]) -> dict[str, Any]:
    """Worker: execute one run and record its state. Never raises for a notebook error."""
    from papermill.exceptions import PapermillExecutionError

    from kimi_eagle.apps.batch.notebooks import execute

    notebook, out, name, params, cwd, batch_id = task
    out_dir = Path(out)
    attempts = int(read_state(out_dir).get("attempts", 0)) + 1
    if out_dir.exists() and any(out_dir.iterdir()):
        if not (out_dir / "run.json").exists():  # never delete a directory this batch did not make
            return {"name": name, "params": params, "status": "failed", "attempts": attempts,
                    "error": f"{out_dir} exists and is not a batch run directory; move it away", "failed_cell": None}
        shutil.rmtree(out_dir)  # outputs of an earlier attempt (e.g. a stale metrics.json) must not survive
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    state: dict[str, Any] = {"name": name, "params": params, "status": "running", "attempts": attempts,
                             "started_at": _iso(started), "pid": os.getpid(), "batch": batch_id}
    write_state(out_dir, state)
    executed = out_dir / Path(notebook).name
    try:
        with _stderr_to(out_dir / "kernel.log"):  # the kernel's own log lines, kept per run, off the progress bar
            execute(notebook, out_dir, params, cwd=cwd)
        state.update(status="ok", error=None, failed_cell=None)
    except PapermillExecutionError as e:
        state.update(status="failed", error=f"{e.ename}: {e.evalue}",
                     failed_cell={"index": e.cell_index, "execution_count": e.exec_count, "source": e.source})
    except Exception as e:  # noqa: BLE001 — a dead kernel or bad notebook fails this run only
        state.update(status="failed", error=f"{type(e).__name__}: {e}", failed_cell=None)
    finished = time.time()
    if executed.exists():
        state["notebook"] = f"{name}/{executed.name}"
        try:
            state["html"] = f"{name}/{render_html(executed).name}"
        except Exception as e:  # noqa: BLE001 — a rendering problem is reported, not fatal
            state["html_error"] = f"{type(e).__name__}: {e}"
    state.update(finished_at=_iso(finished), duration_s=round(finished - started, 3))
    write_state(out_dir, state)
    return state


@contextlib.contextmanager
def _stderr_to(path: Path):
    """Point file descriptor 2 at ``path`` (inherited by the kernel process), then restore it."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "ab") as f:
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


@contextlib.contextmanager
def _exclusive(run_dir: Path):
    """Hold ``RUN_DIR/batch.lock`` (released by the OS however the batch ends): one batch per RUN_DIR at a time.
    The lock file is removed when the batch ends; a batch that locked a file another batch has just removed
    (not the one at the path any more) locks the new one instead."""
    import fcntl

    global _LOCK_FD
    path = run_dir / "batch.lock"
    while True:
        f = open(path, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            raise GridError(f"{run_dir} is in use by another batch; wait for it or use another RUN_DIR") from None
        try:
            if os.fstat(f.fileno()).st_ino == os.stat(path).st_ino:
                break
        except FileNotFoundError:
            pass
        f.close()  # the previous holder removed this file after we opened it: lock the current one
    _LOCK_FD = f.fileno()
    try:
        yield
    finally:
        _LOCK_FD = None
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # still holding the lock: no other batch runs in between
        f.close()


_LOCK_FD: int | None = None  # the batch lock's descriptor, which forked workers close (only the batch holds it)


def _preload() -> None:
    """Import what every worker needs once, here, so forked workers start at once."""
    import nbconvert  # noqa: F401
    import papermill  # noqa: F401
    from papermill.exceptions import PapermillExecutionError  # noqa: F401

    from kimi_eagle.apps.batch import notebooks  # noqa: F401


def _pool(n: int):
    """Worker processes: on Linux forked while this process has no other thread (they inherit the imports),
    else spawned."""
    method = "fork" if sys.platform.startswith("linux") and threading.active_count() == 1 else "spawn"
    return multiprocessing.get_context(method).Pool(n, initializer=_worker_init, initargs=(parent_watch(),))


def _worker_init(watch: tuple[int, int]) -> None:
    die_with_parent(*watch)  # a killed batch takes its workers down at once, quietly (issue 48)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a forked worker must not inherit the batch's handler
    if _LOCK_FD is not None:  # nor the batch lock: a worker still exiting after its batch died must not hold it
        with contextlib.suppress(OSError):
            os.close(_LOCK_FD)


def render_html(executed: Path) -> Path:
    """The executed notebook rendered to HTML beside it with nbconvert; widgets show their static snapshots,
    offline too (:func:`kimi_eagle.apps.widgets.snapshot.notebook_html`)."""
    from kimi_eagle.apps.widgets.snapshot import notebook_html

    out = executed.with_suffix(".html")
    write_text(out, notebook_html(executed))
    return out


def read_state(run_out: Path) -> dict[str, Any]:
    try:
        return json.loads((Path(run_out) / "run.json").read_text())
    except (OSError, ValueError):
        return {}


def write_state(run_out: Path, state: dict[str, Any]) -> None:
    write_json(Path(run_out) / "run.json", state)


def _is_done(run_out: Path, run: Run) -> bool:
    """Whether a kept run is finished: ok with the same parameters, and its ``metrics.json`` (when it wrote one)
    still reads (:func:`metrics_problem`); a run whose metrics were corrupted since is run again."""
    from kimi_eagle.apps.reports.batch_summary import metrics_problem

    state = read_state(run_out)
    return (state.get("status") == "ok" and _canonical(state.get("params")) == _canonical(run.params)
            and metrics_problem(run_out) is None)


def _canonical(params: Any) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def _write_manifest(run_dir: Path, notebook: Path, grid: Grid) -> None:
    manifest = {
        "notebook": str(notebook), "notebook_sha256": hashlib.sha256(notebook.read_bytes()).hexdigest(),
        "written_at": _iso(time.time()), "runs": [{"name": r.name, "params": r.params} for r in grid.runs],
    }
    write_json(run_dir / "batch.json", manifest)


def _progress_bar(total: int, done: int, enabled: bool):
    if not enabled:
        return contextlib.nullcontext()
    from tqdm import tqdm

    bar = tqdm(total=total, initial=done, unit="run", desc="batch", file=sys.stderr)
    _advance(bar, done, 0, total - done)
    return bar


def _advance(bar, done: int, failed: int, left: int) -> None:
    if bar is not None:
        bar.n = done + failed
        bar.set_postfix_str(f"ok={done} failed={failed} left={left}", refresh=True)


class _terminate_on_sigterm:
    """Turn SIGTERM into KeyboardInterrupt so the pool's workers are terminated on the way out."""

    def __enter__(self):
        self._old = None
        try:
            self._old = signal.signal(signal.SIGTERM, self._raise)
        except ValueError:  # not the main thread: leave signals alone
            pass
        return self

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)
        return False

    @staticmethod
    def _raise(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")
