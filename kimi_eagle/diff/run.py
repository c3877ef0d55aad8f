"""``kimi-eagle diff``: engine token IDs against reconstructed IDs, by bytes, for every record.

    kimi-eagle diff --engine ENGINE.jsonl --reconstructed RECON.parquet -o DIFF_DIR [--tokenizer DIR] [--labels LABELS]

Writes ``DIFF_DIR/records.parquet`` — one row for every id in either input, with ``status``
``ok``, ``missing_engine`` (reconstructed only), ``missing_api`` (engine only) or ``error``
(unparseable or invalid engine record, failed reconstruction, duplicate id, out-of-range IDs) and
the reason — and ``DIFF_DIR/hunks.parquet``, one row per differing run. Nothing is dropped: every
reconstructed row and every engine line (each JSON value of it) is in exactly one records row. Per id,
the first *valid* record of each input wins; every later one is an ``error`` row naming the first
(``duplicate id 'X' in the engine input (first valid record at engine line N)``), so an id can have
more than one row: the pair's, then one per extra record.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from kimi_eagle.diff.align import AlignError, check_ids
from kimi_eagle.diff.billing import check_segments, completion_billing, flags_list, reasoning_billing
from kimi_eagle.diff.classify import HunkVerdict, RecordVerdict, classify
from kimi_eagle.io import atomic_path, read_jsonl, write_json, write_lines
from kimi_eagle.records import RecordError, check_id, parse_engine_record, printable_id
from kimi_eagle.tokenize.tokenizer import Tokenizer

RECON_COLUMNS = ("id", "status", "completion_ids", "segments")
STATUSES = ("ok", "missing_engine", "missing_api", "error")

RECORD_SCHEMA = pa.schema([
    ("id", pa.string()), ("dataset", pa.string()), ("status", pa.string()), ("error", pa.string()),
    ("verdict", pa.string()), ("label", pa.string()), ("subclasses", pa.list_(pa.string())),
    ("expected", pa.string()),
    ("n_engine_tokens", pa.int64()), ("n_recon_tokens", pa.int64()), ("token_delta", pa.int64()),
    ("n_hunks", pa.int64()), ("n_split_hunks", pa.int64()), ("n_semantic_hunks", pa.int64()),
    ("engine_canonical", pa.bool_()), ("first_divergence", pa.int64()), ("first_divergence_frac", pa.float64()),
    ("prompt_match", pa.bool_()), ("format", pa.string()), ("flags", pa.list_(pa.string())),
    ("finish_reason", pa.string()), ("engine_finish_reason", pa.string()), ("provider", pa.string()),
    ("billed_completion_tokens", pa.int64()), ("billing_delta", pa.int64()),
    ("billing_explained", pa.int64()), ("billing_unexplained", pa.int64()),
    ("billed_reasoning_tokens", pa.int64()), ("recon_reasoning_tokens", pa.int64()),
    ("reasoning_delta", pa.int64()), ("reasoning_explained", pa.int64()), ("reasoning_unexplained", pa.int64()),
    ("engine_line", pa.int64()), ("serving", pa.string()),
])
HUNK_SCHEMA = pa.schema([
    ("id", pa.string()), ("dataset", pa.string()), ("hunk", pa.int64()), ("kind", pa.string()),
    ("subclass", pa.string()), ("segment", pa.string()),
    ("engine_tok_start", pa.int64()), ("engine_tok_end", pa.int64()),
    ("recon_tok_start", pa.int64()), ("recon_tok_end", pa.int64()),
    ("engine_byte_start", pa.int64()), ("engine_byte_end", pa.int64()),
    ("recon_byte_start", pa.int64()), ("recon_byte_end", pa.int64()),
    ("engine_ids", pa.list_(pa.int64())), ("recon_ids", pa.list_(pa.int64())),
    ("engine_bytes", pa.binary()), ("recon_bytes", pa.binary()),
    ("token_delta", pa.int64()), ("engine_canonical", pa.bool_()), ("recon_canonical", pa.bool_()),
])


@dataclass
class EngineEntry:
    id: str
    line: int
    output_ids: list[int] | None = None
    prompt_ids: list[int] | None = None
    finish_reason: str | None = None
    error: str | None = None


@dataclass
class DiffResult:
    records: pd.DataFrame
    hunks: pd.DataFrame


# --------------------------------------------------------------------------------------------
# inputs


class EngineRecords(dict):
    """The engine input as ``{id: the entry that stands for the id}`` — its first *valid* record, else its first
    record — with ``all``: every entry in input order, nothing dropped. A later valid record with an id that a
    valid one already holds carries the error ``duplicate id 'X' in the engine input (first valid record at
    engine line N)``; an invalid record never claims an id."""

    def __init__(self, entries: list[EngineEntry]) -> None:
        super().__init__()
        self.all = entries
        for entry in entries:
            held = self.get(entry.id)
            if held is None or (held.error and not entry.error):
                self[entry.id] = entry


def read_engine(path: str | Path, tok: Tokenizer) -> EngineRecords:
    """Every engine line as an entry; bad lines, bad records and later duplicates become entries with an ``error``."""
    entries: list[EngineEntry] = []
    first_valid: dict[str, int] = {}
    unreadable: Counter[int] = Counter()
    for line in read_jsonl(path):
        if line.error:  # unreadable: a synthetic id no real one can take (kimi_eagle.records.RESERVED_ID)
            unreadable[line.lineno] += 1  # several values on one line: one entry each
            n = unreadable[line.lineno]
            rid = f"<engine line {line.lineno}>" if n == 1 else f"<engine line {line.lineno} value {n}>"
            entries.append(EngineEntry(rid, line.lineno, error=line.error))
            continue
        entry = engine_entry(tok, line.obj, line.lineno)
        if not entry.error:
            if entry.id in first_valid:
                entry.error = (f"duplicate id {entry.id!r} in the engine input "
                               f"(first valid record at engine line {first_valid[entry.id]})")
            else:
                first_valid[entry.id] = line.lineno
        entries.append(entry)
    return EngineRecords(entries)


def engine_entry(tok: Tokenizer, obj: Any, lineno: int) -> EngineEntry:
    """One parsed engine record (line ``lineno``) as an entry; ``error`` says why it cannot be diffed (an invalid
    record, an empty output, an ID outside the vocabulary). Never raises for a bad record."""
    raw_id = obj.get("id") if isinstance(obj, dict) else None
    try:
        rec = parse_engine_record(obj)
        entry = EngineEntry(rec.id, lineno, rec.output_ids, rec.prompt_ids, rec.finish_reason)
        entry.error = _ids_error(tok, rec.output_ids, "output_ids") or (
            _ids_error(tok, rec.prompt_ids, "prompt_ids") if rec.prompt_ids is not None else None)
    except Exception as e:  # RecordError, or anything unforeseen: this record's error, never the run's
        try:
            rid = check_id(raw_id)
        except RecordError:
            rid = f"<engine line {lineno}>"
        reason = str(e) if isinstance(e, RecordError) else f"unexpected {type(e).__name__}: {e}"
        entry = EngineEntry(rid, lineno, error=printable_id(f"engine line {lineno}: {reason}"))
    return entry


def _ids_error(tok: Tokenizer, ids: list[int], field: str) -> str | None:
    """Why the engine's ``field`` cannot be diffed (empty output, an ID outside the vocabulary), or None."""
    if not ids and field == "output_ids":
        return "engine output_ids is empty"
    try:
        check_ids(tok, ids, f"engine {field}")
    except AlignError as e:
        return str(e)
    return None


