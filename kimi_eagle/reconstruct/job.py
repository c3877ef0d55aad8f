"""``kimi-eagle reconstruct``: API records (JSONL) -> token IDs, one parquet row per input record.

``reconstruct_file`` runs :func:`~kimi_eagle.reconstruct.record.reconstruct_line` over a JSONL file
with worker processes. Records are cut into shards of ``shard_size`` records; each shard is written
atomically to ``OUT.parts/``; ``resume`` skips finished shards; the final parquet is written
atomically and holds exactly one row per input record (``status`` ``ok`` or ``error`` with the
reason), in input order. ``read_rows`` reads it back.

Arguments are checked before any work (positive sizes, an output path that is not a folder, a
loadable tokenizer, a UTF-8 input); one run at a time per output (``.OUT.lock``, released by the OS
however the run ends); the resume manifest holds the SHA-256 of the whole input, streamed.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

from kimi_eagle.chat.completion import CompletionOptions
from kimi_eagle.chat.encoder import PieceEncoder
from kimi_eagle.chat.formats import FORMATS, get_format
from kimi_eagle.io import UTF8_BOM, atomic_path, check_encoding, iter_raw_lines, write_json
from kimi_eagle.reconstruct.record import ReconstructOptions, error_row, reconstruct_line
from kimi_eagle.tokenize.tokenizer import Tokenizer, load_tokenizer

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
        ("provider", pa.string()), ("usage_error", pa.string()), ("line", pa.int64()),
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
    try:
        table = _table(rows, schema)
    except (pa.ArrowException, OverflowError, UnicodeError, TypeError, ValueError):
        table = _table([_storable_row(r, schema) for r in rows], schema)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, use_dictionary=False)


def _table(rows: list[dict[str, Any]], schema: "Any") -> "Any":
    import pyarrow as pa

    columns = {f.name: _int_lists([r[f.name] for r in rows]) if f.name in ID_COLUMNS
               else pa.array([r[f.name] for r in rows], type=f.type) for f in schema}
    return pa.table(columns, schema=schema)


def _storable_row(row: dict[str, Any], schema: "Any") -> dict[str, Any]:
    """``row`` if parquet can hold it, else the error row of its record naming why (a value the checks missed)."""
    import pyarrow as pa

    try:
        _table([row], schema)
        return row
    except (pa.ArrowException, OverflowError, UnicodeError, TypeError, ValueError) as e:
        bad = error_row(str(row.get("id")), f"cannot store the row: {type(e).__name__}: {e}", str(row.get("format")))
        bad.id = bad.id if _table_ok(bad, schema) else f"<line {row.get('line')}>"
        return {**bad.to_dict(), "line": row.get("line")}


def _table_ok(row: Any, schema: "Any") -> bool:
    try:
        _table([{**row.to_dict(), "line": 0}], schema)
        return True
    except Exception:
        return False


def read_rows(path: str | os.PathLike) -> "Any":
    """A reconstruction parquet as a pandas DataFrame (list columns as Python lists/arrays)."""
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pandas()


# --------------------------------------------------------------------------------------------
# Batch


class _HashingReader:
    """A binary file whose every byte read is also fed to a SHA-256 (one pass counts lines and hashes)."""

    def __init__(self, f: Any) -> None:
        self.f, self.sha = f, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.sha.update(data)
        return data


def _shard_starts(path: Path, shard_size: int) -> tuple[int, list[tuple[int, int]], str]:
    """Count the non-blank lines, find where each shard starts and hash the whole file, in one streamed pass:
    ``(n_lines, [(byte offset, line number)], sha256)``. Lines end at LF, CRLF or CR."""
    starts: list[tuple[int, int]] = []
    n = 0
    with open(path, "rb") as f:
        reader = _HashingReader(f)
        for lineno, (offset, raw) in enumerate(iter_raw_lines(reader), 1):
            if raw.strip() and not (lineno == 1 and raw == UTF8_BOM):
                if n % shard_size == 0:
                    starts.append((offset, lineno))
                n += 1
    return n, starts, reader.sha.hexdigest()


def _read_shard(path: Path, offset: int, lineno: int, shard_size: int) -> list[tuple[int, bytes]]:
    """The ``shard_size`` non-blank lines from ``offset`` (workers read their own lines: nothing big is pickled)."""
    lines: list[tuple[int, bytes]] = []
    with open(path, "rb") as f:
        f.seek(offset)
        for _, raw in iter_raw_lines(f, offset):
            if lineno == 1 and raw.startswith(UTF8_BOM):
                raw = raw[len(UTF8_BOM):]
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
    rows = [row for lineno, raw in lines for row in reconstruct_line(raw, lineno, tok, fmt, options, encoder)]
    write_rows(rows, _W["parts"] / f"shard-{k:06d}.parquet")
    return k, len(rows)


def _manifest(in_path: Path, sha256: str, tokenizer_dir: str, format_name: str, job: JobOptions) -> dict:
    """What a resumed run must share with the run it resumes: input (path, size, hash) and settings."""
    return {"input": str(in_path.resolve()), "size": in_path.stat().st_size, "sha256": sha256,
            "tokenizer": str(Path(tokenizer_dir).resolve()), "format": format_name,
            "tool_declaration": job.tool_declaration, "options": asdict(job.completion), "shard_size": job.shard_size}


def _mark_duplicates(table: "Any", first: dict[str, int]) -> "Any":
    """The first *valid* record of an id wins: every later ``ok`` row whose id is in ``first`` (id -> line of
    the first ok row, updated) becomes an error row naming that line. Error rows never claim an id."""
    import pyarrow as pa

    dups = set()
    columns = (table.column(c).to_pylist() for c in ("id", "line", "status"))
    for k, (rid, lineno, status) in enumerate(zip(*columns)):
        if status != "ok":
            continue
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
        self.errors: list[str] = []

    def add(self, k: int) -> None:
        import pyarrow.parquet as pq

        table = _mark_duplicates(pq.read_table(self.parts / f"shard-{k:06d}.parquet", schema=_schema()), self.first)
        self.writer.write_table(table)
        for status, error in zip(table.column("status").to_pylist(), table.column("error").to_pylist()):
            self.counts[status] = self.counts.get(status, 0) + 1
            if error:
                self.errors.append(error)

    def __enter__(self) -> "_Merger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.writer.close()


@dataclass(frozen=True)
class JobOptions:
    """How :func:`reconstruct_file` runs (defaults: one process, no resume, the official templates).

    ``workers``: processes; ``resume``: keep the finished shards of an interrupted run with the same input
    and settings; ``shard_size``: records per shard; ``progress``: a progress bar on stderr;
    ``tool_declaration``: ``json`` or ``ts`` (Moonshot's TypeScript tool declaration);
    ``completion``: how API fields become the completion (:class:`~kimi_eagle.chat.completion.CompletionOptions`).
    """

    workers: int = 1
    resume: bool = False
    shard_size: int = 256
    progress: bool = True
    tool_declaration: str = "json"
    completion: CompletionOptions = ReconstructOptions()


class NothingToProcess(ValueError):
    """The input holds no record at all (empty, or only blank lines)."""


class StatusCounts(dict):
    """``{status: rows}`` of a finished run (compares equal to a plain dict); ``errors`` holds every error reason."""

    def __init__(self, counts: dict[str, int], errors: list[str]) -> None:
        super().__init__(counts)
        self.errors = errors


def check_arguments(in_path: Path, out_path: Path, format_name: str, workers: int, shard_size: int) -> None:
    """Refuse bad arguments before any work: ValueError/FileNotFoundError naming the argument."""
    if not in_path.is_file():
        raise FileNotFoundError(f"input not found: {in_path}")
    if format_name not in FORMATS:
        raise ValueError(f"unknown format {format_name!r}; known: {', '.join(FORMATS)}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer, not {workers!r}")
    if isinstance(shard_size, bool) or not isinstance(shard_size, int) or shard_size < 1:
        raise ValueError(f"shard size must be a positive integer, not {shard_size!r}")
    if out_path.is_dir():
        raise ValueError(f"output {out_path} is a folder; give the path of the parquet file to write")
    if out_path.resolve() == in_path.resolve():
        raise ValueError(f"output {out_path} is the input file")
    check_encoding(in_path)


@contextlib.contextmanager
def output_lock(out_path: Path) -> Iterator[None]:
    """Hold ``.OUT.lock`` beside the output (released by the OS however the run ends): one run per output."""
    import fcntl

    out_path.parent.mkdir(parents=True, exist_ok=True)
    with open(out_path.with_name(f".{out_path.name}.lock"), "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(f"{out_path} is being written by another run; wait for it or choose another output") from None
        yield


def reconstruct_file(in_path: str | os.PathLike, out_path: str | os.PathLike, tokenizer_dir: str | os.PathLike,
                     format_name: str, job: JobOptions = JobOptions(), tokenizer: Tokenizer | None = None) -> StatusCounts:
    """Reconstruct every record of ``in_path`` into ``out_path`` (parquet); returns status counts.

    Exactly one row per input record, in input order (a record is a non-blank line; a line holding
    several JSON values gives one error row per value). Arguments are checked and the tokenizer
    loaded before any work; a second run on the same output is refused while one runs. Shards go to ``OUT.parts/`` (atomic
    writes); with ``resume`` the finished shards of an interrupted run with the same input and
    settings are kept, so a killed run resumed equals an uninterrupted one. Finished shards are
    streamed into the output in order while workers go on; the output appears atomically at the end.
    ``job``: workers, resume, shard size, progress bar, tool declaration and completion options
    (:class:`JobOptions`). ``tokenizer``: an already loaded tokenizer of ``tokenizer_dir`` (saves loading it again).
    """
    in_path, out_path = Path(in_path), Path(out_path)
    check_arguments(in_path, out_path, format_name, job.workers, job.shard_size)
    tok = tokenizer or load_tokenizer(tokenizer_dir)
    with output_lock(out_path):
        return _reconstruct_locked(in_path, out_path, tokenizer_dir, format_name, job, tok)


def _reconstruct_locked(in_path: Path, out_path: Path, tokenizer_dir: str | os.PathLike, format_name: str,
                        job: JobOptions, tok: Tokenizer) -> StatusCounts:
    """The run of :func:`reconstruct_file` once its arguments are checked and the output is locked."""
    from tqdm import tqdm

    workers, options, shard_size = job.workers, job.completion, job.shard_size
    n_lines, starts, sha256 = _shard_starts(in_path, shard_size)
    if n_lines == 0:
        raise NothingToProcess(f"{in_path} is empty: no records to reconstruct")
    parts = out_path.with_name(out_path.name + ".parts")
    manifest = _manifest(in_path, sha256, str(tokenizer_dir), format_name, job)
    mpath = parts / "manifest.json"
    if job.resume and parts.is_dir() and mpath.is_file():
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
    bar = tqdm(total=n_lines, unit="rec", desc="reconstruct", disable=not job.progress, file=sys.stderr)

    def consume(results: Iterator[tuple[int, int]], merger: _Merger) -> None:
        for k in range(n_shards):
            if k not in done:
                got, _ = next(results)
                assert got == k, (got, k)
            merger.add(k)
            bar.update(min(shard_size, n_lines - k * shard_size))

    with atomic_path(out_path) as tmp, _Merger(parts, tmp) as merger:
        if workers <= 1:
            _init_worker(str(tokenizer_dir), format_name, job.tool_declaration, options, str(parts), tok)
            consume(map(_run_shard, jobs), merger)
        else:
            import multiprocessing as mp

            ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context("spawn")
            init_tok = tok if ctx.get_start_method() == "fork" else None
            init_args = (str(tokenizer_dir), format_name, job.tool_declaration, options, str(parts), init_tok)
            with ctx.Pool(workers, _init_worker, init_args) as pool:
                consume(pool.imap(_run_shard, jobs), merger)
    bar.close()
    shutil.rmtree(parts)
    return StatusCounts(merger.counts, merger.errors)


# --------------------------------------------------------------------------------------------
# CLI
