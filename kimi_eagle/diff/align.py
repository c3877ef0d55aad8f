"""Align two ID sequences of one tokenizer by the byte offsets of their tokens.

``a`` is the reference (the engine's IDs), ``b`` the candidate (the reconstruction). The result
is a list of :class:`Hunk` — maximal token runs that differ — each with its token and byte
ranges on both sides. Everything works on token bytes; nothing is decoded (many tokens are
partial UTF-8).

* Identical leading and trailing tokens are cut off first (IDs packed to bytes, memcmp, galloping); only the
  middle is aligned, so a local difference costs little however long the record is.
* Where the bytes agree, hunks are the runs between *common boundaries* — byte offsets at which
  both sequences have a token boundary — whose tokens differ (one linear merge).
* Where the bytes differ, a byte-level diff finds the edits: common prefix and suffix are cut
  off, the middle is diffed by word-sized chunks (``difflib.SequenceMatcher``), and replaced
  chunk runs are refined byte by byte. The equal byte blocks it finds give the common
  boundaries; everything between two consecutive common boundaries whose tokens differ is a hunk.
"""
from __future__ import annotations

import re
from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from functools import cached_property
from itertools import accumulate
from typing import Sequence

import numpy as np

from ..tokcache import per_tokenizer
from ..tokenize.tokenizer import Tokenizer

# Word-sized chunks for the coarse byte diff: runs of word bytes, whitespace, or single others.
_CHUNK = re.compile(rb"[A-Za-z0-9_\x80-\xff]+|\s+|.", re.DOTALL)
REFINE_MAX_BYTES = 4_000  # replaced chunk runs up to this size (each side) are refined byte by byte
TINY_MIDDLE = 2  # after the common prefix and suffix, a side this short is not searched for matches


class AlignError(ValueError):
    """The IDs cannot be aligned (e.g. an ID outside the tokenizer's vocabulary)."""


@dataclass(slots=True)
class Hunk:
    """A maximal differing run: tokens ``a[a_start:a_end]`` against ``b[b_start:b_end]``.

    Byte offsets are into the concatenated token bytes of each sequence. ``same_bytes`` is
    True when both runs spell the same bytes (a segmentation difference only).
    """

    a_start: int
    a_end: int
    b_start: int
    b_end: int
    a_byte_start: int
    a_byte_end: int
    b_byte_start: int
    b_byte_end: int
    same_bytes: bool

    @property
    def token_delta(self) -> int:
        """Tokens in ``b``'s run minus tokens in ``a``'s run."""
        return (self.b_end - self.b_start) - (self.a_end - self.a_start)


@dataclass(slots=True)
class Middle:
    """What :func:`align` built for the differing middle, kept so hunk bytes are slices, not joins.

    IDs ``p .. p + len(a)`` of the engine side (``a``) and ``p .. p + len(b)`` of ``b``, whose bytes
    ``xa``/``xb`` start at byte ``base`` of both sequences; ``ao``/``bo`` are their token offsets.
    """

    p: int
    base: int
    a: list[int]
    b: list[int]
    xa: bytes
    xb: bytes
    ao: list[int]
    bo: list[int]
    a_specials: list[int]  # positions (in the middle) of the special tokens
    b_specials: list[int]


