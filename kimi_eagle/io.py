"""The kit's one write path, and JSONL reading that never drops a line.

Every file the kit writes goes through here: whole files are written to a temporary file beside the
target and renamed over it (readers see the old file or the new one, never half of one); logs that
grow line by line are appended one complete, flushed line at a time (a killed run leaves at most one
torn last line, which readers report as an error line rather than skipping).
"""
from __future__ import annotations

import json
import os
import re
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Iterator

import orjson


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block succeeds it is renamed over ``path``.

    If the block raises, the temporary file is removed and ``path`` is untouched. The parent
    directory is created if missing. Writers that infer a format from the file name (matplotlib)
    must be told the format: the temporary name ends in ``.tmp``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_json(path: str | os.PathLike, obj: Any, indent: int | None = 2) -> Path:
    """Write ``obj`` as JSON atomically (values JSON cannot hold are written with ``str``)."""
    return write_text(path, json.dumps(obj, indent=indent, default=str, ensure_ascii=False))


def disjoint_union(*parts: dict[str, Any]) -> dict[str, Any]:
    """The keys of every part, in order, in one dict; ValueError if a key is written twice (a metrics
    builder must never let one measure overwrite another)."""
    out: dict[str, Any] = {}
    for part in parts:
        twice = sorted(set(out) & set(part))
        if twice:
            raise ValueError(f"key written twice: {', '.join(twice)}")
        out.update(part)
    return out


def jsonl_line(obj: Any) -> str:
    """``obj`` as one JSONL line (UTF-8 kept as is, newline included)."""
    return json.dumps(obj, ensure_ascii=False) + "\n"


def write_jsonl(path: str | os.PathLike, rows: Iterable[Any]) -> Path:
    """Write ``rows`` as JSONL atomically, one object a line."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(jsonl_line(row))
    return Path(path)


def write_lines(path: str | os.PathLike, lines: Iterable[bytes], fsync: bool = False) -> Path:
    """Write raw byte ``lines`` (each with its newline) atomically; ``fsync`` before the rename."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.writelines(lines)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    return Path(path)


def write_figure(fig: Any, path: str | os.PathLike, dpi: int = 110, **savefig_kwargs: Any) -> Path:
    """Save a matplotlib figure atomically, in the format named by ``path``'s suffix (default PNG).

    The figure is left open: the caller decides whether to show it (notebooks) or close it.
    """
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower() or "png"
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=fmt, dpi=dpi, **savefig_kwargs)
    return path


class JsonlAppender:
    """Appends one complete JSON line per ``append``, flushed at once; safe to share between threads.

    ``transform`` rewrites each serialised line before it is written (e.g. redacting a secret);
    ``fsync_every`` seconds (None: never) the file is also synced to disk, and always on ``close``.
    """

    def __init__(self, path: str | os.PathLike, transform: Callable[[str], str] | None = None,
                 fsync_every: float | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", encoding="utf-8")
        self._transform = transform
        self._fsync_every = fsync_every
        self._last_sync = time.monotonic()
        self._lock = threading.Lock()

    def append(self, obj: Any) -> None:
        text = json.dumps(obj, ensure_ascii=False)
        line = (self._transform(text) if self._transform else text) + "\n"
        with self._lock:
            self._f.write(line)
            self._f.flush()
            if self._fsync_every is not None and time.monotonic() - self._last_sync > self._fsync_every:
                os.fsync(self._f.fileno())
                self._last_sync = time.monotonic()

    def close(self) -> None:
        with self._lock:
            if self._f.closed:
                return
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()

    def __enter__(self) -> "JsonlAppender":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


MAX_DEPTH = 100  # containers nested deeper than this make a record an error (the kit's code recurses over them)
UTF8_BOM = b"\xef\xbb\xbf"
_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32-LE"), (b"\x00\x00\xfe\xff", "UTF-32-BE"),
         (b"\xff\xfe", "UTF-16-LE"), (b"\xfe\xff", "UTF-16-BE"))
_EOL = re.compile(rb"\r\n|\r|\n")


class EncodingRefused(ValueError):
    """A whole file is not UTF-8 (UTF-16/UTF-32, with or without a byte-order mark): it is refused, not guessed."""


