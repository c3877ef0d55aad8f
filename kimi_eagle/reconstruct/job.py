"""``kimi-eagle reconstruct``: API records (JSONL) -> token IDs, one parquet row per input record.

``reconstruct_file`` runs :func:`~kimi_eagle.reconstruct.record.reconstruct_line` over a JSONL file,
in this process (1 worker) or in forked worker processes. Records are cut into shards of ``shard_size``
records; each shard is written atomically to ``OUT.parts/``; ``resume`` skips finished shards; the final
parquet is written atomically and holds exactly one row per input record (``status`` ``ok`` or ``error``
with the reason), in input order. ``read_rows`` reads it back.

Arguments are checked before any work (positive sizes, an output path that is not a folder, a
loadable tokenizer, a UTF-8 input); one run at a time per output (``.OUT.lock``, released by the OS
however the run ends); the resume manifest holds the xxh3-128 hash of the whole input, streamed by a scan
thread while the first shards are reconstructed (docs/scale.md: the file job's costs and its model).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
import threading
import uuid
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from kimi_eagle import io as kit_io
from kimi_eagle.chat.by_model import record_format
from kimi_eagle.chat.completion import CompletionOptions
from kimi_eagle.chat.encoder import PieceEncoder
from kimi_eagle.chat.formats import RECORD_FORMATS, Format
from kimi_eagle.io import UTF8_BOM, LongLine, atomic_path, check_encoding, iter_raw_lines, write_json
from kimi_eagle.reconstruct.columns import columnar_table
from kimi_eagle.reconstruct.record import ReconstructOptions, error_row, reconstruct_line
from kimi_eagle.reconstruct.source import api_source, source_metadata
from kimi_eagle.reconstruct.workers import die_with_parent, parent_watch
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
        ("serving_variant", pa.string()),  # the provider table's variant of its prompt (null: none applied)
        ("count_conventions", pa.list_(pa.string())),  # the table's completion count conventions (billing reads)
        ("billed_prompt_tokens", pa.int64()),  # usage.prompt_tokens as a count (null: absent or not a count)
        ("prompt_count_offset", pa.int64()),  # the table variant's prompt count offsets (null: no variant rendered it)
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


SHARD_SUM = ".xxh3"  # beside each finished shard: the xxh3-128 of its bytes, checked before a resumed run reuses it


def write_shard(table: "Any", path: Path) -> None:
    """A finished shard as an Arrow IPC file, atomically (written and read back at memory speed), then the
    xxh3-128 of its bytes beside it (``NAME.xxh3``): a shard counts as finished only with a matching sum."""
    import pyarrow as pa
    import xxhash

    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    data = sink.getvalue()
    with atomic_path(path) as tmp:
        tmp.write_bytes(memoryview(data))
    with atomic_path(path.with_name(path.name + SHARD_SUM)) as tmp:
        tmp.write_text(xxhash.xxh3_128_hexdigest(memoryview(data)))


def intact_shards(parts: Path) -> set[int]:
    """The finished shards in ``parts`` a resumed run may reuse: those whose bytes match the sum written beside
    them. A shard changed since (edited, truncated, its sum missing) is removed, named on stderr, and made again."""
    import xxhash

    done = set()
    for p in sorted(parts.glob("shard-" + "[0-9]" * 6 + ".arrow")):
        sum_path = p.with_name(p.name + SHARD_SUM)
        recorded = sum_path.read_text().strip() if sum_path.is_file() else None
        if recorded is not None and xxhash.xxh3_128_hexdigest(p.read_bytes()) == recorded:
            done.add(int(p.stem.split("-")[1]))
            continue
        why = "its bytes differ from the xxh3-128 recorded beside it" if recorded is not None else "no recorded sum"
        print(f"reconstruct: {p} is not the shard that was written ({why}); reconstructing it again", file=sys.stderr)
        p.unlink()
        sum_path.unlink(missing_ok=True)
    return done


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
    """A binary file whose every chunk read is also fed to an xxh3-128 hash (about 10 GB/s, against 1.2 GB/s for
    SHA-256 here): one read of the file finds the records and hashes it. ``hexdigest``: the hash of what was read."""

    def __init__(self, f: Any) -> None:
        import xxhash

        self.f, self.hash = f, xxhash.xxh3_128()

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.hash.update(data)
        return data

    def hexdigest(self) -> str:
        return self.hash.hexdigest()


_EOL = re.compile(rb"\r\n|\r|\n")  # the line ends of iter_raw_lines


def _line_ends(buf: bytes, limit: int, cr: bool) -> Iterator[tuple[int, int]]:
    """``(end, start of the next line)`` of every line of ``buf[:limit]`` that ends there (at LF, or at CRLF / CR
    when ``cr``), found without copying a line."""
    if cr:
        for m in _EOL.finditer(buf, 0, limit):
            yield m.start(), m.end()
        return
    start = buf.find(b"\n", 0, limit)
    while start >= 0:
        yield start, start + 1
        start = buf.find(b"\n", start + 1, limit)


def _is_record(buf: bytes, start: int, end: int, lineno: int) -> bool:
    """Whether line ``buf[start:end]`` (line number ``lineno``) is a record: not blank, not a lone byte-order mark."""
    if start < end and buf[start] == 0x7B:  # "{": the common case, decided without a copy
        return True
    raw = buf[start:end]
    return bool(raw.strip()) and not (lineno == 1 and raw == UTF8_BOM)


def record_starts(f: Any, chunk_size: int = 1 << 20) -> Iterator[tuple[int, int]]:
    """``(byte offset, line number)`` of every record (non-blank line) of a binary stream, in one read.

    Lines end at LF, CRLF or CR, exactly as :func:`~kimi_eagle.io.iter_raw_lines` cuts them (a CR at the end of a
    chunk waits for the next one); a line is copied only when it does not start with ``{``.
    """
    for offsets, linenos in record_chunks(f, chunk_size):
        yield from zip(offsets.tolist(), linenos.tolist())


def _lf_records(buf: bytes, limit: int, lineno: int) -> tuple[Any, Any, int, int]:
    """The records among the LF-ended lines of ``buf[:limit]`` (no CR in it), found by numpy: ``(offsets in buf,
    line numbers, lines ended, where the unended rest starts)``; ``lineno``: the lines before ``buf``."""
    import numpy as np

    data = np.frombuffer(buf, dtype=np.uint8, count=limit)
    ends = np.flatnonzero(data == 0x0A)
    starts = np.empty_like(ends)
    starts[:1] = 0
    starts[1:] = ends[:-1] + 1
    numbers = np.arange(lineno + 1, lineno + 1 + len(ends))
    brace = starts < ends  # not empty, and (below) starting with "{": a record without a look at its bytes
    brace[brace] = data[starts[brace]] == 0x7B
    odd = np.flatnonzero(~brace & (starts < ends))  # other non-empty lines: blank? a lone byte-order mark?
    keep = brace
    keep[odd] = [_is_record(buf, int(starts[k]), int(ends[k]), int(numbers[k])) for k in odd]
    rest = int(ends[-1]) + 1 if len(ends) else 0
    return starts[keep], numbers[keep], len(ends), rest


def _chunk_records(buf: bytes, limit: int, lineno: int, cr: bool) -> tuple[Any, Any, int, int]:
    """:func:`_lf_records` for any line ends: lines ending at CR or CRLF are cut one by one."""
    import numpy as np

    if not cr:
        return _lf_records(buf, limit, lineno)
    offsets, numbers, start, first = [], [], 0, lineno
    for end, nxt in _line_ends(buf, limit, cr):
        lineno += 1
        if _is_record(buf, start, end, lineno):
            offsets.append(start)
            numbers.append(lineno)
        start = nxt
    return np.array(offsets, dtype=np.int64), np.array(numbers, dtype=np.int64), lineno - first, start


def record_chunks(f: Any, chunk_size: int = 1 << 20) -> Iterator[tuple[Any, Any]]:
    """:func:`record_starts` a chunk at a time: numpy arrays ``(byte offsets, line numbers)`` of its records.

    Linear for any line length: an unended line longer than a read (and than 64 bytes) is not kept; it is held as
    its offset and whether it is blank, and stands in as one byte (``{`` or a space) once its end is read."""
    import numpy as np

    buf, base, lineno, eof = b"", 0, 0, False  # base: the file offset of buf[0]
    held: list = []  # a long unended line: [its file offset, any non-blank byte, file offset of the read]
    gap = 0  # bytes of a held line that buf[0] stands in for (added to the offsets after buf[0])
    while not eof:
        chunk = f.read(chunk_size)
        eof = not chunk
        if held:
            if _held_goes_on(held, chunk, eof):
                continue
            end = _first_eol(chunk)
            end = len(chunk) if end < 0 else end
            blank = not (held[1] or chunk[:end].strip())
            buf, base = (b" " if blank else b"{") + chunk[end:], held[0]
            gap, held = held[2] + end - held[0] - 1, []
        else:
            buf = buf + chunk if buf else chunk
        cr = b"\r" in buf
        limit = len(buf) - 1 if cr and not eof and buf.endswith(b"\r") else len(buf)
        offsets, numbers, n_lines, start = _chunk_records(buf, limit, lineno, cr)
        lineno += n_lines
        yield offsets + base + np.where(offsets > 0, gap, 0), numbers
        if start > 0:
            base, gap = base + start + gap, 0
        buf = buf[start:]
        if len(buf) > max(chunk_size, 64) and not buf.endswith(b"\r") and not eof:  # hold it, do not grow it
            held, buf = [base, bool(buf.strip()), base + len(buf)], b""
    if buf and _is_record(buf, 0, len(buf), lineno + 1):
        yield np.array([base]), np.array([lineno + 1])


def _first_eol(chunk: bytes) -> int:
    """Where the first line end (LF or CR) of ``chunk`` is, or -1."""
    ends = [i for i in (chunk.find(b"\n"), chunk.find(b"\r")) if i >= 0]
    return min(ends) if ends else -1


def _held_goes_on(held: list, chunk: bytes, eof: bool) -> bool:
    """Whether the held long line goes on past ``chunk`` (no line end in it, not the end of the file); if so the
    chunk is counted into it (``held[2]``: the file offset of the next read) and dropped."""
    if eof or _first_eol(chunk) >= 0:
        return False
    held[1] = held[1] or bool(chunk.strip())
    held[2] += len(chunk)
    return True


class _Scan:
    """The one pass over the input, in a thread: shard starts as they are found, then the record count and the
    input's hash (:func:`_shard_starts`). Work on the first shards starts while the scan goes on."""

    def __init__(self, path: Path, shard_size: int) -> None:

        self.path, self.shard_size = path, shard_size
        self.starts: list[tuple[int, int]] = []
        self.n = 0
        self.sha: str | None = None
        self.failed: list[BaseException] = []
        self.cond = threading.Condition()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        n = 0
        try:
            with open(self.path, "rb") as f:
                reader = _HashingReader(f)
                try:
                    for offsets, linenos in record_chunks(reader):
                        first = -n % self.shard_size  # the chunk's first record that starts a shard
                        if first < len(offsets):
                            picked = zip(offsets[first::self.shard_size].tolist(), linenos[first::self.shard_size].tolist())
                            with self.cond:
                                self.starts.extend(picked)
                                self.cond.notify_all()
                        n += len(offsets)
                finally:
                    sha = reader.hexdigest()
            with self.cond:
                self.n, self.sha = n, sha
        except BaseException as e:  # re-raised by the caller's wait
            self.failed.append(e)
        finally:
            with self.cond:
                self.cond.notify_all()

    def finished(self) -> bool:
        """Whether the scan has ended (with its result or an error)."""
        return self.sha is not None or bool(self.failed)

    def shard(self, k: int) -> tuple[int, int, int | None] | None:
        """``(offset, line number, end offset)`` of shard ``k`` once known (the end is the next shard's start;
        None for the last shard, read up to its ``shard_size`` records); None when the input has fewer shards."""
        with self.cond:
            self.cond.wait_for(lambda: len(self.starts) > k + 1 or self.finished())
            if self.failed:
                raise self.failed[0]
            if k >= len(self.starts):
                return None
            return (*self.starts[k], self.starts[k + 1][0] if k + 1 < len(self.starts) else None)

    def result(self) -> tuple[int, list[tuple[int, int]], str]:
        """``(n_records, [(byte offset, line number)] of the shards, xxh3-128 hex)``, once the scan has ended."""
        with self.cond:
            self.cond.wait_for(self.finished)
        if self.failed:
            raise self.failed[0]
        return self.n, self.starts, str(self.sha)


def _shard_starts(path: Path, shard_size: int) -> tuple[int, list[tuple[int, int]], str]:
    """Count the non-blank lines, find where each shard starts and hash the whole file, in one streamed pass:
    ``(n_lines, [(byte offset, line number)], xxh3-128 hex)``. Lines end at LF, CRLF or CR."""
    return _Scan(path, shard_size).result()


def _read_shard(path: Path, offset: int, lineno: int, shard_size: int, end: int | None = None) -> list[tuple[int, bytes]]:
    """The ``shard_size`` non-blank lines from ``offset`` (workers read their own lines: nothing big is pickled);
    ``end``: where the shard's bytes end (the next shard's start), read in one call and cut in C."""
    import io

    lines: list[tuple[int, bytes]] = []
    with open(path, "rb") as f:
        f.seek(offset)
        limit = kit_io.MAX_LINE_BYTES  # read at call time (a test may lower it)
        data = f.read(end - offset) if end is not None and end - offset <= limit else None  # no line over it
        if data is not None and b"\r" not in data:
            raws: Iterable[bytes] = data.split(b"\n")  # the piece after the last LF is empty or the unended last line
            if lineno > 1 and not raws[-1] and len(raws) <= shard_size + 1 and all(r[:1] == b"{" for r in raws[:-1]):
                return list(zip(range(lineno, lineno + len(raws) - 1), raws[:-1]))  # every line a record: none to skip
        else:
            raws = (raw for _, raw in iter_raw_lines(f if data is None else io.BytesIO(data), offset,
                                                     max_line_bytes=limit))  # a longer line: a LongLine
        for raw in raws:
            if lineno == 1 and raw.startswith(UTF8_BOM) and not isinstance(raw, LongLine):
                raw = raw[len(UTF8_BOM):]
            if raw.startswith(b"{") or raw.strip():  # a record's line is not copied again
                lines.append((lineno, raw))
                if len(lines) == shard_size:
                    break
            lineno += 1
    return lines


@dataclass(frozen=True)
class ShardInfo:
    """What the merge needs of a finished shard, read from its table once (in the worker that made it):
    each row's id, line and status, and the error reasons in row order."""

    ids: list[Any]
    lines: list[Any]
    statuses: list[Any]
    errors: list[str]

    @classmethod
    def of(cls, table: Any) -> "ShardInfo":
        ids, lines, statuses, errors = (table.column(c).to_pylist() for c in ("id", "line", "status", "error"))
        return cls(ids, lines, statuses, [e for e in errors if e])


_W: dict[str, Any] = {}  # per-process worker state: tokenizer, its encoder, format, options, the run it serves


def _init_worker(tokenizer_dir: str, format_name: str, tool_declaration: str, options: CompletionOptions,
                 tok: Any = None) -> None:
    tok = tok or load_tokenizer(tokenizer_dir)
    _W.update(tok=tok, encoder=PieceEncoder(tok, packed=True), fmt=record_format(format_name, tok, tool_declaration),
              options=options, run=None)


def _init_pool_worker(watch: tuple[int, int], *init_args: Any) -> None:
    """A pool worker's start: it ends with the parent (:func:`kimi_eagle.reconstruct.workers.die_with_parent`),
    then :func:`_init_worker`."""
    die_with_parent(*watch)
    _init_worker(*init_args)


def shard_name(k: int) -> str:
    """The file of finished shard ``k`` in ``OUT.parts/`` (an Arrow IPC file, see :func:`write_shard`)."""
    return f"shard-{k:06d}.arrow"


def refuse_foreign_parts(parts: Path) -> None:
    """ValueError unless ``parts`` is a folder holding only what reconstruct writes there (``manifest.json``,
    ``shard-NNNNNN.arrow`` and their temporary files): a user's folder of that name is never deleted."""
    if not parts.is_dir() or parts.is_symlink():
        raise ValueError(f"{parts} exists and is not reconstruct's shard folder; move it away")
    own = re.compile(r"(manifest\.json|shard-\d{6}\.arrow(\.xxh3)?)(\..*\.tmp|\.tmp.*)?|\..*\.tmp")
    foreign = sorted(p.name for p in parts.iterdir() if p.is_dir() or not own.fullmatch(p.name))
    if foreign:
        raise ValueError(f"{parts} holds files reconstruct did not write ({', '.join(foreign[:3])}"
                         f"{', ...' if len(foreign) > 3 else ''}); move it away or choose another output")


def _shard_table(job: tuple[int, str, int, int, int, int | None]) -> "Any":
    """The reconstruction table of one shard ``(k, path, offset, line number, shard size, end offset)``."""
    _, path, offset, lineno, shard_size, end = job
    lines = _read_shard(Path(path), offset, lineno, shard_size, end)
    return lines_table(lines, _W["tok"], _W["fmt"], _W["options"], _W["encoder"])


def _run_shard(task: tuple[tuple[int, str, int, int, int, int | None], str, str]) -> tuple[int, ShardInfo]:
    """A pool worker's step: one shard (``task``: the shard, the run's ``OUT.parts/`` folder, the run's token)
    reconstructed and written there as Arrow IPC. A worker's first shard of a run starts a fresh encoder, as
    the run in one process does (a reused pool's workers carry no cache from an earlier run)."""
    job, parts, run = task
    if _W["run"] != run:
        _W.update(run=run, encoder=PieceEncoder(_W["tok"], packed=True))
    table = _shard_table(job)
    write_shard(table, Path(parts) / shard_name(job[0]))
    return job[0], ShardInfo.of(table)


def _manifest(in_path: Path, digest: str, tokenizer_dir: str, format_name: str, job: JobOptions) -> dict:
    """What a resumed run must share with the run it resumes: input (path, size, xxh3-128 hash) and settings."""
    return {"input": str(in_path.resolve()), "size": in_path.stat().st_size, "xxh3_128": digest,
            "tokenizer": str(Path(tokenizer_dir).resolve()), "format": format_name,
            "tool_declaration": job.tool_declaration, "options": asdict(job.completion), "shard_size": job.shard_size,
            "columns": _schema().names}  # shards of an older row schema are never merged with new ones


def _duplicate_rows(info: ShardInfo, first: dict[str, int]) -> set[int]:
    """The rows of a shard that repeat the id of an earlier ok row (``first``: id -> line of its first ok row,
    updated with the shard's new ids). Error rows never claim an id."""
    dups = set()
    for k, (rid, lineno, status) in enumerate(zip(info.ids, info.lines, info.statuses)):
        if status != "ok":
            continue
        if rid in first:
            dups.add(k)
        else:
            first[rid] = lineno
    return dups


def _mark_rows(table: "Any", dups: set[int], first: dict[str, int]) -> "Any":
    """``table`` with rows ``dups`` turned into the error rows of a duplicate id."""
    import pyarrow as pa

    rows = table.to_pylist()
    for k in dups:
        row = rows[k]
        row.update(status="error", error=f"duplicate id {row['id']!r} (first at line {first[row['id']]})", prompt_ids=[],
                   completion_ids=[], n_prompt_tokens=0, n_completion_tokens=0, segments=[], flags=[],
                   serving=None, serving_variant=None, count_conventions=[], billed_prompt_tokens=None,
                   prompt_count_offset=None)
    return pa.Table.from_pylist(rows, schema=table.schema)


def mark_duplicates(table: "Any", first: dict[str, int]) -> "Any":
    """The first *valid* record of an id wins: every later ``ok`` row whose id is in ``first`` (id -> line of
    the first ok row, updated) becomes an error row naming that line. Error rows never claim an id."""
    dups = _duplicate_rows(ShardInfo.of(table), first)
    return _mark_rows(table, dups, first) if dups else table


class _Merger:
    """Streams finished shards, in order, into one parquet file (overlapping the workers).

    ``path`` is the temporary path of an ``atomic_path`` block: the output appears when the block ends.
    A writer thread (pyarrow releases the GIL) writes each shard's Arrow IPC file when the shard was made in
    this process and encodes the parquet; two shards at most are queued. Used as a context manager, which
    closes the writer (re-raising what the writer thread raised).
    """

    def __init__(self, parts: Path, path: Path, metadata: dict[bytes, bytes] | None = None) -> None:
        import queue

        import pyarrow.parquet as pq

        self.parts = parts
        self.writer = pq.ParquetWriter(path, _schema().with_metadata(metadata), use_dictionary=False)
        self.first: dict[str, int] = {}
        self.counts: dict[str, int] = {}
        self.errors: list[str] = []
        self.queue: Any = queue.Queue(maxsize=2)
        self.failed: list[BaseException] = []
        self.thread = threading.Thread(target=self._write, daemon=True)
        self.thread.start()

    def _write(self) -> None:
        for table, shard, path in iter(self.queue.get, None):
            try:
                if not self.failed:
                    if shard is not None:
                        write_shard(shard, path)
                    self.writer.write_table(table)
            except BaseException as e:  # re-raised by add and close
                self.failed.append(e)

    def add(self, k: int, made: "Any" = None, info: ShardInfo | None = None) -> None:
        """Shard ``k``: its table ``made`` in this process (its IPC file is written here), else read from
        ``OUT.parts/``; ``info`` as its worker read it (else read here). Duplicates are marked in order."""
        table = made if made is not None else read_shard(self.parts / shard_name(k))
        info = info if info is not None else ShardInfo.of(table)
        dups = _duplicate_rows(info, self.first)
        if dups:
            table = _mark_rows(table, dups, self.first)
            info = ShardInfo.of(table)
        if self.failed:
            raise self.failed[0]
        self.queue.put((table, made, self.parts / shard_name(k)))
        for status in info.statuses:
            self.counts[status] = self.counts.get(status, 0) + 1
        self.errors += info.errors

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
    if format_name not in RECORD_FORMATS:
        raise ValueError(f"unknown format {format_name!r}; known: {', '.join(RECORD_FORMATS)}")
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
    with output_lock(out_path), fewer_collections():
        return _reconstruct_locked(in_path, out_path, tokenizer_dir, format_name, job, tok)


@contextlib.contextmanager
def fewer_collections(gen0: int = 20_000) -> Iterator[None]:
    """The cyclic garbage collector's first threshold raised to ``gen0`` allocations while a run lasts (restored
    after; forked workers inherit it). A run makes and drops thousands of containers a shard (parsed records,
    rows), none in reference cycles, which reference counting frees; at the default threshold (700) the
    collections cost the job about a tenth of its CPU (docs/scale.md)."""
    import gc

    old = gc.get_threshold()
    gc.set_threshold(max(old[0], gen0), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


def _reconstruct_locked(in_path: Path, out_path: Path, tokenizer_dir: str | os.PathLike, format_name: str,
                        job: JobOptions, tok: Tokenizer) -> StatusCounts:
    """The run of :func:`reconstruct_file` once its arguments are checked and the output is locked.

    The input is scanned in a thread (record count, shard starts, hash) while the first shards are
    reconstructed; a resumed run waits for the whole scan, whose hash must match the manifest's.
    """
    with contextlib.ExitStack() as stack:
        # the workers are forked first (or kept from the last run), while this process runs no other thread of
        # this run (the scan's and the writer's)
        pool = stack.enter_context(_worker_pool((str(tokenizer_dir), format_name), job, tok)) if job.workers > 1 else None
        return _scan_and_run(in_path, out_path, (str(tokenizer_dir), format_name), job, (tok, pool))


def _scan_and_run(in_path: Path, out_path: Path, where: tuple[str, str], job: JobOptions, engines: tuple[Tokenizer, Any]
                  ) -> StatusCounts:
    """:func:`_reconstruct_locked` once the pool (``engines``: the tokenizer and the pool, or None) is started:
    the scan, the resume checks, the shards made and merged. ``where``: the tokenizer folder and format name."""
    from tqdm import tqdm

    (tokenizer_dir, format_name), (tok, pool) = where, engines
    parts = out_path.with_name(out_path.name + ".parts")
    mpath = parts / "manifest.json"
    scan = _Scan(in_path, job.shard_size)
    resuming = job.resume and parts.is_dir() and mpath.is_file()
    if (scan.result()[0] if resuming else scan.shard(0)) in (0, None):
        raise NothingToProcess(f"{in_path} is empty: no records to reconstruct")
    if resuming:
        written = json.loads(mpath.read_text())
        if isinstance(written, dict) and "sha256" in written:
            raise ValueError(f"cannot resume {out_path}: {parts} was written by an older kimi-eagle (a SHA-256 manifest); "
                             "run again without --resume")
        if isinstance(written, dict) and written.get("columns") != _schema().names:
            raise ValueError(f"cannot resume {out_path}: {parts} was written with other columns (an older kimi-eagle); "
                             "run again without --resume")
        if written != _manifest(in_path, scan.result()[2], tokenizer_dir, format_name, job):
            raise ValueError(f"cannot resume {out_path}: the input or settings changed since {parts} was written")
    else:
        if parts.exists():
            refuse_foreign_parts(parts)  # never delete a folder reconstruct did not make
            shutil.rmtree(parts)
        parts.mkdir(parents=True)
    for stale in [*parts.glob("*.tmp*"), *out_path.parent.glob(f".{out_path.name}.*.tmp")]:
        stale.unlink()  # left by a killed write
    run = _FileRun(in_path, parts, scan, job, (tokenizer_dir, format_name, None if resuming else mpath))
    run.done = intact_shards(parts)  # issue 37: an edited or truncated shard is redone, never trusted
    run.bar = tqdm(total=None, unit="rec", desc="reconstruct", disable=not job.progress, file=sys.stderr)
    source = source_metadata(api_source(in_path))  # #46: the kind of the records' source travels with the file
    with atomic_path(out_path) as tmp, _Merger(parts, tmp, source) as merger:
        if pool is None:
            _init_worker(tokenizer_dir, format_name, job.tool_declaration, job.completion, tok)
            try:
                run.in_process(merger)
            finally:  # the run's encoder and its cache go with the run (a later pool's forks never free them)
                _W.clear()
        else:
            run.pool(merger, pool)
        run.finish()
    run.bar.close()
    shutil.rmtree(parts)
    return StatusCounts(merger.counts, merger.errors)


def _start_pool(where: tuple[str, str], job: JobOptions, tok: Tokenizer) -> Any:
    """``job.workers`` worker processes, forked where the platform can (the loaded tokenizer inherited), each
    initialised for ``where`` (tokenizer folder, format name) and the job's tool declaration and options."""
    import gc
    import multiprocessing as mp

    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context("spawn")
    fork = ctx.get_start_method() == "fork"
    init_args = (*where, job.tool_declaration, job.completion, tok if fork else None)
    rows_table([])  # pyarrow imports pandas on its first conversion: once here, not once per worker
    gc.freeze()  # forked workers then never touch the parent's objects for the collector (no copy-on-write)
    try:
        return ctx.Pool(job.workers, _init_pool_worker, (parent_watch(), *init_args))
    finally:
        gc.unfreeze()


_POOL: dict[str, tuple[Any, Any, Any]] = {}  # "kept": (settings, weak reference to the tokenizer, pool)
_POOL_LOCK = threading.Lock()


@contextlib.contextmanager
def _worker_pool(where: tuple[str, str], job: JobOptions, tok: Tokenizer) -> Iterator[Any]:
    """The workers of a run: the pool the previous run kept when it was made for this same tokenizer object and
    settings (the forks and the workers' first copies of inherited memory are paid once a process, not once a
    run), else a new one (:func:`_start_pool`). Kept for the next run when this one ends normally (one pool at a
    time; :func:`close_worker_pools` ends it), terminated when it fails."""
    import multiprocessing.pool as mpp

    settings = (*where, job.tool_declaration, job.completion, job.workers)
    with _POOL_LOCK:
        kept = _POOL.pop("kept", None)  # taken: a run beside this one makes a pool of its own
    if kept is not None and kept[0] == settings and kept[1]() is tok and getattr(kept[2], "_state", None) == mpp.RUN:
        pool = kept[2]
    else:
        if kept is not None:
            kept[2].terminate()
        pool = _start_pool(where, job, tok)
    try:
        yield pool
    except BaseException:
        pool.terminate()
        raise
    try:
        ref = weakref.ref(tok)
    except TypeError:  # a tokenizer without weak references: its pool is not kept
        pool.terminate()
        return
    with _POOL_LOCK:
        other = _POOL.pop("kept", None)
        _POOL["kept"] = (settings, ref, pool)
    if other is not None:
        other[2].terminate()


def close_worker_pools() -> None:
    """End the worker processes a ``reconstruct_file`` run with workers kept for the next one (they also end
    with this process)."""
    with _POOL_LOCK:
        kept = _POOL.pop("kept", None)
    if kept is not None:
        kept[2].terminate()


class _FileRun:
    """One run of the file job over a scanned input: the shards in order, made here or by a pool, merged."""

    def __init__(self, in_path: Path, parts: Path, scan: _Scan, job: JobOptions, where: tuple[str, str, Path | None]):
        self.in_path, self.parts, self.scan, self.job = in_path, parts, scan, job
        self.tokenizer_dir, self.format_name, self.manifest_path = where  # manifest_path: written once the scan ends
        self.done: set[int] = set()
        self.bar: Any = None

    def jobs(self) -> Iterator[tuple[tuple[int, str, int, int, int, int | None], str, str]]:
        """The shards still to make, as they are found by the scan, as pool tasks (see :func:`_run_shard`)."""
        k, run = 0, uuid.uuid4().hex
        while (shard := self.scan.shard(k)) is not None:
            if k not in self.done:
                offset, lineno, end = shard
                yield (k, str(self.in_path), offset, lineno, self.job.shard_size, end), str(self.parts), run
            k += 1

    def _merged(self, merger: _Merger, k: int, table: Any = None, info: ShardInfo | None = None) -> None:
        merger.add(k, table, info)
        if self.manifest_path is not None and self.scan.finished():
            self.finish()
        size = self.job.shard_size
        self.bar.update(min(size, self.scan.n - k * size) if self.scan.sha is not None else size)

    def in_process(self, merger: _Merger) -> None:
        """Every shard made in this process (its IPC file and the parquet written by the merger's thread)."""
        k = 0
        while self.scan.shard(k) is not None:
            if k in self.done:
                self._merged(merger, k)
            else:
                offset, lineno, end = self.scan.shard(k)
                self._merged(merger, k, _shard_table((k, str(self.in_path), offset, lineno, self.job.shard_size, end)))
            k += 1

    def pool(self, merger: _Merger, pool: Any) -> None:
        """Shards made by the workers of ``pool`` (:func:`_worker_pool`), merged in order."""
        results = pool.imap(_run_shard, self.jobs())
        k = 0
        while self.scan.shard(k) is not None:
            if k in self.done:
                self._merged(merger, k)
            else:
                got, info = next(results)
                assert got == k, (got, k)
                self._merged(merger, k, None, info)
            k += 1

    def finish(self) -> None:
        """Once the scan has ended: the manifest of a fresh run written, the progress bar's total set."""
        n, _, digest = self.scan.result()
        if self.manifest_path is not None:
            write_json(self.manifest_path, _manifest(self.in_path, digest, self.tokenizer_dir, self.format_name, self.job),
                       indent=1)
            self.manifest_path = None
        if self.bar is not None and self.bar.total != n:
            self.bar.total = n
            self.bar.refresh()


# --------------------------------------------------------------------------------------------
# CLI
