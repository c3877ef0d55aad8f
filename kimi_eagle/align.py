"""Align two ID sequences of one tokenizer by the byte offsets of their tokens.

``a`` is the reference (the engine's IDs), ``b`` the candidate (the reconstruction). The result
is a list of :class:`Hunk` — maximal token runs that differ — each with its token and byte
ranges on both sides. Everything works on token bytes; nothing is decoded (many tokens are
partial UTF-8).

* Where the bytes agree, hunks are the runs between *common boundaries* — byte offsets at which
  both sequences have a token boundary — whose tokens differ (linear time, vectorised).
* Where the bytes differ, a byte-level diff finds the edits: common prefix and suffix are cut
  off, the middle is diffed by word-sized chunks (``difflib.SequenceMatcher``), and replaced
  chunk runs are refined byte by byte. The equal byte blocks it finds give the common
  boundaries; everything between two consecutive common boundaries whose tokens differ is a hunk.
"""
from __future__ import annotations

import re
import weakref
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Sequence

import numpy as np

from .tokenizer import Tokenizer

# Word-sized chunks for the coarse byte diff: runs of word bytes, whitespace, or single others.
_CHUNK = re.compile(rb"[A-Za-z0-9_\x80-\xff]+|\s+|.", re.DOTALL)
REFINE_MAX_BYTES = 4_000  # replaced chunk runs up to this size (each side) are refined byte by byte


class AlignError(ValueError):
    """The IDs cannot be aligned (e.g. an ID outside the tokenizer's vocabulary)."""


@dataclass(frozen=True)
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
    a_bytes: bytes
    b_bytes: bytes
    a_offsets: np.ndarray  # len(a) + 1 byte offsets: token i spans a_offsets[i]:a_offsets[i+1]
    b_offsets: np.ndarray
    hunks: list[Hunk]

    @property
    def exact(self) -> bool:
        return not self.hunks

    @property
    def same_bytes(self) -> bool:
        return self.a_bytes == self.b_bytes

    def a_run_bytes(self, h: Hunk) -> bytes:
        return self.a_bytes[h.a_byte_start : h.a_byte_end]

    def b_run_bytes(self, h: Hunk) -> bytes:
        return self.b_bytes[h.b_byte_start : h.b_byte_end]

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


_SPECIAL_ARRAYS: "weakref.WeakKeyDictionary[object, np.ndarray]" = weakref.WeakKeyDictionary()


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


def _bytes_and_offsets(tok: Tokenizer, ids: Sequence[int], what: str) -> tuple[bytes, np.ndarray, np.ndarray]:
    table, lengths = byte_table(tok)
    arr = np.asarray(ids, dtype=np.int64)
    if arr.size and (arr.min() < 0 or arr.max() >= len(table)):
        check_ids(tok, ids, what)
    offsets = np.zeros(arr.size + 1, dtype=np.int64)
    np.cumsum(lengths[arr], out=offsets[1:])
    return b"".join(map(table.__getitem__, ids)), offsets, arr


# --------------------------------------------------------------------------------------------
# byte diff


def _common_prefix(x: bytes, y: bytes) -> int:
    n = min(len(x), len(y))
    if n == 0:
        return 0
    ax = np.frombuffer(x, dtype=np.uint8, count=n)
    ay = np.frombuffer(y, dtype=np.uint8, count=n)
    diff = np.flatnonzero(ax != ay)
    return int(diff[0]) if diff.size else n


def _common_suffix(x: bytes, y: bytes, limit: int) -> int:
    n = min(len(x), len(y), limit)
    if n == 0:
        return 0
    ax = np.frombuffer(x, dtype=np.uint8)[len(x) - n :][::-1]
    ay = np.frombuffer(y, dtype=np.uint8)[len(y) - n :][::-1]
    diff = np.flatnonzero(ax != ay)
    return int(diff[0]) if diff.size else n


Atoms = tuple[np.ndarray, np.ndarray]  # (starts, ends) of byte spans kept whole (special tokens)
_NO_ATOMS: Atoms = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))


def _snap(pos: int, atoms: Atoms, down: bool) -> int:
    """Move ``pos`` out of any atom it falls strictly inside (to the atom's start or end)."""
    starts, ends = atoms
    k = int(np.searchsorted(starts, pos, side="left")) - 1
    if k >= 0 and starts[k] < pos < ends[k]:
        return int(starts[k] if down else ends[k])
    return pos


def _chunks(data: bytes, lo: int, hi: int, atoms: Atoms, fine: bool) -> tuple[list[bytes], np.ndarray]:
    """``data[lo:hi]`` as chunks (single bytes if ``fine``, else word-sized), atoms kept whole.

    Returns the chunks and their ``len + 1`` absolute byte offsets.
    """
    starts, ends = atoms
    k0, k1 = np.searchsorted(starts, lo, side="left"), np.searchsorted(starts, hi, side="left")
    out: list[bytes] = []
    pos = lo
    for s, e in zip(starts[k0:k1].tolist(), ends[k0:k1].tolist()):
        if e > hi:
            break
        gap = data[pos:s]
        out.extend([gap[i : i + 1] for i in range(len(gap))] if fine else _CHUNK.findall(gap))
        out.append(data[s:e])
        pos = e
    gap = data[pos:hi]
    out.extend([gap[i : i + 1] for i in range(len(gap))] if fine else _CHUNK.findall(gap))
    offsets = np.full(len(out) + 1, lo, dtype=np.int64)
    np.cumsum([len(c) for c in out], out=offsets[1:])
    offsets[1:] += lo
    return out, offsets