@dataclass(frozen=True)
class Line:
    """One record of a JSONL file: its 1-based physical line number and the parsed object or the error.

    ``error`` set means the record is not usable: ``obj`` is then ``None`` and ``partial`` holds whatever
    could be read (one of several values on one line, a record nested too deeply, a line read with
    invalid UTF-8 replaced), for its id in an error row only — never to be used as data.
    A line holding several JSON values yields one ``Line`` per value, all with the same ``lineno``.
    """

    lineno: int
    obj: Any
    error: str | None
    partial: Any = None


def encoding_problem(head: bytes) -> str | None:
    """Why a file starting with ``head`` is not UTF-8 JSONL (a UTF-16/32 byte-order mark or layout), or None."""
    for bom, name in _BOMS:
        if head.startswith(bom):
            return (f"the file is {name} (byte-order mark {bom.hex(' ')}); JSONL must be UTF-8 — "
                    f"convert it, e.g. iconv -f {name} -t UTF-8")
    sample = head[:256]
    if len(sample) >= 4 and sample.count(0) * 4 >= len(sample):  # UTF-8 JSON never holds NUL bytes
        return ("the file is not UTF-8: a quarter or more of its first bytes are NUL, the layout of UTF-16/UTF-32 "
                "without a byte-order mark; JSONL must be UTF-8")
    return None


MAX_LINE_BYTES = 128 << 20  # one record's line: collect keeps replies of at most 64 MiB (--max-body-bytes), requests
# are far smaller; a longer line is refused by its size, unread (its strings are over the 400,000-character limit anyway)


class LongLine(bytes):
    """A line longer than the readers' limit, yielded in place of its bytes: ``size`` (its length in bytes) and
    ``limit``. Its value is the line's first bytes and a NUL, never parseable JSON: :func:`parse_line` makes it an
    error line naming the size, before any parse."""

    size: int
    limit: int

    def __new__(cls, head: bytes, size: int, limit: int) -> "LongLine":
        line = super().__new__(cls, head[:64] + b"\x00")
        line.size, line.limit = size, limit
        return line

    def reason(self) -> str:
        return (f"{self.size:,} bytes on one line, over the {self.limit:,}-byte limit of one record "
                f"(refused by size, not parsed)")


def iter_raw_lines(f: BinaryIO, offset: int = 0, chunk_size: int = 1 << 20,
                   max_line_bytes: int | None = None) -> Iterator[tuple[int, bytes]]:
    """``(byte offset, line)`` for every physical line of a binary stream read from ``offset``.

    Lines end at ``\\n``, ``\\r\\n`` or a lone ``\\r`` (universal newlines); the terminator is not part of
    the line. Blank lines are yielded too, so callers can count physical lines. Linear in the bytes read: each
    byte is scanned for a line end once, and a line longer than a read is kept in pieces joined once when it
    ends (a 1 GB line costs what reading it costs, not a re-scan per read). With ``max_line_bytes`` a longer line
    is not kept: its bytes are counted as they stream by and a :class:`LongLine` is yielded for it (bounded
    memory for any line length; a line of only whitespace stays blank).
    """
    pieces: list[bytes] = []  # the line still open, as read
    start, base, after_cr = offset, offset, False  # where the open line starts; where the chunk starts
    held: list = []  # a line over max_line_bytes: [size so far, its first bytes, any non-blank byte, the limit]
    while chunk := f.read(chunk_size):
        skip = 1 if after_cr and chunk[:1] == b"\n" else 0  # the LF of a CRLF split between two reads
        start += skip
        after_cr = chunk.endswith(b"\r")
        pos = skip
        for end, after in _line_ends(chunk, skip):
            pieces.append(chunk[pos:end])
            yield start, _ended(pieces, held, max_line_bytes)
            pieces, held, pos = [], [], after
            start = base + after
        if pos < len(chunk):
            pieces.append(chunk[pos:])
            if max_line_bytes is not None:
                pieces = _hold(pieces, held, max_line_bytes)
        base += len(chunk)
    if pieces or held:
        line = _ended(pieces, held, max_line_bytes)
        if line:
            yield start, line


def _hold(pieces: list[bytes], held: list, limit: int) -> list[bytes]:
    """Move the open line's pieces into ``held`` (size, head, non-blank) once it is longer than ``limit``."""
    if not held:
        if sum(map(len, pieces)) <= limit:
            return pieces
        held.extend([0, b"".join(pieces[:1])[:64], False, limit])
    for piece in pieces:
        held[0] += len(piece)
        held[2] = held[2] or bool(piece.strip())
    return []


