"""Reconstruction of an Arrow batch of raw JSONL lines: the unit scale-out engines call.

:func:`reconstruct_batch` takes a ``pyarrow.RecordBatch`` or ``Table`` whose ``text`` column holds raw
API-record lines (``string`` or ``binary``, one JSONL line a row, as ``ray.data.read_text`` and
``datasets.load_dataset("text")`` give them) and an optional ``line`` column (1-based line numbers;
default: the row's position in the batch, from 1), and returns a ``pyarrow.Table`` of the
reconstruction schema (:func:`~kimi_eagle.reconstruct.job.reconstruction_schema`): one row per
record, exactly the rows ``kimi-eagle reconstruct`` writes for those lines. Blank lines give no row
(as in a file); a line holding several JSON values gives one error row per value.

Two things are properties of a whole file, not of a batch, and stay with the caller: the line
numbers (give the ``line`` column: positive integers only) and duplicate ids (the first ok row of an id wins; apply
:func:`~kimi_eagle.reconstruct.job.mark_duplicates` to the batches in order, as the file job does).

The tokenizer, format and encoder are loaded once per process and options (a worker of
``datasets.map(num_proc=N)`` or a Ray actor loads them on its first batch). :func:`~kimi_eagle.reconstruct.job.lines_table`
is the same step over ``(line number, raw bytes)`` pairs; the file job's workers call it per shard.
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

from kimi_eagle.chat.by_model import record_format
from kimi_eagle.chat.completion import CompletionOptions
from kimi_eagle.chat.encoder import PieceEncoder
from kimi_eagle.chat.formats import Format
from kimi_eagle.io import UTF8_BOM, iter_raw_lines
from kimi_eagle.reconstruct.job import rows_table
from kimi_eagle.reconstruct.record import ReconstructOptions, error_row, reconstruct_line
from kimi_eagle.records import synthetic_id
from kimi_eagle.tokenize.tokenizer import Tokenizer, load_tokenizer


@dataclass(frozen=True)
class BatchOptions:
    """What :func:`reconstruct_batch` needs: the tokenizer folder, the chat format, the tool declaration
    (``json`` or ``ts``) and the completion options — the settings of ``kimi-eagle reconstruct``."""

    tokenizer_dir: str
    format_name: str = "auto"  # as the CLI: each record in its model's format (kimi_eagle.chat.by_model)
    tool_declaration: str = "json"
    completion: CompletionOptions = ReconstructOptions()


_LOADED: dict[BatchOptions, tuple[Tokenizer, Format, PieceEncoder]] = {}  # per process


def loaded(options: BatchOptions) -> tuple[Tokenizer, Format, PieceEncoder]:
    """The tokenizer, format and encoder of ``options``, loaded once per process."""
    if options not in _LOADED:
        tok = load_tokenizer(options.tokenizer_dir)
        _LOADED[options] = (tok, record_format(options.format_name, tok, options.tool_declaration),
                            PieceEncoder(tok, packed=True))  # rows go straight to Arrow: IDs stay packed
    return _LOADED[options]


def _line_number(value: Any, position: int) -> tuple[int | None, str | None]:
    """``(line number, None)`` of a ``line`` value, or ``(None, reason)``: only a positive integer is a line
    number (a float, a string, a bool, a null or a number below 1 is refused, never coerced)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None, f"batch row {position}: line {str(value)[:40]!r} ({type(value).__name__}) is not a positive integer line number"
    return value, None


def _raw_line(text: Any, lineno: int) -> tuple[bytes, str | None]:
    """``(raw bytes, None)`` of a ``text`` value (BOM removed from line 1), or ``(b"", reason)`` for a null, a
    value that is neither text nor bytes, or a row holding a line break (two records in one row: never merged)."""
    if text is None:
        return b"", "text is null: no line to reconstruct (a blank line is an empty string)"
    if not isinstance(text, (str, bytes)):
        return b"", f"text is {type(text).__name__}, not a line of text or bytes"
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if lineno == 1 and raw.startswith(UTF8_BOM):
        raw = raw[len(UTF8_BOM):]
    breaks = raw.count(b"\n") + raw.replace(b"\r\n", b"\n").count(b"\r")
    if breaks and raw.strip():
        return b"", f"the row holds {breaks + 1} lines (a line break inside one row); give one JSONL line per row"
    return raw, None


def batch_items(batch: Any) -> list[tuple[int | None, int, bytes, str | None]]:
    """``(line number, batch row, raw bytes, problem)`` of every non-blank row of a batch's ``text`` (and ``line``)
    columns, 1-based batch row; ``problem`` says why a row cannot be read as one JSONL line (its raw bytes are
    then empty). ValueError for a batch without a ``text`` column."""
    names = batch.schema.names
    if "text" not in names:
        raise ValueError(f"the batch has no 'text' column (raw JSONL lines); its columns: {', '.join(names)}")
    texts = batch.column(names.index("text")).to_pylist()
    numbers = batch.column(names.index("line")).to_pylist() if "line" in names else range(1, len(texts) + 1)
    items = []
    for position, (value, text) in enumerate(zip(numbers, texts), 1):
        lineno, problem = _line_number(value, position)
        raw, bad_text = _raw_line(text, lineno or 0)
        problem = problem or bad_text
        if problem or raw.strip():
            items.append((lineno, position, raw, problem))
    return items


def batch_lines(batch: Any) -> list[tuple[int, bytes]]:
    """The non-blank ``(line number, raw bytes)`` of a batch's readable rows (:func:`batch_items` without the
    rows it names a problem for); a UTF-8 byte-order mark is removed from line 1."""
    return [(lineno, raw) for lineno, _, raw, problem in batch_items(batch) if problem is None and lineno is not None]


def reconstruct_batch(batch: Any, options: BatchOptions) -> Any:
    """Reconstruct a ``RecordBatch``/``Table`` of raw JSONL lines (see the module) into a reconstruction table:
    every non-blank row gets its rows; a row that is not one line (a null, a non-text value, a line break
    inside, a ``line`` that is not a positive integer) gets an error row naming why, with its line number
    (null when the ``line`` value was the problem; its id is then ``<batch row N>``)."""
    tok, fmt, encoder = loaded(options)
    rows: list[dict[str, Any]] = []
    for lineno, position, raw, problem in batch_items(batch):
        if problem is None and lineno is not None:
            rows.extend(reconstruct_line(raw, lineno, tok, fmt, options.completion, encoder))
            continue
        rid = synthetic_id(lineno) if lineno is not None else f"<batch row {position}>"
        rows.append({**error_row(rid, problem or "unreadable row", fmt.name).to_dict(), "line": lineno})
    return rows_table(rows)


def file_lines(files: Any) -> Any:
    """Whole files (a ``bytes`` column, as ``ray.data.read_binary_files`` gives them) -> a ``pyarrow.Table`` of one
    row per physical line: ``text`` (raw bytes) and ``line`` (from 1 in every file), split exactly as
    ``kimi-eagle reconstruct`` splits a file, so line numbers and undecodable bytes reach :func:`reconstruct_batch`
    as the CLI sees them."""
    import pyarrow as pa

    texts, numbers = [], []
    for data in files.column("bytes").to_pylist():
        for lineno, (_, raw) in enumerate(iter_raw_lines(io.BytesIO(data)), 1):
            texts.append(raw)
            numbers.append(lineno)
    return pa.table({"text": pa.array(texts, pa.binary()), "line": pa.array(numbers, pa.int64())})