@dataclass
class Alignment:
    a: list[int]
    b: list[int]
    hunks: list[Hunk]
    table: list[bytes] = field(repr=False, default_factory=list)  # token bytes by ID
    middle: Middle | None = field(repr=False, compare=False, default=None)

    @property
    def exact(self) -> bool:
        return not self.hunks

    @cached_property
    def a_bytes(self) -> bytes:
        return b"".join(map(self.table.__getitem__, self.a))

    @cached_property
    def b_bytes(self) -> bytes:
        return b"".join(map(self.table.__getitem__, self.b))

    @cached_property
    def a_offsets(self) -> list[int]:
        """``len(a) + 1`` byte offsets: token i spans ``a_offsets[i]:a_offsets[i+1]``."""
        return [0, *accumulate(map(len, map(self.table.__getitem__, self.a)))]

    @cached_property
    def b_offsets(self) -> list[int]:
        return [0, *accumulate(map(len, map(self.table.__getitem__, self.b)))]

    @property
    def same_bytes(self) -> bool:
        return self.a_bytes == self.b_bytes

    def a_run_bytes(self, h: Hunk) -> bytes:
        m = self.middle
        if m is not None and m.p <= h.a_start <= h.a_end <= m.p + len(m.a):
            return m.xa[m.ao[h.a_start - m.p] : m.ao[h.a_end - m.p]]
        return b"".join(map(self.table.__getitem__, self.a[h.a_start : h.a_end]))

    def b_run_bytes(self, h: Hunk) -> bytes:
        m = self.middle
        if m is not None and m.p <= h.b_start <= h.b_end <= m.p + len(m.b):
            return m.xb[m.bo[h.b_start - m.p] : m.bo[h.b_end - m.p]]
        return b"".join(map(self.table.__getitem__, self.b[h.b_start : h.b_end]))

    def a_run_specials(self, h: Hunk) -> list[int] | None:
        """The special IDs in ``a[h.a_start:h.a_end]``, sorted; None when the run is not in the middle."""
        m = self.middle
        if m is None or not m.p <= h.a_start <= h.a_end <= m.p + len(m.a):
            return None
        pos = m.a_specials
        return sorted([m.a[k] for k in pos[bisect_left(pos, h.a_start - m.p) : bisect_left(pos, h.a_end - m.p)]])

    def b_run_specials(self, h: Hunk) -> list[int] | None:
        m = self.middle
        if m is None or not m.p <= h.b_start <= h.b_end <= m.p + len(m.b):
            return None
        pos = m.b_specials
        return sorted([m.b[k] for k in pos[bisect_left(pos, h.b_start - m.p) : bisect_left(pos, h.b_end - m.p)]])

    def a_run_offset(self, k: int) -> int | None:
        """Byte offset of token ``k`` of ``a`` within the middle's bytes, or None outside the middle."""
        m = self.middle
        return m.ao[k - m.p] if m is not None and m.p <= k <= m.p + len(m.a) else None

    def b_run_offset(self, k: int) -> int | None:
        m = self.middle
        return m.bo[k - m.p] if m is not None and m.p <= k <= m.p + len(m.b) else None

    def a_slice(self, start: int, end: int) -> bytes:
        """``a_bytes[start:end]``, joining only the tokens around the middle that the range needs."""
        m = self.middle
        got = None if m is None else _range_bytes(self.table, self.a, m.p, m.p + len(m.a), m.xa, m.base, start, end)
        return self.a_bytes[start:end] if got is None else got

    def b_slice(self, start: int, end: int) -> bytes:
        """``b_bytes[start:end]`` (as :meth:`a_slice`)."""
        m = self.middle
        got = None if m is None else _range_bytes(self.table, self.b, m.p, m.p + len(m.b), m.xb, m.base, start, end)
        return self.b_bytes[start:end] if got is None else got

    def b_to_a_byte(self, pos: int, side: str = "start") -> int:
        """Map byte offset ``pos`` of ``b`` to ``a``.

        Exact outside hunks (the bytes there are equal). Inside a hunk, or at an insertion point
        of ``a``-only bytes, ``side="start"`` gives the hunk's start in ``a`` and ``"end"`` its end,
        so a mapped range always covers the differing bytes.
        """
        shift = 0
        for h in self.hunks:
            if pos < h.b_byte_start:
                break
            if pos == h.b_byte_start and (side == "start" or h.b_byte_end > pos):
                return h.a_byte_start
            if pos < h.b_byte_end:
                return h.a_byte_start if side == "start" else h.a_byte_end
            shift = h.a_byte_end - h.b_byte_end
        return pos + shift


def _range_bytes(table: list[bytes], ids: list[int], k0: int, k1: int, x: bytes, base: int, start: int, end: int
                 ) -> bytes | None:
    """Bytes ``[start, end)`` of ``ids``, whose tokens ``k0..k1`` spell ``x`` from byte ``base`` on.

    Tokens are joined outwards from ``x`` only as far as the range reaches; None for a range that
    ``bytes`` slicing would read differently (negative or reversed bounds).
    """
    if start < 0 or end < start:
        return None
    left: list[bytes] = []
    lo, k = base, k0
    while lo > start and k > 0:
        k -= 1
        left.append(table[ids[k]])
        lo -= len(left[-1])
    if lo > start:
        return None
    right: list[bytes] = []
    hi, k, n = base + len(x), k1, len(ids)
    while hi < end and k < n:
        right.append(table[ids[k]])
        hi += len(right[-1])
        k += 1
    if not left and not right:
        return x[start - base : end - base]
    left.reverse()
    return b"".join([*left, x, *right])[start - lo : end - lo]