def _ended(pieces: list[bytes], held: list, limit: int | None) -> bytes:
    """The line that just ended: its bytes, or a :class:`LongLine` when over ``limit`` (``b""``: only whitespace)."""
    if not held and (limit is None or sum(map(len, pieces)) <= limit):
        return b"".join(pieces) if len(pieces) > 1 else pieces[0] if pieces else b""
    _hold(pieces, held, limit if limit is not None else held[3])
    return LongLine(held[1], held[0], held[3]) if held[2] else b""


def _line_ends(chunk: bytes, pos: int) -> Iterator[tuple[int, int]]:
    """``(end, after)`` of every line end in ``chunk`` from ``pos`` (LF only: found by ``bytes.find``, in C)."""
    if b"\r" in chunk:
        for m in _EOL.finditer(chunk, pos):
            yield m.start(), m.end()
        return
    while (end := chunk.find(b"\n", pos)) >= 0:
        yield end, end + 1
        pos = end + 1


def json_depth(obj: Any, limit: int = MAX_DEPTH) -> int:
    """How deeply containers nest in ``obj`` (a scalar is 0, ``[]`` is 1), counted without recursion.

    Stops as soon as the depth exceeds ``limit`` (the value returned is then ``limit + 1``).
    """
    deepest = 0
    stack = [(obj, 1)] if isinstance(obj, (dict, list)) else []
    while stack:
        value, depth = stack.pop()
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                return deepest
        children = value.values() if isinstance(value, dict) else value
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return deepest


def depth_error(text: str | bytes, obj: Any) -> str | None:
    """Why ``obj`` (parsed from ``text``) is nested too deeply, or None; the walk runs only when
    ``text`` holds enough brackets to reach ``MAX_DEPTH`` (a cheap bound on the depth)."""
    if text.count("{" if isinstance(text, str) else b"{") + text.count("[" if isinstance(text, str) else b"[") <= MAX_DEPTH:
        return None
    if json_depth(obj) > MAX_DEPTH:
        return f"nested more than {MAX_DEPTH} levels deep"
    return None


# bytes marked for one C-speed pass: digits 1 (19 in a row: an integer orjson would read as a float), "{" and "[" 2
_SCAN_MARKS = bytes(1 if 48 <= b <= 57 else 2 if b in b"{[" else 0 for b in range(256))
_DIGIT_RUN = b"\x01" * 19


def fast_loads(data: bytes) -> tuple[bool, Any]:
    """``(True, value)`` when orjson parses the UTF-8 JSON ``data`` to provably what ``json.loads`` gives and the
    value nests no deeper than ``MAX_DEPTH``; ``(False, None)`` when the standard path must decide.

    orjson's value is taken only when orjson accepts the bytes and they hold no run of 19 digits (orjson reads
    an integer beyond 64 bits as a float; a long mantissa). Everything else (NaN/Infinity, lone surrogates,
    1e400, bad JSON, invalid UTF-8, deep nesting) is left to the caller's ``json.loads``, so its values, errors
    and messages stay the standard library's. orjson refuses the constants a ``parse_constant`` hook is called
    for, so such a hook only ever runs in the fallback.
    """
    marks = data.translate(_SCAN_MARKS)
    if _DIGIT_RUN in marks:
        return False, None
    try:
        obj = orjson.loads(data)
    except Exception:  # any refusal (JSONDecodeError, a limit): the standard path decides, with its message
        return False, None
    if marks.count(2) > MAX_DEPTH and json_depth(obj) > MAX_DEPTH:
        return False, None
    return True, obj


def loads_exact(text: str, parse_constant: Callable[[str], Any] | None = None) -> Any:
    """``json.loads(text, parse_constant=parse_constant)``, value and error alike, through :func:`fast_loads`."""
    ok, obj = fast_loads(text.encode("utf-8", "surrogatepass"))  # a lone surrogate: bytes orjson refuses
    return obj if ok else json.loads(text, parse_constant=parse_constant)


