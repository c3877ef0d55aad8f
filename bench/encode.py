"""KimiTokenizer.encode vs bare tiktoken.Encoding.encode on ShareGPT assistant texts, in one run.

Prints MB/s, tokens/s and the ratio (wrapper / bare; target >= 0.95).
Usage: python bench/encode.py [--repeats 5] [--limit N]
"""
from __future__ import annotations

import argparse
import json
import time

from kimi_eagle.assets import data_path, kimi_dir
from kimi_eagle.tokenize.tokenizer import KimiTokenizer


def assistant_texts(limit: int | None) -> list[str]:
    texts = []
    with open(data_path("sharegpt"), encoding="utf-8") as f:
        for line in f:
            for turn in json.loads(line)["conversations"]:
                if turn["from"] == "gpt":
                    texts.append(turn["value"])
    return texts[:limit] if limit else texts


def timed(fn, texts) -> tuple[float, int]:
    start = time.perf_counter()
    n_tokens = sum(len(fn(t)) for t in texts)
    return time.perf_counter() - start, n_tokens


def best_times(fns, texts, repeats: int) -> list[tuple[float, int]]:
    """Best of ``repeats`` for each function, interleaved so machine noise hits both alike."""
    best = [(float("inf"), 0)] * len(fns)
    for _ in range(repeats):
        for k, fn in enumerate(fns):
            best[k] = min(best[k], timed(fn, texts))
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--limit", type=int, default=None)
    args = p.parse_args()
    tok = KimiTokenizer.from_dir(kimi_dir())
    texts = assistant_texts(args.limit)
    mb = sum(len(t.encode()) for t in texts) / 1e6
    bare = lambda t: tok.encoding.encode(t, disallowed_special=())  # noqa: E731
    (t_bare, n_bare), (t_kimi, n_kimi) = best_times([bare, tok.encode], texts, args.repeats)
    print(f"texts: {len(texts):,} assistant turns, {mb:.1f} MB")
    print(f"bare tiktoken   : {mb / t_bare:7.2f} MB/s  {n_bare / t_bare:12,.0f} tokens/s")
    print(f"KimiTokenizer   : {mb / t_kimi:7.2f} MB/s  {n_kimi / t_kimi:12,.0f} tokens/s")
    print(f"ratio (wrapper/bare throughput): {t_bare / t_kimi:.3f}  (target >= 0.95)")
    if n_bare != n_kimi:
        print(f"note: token counts differ ({n_kimi:,} vs {n_bare:,}) because of the long-run cuts")


if __name__ == "__main__":
    main()
