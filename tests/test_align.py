"""Byte-offset alignment of two ID sequences of the real Kimi tokenizer."""
from __future__ import annotations

import random

import pytest
from helpers import split_token
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kimi_eagle.diff.align import AlignError, align
from kimi_eagle.diff.bytediff import equal_byte_blocks
from kimi_eagle.tokenize.tokenizer import DerivedTables, SpecialToken, ids_to_bytes

TEXT = ("The quick brown fox jumps over the lazy dog. 世界你好！Ünïcödé — emoji 🦊 and tabs\tand\n\nnewlines; "
        'JSON {"city": "Paris", "unit": "celsius"} and code `for i in range(10): print(i)`.')


def check_invariants(tok, al):
    """Hunks are ordered and disjoint, and outside them both sequences agree token for token."""
    a, b = al.a, al.b
    ia = ib = 0
    for h in al.hunks:
        assert h.a_start >= ia and h.b_start >= ib
        assert a[ia : h.a_start] == b[ib : h.b_start], "tokens between hunks must be identical"
        assert a.run_bytes(h.a_start, h.a_end) == ids_to_bytes(tok, a[h.a_start : h.a_end])
        assert b.run_bytes(h.b_start, h.b_end) == ids_to_bytes(tok, b[h.b_start : h.b_end])
        assert h.same_bytes == (a.run_bytes(h.a_start, h.a_end) == b.run_bytes(h.b_start, h.b_end))
        assert a[h.a_start : h.a_end] != b[h.b_start : h.b_end]
        ia, ib = h.a_end, h.b_end
    assert a[ia:] == b[ib:]


def test_identical_sequences_have_no_hunks(kimi):
    ids = kimi.encode(TEXT)
    al = align(kimi, ids, list(ids))
    assert al.exact and al.hunks == []
    assert al.a.bytes == TEXT.encode()
    assert (al.a.offsets[0], al.a.offsets[-1], len(al.a.offsets)) == (0, len(TEXT.encode()), len(ids) + 1)


def test_a_token_split_in_two_is_one_same_bytes_hunk(kimi):
    ids = kimi.encode(TEXT)
    index = next(i for i, t in enumerate(ids) if len(kimi.token_bytes(t)) >= 4)
    split = split_token(kimi, ids, index)
    al = align(kimi, split, ids)
    assert len(al.hunks) == 1
    h = al.hunks[0]
    assert (h.a_start, h.a_end, h.b_start, h.b_end) == (index, index + 2, index, index + 1)
    assert h.same_bytes and h.token_delta == -1
    start = len(ids_to_bytes(kimi, ids[:index]))
    assert (h.a_byte_start, h.a_byte_end) == (start, start + len(kimi.token_bytes(ids[index])))
    check_invariants(kimi, al)


def test_partial_utf8_tokens_align_by_bytes(kimi):
    ids = kimi.encode("世界")
    byte_ids = [kimi.encoding.encode_single_token(bytes([c])) for c in "世界".encode()]
    al = align(kimi, byte_ids, ids)
    assert len(al.hunks) == 1 and al.hunks[0].same_bytes
    assert (al.hunks[0].a_end - al.hunks[0].a_start, al.hunks[0].b_end - al.hunks[0].b_start) == (6, len(ids))


def test_a_changed_word_is_a_small_hunk(kimi):
    a = kimi.encode(TEXT)
    b = kimi.encode(TEXT.replace("lazy", "sleepy"))
    al = align(kimi, a, b)
    assert len(al.hunks) == 1
    h = al.hunks[0]
    assert not h.same_bytes
    assert al.a.run_bytes(h.a_start, h.a_end).strip() == b"lazy" and al.b.run_bytes(h.b_start, h.b_end).strip() == b"sleepy"
    check_invariants(kimi, al)


