"""The README's own-logs flow on each agent test, with the provider table learned without that test.

``bench/agent_folds.py --tables DIR`` writes one learned table per fold (``DIR/FOLD.toml``: every record of both
recorded corpora except the fold's scored tests). For each fold this runs what a user runs on a log of their own,
with no options but that table: ``kimi-eagle convert --from openai-stream`` on the scored tests' raw streams (as the
agent recorded them), ``kimi-eagle reconstruct --provider-table DIR/FOLD.toml`` and ``kimi-eagle billing``. It then
reads each fold's ``summary.json``: prompts equal to the billed count (strictly, or by the entry's named count
offsets) and completions by billing's verdict (equal, explained by a named convention, unexplained), and records in
error. The leave-one-test-out folds are summed (each record is scored once, under a table that never saw its test);
``fixed-split`` (the split ``providers --recorded`` scores) is printed apart. ``python bench/agent_folds_flow.py
--flow DIR`` prints the same lines for one flow already run (its ``DIR/bill``), e.g. the in-sample one.

Usage: python bench/agent_folds_flow.py DIR | --flow DIR
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
from agent_folds import wilson  # bench/, the script's own directory

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


def run_fold(table: Path) -> None:
    """The flow on one fold's scored tests (its outputs in the folder named after the table)."""
    work = table.with_suffix("")
    work.mkdir(exist_ok=True)
    write_log(table.stem, work / "log.jsonl")
    kimi("convert", "--from", "openai-stream", str(work / "log.jsonl"), "-o", str(work / "api.jsonl"))
    kimi("reconstruct", str(work / "api.jsonl"), "-o", str(work / "rec.parquet"), "--provider-table", str(table))
    print(kimi("billing", str(work / "rec.parquet"), "-o", str(work / "bill")).strip().splitlines()[-1], flush=True)


def tally(work: Path) -> list[dict]:
    """One dict per record of the fold's billing: provider, prompt verdict and residual, completion verdict."""
    rows = pq.read_table(work / "bill" / "billing_records.parquet",
                         columns=["provider", "prompt_verdict", "prompt_residual", "verdict"]).to_pylist()
    return [{**r, "verdict": (r["verdict"] or "").partition(":")[0]} for r in rows]


def line(rows: list[dict]) -> str:
    """Prompts equal (strictly or by the entry's count offsets), completions unexplained, records in error, the
    median residual of the prompts that differ: one line, with Wilson 95 % intervals."""
    compared = [r for r in rows if r["prompt_verdict"] in ("equal", "equal_by_table", "differs")]
    pe = sum(r["prompt_verdict"] != "differs" for r in compared)
    rated = [r for r in rows if r["verdict"] in ("match", "explained", "unexplained")]
    unx, err = sum(r["verdict"] == "unexplained" for r in rated), sum(r["verdict"] == "error" for r in rows)
    residuals = sorted(r["prompt_residual"] for r in compared if r["prompt_verdict"] == "differs")
    (plo, phi), (ulo, uhi) = wilson(pe, len(compared)), wilson(unx, len(rated))
    median = f"{residuals[len(residuals) // 2]:+d}" if residuals else "-"
    return (f"prompts equal {pe}/{len(compared)} ({100 * pe / max(len(compared), 1):.1f} %, {100 * plo:.1f}-"
            f"{100 * phi:.1f}; residual of the others median {median}); completions unexplained {unx}/{len(rated)} "
            f"({100 * unx / max(len(rated), 1):.1f} %, {100 * ulo:.1f}-{100 * uhi:.1f}); records in error {err}")


def per_provider(rows: list[dict]) -> None:
    for provider in sorted({r["provider"] for r in rows}):
        print(f"  {provider}: {line([r for r in rows if r['provider'] == provider])}")
    print(f"all: {line(rows)}")


def main() -> None:
    if sys.argv[1] == "--flow":
        return per_provider(tally(Path(sys.argv[2])))
    tables = sorted(Path(sys.argv[1]).glob("*.toml"))
    total: list[dict] = []
    for table in tables:
        run_fold(table)
        rows = tally(table.with_suffix(""))
        print(f"{table.stem}: {line(rows)}", flush=True)
        total += rows if table.stem != FIXED else []
    if not total:
        return
    print("\nleave one test out, per provider (Wilson 95 % intervals):")
    per_provider(total)


if __name__ == "__main__":
    main()
