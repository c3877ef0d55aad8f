"""``kimi-eagle reconstruct``: API records -> token IDs, one parquet row per input record.

``reconstruct_record`` turns one API record (``{"id", "request": {"messages", "tools"?}, "response"}``)
into a :class:`ReconstructedRow`: the rendered prompt's IDs, the completion's IDs encoded once as a
whole string, typed segments with byte and token spans, and flags. Bad input raises ``RecordError``.

``reconstruct_file`` runs it over a JSONL file with worker processes. Records are cut into shards
of ``shard_size`` records; each shard is written atomically to ``OUT.parts/``; ``resume`` skips
finished shards; the final parquet is written atomically and holds exactly one row per input
record (``status`` ``ok`` or ``error`` with the reason), in input order.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

from .completion import (MAX_TEXT_CHARS, SPAN_FIELDS, CompletionOptions, PieceEncoder, ToolCall, Turn,
                         check_text)
from .formats import FORMATS, TOOL_DECLARATIONS, Format, get_format
from ..records import RecordError
from ..tokenize.tokenizer import Tokenizer, load_tokenizer

FINISH_REASONS = ("stop", "tool_calls", "length")


@dataclass(frozen=True)
class ReconstructOptions(CompletionOptions):
    """Completion options (see :class:`~kimi_eagle.reconstruct.completion.CompletionOptions`)."""


@dataclass
class ReconstructedRow:
    """One row of the reconstruction (schema in docs/CONTRACTS.md)."""

    id: str
    dataset: str | None
    status: str
    error: str | None
    format: str
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    n_prompt_tokens: int = 0
    n_completion_tokens: int = 0
    segments: list[dict[str, Any]] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    billed_completion_tokens: int | None = None
    billed_reasoning_tokens: int | None = None
    provider: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The row as a dict (shallow: the ID lists are shared, not copied)."""
        return dict(self.__dict__)

    @property
    def loss_mask(self) -> list[int]:
        return [0] * self.n_prompt_tokens + [1] * self.n_completion_tokens


# --------------------------------------------------------------------------------------------
# Parsing an API record


def _opt_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _reasoning(message: dict) -> str | None:
    """``reasoning``, else the text of ``reasoning_details``, else ``reasoning_content``."""
    r = message.get("reasoning")
    if isinstance(r, str) and r:
        return r
    details = message.get("reasoning_details")
    if isinstance(details, list):
        texts = [d["text"] for d in details if isinstance(d, dict) and isinstance(d.get("text"), str)]
        if texts:
            return "".join(texts)
    rc = message.get("reasoning_content")
    if isinstance(rc, str) and rc:
        return rc
    return None


def parse_turn(response: Any) -> Turn:
    """The generated message of an OpenRouter chat.completion response."""
    if not isinstance(response, dict):
        raise RecordError("response is not a JSON object")
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices:
        raise RecordError("response has no choices")
    choice = choices[0]
    if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
        raise RecordError("response.choices[0] has no message")
    msg = choice["message"]
    finish = choice.get("finish_reason")
    if finish not in FINISH_REASONS:
        raise RecordError(f"unknown finish_reason {finish!r} (expected one of {', '.join(FINISH_REASONS)})")
    reasoning = _reasoning(msg)
    text = msg.get("content")
    if text is not None and not isinstance(text, str):
        raise RecordError(f"message content is a {type(text).__name__}, not a string")
    calls = []
    for k, call in enumerate(msg.get("tool_calls") or []):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise RecordError(f"tool_calls[{k}] has no function name")
        args = fn.get("arguments", "")
        if isinstance(args, str):
            check_text(args, f"tool_calls[{k}] arguments")
        cid = call.get("id")
        calls.append(ToolCall(cid if isinstance(cid, str) else None, fn["name"], args))
    if not reasoning and not text and not calls:
        raise RecordError("message has no reasoning, no content and no tool calls")
    if reasoning:
        check_text(reasoning, "reasoning")
    if text:
        check_text(text, "content")
    return Turn(reasoning, text, calls, finish)


