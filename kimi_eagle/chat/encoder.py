"""Whole-string encoding of pieces and segments, with byte and token spans.

Encoding is done once per string: consecutive non-special pieces are joined and encoded together
(exactly what encoding the whole string does, because a tokenizer never merges across a special
token), special pieces become their IDs. Segment token spans are then read off the joined runs.
A :class:`PieceEncoder` belongs to one tokenizer and keeps a cache of encoded runs: build it once
per process (or per loop over records) and pass it to every call.
"""
from __future__ import annotations

import inspect
import re
import struct
from collections import OrderedDict
from typing import Any, Callable, Iterable, Sequence

from kimi_eagle.chat.completion import SPECIAL, Piece, Segment, Span
from kimi_eagle.tokenize.tokenizer import MAX_RUN_CHARS, KimiTokenizer, Tokenizer


class PieceEncoder:
    """Encodes piece lists with one tokenizer: joined plain runs, specials by ID, a run cache.

    The cache maps a plain run to its IDs; multi-turn prompts repeat their history runs, so a
    conversation's prompts cost little more than its new text.

    ``packed``: :meth:`encode_marked` (a prompt) and the common case of :meth:`encode_segments_marked` (a
    completion) return their IDs as a numpy ``int32`` array instead of a list, joined from the runs' packed IDs
    (tiktoken's buffer: no Python int is made for them). For a consumer that only stores the IDs (a file job's
    Arrow column); everything else gets lists.
    """

    def __init__(self, tok: Tokenizer, cache_entries: int = 8192, packed: bool = False) -> None:
        self.tok = tok
        self.packed = packed
        self.special_id_by_text = tok.special_id_by_text
        self._marker = _marker_regex(self.special_id_by_text)
        self._marker_needles = _marker_needles(self.special_id_by_text)
        self._marker_chars = sorted({n[:1] for n in self._marker_needles})
        self._cache: dict[bool, OrderedDict[str, list[int]]] = {False: OrderedDict(), True: OrderedDict()}
        self._marks: OrderedDict[str, bool] = OrderedDict()
        self._cache_entries = cache_entries
        self._plain = _plain_encoder(tok)
        self._plain_cont = _plain_encoder(tok, continuation=True)
        if packed:
            self._packed_cache: dict[bool, OrderedDict[str, tuple[bytes, bool]]] = {False: OrderedDict(), True: OrderedDict()}
            self._packed_specials = {text: _int32_bytes([sid]) for text, sid in self.special_id_by_text.items()}
            self._packed_plain = {c: _packed_encoder(tok, p) for c, p in ((False, self._plain), (True, self._plain_cont))}

    def has_marker(self, text: str) -> bool:
        """Does ``text`` spell any special token of the tokenizer? (cached)"""
        found = self._marks.get(text)
        if found is None:
            found = self._scan(text)
            self._remember(self._marks, text, found)
        return found

    def _scan(self, text: str) -> bool:
        # a quick look for the literal starts of every candidate first; the regex only where one occurs
        if not any(c in text for c in self._marker_chars) or not any(n in text for n in self._marker_needles):
            return False
        return self._marker is not None and any(m.group() in self.special_id_by_text for m in self._marker.finditer(text))

    def _remember(self, cache: OrderedDict, key: str, value: Any) -> None:
        if len(cache) >= self._cache_entries:  # evict the oldest: records arrive conversation by conversation
            cache.popitem(last=False)
        cache[key] = value

    def encode_text(self, text: str, continuation: bool = False) -> list[int]:
        """IDs of plain text (special spellings stay text), cached."""
        return self._run(text, continuation)[0]

    def _run(self, text: str, continuation: bool) -> tuple[list[int], bool]:
        """IDs of a plain run and whether it spells a special token, cached together."""
        cache = self._cache[continuation]
        hit = cache.get(text)
        if hit is None:
            hit = ((self._plain_cont if continuation else self._plain)(text), self._scan(text))
            self._remember(cache, text, hit)
        return hit

    def _runs(self, pieces: Iterable[Piece]) -> Iterable[tuple[str, int | None]]:
        """Yield ``(plain run, None)`` and ``(special text, id)`` in order."""
        buf: list[str] = []
        for text, kind in pieces:
            sid = self.special_id_by_text.get(text) if kind == SPECIAL else None
            if sid is None:
                buf.append(text)
                continue
            if buf:
                yield "".join(buf), None
                buf = []
            yield text, sid
        if buf:
            yield "".join(buf), None

    def encode(self, pieces: Iterable[Piece], continuation: bool = False) -> list[int]:
        """IDs of the joined pieces (plain runs encoded whole, specials by ID)."""
        return self.encode_marked(pieces, continuation)[0]

    def encode_marked(self, pieces: Iterable[Piece], continuation: bool = False) -> tuple[list[int], bool]:
        """``encode``, plus whether any plain run spells a special token (so is kept as literal text);
        a numpy ``int32`` array instead of the list with ``packed``."""
        if self.packed:
            return self._encode_packed(pieces, continuation)
        ids: list[int] = []
        buf: list[str] = []
        special_id_by_text, run_of = self.special_id_by_text, self._run
        marker = False
        for text, kind in pieces:
            if kind == SPECIAL:
                sid = special_id_by_text.get(text)
                if sid is not None:
                    if buf:
                        run = "".join(buf) if len(buf) > 1 else buf[0]
                        if run:
                            run_ids, found = run_of(run, continuation)
                            ids += run_ids
                            marker = marker or found
                        buf = []
                    ids.append(sid)
                    continue
            buf.append(text)
        if buf:
            run = "".join(buf)
            if run:
                run_ids, found = run_of(run, continuation)
                ids += run_ids
                marker = marker or found
        return ids, marker

    def _packed_run(self, text: str, continuation: bool) -> tuple[bytes, bool]:
        """A plain run's IDs as int32 bytes and whether it spells a special token, cached together."""
        cache = self._packed_cache[continuation]
        hit = cache.get(text)
        if hit is None:
            listed = self._cache[continuation].get(text)  # e.g. an earlier completion, now in this prompt's history
            hit = ((_int32_bytes(listed[0]), listed[1]) if listed is not None
                   else (self._packed_plain[continuation](text), self._scan(text)))
            self._remember(cache, text, hit)
        return hit

    def _encode_packed(self, pieces: Iterable[Piece], continuation: bool) -> tuple[Any, bool]:
        """:meth:`encode_marked` with ``packed``: the same IDs as one numpy ``int32`` array."""
        import numpy as np

        parts: list[bytes] = []
        buf: list[str] = []
        specials, run_of = self._packed_specials, self._packed_run
        marker = False
        for text, kind in pieces:
            part = specials.get(text) if kind == SPECIAL else None
            if part is None:
                buf.append(text)
                continue
            if buf:
                run = "".join(buf) if len(buf) > 1 else buf[0]
                buf = []
                if run:
                    packed, found = run_of(run, continuation)
                    parts.append(packed)
                    marker = marker or found
            parts.append(part)
        run = "".join(buf)
        if run:
            packed, found = run_of(run, continuation)
            parts.append(packed)
            marker = marker or found
        return np.frombuffer(b"".join(parts), dtype=np.int32), marker

    def _encode_single_piece_segments(self, segments: Sequence[Segment],
                                      continuation: bool) -> tuple[list[int], list[Span], bool] | None:
        """The common case: one piece per segment and no two plain segments adjacent. None otherwise."""
        ids: list[int] = []
        spans: list[Span] = []
        byte_pos = 0
        prev_plain = marker = False
        special_id_by_text = self.special_id_by_text
        for kind, pieces in segments:
            if len(pieces) != 1:
                return None
            text, pkind = pieces[0]
            nb = len(text) if text.isascii() else len(text.encode("utf-8"))
            start = len(ids)
            sid = special_id_by_text.get(text) if pkind == SPECIAL else None
            if sid is not None:
                ids.append(sid)
                prev_plain = False
            elif text:
                if prev_plain:
                    return None
                run_ids, found = self._run(text, continuation)
                ids += run_ids
                marker = marker or found
                prev_plain = True
            spans.append(Span(kind, byte_pos, byte_pos + nb, start, len(ids)))
            byte_pos += nb
        return ids, spans, marker

    def _encode_single_piece_packed(self, segments: Sequence[Segment],
                                    continuation: bool) -> tuple[Any, list[Span], bool] | None:
        """:meth:`_encode_single_piece_segments` with ``packed``: the IDs as one numpy ``int32`` array."""
        import numpy as np

        parts: list[bytes] = []
        spans: list[Span] = []
        byte_pos = n_ids = 0
        prev_plain = marker = False
        specials, run_of = self._packed_specials, self._packed_run
        for kind, pieces in segments:
            if len(pieces) != 1:
                return None
            text, pkind = pieces[0]
            nb = len(text) if text.isascii() else len(text.encode("utf-8"))
            start = n_ids
            part = specials.get(text) if pkind == SPECIAL else None
            if part is not None:
                prev_plain = False
            elif text:
                if prev_plain:
                    return None
                part, found = run_of(text, continuation)
                marker = marker or found
                prev_plain = True
            if part is not None:
                parts.append(part)
                n_ids += len(part) // 4
            spans.append(Span(kind, byte_pos, byte_pos + nb, start, n_ids))
            byte_pos += nb
        return np.frombuffer(b"".join(parts), dtype=np.int32), spans, marker

    def encode_segments(self, segments: Sequence[Segment], continuation: bool = False) -> tuple[list[int], list[Span]]:
        """Encode the completion once; return its IDs and each segment's byte and token span.

        A plain run that crosses segment boundaries is encoded whole and cut at token byte
        boundaries; a boundary inside a token raises ValueError (formats place boundaries at specials).
        """
        return self.encode_segments_marked(segments, continuation)[:2]

    def encode_segments_marked(self, segments: Sequence[Segment],
                               continuation: bool = False) -> tuple[list[int], list[Span], bool]:
        """``encode_segments``, plus whether any plain text in the completion spells a special token."""
        fast = (self._encode_single_piece_packed if self.packed else self._encode_single_piece_segments)(segments,
                                                                                                   continuation)
        if fast is not None:
            return fast
        marker = any(self.has_marker(t) for seg in segments for t, kind in seg.pieces if kind != SPECIAL)
        return (*self._encode_segments_general(segments, continuation), marker)

    def _encode_segments_general(self, segments: Sequence[Segment],
                                 continuation: bool) -> tuple[list[int], list[Span]]:
        units = [(i, text, sid) for i, seg in enumerate(segments) for text, sid in self._runs(seg.pieces)]
        ids: list[int] = []
        u_tok: list[tuple[int, int]] = [(0, 0)] * len(units)
        k = 0
        while k < len(units):
            if units[k][2] is not None:
                u_tok[k] = (len(ids), len(ids) + 1)
                ids.append(units[k][2])
                k += 1
                continue
            j = k
            while j < len(units) and units[j][2] is None:
                j += 1
            texts = [units[m][1] for m in range(k, j)]
            joined = "".join(texts)
            base = len(ids)
            ids += self.encode_text(joined, continuation) if joined else []
            if j - k == 1:
                u_tok[k] = (base, len(ids))
            else:
                cuts, cum = {0: base}, 0
                for n, t in enumerate(ids[base:], base + 1):
                    cum += len(self.tok.token_bytes(t))
                    cuts[cum] = n
                off = 0
                for m, text in zip(range(k, j), texts):
                    nb = off + len(text.encode("utf-8"))
                    if off not in cuts or nb not in cuts:
                        raise ValueError(f"segment {segments[units[m][0]].kind!r} boundary falls inside a token")
                    u_tok[m] = (cuts[off], cuts[nb])
                    off = nb
            k = j
        spans: list[Span] = []
        byte_pos = tok_pos = 0
        seg_units: dict[int, list[int]] = {}
        for m, (i, _, _) in enumerate(units):
            seg_units.setdefault(i, []).append(m)
        for i, seg in enumerate(segments):
            nb = sum(len(t.encode("utf-8")) for t, _ in seg.pieces)
            ms = seg_units.get(i)
            t0, t1 = (u_tok[ms[0]][0], u_tok[ms[-1]][1]) if ms else (tok_pos, tok_pos)
            spans.append(Span(seg.kind, byte_pos, byte_pos + nb, t0, t1))
            byte_pos, tok_pos = byte_pos + nb, t1
        return ids, spans


