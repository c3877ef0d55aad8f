"""Prompt lines for the local stories260K model: short story openers, each line with its own seed.

The lines are the prompt format ``kimi-eagle collect`` and ``kimi-eagle generate`` read
(``{"id", "dataset", "prompt", "seed"}``); write them with :func:`kimi_eagle.io.write_jsonl`.
"""
from __future__ import annotations

from typing import Any

STORY_OPENERS = ("Once upon a time", "One day", "Once upon a time, there was a little", "Lily and Ben went to",
                 "The sun was shining and", "Tom had a big red", "In a small house,", "The dog wanted to")


def story_prompts(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` prompt lines for the local stories260K model: story openers in turn, each line with its own ``seed``."""
    return [{"id": f"story-{i:05d}", "dataset": "stories", "prompt": STORY_OPENERS[i % len(STORY_OPENERS)],
             "seed": seed * 1_000_003 + i} for i in range(n)]


STORY_SUBJECTS = ("a little girl", "a big dog", "a boy named Tom", "a small bird", "a happy cat", "a kind old man")


def distinct_story_prompts(n: int) -> list[dict[str, Any]]:
    """``n`` *distinct* prompt lines (up to ``len(STORY_SUBJECTS) * len(STORY_OPENERS)``): a subject sentence, then an
    opener — for greedy audits, where a repeated prompt would only repeat its completion."""
    limit = len(STORY_SUBJECTS) * len(STORY_OPENERS)
    if not 0 <= n <= limit:
        raise ValueError(f"n must be in [0, {limit}], got {n}")
    return [{"id": f"audit-{i:03d}", "dataset": "stories",
             "prompt": f"Once upon a time, there was {STORY_SUBJECTS[i % len(STORY_SUBJECTS)]}. "
                       f"{STORY_OPENERS[(i // len(STORY_SUBJECTS)) % len(STORY_OPENERS)]}"} for i in range(n)]
