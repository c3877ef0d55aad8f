"""Readers bounded for any line length (issues 47, 48): a line over the record limit is refused by its size as it
streams by, before any parse, and no reader holds more than a read or two of it.

Memory is measured with ``tracemalloc`` (bytes allocated, not time), so the verdicts hold on any machine."""
from __future__ import annotations

import io
import json
import random
import tracemalloc

import pytest
from helpers import api

from kimi_eagle import io as kit_io
from kimi_eagle.apps.cli import main
from kimi_eagle.io import UTF8_BOM, LongLine, iter_raw_lines, read_jsonl
from kimi_eagle.reconstruct import job as J

MB = 1 << 20


class LongLineReader:
    """A binary stream of ``head``, ``size`` bytes of ``fill``, then ``tail``, made as it is read (the line is
    never in memory as a whole, so what a reader keeps is what tracemalloc sees)."""

    def __init__(self, head: bytes, size: int, tail: bytes, fill: bytes = b"a") -> None:
        self.parts, self.fill, self.left = [head], fill, size
        self.tail = tail

    def read(self, n: int = -1) -> bytes:
        if self.parts:
            return self.parts.pop()
        if self.left > 0:
            k = min(n, self.left)
            self.left -= k
            return self.fill * k
        out, self.tail = self.tail, b""
        return out


def _peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_line_over_the_limit_is_a_long_line_naming_its_size_and_others_are_untouched():
    data = b'{"a": 1}\n{"x": "' + b"b" * 5000 + b'"}\r\n' + b" " * 5000 + b"\n{}"
    lines = [line for _, line in iter_raw_lines(io.BytesIO(data), chunk_size=512, max_line_bytes=1000)]
    assert lines[0] == b'{"a": 1}' and lines[3] == b"{}"
    assert isinstance(lines[1], LongLine) and lines[1].size == 5009 and lines[1].limit == 1000
    assert lines[2] == b""  # a long line of whitespace stays blank
    assert [line for _, line in iter_raw_lines(io.BytesIO(data), chunk_size=512)][1] == data.split(b"\r\n")[0][9:]


def test_a_line_of_exactly_the_limit_is_kept_and_one_byte_more_is_refused():
    for size, refused in ((1000, False), (1001, True)):
        data = b"{" + b"c" * (size - 2) + b"}\n"
        for chunk in (7, 1000, 4096):
            (line,) = [line for _, line in iter_raw_lines(io.BytesIO(data), chunk_size=chunk, max_line_bytes=1000)]
            assert isinstance(line, LongLine) is refused, (size, chunk)


def test_reading_a_32_mb_line_keeps_well_under_a_megabyte_of_it():
    def read():
        reader = LongLineReader(b'{"id": "x", "c": "', 32 * MB, b'"}\n{}\n')
        lines = [line for _, line in iter_raw_lines(reader, chunk_size=64 << 10, max_line_bytes=MB)]
        assert isinstance(lines[0], LongLine) and lines[0].size == 32 * MB + 20 and lines[1] == b"{}"

    assert _peak(read) < 3 * MB  # the limit plus a read or two, never the line


def test_the_record_scan_of_a_32_mb_line_keeps_well_under_a_megabyte_of_it():
    """reconstruct's one pass over the input (shard starts, the input's hash) grew its buffer by one read at a
    time over a long line, copying it each time: quadratic time, the whole line in memory."""
    def scan():
        reader = LongLineReader(b'{"a": 1}\n{"id": "x", "c": "', 32 * MB, b'"}\n{}\n')
        assert list(J.record_starts(reader, 64 << 10)) == [(0, 1), (9, 2), (9 + 18 + 32 * MB + 3, 3)]

    assert _peak(scan) < 2 * MB


def test_the_record_scan_cuts_long_lines_as_iter_raw_lines_at_every_chunk_size():
    rng = random.Random(47)
    rec = b'{"id": "r"}'
    lines = [rec, b"", b" ", b"x", UTF8_BOM, b"{" + b"a" * 300 + b"}", b" " * 200, b"\t" * 150 + b"z",
             UTF8_BOM + b"y" * 100, b" " * 100 + b"{}"]
    for _ in range(150):
        data = (b"".join(rng.choice(lines) + rng.choice([b"\n", b"\r\n", b"\r"]) for _ in range(rng.randrange(20)))
                + rng.choice([b"", rec, b" ", b"q" * 120, b" " * 120]))
        want = [(offset, lineno) for lineno, (offset, raw) in enumerate(iter_raw_lines(io.BytesIO(data)), 1)
                if raw.strip() and not (lineno == 1 and raw == UTF8_BOM)]
        for chunk in (1, 2, 3, 7, 64, 100, 1 << 20):
            assert list(J.record_starts(io.BytesIO(data), chunk)) == want, (data, chunk)


def _file_with_a_long_line(tmp_path, size: int):
    path = tmp_path / "api.jsonl"
    lines = [json.dumps(api(rid, content=text)) for rid, text in (("a", "hello"), ("long", "x" * size), ("b", "bye"))]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_reconstruct_refuses_a_line_over_the_limit_by_its_size_and_keeps_the_others(tmp_path, monkeypatch):
    monkeypatch.setattr(kit_io, "MAX_LINE_BYTES", MB)  # the real limit is 128 MiB; a 3 MB line stands for a 1 GB one
    path = _file_with_a_long_line(tmp_path, 3 * MB)
    out = tmp_path / "recon.parquet"
    assert main(["reconstruct", str(path), "-o", str(out), "--no-progress"]) == 0  # the auto pre-pass included
    import pyarrow.parquet as pq

    rows = pq.read_table(out).to_pylist()
    assert [(r["line"], r["status"]) for r in rows] == [(1, "ok"), (2, "error"), (3, "ok")]
    assert "over the 1,048,576-byte limit of one record (refused by size, not parsed)" in rows[1]["error"]
    size = len(path.read_bytes().split(b"\n")[1])
    assert rows[1]["id"] == "<line 2>" and rows[1]["error"].startswith(f"line 2: {size:,} bytes on one line")


@pytest.mark.parametrize("shard_size", [1, 2, 1000])
def test_every_shard_reads_a_line_over_the_limit_as_refused(tmp_path, monkeypatch, shard_size):
    monkeypatch.setattr(kit_io, "MAX_LINE_BYTES", MB)
    path = _file_with_a_long_line(tmp_path, 2 * MB)
    n, starts, _ = J._shard_starts(path, shard_size)
    assert n == 3
    lines = [line for k, (offset, lineno) in enumerate(starts)
             for line in J._read_shard(path, offset, lineno, shard_size, starts[k + 1][0] if k + 1 < len(starts) else None)]
    assert [lineno for lineno, _ in lines] == [1, 2, 3] and isinstance(lines[1][1], LongLine)


def test_read_jsonl_makes_a_line_over_the_limit_an_error_line(tmp_path, monkeypatch):
    monkeypatch.setattr(kit_io, "MAX_LINE_BYTES", MB)
    lines = list(read_jsonl(_file_with_a_long_line(tmp_path, 2 * MB)))
    assert [line.error is None for line in lines] == [True, False, True]
    assert lines[1].error.startswith("line 2: ") and "over the 1,048,576-byte limit" in lines[1].error
