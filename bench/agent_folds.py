"""The agent traces out of sample, one test at a time: each of the agent's seven tests scored under the shipped
table's calibration learned without it (the toy-tool exchanges and the agent's six other tests).

``kimi-eagle providers --recorded`` scores one fixed split (learned on four tests, scored on three); this is the
leave-one-test-out view of the same question, closer to the case of a test nobody here has seen, which was recorded
on the same days as the seven. Prints, per held-out test and per provider, prompts (all of them declare tools) and
completions equal to the billed counts over those scored, with Wilson 95 % intervals on the totals.

Usage: python bench/agent_folds.py
"""
from __future__ import annotations

import math
import time
from collections import Counter

from kimi_eagle.assets import kimi_dir
from kimi_eagle.reconstruct.record import rebuild_under
from kimi_eagle.reconstruct.recorded import AGENT_DATASET, DATASET, corpus_records, source_test
from kimi_eagle.serving.calibration import VariantCounts, _deltas, calibrate, row_for, screen
from kimi_eagle.tokenize.tokenizer import load_tokenizer


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of ``k`` successes in ``n`` trials."""
    if n == 0:
        return 0.0, 1.0
    p, d = k / n, 1 + z * z / n
    mid, half = (p + z * z / (2 * n)) / d, z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, mid - half), min(1.0, mid + half)


def fold(counts: VariantCounts, learn: list[dict], scored: list[dict]) -> Counter:
    """``Counter`` of ``(provider, side, equal)`` for ``scored`` under the calibration of ``learn``."""
    rows, out = calibrate(learn, counts), Counter()
    for r in scored:
        row = row_for(rows, r)
        for side in ("prompt", "completion"):
            deltas = _deltas(counts, [r], row["variant"], side) if row else [None]
            out[(r["response"]["provider"], side, deltas == [0])] += 1
    return out


def main() -> None:
    start = time.time()
    counts = VariantCounts(load_tokenizer(kimi_dir()), rebuild_under)
    toy, _ = screen(corpus_records(DATASET)[1], counts)
    exchanges, agent = corpus_records(AGENT_DATASET)
    tests = {r["id"]: source_test(ex) for ex, r in zip(exchanges, agent)}
    agent, _ = screen(agent, counts)
    total = Counter()
    for test in sorted(set(tests.values())):
        scored = [r for r in agent if tests[r["id"]] == test]
        got = fold(counts, toy + [r for r in agent if tests[r["id"]] != test], scored)
        total += got
        sides = {side: (sum(v for (_, s, e), v in got.items() if s == side and e),
                        sum(v for (_, s, _), v in got.items() if s == side)) for side in ("prompt", "completion")}
        print(f"{test}: prompts {sides['prompt'][0]}/{sides['prompt'][1]}, completions "
              f"{sides['completion'][0]}/{sides['completion'][1]} ({time.time() - start:.0f} s)", flush=True)
    print("\n| provider | prompts equal | completions equal |\n|---|---|---|")
    for provider in sorted({p for p, _, _ in total}):
        cells = [f"{total[(provider, s, True)]}/{total[(provider, s, True)] + total[(provider, s, False)]}"
                 for s in ("prompt", "completion")]
        print(f"| {provider} | {cells[0]} | {cells[1]} |")
    for side in ("prompt", "completion"):
        k = sum(v for (_, s, e), v in total.items() if s == side and e)
        n = sum(v for (_, s, _), v in total.items() if s == side)
        lo, hi = wilson(k, n)
        print(f"all tests, {side}s equal: {k}/{n} ({100 * k / n:.1f} %, Wilson 95 % {100 * lo:.1f}-{100 * hi:.1f} %)")


if __name__ == "__main__":
    main()
