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
from .records import RecordError
from .tokenizer import Tokenizer, load_tokenizer

FINISH_REASONS = ("stop", "tool_calls", "length")


@dataclass(frozen=True)
class ReconstructOptions(CompletionOptions):
    """Completion options (see :class:`~kimi_eagle.completion.CompletionOptions`)."""


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
    return [_normalise_message(m, i) for i, m in enumerate(messages)]


def _normalise_message(m: Any, i: int) -> dict:
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
    if _copies_reasoning(m):
        m = {**m, "reasoning_content": m["reasoning"]}
    return m


def _copies_reasoning(m: dict) -> bool:
    return m["role"] == "assistant" and "reasoning_content" not in m and isinstance(m.get("reasoning"), str)


def _snapshot(value: Any) -> Any:
    """A private deep copy of a JSON value made only of dicts, lists, strings and None; else ``_UNSAFE``.

    For such values ``==`` is exact (no ``1 == 1.0 == True``) up to dict key order."""
    t = type(value)
    if t is str or value is None:
        return value
    if t is list:
        out = [_snapshot(v) for v in value]
        return _UNSAFE if any(v is _UNSAFE for v in out) else out
    if t is dict:
        out = {k: _snapshot(v) for k, v in value.items()}
        return _UNSAFE if any(type(k) is not str or v is _UNSAFE for k, v in out.items()) else out
    return _UNSAFE


def _snapshot_message(m: dict) -> Any:
    """``_snapshot`` of a normalised message whose equal copies render identically; else ``_UNSAFE``.

    Key order matters only where a template prints a dict as JSON: tool-call arguments that are not
    strings, so messages with those are never reused."""
    if set(map(type, m.values())) <= _FLAT:  # the common case: a role and a string content
        return dict(m)
    for call in m.get("tool_calls") or ():
        if not isinstance(call.get("function", {}).get("arguments", ""), (str, type(None))):
            return _UNSAFE
    return _snapshot(m)


_FLAT = {str, type(None)}
_DICT = {dict}


_UNSAFE = object()


