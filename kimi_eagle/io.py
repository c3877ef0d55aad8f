"""The kit's one write path, and JSONL reading that never drops a line.

Every file the kit writes goes through here: whole files are written to a temporary file beside the
target and renamed over it (readers see the old file or the new one, never half of one); logs that
grow line by line are appended one complete, flushed line at a time (a killed run leaves at most one
torn last line, which readers report as an error line rather than skipping).
"""
from __future__ import annotations

import json
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator


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


@dataclass(frozen=True)
class Line:
    """One JSONL line: its 1-based number and either the parsed object or the parse error."""

    lineno: int
    obj: Any
    error: str | None


def read_jsonl(path: str | os.PathLike) -> Iterator[Line]:
    """Yield every non-blank line of a JSONL file, parsed or with its error (never skipped)."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                yield Line(lineno, json.loads(raw), None)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                yield Line(lineno, None, f"line {lineno}: not JSON ({e})")
