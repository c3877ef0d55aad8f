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


def test_dflash_arms_compare_with_their_own_engine_ids_arm_and_the_side_by_side_tables_read_the_table():
    from kimi_eagle.eagle3.ablation import DEFAULT_ARMS, AblationSettings, dflash_arms, drafter_tables

    both = DEFAULT_ARMS + dflash_arms()
    assert [a.name for a in dflash_arms()] == [f"DFlash · {a.name}" for a in DEFAULT_ARMS if a.storage == "bf16"]
    settings = AblationSettings(arms=both, k=7, block_size=5)
    by_name = {a.name: a for a in both}
    assert settings.reference_of(by_name["DFlash · recon + 5% splits"]) == "DFlash · engine IDs · bf16"
    assert settings.reference_of(by_name["recon + 5% splits"]) == "engine IDs · bf16"
    assert settings.k_of(by_name["DFlash · recon IDs · bf16"]) == 4 and settings.k_of(by_name["recon IDs · bf16"]) == 7

    def row(drafter, ids, rate, tau, delta, lo, hi, mode="greedy"):
        return {"drafter": drafter, "ids": ids, "inject_rate": rate, "mode": mode, "storage": "bf16", "k": 4, "tau": tau,
                "lo": tau - 0.1, "hi": tau + 0.1, "delta": delta, "delta_lo": lo, "delta_hi": hi, "significant": lo > 0 or hi < 0}
    table = [row("eagle3", "engine", 0.0, 2.0, 0.0, 0.0, 0.0), row("eagle3", "recon", 0.0, 1.9, -0.1, -0.2, 0.05),
             row("eagle3", "recon", 0.05, 1.7, -0.3, -0.4, -0.2), row("dflash", "engine", 0.0, 1.5, 0.0, 0.0, 0.0),
             row("dflash", "recon", 0.0, 1.6, 0.1, 0.0, 0.2), row("dflash", "recon", 0.05, 1.5, 0.0, -0.1, 0.1)]
    t = drafter_tables(table, modes=("greedy",))
    assert [(r["drafter"], r["tau"], r["ci95"], r["tau_over_eagle3"]) for r in t["tau"]] == [
        ("eagle3", 2.0, [1.9, 2.1], 1.0), ("dflash", 1.5, [1.4, 1.6], 0.75)]
    # one sign: engine − recon, so the interval is the table's (recon − engine) interval negated and swapped
    assert [(r["engine_minus_recon"], r["ci95"]) for r in t["engine_minus_recon"]] == [(0.1, [-0.05, 0.2]), (-0.1, [-0.2, 0.0])]
    assert t["first_significant_rate"] == {"eagle3 greedy": 0.05, "dflash greedy": None}
    assert first_significant_rate(table, "greedy", "dflash") is None and first_significant_rate(table, "greedy") == 0.05


def test_the_bootstrap_interval_equals_an_independent_loop_over_the_same_resamples():
    rng = np.random.default_rng(1)
    rounds = rng.integers(5, 9, size=(2, 7))
    acc = rng.binomial(rounds * 3, 0.4)
    got = bootstrap_tau(acc, rounds, n_boot=300, seed=4)
    draws = np.random.default_rng(4)
    seeds, prompts = draws.integers(0, 2, size=(300, 2)), draws.integers(0, 7, size=(300, 7))
    taus = []
    for b in range(300):
        a = sum(acc[s, p] for s in seeds[b] for p in prompts[b])
        r = sum(rounds[s, p] for s in seeds[b] for p in prompts[b])
        taus.append((a + r) / r)
    assert got["lo"] == pytest.approx(np.quantile(taus, 0.025)) and got["hi"] == pytest.approx(np.quantile(taus, 0.975))


def test_injection_with_an_id_filter_splits_only_kept_tokens_into_kept_halves(stories):
    """A row-mapped tiny-kimi injects only where the model has rows for the token and both halves (#36)."""
    splits = two_token_splits(stories)
    texts = ["Once upon a time there was a little girl named Lily.", "She liked to play with her big red ball outside."] * 6
    rows = [Row(str(i), [1] + stories.encode(t), [0] + [1] * len(stories.encode(t))) for i, t in enumerate(texts)]
    allowed = {i for i in range(len(stories.token_table)) if i % 3}  # a stand-in row map: every id not divisible by 3
    out, info = inject_rows(rows, stories, 0.2, seed=1, keep=allowed.__contains__)
    assert info["split_tokens"] > 0
    for before, after in zip(rows, out):
        assert ids_to_bytes(stories, after.input_ids) == ids_to_bytes(stories, before.input_ids)
        new = [t for t in after.input_ids if t not in before.input_ids]
        assert all(t in allowed for t in new)
    used = {t for r in rows for t in r.input_ids if t in splits}
    assert info["splittable_tokens"] == sum(1 for r in rows for t, m in zip(r.input_ids, r.loss_mask)
                                            if m and t in splits and t in allowed and set(splits[t]) <= allowed)
    assert used  # the rows do hold splittable tokens