class PromptCache:
    """Prompt IDs of a separable format, built on the previous record's prompt.

    Records arrive conversation by conversation: record j+1's messages are mostly record j's. The
    cache keeps the previous record's messages (private strings-only snapshots, so ``==`` means
    "renders identically") and its encoded message blocks. Leading messages equal to the previous
    record's are neither validated nor rendered again, and their blocks' IDs are reused as long as
    their rendering modes (e.g. K2.5's dropped reasoning) are unchanged; the rest goes the ordinary
    way. The format must be separable (``prompt_head``, ``message_modes``, ``message_pieces``,
    ``prompt_tail``, each block ending in a special token), so the concatenated blocks equal the
    encoding of the whole prompt.
    """

    def __init__(self, fmt: Any, enc: PieceEncoder) -> None:
        self.fmt, self.enc = fmt, enc
        self._tail = enc.encode_marked(fmt.prompt_tail())
        self._reset()

    def _reset(self) -> None:
        # the previous record, per message: snapshot (or _UNSAFE), reasoning copied?, mode, block end
        # in ``_body``, any literal marker up to here; ``_body``: the message blocks' IDs, concatenated
        self._snaps: list[Any] = []
        self._copies: list[bool] = []
        self._modes: list[Any] = []
        self._ends: list[int] = []
        self._marks: list[bool] = []
        self._body: list[int] = []

    @staticmethod
    def supports(fmt: Any, enc: PieceEncoder) -> bool:
        return all(hasattr(fmt, a) for a in ("prompt_head", "message_modes", "message_pieces", "prompt_tail")) \
            and "<|im_end|>" in enc.special_ids

    def messages(self, raw: Any) -> tuple[list[dict], int]:
        """``normalise_messages(raw)`` and how many leading messages equal the previous record's."""
        if not isinstance(raw, list):
            raise RecordError("request.messages is not a list")
        snaps = self._snaps
        n = min(len(raw), len(snaps))
        if raw[:n] == snaps[:n] and (not n or set(map(type, raw[:n])) == _DICT):
            k = n
        else:
            k = 0
            while k < n and type(raw[k]) is dict and raw[k] == snaps[k]:
                k += 1
        out = raw[:k]
        if True in self._copies[:k]:
            out = [{**m, "reasoning_content": m["reasoning"]} if c else m for m, c in zip(out, self._copies)]
        out += [_normalise_message(m, i) for i, m in enumerate(raw[k:], k)]
        return out, k

    def prompt(self, raw: list, messages: list[dict], same: int, tools: list | None) -> tuple[list[int], bool]:
        """Prompt IDs and literal-marker flag; ``same``: leading messages equal to the previous record's."""
        try:
            return self._prompt(raw, messages, same, tools)
        except BaseException:
            self._reset()  # the blocks were cut back in place: start afresh
            raise

    def _prompt(self, raw: list, messages: list[dict], same: int, tools: list | None) -> tuple[list[int], bool]:
        fmt, enc = self.fmt, self.enc
        modes = fmt.message_modes(messages)
        keep = same
        if modes[:keep] != self._modes[:keep]:
            keep = next(i for i in range(keep) if modes[i] != self._modes[i])
        ends, marks, body = self._ends, self._marks, self._body  # cut back to the kept blocks, in place
        cut = ends[keep - 1] if keep else 0
        del ends[keep:], marks[keep:], body[cut:]
        marker = marks[-1] if keep else False
        for i in range(keep, len(messages)):
            block, found = enc.encode_marked(fmt.message_pieces(messages[i], modes[i]))
            body += block
            marker = marker or found
            ends.append(len(body))
            marks.append(marker)
        if tools:
            ids, head_marker = enc.encode_marked(fmt.prompt_head(tools))
            ids += body
        else:
            ids, head_marker = list(body), False
        ids += self._tail[0]
        self._snaps = self._snaps[:same] + [_snapshot_message(m) for m in raw[same:]]
        self._copies = self._copies[:same] + [m is not r for m, r in zip(messages[same:], raw[same:])]
        self._modes, self._ends, self._marks, self._body = modes, ends, marks, body
        return ids, marker or head_marker or self._tail[1]


# --------------------------------------------------------------------------------------------
# One record


_encoders: dict[int, PieceEncoder] = {}
_prompt_caches: dict[int, PromptCache] = {}


def _encoder(tok: Tokenizer) -> PieceEncoder:
    enc = _encoders.get(id(tok))
    if enc is None or enc.tok is not tok:
        enc = _encoders[id(tok)] = PieceEncoder(tok)
    return enc


def _prompt_cache(fmt: Format, enc: PieceEncoder) -> PromptCache | None:
    cache = _prompt_caches.get(id(fmt))
    if cache is None or cache.fmt is not fmt or cache.enc is not enc:
        if not PromptCache.supports(fmt, enc):
            return None
        cache = _prompt_caches[id(fmt)] = PromptCache(fmt, enc)
    return cache


def clear_caches() -> None:
    """Forget every cached encoding (run IDs and prompt blocks)."""
    _encoders.clear()
    _prompt_caches.clear()


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
    enc = _encoder(tok)
    cache = _prompt_cache(fmt, enc)
    raw_messages = request.get("messages")
    if cache is not None:
        messages, same = cache.messages(raw_messages)
    else:
        messages, same = normalise_messages(raw_messages), 0
    tools = request.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise RecordError("request.tools is not a list")
    turn = parse_turn(response)
    flags: list[str] = []
    try:
        if cache is not None:
            prompt_ids, prompt_marker = cache.prompt(raw_messages, messages, same, tools)
        else:
            prompt_ids, prompt_marker = enc.encode_marked(fmt.prompt_pieces(messages, tools))
    except RecordError:
        raise
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise RecordError(f"cannot render the prompt: {type(e).__name__}: {e}") from None
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