# --------------------------------------------------------------------------------------------
# token bytes, cached per tokenizer


@dataclass(frozen=True, slots=True)
class Vocab:
    """What alignment needs of a tokenizer, built once per tokenizer (see :func:`vocab`)."""

    table: list[bytes]  # bytes of every ID
    lengths: np.ndarray  # their lengths (int64), for long sums
    lens: list[int]  # their lengths as a list, for short sums at C speed
    specials: frozenset[int]  # IDs of the special/added tokens
    plain: list[bytes]  # like ``table`` with every special token spelled b"" (ordinary bytes only)
    has_empty: bool  # some token has no bytes (offsets are then not strictly increasing)
    special_mask: np.ndarray  # bool by ID: is it a special token


@per_tokenizer
def vocab(tok: Tokenizer) -> Vocab:
    """The :class:`Vocab` of ``tok``, cached while ``tok`` lives (weak-referenceable tokenizers)."""
    table = [tok.token_bytes(i) for i in range(tok.n_vocab)]
    lens = list(map(len, table))
    specials = special_ids(tok)
    plain = list(table)
    for i in specials:
        if 0 <= i < len(plain):
            plain[i] = b""
    mask = np.zeros(len(table), dtype=bool)
    mask[[i for i in specials if 0 <= i < len(table)]] = True
    return Vocab(table, np.array(lens, dtype=np.int64), lens, specials, plain, 0 in lens, mask)


def byte_table(tok: Tokenizer) -> tuple[list[bytes], np.ndarray]:
    """``(bytes of every ID, their lengths)`` for ``tok``, built once per tokenizer."""
    v = vocab(tok)
    return v.table, v.lengths


def special_ids(tok: Tokenizer) -> frozenset[int]:
    """IDs of every special/added token of ``tok``."""
    return frozenset(s.id for s in tok.special_tokens)


def check_ids(tok: Tokenizer, ids: Sequence[int], what: str = "ids") -> None:
    """Raise :class:`AlignError` naming the first ID outside ``0..n_vocab-1``."""
    n = tok.n_vocab
    for k, i in enumerate(ids):
        if not 0 <= i < n:
            raise AlignError(f"{what}[{k}] = {i} is outside the vocabulary 0..{n - 1} of {tok.name}")


# --------------------------------------------------------------------------------------------
# byte diff


def _common_prefix(x: bytes, y: bytes, i: int = 0, j: int = 0, limit: int | None = None) -> int:
    """How many bytes agree from ``x[i:]`` and ``y[j:]`` on, at most ``limit``.

    Windows growing 4x are compared with memcmp; in the first that differs, the first differing byte is the
    lowest set bit of the XOR of the two windows read as little-endian integers. All of it runs at C speed,
    and the cost grows with the answer, not with the lengths.
    """
    n = min(len(x) - i, len(y) - j) if limit is None else limit
    k, step = 0, 256
    while k < n:
        m = min(step, n - k)
        xs, ys = x[i + k : i + k + m], y[j + k : j + k + m]
        if xs != ys:
            d = int.from_bytes(xs, "little") ^ int.from_bytes(ys, "little")
            return k + ((d & -d).bit_length() - 1) // 8
        k, step = k + m, step * 4
    return n


def _common_suffix(x: bytes, y: bytes, limit: int) -> int:
    """Length of the common suffix, at most ``limit`` (as :func:`_common_prefix`, big-endian)."""
    nx, ny = len(x), len(y)
    n = min(nx, ny, limit)
    k, step = 0, 256
    while k < n:
        m = min(step, n - k)
        xs, ys = x[nx - k - m : nx - k], y[ny - k - m : ny - k]
        if xs != ys:
            d = int.from_bytes(xs, "big") ^ int.from_bytes(ys, "big")
            return k + ((d & -d).bit_length() - 1) // 8
        k, step = k + m, step * 4
    return n