def loads_checked(text: str) -> Any:
    """``json.loads`` that raises ``ValueError`` with a readable reason for anything it cannot take:
    bad JSON, numbers beyond Python's digit limit, nesting deeper than ``MAX_DEPTH``."""
    try:
        obj = loads_exact(text)
    except RecursionError:
        raise ValueError(f"nested more than {MAX_DEPTH} levels deep") from None
    except json.JSONDecodeError:
        raise
    except ValueError as e:  # e.g. an integer of more than 4,300 digits
        raise ValueError(f"not JSON ({e})") from None
    problem = depth_error(text, obj)
    if problem:
        raise ValueError(problem)
    return obj


# characters some tools end records with that are not JSONL line breaks (which are only LF, CRLF and CR)
FOREIGN_SEPARATORS = {"\f": "U+000C form feed", "\v": "U+000B vertical tab", "\x1c": "U+001C file separator",
                      "\x1d": "U+001D group separator", "\x1e": "U+001E record separator",
                      "\x85": "U+0085 next line", "\u2028": "U+2028 line separator",
                      "\u2029": "U+2029 paragraph separator"}


def _values(text: str, separators: set[str] | None = None) -> list[Any] | None:
    """The JSON values of a line holding several one after another, or None if it is not that; the
    :data:`FOREIGN_SEPARATORS` met between values are added to ``separators``."""
    decoder = json.JSONDecoder()
    values, i, n = [], 0, len(text)
    try:
        while i < n:
            value, i = decoder.raw_decode(text, i)
            values.append(value)
            while i < n and (text[i] in " \t" or text[i] in FOREIGN_SEPARATORS):
                if separators is not None and text[i] in FOREIGN_SEPARATORS:
                    separators.add(text[i])
                i += 1
    except (ValueError, RecursionError):
        return None
    return values if len(values) > 1 else None


def parse_line(raw: bytes, lineno: int) -> list[Line]:
    """Parse one physical line into one ``Line`` (or one per value when the line holds several values).

    Never raises for bad input: invalid UTF-8 (with the byte offset), bad JSON, numbers Python cannot
    read, nesting deeper than ``MAX_DEPTH`` and several values on one line all become error lines.
    """
    if isinstance(raw, LongLine):  # refused by its size before any parse (iter_raw_lines' max_line_bytes)
        return [Line(lineno, None, f"line {lineno}: {raw.reason()}")]
    ok, obj = fast_loads(raw)  # orjson accepts only strict UTF-8, so a value it gives needs no decode first
    if ok:
        return [Line(lineno, obj, None)]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        obj = None
        try:  # keep what the rest of the line says (its id), for the error row
            obj = loads_checked(raw.decode("utf-8", "replace"))
        except ValueError:
            pass
        bad = raw[e.start:e.end].hex(" ")
        return [Line(lineno, None, f"line {lineno}: invalid UTF-8 at byte {e.start} ({bad}: {e.reason}); "
                                  f"not UTF-8 text (CESU-8, Latin-1, a torn write?)", obj)]
    try:
        obj = json.loads(text)
    except RecursionError:
        return [Line(lineno, None, f"line {lineno}: nested more than {MAX_DEPTH} levels deep")]
    except json.JSONDecodeError as e:
        separators: set[str] = set()
        values = _values(text, separators) if e.msg == "Extra data" else None
        if values is None:
            return [Line(lineno, None, f"line {lineno}: not JSON ({e})")]
        n = len(values)
        how = (f", separated by {' and '.join(FOREIGN_SEPARATORS[c] for c in sorted(separators))}, which JSONL does "
               "not take as a line break (only LF, CRLF or CR)" if separators else "")
        return [Line(lineno, None, f"line {lineno}: {n} JSON values on one line (value {k} of {n}){how}; one record per line",
                     v if json_depth(v) <= MAX_DEPTH else None)
                for k, v in enumerate(values, 1)]
    except ValueError as e:  # e.g. an integer of more than 4,300 digits
        return [Line(lineno, None, f"line {lineno}: not JSON ({e})")]
    problem = depth_error(text, obj)
    return [Line(lineno, None, f"line {lineno}: {problem}", obj) if problem else Line(lineno, obj, None)]


