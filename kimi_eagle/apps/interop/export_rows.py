"""export-data's row checks: which records become training rows, checked a whole Arrow batch at a time.

A training row is ``input_ids`` = prompt IDs + completion IDs exactly as stored and ``loss_mask`` 1
over the completion, cut at ``max_length``. :class:`ExportRows` holds the rows column-wise (flat
numpy IDs and mask, offsets, source index and id per row).

A parquet batch of reconstructed rows (or engine records with ``output_ids``) with integer list
columns is checked with Arrow/numpy compute: status, drop flags, an empty completion, vocabulary
bounds and the cut at ``max_length`` for every row at once. Every row those checks do not pass as
plainly usable — and every JSONL record, and every ``{input_ids, loss_mask}`` row — goes through
:func:`to_training_row`, the per-record rules, which decide its reason and detail. Nothing is
coerced: IDs and mask values must be integers (a bool, float, string or infinity is ``malformed``,
named), masks 0 or 1. The two paths give the same rows and reasons (tests/test_export_data_checks.py).

:func:`check_rows_batch` is the same checks as a function of one Arrow batch (a ``RecordBatch`` or
``Table``), one output row per record with its status, drop reason and training row: the unit a
scale-out engine (``datasets.map``, Ray Data) calls; the source index of the batch's first record is
the caller's (``index0``).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np

from kimi_eagle.io import read_jsonl
from kimi_eagle.records import storable_text

RECORD_FIELDS = ("id", "status", "error", "flags", "prompt_ids", "completion_ids", "output_ids", "input_ids",
                 "loss_mask")  # every field :func:`to_training_row` reads


@dataclass
class TrainingRow:
    """One exported row: the source record's index and id, exact IDs and the completion mask."""

    index: int
    id: str
    input_ids: list[int]
    loss_mask: list[int]


@dataclass
class ExportStats:
    """What happened to every input record."""

    rows_in: int = 0
    rows_written: int = 0
    rows_truncated: int = 0
    tokens_written: int = 0
    supervised_tokens: int = 0
    dropped: list[dict] = field(default_factory=list)

    def drop(self, index: int, rid: str | None, reason: str, detail: str = "") -> None:
        self.dropped.append({"index": index, "id": rid, "reason": reason, "detail": detail})

    def dropped_by_reason(self) -> dict[str, int]:
        return dict(sorted(Counter(d["reason"] for d in self.dropped).items()))


@dataclass(frozen=True)
class RowRules:
    """What a record needs to become a row: IDs below ``vocab_size``, cut at ``max_length`` (None: no cut),
    no flag of ``drop_flags``."""

    vocab_size: int
    max_length: int | None = None
    drop_flags: tuple[str, ...] = ()


@dataclass
class ExportRows:
    """Training rows column-wise: ``offsets`` (n + 1) into the flat ``input_ids`` (the source's integer type,
    int64 from JSONL) and ``loss_mask`` (int8)."""

    index: np.ndarray
    ids: list[str]
    offsets: np.ndarray
    input_ids: np.ndarray
    loss_mask: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)

    def row(self, k: int) -> TrainingRow:
        a, b = int(self.offsets[k]), int(self.offsets[k + 1])
        return TrainingRow(int(self.index[k]), self.ids[k], self.input_ids[a:b].tolist(), self.loss_mask[a:b].tolist())

    @classmethod
    def from_rows(cls, rows: Sequence[TrainingRow]) -> "ExportRows":
        lengths = np.array([len(r.input_ids) for r in rows], dtype=np.int64)
        flat = lambda name, dtype: np.fromiter((v for r in rows for v in getattr(r, name)), dtype, int(lengths.sum()))  # noqa: E731
        return cls(np.array([r.index for r in rows], dtype=np.int64), [r.id for r in rows],
                   np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), flat("input_ids", np.int64),
                   flat("loss_mask", np.int8))

    @classmethod
    def concat(cls, parts: Sequence["ExportRows"]) -> "ExportRows":
        if not parts:
            return cls.from_rows([])
        starts = np.cumsum([0] + [len(p.input_ids) for p in parts[:-1]])
        return cls(np.concatenate([p.index for p in parts]), [i for p in parts for i in p.ids],
                   np.concatenate([[0]] + [p.offsets[1:] + s for p, s in zip(parts, starts)]).astype(np.int64),
                   np.concatenate([p.input_ids for p in parts]), np.concatenate([p.loss_mask for p in parts]))


