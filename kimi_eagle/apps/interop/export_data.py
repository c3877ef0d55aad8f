"""``kimi-eagle export-data ROWS --to tokens|speculators|specforge -o DIR``: exact-ID training rows.

One training row per assistant turn: ``input_ids`` = prompt IDs + completion IDs exactly as they are
in ROWS (a reconstructed ``.parquet`` from ``kimi-eagle reconstruct``, or ``.jsonl`` engine records /
``{input_ids, loss_mask}`` rows), ``loss_mask`` 1 over the completion. Nothing is re-tokenized.

Every input record is accounted for: a row is written, or dropped with a named reason counted in
``manifest.json`` (and listed there with its index and id). Reasons: ``malformed``,
``status_error``, ``empty_completion``, ``flag:<name>`` (``--drop-flag``), ``id_out_of_vocab``,
``no_supervised_tokens`` (none left after ``--max-length``). Rows longer than ``--max-length``
are cut there and counted as truncated.

Files per target (all in DIR, each written atomically):

* ``tokens``: ``rows.jsonl`` ``{id, input_ids, loss_mask}``.
* ``specforge``: ``prompts.jsonl`` ``{id, input_ids, loss_mask}`` (SpecForge's pre-tokenized
  ``data.prompts_path``) and ``vocab_mapping.pt`` ``{"d2t": int64[N], "t2d": bool[V]}``.
* ``speculators``: an Arrow dataset (``datasets`` ``save_to_disk`` layout: ``input_ids`` int64,
  ``loss_mask`` int64, ``seq_len``), ``token_freq.pt`` ``{id: count}``, ``d2t-N.npy`` / ``t2d-N.npy``;
  hidden states for it go to ``DIR/hidden_states/hs_{row}.safetensors`` (see ``layouts``). Its
  ``state.json`` ``_fingerprint`` derives from :func:`arrow_fingerprint` (a content hash), not from
  ``datasets`` hashing the pickled table; every other byte is ``datasets``' own.

Every file is built from Arrow/numpy columns (no per-row Python): the JSONL lines are Arrow string
arrays (built two chunks at a time in threads; Arrow releases the GIL), the same bytes as ``json.dumps``
(tests/test_export_data_checks.py compares them with the per-record writer on the bundled data).

Every target also gets ``manifest.json`` and the run configs of ``configs`` (SpecForge YAML,
speculators command lines) with the target's layer ids in each trainer's convention.
"""
from __future__ import annotations

import functools
import io
import json
import os
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from kimi_eagle.apps.interop.export_rows import (  # noqa: F401 - the row checks, re-exported
    ExportRows,
    ExportStats,
    TrainingRow,
    collect_rows,
    to_training_row,
)
from kimi_eagle.assets import sha256_file
from kimi_eagle.eagle3 import draft_vocab as dv
from kimi_eagle.io import atomic_path, read_jsonl, write_bytes, write_json

FORMAT = "kimi-eagle-export-data/1"
TARGETS = ("tokens", "speculators", "specforge")
DROP_REASONS = ("malformed", "status_error", "empty_completion", "id_out_of_vocab", "no_supervised_tokens")


def iter_records(path: str | Path, batch_rows: int = 4096) -> Iterator[tuple[int, Any, str | None]]:
    """``(index, record, parse_error)`` for every record of a ``.parquet`` or ``.jsonl`` file, streamed."""
    path = Path(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        index = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_rows):
            for obj in batch.to_pylist():
                yield index, obj, None
                index += 1
    else:
        for index, line in enumerate(read_jsonl(path)):
            yield index, line.obj, line.error


# ------------------------------------------------------------------------------------------
# writers


def _torch_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _npy_bytes(tensor: torch.Tensor) -> bytes:
    import numpy as np

    buf = io.BytesIO()
    np.save(buf, tensor.numpy())
    return buf.getvalue()


