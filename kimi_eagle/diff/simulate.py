"""``kimi-eagle simulate``: a labelled benchmark for the diff, built from real converted conversations.

    kimi-eagle simulate -o SIM_DIR [--source glaive --source reason-tool-use] [--per-effect N] [--seed S]

For each sampled API record (from ``kimi-eagle convert``) the canonical reconstruction stands for
"what the model produced"; one effect is then injected on the engine side or the API side, of the
kinds real engines and APIs produce. Writes ``SIM_DIR/api.jsonl`` (API records, ``usage`` set to
the engine's counts), ``SIM_DIR/engine.jsonl`` (engine records) and ``SIM_DIR/labels.parquet``
(``id, dataset, effect, expected, detail``). Reconstruct ``api.jsonl`` and diff it against
``engine.jsonl`` with ``--labels`` to score the classifier; :func:`run_benchmark` does all three.

Effects and the label the diff must give them:

============================  ====================  =================================================
effect                        expected label        injected
============================  ====================  =================================================
``none``                      ``exact``             nothing
``literal_marker``            ``exact``             the model writes ``<|im_end|>`` as text (both sides)
``non_canonical_split``       ``bpe_split``         engine: one token sampled as two valid tokens
``args_whitespace_stripped``  ``whitespace``        engine args had whitespace around; API parser strips it
``tool_id_rewritten``         ``tool_call_id``      API: ``call_…``/``chatcmpl-tool-…``; engine id not recoverable
``args_reserialised``         ``tool_args_json_equal``  API: arguments re-serialised with keys reordered
``think_end_missing``         ``special_token``     engine: no ``</think>`` before the tool section
``length_truncation``         ``truncation``        API: text cut, ``finish_reason: length``
``partial_utf8``              ``replacement_char``  engine: a partial UTF-8 token; API text has U+FFFD
``content_edited``            ``other``             API: one word of the content changed
============================  ====================  =================================================
"""
from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from kimi_eagle.chat.completion import CompletionOptions
from kimi_eagle.chat.formats import get_format
from kimi_eagle.diff.billing import reasoning_tokens
from kimi_eagle.io import atomic_path, write_jsonl
from kimi_eagle.reconstruct.record import reconstruct_record
from kimi_eagle.records import RecordError
from kimi_eagle.tokenize.tokenizer import Tokenizer, load_tokenizer

EFFECTS: dict[str, str] = {
    "none": "exact",
    "literal_marker": "exact",
    "non_canonical_split": "bpe_split",
    "args_whitespace_stripped": "whitespace",
    "tool_id_rewritten": "tool_call_id",
    "args_reserialised": "tool_args_json_equal",
    "think_end_missing": "special_token",
    "length_truncation": "truncation",
    "partial_utf8": "replacement_char",
    "content_edited": "other",
}
DEFAULT_SOURCES = ("glaive", "reason-tool-use")
DEFAULT_FORMAT = "kimi-k2.5"


class SkipRecord(Exception):
    """This record cannot carry this effect (e.g. it has no tool calls)."""


@dataclass
class Sample:
    id: str
    dataset: str | None
    effect: str
    expected: str
    api: dict[str, Any]
    engine_ids: list[int]
    prompt_ids: list[int]
    detail: str


# --------------------------------------------------------------------------------------------
# helpers on API records


def _message(record: dict) -> dict:
    return record["response"]["choices"][0]["message"]


def _calls(record: dict) -> list[dict]:
    return _message(record).get("tool_calls") or []


def _reconstruct(record: dict, tok: Tokenizer, fmt, options: CompletionOptions = CompletionOptions()):
    row = reconstruct_record(record, tok, fmt, options)
    return row.completion_ids, reasoning_tokens(row.segments), row.segments


def _word_position(rng: random.Random, text: str) -> int:
    """A random character index just after a space (or 0)."""
    spaces = [i + 1 for i, c in enumerate(text) if c == " "]
    return rng.choice(spaces) if spaces else 0


