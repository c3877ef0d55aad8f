"""Align two ID sequences of one tokenizer by the byte offsets of their tokens.

``a`` is the reference (the engine's IDs), ``b`` the candidate (the reconstruction). The result
is a list of :class:`Hunk` — maximal token runs that differ — each with its token and byte
ranges on both sides, and one :class:`Side` per sequence (its IDs and the bytes they spell).
Everything works on token bytes; nothing is decoded (many tokens are partial UTF-8).

* Identical leading and trailing tokens are cut off first (IDs packed to bytes, memcmp, galloping); only the
  middle is aligned, so a local difference costs little however long the record is.
* Where the bytes agree, hunks are the runs between *common boundaries* — byte offsets at which
  both sequences have a token boundary — whose tokens differ (one linear merge).
* Where the bytes differ, the byte diff (:mod:`.bytediff`, special tokens as atoms) finds the equal
  byte blocks; they give the common boundaries, and everything between two consecutive common
  boundaries whose tokens differ is a hunk.
"""
from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate

import numpy as np

from kimi_eagle.diff.bytediff import NO_ATOMS, Atoms, Block, common_prefix, common_suffix, equal_byte_blocks
from kimi_eagle.tokenize.tokenizer import Tokenizer


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


class Side(Sequence[int]):
    """One side of an alignment: its token IDs, read like a list (``len``, indexing, slicing to a list,
    iteration, ``==`` a list), and the bytes they spell.

    :func:`align` hands each side its part of the differing middle — tokens ``first .. last`` spelling
    ``middle`` from byte ``base`` on, their offsets in ``middle`` and the positions of the special tokens
    among them — so the bytes of runs inside the middle are slices, not joins. Anything else is joined
    from the tokenizer's table when asked.
    """

    __slots__ = ("_ids", "_tok", "_first", "_last", "_base", "_middle", "_middle_offsets", "_middle_specials",
                 "_bytes", "_offsets")

    def __init__(self, tok: Tokenizer, ids: list[int], first: int = 0, base: int = 0, middle: bytes = b"",
                 middle_offsets: Sequence[int] = (0,), middle_specials: Sequence[int] = ()) -> None:
        self._ids = ids
        self._tok = tok
        self._first = first
        self._last = first + len(middle_offsets) - 1
        self._base = base
        self._middle = middle
        self._middle_offsets = middle_offsets
        self._middle_specials = middle_specials  # positions in the middle, sorted
        self._bytes: bytes | None = None
        self._offsets: list[int] | None = None

    # -- the IDs, as a read-only list

    def __len__(self) -> int:
        return len(self._ids)

    def __getitem__(self, index):  # an int gives an ID, a slice a new list of IDs
        return self._ids[index]

    def __iter__(self) -> Iterator[int]:
        return iter(self._ids)

    def __reversed__(self) -> Iterator[int]:
        return reversed(self._ids)

    def __contains__(self, token_id: object) -> bool:
        return token_id in self._ids

    def index(self, token_id: int, start: int = 0, stop: int | None = None) -> int:
        return self._ids.index(token_id, start, len(self._ids) if stop is None else stop)

    def count(self, token_id: int) -> int:
        return self._ids.count(token_id)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Side):
            return self._ids == other._ids
        if isinstance(other, list):
            return self._ids == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # compares by value, like the list it stands for

    def __repr__(self) -> str:
        return f"Side({self._ids!r})"

    # -- bytes

    @property
    def bytes(self) -> bytes:
        """The bytes of all the tokens (joined once, on first use)."""
        if self._bytes is None:
            self._bytes = b"".join(map(self._tok.token_table.__getitem__, self._ids))
        return self._bytes

    @property
    def offsets(self) -> list[int]:
        """``len(self) + 1`` byte offsets: token ``i`` spans ``offsets[i]:offsets[i+1]`` (built on first use)."""
        if self._offsets is None:
            self._offsets = list(accumulate(map(self._tok.token_length_list.__getitem__, self._ids), initial=0))
        return self._offsets

    def offset(self, k: int) -> int:
        """Byte offset of token ``k`` (``0 <= k <= len(self)``)."""
        if self._first <= k <= self._last:
            return self._base + self._middle_offsets[k - self._first]
        return self.offsets[k]

    def run_bytes(self, start: int, end: int) -> bytes:
        """The bytes of tokens ``start:end``."""
        if self._first <= start <= end <= self._last:
            mo, first = self._middle_offsets, self._first
            return self._middle[mo[start - first] : mo[end - first]]
        return b"".join(map(self._tok.token_table.__getitem__, self._ids[start:end]))

    def run_specials(self, start: int, end: int) -> list[int]:
        """The special-token IDs among tokens ``start:end``, sorted (a multiset)."""
        ids = self._ids
        if self._first <= start <= end <= self._last:
            pos, first = self._middle_specials, self._first
            return sorted([ids[first + k] for k in pos[bisect_left(pos, start - first) : bisect_left(pos, end - first)]])
        run = ids[start:end]
        specials = self._tok.special_ids
        if specials.isdisjoint(run):
            return []
        return sorted([t for t in specials.intersection(run) for _ in range(run.count(t))])

    def run_plain_bytes(self, start: int, end: int) -> bytes:
        """The bytes of tokens ``start:end`` without those of its special tokens."""
        if not self._first <= start <= end <= self._last:
            return b"".join(map(self._tok.plain_token_table.__getitem__, self._ids[start:end]))
        pos, first, mo, x = self._middle_specials, self._first, self._middle_offsets, self._middle
        lo, hi = bisect_left(pos, start - first), bisect_left(pos, end - first)
        pieces, last = [], mo[start - first]
        for k in pos[lo:hi]:
            pieces.append(x[last : mo[k]])
            last = mo[k + 1]
        pieces.append(x[last : mo[end - first]])
        return b"".join(pieces)

    def slice(self, start: int, end: int) -> bytes:
        """``self.bytes[start:end]``, joining only the tokens around the middle that the range needs."""
        got = _range_bytes(self._tok.token_table, self._ids, self._first, self._last, self._middle, self._base,
                           start, end)
        return self.bytes[start:end] if got is None else got


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