def normalise_messages(messages: Any) -> list[dict]:
    """Validate request messages; copy ``reasoning`` to ``reasoning_content`` (the field templates read)."""
    if not isinstance(messages, list):
        raise RecordError("request.messages is not a list")
    out = []
    for i, m in enumerate(messages):
        role = m.get("role") if type(m) is dict else None
        if not isinstance(role, str) or not role:
            raise RecordError(f"request.messages[{i}] is not a message with a role")
        c = m.get("content")
        if type(c) is str:
            if not c.isascii() or len(c) > MAX_TEXT_CHARS:  # ASCII cannot hold a lone surrogate
                check_text(c, f"request.messages[{i}].content")
        elif c is not None and not (isinstance(c, list) and all(isinstance(p, dict) for p in c)):
            raise RecordError(f"request.messages[{i}].content is neither a string nor a list of parts")
        calls = m.get("tool_calls")
        if calls:
            for j, call in enumerate(calls):
                if not isinstance(call, dict) or not isinstance(call.get("function"), dict) or "name" not in call["function"]:
                    raise RecordError(f"request.messages[{i}].tool_calls[{j}] has no function name")
        if role == "assistant" and "reasoning_content" not in m and isinstance(m.get("reasoning"), str):
            m = {**m, "reasoning_content": m["reasoning"]}
        out.append(m)
    return out


# --------------------------------------------------------------------------------------------
# One record


_encoders: dict[int, PieceEncoder] = {}


def _encoder(tok: Tokenizer) -> PieceEncoder:
    enc = _encoders.get(id(tok))
    if enc is None or enc.tok is not tok:
        enc = _encoders[id(tok)] = PieceEncoder(tok)
    return enc


def reconstruct_record(record: Any, tok: Tokenizer, fmt: Format,
                       options: CompletionOptions = ReconstructOptions()) -> ReconstructedRow:
    """Reconstruct one API record; raises RecordError with a clear message for bad input."""
    if not isinstance(record, dict):
        raise RecordError("record is not a JSON object")
    if record.get("error"):
        raise RecordError(f"converter: {record['error']}")
    rid = record.get("id")
    if not isinstance(rid, str) or not rid:
        raise RecordError("record has no string id")
    request, response = record.get("request"), record.get("response")
    if not isinstance(request, dict):
        raise RecordError("record has no request object")
    messages = normalise_messages(request.get("messages"))
    tools = request.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise RecordError("request.tools is not a list")
    turn = parse_turn(response)
    enc = _encoder(tok)
    flags: list[str] = []
    try:
        prompt_pieces = fmt.prompt_pieces(messages, tools)
    except RecordError:
        raise
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise RecordError(f"cannot render the prompt: {type(e).__name__}: {e}") from None
    prompt_ids, prompt_marker = enc.encode_marked(prompt_pieces)
    if prompt_marker:
        flags.append("prompt_literal_marker")
    segments, seg_flags = fmt.completion_segments(turn, messages, options)
    completion_ids, spans, marker = enc.encode_segments_marked(segments, continuation=fmt.continuation)
    if marker:
        flags.append("literal_marker")
    flags = seg_flags + flags
    usage = response.get("usage") if isinstance(response.get("usage"), dict) else {}
    details = usage.get("completion_tokens_details") if isinstance(usage.get("completion_tokens_details"), dict) else {}
    provider = response.get("provider")
    return ReconstructedRow(
        id=rid, dataset=record.get("dataset") if isinstance(record.get("dataset"), str) else None,
        status="ok", error=None, format=fmt.name,
        prompt_ids=prompt_ids, completion_ids=completion_ids,
        n_prompt_tokens=len(prompt_ids), n_completion_tokens=len(completion_ids),
        segments=[dict(zip(SPAN_FIELDS, s)) for s in spans], flags=flags, finish_reason=turn.finish_reason,
        billed_completion_tokens=_opt_int(usage.get("completion_tokens")),
        billed_reasoning_tokens=_opt_int(details.get("reasoning_tokens")),
        provider=provider if isinstance(provider, str) else None,
    )


def error_row(rid: str, error: str, fmt_name: str, record: Any = None) -> ReconstructedRow:
    dataset = record.get("dataset") if isinstance(record, dict) and isinstance(record.get("dataset"), str) else None
    return ReconstructedRow(id=rid, dataset=dataset, status="error", error=error, format=fmt_name)


def record_id(record: Any, lineno: int) -> str:
    """The record's id, or ``line:N`` when it has none."""
    rid = record.get("id") if isinstance(record, dict) else None
    return rid if isinstance(rid, str) and rid else f"line:{lineno}"


