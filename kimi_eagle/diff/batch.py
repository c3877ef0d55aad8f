"""The diff of an Arrow batch: the unit scale-out engines call (as :mod:`kimi_eagle.reconstruct.batch` for
reconstruction).

:func:`diff_batch` takes a ``pyarrow.RecordBatch`` or ``Table`` holding, per id, the reconstructed row as
``kimi-eagle reconstruct`` writes it (``id``, ``status``, ``error``, ``completion_ids``, ``segments``,
``flags``, ``prompt_ids``, ``finish_reason``, ``billed_*``, ... — any of its columns) joined with the
engine's record for that id:

* ``engine_output_ids`` (list of integers; null: no engine record for this id),
* ``engine_prompt_ids``, ``engine_finish_reason`` (optional),
* ``engine_line`` (optional; the engine record's line, default the row's position in the batch from 1),
* ``expected`` (optional; the label a labelled benchmark expects).

A row with a null ``status`` is an engine record without a reconstructed row. It returns a
``pyarrow.Table`` of :data:`~kimi_eagle.diff.run.RECORD_SCHEMA`: one row per record, the values
``kimi-eagle diff`` writes to ``records.parquet`` for those records (status, verdict, label, subclasses,
hunk counts, token and billing deltas, ...), in the command's order: reconstructed rows in batch order,
then the engine-only rows. Each engine record is checked as the command checks an engine line
(:func:`~kimi_eagle.diff.run.engine_entry`). The hunks themselves (``hunks.parquet``) are the command's.

Duplicate ids are a property of the whole input, not of a batch: give each id one row (the command's rule:
the first valid record of each input wins). Unreadable engine lines have no id to join on and stay with
the caller. The tokenizer is loaded once per process and ``tokenizer_dir``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from kimi_eagle.diff.run import RECORD_SCHEMA, EngineRecords, diff_rows, engine_entry
from kimi_eagle.tokenize.tokenizer import Tokenizer, load_tokenizer

ENGINE_COLUMNS = ("engine_output_ids", "engine_prompt_ids", "engine_finish_reason", "engine_line")


@dataclass(frozen=True)
class DiffBatchOptions:
    """What :func:`diff_batch` needs: the tokenizer folder the IDs belong to (``kimi-eagle diff --tokenizer``)."""

    tokenizer_dir: str


_LOADED: dict[str, Tokenizer] = {}  # per process


def loaded_tokenizer(options: DiffBatchOptions) -> Tokenizer:
    """The tokenizer of ``options``, loaded once per process."""
    if options.tokenizer_dir not in _LOADED:
        _LOADED[options.tokenizer_dir] = load_tokenizer(options.tokenizer_dir)
    return _LOADED[options.tokenizer_dir]


def _engine_record(row: dict[str, Any]) -> dict[str, Any]:
    """The engine columns of a joined row as the engine record ``kimi-eagle diff`` reads from a line."""
    obj = {"id": row["id"], "output_ids": row["engine_output_ids"]}
    if row.get("engine_prompt_ids") is not None:
        obj["prompt_ids"] = row["engine_prompt_ids"]
    if row.get("engine_finish_reason") is not None:
        obj["finish_reason"] = row["engine_finish_reason"]
    return obj


def diff_batch(batch: Any, options: DiffBatchOptions) -> pa.Table:
    """Diff a ``RecordBatch``/``Table`` of joined reconstructed rows and engine records (see the module) into
    ``records.parquet`` rows. ValueError for a batch without an ``id`` or ``engine_output_ids`` column."""
    names = batch.schema.names
    if "id" not in names or "engine_output_ids" not in names:
        raise ValueError(f"the batch needs 'id' and 'engine_output_ids' columns; its columns: {', '.join(names)}")
    tok = loaded_tokenizer(options)
    rows = batch.to_pylist()
    entries = [engine_entry(tok, _engine_record(r), k + 1 if r.get("engine_line") is None else r["engine_line"])
               for k, r in enumerate(rows) if r["engine_output_ids"] is not None]
    recon = [{c: v for c, v in r.items() if c not in ENGINE_COLUMNS} for r in rows if r.get("status") is not None]
    labels = {str(r["id"]): r["expected"] for r in rows if r.get("expected") is not None}
    result = diff_rows(tok, EngineRecords(entries), recon, labels)
    return pa.Table.from_pandas(result.records, schema=RECORD_SCHEMA, preserve_index=False)