@dataclass
class Alignment:
    """``a`` (reference) against ``b`` (candidate): one :class:`Side` each and the hunks between them."""

    a: Side
    b: Side
    hunks: list[Hunk]

    @property
    def exact(self) -> bool:
        return not self.hunks

    @property
    def same_bytes(self) -> bool:
        return self.a.bytes == self.b.bytes

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


def check_ids(tok: Tokenizer, ids: Sequence[int], what: str = "ids") -> None:
    """Raise :class:`AlignError` naming the first ID outside ``0..n_vocab-1``."""
    n = tok.n_vocab
    for k, i in enumerate(ids):
        if not 0 <= i < n:
            raise AlignError(f"{what}[{k}] = {i} is outside the vocabulary 0..{n - 1} of {tok.name}")


# --------------------------------------------------------------------------------------------
# alignment


def _same_ids(pa: bytes, pb: bytes, i: int, j: int, limit: int) -> int:
    """How many IDs agree from ID ``i`` of ``pa`` and ``j`` of ``pb`` on (packed 8-byte IDs), at most ``limit``."""
    return common_prefix(pa, pb, 8 * i, 8 * j, 8 * limit) // 8


def _same_ids_back(pa: bytes, pb: bytes, limit: int) -> int:
    """How many trailing IDs of ``pa`` and ``pb`` agree, at most ``limit``."""
    return common_suffix(pa, pb, 8 * limit) // 8


def _special_positions(specials: frozenset[int], special_mask: np.ndarray, ids: list[int], packed: bytes) -> list[int]:
    """Sorted positions of the special tokens in ``ids`` (a numpy mask for long runs, ``list.index`` otherwise)."""
    if len(ids) >= 128:
        return np.flatnonzero(special_mask[np.frombuffer(packed, dtype=np.uint64)]).tolist()
    if specials.isdisjoint(ids):
        return []
    where = []
    for t in specials.intersection(ids):
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
        return NO_ATOMS
    return [offsets[k] for k in where], [offsets[k + 1] for k in where]


