"""Collector throughput and overhead against the local server, at concurrency 1, 8 and 32 in one run.

Baseline: a bare ``httpx.AsyncClient`` posting the same requests with the same concurrency (no
retries, no output file, no resume bookkeeping). Candidate: ``kimi_eagle.apps.api.collect.collect`` writing
a fresh responses file. Trials are interleaved and the best of ``--repeats`` is kept for each, to
beat the noise of a shared machine. Overhead per request = (collector wall - baseline wall) / n.

    python bench/collect.py [--n 200] [--repeats 3] [--max-tokens 1]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx

from kimi_eagle.apps.api.collect import CollectConfig, collect, load_prompts
from kimi_eagle.apps.api.server import LocalServer
from kimi_eagle.assets import stories_dir
from kimi_eagle.engine.prompts import story_prompts
from kimi_eagle.io import write_jsonl

MODEL = "stories260K"


async def bare(base_url: str, bodies: list[dict], concurrency: int) -> float:
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        async def one(body: dict) -> None:
            async with sem:
                r = await client.post(base_url + "/chat/completions", json=body)
                r.raise_for_status()

        t0 = time.perf_counter()
        await asyncio.gather(*(one(b) for b in bodies))
        return time.perf_counter() - t0


def with_collector(base_url: str, prompts: Path, concurrency: int, max_tokens: int, work: Path) -> float:
    out = work / f"responses-{time.perf_counter_ns()}.jsonl"
    config = CollectConfig(base_url, MODEL, concurrency=concurrency, defaults={"max_tokens": max_tokens},
                           progress=False)
    t0 = time.perf_counter()
    summary = collect(prompts, out, config, api_key="")
    wall = time.perf_counter() - t0
    assert summary["ok"] == summary["prompts"], summary
    return wall


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=200, help="requests per trial")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=1)
    p.add_argument("--concurrency", default="1,8,32")
    args = p.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    work = Path(tempfile.mkdtemp(prefix="bench-collect-"))
    prompts = write_jsonl(work / "prompts.jsonl", story_prompts(args.n))
    bodies = [pr.request for pr in load_prompts(prompts, MODEL, {"max_tokens": args.max_tokens})]
    best: dict[tuple[str, int], float] = {}
    with LocalServer(stories_dir(), work / "engine.jsonl", "--threads", "1") as server:
        asyncio.run(bare(server.base_url, bodies[:20], 4))  # warm up
        for _ in range(args.repeats):
            for c in levels:
                for kind in ("bare", "collect"):
                    if kind == "bare":
                        wall = asyncio.run(bare(server.base_url, bodies, c))
                    else:
                        wall = with_collector(server.base_url, prompts, c, args.max_tokens, work)
                    best[kind, c] = min(best.get((kind, c), float("inf")), wall)
    print(f"{args.n} requests per trial (max_tokens={args.max_tokens}), best of {args.repeats}, local stories260K server")
    print(f"{'concurrency':>11} {'bare req/s':>11} {'collect req/s':>14} {'ratio':>6} {'overhead ms/req':>16}")
    rows = []
    for c in levels:
        b, k = best["bare", c], best["collect", c]
        row = {"concurrency": c, "bare_rps": args.n / b, "collect_rps": args.n / k, "ratio": b / k,
               "overhead_ms_per_request": (k - b) / args.n * 1000}
        rows.append(row)
        print(f"{c:>11} {row['bare_rps']:>11.1f} {row['collect_rps']:>14.1f} {row['ratio']:>6.2f} "
              f"{row['overhead_ms_per_request']:>16.2f}")
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