def draft_vocab_for(rows: ExportRows, vocab_size: int, draft_vocab_size: int) -> dv.DraftVocab:
    """The top-N supervised tokens of ``rows`` (the same choice both trainers make from these counts)."""
    import numpy as np

    supervised = rows.input_ids[rows.loss_mask == 1]
    if supervised.dtype in (np.int32, np.int64):  # torch counts these as they are (numpy would copy to int64)
        counts = torch.bincount(torch.from_numpy(supervised), minlength=vocab_size).to(torch.int64)
    else:
        counts = torch.from_numpy(np.bincount(supervised, minlength=vocab_size).astype(np.int64))
    return dv.build(counts, min(draft_vocab_size, vocab_size))


def _list_array(rows: ExportRows, values: Any, value_type: Any = None) -> Any:
    """``list<int64>`` (or ``value_type``) of ``values`` cut at the rows' offsets (``large_list`` past 2**31 values)."""
    import pyarrow as pa

    values = pa.array(values, value_type or pa.int64())
    if rows.offsets[-1] >= 2**31:
        return pa.LargeListArray.from_arrays(pa.array(rows.offsets, pa.int64()), values)
    return pa.ListArray.from_arrays(pa.array(rows.offsets, pa.int32()), values)


@functools.lru_cache(maxsize=2)
def _id_texts(n: int) -> Any:
    """``f"{i}, "`` for ``i`` in ``range(n)``, then ``f"{i}"`` (a row's last ID) for the same ``i``, as one Arrow
    string array (built once per process and size)."""
    import pyarrow as pa

    return pa.array([f"{i}, " for i in range(n)] + [str(i) for i in range(n)], pa.string())


def _joined_ids(rows: ExportRows) -> Any:
    """Each row's IDs as JSON list text (``json.dumps``'s ``1, 2, 3``), one string per row, in Arrow.

    IDs that are vocabulary indices are looked up in :func:`_id_texts` with one ``take`` (a row's last ID without
    its ``", "``): the taken values, one after another, are the rows' texts, so the rows are views of that one
    buffer at the row offsets; other IDs are cast and joined."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    ids, lengths = rows.input_ids, np.diff(rows.offsets)
    top = int(ids.max()) + 1 if len(ids) else 0
    if len(ids) and 0 <= int(ids.min()) and top <= 1 << 21 and len(ids) * 9 < 2**31:  # <= 9 bytes an ID
        n = max(top, 1 << 18) if top <= 1 << 18 else 1 << 21
        index = ids.astype(np.int32)
        index[rows.offsets[1:][lengths > 0] - 1] += n  # each row's last ID: its text without the separator
        taken = pc.take(_id_texts(n), pa.array(index), boundscheck=False)  # bounds checked above: 0 <= ids < top
        ends = np.frombuffer(taken.buffers()[1], dtype=np.int32)[taken.offset:taken.offset + len(ids) + 1]
        return pa.StringArray.from_buffers(len(rows), pa.py_buffer(np.ascontiguousarray(ends[rows.offsets])),
                                           taken.buffers()[2])
    text = pa.array(ids).cast(pa.string())
    if rows.offsets[-1] >= 2**31:
        return pc.binary_join(pa.LargeListArray.from_arrays(pa.array(rows.offsets, pa.int64()), text), ", ")
    return pc.binary_join(pa.ListArray.from_arrays(pa.array(rows.offsets, pa.int32()), text), ", ")


def _joined_mask(rows: ExportRows) -> Any:
    """Each row's mask as JSON list text. A mask of zeros then ones (the prompt, then the completion) is
    written by repetition (``"0, " * zeros + "1, " * ones``); any other is joined value by value."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    mask, lengths = rows.loss_mask, np.diff(rows.offsets)
    if not len(rows):
        return pa.array([], pa.string())
    starts = np.minimum(rows.offsets[:-1], max(len(mask) - 1, 0))
    ones = np.add.reduceat(mask, starts, dtype=np.int64) if len(mask) else lengths * 0
    ones = np.where(lengths > 0, ones, 0)  # reduceat gives an empty row the next value, not 0
    counts = np.stack([lengths - ones, ones], axis=1).reshape(-1)
    if not np.array_equal(np.repeat(np.tile(np.array([0, 1], dtype=mask.dtype), len(rows)), counts), mask):
        return pc.binary_join(_list_array(rows, mask, pa.int8()).cast(pa.list_(pa.string())), ", ")
    if (ones > 0).all():  # every row ends with a 1: "0, " * zeros + "1, " * (ones - 1) + "1", nothing cut
        return pc.binary_join_element_wise(pc.binary_repeat("0, ", pa.array(lengths - ones)),
                                           pc.binary_repeat("1, ", pa.array(ones - 1)), "1", "")
    text = pc.binary_join_element_wise(pc.binary_repeat("0, ", pa.array(lengths - ones)),
                                       pc.binary_repeat("1, ", pa.array(ones)), "")
    return pc.utf8_slice_codeunits(text, 0, -2)