# the first bytes of file kinds that are not JSON text: refused by name before a line is read
BINARY_KINDS = ((b"PAR1", "a Parquet file"), (b"\x1f\x8b", "a gzip file (decompress it first: gunzip)"),
                (b"PK\x03\x04", "a zip archive (an .xlsx, .zip or .npz?)"), (b"BZh", "a bzip2 file (bunzip2 it first)"),
                (b"\xfd7zXZ\x00", "an xz file (unxz it first)"), (b"\x28\xb5\x2f\xfd", "a zstd file (unzstd it first)"),
                (b"SQLite format 3\x00", "an SQLite database"), (b"ARROW1", "an Arrow IPC file"),
                (b"\x89PNG", "a PNG image"), (b"%PDF", "a PDF"), (b"\x80\x02", "a pickle"), (b"\x80\x04", "a pickle"))


class FileKindRefused(ValueError):
    """An input is not a JSON text file at all (Parquet, gzip, a folder, ...): refused before any output."""


def file_kind_problem(head: bytes) -> str | None:
    """What a file starting with ``head`` is, when it is a binary kind of :data:`BINARY_KINDS`; else None."""
    for magic, name in BINARY_KINDS:
        if head.startswith(magic):
            return f"this is {name}, not JSON text"
    return None


def check_encoding(path: str | os.PathLike) -> None:
    """Raise :class:`FileKindRefused` if ``path`` is a folder or a binary kind (:func:`file_kind_problem`),
    :class:`EncodingRefused` if it is not UTF-8 (a UTF-16/32 byte-order mark or layout)."""
    if Path(path).is_dir():
        raise FileKindRefused(f"{path}: this is a folder; give the path of a file")
    with open(path, "rb") as f:
        head = f.read(4096)
    kind = file_kind_problem(head)
    if kind:
        raise FileKindRefused(f"{path}: {kind}")
    problem = encoding_problem(head)
    if problem:
        raise EncodingRefused(f"{path}: {problem}")


def check_jsonl(path: str | os.PathLike) -> None:
    """:func:`check_encoding`, and :class:`FileKindRefused` for a JSON array (one JSON value holding the
    records, where JSONL needs one object per line)."""
    check_encoding(path)
    with open(path, "rb") as f:
        head = f.read(4096).removeprefix(UTF8_BOM).lstrip()
    if head[:1] == b"[":
        raise FileKindRefused(f"{path}: this is a JSON array, not JSONL (one object per line); "
                              "`kimi-eagle convert --from openai` reads arrays, or write one object per line")


def read_jsonl(path: str | os.PathLike) -> Iterator[Line]:
    """Yield every record of a JSONL file, parsed or with its error (never skipped, never raises for a bad line).

    Universal newlines (LF, CRLF, CR); blank lines are skipped but counted; a UTF-8 byte-order mark
    is ignored; a line over :data:`MAX_LINE_BYTES` is an error line naming its size, never held in memory. A
    file that is not UTF-8 at all (UTF-16/32) raises :class:`EncodingRefused` before
    the first line. See :func:`parse_line` for what becomes an error line.
    """
    check_encoding(path)
    with open(path, "rb") as f:
        for lineno, (_, raw) in enumerate(iter_raw_lines(f, max_line_bytes=MAX_LINE_BYTES), 1):  # read per call
            if lineno == 1 and raw.startswith(UTF8_BOM) and not isinstance(raw, LongLine):
                raw = raw[len(UTF8_BOM):]
            if raw.strip():
                yield from parse_line(raw, lineno)


def check_parquet(path: str | os.PathLike, made_by: str = "") -> None:
    """Raise :class:`FileKindRefused` unless ``path`` is a Parquet file (a folder, JSON text, gzip, ... are
    named); ``made_by`` says which command writes the expected file (e.g. ``"kimi-eagle reconstruct"``)."""
    if not Path(path).exists():
        raise FileNotFoundError(f"input not found: {path}")
    hint = f" (the file {made_by} writes)" if made_by else ""
    if Path(path).is_dir():
        raise FileKindRefused(f"{path}: this is a folder; give the path of a Parquet file{hint}")
    with open(path, "rb") as f:
        head = f.read(4096)
    if head.startswith(b"PAR1"):
        return
    kind = file_kind_problem(head) or encoding_problem(head)
    text = head.removeprefix(UTF8_BOM).lstrip()[:1]
    what = (kind.replace("this is ", "").replace(", not JSON text", "") if kind else
            "JSON text" if text in (b"{", b"[") else "empty" if not head else "not a Parquet file")
    raise FileKindRefused(f"{path}: this is {what}, not Parquet{hint}")