def _find_token(tok: Tokenizer, raw: bytes) -> int | None:
    """The ordinary token spelled ``raw``, or None."""
    return tok.id_by_bytes.get(raw)


# --------------------------------------------------------------------------------------------
# effects: each returns (api record, engine ids, detail, engine reasoning tokens) or raises SkipRecord


def _none(rng, tok, fmt, rec):
    ids, n_reasoning, _ = _reconstruct(rec, tok, fmt)
    return rec, ids, "", n_reasoning


def _literal_marker(rng, tok, fmt, rec):
    msg = _message(rec)
    if not msg.get("content"):
        raise SkipRecord
    text = msg["content"]
    k = _word_position(rng, text)
    msg["content"] = text[:k] + "<|im_end|> " + text[k:]
    ids, n_reasoning, _ = _reconstruct(rec, tok, fmt)
    return rec, ids, f"'<|im_end|> ' written as text at character {k}", n_reasoning


def _split(rng, tok, fmt, rec):
    ids, n_reasoning, segments = _reconstruct(rec, tok, fmt)
    specials = tok.special_ids
    in_reasoning = {i for s in segments if s["kind"] == "reasoning" for i in range(s["tok_start"], s["tok_end"])}
    order = list(range(len(ids)))
    rng.shuffle(order)
    for i in order:
        if ids[i] in specials:
            continue
        raw = tok.token_bytes(ids[i])
        cuts = list(range(1, len(raw)))
        rng.shuffle(cuts)
        for cut in cuts:
            left, right = _find_token(tok, raw[:cut]), _find_token(tok, raw[cut:])
            if left is not None and right is not None:
                return (rec, ids[:i] + [left, right] + ids[i + 1 :], f"token {i} {raw!r} -> {raw[:cut]!r} + {raw[cut:]!r}",
                        n_reasoning + (i in in_reasoning))
    raise SkipRecord


def _args_whitespace(rng, tok, fmt, rec):
    calls = _calls(rec)
    if not calls or not isinstance(calls[0]["function"].get("arguments"), str):
        raise SkipRecord
    engine_rec = copy.deepcopy(rec)
    pad_left, pad_right = rng.choice([(" ", ""), ("", "\n"), (" ", "\n"), ("\n", "\n")])
    fn = _calls(engine_rec)[0]["function"]
    fn["arguments"] = pad_left + fn["arguments"] + pad_right
    ids, n_reasoning, _ = _reconstruct(engine_rec, tok, fmt)
    return rec, ids, f"engine arguments padded {pad_left!r} ... {pad_right!r}", n_reasoning


def _tool_id(rng, tok, fmt, rec):
    calls = _calls(rec)
    if not calls:
        raise SkipRecord
    engine_rec = copy.deepcopy(rec)
    first = calls[0]["function"]["name"]
    model_id = f"functions.{first}:{rng.randint(7, 40)}"  # the model's own id, which the API lost
    _calls(engine_rec)[0]["id"] = model_id
    ids, n_reasoning, _ = _reconstruct(engine_rec, tok, fmt, CompletionOptions(keep_tool_ids=True))
    api_id = rng.choice(["call_", "chatcmpl-tool-"]) + "".join(rng.choice("0123456789abcdef") for _ in range(24))
    calls[0]["id"] = api_id  # the other calls keep ids equal to the normalised ones on both sides
    return rec, ids, f"engine {model_id!r}, API {api_id!r}", n_reasoning


def _args_reserialised(rng, tok, fmt, rec):
    calls = _calls(rec)
    for c in calls:
        try:
            args = json.loads(c["function"]["arguments"])
        except (TypeError, ValueError):
            continue
        if isinstance(args, dict) and len(args) >= 2:
            ids, n_reasoning, _ = _reconstruct(rec, tok, fmt)
            c["function"]["arguments"] = json.dumps(dict(reversed(list(args.items()))), ensure_ascii=False)
            return rec, ids, f"keys of {c['function']['name']} arguments reversed", n_reasoning
    raise SkipRecord