def read_reconstructed(path: str | Path) -> list[dict[str, Any]]:
    """The reconstructed rows; raises ValueError with the reason if the file is not usable."""
    try:
        table = pq.read_table(path)
    except FileNotFoundError:
        raise
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{path}: not a readable parquet file ({e})") from None
    missing = [c for c in RECON_COLUMNS if c not in table.column_names]
    if missing:
        raise ValueError(f"{path}: not a reconstructed-rows file, missing columns {missing}")
    return table.to_pylist()


def read_labels(path: str | Path) -> dict[str, str | None]:
    """``{id: expected label}`` from a ``labels.parquet`` (or JSONL) with ``id`` and ``expected``."""
    path = Path(path)
    if path.suffix == ".parquet":
        try:
            rows = [(k + 1, r) for k, r in enumerate(pq.read_table(path, columns=["id", "expected"]).to_pylist())]
        except (pa.ArrowException, OSError) as e:
            raise ValueError(f"{path}: not a labels file with columns id and expected ({e})") from None
    else:
        rows = []
        for ln in read_jsonl(path):
            if ln.error:
                raise ValueError(f"{path}: {ln.error}")
            rows.append((ln.lineno, ln.obj))
    labels: dict[str, str | None] = {}
    for where, r in rows:
        if not (isinstance(r, dict) and isinstance(r.get("id"), str)
                and (r.get("expected") is None or isinstance(r.get("expected"), str))):
            raise ValueError(f"{path}: label {where}: needs a string id and an expected label (a string or null), "
                             f"got {str(r)[:120]}")
        labels.setdefault(r["id"], r["expected"])
    return labels