def _text_bytes(lines: Any) -> memoryview:
    """The bytes of an Arrow string array's values, one after another (its data buffer, no copy)."""
    import numpy as np

    if not len(lines):
        return memoryview(b"")
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int32)[lines.offset:lines.offset + len(lines) + 1]
    return memoryview(lines.buffers()[2])[int(offsets[0]):int(offsets[-1])]


def _rows_slice(rows: ExportRows, a: int, b: int) -> ExportRows:
    lo, hi = int(rows.offsets[a]), int(rows.offsets[b])
    return ExportRows(rows.index[a:b], rows.ids[a:b], rows.offsets[a:b + 1] - lo, rows.input_ids[lo:hi],
                      rows.loss_mask[lo:hi])


def _jsonl_chunk(rows: ExportRows) -> Any:
    """The ``{"id", "input_ids", "loss_mask"}`` lines of ``rows`` as one Arrow string array."""
    import pyarrow.compute as pc

    return pc.binary_join_element_wise('{"id": ', json_strings(rows.ids), ', "input_ids": [', _joined_ids(rows),
                                       '], "loss_mask": [', _joined_mask(rows), ']}\n', "")


def write_training_jsonl(path: Path, rows: ExportRows, chunk_rows: int = 16384, threads: int = 2) -> Path:
    """``{"id", "input_ids", "loss_mask"}`` per row, one JSON object a line (``json.dumps``'s bytes, UTF-8
    kept), atomically. Each chunk of rows is built as one Arrow string array (Arrow's kernels, GIL released,
    ``threads`` chunks at a time) and written as one buffer, in order."""
    from concurrent.futures import ThreadPoolExecutor

    starts = range(0, len(rows), chunk_rows)
    with atomic_path(path) as tmp, open(tmp, "wb") as f, ThreadPoolExecutor(max(threads, 1)) as pool:
        pending = []
        for a in [*starts, None]:  # keep at most `threads` chunks in flight; None drains the last ones
            if a is not None:
                pending.append(pool.submit(_jsonl_chunk, _rows_slice(rows, a, min(a + chunk_rows, len(rows)))))
            while pending and (a is None or len(pending) > max(threads, 1)):
                f.write(_text_bytes(pending.pop(0).result()))
    return path


def json_strings(values: Sequence[str]) -> Any:
    """``json.dumps(v, ensure_ascii=False)`` of each string, as an Arrow string array: quoted in Arrow when no
    value holds a character JSON escapes (``"``, ``\\``, a control character), else value by value."""
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = pa.array(values, pa.string())
    if pc.any(pc.match_substring_regex(arr, r'["\\\x00-\x1f]')).as_py():
        return pa.array([json.dumps(v, ensure_ascii=False) for v in values], pa.string())
    return pc.binary_join_element_wise('"', arr, '"', "")