def _marker_regex(specials: Iterable[str]) -> re.Pattern | None:
    """A regex finding candidate special spellings: one generic ``<|...|>`` pattern plus the rest
    literally (a single fast scan even with hundreds of reserved ``<|reserved_token_N|>`` names)."""
    generic = re.compile(r"<\|[^\s<>|]{1,64}\|>")
    others = sorted((t for t in specials if not generic.fullmatch(t)), key=len, reverse=True)
    alts = ([generic.pattern] if len(others) < len(list(specials)) else []) + [re.escape(t) for t in others]
    return re.compile("|".join(alts)) if alts else None


def _marker_needles(specials: Iterable[str]) -> list[str]:
    """Literal strings at least one of which every match of ``_marker_regex`` contains."""
    generic = re.compile(r"<\|[^\s<>|]{1,64}\|>")
    others = [t for t in specials if not generic.fullmatch(t)]
    return (["<|"] if len(others) < len(list(specials)) else []) + others


def _int32_bytes(ids: Sequence[int]) -> bytes:
    """IDs as native-order int32 bytes (ValueError for one that is not an int32)."""
    try:
        return struct.pack(f"={len(ids)}i", *ids)
    except struct.error:
        raise ValueError("an ID does not fit int32") from None


def _packed_encoder(tok: Tokenizer, plain: Callable[[str], list[int]]) -> Callable[[str], bytes]:
    """A function giving what ``plain`` gives as int32 bytes: for Kimi, texts up to ``MAX_RUN_CHARS`` through
    tiktoken's token buffer (what ``encode_to_numpy`` wraps, called without its Python layer when the installed
    tiktoken has it: the same IDs as ``encode_ordinary``, never made Python ints; tests/test_packed_encoder.py)."""
    if not isinstance(tok, KimiTokenizer):
        return lambda text: _int32_bytes(plain(text))
    core = getattr(tok.encoding, "_core_bpe", None)
    if hasattr(core, "encode_to_tiktoken_buffer") and tok.n_vocab <= 2**31:
        buffer, no_specials = core.encode_to_tiktoken_buffer, frozenset()  # uint32 IDs; every ID < 2**31
        return lambda text: bytes(buffer(text, no_specials)) if len(text) <= MAX_RUN_CHARS else _int32_bytes(plain(text))
    to_numpy = tok.encoding.encode_to_numpy
    return lambda text: (to_numpy(text, disallowed_special=()).tobytes() if len(text) <= MAX_RUN_CHARS
                         else _int32_bytes(plain(text)))


def _plain_encoder(tok: Tokenizer, continuation: bool = False) -> Callable[[str], list[int]]:
    """A function encoding text with special spellings as plain text, as ``tok.encode`` does.

    For Kimi, short texts go straight to tiktoken's ``encode_ordinary`` (the same tokens as
    ``encode`` without allowed specials, but faster); long ones through ``KimiTokenizer.encode``
    for its chunking. ``continuation`` uses the tokenizer's continuation mode where it has one.
    """
    if isinstance(tok, KimiTokenizer):
        ordinary, full = tok.encoding.encode_ordinary, tok.encode
        return lambda text: ordinary(text) if len(text) <= MAX_RUN_CHARS else full(text)
    if continuation:
        try:
            if "continuation" in inspect.signature(tok.encode).parameters:
                return lambda text: tok.encode(text, continuation=True)  # type: ignore[call-arg]
        except (TypeError, ValueError):
            pass
    return tok.encode