def reconstruct_line(raw: bytes, lineno: int, tok: Tokenizer, fmt: Format, options: CompletionOptions) -> dict[str, Any]:
    """One JSONL line -> one row dict (never raises for bad input), with its ``line`` number."""
    try:
        record = json.loads(raw)
    except UnicodeDecodeError as e:
        try:  # keep the id if the rest of the line is readable
            rid = record_id(json.loads(raw.decode("utf-8", "replace")), lineno)
        except json.JSONDecodeError:
            rid = f"line:{lineno}"
        row = error_row(rid, f"line {lineno}: invalid UTF-8 at byte {e.start}", fmt.name)
    except json.JSONDecodeError as e:
        row = error_row(f"line:{lineno}", f"line {lineno}: not JSON ({e})", fmt.name)
    else:
        try:
            row = reconstruct_record(record, tok, fmt, options)
        except RecordError as e:
            row = error_row(record_id(record, lineno), str(e), fmt.name, record)
        except Exception as e:  # a record the checks did not foresee must not stop the run
            row = error_row(record_id(record, lineno), f"unexpected {type(e).__name__}: {e}", fmt.name, record)
    d = row.to_dict()
    d["line"] = lineno
    return d


# --------------------------------------------------------------------------------------------
# Parquet


def _schema():
    import pyarrow as pa

    seg = pa.struct([("kind", pa.string()), ("byte_start", pa.int64()), ("byte_end", pa.int64()),
                     ("tok_start", pa.int64()), ("tok_end", pa.int64())])
    return pa.schema([
        ("id", pa.string()), ("dataset", pa.string()), ("status", pa.string()), ("error", pa.string()),
        ("format", pa.string()), ("prompt_ids", pa.list_(pa.int32())), ("completion_ids", pa.list_(pa.int32())),
        ("n_prompt_tokens", pa.int64()), ("n_completion_tokens", pa.int64()), ("segments", pa.list_(seg)),
        ("flags", pa.list_(pa.string())), ("finish_reason", pa.string()),
        ("billed_completion_tokens", pa.int64()), ("billed_reasoning_tokens", pa.int64()),
        ("provider", pa.string()), ("line", pa.int64()),
    ])


ID_COLUMNS = ("prompt_ids", "completion_ids")


def _int_lists(lists: list[list[int]]) -> "Any":
    """A ``list<int32>`` column: one flat list converted by numpy (about twice pyarrow's nested conversion)."""
    import numpy as np
    import pyarrow as pa

    flat: list[int] = []
    offsets = np.zeros(len(lists) + 1, dtype=np.int32)
    for k, ids in enumerate(lists):
        flat += ids
        offsets[k + 1] = len(flat)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.array(flat, dtype=np.int32)))


def _write_atomic(rows: list[dict[str, Any]], path: Path) -> None:
    import pyarrow as pa

    schema = _schema()
    columns = {f.name: _int_lists([r[f.name] for r in rows]) if f.name in ID_COLUMNS
               else pa.array([r[f.name] for r in rows], type=f.type) for f in schema}
    _write_table_atomic(pa.table(columns, schema=schema), path)


def _write_table_atomic(table: "Any", path: Path) -> None:
    import pyarrow.parquet as pq

    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    pq.write_table(table, tmp, use_dictionary=False)
    os.replace(tmp, path)


def read_rows(path: str | os.PathLike) -> "Any":
    """A reconstruction parquet as a pandas DataFrame (list columns as Python lists/arrays)."""
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pandas()


# --------------------------------------------------------------------------------------------
# Batch


def _shard_starts(path: Path, shard_size: int) -> tuple[int, list[tuple[int, int]]]:
    """Count the records and find where each shard starts: ``(n_records, [(byte offset, line number)])``."""
    starts: list[tuple[int, int]] = []
    n = offset = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if raw.strip():
                if n % shard_size == 0:
                    starts.append((offset, lineno))
                n += 1
            offset += len(raw)
    return n, starts


def _read_shard(path: Path, offset: int, lineno: int, shard_size: int) -> list[tuple[int, bytes]]:
    """The ``shard_size`` records from ``offset`` (workers read their own lines: nothing big is pickled)."""
    lines: list[tuple[int, bytes]] = []
    with open(path, "rb") as f:
        f.seek(offset)
        for raw in f:
            if raw.strip():
                lines.append((lineno, raw))
                if len(lines) == shard_size:
                    break
            lineno += 1
    return lines


