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

from kimi_eagle.diff.align import Alignment, Hunk, align
from kimi_eagle.tokenize.tokenizer import Tokenizer

VERDICTS = ("exact", "bpe_split", "semantic")
SUBCLASSES = ("truncation", "replacement_char", "special_token", "whitespace", "tool_call_id",
              "tool_args_json_equal", "other")
LABELS = ("exact", "bpe_split", *SUBCLASSES, "mixed")
# The one sign of every token delta (records/hunks parquet ``token_delta``, the report and its charts, the
# inspector, the playground, summaries): reconstructed tokens minus engine tokens; a truncated reconstruction
# is negative, an extra ``</think>`` in the reconstruction +1 (#35).
TOKEN_DELTA_SIGN = "reconstructed − engine"
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


def is_canonical(tok: Tokenizer, ids: Sequence[int], raw: bytes) -> bool | None:
    """Is ``ids`` what the tokenizer produces for ``raw``? None when ``raw`` is not valid UTF-8."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    texts = tok.special_text_by_id
    allowed = {texts[i] for i in ids if i in texts}
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


def _json_equal(x: bytes, y: bytes) -> bool:
    try:
        return json.loads(x.decode("utf-8")) == json.loads(y.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return False


def _subclass(al: Alignment, h: Hunk, sa: list[int], sb: list[int], segments: Sequence[Mapping[str, Any]],
              json_cache: dict[tuple[int, int], bool] | None, kinds: list[str] | None, spans: Spans | None = None) -> str:
    """The subclass of one hunk whose bytes (or special tokens) differ, given the special IDs of the two runs
    (``sa``, ``sb``); see the module docstring."""
    a, b = al.a, al.b
    xa, xb = a.run_bytes(h.a_start, h.a_end), b.run_bytes(h.b_start, h.b_end)
    if xa != xb and h.a_end == len(a) and h.b_end == len(b):
        oa = a.run_plain_bytes(h.a_start, h.a_end) if sa else xa
        ob = b.run_plain_bytes(h.b_start, h.b_end) if sb else xb
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
                cache[bs, be] = _json_equal(a.slice(as_, ae), b.slice(bs, be))
            if cache[bs, be]:
                return "tool_args_json_equal"
    return "other"


def classify_alignment(tok: Tokenizer, al: Alignment, segments: Sequence[Mapping[str, Any]] = ()) -> RecordVerdict:
    """Verdict for an alignment of engine IDs (``a``) against reconstructed IDs (``b``)."""
    if not al.hunks:
        return RecordVerdict("exact", "exact", [], [], al)
    a, b = al.a, al.b
    hunks: list[HunkVerdict] = []
    json_cache: dict[tuple[int, int], bool] = {}
    spans = _spans(segments)
    for h in al.hunks:
        sa, sb = a.run_specials(h.a_start, h.a_end), b.run_specials(h.b_start, h.b_end)
        kinds = _segment_kinds(spans, h.b_byte_start, h.b_byte_end)
        segment = "+".join(kinds)
        if h.same_bytes and sa == sb:
            hunks.append(HunkVerdict(h, "split", None, segment,
                                     is_canonical(tok, a[h.a_start : h.a_end], a.run_bytes(h.a_start, h.a_end)),
                                     is_canonical(tok, b[h.b_start : h.b_end], b.run_bytes(h.b_start, h.b_end))))
        else:
            hunks.append(HunkVerdict(h, "semantic", _subclass(al, h, sa, sb, segments, json_cache, kinds, spans),
                                     segment, None, None))
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
