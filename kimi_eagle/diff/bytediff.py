"""The equal byte blocks of two byte strings: a byte diff that knows nothing of tokens.

:func:`equal_byte_blocks` cuts off the common prefix and suffix, diffs the middle by word-sized
chunks and refines replaced chunk runs byte by byte. Its blocks are those ``difflib.SequenceMatcher``
finds (same longest-match contract and tie-breaking), computed with ``str.find``/``bytes.find`` at
C speed; difflib itself is only used where its autojunk heuristic applies. *Atoms* are byte spans
that are matched whole or not at all (the caller's markers, e.g. special tokens).
"""
from __future__ import annotations

import re
from bisect import bisect_left
from difflib import SequenceMatcher
from itertools import accumulate

# Word-sized chunks for the coarse byte diff: runs of word bytes, whitespace, or single others.
_CHUNK = re.compile(rb"[A-Za-z0-9_\x80-\xff]+|\s+|.", re.DOTALL)
REFINE_MAX_BYTES = 4_000  # replaced chunk runs up to this size (each side) are refined byte by byte
TINY_MIDDLE = 2  # after the common prefix and suffix, a side this short is not searched for matches

Block = tuple[int, int, int]  # (i, j, n): x[i:i+n] == y[j:j+n]
Atoms = tuple[list[int], list[int]]  # (starts, ends) of byte spans kept whole, sorted and disjoint
NO_ATOMS: Atoms = ([], [])


def common_prefix(x: bytes, y: bytes, i: int = 0, j: int = 0, limit: int | None = None) -> int:
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


def common_suffix(x: bytes, y: bytes, limit: int) -> int:
    """Length of the common suffix, at most ``limit`` (as :func:`common_prefix`, big-endian)."""
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


def _longest_match(sx: str | bytes, sy: str | bytes, alo: int, ahi: int, blo: int, bhi: int) -> Block:
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


def matching_blocks(sx: str | bytes, sy: str | bytes) -> list[Block]:
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
    merged: list[Block] = []
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
              fine: bool) -> list[Block]:
    """Equal byte blocks of ``x[xr]`` and ``y[yr]``: a diff of their chunks, replaced runs refined byte by byte.

    The blocks are those of ``difflib.SequenceMatcher`` (its autojunk heuristic on for the word-sized chunks,
    off for single bytes); without junk they are computed by :func:`matching_blocks` (C-speed searching).
    """
    (x0, x1), (y0, y1) = xr, yr
    if fine and not _has_atoms(xa, x0, x1) and not _has_atoms(ya, y0, y1):  # bytes are the chunks
        return [(x0 + i, y0 + j, k) for i, j, k in matching_blocks(x[x0:x1], y[y0:y1])]
    cx, ox = _chunks(x, x0, x1, xa, fine)
    cy, oy = _chunks(y, y0, y1, ya, fine)
    if not fine and len(cy) >= 200:  # difflib's autojunk may drop popular chunks: use difflib itself
        matches = SequenceMatcher(None, cx, cy, autojunk=True).get_matching_blocks()[:-1]
    else:
        matches = matching_blocks(*_as_text(cx, cy))
    blocks: list[Block] = []
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


def equal_byte_blocks(x: bytes, y: bytes, x_atoms: Atoms = NO_ATOMS, y_atoms: Atoms = NO_ATOMS) -> list[Block]:
    """Matching blocks ``(i, j, n)`` with ``x[i:i+n] == y[j:j+n]``, increasing in both.

    Common prefix and suffix first; the middle by word-sized chunks, with replaced chunk runs
    refined byte by byte when small enough. Atoms are never split: an atom is matched whole or
    not at all.
    """
    p = common_prefix(x, y)
    while (q := min(_snap(p, x_atoms, down=True), _snap(p, y_atoms, down=True))) != p:
        p = q
    s = common_suffix(x, y, min(len(x), len(y)) - p)
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
               ) -> list[Block] | None:
    """The one block when the shorter middle occurs whole inside the longer (a pure insertion around it).

    Found at C speed with ``bytes.find``; None when it does not occur or would cut an atom.
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
