"""The honest end-to-end measurement on a model we can run: serve -> collect -> reconstruct -> diff.

Samples N completions from stories260K (temperature 1.0 by default) through ``kimi-eagle serve``,
collects them with ``kimi-eagle collect`` (text only, as from an API), reconstructs the token IDs
from the text with ``kimi-eagle reconstruct --format plain`` (stories260K's own tokenizer), and
diffs them by bytes against the IDs the server logged with ``kimi-eagle diff``. Prints every
command it runs and the rates of exact / BPE-split / semantic records, and writes
``OUT/e2e_summary.json``.

    python bench/e2e_stories.py [--n 500] [--max-tokens 256] [--out runs/e2e_stories] [--faults]
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pandas as pd

from kimi_eagle.apps.api.server import LocalServer
from kimi_eagle.assets import stories_dir
from kimi_eagle.diff.inputs import delivered_engine_records
from kimi_eagle.engine.prompts import story_prompts
from kimi_eagle.io import write_json, write_jsonl

FAULTS = ["--fault-429", "0.03", "--retry-after", "0.5", "--fault-503", "0.03", "--fault-truncate", "0.02",
          "--fault-drop", "0.02", "--fault-seed", "0"]


def sh(cmd: list[str], timeout: float) -> str:
    print("$", " ".join(shlex.quote(c) for c in cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        sys.exit(f"command failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return r.stdout


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=500)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--seed", type=int, default=0, help="prompt i is sampled with seed seed*1000003+i")
    p.add_argument("--faults", action="store_true", help="inject 429/503/truncated/dropped replies on the way")
    p.add_argument("--out", default="runs/e2e_stories")
    p.add_argument("--timeout", type=float, default=3600, help="bound on the collection, seconds")
    args = p.parse_args()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = str(stories_dir())
    prompts = write_jsonl(out / "prompts.jsonl", story_prompts(args.n, args.seed))
    responses, engine_log, engine = out / "responses.jsonl", out / "engine_log.jsonl", out / "engine.jsonl"
    recon, diff_dir = out / "recon.parquet", out / "diff"
    py = [sys.executable, "-m", "kimi_eagle"]
    t0 = time.perf_counter()
    server_args = ["--threads", "1", *(FAULTS if args.faults else [])]
    print(f"$ kimi-eagle serve --model {model} --host 127.0.0.1 --port 0 --records {engine_log} {' '.join(server_args)}")
    with LocalServer(model, engine_log, *server_args, log=out / "serve.log") as server:
        sh([*py, "collect", str(prompts), "-o", str(responses), "--base-url", server.base_url, "--model", "stories260K",
            "--concurrency", str(args.concurrency), "--temperature", str(args.temperature),
            "--max-tokens", str(args.max_tokens), "--no-progress"], timeout=args.timeout)
    t_collect = time.perf_counter() - t0
    delivered = delivered_engine_records(engine_log, responses)
    write_jsonl(engine, delivered)
    print(f"# {len(delivered)} engine records paired with stored responses by response_id -> {engine}")
    sh([*py, "reconstruct", str(responses), "-o", str(recon), "--tokenizer", model, "--format", "plain",
        "--no-progress"], timeout=600)
    print(sh([*py, "diff", "--engine", str(engine), "--reconstructed", str(recon), "-o", str(diff_dir),
              "--tokenizer", model], timeout=600).strip())

    records = pd.read_parquet(diff_dir / "records.parquet")
    hunks = pd.read_parquet(diff_dir / "hunks.parquet")
    ok = records[records["status"] == "ok"]
    n = len(ok)
    labels = Counter(ok["label"])
    verdicts = Counter(ok["verdict"])
    engine_tokens = int(ok["n_engine_tokens"].sum())
    n_bos_inside = sum(1 for r in delivered if 1 in r["output_ids"])
    summary = {
        "completions": args.n, "records": len(records), "status": dict(Counter(records["status"])),
        "ok_records": n, "verdicts": dict(verdicts), "labels": dict(labels),
        "exact_rate": verdicts["exact"] / n if n else None,
        "bpe_split_rate": verdicts["bpe_split"] / n if n else None,
        "semantic_rate": verdicts["semantic"] / n if n else None,
        "records_with_split_hunks": int((ok["n_split_hunks"] > 0).sum()),
        "records_with_semantic_hunks": int((ok["n_semantic_hunks"] > 0).sum()),
        "hunks": dict(Counter(hunks["kind"])), "semantic_subclasses": dict(Counter(hunks["subclass"].dropna())),
        "engine_tokens": engine_tokens, "token_delta_sum": int(ok["token_delta"].sum()),
        "prompt_match_rate": float(ok["prompt_match"].mean()) if n else None,
        "engine_finish_reasons": dict(Counter(ok["engine_finish_reason"])),
        "completions_containing_bos_id_1": n_bos_inside,
        "temperature": args.temperature, "max_tokens": args.max_tokens, "faults": args.faults,
        "collect_seconds": round(t_collect, 1),
    }
    write_json(out / "e2e_summary.json", summary)
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
