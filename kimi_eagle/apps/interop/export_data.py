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
  hidden states for it go to ``DIR/hidden_states/hs_{row}.safetensors`` (see ``layouts``).

Every target also gets ``manifest.json`` and the run configs of ``configs`` (SpecForge YAML,
speculators command lines) with the target's layer ids in each trainer's convention.
"""
from __future__ import annotations

import io
import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from kimi_eagle.assets import sha256_file
from kimi_eagle.eagle3 import draft_vocab as dv
from kimi_eagle.io import read_jsonl, write_bytes, write_json, write_jsonl

FORMAT = "kimi-eagle-export-data/1"
TARGETS = ("tokens", "speculators", "specforge")
DROP_REASONS = ("malformed", "status_error", "empty_completion", "id_out_of_vocab", "no_supervised_tokens")


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


def to_training_row(index: int, obj: Any, *, vocab_size: int, max_length: int | None,
                    drop_flags: Sequence[str] = ()) -> tuple[TrainingRow | None, str | None, str, bool]:
    """``(row, None, "", truncated)`` or ``(None, reason, detail, False)`` for one input record.

    Accepts a reconstructed row (``status``, ``prompt_ids``, ``completion_ids``, ``flags``), an engine
    record (``prompt_ids``, ``output_ids``, ``error``) or a pre-tokenized ``{input_ids, loss_mask}`` row.
    """
    if not isinstance(obj, dict):
        return None, "malformed", "record is not an object", False
    rid = str(obj.get("id", index))
    if obj.get("status", "ok") != "ok" or (obj.get("error") and "status" not in obj):
        return None, "status_error", str(obj.get("error") or obj.get("status")), False
    flags = [f for f in (obj.get("flags") or []) if f in drop_flags]
    if flags:
        return None, f"flag:{flags[0]}", ",".join(flags), False
    try:
        if "input_ids" in obj:
            ids = [int(i) for i in obj["input_ids"]]
            mask = [int(m) for m in (obj.get("loss_mask") if obj.get("loss_mask") is not None else [1] * len(ids))]
            if any(m not in (0, 1) for m in mask):
                return None, "malformed", "loss_mask values must be 0 or 1", False
        else:
            completion = obj.get("completion_ids", obj.get("output_ids"))
            if completion is None:
                return None, "malformed", "no input_ids, completion_ids or output_ids", False
            prompt = [int(i) for i in (obj.get("prompt_ids") or [])]
            completion = [int(i) for i in completion]
            ids, mask = prompt + completion, [0] * len(prompt) + [1] * len(completion)
    except (TypeError, ValueError) as e:
        return None, "malformed", f"ids are not integers: {e}", False
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


def collect_rows(path: str | Path, *, vocab_size: int, max_length: int | None = None,
                 drop_flags: Sequence[str] = ()) -> tuple[list[TrainingRow], ExportStats]:
    """Every usable row of ``path`` and the stats accounting for every record."""
    stats = ExportStats()
    rows: list[TrainingRow] = []
    for index, obj, error in iter_records(path):
        stats.rows_in += 1
        if error:
            rid = obj.get("id") if isinstance(obj, dict) else None
            stats.drop(index, rid, "malformed", error)
            continue
        row, reason, detail, truncated = to_training_row(index, obj, vocab_size=vocab_size, max_length=max_length,
                                                         drop_flags=drop_flags)
        if row is None:
            rid = obj.get("id") if isinstance(obj, dict) else None
            stats.drop(index, None if rid is None else str(rid), reason or "malformed", detail)
            continue
        rows.append(row)
        stats.rows_written += 1
        stats.rows_truncated += truncated
        stats.tokens_written += len(row.input_ids)
        stats.supervised_tokens += sum(row.loss_mask)
    return rows, stats


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


def draft_vocab_for(rows: Sequence[TrainingRow], vocab_size: int, draft_vocab_size: int) -> dv.DraftVocab:
    """The top-N supervised tokens of ``rows`` (the same choice both trainers make from these counts)."""
    counts = dv.supervised_counts(((r.input_ids, r.loss_mask) for r in rows), vocab_size)
    return dv.build(counts, min(draft_vocab_size, vocab_size))


def token_freq(vocab: dv.DraftVocab) -> dict[int, int]:
    """speculators' ``token_freq.pt`` content: ``{token_id: supervised count}`` for every seen token."""
    seen = torch.nonzero(vocab.counts).flatten().tolist()
    return {int(t): int(vocab.counts[t]) for t in seen}


