"""Collector throughput and overhead against the local server, at concurrency 1, 8 and 32 in one run, for plain
and streamed (``stream: true``, SSE) answers.

Baselines: a bare ``httpx.AsyncClient`` sending the same requests with the same concurrency (no retries, no
output file, no resume bookkeeping) -- for streams it reads the SSE lines and parses each ``data:`` payload,
as the least a streaming client does. Candidate: ``kimi_eagle.apps.api.collect.collect`` writing a fresh
responses file (for streams: ``collect --stream``, assembling the chunks into the record). Trials are
interleaved and the best of ``--repeats`` is kept for each, to beat the noise of a shared machine. Ratio =
bare wall / collect wall; overhead per request = (collector wall - baseline wall) / n.

    python bench/collect.py [--n 200] [--repeats 3] [--max-tokens 1] [--modes plain,stream]
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
STREAM = {"stream": True, "stream_options": {"include_usage": True}}


async def bare(base_url: str, bodies: list[dict], concurrency: int, stream: bool) -> float:
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        async def one(body: dict) -> None:
            async with sem:
                if not stream:
                    r = await client.post(base_url + "/chat/completions", json=body)
                    r.raise_for_status()
                    return
                async with client.stream("POST", base_url + "/chat/completions", json={**body, **STREAM}) as r:
                    r.raise_for_status()
                    done = False
                    async for line in r.aiter_lines():
                        if line.startswith("data: "):
                            if line == "data: [DONE]":
                                done = True
                            else:
                                json.loads(line[6:])
                    assert done

        t0 = time.perf_counter()
        await asyncio.gather(*(one(b) for b in bodies))
        return time.perf_counter() - t0


def with_collector(base_url: str, prompts: Path, concurrency: int, max_tokens: int, work: Path, stream: bool) -> float:
    out = work / f"responses-{time.perf_counter_ns()}.jsonl"
    defaults = {"max_tokens": max_tokens, **(STREAM if stream else {})}
    config = CollectConfig(base_url, MODEL, concurrency=concurrency, defaults=defaults, progress=False)
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
    p.add_argument("--modes", default="plain,stream", help="plain, stream or both (comma-separated)")
    args = p.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    modes = [m.strip() for m in args.modes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="bench-collect-"))
    prompts = write_jsonl(work / "prompts.jsonl", story_prompts(args.n))
    bodies = [pr.request for pr in load_prompts(prompts, MODEL, {"max_tokens": args.max_tokens})]
    best: dict[tuple[str, str, int], float] = {}
    with LocalServer(stories_dir(), work / "engine.jsonl", "--threads", "1") as server:
        asyncio.run(bare(server.base_url, bodies[:20], 4, False))  # warm up
        for _ in range(args.repeats):
            for mode in modes:
                for c in levels:
                    for kind in ("bare", "collect"):
                        stream = mode == "stream"
                        if kind == "bare":
                            wall = asyncio.run(bare(server.base_url, bodies, c, stream))
                        else:
                            wall = with_collector(server.base_url, prompts, c, args.max_tokens, work, stream)
                        best[mode, kind, c] = min(best.get((mode, kind, c), float("inf")), wall)
    print(f"{args.n} requests per trial (max_tokens={args.max_tokens}), best of {args.repeats}, local stories260K server")
    print(f"{'mode':>6} {'concurrency':>11} {'bare req/s':>11} {'collect req/s':>14} {'ratio':>6} {'overhead ms/req':>16}")
    rows = []
    for mode in modes:
        for c in levels:
            b, k = best[mode, "bare", c], best[mode, "collect", c]
            row = {"mode": mode, "concurrency": c, "bare_rps": args.n / b, "collect_rps": args.n / k, "ratio": b / k,
                   "overhead_ms_per_request": (k - b) / args.n * 1000}
            rows.append(row)
            print(f"{mode:>6} {c:>11} {row['bare_rps']:>11.1f} {row['collect_rps']:>14.1f} {row['ratio']:>6.2f} "
                  f"{row['overhead_ms_per_request']:>16.2f}")
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
