"""The README's own-logs flow on each agent test, with the provider table learned without that test.

``bench/agent_folds.py --tables DIR`` writes one learned table per fold (``DIR/FOLD.toml``: every record of both
recorded corpora except the fold's scored tests). For each fold this runs what a user runs on a log of their own,
with no options but that table: ``kimi-eagle convert --from openai-stream`` on the scored tests' raw streams (as the
agent recorded them), ``kimi-eagle reconstruct --provider-table DIR/FOLD.toml`` and ``kimi-eagle billing``. It then
reads each fold's ``summary.json``: prompts equal to the billed count (strictly, or by the entry's named count
offsets) and completions by billing's verdict (equal, explained by a named convention, unexplained), and records in
error. The leave-one-test-out folds are summed (each record is scored once, under a table that never saw its test);
``fixed-split`` (the split ``providers --recorded`` scores) is printed apart.

Usage: python bench/agent_folds_flow.py DIR
"""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

from agent_folds import wilson  # noqa: E402 (bench/ is the script's directory)

from kimi_eagle.assets import data_path
from kimi_eagle.reconstruct.recorded import AGENT_SCORE_TESTS, AGENT_TRACES

FIXED = "fixed-split"


def scored_tests(fold: str) -> set[str]:
    return set(AGENT_SCORE_TESTS) if fold == FIXED else {fold}


def write_log(fold: str, out: Path) -> int:
    """The fold's scored tests' raw exchanges as an OpenAI stream log (``request`` + ``chunks`` per line)."""
    n = 0
    with open(data_path(AGENT_TRACES), encoding="utf-8") as src, open(out, "w", encoding="utf-8") as dst:
        for line in src:
            ex = json.loads(line)
            if ex["source"]["path"].rpartition("/")[2].removesuffix(".yaml") in scored_tests(fold):
                dst.write(json.dumps({"request": ex["request"], "chunks": ex["stream_chunks"]}) + "\n")
                n += 1
    return n


def kimi(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "kimi_eagle", *args], capture_output=True, text=True, check=True)
    return done.stdout


def run_fold(table: Path) -> dict:
    """The flow on one fold's scored tests; its billing summary."""
    work = table.with_suffix("")
    work.mkdir(exist_ok=True)
    write_log(table.stem, work / "log.jsonl")
    kimi("convert", "--from", "openai-stream", str(work / "log.jsonl"), "-o", str(work / "api.jsonl"))
    kimi("reconstruct", str(work / "api.jsonl"), "-o", str(work / "rec.parquet"), "--provider-table", str(table))
    print(kimi("billing", str(work / "rec.parquet"), "-o", str(work / "bill")).strip().splitlines()[-1], flush=True)
    return json.loads((work / "bill" / "summary.json").read_text(encoding="utf-8"))


def tally(summary: dict) -> Counter:
    """``(provider, measure) -> count``: prompts equal and compared, completions rated and unexplained, errors."""
    out = Counter()
    for provider, p in summary["prompt_parity"]["by_provider"].items():
        out[(provider, "prompt_equal")] += p["equal_total"]
        out[(provider, "prompt_compared")] += p["compared"]
    for p in summary["by_provider"]:
        if p["provider"] == "all":  # the total row
            continue
        for k in ("rated", "unexplained", "error"):
            out[(p["provider"], k)] += p[k]
    return out


def line(t: Counter, provider: str | None = None) -> str:
    def get(m: str) -> int:
        return sum(v for (p, k), v in t.items() if k == m and (provider is None or p == provider))

    pe, pc, rated, unx, err = (get(m) for m in ("prompt_equal", "prompt_compared", "rated", "unexplained", "error"))
    (plo, phi), (ulo, uhi) = wilson(pe, pc), wilson(unx, rated)
    return (f"prompts equal {pe}/{pc} ({100 * pe / max(pc, 1):.1f} %, {100 * plo:.1f}-{100 * phi:.1f}); completions "
            f"unexplained {unx}/{rated} ({100 * unx / max(rated, 1):.1f} %, {100 * ulo:.1f}-{100 * uhi:.1f}); "
            f"records in error {err}")


def main() -> None:
    tables = sorted(Path(sys.argv[1]).glob("*.toml"))
    total = Counter()
    for table in tables:
        t = tally(run_fold(table))
        print(f"{table.stem}: {line(t)}", flush=True)
        total += t if table.stem != FIXED else Counter()
    if not total:
        return
    print("\nleave one test out, per provider (Wilson 95 % intervals):")
    for provider in sorted({p for p, _ in total}):
        print(f"  {provider}: {line(total, provider)}")
    print(f"all tests: {line(total)}")


if __name__ == "__main__":
    main()
