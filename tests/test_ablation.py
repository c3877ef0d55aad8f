"""The drafter ablation's parts: re-segmentation injection (same bytes, other IDs) and the bootstrap statistics."""
import numpy as np
import pytest

from kimi_eagle.apps.reports.training_charts import plot_arms, plot_dose_response
from kimi_eagle.eagle3.ablation import bootstrap_tau, first_significant_rate
from kimi_eagle.eagle3.hidden import Row
from kimi_eagle.eagle3.resegment import inject_rows, two_token_splits
from kimi_eagle.tokenize.tokenizer import ids_to_bytes


def test_every_split_spells_the_token_with_two_shorter_vocabulary_tokens(stories):
    splits = two_token_splits(stories)
    assert len(splits) > 100
    for token, (left, right) in splits.items():
        raw = stories.token_table[token]
        assert stories.token_table[left] + stories.token_table[right] == raw
        assert 0 < len(stories.token_table[left]) < len(raw) and not stories.is_special(left) and not stories.is_special(right)


@pytest.mark.parametrize("rate", [0.01, 0.05, 0.2])
def test_injection_keeps_the_bytes_and_splits_the_asked_share_of_completion_tokens(stories, rate):
    texts = ["Once upon a time there was a little girl named Lily.", "She liked to play with her big red ball outside.",
             "One day, the sun was shining and the birds were singing in the tall green trees."] * 8
    rows = [Row(str(i), [1] + stories.encode("Story:") + stories.encode(t), [0] * (1 + len(stories.encode("Story:"))) + [1] * len(stories.encode(t)))
            for i, t in enumerate(texts)]
    out, info = inject_rows(rows, stories, rate, seed=3)
    n_completion = sum(sum(r.loss_mask) for r in rows)
    assert info["split_tokens"] == round(rate * n_completion) and info["achieved_rate"] == pytest.approx(rate, abs=0.5 / n_completion)
    added = 0
    for before, after in zip(rows, out):
        assert ids_to_bytes(stories, after.input_ids) == ids_to_bytes(stories, before.input_ids)
        n_prompt = before.loss_mask.index(1)
        assert after.input_ids[:n_prompt] == before.input_ids[:n_prompt] and after.loss_mask == [0] * n_prompt + [1] * (len(after.input_ids) - n_prompt)
        added += len(after.input_ids) - len(before.input_ids)
    assert added == info["split_tokens"]  # each injected split adds exactly one token
    assert inject_rows(rows, stories, rate, seed=3)[0] == out  # seeded


def test_bootstrap_interval_and_paired_difference():
    rng = np.random.default_rng(0)
    rounds = rng.integers(8, 12, size=(3, 20))
    ref_acc = rng.binomial(rounds * 4, 0.3)
    same = bootstrap_tau(ref_acc, rounds, (ref_acc, rounds), n_boot=500)
    assert same["tau"] == pytest.approx((ref_acc.sum() + rounds.sum()) / rounds.sum())
    assert same["lo"] < same["tau"] < same["hi"]
    assert same["delta"] == same["delta_lo"] == same["delta_hi"] == 0.0 and not same["significant"]
    # one accepted draft more in every round: τ up by exactly 1, significant, and the paired interval is a point
    better = bootstrap_tau(ref_acc + rounds, rounds, (ref_acc, rounds), n_boot=500)
    assert better["delta"] == pytest.approx(1.0) and better["delta_lo"] == pytest.approx(1.0) and better["significant"]
    # small noise: the paired interval is far narrower than either arm's own interval
    noisy = bootstrap_tau(ref_acc + rng.integers(-1, 2, size=ref_acc.shape), rounds, (ref_acc, rounds), n_boot=500)
    assert noisy["delta_hi"] - noisy["delta_lo"] < (noisy["hi"] - noisy["lo"]) / 2


def test_first_significant_rate_and_charts(tmp_path):
    def row(rate, delta_hi, significant, mode="greedy"):
        return {"arm": f"recon + {rate}", "mode": mode, "tau": 2.0, "lo": 1.9, "hi": 2.1, "inject_rate": rate, "ids": "recon",
                "storage": "bf16", "delta": delta_hi - 0.05, "delta_lo": delta_hi - 0.1, "delta_hi": delta_hi, "significant": significant}
    table = [row(0.0, 0.05, False), row(0.01, 0.05, False), row(0.05, -0.01, True), row(0.2, -0.2, True), row(0.2, 0.1, False, "t=1")]
    assert first_significant_rate(table, "greedy") == 0.05 and first_significant_rate(table, "t=1") is None
    plot_arms(table, path=tmp_path / "arms.png")
    fig = plot_dose_response(table, path=tmp_path / "dose.png")
    assert (tmp_path / "arms.png").read_bytes()[:4] == b"\x89PNG" and len(fig.axes[0].lines) >= 2
