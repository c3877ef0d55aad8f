"""``kimi-eagle reconstruct``: API records (JSONL) -> token IDs, one parquet row per input record.

``reconstruct_file`` runs :func:`~kimi_eagle.reconstruct.record.reconstruct_line` over a JSONL file
with worker processes. Records are cut into shards of ``shard_size`` records; each shard is written
atomically to ``OUT.parts/``; ``resume`` skips finished shards; the final parquet is written
atomically and holds exactly one row per input record (``status`` ``ok`` or ``error`` with the
reason), in input order. ``read_rows`` reads it back.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator

from .completion import CompletionOptions
from .encoder import PieceEncoder
from .formats import FORMATS, TOOL_DECLARATIONS, get_format
from .record import ReconstructOptions, reconstruct_line
from ..io import atomic_path, write_json
from ..tokenize.tokenizer import Tokenizer, load_tokenizer


# --------------------------------------------------------------------------------------------
# Parquet


def _schema():
    import pyarrow as pa

    seg = pa.struct([("kind", pa.string()), ("byte_start", pa.int64()), ("byte_end", pa.int64()),
                     ("tok_start", pa.int64()), ("tok_end", pa.int64())])
    return pa.schema([
        ("id", pa.string()), ("dataset", pa.string()), ("status", pa.string()), ("error", pa.string()),
        ("format", pa.string()), ("prompt_ids", pa.list_(pa.int32())), ("completion_ids", pa.list_(pa.int32())),
        ("n_prompt_tokens", pa.int64()), ("n_completion_tokens", pa.int64()), ("segments", pa.list_(seg)),
        ("flags", pa.list_(pa.string())), ("finish_reason", pa.string()),
        ("billed_completion_tokens", pa.int64()), ("billed_reasoning_tokens", pa.int64()),
        ("provider", pa.string()), ("line", pa.int64()),
    ])


ID_COLUMNS = ("prompt_ids", "completion_ids")


def _int_lists(lists: list[list[int]]) -> "Any":
    """A ``list<int32>`` column: one flat list converted by numpy (about twice pyarrow's nested conversion)."""
    import numpy as np
    import pyarrow as pa

    flat: list[int] = []
    offsets = np.zeros(len(lists) + 1, dtype=np.int32)
    for k, ids in enumerate(lists):
        flat += ids
        offsets[k + 1] = len(flat)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.array(flat, dtype=np.int32)))


