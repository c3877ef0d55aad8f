"""Verdicts for one record: does the reconstruction reproduce the engine's IDs, and if not, how not.

Record verdicts:

* ``exact`` — the same IDs;
* ``bpe_split`` — the same bytes, segmented differently (with the token-count delta and whether
  the engine's runs are the canonical encoding of their bytes);
* ``semantic`` — some bytes differ (or a special token stands where the other side spells the
  same text with ordinary tokens).

Every semantic hunk gets one subclass, tested in this order (the first that fits wins):

1. ``truncation`` — the hunk ends both sequences and, special tokens aside, one side's bytes are
   a proper prefix of the other's;
2. ``replacement_char`` — both sides read the same once invalid UTF-8 is decoded as U+FFFD;
3. ``special_token`` — the two runs hold different special tokens (a missing ``</think>``, an
   extra ``<|im_end|>``, a marker spelled as text on one side);
4. ``whitespace`` — the runs are equal once ASCII whitespace is removed;
5. ``tool_call_id`` — the hunk touches a ``tool_id`` segment;
6. ``tool_args_json_equal`` — the hunk lies in ``tool_args`` whose JSON parses equal on both sides;
7. ``other``.

A record's ``label`` is ``exact``, ``bpe_split``, its single semantic subclass, or ``mixed``.
Segments (kind and byte/token ranges) describe the reconstructed side, as in the reconstructed row.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .align import Alignment, Hunk, align, vocab
from ..tokcache import per_tokenizer
from ..tokenize.tokenizer import Tokenizer

VERDICTS = ("exact", "bpe_split", "semantic")
SUBCLASSES = ("truncation", "replacement_char", "special_token", "whitespace", "tool_call_id",
              "tool_args_json_equal", "other")
LABELS = ("exact", "bpe_split", *SUBCLASSES, "mixed")
_WS = b" \t\r\n\f\v"


@dataclass
class HunkVerdict:
    hunk: Hunk
    kind: str  # "split" (same bytes) or "semantic"
    subclass: str | None  # for semantic hunks
    segment: str  # kinds of the reconstructed segments it touches, joined by "+"
    engine_canonical: bool | None  # engine run == encode(its bytes); None if not valid UTF-8
    recon_canonical: bool | None


@dataclass
class RecordVerdict:
    verdict: str
    label: str
    subclasses: list[str]  # distinct semantic subclasses, in SUBCLASSES order
    hunks: list[HunkVerdict]
    alignment: Alignment

    @property
    def n_engine(self) -> int:
        return len(self.alignment.a)

    @property
    def n_recon(self) -> int:
        return len(self.alignment.b)

    @property
    def token_delta(self) -> int:
        """Reconstructed tokens minus engine tokens (the sum of the hunks' deltas)."""
        return self.n_recon - self.n_engine

    @property
    def engine_canonical(self) -> bool | None:
        """For split hunks: are all the engine's runs canonical? None without split hunks."""
        flags = [h.engine_canonical for h in self.hunks if h.kind == "split"]
        if not flags:
            return None
        return None if any(f is None for f in flags) else all(flags)

    @property
    def first_divergence(self) -> int | None:
        """Engine token index of the first hunk."""
        return self.hunks[0].hunk.a_start if self.hunks else None


@per_tokenizer
def _specials(tok: Tokenizer) -> tuple[frozenset[int], dict[int, str], int]:
    """Special IDs, their texts, and the smallest special ID (a quick "none here" test by ``max``)."""
    texts = {s.id: s.text for s in tok.special_tokens}
    return frozenset(texts), texts, min(texts, default=1 << 62)


def is_canonical(tok: Tokenizer, ids: Sequence[int], raw: bytes) -> bool | None:
    """Is ``ids`` what the tokenizer produces for ``raw``? None when ``raw`` is not valid UTF-8."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    specials, texts, _ = _specials(tok)
    allowed = {texts[i] for i in ids if i in specials}
    return tok.encode(text, allow_special=allowed) == list(ids)


Spans = list[tuple[int, int, str]]  # (byte_start, byte_end, kind) of each segment


def _spans(segments: Sequence[Mapping[str, Any]]) -> Spans:
    return [(int(s["byte_start"]), int(s["byte_end"]), s["kind"]) for s in segments]


def _segment_kinds(spans: Spans, start: int, end: int) -> list[str]:
    """Kinds of the segments overlapping bytes ``[start, end)``; for an empty range, those touching it."""
    kinds: list[str] = []
    for bs, be, kind in spans:
        hit = (bs < end and be > start) if end > start else (bs <= start <= be)
        if hit and kind not in kinds:
            kinds.append(kind)
    return kinds


def _special_counts(ids: Sequence[int], specials: frozenset[int], lowest: int = 0) -> list[int]:
    """The special IDs in ``ids`` as a sorted list (a multiset); ``lowest`` is the smallest special ID."""
    if not ids or max(ids) < lowest or specials.isdisjoint(ids):
        return []
    ids = ids if isinstance(ids, list) else list(ids)
    return sorted([t for t in specials.intersection(ids) for _ in range(ids.count(t))])


def _without_specials(tok: Tokenizer, run: list[int], raw: bytes, present: list[int], offset, start: int) -> bytes:
    """``raw`` (the bytes of ``run``, tokens ``start..`` of a side) without the bytes of its special tokens.

    ``present`` are the run's special IDs; ``offset(k)`` the byte offset of token ``k`` (None if unknown).
    The special tokens are found with ``list.index`` and cut out by offset, so a long run costs little.
    """
    if not present:
        return raw
    first = offset(start)
    if first is None or offset(start + len(run)) is None:
        plain = vocab(tok).plain  # special tokens spelled b""
        return b"".join(map(plain.__getitem__, run))
    where = []
    for t in set(present):
        k = run.index(t)
        while True:
            where.append(k)
            try:
                k = run.index(t, k + 1)
            except ValueError:
                break
    where.sort()
    pieces, last = [], 0
    for k in where:
        pieces.append(raw[last : offset(start + k) - first])
        last = offset(start + k + 1) - first
    pieces.append(raw[last:])
    return b"".join(pieces)


def _json_equal(x: bytes, y: bytes) -> bool:
    try:
        return json.loads(x.decode("utf-8")) == json.loads(y.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return False


def semantic_subclass(tok: Tokenizer, al: Alignment, h: Hunk, segments: Sequence[Mapping[str, Any]],
                      json_cache: dict[tuple[int, int], bool] | None = None, kinds: list[str] | None = None) -> str:
    """The subclass of one hunk whose bytes (or special tokens) differ; see the module docstring."""
    specials, _, lowest = _specials(tok)
    a_run, b_run = al.a[h.a_start : h.a_end], al.b[h.b_start : h.b_end]
    return _subclass(tok, al, h, a_run, b_run, _special_counts(a_run, specials, lowest),
                     _special_counts(b_run, specials, lowest), segments, json_cache, kinds)


def _subclass(tok: Tokenizer, al: Alignment, h: Hunk, a_run: list[int], b_run: list[int], sa: list[int],
              sb: list[int], segments: Sequence[Mapping[str, Any]], json_cache: dict[tuple[int, int], bool] | None,
              kinds: list[str] | None, spans: Spans | None = None) -> str:
    """:func:`semantic_subclass` given the runs and their special IDs (``sa``, ``sb``)."""
    xa, xb = al.a_run_bytes(h), al.b_run_bytes(h)
    if xa != xb and h.a_end == len(al.a) and h.b_end == len(al.b):
        oa = _without_specials(tok, a_run, xa, sa, al.a_run_offset, h.a_start)
        ob = _without_specials(tok, b_run, xb, sb, al.b_run_offset, h.b_start)
        short, long_ = sorted((oa, ob), key=len)
        if len(short) < len(long_) and long_.startswith(short):
            return "truncation"
    if xa != xb and xa.decode("utf-8", errors="replace") == xb.decode("utf-8", errors="replace"):
        return "replacement_char"
    if sa != sb:
        return "special_token"
    if xa.translate(None, _WS) == xb.translate(None, _WS):
        return "whitespace"
    if spans is None:
        spans = _spans(segments)
    if kinds is None:
        kinds = _segment_kinds(spans, h.b_byte_start, h.b_byte_end)
    if "tool_id" in kinds:
        return "tool_call_id"
    if kinds and set(kinds) == {"tool_args"}:
        args = [(bs, be) for bs, be, kind in spans if kind == "tool_args" and bs <= h.b_byte_start
                and h.b_byte_end <= be]
        if args:
            bs, be = args[0]
            cache = {} if json_cache is None else json_cache
            if (bs, be) not in cache:  # one parse per arguments segment, however many hunks it holds
                as_, ae = al.b_to_a_byte(bs, "start"), al.b_to_a_byte(be, "end")
                cache[bs, be] = _json_equal(al.a_slice(as_, ae), al.b_slice(bs, be))
            if cache[bs, be]:
                return "tool_args_json_equal"
    return "other"


def classify_alignment(tok: Tokenizer, al: Alignment, segments: Sequence[Mapping[str, Any]] = ()) -> RecordVerdict:
    """Verdict for an alignment of engine IDs (``a``) against reconstructed IDs (``b``)."""
    if not al.hunks:
        return RecordVerdict("exact", "exact", [], [], al)
    specials, _, lowest = _specials(tok)
    hunks: list[HunkVerdict] = []
    json_cache: dict[tuple[int, int], bool] = {}
    spans = _spans(segments)
    for h in al.hunks:
        a_run, b_run = al.a[h.a_start : h.a_end], al.b[h.b_start : h.b_end]
        sa, sb = al.a_run_specials(h), al.b_run_specials(h)
        if sa is None:
            sa = _special_counts(a_run, specials, lowest)
        if sb is None:
            sb = _special_counts(b_run, specials, lowest)
        kinds = _segment_kinds(spans, h.b_byte_start, h.b_byte_end)
        segment = "+".join(kinds)
        if h.same_bytes and sa == sb:
            hunks.append(HunkVerdict(h, "split", None, segment, is_canonical(tok, a_run, al.a_run_bytes(h)),
                                     is_canonical(tok, b_run, al.b_run_bytes(h))))
        else:
            hunks.append(HunkVerdict(h, "semantic", _subclass(tok, al, h, a_run, b_run, sa, sb, segments, json_cache,
                                                              kinds, spans), segment, None, None))
    present = {hv.subclass for hv in hunks}
    subclasses = [c for c in SUBCLASSES if c in present]
    if not subclasses:
        verdict, label = "bpe_split", "bpe_split"
    else:
        verdict, label = "semantic", subclasses[0] if len(subclasses) == 1 else "mixed"
    return RecordVerdict(verdict, label, subclasses, hunks, al)


def classify(tok: Tokenizer, engine_ids: Sequence[int], recon_ids: Sequence[int],
             segments: Sequence[Mapping[str, Any]] = ()) -> RecordVerdict:
    """Align engine IDs against reconstructed IDs and classify the record."""
    return classify_alignment(tok, align(tok, engine_ids, recon_ids), segments)
