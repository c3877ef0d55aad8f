"""`kimi-eagle export-data` throughput vs reading the same parquet alone (rows/s, ratio).

The parquet holds reconstructed-row-shaped records (``status``, ``prompt_ids``, ``completion_ids``,
``flags``) built from real text (Alpaca outputs) tokenised with stories260K's tokenizer, repeated to
``--rows``. Baseline: ``pyarrow.parquet`` reading the file and converting every row to Python (what
any exporter must do at least). Measured: the whole ``export_data`` call per target (validation,
drop reasons, draft vocab, every file written atomically). Best of ``--repeats``, interleaved.

    python bench/export_data.py [--rows 20000] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from kimi_eagle.apps.interop.export_data import TARGETS, export_data
from kimi_eagle.assets import data_path, stories_dir
from kimi_eagle.tokenize.tokenizer import HFTokenizer


def make_parquet(path: Path, n_rows: int) -> None:
    tok = HFTokenizer.from_dir(stories_dir())
    items = json.loads(data_path("alpaca").read_text())[:200]
    base = [(tok.encode(it.get("instruction", "")), tok.encode(it.get("output", ""))) for it in items]
    rows = [{"id": f"r{k}", "status": "ok", "prompt_ids": base[k % len(base)][0],
             "completion_ids": base[k % len(base)][1], "flags": []} for k in range(n_rows)]
    schema = pa.schema([("id", pa.string()), ("status", pa.string()), ("prompt_ids", pa.list_(pa.int32())),
                        ("completion_ids", pa.list_(pa.int32())), ("flags", pa.list_(pa.string()))])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "rows.parquet"
        make_parquet(src, args.rows)
        best = {"read": float("inf"), **{t: float("inf") for t in TARGETS}}
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            n = sum(len(b.to_pylist()) for b in pq.ParquetFile(src).iter_batches(batch_size=4096))
            best["read"] = min(best["read"], time.perf_counter() - t0)
            assert n == args.rows
            for to in TARGETS:
                t0 = time.perf_counter()
                m = export_data(src, to, Path(d) / to, vocab_size=512, draft_vocab_size=64)
                best[to] = min(best[to], time.perf_counter() - t0)
                assert m["rows_written"] == args.rows
        out = {"rows": args.rows, "read_rows_per_s": round(args.rows / best["read"])}
        for to in TARGETS:
            out[f"{to}_rows_per_s"] = round(args.rows / best[to])
            out[f"{to}_time_ratio_vs_read"] = round(best[to] / best["read"], 2)
        print(json.dumps(out))


if __name__ == "__main__":
    main()