Atoms = tuple[list[int], list[int]]  # (starts, ends) of byte spans kept whole (special tokens)
_NO_ATOMS: Atoms = ([], [])


def _snap(pos: int, atoms: Atoms, down: bool) -> int:
    """Move ``pos`` out of any atom it falls strictly inside (to the atom's start or end)."""
    starts, ends = atoms
    k = bisect_left(starts, pos) - 1
    if k >= 0 and starts[k] < pos < ends[k]:
        return starts[k] if down else ends[k]
    return pos


def _chunks(data: bytes, lo: int, hi: int, atoms: Atoms, fine: bool) -> tuple[list[bytes], list[int]]:
    """``data[lo:hi]`` as chunks (single bytes if ``fine``, else word-sized), atoms kept whole.

    Returns the chunks and their ``len + 1`` absolute byte offsets.
    """
    starts, ends = atoms
    out: list[bytes] = []
    pos = lo
    for k in range(bisect_left(starts, lo), bisect_left(starts, hi)):
        s, e = starts[k], ends[k]
        if e > hi:
            break
        gap = data[pos:s]
        out.extend([gap[i : i + 1] for i in range(len(gap))] if fine else _CHUNK.findall(gap))
        out.append(data[s:e])
        pos = e
    gap = data[pos:hi]
    out.extend([gap[i : i + 1] for i in range(len(gap))] if fine else _CHUNK.findall(gap))
    return out, list(accumulate(map(len, out), initial=lo))


def _longest_match(sx: str | bytes, sy: str | bytes, alo: int, ahi: int, blo: int, bhi: int) -> tuple[int, int, int]:
    """The longest block ``sx[i:i+k] == sy[j:j+k]`` inside the ranges; the earliest ``i``, then ``j``, on ties.

    The contract of ``difflib.SequenceMatcher.find_longest_match`` without junk, with the searching done by
    ``find`` at C speed: each start ``i`` costs one search for a block longer than the best so far.
    """
    besti, bestj, bestk = alo, blo, 0
    find = sy.find
    i = alo
    while i + bestk < ahi:
        if find(sx[i : i + bestk + 1], blo, bhi) >= 0:
            k = bestk + 1
            lo, hi = k, min(ahi - i, bhi - blo)  # a block of lo occurs; gallop then bisect for the longest
            step = 1
            while lo < hi:
                k = min(hi, lo + step)
                if sy.find(sx[i : i + k], blo, bhi) < 0:
                    hi = k - 1
                    break
                lo, step = k, step * 2
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if sy.find(sx[i : i + mid], blo, bhi) >= 0:
                    lo = mid
                else:
                    hi = mid - 1
            besti, bestj, bestk = i, sy.find(sx[i : i + lo], blo, bhi), lo
        i += 1
    return besti, bestj, bestk


def _matching_blocks(sx: str | bytes, sy: str | bytes) -> list[tuple[int, int, int]]:
    """``difflib.SequenceMatcher(None, sx, sy, autojunk=False).get_matching_blocks()``, without the sentinel."""
    found = []
    stack = [(0, len(sx), 0, len(sy))]
    while stack:
        alo, ahi, blo, bhi = stack.pop()
        i, j, k = _longest_match(sx, sy, alo, ahi, blo, bhi)
        if k:
            found.append((i, j, k))
            if alo < i and blo < j:
                stack.append((alo, i, blo, j))
            if i + k < ahi and j + k < bhi:
                stack.append((i + k, ahi, j + k, bhi))
    found.sort()
    merged: list[tuple[int, int, int]] = []
    for i, j, k in found:  # adjacent blocks become one
        if merged and merged[-1][0] + merged[-1][2] == i and merged[-1][1] + merged[-1][2] == j:
            merged[-1] = (merged[-1][0], merged[-1][1], merged[-1][2] + k)
        else:
            merged.append((i, j, k))
    return merged


def _as_text(cx: list[bytes], cy: list[bytes]) -> tuple[str, str]:
    """Both chunk lists as strings with one character per distinct chunk (equal chunks, equal characters)."""
    codes = {c: k for k, c in enumerate(dict.fromkeys(cx + cy))}
    return "".join(map(chr, map(codes.__getitem__, cx))), "".join(map(chr, map(codes.__getitem__, cy)))