def _think_end_missing(rng, tok, fmt, rec):
    if not _calls(rec):
        raise SkipRecord
    ids, n_reasoning, segments = _reconstruct(rec, tok, fmt)
    ends = [s for s in segments if s["kind"] == "think_end"]
    if not ends:
        raise SkipRecord
    s = ends[0]
    return (rec, ids[: s["tok_start"]] + ids[s["tok_end"] :], "engine went from reasoning straight to the tool section",
            n_reasoning)


def _truncation(rng, tok, fmt, rec):
    msg = _message(rec)
    if _calls(rec) or not msg.get("content") or len(msg["content"]) < 20:
        raise SkipRecord
    ids, n_reasoning, _ = _reconstruct(rec, tok, fmt)
    text = msg["content"]
    k = rng.randint(len(text) // 4, 3 * len(text) // 4)
    msg["content"] = text[:k]
    rec["response"]["choices"][0]["finish_reason"] = "length"
    rec["response"]["choices"][0]["native_finish_reason"] = "length"
    return rec, ids, f"API content cut at character {k} of {len(text)}", n_reasoning


def _partial_utf8(rng, tok, fmt, rec):
    msg = _message(rec)
    if not msg.get("content"):
        raise SkipRecord
    text = msg["content"]
    k = _word_position(rng, text)
    msg["content"] = text[:k] + "\ufffd" + text[k:]
    ids, n_reasoning, segments = _reconstruct(rec, tok, fmt)
    content = next(s for s in segments if s["kind"] == "content")
    p = content["byte_start"] + len(text[:k].encode())  # the U+FFFD bytes: [p, p + 3)
    table = tok.token_table
    offsets = [0]
    for i in ids:
        offsets.append(offsets[-1] + len(table[i]))
    t0 = max(i for i in range(len(ids)) if offsets[i] <= p)
    t1 = min(i for i in range(len(ids) + 1) if offsets[i] >= p + 3)
    run = b"".join(table[i] for i in ids[t0:t1])
    before, after = run[: p - offsets[t0]], run[p + 3 - offsets[t0] :]
    partial = [_find_token(tok, b"\xe4"), _find_token(tok, b"\xb8")]
    if None in partial:
        raise SkipRecord
    engine_run = tok.encode(before.decode()) + partial + tok.encode(after.decode())
    return (rec, ids[:t0] + engine_run + ids[t1:], f"engine bytes e4 b8 (half a character) at content character {k}",
            n_reasoning)


def _content_edited(rng, tok, fmt, rec):
    msg = _message(rec)
    words = [w for w in (msg.get("content") or "").split(" ") if w.isalpha() and len(w) >= 4]
    if not words:
        raise SkipRecord
    ids, n_reasoning, _ = _reconstruct(rec, tok, fmt)
    w = rng.choice(words)
    msg["content"] = msg["content"].replace(w, w.upper(), 1)
    return rec, ids, f"API content word {w!r} upper-cased", n_reasoning


INJECT: dict[str, Callable] = {
    "none": _none, "literal_marker": _literal_marker, "non_canonical_split": _split,
    "args_whitespace_stripped": _args_whitespace, "tool_id_rewritten": _tool_id,
    "args_reserialised": _args_reserialised, "think_end_missing": _think_end_missing,
    "length_truncation": _truncation, "partial_utf8": _partial_utf8, "content_edited": _content_edited,
}


# --------------------------------------------------------------------------------------------
# the benchmark


def _with_usage(rec: dict, engine_ids: list[int], n_reasoning: int) -> dict:
    """Bill what the engine produced: its completion tokens and its reasoning tokens."""
    rec["response"]["usage"] = {"prompt_tokens": None, "completion_tokens": len(engine_ids),
                                "completion_tokens_details": {"reasoning_tokens": n_reasoning}}
    return rec


def simulate_samples(records: Iterable[dict], tok: Tokenizer, format_name: str = DEFAULT_FORMAT, per_effect: int = 10,
                     seed: int = 0, effects: Iterable[str] = EFFECTS) -> list[Sample]:
    """Inject each effect into ``per_effect`` records (each source record used at most once)."""
    fmt = get_format(format_name, tok)
    pool = [r for r in records if isinstance(r, dict) and not r.get("error")]
    rng = random.Random(seed)
    rng.shuffle(pool)
    used: set[int] = set()
    samples: list[Sample] = []
    for effect in effects:
        expected = EFFECTS[effect]
        n = 0
        for k, rec in enumerate(pool):
            if n == per_effect:
                break
            if k in used:
                continue
            api = copy.deepcopy(rec)
            try:
                api, engine_ids, detail, n_reasoning = INJECT[effect](random.Random(f"{seed}:{effect}:{rec['id']}"), tok, fmt, api)
                prompt_ids = reconstruct_record(api, tok, fmt).prompt_ids
            except (SkipRecord, RecordError, ValueError, KeyError):
                continue
            used.add(k)
            n += 1
            sid = f"{rec['id']}#{effect}"
            api = {**api, "id": sid}
            samples.append(Sample(sid, rec.get("dataset"), effect, expected, _with_usage(api, engine_ids, n_reasoning),
                                  engine_ids, prompt_ids, detail))
    return samples


def write_samples(samples: list[Sample], out_dir: str | Path) -> dict[str, Path]:
    """``api.jsonl``, ``engine.jsonl`` and ``labels.parquet`` in ``out_dir`` (each written atomically)."""
    out = Path(out_dir)
    paths = {"api": out / "api.jsonl", "engine": out / "engine.jsonl", "labels": out / "labels.parquet"}
    write_jsonl(paths["api"], (s.api for s in samples))
    write_jsonl(paths["engine"], ({"id": s.id, "output_ids": s.engine_ids, "prompt_ids": s.prompt_ids} for s in samples))
    table = pa.Table.from_pylist([{"id": s.id, "dataset": s.dataset, "effect": s.effect, "expected": s.expected,
                                   "detail": s.detail} for s in samples],
                                 schema=pa.schema([(c, pa.string()) for c in ("id", "dataset", "effect", "expected", "detail")]))
    with atomic_path(paths["labels"]) as tmp:
        pq.write_table(table, tmp)
    return paths


def load_source_records(sources: Iterable[str]) -> list[dict]:
    """API records converted from the bundled real conversations."""
    from kimi_eagle.reconstruct.convert import convert

    return [r for source in sources for r in convert(source)]


def run_benchmark(sim_dir: str | Path, tokenizer_dir: str | Path, format_name: str = DEFAULT_FORMAT,
                  diff_dir: str | Path | None = None):
    """Reconstruct ``SIM_DIR/api.jsonl`` and diff it against the engine records with the labels.

    Returns the :class:`~kimi_eagle.diff.run.DiffResult` (written to ``diff_dir``, default ``SIM_DIR/diff``).
    """
    from kimi_eagle.diff.run import diff_files, write_diff
    from kimi_eagle.diff.summary import diff_data_kind
    from kimi_eagle.reconstruct.job import JobOptions, reconstruct_file

    sim = Path(sim_dir)
    recon = sim / "reconstructed.parquet"
    reconstruct_file(sim / "api.jsonl", recon, tokenizer_dir, format_name, JobOptions(progress=False))
    tok = load_tokenizer(tokenizer_dir)
    result = diff_files(tok, sim / "engine.jsonl", recon, sim / "labels.parquet")
    meta = {"engine": str(sim / "engine.jsonl"), "reconstructed": str(recon), "tokenizer": tok.name,
            "labels": str(sim / "labels.parquet")}
    meta["data"], meta["data_from"] = diff_data_kind(result.records, meta)  # provenance, as `kimi-eagle diff` states it
    write_diff(result, diff_dir or sim / "diff", meta)
    return result


# --------------------------------------------------------------------------------------------
# CLI