# ------------------------------------------------------------------------------------------
# one record (JSONL records, {input_ids, loss_mask} rows, and whatever the batch checks leave)


class _Malformed(ValueError):
    pass


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}…({len(text)} characters)"


def int_list(values: Any, name: str, mask: bool = False) -> list[int]:
    """``values`` if it is a list of integers (a mask: of 0 and 1); ``_Malformed`` naming the first value that
    is not — a bool, a float (5.0 and infinity too), a string — never a converted one."""
    if not isinstance(values, (list, tuple)):
        raise _Malformed(f"{name} is {'null' if values is None else 'a ' + type(values).__name__}, not a list")
    for k, v in enumerate(values):
        if type(v) is not int:
            raise _Malformed(f"{name}[{k}] is {_shown(v)} ({type(v).__name__}), not an integer")
        if mask and v not in (0, 1):
            raise _Malformed(f"{name}[{k}] is {v}: loss_mask values must be 0 or 1")
    return list(values)


def _ids_and_mask(obj: dict) -> tuple[list[int], list[int]]:
    if "input_ids" in obj:
        ids = int_list(obj["input_ids"], "input_ids")
        mask = int_list(obj["loss_mask"], "loss_mask", mask=True) if obj.get("loss_mask") is not None else [1] * len(ids)
        return ids, mask
    completion = obj.get("completion_ids", obj.get("output_ids"))
    if completion is None:
        raise _Malformed("no input_ids, completion_ids or output_ids")
    name = "completion_ids" if "completion_ids" in obj else "output_ids"
    prompt = int_list(obj.get("prompt_ids") or [], "prompt_ids")
    completion = int_list(completion, name)
    return prompt + completion, [0] * len(prompt) + [1] * len(completion)


def to_training_row(index: int, obj: Any, *, vocab_size: int, max_length: int | None,
                    drop_flags: Sequence[str] = ()) -> tuple[TrainingRow | None, str | None, str, bool]:
    """``(row, None, "", truncated)`` or ``(None, reason, detail, False)`` for one input record.

    Accepts a reconstructed row (``status``, ``prompt_ids``, ``completion_ids``, ``flags``), an engine
    record (``prompt_ids``, ``output_ids``, ``error``) or a pre-tokenized ``{input_ids, loss_mask}`` row.
    """
    if not isinstance(obj, dict):
        return None, "malformed", "record is not an object", False
    rid = str(obj.get("id", index))
    if not storable_text(rid):
        return None, "malformed", "id is not valid Unicode (a lone surrogate)", False
    if obj.get("status", "ok") != "ok" or (obj.get("error") and "status" not in obj):
        return None, "status_error", str(obj.get("error") or obj.get("status")), False
    flags = obj.get("flags") or []
    flags = [f for f in (flags if isinstance(flags, list) else [flags]) if f in drop_flags]
    if flags:
        return None, f"flag:{flags[0]}", ",".join(flags), False
    try:
        ids, mask = _ids_and_mask(obj)
    except _Malformed as e:
        return None, "malformed", str(e), False
    if len(ids) != len(mask):
        return None, "malformed", f"input_ids ({len(ids)}) and loss_mask ({len(mask)}) differ in length", False
    if not any(mask):
        return None, "empty_completion", "no completion tokens", False
    bad = next((i for i in ids if not 0 <= i < vocab_size), None)
    if bad is not None:
        return None, "id_out_of_vocab", f"id {bad} outside [0, {vocab_size})", False
    truncated = max_length is not None and len(ids) > max_length
    if truncated:
        ids, mask = ids[:max_length], mask[:max_length]
        if not any(mask):
            return None, "no_supervised_tokens", f"no completion token within the first {max_length} tokens", False
    return TrainingRow(index, rid, ids, mask), None, "", truncated


# ------------------------------------------------------------------------------------------
# a parquet batch at a time


def _int_list_column(batch: Any, name: str) -> Any:
    """The column ``name`` if it is a list of integers, else None."""
    import pyarrow as pa

    if name not in batch.schema.names:
        return None
    col = batch.column(name)
    return col if pa.types.is_list(col.type) and pa.types.is_integer(col.type.value_type) else None


def _lengths(col: Any) -> np.ndarray:
    import pyarrow.compute as pc

    return pc.fill_null(pc.list_value_length(col), 0).to_numpy(zero_copy_only=False).astype(np.int64)