def _matching(x: bytes, y: bytes, xr: tuple[int, int], yr: tuple[int, int], xa: Atoms, ya: Atoms,
              fine: bool) -> list[tuple[int, int, int]]:
    """Equal byte blocks of ``x[xr]`` and ``y[yr]``: a diff of their chunks, replaced runs refined byte by byte.

    The blocks are those of ``difflib.SequenceMatcher`` (its autojunk heuristic on for the word-sized chunks,
    off for single bytes); without junk they are computed by :func:`_matching_blocks` (C-speed searching).
    """
    (x0, x1), (y0, y1) = xr, yr
    if fine and not _has_atoms(xa, x0, x1) and not _has_atoms(ya, y0, y1):  # bytes are the chunks
        return [(x0 + i, y0 + j, k) for i, j, k in _matching_blocks(x[x0:x1], y[y0:y1])]
    cx, ox = _chunks(x, x0, x1, xa, fine)
    cy, oy = _chunks(y, y0, y1, ya, fine)
    if not fine and len(cy) >= 200:  # difflib's autojunk may drop popular chunks: use difflib itself
        matches = SequenceMatcher(None, cx, cy, autojunk=True).get_matching_blocks()[:-1]
    else:
        matches = _matching_blocks(*_as_text(cx, cy))
    blocks: list[tuple[int, int, int]] = []
    i = j = 0
    for ai, bj, size in [*matches, (len(cx), len(cy), 0)]:
        if not fine and i < ai and j < bj:  # a replaced run
            bx, ex, by, ey = ox[i], ox[ai], oy[j], oy[bj]
            if ex - bx <= REFINE_MAX_BYTES and ey - by <= REFINE_MAX_BYTES:
                blocks.extend(_matching(x, y, (bx, ex), (by, ey), xa, ya, fine=True))
        if size:
            blocks.append((ox[ai], oy[bj], ox[ai + size] - ox[ai]))
        i, j = ai + size, bj + size
    return blocks


def _has_atoms(atoms: Atoms, lo: int, hi: int) -> bool:
    """Does an atom start inside ``[lo, hi)``?"""
    starts = atoms[0]
    k = bisect_left(starts, lo)
    return k < len(starts) and starts[k] < hi


def equal_byte_blocks(x: bytes, y: bytes, x_atoms: Atoms = _NO_ATOMS, y_atoms: Atoms = _NO_ATOMS) -> list[tuple[int, int, int]]:
    """Matching blocks ``(i, j, n)`` with ``x[i:i+n] == y[j:j+n]``, increasing in both.

    Common prefix and suffix first; the middle by word-sized chunks, with replaced chunk runs
    refined byte by byte when small enough. Atoms (the byte spans of special tokens) are never
    split: a marker is matched whole or not at all.
    """
    p = _common_prefix(x, y)
    while (q := min(_snap(p, x_atoms, down=True), _snap(p, y_atoms, down=True))) != p:
        p = q
    s = _common_suffix(x, y, min(len(x), len(y)) - p)
    while (q := min(len(x) - _snap(len(x) - s, x_atoms, down=False), len(y) - _snap(len(y) - s, y_atoms, down=False))) != s:
        s = q
    blocks = [(0, 0, p)] if p else []
    x1, y1 = len(x) - s, len(y) - s
    if min(x1, y1) - p > TINY_MIDDLE:  # a tiny middle on either side holds no useful match
        inner = _contained(x, y, (p, x1), (p, y1), x_atoms, y_atoms)
        blocks += inner if inner is not None else _matching(x, y, (p, x1), (p, y1), x_atoms, y_atoms, fine=False)
    if s:
        blocks.append((x1, y1, s))
    return blocks


def _contained(x: bytes, y: bytes, xr: tuple[int, int], yr: tuple[int, int], xa: Atoms, ya: Atoms
               ) -> list[tuple[int, int, int]] | None:
    """The one block when the shorter middle occurs whole inside the longer (a pure insertion around it).

    Found at C speed with ``bytes.find``; None when it does not occur or would cut a special token.
    """
    (x0, x1), (y0, y1) = xr, yr
    if y1 - y0 <= x1 - x0:
        k = x.find(y[y0:y1], x0, x1)
        if k >= 0 and _snap(k, xa, True) == k and _snap(k + y1 - y0, xa, True) == k + y1 - y0:
            return [(k, y0, y1 - y0)]
    else:
        k = y.find(x[x0:x1], y0, y1)
        if k >= 0 and _snap(k, ya, True) == k and _snap(k + x1 - x0, ya, True) == k + x1 - x0:
            return [(x0, k, x1 - x0)]
    return None


