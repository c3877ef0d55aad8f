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
import re
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

from kimi_eagle.chat.completion import CompletionOptions
from kimi_eagle.chat.encoder import PieceEncoder
from kimi_eagle.chat.formats import FORMATS, Format, get_format
from kimi_eagle.io import UTF8_BOM, atomic_path, check_encoding, iter_raw_lines, write_json
from kimi_eagle.reconstruct.columns import columnar_table
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
        ("ids_source", pa.string()), ("billed_cached_tokens", pa.int64()), ("cost", pa.float64()),
        ("serving", pa.string()),  # the serving profile of the row (--serving; null for an error row)
    ])


ID_COLUMNS = ("prompt_ids", "completion_ids")


def reconstruction_schema() -> "Any":
    """The Arrow schema of a reconstruction (one row per input record; docs/CONTRACTS.md)."""
    return _schema()


def rows_table(rows: list[dict[str, Any]], schema: "Any" = None) -> "Any":
    """Row dicts (``reconstruct_line``'s) as a table of the reconstruction schema, built column by column
    (:func:`~kimi_eagle.reconstruct.columns.columnar_table`); a row a column cannot hold becomes the error
    row of its record naming why (the reference per-row path, :func:`reference_table`, decides)."""
    import pyarrow as pa

    schema = schema if schema is not None else _schema()
    errors = (pa.ArrowException, OverflowError, UnicodeError, TypeError, ValueError, KeyError)
    try:
        return columnar_table(rows, schema)
    except errors:
        return _table([_storable_row(r, schema) for r in rows], schema)


def reference_table(rows: list[dict[str, Any]], schema: "Any" = None) -> "Any":
    """The same table built the general way (``pyarrow.array`` per column): the reference the columnar
    builder is tested against."""
    import pyarrow as pa

    schema = schema if schema is not None else _schema()
    try:
        return _table(rows, schema)
    except (pa.ArrowException, OverflowError, UnicodeError, TypeError, ValueError):
        return _table([_storable_row(r, schema) for r in rows], schema)


def lines_table(lines: Any, tok: Tokenizer, fmt: Format, options: CompletionOptions, encoder: PieceEncoder) -> "Any":
    """``(line number, raw line)`` pairs (non-blank, BOM removed) -> their rows as a reconstruction table: the
    step every shard of the file job runs, and :func:`~kimi_eagle.reconstruct.batch.reconstruct_batch` too."""
    return rows_table([row for lineno, raw in lines for row in reconstruct_line(raw, lineno, tok, fmt, options, encoder)])


def write_rows(rows: list[dict[str, Any]], path: Path) -> None:
    """Write row dicts (``reconstruct_line``'s) as a parquet of the reconstruction schema, atomically."""
    import pyarrow.parquet as pq

    with atomic_path(path) as tmp:
        pq.write_table(rows_table(rows), tmp, use_dictionary=False)


def _table(rows: list[dict[str, Any]], schema: "Any") -> "Any":
    import pyarrow as pa

    return pa.table({f.name: pa.array([r[f.name] for r in rows], type=f.type) for f in schema}, schema=schema)


def write_shard(table: "Any", path: Path) -> None:
    """A finished shard as an Arrow IPC file, atomically (written and read back at memory speed)."""
    import pyarrow as pa

    with atomic_path(path) as tmp:
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)


def read_shard(path: Path) -> "Any":
    """A shard written by :func:`write_shard`, memory-mapped."""
    import pyarrow as pa

    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_file(source).read_all()


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
    """A binary file whose every chunk read is also fed to a SHA-256 in a thread (hashlib releases the GIL):
    one read of the file counts the lines while the hash runs beside it. ``hexdigest`` waits for the hash."""

    def __init__(self, f: Any) -> None:
        import queue
        import threading

        self.f, self.sha = f, hashlib.sha256()
        self.chunks: Any = queue.Queue(maxsize=8)
        self.thread = threading.Thread(target=self._hash, daemon=True)
        self.thread.start()

    def _hash(self) -> None:
        for data in iter(self.chunks.get, None):
            self.sha.update(data)

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.chunks.put(data if data else None)
        return data

    def hexdigest(self) -> str:
        self.chunks.put(None)
        self.thread.join()
        return self.sha.hexdigest()


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
    return n, starts, reader.hexdigest()


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


def shard_name(k: int) -> str:
    """The file of finished shard ``k`` in ``OUT.parts/`` (an Arrow IPC file, see :func:`write_shard`)."""
    return f"shard-{k:06d}.arrow"