def write_rows(rows: list[dict[str, Any]], path: Path) -> None:
    """Write row dicts (``reconstruct_line``'s) as a parquet of the reconstruction schema, atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = _schema()
    columns = {f.name: _int_lists([r[f.name] for r in rows]) if f.name in ID_COLUMNS
               else pa.array([r[f.name] for r in rows], type=f.type) for f in schema}
    with atomic_path(path) as tmp:
        pq.write_table(pa.table(columns, schema=schema), tmp, use_dictionary=False)


def read_rows(path: str | os.PathLike) -> "Any":
    """A reconstruction parquet as a pandas DataFrame (list columns as Python lists/arrays)."""
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pandas()


# --------------------------------------------------------------------------------------------
# Batch


def _shard_starts(path: Path, shard_size: int) -> tuple[int, list[tuple[int, int]]]:
    """Count the records and find where each shard starts: ``(n_records, [(byte offset, line number)])``."""
    starts: list[tuple[int, int]] = []
    n = offset = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if raw.strip():
                if n % shard_size == 0:
                    starts.append((offset, lineno))
                n += 1
            offset += len(raw)
    return n, starts


def _read_shard(path: Path, offset: int, lineno: int, shard_size: int) -> list[tuple[int, bytes]]:
    """The ``shard_size`` records from ``offset`` (workers read their own lines: nothing big is pickled)."""
    lines: list[tuple[int, bytes]] = []
    with open(path, "rb") as f:
        f.seek(offset)
        for raw in f:
            if raw.strip():
                lines.append((lineno, raw))
                if len(lines) == shard_size:
                    break
            lineno += 1
    return lines


_W: dict[str, Any] = {}  # per-process worker state: tokenizer, its encoder, format, options, parts dir


def _init_worker(tokenizer_dir: str, format_name: str, tool_declaration: str, options: CompletionOptions, parts: str,
                 tok: Any = None) -> None:
    tok = tok or load_tokenizer(tokenizer_dir)
    _W.update(tok=tok, encoder=PieceEncoder(tok), fmt=get_format(format_name, tok, tool_declaration), options=options,
              parts=Path(parts))


def _run_shard(job: tuple[int, str, int, int, int]) -> tuple[int, int]:
    k, path, offset, lineno, shard_size = job
    lines = _read_shard(Path(path), offset, lineno, shard_size)
    tok, encoder, fmt, options = _W["tok"], _W["encoder"], _W["fmt"], _W["options"]
    rows = [reconstruct_line(raw, lineno, tok, fmt, options, encoder) for lineno, raw in lines]
    write_rows(rows, _W["parts"] / f"shard-{k:06d}.parquet")
    return k, len(rows)


def _manifest(in_path: Path, tokenizer_dir: str, format_name: str, tool_declaration: str, options: CompletionOptions,
              shard_size: int) -> dict:
    st = in_path.stat()
    with open(in_path, "rb") as f:
        head = hashlib.sha256(f.read(1 << 20)).hexdigest()
    return {"input": str(in_path.resolve()), "size": st.st_size, "head_sha256": head, "tokenizer": str(Path(tokenizer_dir).resolve()),
            "format": format_name, "tool_declaration": tool_declaration, "options": asdict(options), "shard_size": shard_size}


def _mark_duplicates(table: "Any", first: dict[str, int]) -> "Any":
    """Turn every repeat of an id in ``first`` (id -> line, updated) into an error row."""
    import pyarrow as pa

    dups = set()
    for k, (rid, lineno) in enumerate(zip(table.column("id").to_pylist(), table.column("line").to_pylist())):
        if rid in first:
            dups.add(k)
        else:
            first[rid] = lineno
    if not dups:
        return table
    rows = table.to_pylist()
    for k in dups:
        row = rows[k]
        row.update(status="error", error=f"duplicate id {row['id']!r} (first at line {first[row['id']]})", prompt_ids=[],
                   completion_ids=[], n_prompt_tokens=0, n_completion_tokens=0, segments=[], flags=[])
    return pa.Table.from_pylist(rows, schema=table.schema)


class _Merger:
    """Streams finished shards, in order, into one parquet file (overlapping the workers).

    ``path`` is the temporary path of an ``atomic_path`` block: the output appears when the block ends.
    Used as a context manager, which closes the writer.
    """

    def __init__(self, parts: Path, path: Path) -> None:
        import pyarrow.parquet as pq

        self.parts = parts
        self.writer = pq.ParquetWriter(path, _schema(), use_dictionary=False)
        self.first: dict[str, int] = {}
        self.counts: dict[str, int] = {}

    def add(self, k: int) -> None:
        import pyarrow.parquet as pq

        table = _mark_duplicates(pq.read_table(self.parts / f"shard-{k:06d}.parquet", schema=_schema()), self.first)
        self.writer.write_table(table)
        for status in table.column("status").to_pylist():
            self.counts[status] = self.counts.get(status, 0) + 1

    def __enter__(self) -> "_Merger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.writer.close()


def reconstruct_file(in_path: str | os.PathLike, out_path: str | os.PathLike, tokenizer_dir: str | os.PathLike,
                     format_name: str, workers: int = 1, resume: bool = False,
                     options: CompletionOptions = ReconstructOptions(), shard_size: int = 256,
                     progress: bool = True, tool_declaration: str = "json",
                     tokenizer: Tokenizer | None = None) -> dict[str, int]:
    """Reconstruct every record of ``in_path`` into ``out_path`` (parquet); returns status counts.

    Exactly one row per non-blank input line, in input order. Shards go to ``OUT.parts/`` (atomic
    writes); with ``resume`` the finished shards of an interrupted run with the same input and
    settings are kept, so a killed run resumed equals an uninterrupted one. Finished shards are
    streamed into the output in order while workers go on; the output appears atomically at the end.
    ``tokenizer``: an already loaded tokenizer of ``tokenizer_dir`` (saves loading it again).
    """
    from tqdm import tqdm

    in_path, out_path = Path(in_path), Path(out_path)
    if not in_path.is_file():
        raise FileNotFoundError(f"input not found: {in_path}")
    if format_name not in FORMATS:
        raise ValueError(f"unknown format {format_name!r}; known: {', '.join(FORMATS)}")
    n_lines, starts = _shard_starts(in_path, shard_size)
    if n_lines == 0:
        raise ValueError(f"{in_path} is empty: no records to reconstruct")
    parts = out_path.with_name(out_path.name + ".parts")
    manifest = _manifest(in_path, str(tokenizer_dir), format_name, tool_declaration, options, shard_size)
    mpath = parts / "manifest.json"
    if resume and parts.is_dir() and mpath.is_file():
        old = json.loads(mpath.read_text())
        if old != manifest:
            raise ValueError(f"cannot resume {out_path}: the input or settings changed since {parts} was written")
    else:
        if parts.exists():
            shutil.rmtree(parts)
        parts.mkdir(parents=True)
        write_json(mpath, manifest, indent=1)
    for stale in [*parts.glob("*.tmp*"), *out_path.parent.glob(f".{out_path.name}.*.tmp")]:
        stale.unlink()  # left by a killed write
    done = {int(p.stem.split("-")[1]) for p in parts.glob("shard-*.parquet")}
    n_shards = (n_lines + shard_size - 1) // shard_size
    jobs = ((k, str(in_path), offset, lineno, shard_size) for k, (offset, lineno) in enumerate(starts) if k not in done)
    bar = tqdm(total=n_lines, unit="rec", desc="reconstruct", disable=not progress, file=sys.stderr)
    tok = tokenizer or load_tokenizer(tokenizer_dir)

    def consume(results: Iterator[tuple[int, int]], merger: _Merger) -> None:
        for k in range(n_shards):
            if k not in done:
                got, _ = next(results)
                assert got == k, (got, k)
            merger.add(k)
            bar.update(min(shard_size, n_lines - k * shard_size))

    with atomic_path(out_path) as tmp, _Merger(parts, tmp) as merger:
        if workers <= 1:
            _init_worker(str(tokenizer_dir), format_name, tool_declaration, options, str(parts), tok)
            consume(map(_run_shard, jobs), merger)
        else:
            import multiprocessing as mp

            ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context("spawn")
            init_tok = tok if ctx.get_start_method() == "fork" else None
            init_args = (str(tokenizer_dir), format_name, tool_declaration, options, str(parts), init_tok)
            with ctx.Pool(workers, _init_worker, init_args) as pool:
                consume(pool.imap(_run_shard, jobs), merger)
    bar.close()
    shutil.rmtree(parts)
    return merger.counts


# --------------------------------------------------------------------------------------------
# CLI


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="API records (JSONL)")
    p.add_argument("-o", "--output", required=True, help="output parquet")
    p.add_argument("--tokenizer", required=True, help="tokenizer directory (Kimi or HF)")
    p.add_argument("--format", default="kimi-k2.5", choices=FORMATS, help="chat format (default kimi-k2.5)")
    p.add_argument("--tool-declaration", choices=TOOL_DECLARATIONS, default="json",
                   help="K2.5 tools as compact JSON (the template default) or TypeScript (Moonshot's tools_ts_str)")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--resume", action="store_true", help="keep the finished shards of an interrupted run")
    p.add_argument("--shard-size", type=int, default=256, help="records per shard (the unit of resumption)")
    p.add_argument("--omit-think-end-before-tools", action="store_true",
                   help="no </think> when the model goes from reasoning straight into tool calls")
    p.add_argument("--keep-tool-ids", action="store_true", help="keep the API's tool-call ids (default: functions.NAME:IDX)")
    p.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> int:
    options = ReconstructOptions(omit_think_end_before_tools=args.omit_think_end_before_tools,
                                 keep_tool_ids=args.keep_tool_ids)
    counts = reconstruct_file(args.input, args.output, args.tokenizer, args.format, workers=args.workers,
                              resume=args.resume, options=options, shard_size=args.shard_size,
                              progress=not args.no_progress, tool_declaration=args.tool_declaration)
    total = sum(counts.values())
    print(f"{args.output}: {total} rows, " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 0
