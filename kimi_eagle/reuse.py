"""What a rerun reused instead of redoing: one vocabulary for every notebook, command and ``metrics.json``.

A stage that finds its earlier output (a collection's answered prompts, a checkpoint, stored hidden states, an
evaluation) keeps it. Each such stage adds one entry to a ``reused`` mapping, ``{stage: "what of what"}``, and
the counts beside it (``requested``, ``retries``, ...) are of what this run did, never of what it found.
``{}`` means everything was done fresh.

>>> reused = {}
>>> note_collect(reused, "collect", {"prompts": 48, "already_done": 48})
>>> note_training(reused, "training", {"start": "resumed from step 120", "step": 120})
>>> reused_line(reused)
'reused: collect 48/48, training from step 120 (trained to 120)'
>>> reused_line({})
'reused: nothing (all fresh)'
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def note_collect(reused: dict[str, str], stage: str, summary: Mapping[str, Any]) -> None:
    """A collector's ``summary`` kept ``already_done`` of its ``prompts``: ``reused[stage] = "k/n"``."""
    kept = int(summary.get("already_done") or 0)
    if kept:
        reused[stage] = f"{kept}/{summary['prompts']}"


def note_training(reused: dict[str, str], stage: str, summary: Mapping[str, Any]) -> None:
    """A training ``summary`` (:func:`kimi_eagle.eagle3.train.train_drafter`) that resumed a checkpoint:
    ``reused[stage] = "from step N (trained to M)"``."""
    start = str(summary.get("start") or "")
    if start.startswith("resumed from step"):
        reused[stage] = f"{start[len('resumed '):]} (trained to {summary.get('step')})"


def note_count(reused: dict[str, str], stage: str, kept: int, total: int) -> None:
    """``kept`` of ``total`` items of ``stage`` were found done: ``reused[stage] = "kept/total"``."""
    if kept:
        reused[stage] = f"{kept}/{total}"


def reused_line(reused: Mapping[str, str]) -> str:
    """The one line a notebook or command prints: ``reused: collect 48/48, training from step 120``."""
    if not reused:
        return "reused: nothing (all fresh)"
    return "reused: " + ", ".join(f"{stage} {what}" for stage, what in reused.items())
