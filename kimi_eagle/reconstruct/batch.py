"""Reconstruction of an Arrow batch of raw JSONL lines: the unit scale-out engines call.

:func:`reconstruct_batch` takes a ``pyarrow.RecordBatch`` or ``Table`` whose ``text`` column holds raw
API-record lines (``string`` or ``binary``, one JSONL line a row, as ``ray.data.read_text`` and
``datasets.load_dataset("text")`` give them) and an optional ``line`` column (1-based line numbers;
default: the row's position in the batch, from 1), and returns a ``pyarrow.Table`` of the
reconstruction schema (:func:`~kimi_eagle.reconstruct.job.reconstruction_schema`): one row per
record, exactly the rows ``kimi-eagle reconstruct`` writes for those lines. Blank lines give no row
(as in a file); a line holding several JSON values gives one error row per value.

Two things are properties of a whole file, not of a batch, and stay with the caller: the line
numbers (give the ``line`` column) and duplicate ids (the first ok row of an id wins; apply
:func:`~kimi_eagle.reconstruct.job.mark_duplicates` to the batches in order, as the file job does).

The tokenizer, format and encoder are loaded once per process and options (a worker of
``datasets.map(num_proc=N)`` or a Ray actor loads them on its first batch). :func:`~kimi_eagle.reconstruct.job.lines_table`
is the same step over ``(line number, raw bytes)`` pairs; the file job's workers call it per shard.
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

from kimi_eagle.chat.completion import CompletionOptions
from kimi_eagle.chat.encoder import PieceEncoder
from kimi_eagle.chat.formats import Format, get_format
from kimi_eagle.io import UTF8_BOM, iter_raw_lines
from kimi_eagle.reconstruct.job import lines_table
from kimi_eagle.reconstruct.record import ReconstructOptions
from kimi_eagle.tokenize.tokenizer import Tokenizer, load_tokenizer


@dataclass(frozen=True)
class BatchOptions:
    """What :func:`reconstruct_batch` needs: the tokenizer folder, the chat format, the tool declaration
    (``json`` or ``ts``) and the completion options — the settings of ``kimi-eagle reconstruct``."""

    tokenizer_dir: str
    format_name: str = "kimi-k2.5"
    tool_declaration: str = "json"
    completion: CompletionOptions = ReconstructOptions()


_LOADED: dict[BatchOptions, tuple[Tokenizer, Format, PieceEncoder]] = {}  # per process


def loaded(options: BatchOptions) -> tuple[Tokenizer, Format, PieceEncoder]:
    """The tokenizer, format and encoder of ``options``, loaded once per process."""
    if options not in _LOADED:
        tok = load_tokenizer(options.tokenizer_dir)
        _LOADED[options] = (tok, get_format(options.format_name, tok, options.tool_declaration),
                            PieceEncoder(tok, packed=True))  # rows go straight to Arrow: IDs stay packed
    return _LOADED[options]


def batch_lines(batch: Any) -> list[tuple[int, bytes]]:
    """The non-blank ``(line number, raw bytes)`` of a batch's ``text`` (and ``line``) columns; a UTF-8
    byte-order mark is removed from line 1. ValueError for a batch without a ``text`` column."""
    names = batch.schema.names
    if "text" not in names:
        raise ValueError(f"the batch has no 'text' column (raw JSONL lines); its columns: {', '.join(names)}")
    texts = batch.column(names.index("text")).to_pylist()
    numbers = batch.column(names.index("line")).to_pylist() if "line" in names else range(1, len(texts) + 1)
    lines = []
    for lineno, text in zip(numbers, texts):
        raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else (text or b"")
        if lineno == 1 and raw.startswith(UTF8_BOM):
            raw = raw[len(UTF8_BOM):]
        if raw.strip():
            lines.append((int(lineno), raw))
    return lines


def reconstruct_batch(batch: Any, options: BatchOptions) -> Any:
    """Reconstruct a ``RecordBatch``/``Table`` of raw JSONL lines (see the module) into a reconstruction table."""
    tok, fmt, encoder = loaded(options)
    return lines_table(batch_lines(batch), tok, fmt, options.completion, encoder)


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
