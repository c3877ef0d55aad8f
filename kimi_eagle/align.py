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
import weakref
from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from functools import cached_property
from itertools import accumulate
from typing import Sequence

import numpy as np

from .tokenizer import Tokenizer

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


@dataclass
class Alignment:
    a: list[int]
    b: list[int]
    hunks: list[Hunk]
    table: list[bytes] = field(repr=False, default_factory=list)  # token bytes by ID

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
        return b"".join(map(self.table.__getitem__, self.a[h.a_start : h.a_end]))

    def b_run_bytes(self, h: Hunk) -> bytes:
        return b"".join(map(self.table.__getitem__, self.b[h.b_start : h.b_end]))

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


# --------------------------------------------------------------------------------------------
# token bytes, cached per tokenizer

_TABLES: "weakref.WeakKeyDictionary[object, tuple[list[bytes], np.ndarray]]" = weakref.WeakKeyDictionary()


def byte_table(tok: Tokenizer) -> tuple[list[bytes], np.ndarray]:
    """``(bytes of every ID, their lengths)`` for ``tok``, built once per tokenizer."""
    try:
        return _TABLES[tok]
    except (KeyError, TypeError):
        pass
    table = [tok.token_bytes(i) for i in range(tok.n_vocab)]
    entry = (table, np.fromiter(map(len, table), dtype=np.int64, count=len(table)))
    try:
        _TABLES[tok] = entry
    except TypeError:  # not weak-referenceable: just don't cache
        pass
    return entry


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


