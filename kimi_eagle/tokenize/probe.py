"""Probe a tokenizer: which special tokens exist, which round-trip, which IDs really stop generation.

Magic constants are wrong until probed: Kimi's ID 163533 is the ordinary token ``chas``;
the stop token ``<|im_end|>`` is 163586.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from kimi_eagle.io import read_jsonl
from kimi_eagle.records import RecordError, parse_engine_record
from kimi_eagle.tokenize.tokenizer import Tokenizer

RESERVED_PREFIX = "<|reserved_token_"  # Kimi's unnamed special slots
MARKER_HINTS = ("<|", "|>", "im_end", "im_start", "</think", "<think")


@dataclass
class SpecialReport:
    id: int
    text: str
    hf_special: bool
    roundtrip: bool  # encode(text, allow_special=True) == [id]
    plain_text_ids: list[int]  # the text encoded as ordinary text


@dataclass
class TokenInfo:
    id: int
    text: str
    bytes_hex: str
    is_special: bool


@dataclass
class EngineStats:
    n_records: int
    n_errors: int
    errors: list[str]  # the first 50 reasons ("line N: why")
    last_tokens: list[dict]  # [{id, text, count}] — which tokens actually end generations
    special_occurrences: list[dict]  # [{id, text, count}] — special IDs seen anywhere in outputs
    all_errors: list[str] = field(default_factory=list, repr=False)  # every reason (not in the JSON report)


@dataclass
class ProbeReport:
    tokenizer: str
    n_vocab: int
    n_ranks: int
    special_tokens: list[SpecialReport]
    marker_like_tokens: list[TokenInfo]
    checked_ids: list[TokenInfo]
    engine: EngineStats | None = None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        d = asdict(self)
        if d["engine"]:
            del d["engine"]["all_errors"]
        return json.dumps(d, ensure_ascii=False, indent=2)


def describe(tok: Tokenizer, token_id: int) -> TokenInfo:
    b = tok.token_bytes(token_id)
    return TokenInfo(token_id, b.decode("utf-8", errors="replace"), b.hex(), token_id in tok.special_ids)


def probe_specials(tok: Tokenizer) -> list[SpecialReport]:
    return [
        SpecialReport(s.id, s.text, s.hf_special, tok.encode(s.text, allow_special=True) == [s.id], tok.encode(s.text))
        for s in tok.special_tokens
    ]


def marker_like_tokens(tok: Tokenizer, limit: int = 200) -> list[TokenInfo]:
    """Ordinary tokens whose bytes look like a piece of a special marker (``<|``, ``|>``, ``im_end`` ...)."""
    special_ids = tok.special_ids
    found = []
    for i in range(tok.n_vocab):
        if i in special_ids:
            continue
        try:
            text = tok.token_bytes(i).decode("utf-8", errors="replace")
        except IndexError:
            continue
        if any(h in text for h in MARKER_HINTS):
            found.append(describe(tok, i))
            if len(found) >= limit:
                break
    return found


def engine_stats(tok: Tokenizer, path: str | Path, top: int = 20) -> EngineStats:
    """Which tokens end the engine's generations and which specials occur; bad records are counted with a reason."""
    last: Counter[int] = Counter()
    specials: Counter[int] = Counter()
    special_ids = tok.special_ids
    n, errors = 0, []
    for line in read_jsonl(path):
        n += 1
        try:
            if line.error:
                raise RecordError(line.error.removeprefix(f"line {line.lineno}: "))
            rec = parse_engine_record(line.obj)
            outside = next((i for i in rec.output_ids if i >= tok.n_vocab), None)
            if outside is not None:
                raise RecordError(f"output_ids holds {outside}, outside the vocabulary 0..{tok.n_vocab - 1}")
        except RecordError as e:
            errors.append(f"line {line.lineno}: {e}")
            continue
        except Exception as e:  # a record the checks did not foresee must not stop the probe
            errors.append(f"line {line.lineno}: unexpected {type(e).__name__}: {e}")
            continue
        if rec.output_ids:
            last[rec.output_ids[-1]] += 1
        specials.update(i for i in rec.output_ids if i in special_ids)

    def rows(counter: Counter[int]) -> list[dict]:
        return [{"id": i, "text": describe(tok, i).text, "count": c} for i, c in counter.most_common(top)]

    return EngineStats(n, len(errors), errors[:50], rows(last), rows(specials), errors)


def probe(tok: Tokenizer, engine_outputs: str | Path | None = None, check_ids: Sequence[int] = ()) -> ProbeReport:
    """Everything the probe knows about ``tok``; with engine outputs, the stop tokens really emitted."""
    n_ranks = getattr(tok, "n_ranks", tok.n_vocab)
    report = ProbeReport(
        tokenizer=tok.name,
        n_vocab=tok.n_vocab,
        n_ranks=n_ranks,
        special_tokens=probe_specials(tok),
        marker_like_tokens=marker_like_tokens(tok),
        checked_ids=[describe(tok, i) for i in check_ids if 0 <= i < tok.n_vocab],
    )
    for s in report.special_tokens:
        if not s.roundtrip:
            report.notes.append(f"special {s.text!r} (id {s.id}) does not round-trip")
    for info in report.checked_ids:
        kind = "a special token" if info.is_special else "an ordinary token"
        report.notes.append(f"id {info.id} is {kind} that decodes to {info.text!r}")
    if engine_outputs is not None:
        report.engine = engine_stats(tok, engine_outputs)
    return report


def named_specials(report: ProbeReport) -> list[SpecialReport]:
    """The special tokens with a name (not one of the ``<|reserved_token_N|>`` slots)."""
    return [s for s in report.special_tokens if not s.text.startswith(RESERVED_PREFIX)]


def probe_metrics(report: ProbeReport, sample_tokens: int) -> dict[str, Any]:
    """``metrics.json`` of a probe: the tokenizer, its sizes, named specials, specials that do not
    round-trip, and how many tokens the sample text took (``sample_tokens``)."""
    from kimi_eagle.data_kinds import model_kind

    return {"data": model_kind(report.tokenizer), "tokenizer": report.tokenizer, "n_vocab": report.n_vocab,
            "n_ranks": report.n_ranks,
            "n_named_specials": len(named_specials(report)),
            "n_not_roundtrip": sum(not s.roundtrip for s in report.special_tokens), "sample_tokens": sample_tokens}
