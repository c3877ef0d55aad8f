"""Peak memory of ``kimi-eagle serve`` across rejected 15 MB prompts, and the longest ``/health`` wait meanwhile.

Starts ``serve`` on stories260K (``LocalServer``), records its idle RSS, then sends ``--prompts`` chat requests, one
after another, each a JSON body with one user message of ``--mb`` MB of story text (stories260K's context is 512
tokens, so each is refused), while a thread polls ``/health`` every 0.1 s and another samples the server's RSS every
0.05 s. Prints the idle, peak and final RSS (MB), their ratios to idle, the statuses the prompts got and the longest
``/health`` latency (s). Usage: python bench/serve_memory.py [--prompts 10] [--mb 15] [--deadline 100]
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

from kimi_eagle.apps.api.server import LocalServer
from kimi_eagle.assets import stories_dir

SENTENCE = "Once upon a time, there was a little girl named Lily. She loved to play outside in the sunshine. "


def big_body(mb: float) -> bytes:
    size = int(mb * 1_000_000)
    text = (SENTENCE * (size // len(SENTENCE) + 1))[:size]
    return json.dumps({"model": "stories260K", "messages": [{"role": "user", "content": text}], "max_tokens": 4}).encode()


class Watch:
    """Samples a process's RSS and polls ``/health`` in two threads until stopped."""

    def __init__(self, pid: int, health_url: str) -> None:
        self.proc, self.url = psutil.Process(pid), health_url
        self.peak_rss = self.proc.memory_info().rss
        self.max_latency = 0.0
        self.health_failures = 0
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=f, daemon=True) for f in (self._sample, self._poll)]

    def _sample(self) -> None:
        while not self.stop.is_set():
            self.peak_rss = max(self.peak_rss, self.proc.memory_info().rss)
            time.sleep(0.05)

    def _poll(self) -> None:
        with httpx.Client(timeout=60) as client:
            while not self.stop.is_set():
                t0 = time.perf_counter()
                try:
                    ok = client.get(self.url).status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.max_latency = max(self.max_latency, time.perf_counter() - t0)
                self.health_failures += not ok
                time.sleep(0.1)

    def __enter__(self) -> "Watch":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=70)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--mb", type=float, default=15.0)
    ap.add_argument("--deadline", type=float, default=100.0, help="stop sending after this many seconds")
    ap.add_argument("--format", default=None, help="serve's chat format (default: the model's plain format; "
                    "kimi-k2.5 renders the K2.5 format, so the prompt is tokenised before it can be refused)")
    args = ap.parse_args()
    body = big_body(args.mb)
    mb = 1 << 20
    with tempfile.TemporaryDirectory() as tmp, LocalServer(
            stories_dir(), Path(tmp) / "engine.jsonl", *(["--format", args.format] if args.format else [])) as srv:
        root = srv.base_url.removesuffix("/v1")
        time.sleep(0.5)
        idle = psutil.Process(srv.pid).memory_info().rss
        statuses: collections.Counter = collections.Counter()
        start = time.monotonic()
        with Watch(srv.pid, root + "/health") as watch, httpx.Client(timeout=120) as client:
            for _ in range(args.prompts):
                if time.monotonic() - start > args.deadline:
                    statuses["not sent (deadline)"] += 1
                    continue
                r = client.post(srv.base_url + "/chat/completions", content=body,
                                headers={"Content-Type": "application/json"})
                statuses[r.status_code] += 1
            time.sleep(1.0)
        final = psutil.Process(srv.pid).memory_info().rss
        elapsed = time.monotonic() - start
    print(f"format {args.format or 'default'}; body {len(body) / 1e6:.1f} MB x {args.prompts}; statuses {dict(statuses)}; {elapsed:.1f} s")
    print(f"idle RSS {idle / mb:.0f} MB; peak RSS {watch.peak_rss / mb:.0f} MB ({watch.peak_rss / idle:.2f}x idle); "
          f"final RSS {final / mb:.0f} MB ({final / idle:.2f}x idle)")
    print(f"/health max latency {watch.max_latency:.3f} s; /health failures {watch.health_failures}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
