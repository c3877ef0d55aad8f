"""Reconstruction throughput vs bare tiktoken, and worker scaling, in one run.

Records: the converted ShareGPT and glaive datasets (``kimi-eagle convert``), format ``kimi-k2.5``.
  baseline : bare ``tiktoken.Encoding.encode(allowed_special="all")`` of the completion strings
             (the exact strings reconstruction produces, markers included)
  completion only : the completion half of ``reconstruct_record`` (API fields -> segments -> whole-string
             encoding, spans, flags), fresh cache per repeat
  single   : ``reconstruct_record`` over the parsed records in one process (prompt rendering and
             encoding too), fresh cache per repeat
  workers  : ``reconstruct_file`` end to end (JSONL in, parquet out) with 1 and with N workers,
             tokenizer preloaded
Throughput is completion tokens per second. Repeats are interleaved; the best of each counts.
Targets: single / baseline >= 0.8; N workers / 1 worker >= 1.6 (N = 2).
Usage: python bench/reconstruct.py [--repeats 3] [--limit N] [--workers 2]
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from kimi_eagle.assets import kimi_dir
from kimi_eagle.chat.completion import SPAN_FIELDS
from kimi_eagle.chat.encoder import PieceEncoder
from kimi_eagle.chat.formats import get_format
from kimi_eagle.reconstruct.convert import convert_file
from kimi_eagle.reconstruct.job import JobOptions, reconstruct_file
from kimi_eagle.reconstruct.record import ReconstructOptions, parse_turn, reconstruct_record
from kimi_eagle.tokenize.tokenizer import KimiTokenizer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--limit", type=int, default=None, help="conversations per dataset")
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()

    tok = KimiTokenizer.from_dir(kimi_dir())
    fmt = get_format("kimi-k2.5")
    tmp = Path(tempfile.mkdtemp(prefix="bench-reconstruct-"))
    src = tmp / "records.jsonl"
    with open(src, "w") as out:
        for name in ("sharegpt", "glaive"):
            part = tmp / f"{name}.jsonl"
            convert_file(name, None, part, limit=args.limit)
            out.write(part.read_text())
    records = [json.loads(line) for line in open(src)]
    encoder = PieceEncoder(tok)
    rows = [reconstruct_record(r, tok, fmt, encoder=encoder) for r in records]
    texts = [b"".join(tok.token_bytes(i) for i in row.completion_ids).decode() for row in rows]
    n_tokens = sum(row.n_completion_tokens for row in rows)
    encode = tok.encoding.encode

    def bare() -> int:
        return sum(len(encode(t, allowed_special="all")) for t in texts)

    def single() -> int:
        enc = PieceEncoder(tok)  # no cache carried over from the previous repeat
        return sum(reconstruct_record(r, tok, fmt, encoder=enc).n_completion_tokens for r in records)

    histories = [r["request"]["messages"] for r in records]

    def completion_only() -> int:
        """The completion half of reconstruct_record: API fields -> segments -> IDs, spans, flags."""
        enc, options, n = PieceEncoder(tok), ReconstructOptions(), 0
        for r, history in zip(records, histories):
            segments, _ = fmt.completion_segments(parse_turn(r["response"]), history, options)
            ids, spans, _ = enc.encode_segments_marked(segments)
            [dict(zip(SPAN_FIELDS, s)) for s in spans]
            n += len(ids)
        return n

    def batch(workers: int):
        def run() -> int:
            counts = reconstruct_file(src, tmp / f"out{workers}.parquet", kimi_dir(), "kimi-k2.5",
                                      JobOptions(workers=workers, progress=False), tokenizer=tok)
            assert counts.get("ok", 0) == len(records), counts
            return n_tokens
        return run

    fns = {"bare tiktoken": bare, "completion only": completion_only, "single process": single, "1 worker (file)": batch(1),
           f"{args.workers} workers (file)": batch(args.workers)}
    best = {name: float("inf") for name in fns}
    for _ in range(args.repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            got = fn()
            best[name] = min(best[name], time.perf_counter() - start)
            assert got == n_tokens, (name, got, n_tokens)
    mb = sum(len(t.encode()) for t in texts) / 1e6
    print(f"records: {len(records):,} ({args.limit or 'all'} conversations each of sharegpt, glaive); "
          f"completions {mb:.1f} MB, {n_tokens:,} tokens")
    for name, t in best.items():
        print(f"{name:22s}: {n_tokens / t:12,.0f} completion tokens/s  ({t:.2f} s)")
    ratio_completion = best["bare tiktoken"] / best["completion only"]
    ratio_single = best["bare tiktoken"] / best["single process"]
    ratio_workers = best["1 worker (file)"] / best[f"{args.workers} workers (file)"]
    print(f"completion only / bare tiktoken     : {ratio_completion:.2f}")
    print(f"single process / bare tiktoken      : {ratio_single:.2f}  (target >= 0.8; includes rendering and"
          " encoding every prompt)")
    print(f"{args.workers} workers / 1 worker (end to end)  : {ratio_workers:.2f}  (target >= 1.6)")


if __name__ == "__main__":
    main()