def _anchors(ao: list[int], bo: list[int], blocks: list[Block]) -> list[tuple[int, int]]:
    """Common boundaries ``(k, kb)`` inside the equal byte blocks, the ends included (plain method).

    Used when some token has no bytes (several tokens then share an offset).
    """
    b_index = {off: k for k, off in enumerate(bo)}
    anchors = [(0, 0)]
    for i, j, n in blocks:
        for k in range(bisect_left(ao, i), bisect_right(ao, i + n)):
            kb = b_index.get(ao[k] - i + j)
            last_k, last_kb = anchors[-1]
            if kb is not None and k >= last_k and kb >= last_kb and (k, kb) != (last_k, last_kb):  # monotone only
                anchors.append((k, kb))
    if anchors[-1] != (len(ao) - 1, len(bo) - 1):
        anchors.append((len(ao) - 1, len(bo) - 1))
    return anchors


def _offsets(length_list: list[int], lengths: np.ndarray, ids: list[int], packed: bytes) -> list[int]:
    """``len(ids) + 1`` byte offsets of the tokens (numpy for long runs, where its fixed cost pays)."""
    if len(ids) < 256:
        return list(accumulate(map(length_list.__getitem__, ids), initial=0))
    out = np.cumsum(lengths[np.frombuffer(packed, dtype=np.uint64)]).tolist()
    out.insert(0, 0)
    return out


def _align_middle(tok: Tokenizer, a: list[int], b: list[int], pa: bytes, pb: bytes, p: int, base: int
                  ) -> tuple[list[Hunk], tuple[bytes, list[int], list[int]], tuple[bytes, list[int], list[int]]]:
    """Hunks of the middles ``a`` against ``b`` (IDs ``p..`` of the sequences, bytes ``base..``).

    Their first tokens differ and their ends are a common boundary; ``pa``/``pb`` are the middles packed.
    Common boundaries are found by merging the byte offsets inside each equal byte block; a run of
    identical tokens after a common boundary is skipped whole (memcmp), so the Python work is in the hunks.
    Also returns each middle's ``(bytes, token offsets, special-token positions)``.
    """
    table, length_list, lengths = tok.token_table, tok.token_length_list, tok.token_lengths
    specials, special_mask = tok.special_ids, tok.special_mask
    ao, bo = _offsets(length_list, lengths, a, pa), _offsets(length_list, lengths, b, pb)
    xa, xb = b"".join(map(table.__getitem__, a)), b"".join(map(table.__getitem__, b))
    sa, sb = _special_positions(specials, special_mask, a, pa), _special_positions(specials, special_mask, b, pb)
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

    if tok.has_empty_token:
        anchors = _anchors(ao, bo, blocks)
        for (a0, b0), (a1, b1) in zip(anchors, anchors[1:]):
            emit(a0, b0, a1, b1)
        return hunks, (xa, ao, sa), (xb, bo, sb)
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
    return hunks, (xa, ao, sa), (xb, bo, sb)


def align(tok: Tokenizer, a: Sequence[int], b: Sequence[int]) -> Alignment:
    """Align ``a`` (reference) and ``b`` (candidate); raises :class:`AlignError` on out-of-range IDs."""
    a, b = list(a), list(b)
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
    n_vocab = len(tok.token_table)
    if a and (max(a) if na < 256 else int(np.frombuffer(pa, dtype=np.uint64).max())) >= n_vocab:
        check_ids(tok, a, "a")
    if a == b:
        return Alignment(Side(tok, a), Side(tok, b), [])
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
        base = sum(map(tok.token_length_list.__getitem__, a[:p]))
    else:
        base = int(tok.token_lengths[np.frombuffer(pa, dtype=np.uint64, count=p)].sum())
    bm = b[p : nb - s]
    if bm and max(bm) >= n_vocab:  # b's other IDs are a's
        check_ids(tok, b, "b")
    hunks, (xa, ao, sa), (xb, bo, sb) = _align_middle(tok, a[p : na - s], bm, pa[8 * p : 8 * (na - s)],
                                                      pb[8 * p : 8 * (nb - s)], p, base)
    return Alignment(Side(tok, a, p, base, xa, ao, sa), Side(tok, b, p, base, xb, bo, sb), hunks)