# --------------------------------------------------------------------------------------------
# diff


def _empty_record(rid: str, status: str, error: str | None = None, **extra: Any) -> dict[str, Any]:
    row = {f.name: None for f in RECORD_SCHEMA}
    row.update({"subclasses": [], "flags": [], **extra, "id": rid, "status": status, "error": error})
    return row


def _recon_fields(r: dict[str, Any]) -> dict[str, Any]:
    try:
        flags = flags_list(r.get("flags"))
    except ValueError:  # diff_record makes the row an error saying why
        flags = []
    dataset = r.get("dataset")
    return dict(dataset=dataset if isinstance(dataset, str) else None, format=r.get("format"), flags=flags,
                finish_reason=r.get("finish_reason"), provider=r.get("provider"),
                billed_completion_tokens=r.get("billed_completion_tokens"),
                billed_reasoning_tokens=r.get("billed_reasoning_tokens"),
                serving=r.get("serving") if isinstance(r.get("serving"), str) else None)


def diff_record(tok: Tokenizer, eng: EngineEntry, rec: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The records row and hunk rows of one id present (and valid) in both inputs."""
    recon_ids = list(rec["completion_ids"] if rec.get("completion_ids") is not None else [])
    row = _empty_record(rec["id"], "ok", engine_line=eng.line, engine_finish_reason=eng.finish_reason, **_recon_fields(rec))
    try:
        segments = check_segments(rec.get("segments"), len(recon_ids))
        flags_list(rec.get("flags"))
    except ValueError as e:
        row.update(status="error", error=f"reconstructed row: {e}")
        return row, []
    try:
        v = classify(tok, eng.output_ids or [], recon_ids, segments)
    except AlignError as e:
        row.update(status="error", error=f"reconstructed completion_ids: {e}")
        return row, []
    hunk_rows = [_hunk_row(rec["id"], row["dataset"], k, hv, v) for k, hv in enumerate(v.hunks)]
    row.update(_verdict_fields(v))
    if eng.prompt_ids is not None and rec.get("prompt_ids") is not None:
        row["prompt_match"] = list(eng.prompt_ids) == list(rec["prompt_ids"])
    cb = completion_billing(row["billed_completion_tokens"], v.n_recon, v.n_engine)
    in_reasoning = [hv.hunk.token_delta for hv in v.hunks if "reasoning" in hv.segment.split("+")]
    rb = reasoning_billing(row["billed_reasoning_tokens"], segments, in_reasoning)
    row.update(billing_delta=cb.delta, billing_explained=cb.explained, billing_unexplained=cb.unexplained,
               recon_reasoning_tokens=rb.reconstructed, reasoning_delta=rb.delta,
               reasoning_explained=rb.explained, reasoning_unexplained=rb.unexplained)
    return row, hunk_rows


def _verdict_fields(v: RecordVerdict) -> dict[str, Any]:
    first = v.first_divergence
    return dict(verdict=v.verdict, label=v.label, subclasses=list(v.subclasses),
                n_engine_tokens=v.n_engine, n_recon_tokens=v.n_recon, token_delta=v.token_delta,
                n_hunks=len(v.hunks), n_split_hunks=sum(h.kind == "split" for h in v.hunks),
                n_semantic_hunks=sum(h.kind == "semantic" for h in v.hunks),
                engine_canonical=v.engine_canonical, first_divergence=first,
                first_divergence_frac=None if first is None else first / max(v.n_engine, 1))


def _hunk_row(rid: str, dataset: str | None, k: int, hv: HunkVerdict, v: RecordVerdict) -> dict[str, Any]:
    h, al = hv.hunk, v.alignment
    return dict(id=rid, dataset=dataset, hunk=k, kind=hv.kind, subclass=hv.subclass, segment=hv.segment,
                engine_tok_start=h.a_start, engine_tok_end=h.a_end, recon_tok_start=h.b_start, recon_tok_end=h.b_end,
                engine_byte_start=h.a_byte_start, engine_byte_end=h.a_byte_end,
                recon_byte_start=h.b_byte_start, recon_byte_end=h.b_byte_end,
                engine_ids=al.a[h.a_start : h.a_end], recon_ids=al.b[h.b_start : h.b_end],
                engine_bytes=al.a.run_bytes(h.a_start, h.a_end), recon_bytes=al.b.run_bytes(h.b_start, h.b_end), token_delta=h.token_delta,
                engine_canonical=hv.engine_canonical, recon_canonical=hv.recon_canonical)


def diff_rows(tok: Tokenizer, engine: dict[str, EngineEntry], recon_rows: Iterable[dict[str, Any]],
              labels: dict[str, str] | None = None) -> DiffResult:
    """Diff every record of either input: one records row per reconstructed row and per engine entry not paired
    with one (nothing dropped). Per id, the first valid reconstructed row (else its first row) pairs with the
    engine's first valid record (else its first); every other row or entry with that id is an ``error`` row with
    its own reason — a later valid one names the first: ``duplicate id 'X' in the ... input (first valid ...)``.
    Row order: reconstructed order, then the unpaired engine entries in line order.

    ``engine``: :func:`read_engine`'s :class:`EngineRecords` (a plain ``{id: entry}`` dict is taken as is)."""
    labels = labels or {}
    entries = engine.all if isinstance(engine, EngineRecords) else list(engine.values())
    primary_engine = engine if isinstance(engine, EngineRecords) else EngineRecords(entries)
    recon = list(recon_rows)
    first_ok: dict[str, int] = {}
    for k, rec in enumerate(recon):
        if rec.get("status") == "ok":
            first_ok.setdefault(str(rec["id"]), k)
    primary_recon: dict[str, int] = {}
    for k, rec in enumerate(recon):
        primary_recon.setdefault(str(rec["id"]), first_ok.get(str(rec["id"]), k))
    records: list[dict[str, Any]] = []
    hunks: list[dict[str, Any]] = []
    paired: set[int] = set()  # id() of the engine entries already in a row
    for k, rec in enumerate(recon):
        rid = str(rec["id"])
        if k != primary_recon[rid]:
            first = recon[primary_recon[rid]]
            where = f"line {first['line']}" if first.get("line") is not None else f"row {primary_recon[rid] + 1}"
            reason = (f"duplicate id {rid!r} in the reconstructed input (first valid row: {where})"
                      if rec.get("status") == "ok" else f"reconstruction: {rec.get('error') or rec.get('status')}")
            records.append(_empty_record(rid, "error", reason, **_recon_fields(rec)))
            continue
        eng = primary_engine.get(rid)
        if eng is not None:
            paired.add(id(eng))
        line = None if eng is None else eng.line
        if rec.get("status") != "ok":
            row = _empty_record(rid, "error", f"reconstruction: {rec.get('error') or rec.get('status')}",
                                engine_line=line, **_recon_fields(rec))
        elif eng is None:
            row = _empty_record(rid, "missing_engine", "no engine record with this id", **_recon_fields(rec))
        elif eng.error:
            row = _empty_record(rid, "error", eng.error, engine_line=line, **_recon_fields(rec))
        else:
            try:
                row, hunk_rows = diff_record(tok, eng, rec)
            except Exception as e:  # a record the checks did not foresee becomes its own error row
                row, hunk_rows = _empty_record(rid, "error", f"unexpected {type(e).__name__}: {e}", engine_line=line,
                                               **_recon_fields(rec)), []
            hunks += hunk_rows
        records.append(row)
    for eng in entries:
        if id(eng) not in paired:
            status = "error" if eng.error else "missing_api"
            records.append(_empty_record(eng.id, status, eng.error or "no reconstructed row with this id",
                                         engine_line=eng.line))
    for row in records:
        row["expected"] = labels.get(row["id"])
    return DiffResult(pa.Table.from_pylist(records, schema=RECORD_SCHEMA).to_pandas(),
                      pa.Table.from_pylist(hunks, schema=HUNK_SCHEMA).to_pandas())


def diff_files(tok: Tokenizer, engine_path: str | Path, recon_path: str | Path,
               labels_path: str | Path | None = None) -> DiffResult:
    labels = read_labels(labels_path) if labels_path else None
    return diff_rows(tok, read_engine(engine_path, tok), read_reconstructed(recon_path), labels)


def sample_pair(api_path: str | Path, engine_path: str | Path, n: int | None, out_dir: str | Path) -> tuple[Path, Path]:
    """The first ``n`` API records (all if ``n`` is None) and the engine lines with the same ids.

    Engine lines that are not JSON or have no id are kept (they become error rows), so sampling
    never hides bad input. Written to ``out_dir/api.jsonl`` and ``out_dir/engine.jsonl``.
    """
    out = Path(out_dir)
    api_lines, ids = [], set()
    with open(api_path, "rb") as f:
        for raw in f:
            if not raw.strip():
                continue
            if n is not None and len(api_lines) == n:
                break
            api_lines.append(raw if raw.endswith(b"\n") else raw + b"\n")
            try:
                ids.add(str(json.loads(raw).get("id")))
            except (ValueError, AttributeError):
                pass
    engine_lines = []
    with open(engine_path, "rb") as f:
        for raw in f:
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
                rid = obj.get("id", (obj.get("meta_info") or {}).get("id"))
            except (ValueError, AttributeError):
                rid = None
            if rid is None or str(rid) in ids:
                engine_lines.append(raw if raw.endswith(b"\n") else raw + b"\n")
    paths = (out / "api.jsonl", out / "engine.jsonl")
    for path, lines in zip(paths, (api_lines, engine_lines)):
        write_lines(path, lines)
    return paths


# --------------------------------------------------------------------------------------------
# output


def _write_parquet(df: pd.DataFrame, schema: pa.Schema, path: Path) -> None:
    table = pa.Table.from_pandas(df, schema=schema, preserve_index=False)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def write_diff(result: DiffResult, out_dir: str | Path, meta: dict[str, Any] | None = None) -> Path:
    """Write ``records.parquet``, ``hunks.parquet`` and ``meta.json`` atomically into ``out_dir``."""
    out = Path(out_dir)
    _write_parquet(result.records, RECORD_SCHEMA, out / "records.parquet")
    _write_parquet(result.hunks, HUNK_SCHEMA, out / "hunks.parquet")
    meta = {**(meta or {}), "n_records": len(result.records), "n_hunks": len(result.hunks),
            "status": result.records["status"].value_counts().to_dict()}
    write_json(out / "meta.json", meta)
    return out


def read_diff(diff_dir: str | Path) -> DiffResult:
    """Read a diff directory back; raises ValueError naming the file if one is missing or corrupt."""
    d = Path(diff_dir)
    frames = []
    for name, schema in (("records.parquet", RECORD_SCHEMA), ("hunks.parquet", HUNK_SCHEMA)):
        path = d / name
        if not path.is_file():
            raise ValueError(f"{d}: no {name} here (is this the output of `kimi-eagle diff`?)")
        try:
            table = pq.read_table(path)
        except (pa.ArrowException, OSError) as e:
            raise ValueError(f"{path}: not a readable parquet file ({e})") from None
        check_schema(table.schema, schema, path)
        frames.append(table.to_pandas())
    return DiffResult(*frames)


def check_schema(found: pa.Schema, expected: pa.Schema, path: Path) -> None:
    """ValueError naming the columns of ``expected`` that ``found`` lacks or holds with another type."""
    missing = [f.name for f in expected if f.name not in found.names]
    wrong = [f"{f.name} ({found.field(f.name).type}, not {f.type})" for f in expected
             if f.name in found.names and not found.field(f.name).type.equals(f.type)
             and not pa.types.is_null(found.field(f.name).type)]
    if missing or wrong:
        what = "; ".join(x for x in (f"missing {', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}"
                                     if missing else "", f"wrong type: {', '.join(wrong[:3])}" if wrong else "") if x)
        raise ValueError(f"{path}: not the schema `kimi-eagle diff` writes ({what})")


# --------------------------------------------------------------------------------------------
# CLI
