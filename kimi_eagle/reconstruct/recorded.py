"""Real HTTP exchanges with Kimi models recorded from real providers (``assets/data/real_api``), read as API records.

:func:`load_exchanges` reads ``kimi_recorded_exchanges.jsonl`` in place (found by :mod:`kimi_eagle.assets`: an
explicit path, then ``$KIMI_EAGLE_ASSETS``, then ``../shared/assets``) and checks every line: a line that is not
an exchange is an :class:`ExchangeError` naming the line. :func:`exchange_record` turns one :class:`Exchange` into
the kit's API record ``{"id", "dataset", "format", "request", "response"}`` through the same converters as
``kimi-eagle convert``: ``--from openai`` (:func:`~kimi_eagle.reconstruct.log_shapes.api_record_from_log`) for a
plain answer, ``--from openai-stream`` (:func:`~kimi_eagle.reconstruct.stream_log.logged_stream_record`) for a
stream, and for ``bedrock-converse`` the Converse mapping of :mod:`kimi_eagle.reconstruct.bedrock` first.
``response.provider`` is the exchange's provider; ``format`` the chat format of its model (:data:`MODEL_FORMATS`;
``reconstruct`` itself takes the format from ``--format``). An exchange that cannot be converted (no request
recorded, a model without a known format, a Converse part with no chat equivalent, what the converters refuse)
is ``{"id", "dataset", "format", "error"}`` with a one-line reason, never dropped.

:func:`measure_exchanges` converts and reconstructs every exchange under serving profiles and compares the counts
with the provider's billed ``usage``; :func:`provider_table` sums that up per provider and model.
"""
from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from kimi_eagle.assets import data_path
from kimi_eagle.chat.by_model import MODEL_FORMATS, format_of_model
from kimi_eagle.chat.encoder import PieceEncoder
from kimi_eagle.chat.formats import get_format
from kimi_eagle.io import read_jsonl
from kimi_eagle.reconstruct.bedrock import BedrockError, converse_log
from kimi_eagle.reconstruct.log_shapes import LogShapeError, api_record_from_log
from kimi_eagle.reconstruct.record import reconstruct_record, serving_options
from kimi_eagle.reconstruct.stream_log import logged_stream_record
from kimi_eagle.records import RecordError, count_field
from kimi_eagle.serving.profiles import get_profile
from kimi_eagle.tokenize.tokenizer import Tokenizer

RECORDED = "real_api/kimi_recorded_exchanges.jsonl"  # under the assets' data/
DATASET = "real_api"
AGENT_TRACES = "real_api/kimi_agent_traces.jsonl"  # a coding agent's real traffic: 11 real tools (issue 44)
AGENT_DATASET = "agent_traces"
CORPORA = {DATASET: RECORDED, AGENT_DATASET: AGENT_TRACES}  # dataset -> file under data/; reported separately
# The agent traces' out-of-sample split (issue 44): learned on these tests of the agent, scored on the others.
AGENT_LEARN_TESTS = ("simple_test", "read_a_file", "update_a_file", "download_tool")
AGENT_SCORE_TESTS = ("bash_tool", "fetch_tool", "glob_tool")
API_FORMATS = ("openai-chat-completions", "bedrock-converse")
PROFILES = ("template", "moonshot")


class ExchangeError(ValueError):
    """A line of the recorded file that is not an exchange; the message names the file and the line."""


@dataclass(frozen=True)
class Exchange:
    """One recorded exchange: exactly one of ``response`` (a plain answer) and ``stream_chunks`` (every SSE
    ``data:`` object in order) is set; ``request`` is None where it was not recorded. ``extra`` holds every
    other field as recorded (``summary``, ``why_real``, ``notes``, ...)."""

    id: str
    line: int
    model: str
    provider: str
    api_format: str
    request: dict | None
    response: dict | None = None
    stream_chunks: list | None = None
    stream_done_marker: bool = False
    source: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    @property
    def streamed(self) -> bool:
        return self.stream_chunks is not None


def chat_format(model: Any) -> str | None:
    """The chat format of a model name (:data:`~kimi_eagle.chat.by_model.MODEL_FORMATS`), None when it is not known."""
    return format_of_model(model)


def recorded_path(explicit: str | os.PathLike | None = None, dataset: str = DATASET) -> Path:
    """Where the recorded exchanges of ``dataset`` (:data:`CORPORA`) are (``explicit`` is an assets root);
    :class:`~kimi_eagle.assets.AssetError` naming every place searched when they are nowhere."""
    return data_path(CORPORA[dataset], explicit)


def source_test(ex: Exchange) -> str:
    """The agent test an exchange was recorded by: the file name of its ``source.path`` without ``.yaml``."""
    path = ex.source.get("path") if isinstance(ex.source, dict) else None
    return str(path).rpartition("/")[2].removesuffix(".yaml") if path else ""


