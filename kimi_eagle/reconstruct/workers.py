"""Worker processes that end with their parent (issue 48).

A pool's worker whose parent is killed (SIGKILL, or SIGTERM with no clean-up) used to run on to the end of its
task and then print a ``BrokenPipeError`` traceback when it sent the result to the dead parent.
:func:`die_with_parent`, run first in every worker (the pool's initializer), makes it end at once and quietly:

- a worker forked by the parent's main thread asks Linux for SIGKILL the moment the parent ends
  (``prctl(PR_SET_PDEATHSIG)``);
- any other worker (spawned, not on Linux, or forked by another thread) runs a daemon thread that notices the
  parent is gone (its parent pid changes) within :data:`POLL_S` and ends the worker with ``os._exit``.

Why the main-thread condition: the death signal follows the *thread* that forked the worker, and a
``multiprocessing.Pool`` forks the replacement of a dead worker from its worker-handler thread. Were that
replacement given the signal, it would be killed when the handler thread ends at the pool's shutdown, possibly
while holding the pool's task-queue lock, and the shutdown would wait on that lock for ever
(``tests/test_batch.py``: a worker that dies). A forked child keeps the forking thread's identity
(``threading.get_ident``), which is how a worker tells.

A worker's own children (a notebook kernel) watch their parent the same way (ipykernel's parent poller).
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

POLL_S = 0.2  # how often a worker without the death signal checks its parent
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def parent_watch() -> tuple[int, int]:
    """The arguments for :func:`die_with_parent`, taken in the parent before the pool starts: its pid and its main
    thread's identity."""
    return os.getpid(), threading.main_thread().ident or 0


def die_with_parent(parent_pid: int, main_ident: int = 0) -> None:
    """In a worker: end quietly (no traceback, no result sent) as soon as process ``parent_pid`` ends."""
    forked_by_main = main_ident != 0 and threading.get_ident() == main_ident
    if not (forked_by_main and _set_death_signal(signal.SIGKILL)):
        threading.Thread(target=_watch, args=(parent_pid,), name="parent-watch", daemon=True).start()
    if os.getppid() != parent_pid:  # the parent ended before the watch was set
        os._exit(0)


def _set_death_signal(sig: int) -> bool:
    """``prctl(PR_SET_PDEATHSIG, sig)`` on Linux; False where it is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(POLL_S)
    os._exit(0)
