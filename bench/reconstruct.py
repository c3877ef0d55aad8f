"""Reconstruction throughput: the file job against the in-process core, worker scaling, stage shares, memory.

Records: the converted ShareGPT and glaive datasets (``kimi-eagle convert``, 8,498 records), repeated
with distinct ids to ``--records``; format ``kimi-k2.5``.
  bare tiktoken   : ``tiktoken.Encoding.encode`` of the completion strings of the first 10,000 records
  in process      : ``reconstruct_record`` over the already-parsed records (first 10,000; fresh cache)
  1 / N workers   : ``reconstruct_file`` end to end (JSONL in, parquet out), tokenizer preloaded, on
                    all records and on the first 10,000
Throughput is records/s (completion tokens/s for the bare encode). Best of ``--repeats``,
interleaved; wall-clock and CPU time (this process and its workers: the steadier measure on a
shared machine). Stage shares: the job's steps timed one by one in CPU time on 10,000 records.
``--memory``: peak RSS of ``kimi-eagle reconstruct`` (a subprocess, 1 worker) at 1x, 10x and 100x
of 1,000 records.
Targets: 1 worker >= 0.8x in process; N workers >= 0.85*N x 1 worker (N = 2), also at 10,000 records.
Usage: python bench/reconstruct.py [--records 20000] [--repeats 2] [--workers 2] [--memory]
"""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kimi_eagle.assets import kimi_dir
from kimi_eagle.chat.encoder import PieceEncoder
from kimi_eagle.chat.formats import get_format
from kimi_eagle.io import parse_line
from kimi_eagle.reconstruct import job as J
from kimi_eagle.reconstruct.convert import convert_file
from kimi_eagle.reconstruct.job import JobOptions, reconstruct_file
from kimi_eagle.reconstruct.record import reconstruct_record
from kimi_eagle.tokenize.tokenizer import KimiTokenizer

SMALL = 10_000


def make_records(tmp: Path, n: int) -> Path:
    """``n`` records: the bundled datasets repeated, ids made distinct (``id#copy``)."""
    base: list[bytes] = []
    for name in ("sharegpt", "glaive"):
        part = tmp / f"{name}.jsonl"
        if not part.exists():
            convert_file(name, None, part)
        base += part.read_bytes().splitlines()
    path = tmp / f"records-{n}.jsonl"
    with open(path, "wb") as out:
        for k in range(n):
            r = json.loads(base[k % len(base)])
            r["id"] = f"{r['id']}#{k // len(base)}"
            out.write(json.dumps(r, ensure_ascii=False).encode() + b"\n")
    return path


def cpu() -> float:
    rs = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(r.ru_utime + r.ru_stime for r in rs)


def stage_shares(src: Path, tok, fmt) -> dict[str, float]:
    """CPU seconds of each step of the file job on ``src``, run one after another (1 worker)."""
    import pyarrow.parquet as pq

    t: dict[str, float] = {}

    def step(name, fn):
        c = time.process_time()
        out = fn()
        t[name] = time.process_time() - c
        return out

    _, starts, _ = step("scan + sha256", lambda: J._shard_starts(src, 256))
    shards = step("read lines", lambda: [J._read_shard(src, o, ln, 256) for o, ln in starts])
    parsed = step("JSON parse", lambda: [[parse_line(raw, ln)[0] for ln, raw in s] for s in shards])
    enc = PieceEncoder(tok)
    rows = step("reconstruct", lambda: [[(reconstruct_record(p.obj, tok, fmt, encoder=enc), p.lineno) for p in s]
                                        for s in parsed])
    dicts = [[{**r.to_dict(), "line": ln} for r, ln in s] for s in rows]
    tables = step("Arrow columns", lambda: [J.rows_table(d) for d in dicts])
    with tempfile.TemporaryDirectory() as d:
        step("shard IPC write + read", lambda: [J.read_shard(J.write_shard(tb, Path(d) / f"{k}.arrow") or
                                                             Path(d) / f"{k}.arrow") for k, tb in enumerate(tables)])
        first: dict = {}
        step("duplicates", lambda: [J.mark_duplicates(tb, first) for tb in tables])

        def merge():
            with pq.ParquetWriter(Path(d) / "out.parquet", J.reconstruction_schema(), use_dictionary=False) as w:
                for tb in tables:
                    w.write_table(tb)
        step("parquet write", merge)
    return t


