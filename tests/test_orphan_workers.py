"""A killed parent takes its pool workers down, quietly (issue 48).

``reconstruct --workers N`` and ``batch`` run their work in a process pool. When the parent is killed (SIGKILL, or
SIGTERM with no clean-up), its workers must end too — none left running — and print nothing: before the fix each
worker ran its task to the end and then printed a ``BrokenPipeError`` traceback when it sent the result to the
dead parent. Every process a test starts is killed by its pid at the end, whatever happened.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import yaml

from kimi_eagle.apps.batch.run import read_state
from kimi_eagle.assets import REPO_ROOT
from kimi_eagle.reconstruct.convert import convert_file

PROBE = Path(__file__).parent / "data" / "batch_probe.ipynb"
HANG_GUARD_S = 60  # generous: a worker that outlives its parent this long is left running


@pytest.fixture(scope="module")
def many_records(tmp_path_factory) -> Path:
    """A few thousand records (ShareGPT conversations, repeated under new ids): seconds of work for two workers."""
    folder = tmp_path_factory.mktemp("orphans")
    convert_file("sharegpt", None, folder / "sg.jsonl", limit=150)
    lines = (folder / "sg.jsonl").read_text().splitlines()
    path = folder / "many.jsonl"
    with path.open("w") as f:
        for k in range(6):
            for raw in lines:
                f.write(json.dumps({**json.loads(raw), "id": f"{json.loads(raw)['id']}-{k}"}) + "\n")
    return path


def start(cmd: list[str], stderr: Path) -> subprocess.Popen:
    with stderr.open("wb") as err:
        return subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=err)


def wait_for(condition, proc: subprocess.Popen, what: str) -> None:
    deadline = time.time() + HANG_GUARD_S
    while not condition():
        assert proc.poll() is None, f"the command ended before {what}"
        assert time.time() < deadline, f"no {what} within {HANG_GUARD_S} s"
        time.sleep(0.02)


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def kill_and_collect_survivors(proc: subprocess.Popen, sig: int, family: list[psutil.Process]) -> list[str]:
    """Send ``sig`` to the parent alone, then wait (up to the hang guard) for ``family`` to end: the ones still
    running, described (and then killed by pid, so that nothing outlives the test)."""
    os.kill(proc.pid, sig)
    proc.wait(timeout=HANG_GUARD_S)
    _, alive = psutil.wait_procs(family, timeout=HANG_GUARD_S)
    survivors = []
    for p in alive:
        try:
            survivors.append(f"{p.pid} {' '.join(p.cmdline())[:80]}")
            p.kill()
        except psutil.NoSuchProcess:
            pass
    return survivors


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_reconstruct_workers_end_quietly_with_their_killed_parent(many_records, tmp_path, sig):
    out, err = tmp_path / "out.parquet", tmp_path / "stderr.txt"
    cmd = [sys.executable, "-m", "kimi_eagle", "reconstruct", str(many_records), "-o", str(out), "--workers", "2",
           "--shard-size", "40", "--serving", "template", "--no-progress"]
    proc = start(cmd, err)
    family: list[psutil.Process] = []
    try:
        parts = tmp_path / "out.parquet.parts"
        # killed mid-run: the workers are busy with shards when the parent goes
        wait_for(lambda: len(descendants(proc.pid)) >= 2 and any(parts.glob("shard-*.arrow")), proc, "first shard")
        family = descendants(proc.pid)
        survivors = kill_and_collect_survivors(proc, sig, family)
    finally:
        for p in [proc, *family]:
            if p.poll() is None if isinstance(p, subprocess.Popen) else p.is_running():
                p.kill()
    assert not survivors, f"workers outlived their killed parent: {survivors}"
    stderr = err.read_text()
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr[-2000:]


def test_batch_workers_and_their_kernels_end_quietly_with_their_killed_parent(tmp_path):
    grid = tmp_path / "g.yaml"
    grid.write_text(yaml.safe_dump({"fixed": {"sleep_s": 30}, "sweep": {"x": [1, 2]}}))
    out, err = tmp_path / "run", tmp_path / "stderr.txt"
    cmd = [sys.executable, "-m", "kimi_eagle", "batch", str(PROBE), "--grid", str(grid), "-o", str(out),
           "--workers", "2", "--no-progress"]
    proc = start(cmd, err)
    family: list[psutil.Process] = []
    try:
        running = lambda: [read_state(out / f"x={x}").get("status") for x in (1, 2)] == ["running"] * 2  # noqa: E731
        # both notebooks are in their 30 s sleep: each worker has a kernel
        wait_for(lambda: running() and len(descendants(proc.pid)) >= 4, proc, "two running notebooks")
        family = descendants(proc.pid)
        survivors = kill_and_collect_survivors(proc, signal.SIGKILL, family)
    finally:
        for p in [*family]:
            if p.is_running():
                p.kill()
        if proc.poll() is None:
            proc.kill()
    assert not survivors, f"workers or kernels outlived their killed batch: {survivors}"
    stderr = err.read_text()
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr[-2000:]


def test_a_worker_forked_off_the_main_thread_watches_its_parent_by_polling(tmp_path):
    """A worker that cannot take the death signal (spawned, or forked by another thread than the main one: a
    pool's replacement workers) runs a daemon thread that notices the parent has gone and ends it, mid-task."""
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent("""
        import multiprocessing, os, sys, time
        from kimi_eagle.reconstruct.workers import die_with_parent
        pool = multiprocessing.get_context("fork").Pool(1, die_with_parent, (os.getpid(), 0))
        print(pool.apply(os.getpid), flush=True)
        pool.apply_async(time.sleep, (120,))
        time.sleep(120)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    worker = None
    try:
        worker = psutil.Process(int(proc.stdout.readline()))
        proc.kill()
        proc.wait(timeout=HANG_GUARD_S)
        _, alive = psutil.wait_procs([worker], timeout=HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            proc.kill()
        if worker is not None and worker.is_running():
            worker.kill()
    assert not alive, "the worker outlived its parent"
    assert "Traceback" not in proc.stderr.read()