def _matching(x: bytes, y: bytes, xr: tuple[int, int], yr: tuple[int, int], xa: Atoms, ya: Atoms,
              fine: bool) -> list[tuple[int, int, int]]:
    cx, ox = _chunks(x, *xr, xa, fine)
    cy, oy = _chunks(y, *yr, ya, fine)
    blocks: list[tuple[int, int, int]] = []
    sm = SequenceMatcher(None, cx, cy, autojunk=not fine)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        bx, ex, by, ey = int(ox[i1]), int(ox[i2]), int(oy[j1]), int(oy[j2])
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
    p = min(_snap(p, x_atoms, down=True), _snap(p, y_atoms, down=True))
    s = _common_suffix(x, y, min(len(x), len(y)) - p)
    s = min(len(x) - _snap(len(x) - s, x_atoms, down=False), len(y) - _snap(len(y) - s, y_atoms, down=False))
    blocks = [(0, 0, p)] if p else []
    if p < len(x) - s and p < len(y) - s:
        blocks += _matching(x, y, (p, len(x) - s), (p, len(y) - s), x_atoms, y_atoms, fine=False)
    if s:
        blocks.append((len(x) - s, len(y) - s, s))
    return blocks


# --------------------------------------------------------------------------------------------
# alignment


def _anchors_in_block(a_off: np.ndarray, b_off: np.ndarray, i: int, j: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Token-boundary index pairs at the same place inside the equal block ``a[i:i+n] == b[j:j+n]``."""
    ai0, ai1 = np.searchsorted(a_off, i, side="left"), np.searchsorted(a_off, i + n, side="right")
    bj0, bj1 = np.searchsorted(b_off, j, side="left"), np.searchsorted(b_off, j + n, side="right")
    _, ia, ib = np.intersect1d(a_off[ai0:ai1] - i, b_off[bj0:bj1] - j, assume_unique=True, return_indices=True)
    return ia + ai0, ib + bj0


def _atoms(tok: Tokenizer, arr: np.ndarray, offsets: np.ndarray) -> Atoms:
    """Byte spans of the special tokens in ``arr``."""
    where = np.flatnonzero(np.isin(arr, _special_array(tok)))
    return offsets[where], offsets[where + 1]


def _special_array(tok: Tokenizer) -> np.ndarray:
    try:
        return _SPECIAL_ARRAYS[tok]
    except (KeyError, TypeError):
        pass
    arr = np.array(sorted(special_ids(tok)), dtype=np.int64)
    try:
        _SPECIAL_ARRAYS[tok] = arr
    except TypeError:
        pass
    return arr


def align(tok: Tokenizer, a: Sequence[int], b: Sequence[int]) -> Alignment:
    """Align ``a`` (reference) and ``b`` (candidate); raises :class:`AlignError` on out-of-range IDs."""
    a, b = list(a), list(b)
    a_bytes, a_off, a_arr = _bytes_and_offsets(tok, a, "a")
    b_bytes, b_off, b_arr = _bytes_and_offsets(tok, b, "b")
    if a == b:
        return Alignment(a, b, a_bytes, b_bytes, a_off, b_off, [])
    if a_bytes == b_bytes:
        blocks = [(0, 0, len(a_bytes))]
    else:
        blocks = equal_byte_blocks(a_bytes, b_bytes, _atoms(tok, a_arr, a_off), _atoms(tok, b_arr, b_off))
    ia_parts, ib_parts = [np.array([0])], [np.array([0])]
    for i, j, n in blocks:
        ia, ib = _anchors_in_block(a_off, b_off, i, j, n)
        ia_parts.append(ia)
        ib_parts.append(ib)
    ia_parts.append(np.array([len(a)]))
    ib_parts.append(np.array([len(b)]))
    ia, ib = np.concatenate(ia_parts), np.concatenate(ib_parts)
    # keep a strictly increasing chain (blocks are ordered; drop repeats at block joins)
    keep = np.ones(ia.size, dtype=bool)
    keep[1:] = (np.diff(ia) > 0) | (np.diff(ib) > 0)
    ia, ib = ia[keep], ib[keep]
    mono = np.concatenate([[True], (np.diff(ia) >= 0) & (np.diff(ib) >= 0)])
    if not mono.all():  # cannot happen with ordered blocks; guard anyway
        raise AlignError("internal: non-monotone anchors")
    da, db = np.diff(ia), np.diff(ib)
    same_token = np.zeros(da.size, dtype=bool)
    one = (da == 1) & (db == 1)
    same_token[one] = a_arr[ia[:-1][one]] == b_arr[ib[:-1][one]]
    hunks = []
    for k in np.flatnonzero(~same_token):
        a0, a1, b0, b1 = int(ia[k]), int(ia[k + 1]), int(ib[k]), int(ib[k + 1])
        ab0, ab1, bb0, bb1 = int(a_off[a0]), int(a_off[a1]), int(b_off[b0]), int(b_off[b1])
        hunks.append(Hunk(a0, a1, b0, b1, ab0, ab1, bb0, bb1, a_bytes[ab0:ab1] == b_bytes[bb0:bb1]))
    return Alignment(a, b, a_bytes, b_bytes, a_off, b_off, hunks)