_W: dict[str, Any] = {}  # per-process worker state: tokenizer, format, options, parts dir


def _init_worker(tokenizer_dir: str, format_name: str, tool_declaration: str, options: CompletionOptions, parts: str,
                 tok: Any = None) -> None:
    tok = tok or load_tokenizer(tokenizer_dir)
    _W.update(tok=tok, fmt=get_format(format_name, tok, tool_declaration), options=options, parts=Path(parts))


def _run_shard(job: tuple[int, str, int, int, int]) -> tuple[int, int]:
    k, path, offset, lineno, shard_size = job
    lines = _read_shard(Path(path), offset, lineno, shard_size)
    rows = [reconstruct_line(raw, lineno, _W["tok"], _W["fmt"], _W["options"]) for lineno, raw in lines]
    _write_atomic(rows, _W["parts"] / f"shard-{k:06d}.parquet")
    return k, len(rows)


def _manifest(in_path: Path, tokenizer_dir: str, format_name: str, tool_declaration: str, options: CompletionOptions,
              shard_size: int) -> dict:
    st = in_path.stat()
    with open(in_path, "rb") as f:
        head = hashlib.sha256(f.read(1 << 20)).hexdigest()
    return {"input": str(in_path.resolve()), "size": st.st_size, "head_sha256": head, "tokenizer": str(Path(tokenizer_dir).resolve()),
            "format": format_name, "tool_declaration": tool_declaration, "options": asdict(options), "shard_size": shard_size}


def _mark_duplicates(table: "Any", first: dict[str, int]) -> "Any":
    """Turn every repeat of an id in ``first`` (id -> line, updated) into an error row."""
    import pyarrow as pa

    dups = set()
    for k, (rid, lineno) in enumerate(zip(table.column("id").to_pylist(), table.column("line").to_pylist())):
        if rid in first:
            dups.add(k)
        else:
            first[rid] = lineno
    if not dups:
        return table
    rows = table.to_pylist()
    for k in dups:
        row = rows[k]
        row.update(status="error", error=f"duplicate id {row['id']!r} (first at line {first[row['id']]})", prompt_ids=[],
                   completion_ids=[], n_prompt_tokens=0, n_completion_tokens=0, segments=[], flags=[])
    return pa.Table.from_pylist(rows, schema=table.schema)


class _Merger:
    """Streams finished shards, in order, into the final parquet (overlapping the workers)."""

    def __init__(self, parts: Path, out_path: Path) -> None:
        import pyarrow.parquet as pq

        self.parts, self.out_path = parts, out_path
        self.tmp = out_path.with_name(out_path.name + f".tmp{os.getpid()}")
        self.writer = pq.ParquetWriter(self.tmp, _schema(), use_dictionary=False)
        self.first: dict[str, int] = {}
        self.counts: dict[str, int] = {}

    def add(self, k: int) -> None:
        import pyarrow.parquet as pq

        table = _mark_duplicates(pq.read_table(self.parts / f"shard-{k:06d}.parquet", schema=_schema()), self.first)
        self.writer.write_table(table)
        for status in table.column("status").to_pylist():
            self.counts[status] = self.counts.get(status, 0) + 1

    def finish(self) -> dict[str, int]:
        self.writer.close()
        os.replace(self.tmp, self.out_path)
        return self.counts