def peak_rss(src: Path, tmp: Path) -> float:
    """Peak RSS (MB) of ``kimi-eagle reconstruct src`` with 1 worker, in a fresh process."""
    code = ("import resource, sys; from kimi_eagle.apps.cli import main; main(sys.argv[1:]);"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", code, "reconstruct", str(src), "-o", str(tmp / "mem.parquet"),
                          "--no-progress"], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1]) / 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=20_000)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--memory", action="store_true", help="peak RSS at 1x, 10x, 100x of 1,000 records")
    args = p.parse_args()

    tok = KimiTokenizer.from_dir(kimi_dir())
    fmt = get_format("kimi-k2.5")
    tmp = Path(tempfile.mkdtemp(prefix="bench-reconstruct-"))
    big = make_records(tmp, args.records)
    small = make_records(tmp, min(SMALL, args.records))
    records = [json.loads(line) for line in open(small, "rb")]
    encoder = PieceEncoder(tok)
    texts = [b"".join(tok.token_bytes(i) for i in reconstruct_record(r, tok, fmt, encoder=encoder).completion_ids).decode()
             for r in records]
    n_tokens = sum(len(tok.encoding.encode(t, allowed_special="all")) for t in texts)

    def in_process() -> None:
        enc = PieceEncoder(tok)
        for r in records:
            reconstruct_record(r, tok, fmt, encoder=enc)

    def file_job(src: Path, workers: int):
        return lambda: reconstruct_file(src, tmp / f"out-{workers}.parquet", kimi_dir(), "kimi-k2.5",
                                        JobOptions(workers=workers, progress=False), tokenizer=tok)

    runs = {"bare tiktoken": (lambda: [tok.encoding.encode(t, allowed_special="all") for t in texts], len(records)),
            "in process": (in_process, len(records)),
            "1 worker": (file_job(big, 1), args.records), f"{args.workers} workers": (file_job(big, args.workers), args.records),
            "1 worker @10k": (file_job(small, 1), len(records)),
            f"{args.workers} workers @10k": (file_job(small, args.workers), len(records))}
    best = {name: [float("inf"), float("inf")] for name in runs}
    for _ in range(args.repeats):
        for name, (fn, _) in runs.items():
            w, c = time.perf_counter(), cpu()
            fn()
            best[name] = [min(best[name][0], time.perf_counter() - w), min(best[name][1], cpu() - c)]
    load = Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"
    print(f"records: {args.records:,} (and the first {len(records):,}); load average at the end: {load}")
    rate = {name: (runs[name][1] / w, runs[name][1] / c) for name, (w, c) in best.items()}
    print(f"{'bare tiktoken':22s}: {n_tokens / best['bare tiktoken'][0]:12,.0f} completion tokens/s")
    for name in list(runs)[1:]:
        print(f"{name:22s}: {rate[name][0]:10,.0f} records/s wall  {rate[name][1]:10,.0f} records/s of CPU")
    n = args.workers

    def ratio(a: str, b: str) -> str:
        return f"wall {rate[a][0] / rate[b][0]:.2f}, cpu {rate[a][1] / rate[b][1]:.2f}"

    print(f"1 worker / in process            : {ratio('1 worker', 'in process')}  (target >= 0.8)")
    print(f"{n} workers / 1 worker             : wall {rate[f'{n} workers'][0] / rate['1 worker'][0]:.2f}"
          f"  (target >= {0.85 * n:.2f}; wall only: CPU time does not scale)")
    print(f"{n} workers / 1 worker @10k        : wall {rate[f'{n} workers @10k'][0] / rate['1 worker @10k'][0]:.2f}")
    shares = stage_shares(small, tok, fmt)
    total = sum(shares.values())
    print("stage shares (CPU, 1 worker, 10k records): " + ", ".join(f"{k} {v / total:.0%}" for k, v in shares.items()))
    if args.memory:
        for scale in (1, 10, 100):
            print(f"peak RSS at {1000 * scale:,} records: {peak_rss(make_records(tmp, 1000 * scale), tmp):,.0f} MB")
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