def _id_columns(batch: Any) -> tuple[Any, Any] | None:
    """``(prompt or None, completion)`` integer list columns of a reconstructed-row or engine-record batch;
    None for any other shape (``input_ids`` rows, IDs that are not integers by type)."""
    import pyarrow as pa

    names = batch.schema.names
    cname = "completion_ids" if "completion_ids" in names else "output_ids"
    prompt, completion = _int_list_column(batch, "prompt_ids"), _int_list_column(batch, cname)
    if "input_ids" in names or completion is None or ("prompt_ids" in names and prompt is None):
        return None
    if any(name in names and not pa.types.is_string(batch.schema.field(name).type) for name in ("status", "error")):
        return None
    return prompt, completion


def _plain(batch: Any, rules: RowRules) -> np.ndarray | None:
    """Which rows of a reconstructed-row batch are plainly usable (ok status, no drop flag, a non-empty
    completion, every ID in the vocabulary, a supervised token left after the cut); None when the batch's
    shape needs the per-record rules."""
    import pyarrow.compute as pc

    columns = _id_columns(batch)
    if columns is None:
        return None
    (prompt, completion), names, n = columns, batch.schema.names, batch.num_rows
    plain = completion.is_valid().to_numpy(zero_copy_only=False) & (_lengths(completion) > 0)
    if "status" in names:
        plain &= pc.fill_null(pc.equal(batch.column("status"), "ok"), False).to_numpy(zero_copy_only=False)
    elif "error" in names:
        plain &= batch.column("error").is_null().to_numpy(zero_copy_only=False)
    if "flags" in names and rules.drop_flags:
        flags = batch.column("flags")
        if not (hasattr(flags.type, "value_type") and str(flags.type.value_type) == "string"):
            return None
        hit = pc.fill_null(pc.is_in(pc.list_flatten(flags), value_set=_strings(rules.drop_flags)), False)
        parents = pc.list_parent_indices(flags).to_numpy(zero_copy_only=False)
        plain &= np.bincount(parents[hit.to_numpy(zero_copy_only=False)], minlength=n) == 0
    p_len = _lengths(prompt) if prompt is not None else np.zeros(n, dtype=np.int64)
    for col in (prompt, completion):
        if col is not None:
            plain &= ~_unusable_values(col, n, rules.vocab_size)
    if rules.max_length is not None:
        plain &= p_len < rules.max_length
    return plain


def _unusable_values(col: Any, n: int, vocab_size: int) -> np.ndarray:
    """Which of the ``n`` rows of list column ``col`` hold a null value or one outside ``[0, vocab_size)``
    (one ``min_max`` when every value is in range, the usual case)."""
    import pyarrow.compute as pc

    values = pc.list_flatten(col)
    if not len(values):
        return np.zeros(n, dtype=bool)
    low, high = pc.min_max(values).values()
    if values.null_count == 0 and low.as_py() >= 0 and high.as_py() < vocab_size:
        return np.zeros(n, dtype=bool)
    outside = pc.or_(pc.less(values, 0), pc.greater_equal(values, vocab_size))
    bad = pc.fill_null(outside, True).to_numpy(zero_copy_only=False)
    return np.bincount(pc.list_parent_indices(col).to_numpy(zero_copy_only=False)[bad], minlength=n) > 0


def _strings(values: Sequence[str]) -> Any:
    import pyarrow as pa

    return pa.array(list(values), pa.string())


def _flat_values(col: Any, value_type: Any) -> np.ndarray:
    """The values of a list column (rows without nulls), in row order, as ``value_type``."""
    import pyarrow.compute as pc

    return pc.list_flatten(col).cast(value_type).to_numpy()