def test_a_missing_tail_is_a_hunk_at_the_end(kimi):
    a = kimi.encode(TEXT)
    al = align(kimi, a, a[:-7])
    assert len(al.hunks) == 1
    h = al.hunks[0]
    assert (h.a_start, h.a_end, h.b_start, h.b_end) == (len(a) - 7, len(a), len(a) - 7, len(a) - 7)


def test_several_edits_make_several_hunks(kimi):
    a = kimi.encode(TEXT)
    b = kimi.encode(TEXT.replace("quick", "slow").replace("Paris", "Rome").replace("\n\n", "\n"))
    al = align(kimi, a, b)
    assert len(al.hunks) == 3
    check_invariants(kimi, al)


def test_empty_sequences(kimi):
    assert align(kimi, [], []).exact
    al = align(kimi, [], kimi.encode("hi"))
    assert len(al.hunks) == 1 and al.hunks[0].a_end == 0 and al.hunks[0].b_end == 1


def test_out_of_range_ids_are_a_clear_error(kimi):
    with pytest.raises(AlignError, match=r"a\[1\] = 163840 is outside the vocabulary 0..163839"):
        align(kimi, [1, kimi.n_vocab], [1])
    with pytest.raises(AlignError, match=r"b\[0\] = -3"):
        align(kimi, [1], [-3])


def test_b_to_a_byte_maps_across_hunks(kimi):
    a = kimi.encode("alpha beta gamma delta")
    b = kimi.encode("alpha BETA-BETA gamma delta")
    al = align(kimi, a, b)
    gamma_b = al.b.bytes.index(b"gamma")
    assert al.a.bytes[al.b_to_a_byte(gamma_b):].startswith(b"gamma")
    assert al.b_to_a_byte(0) == 0
    assert al.b_to_a_byte(len(al.b.bytes), "end") == len(al.a.bytes)


def test_equal_byte_blocks_cover_the_common_bytes():
    x, y = b"one two three four five", b"one 2 three four fiver"
    blocks = equal_byte_blocks(x, y)
    assert sum(n for _, _, n in blocks) == len(b"one  three four five")
    for i, j, n in blocks:
        assert x[i : i + n] == y[j : j + n]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10**6), n_splits=st.integers(0, 4), n_edits=st.integers(0, 3))
def test_random_splits_and_edits_keep_the_invariants(kimi, seed, n_splits, n_edits):
    rng = random.Random(seed)
    words = TEXT.split(" ")
    text_b = " ".join(w if rng.random() > n_edits / 10 else w[::-1] + "x" for w in words)
    a, b = kimi.encode(" ".join(words)), kimi.encode(text_b)
    for _ in range(n_splits):
        a = split_token(kimi, a, rng.randrange(len(a))) or a
    al = align(kimi, a, b)
    check_invariants(kimi, al)
    if al.a.bytes == al.b.bytes:
        assert all(h.same_bytes for h in al.hunks)


@settings(max_examples=300, deadline=None)
@given(x=st.binary(max_size=80), tail_x=st.binary(max_size=12), tail_y=st.binary(max_size=12), limit=st.integers(0, 120))
def test_common_prefix_and_suffix_helpers_agree_with_a_plain_scan(x, tail_x, tail_y, limit):
    from kimi_eagle.diff.bytediff import common_prefix, common_suffix

    a, b = x + tail_x, x + tail_y
    n = min(len(a), len(b))
    assert common_prefix(a, b) == next((i for i in range(n) if a[i] != b[i]), n)
    a, b = tail_x + x, tail_y + x
    n = min(len(a), len(b))
    assert common_suffix(a, b, limit) == min(limit, next((i for i in range(n) if a[-1 - i] != b[-1 - i]), n))


def test_alignment_works_for_an_hf_byte_level_tokenizer(qwen3):
    from kimi_eagle.diff.classify import classify

    text = "Tokenizer-agnostic: 世界 and spaces  here."
    ids = qwen3.encode(text)
    raw = qwen3.token_bytes(ids[0])
    vocab = {qwen3.token_bytes(i): i for i in range(qwen3.n_ranks)}
    cut = next(c for c in range(1, len(raw)) if raw[:c] in vocab and raw[c:] in vocab)
    split = [vocab[raw[:cut]], vocab[raw[cut:]]] + ids[1:]
    assert classify(qwen3, split, ids).verdict == "bpe_split"
    assert classify(qwen3, ids, qwen3.encode(text.replace("here", "there"))).label == "other"