# --------------------------------------------------------------------------------------------
# alignment


def _special_positions(v: Vocab, ids: list[int], packed: bytes) -> list[int]:
    """Sorted positions of the special tokens in ``ids`` (a numpy mask for long runs, ``list.index`` otherwise)."""
    if len(ids) >= 128:
        return np.flatnonzero(v.special_mask[np.frombuffer(packed, dtype=np.uint64)]).tolist()
    if v.specials.isdisjoint(ids):
        return []
    where = []
    for t in v.specials.intersection(ids):
        k = ids.index(t)
        while True:
            where.append(k)
            try:
                k = ids.index(t, k + 1)
            except ValueError:
                break
    where.sort()
    return where


def _atoms(where: list[int], offsets: list[int]) -> Atoms:
    """Byte spans of the special tokens at positions ``where``."""
    if not where:
        return _NO_ATOMS
    return [offsets[k] for k in where], [offsets[k + 1] for k in where]


def _same_ids(pa: bytes, pb: bytes, i: int, j: int, limit: int) -> int:
    """How many IDs agree from ID ``i`` of ``pa`` and ``j`` of ``pb`` on (packed 8-byte IDs), at most ``limit``."""
    return _common_prefix(pa, pb, 8 * i, 8 * j, 8 * limit) // 8


def _same_ids_back(pa: bytes, pb: bytes, limit: int) -> int:
    """How many trailing IDs of ``pa`` and ``pb`` agree, at most ``limit``."""
    return _common_suffix(pa, pb, 8 * limit) // 8


def _anchors(ao: list[int], bo: list[int], blocks: list[tuple[int, int, int]]) -> list[tuple[int, int]]:
    """Common boundaries ``(k, kb)`` inside the equal byte blocks, the ends included (plain method).

    Used when some token has no bytes (several tokens then share an offset).
    """
    b_index = {off: k for k, off in enumerate(bo)}
    anchors = [(0, 0)]
    for i, j, n in blocks:
        for k in range(bisect_left(ao, i), bisect_right(ao, i + n)):
            kb = b_index.get(ao[k] - i + j)
            if kb is not None and (k, kb) != anchors[-1]:
                anchors.append((k, kb))
    if anchors[-1] != (len(ao) - 1, len(bo) - 1):
        anchors.append((len(ao) - 1, len(bo) - 1))
    return anchors


def _offsets(v: Vocab, ids: list[int], packed: bytes) -> list[int]:
    """``len(ids) + 1`` byte offsets of the tokens (numpy for long runs, where its fixed cost pays)."""
    if len(ids) < 256:
        return list(accumulate(map(v.lens.__getitem__, ids), initial=0))
    out = np.cumsum(v.lengths[np.frombuffer(packed, dtype=np.uint64)]).tolist()
    out.insert(0, 0)
    return out