def _assemble(prompt: Any, completion: Any, max_length: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Prompt + completion per row, cut at ``max_length``: ``(offsets, input_ids, loss_mask, rows truncated)``.
    The mask (each row's prompt zeros, then its completion ones) is built first; the prompt values then go
    where it is 0 and the completion values where it is 1, in order (two numpy scatters, no per-row work)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(completion)
    value_type = completion.type.value_type if prompt is None or prompt.type == completion.type else pa.int64()
    cols = [completion] if prompt is None else [prompt, completion]
    lengths = np.stack([_lengths(c) for c in cols], axis=1)
    total = lengths.sum(axis=1)
    mask = np.repeat(np.tile(np.arange(2 - len(cols), 2, dtype=np.int8), n), lengths.reshape(-1))
    if prompt is None:
        ids = _flat_values(completion, value_type)
    else:
        ids = np.empty(len(mask), dtype=value_type.to_pandas_dtype())
        ids[mask == 0], ids[mask == 1] = _flat_values(prompt, value_type), _flat_values(completion, value_type)
    offsets = np.concatenate([[0], np.cumsum(total)]).astype(np.int64)
    if max_length is None or not (total > max_length).any():
        return offsets, ids, mask, 0
    as_lists = lambda v: pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(v))  # noqa: E731
    ids_list, mask_list = (pc.list_slice(as_lists(v), 0, max_length) for v in (ids, mask))
    cut = np.minimum(total, max_length)
    return (np.concatenate([[0], np.cumsum(cut)]).astype(np.int64), ids_list.flatten().to_numpy(),
            mask_list.flatten().to_numpy(), int((cut < total).sum()))


def _row_ids(batch: Any, index: np.ndarray) -> list[str]:
    """``str(record.get("id", index))`` for every row of ``batch`` (source indices ``index``)."""
    if "id" not in batch.schema.names:
        return [str(int(k)) for k in index]
    return [str(v) for v in batch.column("id").to_pylist()]


def check_batch(batch: Any, index0: int, rules: RowRules, stats: ExportStats) -> ExportRows:
    """The training rows of one parquet batch (source indices from ``index0``); every other record is
    counted in ``stats`` as dropped with its reason (the per-record rules decide it)."""
    stats.rows_in += batch.num_rows
    found = _plain(batch, rules)
    plain = found if found is not None else np.zeros(batch.num_rows, dtype=bool)
    others = np.flatnonzero(~plain)
    kept = []
    for k, obj in zip(others, batch.take(others).to_pylist() if len(others) else []):
        row, reason, detail, truncated = to_training_row(index0 + int(k), obj, vocab_size=rules.vocab_size,
                                                         max_length=rules.max_length, drop_flags=rules.drop_flags)
        if row is None:
            rid = obj.get("id") if isinstance(obj, dict) else None
            stats.drop(index0 + int(k), None if rid is None else str(rid), reason or "malformed", detail)
        else:
            kept.append((row, truncated))
    if kept:  # a usable row the batch checks did not pass (an unusual shape): the whole batch record by record
        stats.rows_in -= batch.num_rows
        stats.dropped = [d for d in stats.dropped if d["index"] < index0]
        return _rows_one_by_one(((index0 + k, obj, None) for k, obj in enumerate(batch.to_pylist())), rules, stats)
    import pyarrow as pa

    if not plain.any():
        return ExportRows.from_rows([])
    chosen = batch if plain.all() else batch.filter(pa.array(plain))
    prompt, completion = _id_columns(chosen)
    offsets, ids, mask, truncated = _assemble(prompt, completion, rules.max_length)
    index = np.flatnonzero(plain).astype(np.int64) + index0
    rows = ExportRows(index, _row_ids(chosen, index), offsets, ids, mask)
    _count(stats, rows, truncated)
    return rows


def _count(stats: ExportStats, rows: ExportRows, truncated: int) -> None:
    stats.rows_written += len(rows)
    stats.rows_truncated += truncated
    stats.tokens_written += len(rows.input_ids)
    stats.supervised_tokens += int(rows.loss_mask.sum())


def _rows_one_by_one(records: Iterator[tuple[int, Any, str | None]], rules: RowRules, stats: ExportStats) -> ExportRows:
    rows: list[TrainingRow] = []
    truncated_rows = 0
    for index, obj, error in records:
        stats.rows_in += 1
        rid = obj.get("id") if isinstance(obj, dict) else None
        if error:
            stats.drop(index, rid, "malformed", error)
            continue
        row, reason, detail, truncated = to_training_row(index, obj, vocab_size=rules.vocab_size,
                                                         max_length=rules.max_length, drop_flags=rules.drop_flags)
        if row is None:
            stats.drop(index, None if rid is None else str(rid), reason or "malformed", detail)
            continue
        rows.append(row)
        truncated_rows += truncated
    out = ExportRows.from_rows(rows)
    _count(stats, out, truncated_rows)
    return out


def collect_rows(path: Any, *, vocab_size: int, max_length: int | None = None, drop_flags: Sequence[str] = (),
                 batch_rows: int = 16384) -> tuple[ExportRows, ExportStats]:
    """Every usable row of ``path`` (``.parquet``: batch checks; ``.jsonl``: record by record) and the stats
    accounting for every record."""
    from pathlib import Path

    rules, stats, path = RowRules(vocab_size, max_length, tuple(drop_flags)), ExportStats(), Path(path)
    if path.suffix != ".parquet":
        records = ((k, line.obj, line.error) for k, line in enumerate(read_jsonl(path)))
        return _rows_one_by_one(records, rules, stats), stats
    import pyarrow as pa
    import pyarrow.parquet as pq

    parts, index0 = [], 0
    try:
        source = pq.ParquetFile(path)
        columns = [c for c in RECORD_FIELDS if c in source.schema_arrow.names] or None  # all the rules ever read
        for batch in source.iter_batches(batch_size=batch_rows, columns=columns):
            parts.append(check_batch(batch, index0, rules, stats))
            index0 += batch.num_rows
    except (pa.ArrowException, OSError) as e:  # issue 48: a truncated or foreign file is named, not Arrow's words alone
        raise ValueError(f"{path}: not a readable Parquet file ({str(e)[:160]})") from None
    return ExportRows.concat(parts), stats


# ------------------------------------------------------------------------------------------
# one Arrow batch, one status per record: the unit scale-out engines call


def check_schema() -> Any:
    """The columns :func:`check_rows_batch` returns."""
    import pyarrow as pa

    return pa.schema([("index", pa.int64()), ("id", pa.string()), ("status", pa.string()), ("reason", pa.string()),
                      ("detail", pa.string()), ("truncated", pa.bool_()), ("input_ids", pa.list_(pa.int64())),
                      ("loss_mask", pa.list_(pa.int8()))])


def _one_batch(batch: Any) -> Any:
    """``batch`` as one ``RecordBatch`` (a ``Table``'s chunks combined), only the columns the rules read."""
    import pyarrow as pa

    if isinstance(batch, pa.Table):
        batches = batch.combine_chunks().to_batches()
        batch = batches[0] if batches else pa.RecordBatch.from_pylist([], schema=batch.schema)
    keep = [c for c in RECORD_FIELDS if c in batch.schema.names]
    return batch.select(keep) if keep else batch


def _source_lengths(batch: Any) -> np.ndarray:
    """Per row, the length a kept row had before the cut (``input_ids``, else prompt + completion); 0 where
    a column is not a list (no such row is ever kept)."""
    import pyarrow as pa

    names = batch.schema.names
    length = lambda name: (_lengths(batch.column(name)) if name in names and pa.types.is_list(batch.column(name).type)  # noqa: E731
                           else np.zeros(batch.num_rows, dtype=np.int64))
    if "input_ids" in names:
        return length("input_ids")
    return length("prompt_ids") + length("completion_ids" if "completion_ids" in names else "output_ids")


def check_rows_batch(batch: Any, rules: RowRules, index0: int = 0) -> Any:
    """export-data's row checks on a ``RecordBatch``/``Table`` of records (reconstructed rows, engine records or
    ``{input_ids, loss_mask}`` rows): one row per record, :func:`check_schema` — ``index`` (``index0`` + the
    position), ``id`` (a kept row's as written; a drop's as ``manifest.json`` lists it, null without one),
    ``status`` (``ok`` or ``dropped``), ``reason`` and ``detail`` (a drop's), ``truncated``, and the training
    row's ``input_ids`` / ``loss_mask`` (null when dropped).
    The same rows and reasons ``kimi-eagle export-data`` gives the records at those source indices."""
    import pyarrow as pa

    batch, stats = _one_batch(batch), ExportStats()
    rows, n = check_batch(batch, index0, rules, stats), batch.num_rows
    where = np.full(n, -1, dtype=np.int64)
    where[rows.index - index0] = np.arange(len(rows))
    ids: list[str | None] = [rows.ids[k] if k >= 0 else None for k in where]
    reason, detail = [None] * n, [None] * n
    for d in stats.dropped:
        k = d["index"] - index0
        ids[k], reason[k], detail[k] = d["id"], d["reason"], d["detail"]
    take = pa.array(where, mask=where < 0)
    lists = [pa.ListArray.from_arrays(pa.array(rows.offsets.astype(np.int32)), pa.array(v, t)).take(take)
             for v, t in ((rows.input_ids, pa.int64()), (rows.loss_mask, pa.int8()))]
    truncated = (where >= 0) & (_source_lengths(batch) > (rules.max_length or np.iinfo(np.int64).max))
    return pa.table([pa.array(np.arange(n, dtype=np.int64) + index0), pa.array(ids, pa.string()),
                     pa.array(np.where(where >= 0, "ok", "dropped")), pa.array(reason, pa.string()),
                     pa.array(detail, pa.string()), pa.array(truncated), *lists], schema=check_schema())
