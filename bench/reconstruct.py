"""Reconstruction throughput: the file job against the in-process core, worker scaling, stage costs, memory.

Records: the converted ShareGPT and glaive datasets (``kimi-eagle convert``, 8,498 records), repeated
with distinct ids (``id#copy``) to ``--records`` (default 100,000) and to ``--small`` (10,000); format ``kimi-k2.5``.
  bare tiktoken : ``tiktoken.Encoding.encode`` of the completion strings of the small set
  in process    : ``reconstruct_record`` over the already-parsed small set (full rows: prompt rendering and
                  encoding included; fresh encoder cache) -- the baseline of issue #28; also run under the
                  job's raised GC threshold (``fewer_collections``): what that setting alone gives the core;
                  the ratios take it as measured inside each child, between its file jobs, on the same records
                  (parsed 10,000 at a time, the parse untimed): both sides under the same machine load
  1 / N workers : ``reconstruct_file`` end to end (JSONL in, parquet out), in a child process that has loaded
                  the tokenizer and warmed up on 1,000 records; one child per input size, so its peak RSS is
                  the memory of that size (1,000 records: the base; the small set 10x, the big set 100x);
                  on the small set also 1 worker at the collector's default threshold
Throughput is records/s, best of ``--repeats`` (the big set: best of ``--big-repeats``), interleaved. Each
run also gives its CPU time (this process and its workers) and its main thread's CPU time: on a loaded
machine the wall clock is shared with other jobs, while "1 worker main-thread CPU / in-process CPU" is what
the wall ratio becomes when a spare core runs the job's helper threads (scan + hash, IPC + parquet writer).
Stage costs: the job's steps timed one by one (CPU, per shard as the job runs them) on the small set, with
the thread or process each runs in; they feed the scaling model printed last (docs/scale.md).
Targets: 1 worker >= 0.8x in process; N workers >= 0.85*N x 1 worker (N = 2), at the big set and at 10,000.
Usage: python bench/reconstruct.py [--records 100000] [--small 10000] [--repeats 3] [--big-repeats 2] [--workers 2]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kimi_eagle.assets import kimi_dir
from kimi_eagle.reconstruct.convert import convert_file

SMALL = 10_000
BASE = 1_000  # the records of the memory base and of each child's warm-up
PLACEHOLDER = "\x00bench-id\x00"
TUNED = "in process, job's GC"  # the in-process path run under the job's GC threshold


def make_records(tmp: Path, n: int) -> Path:
    """``n`` records: the bundled datasets repeated, ids made distinct (``id#copy``); each record is the
    ``json.dumps`` of the converted record with its new id (each base record is serialised once)."""
    path = tmp / f"records-{n}.jsonl"
    if path.exists():
        return path
    base: list[tuple[bytes, str]] = []
    for name in ("sharegpt", "glaive"):
        part = tmp / f"{name}.jsonl"
        if not part.exists():
            convert_file(name, None, part)
        for line in part.read_bytes().splitlines():
            r = json.loads(line)
            base.append((json.dumps({**r, "id": PLACEHOLDER}, ensure_ascii=False).encode(), r["id"]))
    hole = json.dumps(PLACEHOLDER).encode()
    with open(path, "wb") as out:
        for k in range(n):
            text, rid = base[k % len(base)]
            out.write(text.replace(hole, json.dumps(f"{rid}#{k // len(base)}", ensure_ascii=False).encode(), 1) + b"\n")
    return path


def cpu() -> float:
    """CPU seconds of this process, its reaped children and its live ones (a kept worker pool's processes)."""
    rs = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(r.ru_utime + r.ru_stime for r in rs) + live_children_cpu()


def live_children_cpu() -> float:
    """CPU seconds (user + system) of this process's live child processes, from ``/proc`` (0 elsewhere)."""
    me, total, tick = os.getpid(), 0, os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:  # fields after the name: state, ppid, ..., utime (12th), stime (13th)
            total += int(fields[11]) + int(fields[12])
    return total / tick


def timed(fn) -> tuple[float, float, float]:
    """``(wall, CPU of the process and its reaped children, CPU of this thread)`` seconds of ``fn()``."""
    w, c, m = time.perf_counter(), cpu(), time.thread_time()
    fn()
    return time.perf_counter() - w, cpu() - c, time.thread_time() - m


# --------------------------------------------------------------------------------------------
# child: the file job on one input, in a fresh process


def child(src: Path, warm: Path, workers: list[int], repeats: int, out_dir: Path, gc_compare: bool = False) -> dict:
    """Load the tokenizer, warm up on ``warm``, then time ``reconstruct_file`` on ``src`` for each worker
    count (interleaved, ``repeats`` times; ``gc_compare``: also 1 worker at the collector's default threshold),
    each repeat followed by the in-process path on the same records (:func:`in_process_seconds`: the ratio's
    two sides measured side by side, in one process); also the start-up of a pool on one shard. Peak RSS: of
    the first repeat's file jobs (before the in-process path holds parsed records)."""
    from kimi_eagle.reconstruct import job as J
    from kimi_eagle.reconstruct.job import JobOptions, reconstruct_file
    from kimi_eagle.tokenize.tokenizer import KimiTokenizer

    t = time.perf_counter()
    tok = KimiTokenizer.from_dir(kimi_dir())
    load_s = time.perf_counter() - t

    def job(path: Path, n: int):
        """The timed call; the last run's output removed first (untimed): every run writes a new file, as a first
        run does, instead of replacing one (the file system frees the replaced file's blocks inside the rename)."""
        out = out_dir / f"out-{os.getpid()}-{n}.parquet"
        out.unlink(missing_ok=True)
        return lambda: reconstruct_file(path, out, kimi_dir(), "kimi-k2.5", JobOptions(workers=n, progress=False),
                                        tokenizer=tok)

    warm_s = timed(job(warm, 1))[0]
    reset = Path("/proc/self/clear_refs")  # Linux: writing 5 resets the peak RSS (VmHWM) to the current RSS
    if reset.exists():
        reset.write_text("5")
    runs: dict[str, list] = {str(n): [] for n in [*workers, *(["1, default GC"] if gc_compare else []), "in process"]}
    tuned, peak = J.fewer_collections, None
    J.close_worker_pools()  # the first run with workers starts its pool (runs[...][0]); later ones reuse it
    for _ in range(repeats):
        for n in workers:
            runs[str(n)].append(timed(job(src, n)))
        if gc_compare:
            J.fewer_collections = contextlib.nullcontext  # the collector's default threshold, for comparison
            try:
                runs["1, default GC"].append(timed(job(src, 1)))
            finally:
                J.fewer_collections = tuned
        peak = peak_rss_mb() if peak is None else peak  # the file jobs' (the load and warm-up excluded where Linux can)
        runs["in process"].append(in_process_seconds(src, tok))
    one = out_dir / f"one-shard-{os.getpid()}.jsonl"
    one.write_bytes(b"".join(warm.read_bytes().splitlines(keepends=True)[:256]))
    startup = {str(n): min(cold(job(one, n), J) for _ in range(3)) for n in (1, 2)}  # a new pool each time
    return {"runs": runs, "load_s": load_s, "warm_s": warm_s, "one_shard_s": startup, "fork_s": fork_seconds(),
            "rss_mb": peak, "worker_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}


def cold(fn, J) -> float:
    """Wall seconds of ``fn()`` with no worker pool kept from an earlier run (one is started if ``fn`` needs it)."""
    J.close_worker_pools()
    return timed(fn)[0]


def in_process_seconds(src: Path, tok) -> tuple[float, float, float]:
    """``(wall, CPU, main-thread CPU)`` of ``reconstruct_record`` over the records of ``src`` with one fresh
    encoder, as "in process" runs (the collector's default threshold), parsed 10,000 records at a time
    outside the timed part."""
    import itertools

    from kimi_eagle.chat.encoder import PieceEncoder
    from kimi_eagle.chat.formats import get_format
    from kimi_eagle.reconstruct.record import reconstruct_record

    fmt, enc, total = get_format("kimi-k2.5"), PieceEncoder(tok), (0.0, 0.0, 0.0)
    with open(src, "rb") as f:
        while chunk := [json.loads(line) for line in itertools.islice(f, 10_000)]:
            part = timed(lambda: [reconstruct_record(r, tok, fmt, encoder=enc) and None for r in chunk])
            total = tuple(a + b for a, b in zip(total, part))
    return total


def peak_rss_mb() -> float:
    """This process's peak RSS in MB (``VmHWM``, which ``clear_refs`` resets; else the lifetime peak)."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def fork_seconds() -> float:
    """The serial part of starting a worker: one ``fork`` of this process (which holds the tokenizer), best of 5."""
    best = 9e9
    for _ in range(5):
        t = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        best = min(best, time.perf_counter() - t)
        os.waitpid(pid, 0)
    return best


def run_child(src: Path, warm: Path, workers: list[int], repeats: int, tmp: Path, gc_compare: bool = False) -> dict:
    cmd = [sys.executable, __file__, "--child", str(src), "--warm", str(warm), "--workers-list",
           ",".join(map(str, workers)), "--repeats", str(repeats), "--tmp", str(tmp)] + (["--gc-compare"] if gc_compare else [])
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"child failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.splitlines()[-1])


# --------------------------------------------------------------------------------------------
# stage costs and the scaling model


WHERE = {"scan + hash": "scan thread", "read lines": "worker", "JSON parse": "worker", "reconstruct": "worker",
         "row dicts": "worker", "Arrow columns": "worker", "shard info": "worker", "IPC shard write": "worker*",
         "IPC shard read": "parent", "duplicates": "parent", "parquet write": "writer thread"}


def stage_costs(src: Path, tok, fmt) -> dict[str, float]:
    """CPU seconds of each step of the file job on ``src``, in the job's order: per shard, each record parsed
    and reconstructed in turn (as ``reconstruct_line`` does), then the shard's table, IPC file and parquet."""
    import pyarrow.parquet as pq

    from kimi_eagle.chat.encoder import PieceEncoder
    from kimi_eagle.io import parse_line
    from kimi_eagle.reconstruct import job as J
    from kimi_eagle.reconstruct.record import reconstruct_record

    t = dict.fromkeys(WHERE, 0.0)
    clock = time.thread_time

    def step(name, fn):
        c = clock()
        out = fn()
        t[name] += clock() - c
        return out

    J.rows_table([])  # pyarrow's first conversion imports pandas: not a cost of the steps
    c = time.process_time()  # the scan runs in threads: the process's CPU time while it alone runs
    _, starts, _ = J._shard_starts(src, 256)
    t["scan + hash"] = time.process_time() - c
    ends = [o for o, _ in starts[1:]] + [src.stat().st_size]
    enc, first = PieceEncoder(tok, packed=True), {}  # the job's encoder: IDs packed for the Arrow columns
    with tempfile.TemporaryDirectory() as d, pq.ParquetWriter(Path(d) / "o.parquet", J.reconstruction_schema(),
                                                              use_dictionary=False) as writer, J.fewer_collections():
        for k, ((offset, lineno), end) in enumerate(zip(starts, ends)):
            lines = step("read lines", lambda: J._read_shard(src, offset, lineno, 256, end))
            dicts = []
            for ln, raw in lines:
                line = step("JSON parse", lambda: parse_line(raw, ln)[0])
                row = step("reconstruct", lambda: reconstruct_record(line.obj, tok, fmt, encoder=enc))
                dicts.append(step("row dicts", lambda: {**row.to_dict(), "line": ln}))
            table = step("Arrow columns", lambda: J.rows_table(dicts))
            info = step("shard info", lambda: J.ShardInfo.of(table))
            path = Path(d) / J.shard_name(k)
            step("IPC shard write", lambda: J.write_shard(table, path))
            step("IPC shard read", lambda: J.read_shard(path))
            step("duplicates", lambda: J._duplicate_rows(info, first))
            step("parquet write", lambda: writer.write_table(table))
    return t


def model_seconds(per_record: dict[str, float], fixed: dict[str, float], records: int, workers: int, cores: int,
                  outputs: int = 1) -> float:
    """Predicted wall seconds of the file job: fixed start-up, then the slowest of the pipeline's lanes;
    ``outputs``: the input split into that many files, one job each (``workers`` in all, run side by side).

    ``per_record`` (seconds a record): ``worker`` (a worker's CPU), ``parent`` (the parent's GIL-holding merge
    work: IPC read + duplicates; none with one worker), ``writer`` (the parquet encode, one thread), ``scan``
    (the scan + SHA-256, one thread). ``fixed``: ``start`` (once a run), ``pool`` (a pool's start beyond its
    forks: the workers' first-shard warm-up, in parallel; only with workers), ``per_worker`` (one fork, serial
    in the parent), ``tail`` (the last shard's parquet write and close). Lanes: the workers
    (``records * worker / workers``), the writer thread, the scan thread, the parent, and the CPU they all
    share (``records * (worker + parent + writer + scan) / cores``).
    """
    parent = per_record["parent"] if workers > outputs else 0.0
    each = records / outputs  # the records of one job: its writer, scan and merge are its own
    lanes = [records * per_record["worker"] / workers, each * per_record["writer"], each * per_record["scan"],
             each * parent, records * (per_record["worker"] + parent + per_record["writer"] + per_record["scan"]) / cores]
    start = fixed["start"] + (fixed["pool"] + fixed["per_worker"] * workers / outputs if workers > outputs else 0.0)
    return start + max(lanes) + fixed["tail"]


# --------------------------------------------------------------------------------------------
# main


def in_process_runs(small: Path, repeats: int) -> tuple[dict, int, int]:
    """Best ``(wall, cpu, main)`` of the bare encode and of ``reconstruct_record`` over the parsed small set."""
    from kimi_eagle.chat.encoder import PieceEncoder
    from kimi_eagle.chat.formats import get_format
    from kimi_eagle.reconstruct.record import reconstruct_record
    from kimi_eagle.tokenize.tokenizer import KimiTokenizer

    tok = KimiTokenizer.from_dir(kimi_dir())
    fmt = get_format("kimi-k2.5")
    records = [json.loads(line) for line in open(small, "rb")]
    encoder = PieceEncoder(tok)
    texts = [b"".join(tok.token_bytes(i) for i in reconstruct_record(r, tok, fmt, encoder=encoder).completion_ids).decode()
             for r in records]
    n_tokens = sum(len(tok.encoding.encode(t, allowed_special="all")) for t in texts)

    def in_process() -> None:
        enc = PieceEncoder(tok)
        for r in records:
            reconstruct_record(r, tok, fmt, encoder=enc)

    def in_process_tuned() -> None:
        with fewer_collections():
            in_process()

    from kimi_eagle.reconstruct.job import fewer_collections

    runs: dict[str, list] = {"bare tiktoken": [], "in process": [], TUNED: []}
    for _ in range(repeats):
        runs["bare tiktoken"].append(timed(lambda: [tok.encoding.encode(t, allowed_special="all") for t in texts]))
        runs["in process"].append(timed(in_process))
        runs[TUNED].append(timed(in_process_tuned))
    return {name: best_of(r) for name, r in runs.items()}, n_tokens, len(records)


def best_of(runs: list) -> list[float]:
    return [min(r[i] for r in runs) for i in range(3)]


def report(args, base: dict, inproc: dict, n_tokens: int, n_small: int, children: dict, costs: dict) -> None:
    n, big, small = args.workers, children["big"], children["small"]
    rate = {name: [n_small / v for v in inproc[name]] for name in ("in process", TUNED)}
    rate["in process @big, beside the jobs"] = [args.records / v for v in best_of(big["runs"]["in process"])]
    rate["in process @small, beside"] = [n_small / v for v in best_of(small["runs"]["in process"])]
    for label, c, size in (("", big, args.records), (" @small", small, n_small)):
        for w in ("1", str(n)):
            rate[f"{w} worker{'s' if w != '1' else ''}{label}"] = [size / v for v in best_of(c["runs"][w])]
    print(f"records: {args.records:,} (big) and {n_small:,} (small); load average {os.getloadavg()[0]:.2f} "
          f"{os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f} (1/5/15 min) at the end; {os.cpu_count()} cores")
    print(f"{'bare tiktoken':26s}: {n_tokens / inproc['bare tiktoken'][0]:12,.0f} completion tokens/s")
    for name, (w, c, m) in rate.items():
        main = f"  {m:9,.0f} records/s of main-thread CPU" if name.startswith("1 ") else ""
        print(f"{name:26s}: {w:9,.0f} records/s wall  {c:9,.0f} records/s of CPU{main}")
    one, one_small, nw, nw_small = "1 worker", "1 worker @small", f"{n} workers", f"{n} workers @small"
    big_in, small_in = rate["in process @big, beside the jobs"], rate["in process @small, beside"]
    print(f"1 worker / in process      : wall {rate[one][0] / big_in[0]:.2f} (big), "
          f"{rate[one_small][0] / small_in[0]:.2f} (small; each against the in-process path on the same records, "
          f"run between the jobs); main-thread CPU / in-process CPU {rate[one][2] / big_in[1]:.2f} (big), "
          f"{rate[one_small][2] / small_in[1]:.2f} (small)"
          f"  (target >= 0.8); against the in-process path run first with the job's GC threshold: main-thread CPU "
          f"{rate[one_small][2] / rate[TUNED][1]:.2f} (small)")
    default_gc = [n_small / v for v in best_of(small["runs"]["1, default GC"])]
    print(f"1 worker @small at the collector's default threshold: {default_gc[2]:,.0f} records/s of main-thread CPU "
          f"(the job's raised threshold: {rate[one_small][2] / default_gc[2]:.2f}x)")
    first = n_small / small["runs"][str(n)][0][0]  # the first run: its pool started (forks, first page copies)
    print(f"{n} workers / 1 worker       : wall {rate[nw][0] / rate[one][0]:.2f} (big), "
          f"{rate[nw_small][0] / rate[one_small][0]:.2f} (small)  (target >= {0.85 * n:.2f}; wall only; best runs: "
          f"their pool kept from the run before); the small set's first run, which started its pool: "
          f"{first:,.0f} records/s, {first / rate[one_small][0]:.2f}x")
    total = sum(costs.values())
    print(f"stage costs (CPU, {n_small:,} records, shard by shard; * = the writer thread with 1 worker):")
    for name, sec in costs.items():
        print(f"  {name:18s} {sec / n_small * 1e6:7.1f} us/record  {sec / total:5.1%}  [{WHERE[name]}]")
    print(f"peak RSS of the timed runs (child process; 1 and {n} workers): {BASE:,} records {base['rss_mb']:,.0f} MB; "
          f"{n_small:,} {small['rss_mb']:,.0f} MB ({small['rss_mb'] / base['rss_mb']:.2f}x); "
          f"{args.records:,} {big['rss_mb']:,.0f} MB ({big['rss_mb'] / base['rss_mb']:.2f}x); largest worker "
          f"{base['worker_rss_mb']:,.0f} / {small['worker_rss_mb']:,.0f} / {big['worker_rss_mb']:,.0f} MB")
    if args.records > n_small:  # what still grows: the duplicate check's id -> first line map, one entry an id
        grow = (big["rss_mb"] - small["rss_mb"]) * 2**20 / (args.records - n_small)
        print(f"peak RSS growth from {n_small:,} to {args.records:,} records: {grow:,.0f} bytes a record")
    model(costs, n_small, base, big, args.records)


def model(costs: dict, n_small: int, base: dict, big: dict, records: int) -> None:
    per = {k: v / n_small for k, v in costs.items()}
    per_record = {"worker": sum(per[k] for k, where in WHERE.items() if where.startswith("worker")),
                  "parent": per["IPC shard read"] + per["duplicates"], "writer": per["parquet write"],
                  "scan": per["scan + hash"]}
    one_shard = base["one_shard_s"]  # the first run's own work is not start-up:
    fixed = {"start": base["load_s"] + max(base["warm_s"] - BASE * per_record["worker"], 0.0), "per_worker": base["fork_s"],
             "pool": max(one_shard["2"] - one_shard["1"] - 2 * base["fork_s"], 0.0), "tail": per["parquet write"] * 256}
    print(f"scaling model inputs: per record worker {per_record['worker'] * 1e6:.1f} us, parent merge "
          f"{per_record['parent'] * 1e6:.1f} us, parquet writer {per_record['writer'] * 1e6:.1f} us, scan "
          f"{per_record['scan'] * 1e6:.1f} us; start-up {fixed['start']:.2f} s (tokenizer {base['load_s']:.2f} s + "
          f"first-run costs), a pool {fixed['pool'] * 1e3:.0f} ms + {fixed['per_worker'] * 1e3:.1f} ms a worker (fork) "
          f"(one shard: 1 worker {one_shard['1'] * 1e3:.0f} ms, 2 workers {one_shard['2'] * 1e3:.0f} ms)")
    ceiling = per_record["worker"] / per_record["writer"]
    per_output = max(int(ceiling), 1)  # workers one output file keeps busy
    for n_rec in (records, 10_000_000):
        t1 = model_seconds(per_record, fixed, n_rec, 1, 2)
        cells = [f"{n} workers on {n} cores {t1 / model_seconds(per_record, fixed, n_rec, n, n):.1f}x" for n in (2, 16, 64)]
        split = [f"{n} cores in {k} outputs {t1 / model_seconds(per_record, fixed, n_rec, n, n, k):.1f}x"
                 for n, k in ((16, -(-16 // per_output)), (64, -(-64 // per_output)))]
        print(f"model at {n_rec:,} records (1 worker {t1:,.0f} s): " + ", ".join(cells)
              + f"; ceiling of one output (its parquet writer) {ceiling:.0f}x; split: " + ", ".join(split))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--small", type=int, default=SMALL)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--big-repeats", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--warm", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--workers-list", help=argparse.SUPPRESS)
    p.add_argument("--tmp", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--gc-compare", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.warm, [int(w) for w in args.workers_list.split(",")], args.repeats,
                               args.tmp, args.gc_compare)))
        return
    tmp = Path(tempfile.mkdtemp(prefix="bench-reconstruct-"))
    try:
        warm, small, big = (make_records(tmp, n) for n in (BASE, min(args.small, args.records), args.records))
        inproc, n_tokens, n_small = in_process_runs(small, args.repeats)
        workers = [1, args.workers]
        children = {"base": run_child(warm, warm, [1], 1, tmp), "small": run_child(small, warm, workers, args.repeats, tmp, True),
                    "big": run_child(big, warm, workers, args.big_repeats, tmp)}
        from kimi_eagle.chat.formats import get_format
        from kimi_eagle.tokenize.tokenizer import KimiTokenizer

        costs = stage_costs(small, KimiTokenizer.from_dir(kimi_dir()), get_format("kimi-k2.5"))
        report(args, children["base"], inproc, n_tokens, n_small, children, costs)
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