@settings(max_examples=400, deadline=None)
@given(x=st.binary(max_size=40), edits=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 4), st.binary(max_size=5)), max_size=4),
       alphabet=st.sampled_from([b"ab", b"ab \n\"", b"abcdefgh {}:,\""]))
def test_matching_blocks_are_difflibs(x, edits, alphabet):
    """The C-speed block search gives exactly difflib's matching blocks (no junk), ties included."""
    from difflib import SequenceMatcher

    from kimi_eagle.diff.bytediff import matching_blocks

    x = bytes(alphabet[c % len(alphabet)] for c in x)  # a small alphabet makes ties and repeats common
    y = bytearray(x)
    for pos, cut, ins in edits:
        pos = min(pos, len(y))
        y[pos : pos + cut] = bytes(alphabet[c % len(alphabet)] for c in ins)
    y = bytes(y)
    want = [tuple(m) for m in SequenceMatcher(None, x, y, autojunk=False).get_matching_blocks()[:-1]]
    assert matching_blocks(x, y) == want
    assert matching_blocks(x.decode("latin-1"), y.decode("latin-1")) == want


@settings(max_examples=300, deadline=None)
@given(same=st.lists(st.integers(0, 2**40), max_size=300), tail_x=st.lists(st.integers(0, 2**40), max_size=5),
       tail_y=st.lists(st.integers(0, 2**40), max_size=5), limit=st.integers(0, 320))
def test_same_ids_helpers_agree_with_a_plain_scan(same, tail_x, tail_y, limit):
    """Runs of equal packed IDs, forwards and backwards (windows, memcmp and the XOR's lowest bit)."""
    from array import array

    from kimi_eagle.diff.align import _same_ids, _same_ids_back

    def pack(ids):
        return array("Q", ids).tobytes()

    a, b = same + tail_x, same + tail_y
    n = min(len(a), len(b), limit)
    assert _same_ids(pack(a), pack(b), 0, 0, n) == next((i for i in range(n) if a[i] != b[i]), n)
    assert _same_ids(pack([7] + a), pack(b), 1, 0, n) == next((i for i in range(n) if a[i] != b[i]), n)
    a, b = tail_x + same, tail_y + same
    n = min(len(a), len(b), limit)
    assert _same_ids_back(pack(a), pack(b), n) == next((i for i in range(n) if a[-1 - i] != b[-1 - i]), n)


def test_out_of_range_errors_name_a_before_b(kimi):
    with pytest.raises(AlignError, match=r"^a\[0\] = 163840"):
        align(kimi, [kimi.n_vocab], [-1])
    with pytest.raises(AlignError, match=r"^b\[1\] = 163841"):
        align(kimi, list(range(40)), [0, kimi.n_vocab + 1] + list(range(40)))


def test_byte_slices_and_hunk_bytes_agree_with_the_joined_sequences(kimi):
    """Hunk bytes and byte ranges are served from the aligned middle; they must read like the full joins."""
    a = kimi.encode(TEXT)
    b = kimi.encode(TEXT.replace("lazy", "sleepy").replace("Paris", "Rome"))
    al = align(kimi, a, b)
    full_a, full_b = ids_to_bytes(kimi, a), ids_to_bytes(kimi, b)
    for start in range(0, len(full_a) + 3, 7):
        for end in range(start, len(full_a) + 9, 5):
            assert al.a.slice(start, end) == full_a[start:end]
            assert al.b.slice(start, end) == full_b[start:end]
    assert al.a.slice(5, 2) == full_a[5:2] and al.a.slice(-4, len(full_a)) == full_a[-4:]
    for h in al.hunks:
        assert al.a.run_bytes(h.a_start, h.a_end) == full_a[h.a_byte_start : h.a_byte_end]
        assert al.b.run_bytes(h.b_start, h.b_end) == full_b[h.b_byte_start : h.b_byte_end]