def _align_middle(v: Vocab, a: list[int], b: list[int], pa: bytes, pb: bytes, p: int, base: int
                  ) -> tuple[list[Hunk], Middle]:
    """Hunks of the middles ``a`` against ``b`` (IDs ``p..`` of the sequences, bytes ``base..``).

    Their first tokens differ and their ends are a common boundary; ``pa``/``pb`` are the middles packed.
    Common boundaries are found by merging the byte offsets inside each equal byte block; a run of
    identical tokens after a common boundary is skipped whole (memcmp), so the Python work is in the hunks.
    """
    table = v.table
    ao, bo = _offsets(v, a, pa), _offsets(v, b, pb)
    xa, xb = b"".join(map(table.__getitem__, a)), b"".join(map(table.__getitem__, b))
    sa, sb = _special_positions(v, a, pa), _special_positions(v, b, pb)
    if xa == xb:
        blocks = [(0, 0, len(xa))]
    elif a and b:
        blocks = equal_byte_blocks(xa, xb, _atoms(sa, ao), _atoms(sb, bo))
    else:
        blocks = []
    na, nb = len(a), len(b)
    hunks: list[Hunk] = []

    def emit(a0: int, b0: int, a1: int, b1: int) -> None:
        if a1 - a0 == 1 and b1 - b0 == 1 and a[a0] == b[b0]:
            return
        ab0, ab1, bb0, bb1 = ao[a0], ao[a1], bo[b0], bo[b1]
        hunks.append(Hunk(a0 + p, a1 + p, b0 + p, b1 + p, ab0 + base, ab1 + base, bb0 + base, bb1 + base,
                          xa[ab0:ab1] == xb[bb0:bb1]))

    if v.has_empty:
        anchors = _anchors(ao, bo, blocks)
        for (a0, b0), (a1, b1) in zip(anchors, anchors[1:]):
            emit(a0, b0, a1, b1)
        return hunks, Middle(p, base, a, b, xa, xb, ao, bo, sa, sb)
    pk = pkb = 0  # the last common boundary
    for i, j, n in blocks:
        end = i + n
        k, kb, k_end, d = bisect_left(ao, i), bisect_left(bo, j), bisect_right(ao, end), j - i
        while k < k_end and kb <= nb:
            x, y = ao[k] + d, bo[kb]
            if x < y:
                k += 1
            elif x > y:
                kb += 1
            else:  # a common boundary
                if k != pk or kb != pkb:
                    emit(pk, pkb, k, kb)
                    pk, pkb = k, kb
                if k < na and kb < nb and a[k] == b[kb] and k + 1 < k_end:  # identical tokens inside the block
                    r = _same_ids(pa, pb, k, kb, min(k_end - 1 - k, nb - kb))
                    k += r
                    kb += r
                    pk, pkb = k, kb
                else:
                    k += 1
                    kb += 1
    if pk != na or pkb != nb:
        emit(pk, pkb, na, nb)
    return hunks, Middle(p, base, a, b, xa, xb, ao, bo, sa, sb)


def align(tok: Tokenizer, a: Sequence[int], b: Sequence[int]) -> Alignment:
    """Align ``a`` (reference) and ``b`` (candidate); raises :class:`AlignError` on out-of-range IDs."""
    a, b = list(a), list(b)
    v = vocab(tok)
    packed = []
    for what, ids in (("a", a), ("b", b)):
        try:
            packed.append(array("Q", ids).tobytes())  # negative IDs raise OverflowError here
        except (OverflowError, TypeError):
            if what == "b":  # a's errors come first
                check_ids(tok, a, "a")
            check_ids(tok, ids, what)
            raise AlignError(f"{what}: IDs must be integers") from None
    pa, pb = packed
    na, nb = len(a), len(b)
    n_vocab = len(v.table)
    if a and (max(a) if na < 256 else int(np.frombuffer(pa, dtype=np.uint64).max())) >= n_vocab:
        check_ids(tok, a, "a")
    if a == b:
        return Alignment(a, b, [], v.table)
    # common prefix/suffix in tokens, compared as packed 8-byte integers (memcmp); they are a's, so valid
    n = min(na, nb)
    if n <= 512:  # one window each way: the lowest set bit of the XOR is the first difference
        x, y = pa[: 8 * n], pb[: 8 * n]
        d = int.from_bytes(x, "little") ^ int.from_bytes(y, "little")
        p = ((d & -d).bit_length() - 1) // 64 if d else n
        x, y = pa[8 * (na - n + p) :], pb[8 * (nb - n + p) :]
        d = int.from_bytes(x, "big") ^ int.from_bytes(y, "big")
        s = ((d & -d).bit_length() - 1) // 64 if d else n - p
    else:
        p = _same_ids(pa, pb, 0, 0, n)
        s = _same_ids_back(pa, pb, n - p)
    if p < 192:  # bytes before the middle (equal on both sides)
        base = sum(map(v.lens.__getitem__, a[:p]))
    else:
        base = int(v.lengths[np.frombuffer(pa, dtype=np.uint64, count=p)].sum())
    bm = b[p : nb - s]
    if bm and max(bm) >= n_vocab:  # b's other IDs are a's
        check_ids(tok, b, "b")
    hunks, middle = _align_middle(v, a[p : na - s], bm, pa[8 * p : 8 * (na - s)], pb[8 * p : 8 * (nb - s)], p, base)
    return Alignment(a, b, hunks, v.table, middle)
