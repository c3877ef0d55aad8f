"""The agent traces out of sample, one test at a time: each of the agent's seven tests scored under the shipped
table's calibration learned without it (the toy-tool exchanges and the agent's six other tests).

``kimi-eagle providers --recorded`` scores one fixed split (learned on four tests, scored on three); this is the
leave-one-test-out view of the same question, closer to the case of a test nobody here has seen, which was recorded
on the same days as the seven. Prints, per held-out test and per provider, prompts (all of them declare tools) and
completions equal to the billed counts over those scored, with Wilson 95 % intervals on the totals.

The last fold, ``fixed-split``, is the split ``providers --recorded`` scores (not in the leave-one-test-out totals).
With ``--tables DIR`` each fold's learned table is written to ``DIR/FOLD.toml``; ``bench/agent_folds_flow.py DIR``
then runs the README's own-logs flow (convert, reconstruct, billing) on each fold's scored tests with that table.

Usage: python bench/agent_folds.py [--tables DIR] [--only FOLD,...]
"""
from __future__ import annotations

import argparse
import math
import time
from collections import Counter
from pathlib import Path

from kimi_eagle.assets import kimi_dir
from kimi_eagle.reconstruct.record import rebuild_under
from kimi_eagle.reconstruct.recorded import AGENT_DATASET, AGENT_SCORE_TESTS, DATASET, corpus_records, source_test
from kimi_eagle.serving.calibration import VariantCounts, _deltas, calibrate, row_for, screen
from kimi_eagle.serving.provider_table import write_table
from kimi_eagle.tokenize.tokenizer import load_tokenizer


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of ``k`` successes in ``n`` trials."""
    if n == 0:
        return 0.0, 1.0
    p, d = k / n, 1 + z * z / n
    mid, half = (p + z * z / (2 * n)) / d, z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, mid - half), min(1.0, mid + half)


def fold(counts: VariantCounts, rows: list[dict], scored: list[dict]) -> Counter:
    """``Counter`` of ``(provider, side, equal)`` for ``scored`` under the calibrated ``rows``."""
    out = Counter()
    for r in scored:
        row = row_for(rows, r)
        for side in ("prompt", "completion"):
            deltas = _deltas(counts, [r], row["variant"], side) if row else [None]
            out[(r["response"]["provider"], side, deltas == [0])] += 1
    return out


def folds(tests: dict[str, str], only: list[str] | None) -> list[tuple[str, set[str]]]:
    """``(fold name, the tests it scores)``: one fold per test (leave one test out), then ``fixed-split`` (the
    split ``providers --recorded`` scores: learned on AGENT_LEARN_TESTS, scored on AGENT_SCORE_TESTS)."""
    out = [(t, {t}) for t in sorted(set(tests.values()))] + [("fixed-split", set(AGENT_SCORE_TESTS))]
    return [f for f in out if only is None or f[0] in only]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", metavar="DIR", help="write each fold's learned provider table to DIR/FOLD.toml "
                        "(bench/agent_folds_flow.py runs the README flow on the fold's scored test with it)")
    parser.add_argument("--only", metavar="FOLD,...", help="only these folds (test names, or fixed-split)")
    args = parser.parse_args()
    start = time.time()
    counts = VariantCounts(load_tokenizer(kimi_dir()), rebuild_under)
    toy, _ = screen(corpus_records(DATASET)[1], counts)
    exchanges, agent = corpus_records(AGENT_DATASET)
    tests = {r["id"]: source_test(ex) for ex, r in zip(exchanges, agent)}
    agent, _ = screen(agent, counts)
    total = Counter()
    for name, scored_tests in folds(tests, args.only.split(",") if args.only else None):
        scored = [r for r in agent if tests[r["id"]] in scored_tests]
        rows = calibrate(toy + [r for r in agent if tests[r["id"]] not in scored_tests], counts)
        if args.tables:
            write_table(rows, Path(args.tables) / f"{name}.toml",
                        f"the toy-tool exchanges and the agent traces without {', '.join(sorted(scored_tests))}")
        got = fold(counts, rows, scored)
        total += got if name != "fixed-split" else Counter()
        sides = {side: (sum(v for (_, s, e), v in got.items() if s == side and e),
                        sum(v for (_, s, _), v in got.items() if s == side)) for side in ("prompt", "completion")}
        print(f"{name}: prompts {sides['prompt'][0]}/{sides['prompt'][1]}, completions "
              f"{sides['completion'][0]}/{sides['completion'][1]} ({time.time() - start:.0f} s)", flush=True)
    if total:
        report(total)


def report(total: Counter) -> None:
    """The leave-one-test-out totals per provider, then over all tests with Wilson 95 % intervals."""
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