def test_each_side_reads_like_its_id_list(kimi):
    a = kimi.encode(TEXT)
    b = kimi.encode(TEXT.replace("lazy", "sleepy"))
    al = align(kimi, a, b)
    assert len(al.a) == len(a) and al.a[3] == a[3] and al.a[2:9] == a[2:9] and list(al.a) == a
    assert al.a == a and al.b == b and al.a != b and al.a == align(kimi, a, a).a
    assert a[5] in al.a and al.a.index(a[5]) == a.index(a[5]) and al.a.count(a[5]) == a.count(a[5])


def test_each_side_serves_the_bytes_specials_and_offsets_of_any_run(kimi):
    """Inside the aligned middle these are slices of what align built; outside they are joined: both read alike."""
    end, think = kimi.encode("<|im_end|>", allow_special=True), kimi.encode("</think>", allow_special=True)
    a = kimi.encode("Reasoning here.") + think + kimi.encode(TEXT) + end + kimi.encode("tail") + end
    b = kimi.encode("Reasoning here.") + kimi.encode(TEXT.replace("lazy", "sleepy")) + end + kimi.encode("tail")
    al = align(kimi, a, b)
    for side, ids in ((al.a, a), (al.b, b)):
        full = ids_to_bytes(kimi, ids)
        offsets = [len(ids_to_bytes(kimi, ids[:k])) for k in range(len(ids) + 1)]
        assert side.bytes == full and side.offsets == offsets
        for start in range(len(ids) + 1):
            assert side.offset(start) == offsets[start]
            for end in range(start, len(ids) + 1, 3):
                run = ids[start:end]
                assert side.run_bytes(start, end) == full[offsets[start] : offsets[end]]
                assert side.run_specials(start, end) == sorted(t for t in run if kimi.is_special(t))
                assert side.run_plain_bytes(start, end) == b"".join(
                    kimi.token_bytes(t) for t in run if not kimi.is_special(t))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(a=st.lists(st.sampled_from([15, 16, 17, 1000, 163586]), max_size=40),
       b=st.lists(st.sampled_from([15, 16, 17, 1000, 163586]), max_size=40))
def test_repetitive_id_lists_keep_the_invariants(kimi, a, b):
    """Shared prefixes and suffixes that overlap (repeated tokens), special tokens, empty sides."""
    al = align(kimi, a, b)
    check_invariants(kimi, al)
    assert al.exact == (a == b)
    if al.hunks:
        first, last = al.hunks[0], al.hunks[-1]
        assert a[: first.a_start] == b[: first.b_start] and first.a_start == first.b_start
        assert len(a) - last.a_end == len(b) - last.b_end


class _TinyTokenizer(DerivedTables):
    """A complete little vocabulary with a special token and a token of no bytes (no real one has that)."""

    name = "tiny"
    VOCAB = [b"a", b"b", b"ab", b"ba", b"aa", b"<s>", b" ", b"a b", b""]

    def __init__(self):
        self.n_vocab = len(self.VOCAB)
        self.special_tokens = [SpecialToken(5, "<s>", True)]

    def token_bytes(self, i):
        return self.VOCAB[i]


@settings(max_examples=300, deadline=None)
@given(a=st.lists(st.integers(0, 8), max_size=14), edits=st.lists(st.tuples(st.integers(0, 14), st.integers(0, 2),
       st.lists(st.integers(0, 8), max_size=2)), max_size=3))
def test_a_vocabulary_with_an_empty_token_keeps_the_invariants(a, edits):
    tok = _TinyTokenizer()
    b = list(a)
    for pos, cut, ins in edits:
        b[pos : pos + cut] = ins
    al = align(tok, a, b)
    check_invariants(tok, al)
    assert al.exact == (a == b)