def write_row_ids(path: Path, rows: ExportRows) -> Path:
    """``row_ids.jsonl``: ``{"row", "id", "index"}`` per exported row (``json.dumps``'s bytes), built in Arrow."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        if len(rows):
            number = lambda v: pa.array(np.asarray(v, dtype=np.int64)).cast(pa.string())  # noqa: E731
            lines = pc.binary_join_element_wise('{"row": ', number(np.arange(len(rows))), ', "id": ',
                                                json_strings(rows.ids), ', "index": ', number(rows.index), '}\n', "")
            f.write(_text_bytes(lines))
    return path


def token_freq(vocab: dv.DraftVocab) -> dict[int, int]:
    """speculators' ``token_freq.pt`` content: ``{token_id: supervised count}`` for every seen token."""
    seen = torch.nonzero(vocab.counts).flatten()
    return dict(zip(seen.tolist(), vocab.counts[seen].tolist()))


def write_specforge_vocab(out: Path, vocab: dv.DraftVocab) -> Path:
    """``vocab_mapping.pt``: ``{"d2t": int64[N], "t2d": bool[V]}`` (SpecForge's ``load_vocab_mapping``)."""
    return write_bytes(out / "vocab_mapping.pt", _torch_bytes({"d2t": vocab.d2t.to(torch.int64), "t2d": vocab.t2d}))


def write_speculators_vocab(out: Path, vocab: dv.DraftVocab) -> list[Path]:
    """``token_freq.pt`` plus ``d2t-N.npy`` (int64) / ``t2d-N.npy`` (bool), the names speculators looks for."""
    n = vocab.size
    return [write_bytes(out / "token_freq.pt", _torch_bytes(token_freq(vocab))),
            write_bytes(out / f"d2t-{n}.npy", _npy_bytes(vocab.d2t.to(torch.int64))),
            write_bytes(out / f"t2d-{n}.npy", _npy_bytes(vocab.t2d))]


FINGERPRINT_TAG = b"kimi-eagle-export-data/1 speculators arrow rows\0"


