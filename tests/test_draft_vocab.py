"""The draft vocabulary: top-N supervised tokens, engine-format d2t/t2d, coverage."""
import pytest
import torch

from kimi_eagle.eagle3 import draft_vocab


def counts_of(rows, vocab=10):
    return draft_vocab.supervised_counts(rows, vocab)


def test_only_supervised_positions_are_counted():
    # token 9 fills the prompt but is never predicted
    rows = [([9, 9, 9, 3, 4, 4], [0, 0, 0, 1, 1, 1]), ([9, 9, 4, 5], [0, 0, 1, 1])]
    counts = counts_of(rows)
    assert counts.tolist() == [0, 0, 0, 1, 3, 1, 0, 0, 0, 0]
    v = draft_vocab.build(counts, 2)
    assert v.draft_to_target.tolist() == [3, 4]  # ties (3 and 5 once each): the lower id wins


def test_d2t_offsets_and_t2d_mask_use_the_engine_convention():
    counts = torch.tensor([0, 5, 0, 7, 1, 0, 0, 9, 0, 0])
    v = draft_vocab.build(counts, 3)
    assert v.draft_to_target.tolist() == [1, 3, 7]  # ascending target ids
    assert v.d2t.dtype == torch.int64 and v.d2t.tolist() == [1, 2, 5]
    assert (torch.arange(3) + v.d2t).tolist() == [1, 3, 7]  # target = draft + d2t[draft]
    assert v.t2d.dtype == torch.bool and torch.nonzero(v.t2d).flatten().tolist() == [1, 3, 7]
    assert v.coverage() == pytest.approx(21 / 22)
    again = draft_vocab.from_tensors(v.d2t, v.t2d)
    assert torch.equal(again.draft_to_target, v.draft_to_target)


def test_n_larger_than_distinct_tokens_fills_with_unseen_ids():
    counts = torch.tensor([0, 0, 4, 0, 2, 0])
    v = draft_vocab.build(counts, 5)
    assert v.size == 5 and v.draft_to_target.tolist() == [0, 1, 2, 3, 4]
    assert v.coverage() == 1.0
    assert v.report()["distinct_supervised_tokens"] == 2
    assert draft_vocab.build(counts, 6).size == 6
    with pytest.raises(ValueError):
        draft_vocab.build(counts, 7)


def test_coverage_counts_positions_not_types():
    counts = torch.tensor([0, 90, 5, 5])
    assert draft_vocab.build(counts, 1).coverage() == pytest.approx(0.9)
