"""`kimi-eagle export-data` throughput vs a bare parquet read + write of the same columns (rows/s, ratio).

The parquet holds reconstructed-row-shaped records (``status``, ``prompt_ids``, ``completion_ids``,
``flags``) built from real text (Alpaca outputs) tokenised with stories260K's tokenizer, repeated to
``--rows``. Baseline: ``pyarrow.parquet`` reading the file's ID columns and writing them to a new
parquet file (the least any exporter does). Measured: the whole ``export_data`` call per target
(checks, drop reasons, draft vocab, every file written atomically), and its stages: read + row
checks (``collect_rows``), draft vocab, each of the target's files, the manifest (source SHA-256),
each printed with its share of the stages' total. Best of ``--repeats``, interleaved with the
baseline in the same run; wall-clock and CPU time (the machine may be shared: CPU time is the
steadier measure). Target: every target >= 0.5x the baseline's rows/s.

    python bench/export_data.py [--rows 40000] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from kimi_eagle.apps.interop import export_data as ed
from kimi_eagle.assets import data_path, sha256_file, stories_dir
from kimi_eagle.tokenize.tokenizer import HFTokenizer

VOCAB, DRAFT = 512, 64
COLUMNS = ["id", "prompt_ids", "completion_ids"]  # what every target reads


def make_parquet(path: Path, n_rows: int) -> None:
    tok = HFTokenizer.from_dir(stories_dir())
    items = json.loads(data_path("alpaca").read_text())[:200]
    base = [(tok.encode(it.get("instruction", "")), tok.encode(it.get("output", ""))) for it in items]
    rows = [{"id": f"r{k}", "status": "ok", "prompt_ids": base[k % len(base)][0],
             "completion_ids": base[k % len(base)][1], "flags": []} for k in range(n_rows)]
    schema = pa.schema([("id", pa.string()), ("status", pa.string()), ("prompt_ids", pa.list_(pa.int32())),
                        ("completion_ids", pa.list_(pa.int32())), ("flags", pa.list_(pa.string()))])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed(fn) -> tuple[float, float]:
    w, c = time.perf_counter(), cpu()
    fn()
    return time.perf_counter() - w, cpu() - c


def stages(src: Path, out: Path, to: str) -> dict[str, tuple[float, float]]:
    """The stages of one export (the pieces ``export_data`` runs, timed one by one)."""
    got: dict = {}
    t = {}
    t["read + checks"] = timed(lambda: got.update(zip(("rows", "stats"), ed.collect_rows(src, vocab_size=VOCAB))))
    t["draft vocab"] = timed(lambda: got.update(vocab=ed.draft_vocab_for(got["rows"], VOCAB, DRAFT)))
    out.mkdir(parents=True, exist_ok=True)
    rows, vocab = got["rows"], got["vocab"]
    writers = {"tokens": {"rows.jsonl": lambda: ed.write_training_jsonl(out / "rows.jsonl", rows)},
               "specforge": {"prompts.jsonl": lambda: ed.write_training_jsonl(out / "prompts.jsonl", rows),
                             "vocab_mapping.pt": lambda: ed.write_specforge_vocab(out, vocab)},
               "speculators": {"arrow dataset": lambda: ed.write_arrow_dataset(out, rows),
                               "row_ids.jsonl": lambda: ed.write_row_ids(out / "row_ids.jsonl", rows),
                               "vocab files": lambda: ed.write_speculators_vocab(out, vocab)}}
    for name, fn in writers[to].items():
        t[name] = timed(fn)
    t["manifest (sha256)"] = timed(lambda: sha256_file(src))
    return t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=40000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "rows.parquet"
        make_parquet(src, args.rows)

        def baseline() -> None:
            table = pq.read_table(src, columns=COLUMNS)
            pq.write_table(table, Path(d) / "copy.parquet")

        best: dict[str, list[float]] = {}

        def keep(name: str, t: tuple[float, float]) -> None:
            old = best.get(name, [float("inf")] * 2)
            best[name] = [min(old[0], t[0]), min(old[1], t[1])]

        share: dict[str, dict] = {}
        for _ in range(args.repeats):
            keep("baseline read", timed(lambda: pq.read_table(src, columns=COLUMNS)))
            keep("baseline", timed(baseline))
            for to in ed.TARGETS:
                m: dict = {}
                keep(to, timed(lambda: m.update(ed.export_data(src, to, Path(d) / to, vocab_size=VOCAB,
                                                               draft_vocab_size=DRAFT))))
                assert m["rows_written"] == args.rows
                for name, t in stages(src, Path(d) / f"stages-{to}", to).items():
                    old = share.setdefault(to, {}).get(name, (float("inf"),) * 2)
                    share[to][name] = (min(old[0], t[0]), min(old[1], t[1]))
        print(f"rows: {args.rows:,} (machine load average {_load()}); best of {args.repeats}, wall and CPU seconds")
        base_wall, base_cpu = best["baseline"]
        print(f"baseline (parquet read + write of {', '.join(COLUMNS)}): {args.rows / base_wall:,.0f} rows/s "
              f"(wall {base_wall:.3f} s, cpu {base_cpu:.3f} s; the read alone: wall {best['baseline read'][0]:.3f} s)")
        mb = lambda path: f"{path.name} {path.stat().st_size / 1e6:,.0f} MB"  # noqa: E731
        sizes = {to: [mb(Path(d) / to / n) for n in ("rows.jsonl", "prompts.jsonl", "data-00000-of-00001.arrow")
                      if (Path(d) / to / n).exists()] for to in ed.TARGETS}
        print(f"written: baseline {mb(Path(d) / 'copy.parquet')}; " + "; ".join(f"{to} {', '.join(v)}"
                                                                               for to, v in sizes.items()))
        for to in ed.TARGETS:
            wall, cpu_s = best[to]
            print(f"{to:12s}: {args.rows / wall:10,.0f} rows/s  ratio vs baseline: wall {base_wall / wall:.2f}, "
                  f"cpu {base_cpu / cpu_s:.2f}  (target >= 0.5)")
            total_wall, total_cpu = (sum(t[k] for t in share[to].values()) for k in (0, 1))
            for name, (w, c) in share[to].items():
                print(f"    {name:20s} wall {w:6.3f} s ({w / total_wall:4.0%})  cpu {c:6.3f} s ({c / total_cpu:4.0%})")


def _load() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "unknown"


if __name__ == "__main__":
    main()