def arrow_fingerprint(table: Any) -> str:
    """A deterministic content hash of ``table`` (integer and list-of-integer columns without nulls): xxh3-128
    (hex) over ``FINGERPRINT_TAG`` and, per column, its name and type, the xxh3-128 of its values' bytes and,
    for a list column, of its row lengths (int64). The same values give the same hash however they are chunked.

    ``datasets`` would otherwise pickle and hash the whole table to fingerprint it (most of an export's time)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import xxhash

    h = xxhash.xxh3_128(FINGERPRINT_TAG)
    for name, col in zip(table.column_names, table.columns):
        is_list = pa.types.is_list(col.type) or pa.types.is_large_list(col.type)
        values, lengths = xxhash.xxh3_128(), xxhash.xxh3_128()
        for chunk in col.chunks:
            flat = chunk.flatten() if is_list else chunk
            if chunk.null_count or flat.null_count:
                raise ValueError(f"arrow_fingerprint: column {name!r} holds nulls")
            values.update(np.ascontiguousarray(flat.to_numpy()))
            if is_list:
                lengths.update(pc.list_value_length(chunk).to_numpy().astype(np.int64))
        h.update(f"{name}\0{col.type}\0".encode() + values.digest() + lengths.digest())
    return h.hexdigest()


def write_arrow_dataset(out: Path, rows: ExportRows) -> list[Path]:
    """The rows as a ``datasets`` Arrow dataset in ``out`` (``input_ids``, ``loss_mask`` int64, ``seq_len``).

    The dataset is given :func:`arrow_fingerprint` of its table as its fingerprint (``state.json``'s
    ``_fingerprint`` is ``datasets``' update of it for the torch format, 16 hex digits); every other byte is what
    ``datasets.Dataset(table).with_format("torch").save_to_disk`` writes. Saved into a temporary folder beside
    the files, then each file is moved in with ``os.replace``, ``state.json`` last, so ``load_from_disk`` never
    sees a half-written dataset.
    """
    try:
        import datasets
        import pyarrow as pa
    except ImportError as e:  # pragma: no cover - the interop extra is part of make test
        raise RuntimeError("--to speculators needs the `datasets` package: pip install -e '.[interop]'") from e
    table = pa.table({
        "input_ids": _list_array(rows, rows.input_ids), "loss_mask": _list_array(rows, rows.loss_mask),
        "seq_len": pa.array(rows.offsets[1:] - rows.offsets[:-1], type=pa.int64()),
    })
    tmp = out / f".arrow.{os.getpid()}.tmp"
    # torch format, as speculators' prepare-data saves it: its ArrowDataset compares rows with torch.equal
    datasets.Dataset(table, fingerprint=arrow_fingerprint(table)).with_format("torch").save_to_disk(str(tmp))
    names = sorted(p.name for p in tmp.iterdir())
    names.sort(key=lambda n: n == "state.json")
    for name in names:
        os.replace(tmp / name, out / name)
    tmp.rmdir()
    return [out / n for n in names]


def check_max_length(max_length: Any) -> None:
    """ValueError unless ``max_length`` is None or an integer >= 1 (``--max-length``)."""
    if max_length is not None and (type(max_length) is not int or max_length < 1):
        raise ValueError(f"--max-length: must be an integer of at least 1, not {max_length!r}")


def export_data(source: str | Path, to: str, out: str | Path, *, vocab_size: int, max_length: int | None = None,
                drop_flags: Sequence[str] = (), draft_vocab_size: int = 32000, target: str | None = None,
                n_layers: int | None = None, hidden_size: int | None = None) -> dict:
    """Export ``source`` for ``to`` into ``out``; returns the manifest (also written as ``manifest.json``)."""
    from kimi_eagle.apps.interop import configs

    if to not in TARGETS:
        raise ValueError(f"unknown target {to!r}: choose from {', '.join(TARGETS)}")
    source, out = Path(source), Path(out)
    check_max_length(max_length)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    rows, stats = collect_rows(source, vocab_size=vocab_size, max_length=max_length, drop_flags=drop_flags)
    written: list[Path] = []
    vocab = draft_vocab_for(rows, vocab_size, draft_vocab_size) if len(rows) else None
    if to == "tokens":
        written.append(write_training_jsonl(out / "rows.jsonl", rows))
    elif to == "specforge":
        written.append(write_training_jsonl(out / "prompts.jsonl", rows))
        if vocab is not None:
            written.append(write_specforge_vocab(out, vocab))
    else:
        written += write_arrow_dataset(out, rows)
        written.append(write_row_ids(out / "row_ids.jsonl", rows))
        if vocab is not None:
            written += write_speculators_vocab(out, vocab)
    manifest = {
        "format": FORMAT, "to": to, "source": str(source), "source_sha256": sha256_file(source),
        "vocab_size": vocab_size, "max_length": max_length, "drop_flags": list(drop_flags),
        "rows_in": stats.rows_in, "rows_written": stats.rows_written, "rows_truncated": stats.rows_truncated,
        "rows_dropped": len(stats.dropped), "dropped_by_reason": stats.dropped_by_reason(),
        "tokens_written": stats.tokens_written, "supervised_tokens": stats.supervised_tokens,
        "draft_vocab": vocab.report() if vocab is not None else None,
        "dropped": stats.dropped, "seconds": round(time.perf_counter() - t0, 3),
    }
    if n_layers is not None and hidden_size is not None and vocab is not None:
        written += configs.write_configs(out, to, target=target or "TARGET", n_layers=n_layers,
                                         hidden_size=hidden_size, vocab_size=vocab_size,
                                         draft_vocab_size=vocab.size, max_length=max_length or 2048)
    manifest["files"] = sorted(p.name for p in written)
    write_json(out / "manifest.json", manifest, indent=1)
    return manifest


# ------------------------------------------------------------------------------------------
# command line


def _target_config(target: str | None) -> dict:
    if not target:
        return {}
    path = Path(target) / "config.json"
    if not path.is_file():
        raise ValueError(f"--target {target}: no config.json")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:  # issue 48: the file is named
        raise ValueError(f"--target {target}: {path} is not readable JSON ({str(e)[:160]})") from None
    cfg = cfg.get("text_config", cfg) if isinstance(cfg, dict) else cfg
    if not isinstance(cfg, dict):
        raise ValueError(f"--target {target}: {path} is not a JSON object")
    return cfg