def refuse_foreign_parts(parts: Path) -> None:
    """ValueError unless ``parts`` is a folder holding only what reconstruct writes there (``manifest.json``,
    ``shard-NNNNNN.arrow`` and their temporary files): a user's folder of that name is never deleted."""
    if not parts.is_dir() or parts.is_symlink():
        raise ValueError(f"{parts} exists and is not reconstruct's shard folder; move it away")
    own = re.compile(r"(manifest\.json|shard-\d{6}\.arrow)(\..*\.tmp|\.tmp.*)?|\..*\.tmp")
    foreign = sorted(p.name for p in parts.iterdir() if p.is_dir() or not own.fullmatch(p.name))
    if foreign:
        raise ValueError(f"{parts} holds files reconstruct did not write ({', '.join(foreign[:3])}"
                         f"{', ...' if len(foreign) > 3 else ''}); move it away or choose another output")


def _run_shard(job: tuple[int, str, int, int, int]) -> tuple[int, int]:
    k, path, offset, lineno, shard_size = job
    lines = _read_shard(Path(path), offset, lineno, shard_size)
    table = lines_table(lines, _W["tok"], _W["fmt"], _W["options"], _W["encoder"])
    write_shard(table, _W["parts"] / shard_name(k))
    return k, table.num_rows


def _manifest(in_path: Path, sha256: str, tokenizer_dir: str, format_name: str, job: JobOptions) -> dict:
    """What a resumed run must share with the run it resumes: input (path, size, hash) and settings."""
    return {"input": str(in_path.resolve()), "size": in_path.stat().st_size, "sha256": sha256,
            "tokenizer": str(Path(tokenizer_dir).resolve()), "format": format_name,
            "tool_declaration": job.tool_declaration, "options": asdict(job.completion), "shard_size": job.shard_size}


def mark_duplicates(table: "Any", first: dict[str, int]) -> "Any":
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
                   completion_ids=[], n_prompt_tokens=0, n_completion_tokens=0, segments=[], flags=[],
                   serving=None)
    return pa.Table.from_pylist(rows, schema=table.schema)


class _Merger:
    """Streams finished shards, in order, into one parquet file (overlapping the workers).

    ``path`` is the temporary path of an ``atomic_path`` block: the output appears when the block ends.
    Parquet encoding runs in a writer thread (pyarrow releases the GIL), two shards at most queued, so
    it overlaps reconstruction even with one worker. Used as a context manager, which closes the writer
    (re-raising what the writer thread raised).
    """

    def __init__(self, parts: Path, path: Path) -> None:
        import queue
        import threading

        import pyarrow.parquet as pq

        self.parts = parts
        self.writer = pq.ParquetWriter(path, _schema(), use_dictionary=False)
        self.first: dict[str, int] = {}
        self.counts: dict[str, int] = {}
        self.errors: list[str] = []
        self.queue: Any = queue.Queue(maxsize=2)
        self.failed: list[BaseException] = []
        self.thread = threading.Thread(target=self._write, daemon=True)
        self.thread.start()

    def _write(self) -> None:
        for table in iter(self.queue.get, None):
            try:
                if not self.failed:
                    self.writer.write_table(table)
            except BaseException as e:  # re-raised by close
                self.failed.append(e)

    def add(self, k: int) -> None:
        import pyarrow.compute as pc

        table = mark_duplicates(read_shard(self.parts / shard_name(k)), self.first)
        if self.failed:
            raise self.failed[0]
        self.queue.put(table)
        counts = pc.value_counts(table.column("status")).to_pylist()
        for item in counts:
            self.counts[item["values"]] = self.counts.get(item["values"], 0) + item["counts"]
        self.errors += [e for e in pc.drop_null(table.column("error")).to_pylist() if e]

    def __enter__(self) -> "_Merger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.queue.put(None)
        self.thread.join()
        self.writer.close()
        if self.failed and exc[0] is None:
            raise self.failed[0]


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
    """Hold ``.OUT.lock`` beside the output (released by the OS however the run ends): one run per output.
    The lock file is removed when the run ends (a lock taken on a file already removed counts as busy)."""
    import fcntl

    out_path.parent.mkdir(parents=True, exist_ok=True)
    lock = out_path.with_name(f".{out_path.name}.lock")
    with open(lock, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if not lock.exists() or os.stat(lock).st_ino != os.fstat(f.fileno()).st_ino:
                raise BlockingIOError
        except BlockingIOError:
            raise ValueError(f"{out_path} is being written by another run; wait for it or choose another output") from None
        try:
            yield
        finally:
            lock.unlink(missing_ok=True)  # issue 24: no lock file left beside the output


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
            refuse_foreign_parts(parts)  # never delete a folder reconstruct did not make
            shutil.rmtree(parts)
        parts.mkdir(parents=True)
        write_json(mpath, manifest, indent=1)
    for stale in [*parts.glob("*.tmp*"), *out_path.parent.glob(f".{out_path.name}.*.tmp")]:
        stale.unlink()  # left by a killed write
    done = {int(p.stem.split("-")[1]) for p in parts.glob(shard_name(0).replace("000000", "*"))}
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