def _common_prefix(x: bytes, y: bytes) -> int:
    """Length of the common prefix: galloping, then bisection, on slice comparisons (memcmp).

    The cost grows with the answer, not with the lengths.
    """
    n = min(len(x), len(y))
    lo, step = 0, 8  # x[:lo] == y[:lo]
    while lo < n:
        hi = min(n, lo + step)
        if x[lo:hi] != y[lo:hi]:
            break
        lo, step = hi, step * 2
    else:
        return n
    while hi - lo > 1:  # x[lo:hi] differs somewhere
        mid = (lo + hi) // 2
        if x[lo:mid] == y[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _common_suffix(x: bytes, y: bytes, limit: int) -> int:
    """Length of the common suffix, at most ``limit`` (same method as :func:`_common_prefix`)."""
    n = min(len(x), len(y), limit)
    nx, ny = len(x), len(y)
    lo, step = 0, 8  # the last lo bytes agree
    while lo < n:
        hi = min(n, lo + step)
        if x[nx - hi : nx - lo] != y[ny - hi : ny - lo]:
            break
        lo, step = hi, step * 2
    else:
        return n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if x[nx - mid : nx - lo] == y[ny - mid : ny - lo]:
            lo = mid
        else:
            hi = mid
    return lo


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


def _matching(x: bytes, y: bytes, xr: tuple[int, int], yr: tuple[int, int], xa: Atoms, ya: Atoms,
              fine: bool) -> list[tuple[int, int, int]]:
    cx, ox = _chunks(x, *xr, xa, fine)
    cy, oy = _chunks(y, *yr, ya, fine)
    blocks: list[tuple[int, int, int]] = []
    sm = SequenceMatcher(None, cx, cy, autojunk=not fine)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        bx, ex, by, ey = ox[i1], ox[i2], oy[j1], oy[j2]
        if tag == "equal":
            blocks.append((bx, by, ex - bx))
        elif tag == "replace" and not fine and ex - bx <= REFINE_MAX_BYTES and ey - by <= REFINE_MAX_BYTES:
            blocks.extend(_matching(x, y, (bx, ex), (by, ey), xa, ya, fine=True))
    return blocks


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


def _atoms(ids: list[int], offsets: list[int], specials: frozenset[int]) -> Atoms:
    """Byte spans of the special tokens in ``ids``."""
    if specials.isdisjoint(ids):
        return _NO_ATOMS
    where = [k for k, t in enumerate(ids) if t in specials]
    return [offsets[k] for k in where], [offsets[k + 1] for k in where]


_SPECIAL_SETS: "weakref.WeakKeyDictionary[object, frozenset[int]]" = weakref.WeakKeyDictionary()


def _special_set(tok: Tokenizer) -> frozenset[int]:
    try:
        return _SPECIAL_SETS[tok]
    except (KeyError, TypeError):
        pass
    ids = special_ids(tok)
    try:
        _SPECIAL_SETS[tok] = ids
    except TypeError:
        pass
    return ids


def _align_middle(table: list[bytes], specials: frozenset[int], a: list[int], b: list[int]) -> list[Hunk]:
    """Hunks of ``a`` against ``b``, whose first tokens differ and whose ends are a common boundary."""
    ao = [0, *accumulate(map(len, map(table.__getitem__, a)))]
    bo = [0, *accumulate(map(len, map(table.__getitem__, b)))]
    xa, xb = b"".join(map(table.__getitem__, a)), b"".join(map(table.__getitem__, b))
    if xa == xb:
        blocks = [(0, 0, len(xa))]
    elif a and b:
        blocks = equal_byte_blocks(xa, xb, _atoms(a, ao, specials), _atoms(b, bo, specials))
    else:
        blocks = []
    b_index = {off: k for k, off in enumerate(bo)}
    anchors = [(0, 0)]
    for i, j, n in blocks:
        for k in range(bisect_left(ao, i), bisect_right(ao, i + n)):
            kb = b_index.get(ao[k] - i + j)
            if kb is not None and (k, kb) != anchors[-1]:
                anchors.append((k, kb))
    if anchors[-1] != (len(a), len(b)):
        anchors.append((len(a), len(b)))
    hunks = []
    for (a0, b0), (a1, b1) in zip(anchors, anchors[1:]):
        if a1 - a0 == 1 and b1 - b0 == 1 and a[a0] == b[b0]:
            continue
        ab0, ab1, bb0, bb1 = ao[a0], ao[a1], bo[b0], bo[b1]
        hunks.append(Hunk(a0, a1, b0, b1, ab0, ab1, bb0, bb1, xa[ab0:ab1] == xb[bb0:bb1]))
    return hunks


def align(tok: Tokenizer, a: Sequence[int], b: Sequence[int]) -> Alignment:
    """Align ``a`` (reference) and ``b`` (candidate); raises :class:`AlignError` on out-of-range IDs."""
    a, b = list(a), list(b)
    table, lengths = byte_table(tok)
    packed = []
    for what, ids in (("a", a), ("b", b)):
        try:
            raw = array("Q", ids).tobytes()  # negative IDs raise OverflowError here
        except (OverflowError, TypeError):
            check_ids(tok, ids, what)
            raise AlignError(f"{what}: IDs must be integers") from None
        if ids and max(ids) >= len(table):
            check_ids(tok, ids, what)
        packed.append(raw)
    if a == b:
        return Alignment(a, b, [], table)
    # common prefix/suffix in tokens, compared as packed 8-byte integers (memcmp)
    pa, pb = packed
    p = _common_prefix(pa, pb) // 8
    s = _common_suffix(pa, pb, 8 * (min(len(a), len(b)) - p)) // 8
    if p < 4096:  # bytes before the middle (equal on both sides)
        base = sum(map(len, map(table.__getitem__, a[:p])))
    else:
        base = int(lengths[np.frombuffer(pa, dtype=np.uint64, count=p)].sum())
    middle = _align_middle(table, _special_set(tok), a[p : len(a) - s], b[p : len(b) - s])
    for h in middle:
        h.a_start += p
        h.a_end += p
        h.b_start += p
        h.b_end += p
        h.a_byte_start += base
        h.a_byte_end += base
        h.b_byte_start += base
        h.b_byte_end += base
    return Alignment(a, b, middle, table)