def _problem(obj: Any) -> str | None:
    """What makes a parsed line not an exchange, or None."""
    if not isinstance(obj, dict):
        return "not a JSON object"
    for key in ("id", "model", "provider"):
        if not isinstance(obj.get(key), str) or not obj[key]:
            return f"`{key}` is missing or not a non-empty string"
    if obj.get("api_format") not in API_FORMATS:
        return f"api_format {obj.get('api_format')!r} is not one of {', '.join(API_FORMATS)}"
    if obj.get("request") is not None and not isinstance(obj["request"], dict):
        return "`request` is neither an object nor null"
    has_response, has_chunks = "response" in obj, "stream_chunks" in obj
    if has_response == has_chunks:
        return "holds both `response` and `stream_chunks`" if has_response else "holds neither `response` nor `stream_chunks`"
    if has_response and not isinstance(obj["response"], dict):
        return "`response` is not an object"
    if has_chunks and not (isinstance(obj["stream_chunks"], list) and all(isinstance(c, dict) for c in obj["stream_chunks"])):
        return "`stream_chunks` is not a list of objects"
    if not isinstance(obj.get("source", {}), dict):
        return "`source` is not an object"
    return None


def _exchange(obj: dict, line: int) -> Exchange:
    known = ("id", "model", "provider", "api_format", "request", "response", "stream_chunks", "stream_done_marker", "source")
    return Exchange(id=obj["id"], line=line, model=obj["model"], provider=obj["provider"], api_format=obj["api_format"],
                    request=obj["request"], response=obj.get("response"), stream_chunks=obj.get("stream_chunks"),
                    stream_done_marker=obj.get("stream_done_marker") is True, source=obj.get("source", {}),
                    extra={k: v for k, v in obj.items() if k not in known})


def load_exchanges(path: str | os.PathLike | None = None, assets: str | os.PathLike | None = None,
                   dataset: str = DATASET) -> list[Exchange]:
    """Every exchange of the recorded file (``path``, else ``dataset``'s file found under ``assets`` by the
    resolver), read in place; :class:`ExchangeError` naming the line for a line that is not JSON or not an
    exchange, or a repeated id."""
    path = Path(path) if path is not None else recorded_path(assets, dataset)
    out: list[Exchange] = []
    first_line: dict[str, int] = {}
    for line in read_jsonl(path):
        problem = line.error or _problem(line.obj)
        if problem is None and line.obj["id"] in first_line:
            problem = f"id {line.obj['id']!r} repeats line {first_line[line.obj['id']]}"
        if problem is not None:
            raise ExchangeError(f"{path}: line {line.lineno}: {problem}")
        first_line[line.obj["id"]] = line.lineno
        out.append(_exchange(line.obj, line.lineno))
    return out


def _refused(ex: Exchange, fmt: str | None, reason: str, dataset: str = DATASET) -> dict:
    return {"id": ex.id, "dataset": dataset, "format": fmt, "error": reason}


def _converted(ex: Exchange) -> dict:
    """The exchange through ``convert``'s own converters (an ``error`` field where they refuse it)."""
    item = {"id": ex.id, "dataset": DATASET, "request": ex.request}
    if ex.api_format == "bedrock-converse":
        if ex.streamed:
            return {"error": "a streamed Converse answer (ConverseStream) has no reader"}
        try:
            item.update(converse_log(ex.request, ex.response, ex.model))
        except BedrockError as e:
            return {"error": f"bedrock-converse: {e}"}
    elif ex.streamed:
        record = logged_stream_record({**item, "chunks": ex.stream_chunks}, f"exchange line {ex.line}")
        if "error" not in record:
            record["stream"] = {**record["stream"], "done": ex.stream_done_marker}
        return record
    else:
        item["response"] = ex.response
    try:
        return api_record_from_log(item, DATASET)
    except LogShapeError as e:
        return {"error": str(e)}


def exchange_record(ex: Exchange, dataset: str = DATASET) -> dict:
    """The kit's API record of one exchange, or ``{"id", "dataset", "format", "error"}`` (see the module);
    ``dataset``: the corpus it comes from (:data:`CORPORA`)."""
    fmt = chat_format(ex.model)
    if fmt is None:
        return _refused(ex, None, f"no chat format known for model {ex.model!r} (known: {', '.join(MODEL_FORMATS)})",
                        dataset)
    if ex.request is None:
        return _refused(ex, fmt, "no request recorded (the fixture kept only the answer): the prompt cannot be rendered",
                        dataset)
    try:
        record = _converted(ex)
    except Exception as e:  # noqa: BLE001 - one exchange the converters did not foresee never stops a corpus
        record = {"error": f"unexpected {type(e).__name__}: {e}"[:300]}
    if "error" in record:
        return _refused(ex, fmt, record["error"], dataset)
    response = {**record["response"], "provider": ex.provider}
    return {"id": record["id"], "dataset": dataset, "format": fmt,
            **{k: v for k, v in record.items() if k not in ("id", "dataset")}, "response": response}


# --------------------------------------------------------------------------------------------
# Measuring: reconstructed counts against the billed ones


