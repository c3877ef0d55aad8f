"""Alignment + classification throughput against encoding the same texts, in one run.

Workload: the labelled benchmark of ``kimi-eagle simulate`` (real converted conversations with one
injected effect per record: 20% identical, 80% differing) — engine IDs against reconstructed IDs
with their segments. Baseline: ``KimiTokenizer.encode`` of the same completion texts.
Prints both times and the ratio diff / encode (target <= 0.5), best of interleaved repeats.
Usage: python bench/diff.py [--per-effect 40] [--repeats 5] [--source sharegpt ...]
"""
from __future__ import annotations

import argparse
import time

from kimi_eagle.assets import kimi_dir
from kimi_eagle.chat.encoder import PieceEncoder
from kimi_eagle.chat.formats import get_format
from kimi_eagle.diff.classify import classify
from kimi_eagle.diff.simulate import load_source_records, simulate_samples
from kimi_eagle.reconstruct.record import reconstruct_record
from kimi_eagle.tokenize.tokenizer import KimiTokenizer, ids_to_bytes


def workload(tok, per_effect: int, seed: int, sources: list[str]):
    fmt = get_format("kimi-k2.5", tok)
    samples = simulate_samples(load_source_records(sources), tok, per_effect=per_effect, seed=seed)
    pairs, texts = [], []
    encoder = PieceEncoder(tok)
    for s in samples:
        row = reconstruct_record(s.api, tok, fmt, encoder=encoder)
        pairs.append((s.engine_ids, row.completion_ids, row.segments))
        texts.append(ids_to_bytes(tok, row.completion_ids).decode("utf-8"))
    return pairs, texts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--per-effect", type=int, default=40)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--source", action="append", default=None,
                   help="converted datasets (default glaive + reason-tool-use + sharegpt; sharegpt alone has longer texts)")
    args = p.parse_args()
    tok = KimiTokenizer.from_dir(kimi_dir())
    start = time.perf_counter()
    for table in ("token_table", "token_lengths", "special_mask", "has_empty_token"):  # what the diff reads
        getattr(tok, table)  # built once per tokenizer
    t_table = time.perf_counter() - start
    pairs, texts = workload(tok, args.per_effect, args.seed, args.source or ["glaive", "reason-tool-use", "sharegpt"])
    mb = sum(len(t.encode()) for t in texts) / 1e6
    n_tokens = sum(len(b) for _, b, _ in pairs)
    classify(tok, *pairs[0])  # warm caches

    verdicts = [classify(tok, a, b, segs).verdict for a, b, segs in pairs]
    groups = {"all": list(range(len(pairs)))}
    for v in ("exact", "bpe_split", "semantic"):
        groups[v] = [k for k, x in enumerate(verdicts) if x == v]

    def encode(idx):
        return sum(len(tok.encode(texts[k], allow_special=True)) for k in idx)

    def diff(idx):
        return sum(len(classify(tok, *pairs[k]).hunks) for k in idx)

    best: dict[tuple[str, str], float] = {}
    for _ in range(args.repeats):  # interleaved, best of each
        for name, idx in groups.items():
            for what, fn in (("encode", encode), ("diff", diff)):
                t0 = time.perf_counter()
                fn(idx)
                dt = time.perf_counter() - t0
                best[name, what] = min(best.get((name, what), dt), dt)
    print(f"workload: {len(pairs):,} simulated records, {mb:.2f} MB, {n_tokens:,} reconstructed tokens; "
          f"one-time byte table {t_table * 1e3:.0f} ms")
    print(f"{'records':>10} {'n':>5} {'encode ms':>10} {'diff ms':>9} {'diff/encode':>12}")
    for name, idx in groups.items():
        e, d = best[name, "encode"], best[name, "diff"]
        print(f"{name:>10} {len(idx):5d} {e * 1e3:10.1f} {d * 1e3:9.1f} {d / e:12.3f}")
    ratio = best["all", "diff"] / best["all", "encode"]
    print(f"ratio diff / encode (all records): {ratio:.3f}  (target <= 0.5)")

if __name__ == "__main__":
    main()