def write_specforge_vocab(out: Path, vocab: dv.DraftVocab) -> Path:
    """``vocab_mapping.pt``: ``{"d2t": int64[N], "t2d": bool[V]}`` (SpecForge's ``load_vocab_mapping``)."""
    return write_bytes(out / "vocab_mapping.pt", _torch_bytes({"d2t": vocab.d2t.to(torch.int64), "t2d": vocab.t2d}))


def write_speculators_vocab(out: Path, vocab: dv.DraftVocab) -> list[Path]:
    """``token_freq.pt`` plus ``d2t-N.npy`` (int64) / ``t2d-N.npy`` (bool), the names speculators looks for."""
    n = vocab.size
    return [write_bytes(out / "token_freq.pt", _torch_bytes(token_freq(vocab))),
            write_bytes(out / f"d2t-{n}.npy", _npy_bytes(vocab.d2t.to(torch.int64))),
            write_bytes(out / f"t2d-{n}.npy", _npy_bytes(vocab.t2d))]


def write_arrow_dataset(out: Path, rows: Sequence[TrainingRow]) -> list[Path]:
    """The rows as a ``datasets`` Arrow dataset in ``out`` (``input_ids``, ``loss_mask`` int64, ``seq_len``).

    Saved into a temporary folder beside the files, then each file is moved in with ``os.replace``,
    ``state.json`` last, so ``load_from_disk`` never sees a half-written dataset.
    """
    try:
        import datasets
        import pyarrow as pa
    except ImportError as e:  # pragma: no cover - the interop extra is part of make test
        raise RuntimeError("--to speculators needs the `datasets` package: pip install -e '.[interop]'") from e
    table = pa.table({
        "input_ids": pa.array([r.input_ids for r in rows], type=pa.list_(pa.int64())),
        "loss_mask": pa.array([r.loss_mask for r in rows], type=pa.list_(pa.int64())),
        "seq_len": pa.array([len(r.input_ids) for r in rows], type=pa.int64()),
    })
    tmp = out / f".arrow.{os.getpid()}.tmp"
    # torch format, as speculators' prepare-data saves it: its ArrowDataset compares rows with torch.equal
    datasets.Dataset(table).with_format("torch").save_to_disk(str(tmp))
    names = sorted(p.name for p in tmp.iterdir())
    names.sort(key=lambda n: n == "state.json")
    for name in names:
        os.replace(tmp / name, out / name)
    tmp.rmdir()
    return [out / n for n in names]


def export_data(source: str | Path, to: str, out: str | Path, *, vocab_size: int, max_length: int | None = None,
                drop_flags: Sequence[str] = (), draft_vocab_size: int = 32000, target: str | None = None,
                n_layers: int | None = None, hidden_size: int | None = None) -> dict:
    """Export ``source`` for ``to`` into ``out``; returns the manifest (also written as ``manifest.json``)."""
    from kimi_eagle.apps.interop import configs

    if to not in TARGETS:
        raise ValueError(f"unknown target {to!r}: choose from {', '.join(TARGETS)}")
    source, out = Path(source), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    rows, stats = collect_rows(source, vocab_size=vocab_size, max_length=max_length, drop_flags=drop_flags)
    written: list[Path] = []
    line = lambda r: {"id": r.id, "input_ids": r.input_ids, "loss_mask": r.loss_mask}  # noqa: E731
    vocab = draft_vocab_for(rows, vocab_size, draft_vocab_size) if rows else None
    if to == "tokens":
        written.append(write_jsonl(out / "rows.jsonl", (line(r) for r in rows)))
    elif to == "specforge":
        written.append(write_jsonl(out / "prompts.jsonl", (line(r) for r in rows)))
        if vocab is not None:
            written.append(write_specforge_vocab(out, vocab))
    else:
        written += write_arrow_dataset(out, rows)
        written.append(write_jsonl(out / "row_ids.jsonl", ({"row": k, "id": r.id, "index": r.index}
                                                            for k, r in enumerate(rows))))
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
    cfg = json.loads(path.read_text())
    return cfg.get("text_config", cfg)