def corpus_records(dataset: str = DATASET, assets: str | os.PathLike | None = None) -> tuple[list[Exchange], list[dict]]:
    """The exchanges of one corpus (:data:`CORPORA`) and their API records, in order (refused ones included)."""
    exchanges = load_exchanges(assets=assets, dataset=dataset)
    return exchanges, [exchange_record(ex, dataset) for ex in exchanges]


def _billed(record: dict, key: str) -> int | None:
    usage = record.get("response", {}).get("usage")
    return count_field(usage.get(key)) if isinstance(usage, dict) else None


def _row(ex: Exchange, record: dict) -> dict[str, Any]:
    return {"id": ex.id, "line": ex.line, "provider": ex.provider, "model": ex.model, "api_format": ex.api_format,
            "streamed": ex.streamed, "format": record.get("format"), "status": "ok", "reason": None,
            "billed_prompt_tokens": _billed(record, "prompt_tokens"),
            "billed_completion_tokens": _billed(record, "completion_tokens"), "counts": {}}


class _Reconstructor:
    """Reconstructs records under each profile, with one encoder and one format per (format, profile)."""

    def __init__(self, tok: Tokenizer, profiles: Iterable[str]) -> None:
        self.tok, self.encoder = tok, PieceEncoder(tok)
        self.profiles = {name: get_profile(name) for name in profiles}
        self.formats: dict[tuple[str, str], Any] = {}

    def counts(self, record: dict, name: str) -> dict[str, Any]:
        profile = self.profiles[name]
        key = (record["format"], name)
        if key not in self.formats:
            self.formats[key] = get_format(record["format"], self.tok, profile.tool_declaration)
        row = reconstruct_record(record, self.tok, self.formats[key], serving_options(profile), self.encoder)
        return {"n_prompt_tokens": row.n_prompt_tokens, "n_completion_tokens": row.n_completion_tokens,
                "flags": row.flags}


def measure_exchange(ex: Exchange, rec: _Reconstructor) -> dict[str, Any]:
    """One exchange's row: ``status`` ``ok`` (converted, and reconstructed under every profile: ``counts[profile]``
    holds ``n_prompt_tokens``, ``n_completion_tokens``, ``flags``), ``refused`` (``reason`` says which step and
    why) or ``error`` (an exception no check foresaw: a bug), with the billed counts."""
    record: dict = {}
    try:
        record = exchange_record(ex)
        row = _row(ex, record)
        if "error" in record:
            return {**row, "status": "refused", "reason": f"convert: {record['error']}"}
        for name in rec.profiles:
            try:
                row["counts"][name] = rec.counts(record, name)
            except RecordError as e:
                return {**row, "status": "refused", "reason": f"reconstruct ({name}): {e}", "counts": {}}
        return row
    except Exception as e:  # a record the checks did not foresee must not stop the measurement
        return {**_row(ex, record), "status": "error", "reason": f"unexpected {type(e).__name__}: {e}"}


def measure_exchanges(exchanges: Iterable[Exchange], tok: Tokenizer, profiles: Iterable[str] = PROFILES) -> list[dict]:
    """:func:`measure_exchange` of every exchange, in order (every exchange gives one row)."""
    rec = _Reconstructor(tok, profiles)
    return [measure_exchange(ex, rec) for ex in exchanges]


def _compared(rows: list[dict], profile: str, kind: str) -> list[int]:
    """``billed - reconstructed`` of the ok rows with a billed ``kind`` count (``prompt`` or ``completion``)."""
    return [row[f"billed_{kind}_tokens"] - row["counts"][profile][f"n_{kind}_tokens"] for row in rows
            if row["status"] == "ok" and profile in row["counts"] and row[f"billed_{kind}_tokens"] is not None]


def provider_table(rows: Iterable[dict], profiles: Iterable[str] = PROFILES) -> list[dict[str, Any]]:
    """Per (provider, model, profile), sorted: ``records``, ``ok`` (converted and reconstructed), ``prompt_equal`` /
    ``prompt_compared`` (ok rows with a billed ``usage.prompt_tokens``: how many equal the reconstructed
    ``n_prompt_tokens``), the same for completions, and ``median_prompt_delta`` / ``median_completion_delta``:
    the median of **billed − reconstructed** over the compared rows (positive: the provider bills more tokens
    than the reconstruction has; None when nothing was compared)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["provider"], row["model"]), []).append(row)
    table = []
    for (provider, model), members in sorted(groups.items()):
        for profile in profiles:
            entry: dict[str, Any] = {"provider": provider, "model": model, "profile": profile, "records": len(members),
                                     "ok": sum(r["status"] == "ok" and profile in r["counts"] for r in members)}
            for kind in ("prompt", "completion"):
                deltas = _compared(members, profile, kind)
                entry[f"{kind}_equal"] = sum(d == 0 for d in deltas)
                entry[f"{kind}_compared"] = len(deltas)
                entry[f"median_{kind}_delta"] = statistics.median(deltas) if deltas else None
            table.append(entry)
    return table