def reconstruct_file(in_path: str | os.PathLike, out_path: str | os.PathLike, tokenizer_dir: str | os.PathLike,
                     format_name: str, workers: int = 1, resume: bool = False,
                     options: CompletionOptions = ReconstructOptions(), shard_size: int = 256,
                     progress: bool = True, tool_declaration: str = "json",
                     tokenizer: Tokenizer | None = None) -> dict[str, int]:
    """Reconstruct every record of ``in_path`` into ``out_path`` (parquet); returns status counts.

    Exactly one row per non-blank input line, in input order. Shards go to ``OUT.parts/`` (atomic
    writes); with ``resume`` the finished shards of an interrupted run with the same input and
    settings are kept, so a killed run resumed equals an uninterrupted one. Finished shards are
    streamed into the output in order while workers go on; the output appears atomically at the end.
    ``tokenizer``: an already loaded tokenizer of ``tokenizer_dir`` (saves loading it again).
    """
    from tqdm import tqdm

    in_path, out_path = Path(in_path), Path(out_path)
    if not in_path.is_file():
        raise FileNotFoundError(f"input not found: {in_path}")
    if format_name not in FORMATS:
        raise ValueError(f"unknown format {format_name!r}; known: {', '.join(FORMATS)}")
    n_lines, starts = _shard_starts(in_path, shard_size)
    if n_lines == 0:
        raise ValueError(f"{in_path} is empty: no records to reconstruct")
    parts = out_path.with_name(out_path.name + ".parts")
    manifest = _manifest(in_path, str(tokenizer_dir), format_name, tool_declaration, options, shard_size)
    mpath = parts / "manifest.json"
    if resume and parts.is_dir() and mpath.is_file():
        old = json.loads(mpath.read_text())
        if old != manifest:
            raise ValueError(f"cannot resume {out_path}: the input or settings changed since {parts} was written")
    else:
        if parts.exists():
            shutil.rmtree(parts)
        parts.mkdir(parents=True)
        mpath.write_text(json.dumps(manifest, indent=1))
    for stale in [*parts.glob("*.tmp*"), *out_path.parent.glob(out_path.name + ".tmp*")]:
        stale.unlink()  # left by an interrupted write
    done = {int(p.stem.split("-")[1]) for p in parts.glob("shard-*.parquet")}
    n_shards = (n_lines + shard_size - 1) // shard_size
    jobs = ((k, str(in_path), offset, lineno, shard_size) for k, (offset, lineno) in enumerate(starts) if k not in done)
    bar = tqdm(total=n_lines, unit="rec", desc="reconstruct", disable=not progress, file=sys.stderr)
    tok = tokenizer or load_tokenizer(tokenizer_dir)
    merger = _Merger(parts, out_path)

    def consume(results: Iterator[tuple[int, int]]) -> None:
        for k in range(n_shards):
            if k not in done:
                got, _ = next(results)
                assert got == k, (got, k)
            merger.add(k)
            bar.update(min(shard_size, n_lines - k * shard_size))

    if workers <= 1:
        _init_worker(str(tokenizer_dir), format_name, tool_declaration, options, str(parts), tok)
        consume(map(_run_shard, jobs))
    else:
        import multiprocessing as mp

        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context("spawn")
        init_tok = tok if ctx.get_start_method() == "fork" else None
        init_args = (str(tokenizer_dir), format_name, tool_declaration, options, str(parts), init_tok)
        with ctx.Pool(workers, _init_worker, init_args) as pool:
            consume(pool.imap(_run_shard, jobs))
    bar.close()
    counts = merger.finish()
    shutil.rmtree(parts)
    return counts


# --------------------------------------------------------------------------------------------
# CLI


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="API records (JSONL)")
    p.add_argument("-o", "--output", required=True, help="output parquet")
    p.add_argument("--tokenizer", required=True, help="tokenizer directory (Kimi or HF)")
    p.add_argument("--format", default="kimi-k2.5", choices=FORMATS, help="chat format (default kimi-k2.5)")
    p.add_argument("--tool-declaration", choices=TOOL_DECLARATIONS, default="json",
                   help="K2.5 tools as compact JSON (the template default) or TypeScript (Moonshot's tools_ts_str)")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--resume", action="store_true", help="keep the finished shards of an interrupted run")
    p.add_argument("--shard-size", type=int, default=256, help="records per shard (the unit of resumption)")
    p.add_argument("--omit-think-end-before-tools", action="store_true",
                   help="no </think> when the model goes from reasoning straight into tool calls")
    p.add_argument("--keep-tool-ids", action="store_true", help="keep the API's tool-call ids (default: functions.NAME:IDX)")
    p.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> int:
    options = ReconstructOptions(omit_think_end_before_tools=args.omit_think_end_before_tools,
                                 keep_tool_ids=args.keep_tool_ids)
    counts = reconstruct_file(args.input, args.output, args.tokenizer, args.format, workers=args.workers,
                              resume=args.resume, options=options, shard_size=args.shard_size,
                              progress=not args.no_progress, tool_declaration=args.tool_declaration)
    total = sum(counts.values())
    print(f"{args.output}: {total} rows, " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 0
