"""Speculative decoding against the real stories260K target: exactness at temperature 0, τ accounting."""
import json

import pytest
import torch

from kimi_eagle.apps.cli import main
from kimi_eagle.assets import stories_dir
from kimi_eagle.eagle3 import draft_vocab
from kimi_eagle.eagle3.hidden import load_target
from kimi_eagle.eagle3.model import Eagle3Drafter
from kimi_eagle.eagle3.speculative import (
    CachedTarget,
    DecodeOptions,
    EagleProposer,
    NgramProposer,
    Target,
    generate_target_only,
    probs_from_logits,
    speculative_generate,
)

torch.set_num_threads(1)
EOS = 2
GREEDY_40 = DecodeOptions(max_new_tokens=40, k=4, temperature=0.0, eos_id=EOS)


@pytest.fixture(scope="module")
def target():
    return load_target(stories_dir())


@pytest.fixture(scope="module")
def drafter(target):
    vocab = draft_vocab.build(torch.arange(512).flip(0), 300)
    return Eagle3Drafter.from_target(target, vocab, [1, 2, 3], seed=0).eval()


@pytest.fixture(scope="module")
def prompts(stories):
    return [[1] + stories.encode(t) for t in ("Once upon a time", "The little bird was")]


class Oracle:
    """Drafts from the target itself (q = p): every draft must be accepted, so τ = k + 1."""

    name = "oracle"

    def __init__(self, model):
        self.target = Target(model)

    def propose(self, ids, aux, k, temperature, generator):
        drafts, dists = [], []
        for _ in range(k):
            p = probs_from_logits(self.target(ids + drafts)[0][-1], temperature)
            d = int(torch.argmax(p)) if temperature <= 0 else int(torch.multinomial(p, 1, generator=generator))
            drafts.append(d)
            dists.append(p)
        return drafts, dists


def test_greedy_speculative_output_equals_target_only_greedy(target, drafter, prompts):
    for ids in prompts:
        want = generate_target_only(target, ids, 40, 0.0, EOS)
        eagle = speculative_generate(Target(target, [1, 2, 3]), EagleProposer(drafter), ids, GREEDY_40)
        ngram = speculative_generate(Target(target), NgramProposer(512), ids, GREEDY_40)
        assert eagle.tokens == want and ngram.tokens == want
        assert eagle.rounds > 0 and all(0 <= a <= 4 for a in eagle.accepted)


def test_kv_cached_verification_gives_target_only_greedy_output(target, drafter, prompts):
    """Rejections (an untrained drafter), full acceptance with bonus tokens (the oracle) and n-gram
    drafts: the cached verifier crops its cache correctly in each case."""
    for ids in prompts:
        want = generate_target_only(target, ids, 40, 0.0, EOS)
        for proposer, verifier in ((EagleProposer(drafter), CachedTarget(target, [1, 2, 3])), (Oracle(target), CachedTarget(target)),
                                   (NgramProposer(512), CachedTarget(target))):
            got = speculative_generate(verifier, proposer, ids, GREEDY_40)
            assert got.tokens == want, proposer.name
            committed = ids + got.tokens
            if got.tokens[-1] != EOS:  # the loop ended on the budget: the invariant holds
                assert verifier.cache.get_seq_length() == len(committed) - 1
            if verifier.aux is not None:  # the cached features are the full-sequence ones
                full_aux = Target(target, [1, 2, 3])(committed)[1]
                n = verifier.aux.shape[0]
                torch.testing.assert_close(verifier.aux, full_aux[:n], rtol=1e-4, atol=1e-5)


def test_kv_cached_and_uncached_verification_agree_when_sampling(target, drafter, prompts):
    """The uncached reference (whole sequence through target and drafter each round), the cached target
    alone and cached target + cached drafter draw the same tokens from the same generator."""
    for ids in prompts:
        results = []
        for verifier, cached_drafter in ((Target(target, [1, 2, 3]), False), (CachedTarget(target, [1, 2, 3]), False),
                                         (CachedTarget(target, [1, 2, 3]), True)):
            g = torch.Generator().manual_seed(5)
            results.append(speculative_generate(verifier, EagleProposer(drafter, cached=cached_drafter), ids, DecodeOptions(30, 3, 1.0, EOS), g))
        assert all(r.tokens == results[0].tokens and r.accepted == results[0].accepted for r in results[1:])


class CheckedEagle:
    """The cached EAGLE-3 proposer, checked every round against the uncached drafter on the same prefix and
    features; the drafts offered for verification are its own, or ``steer``'s (an oracle: every chain
    accepted, so whole chains are committed at once; n-gram: a mix), so the cache sees every kind of step."""

    name = "checked-eagle"

    def __init__(self, drafter, steer=None):
        self.cached, self.uncached, self.steer = EagleProposer(drafter), EagleProposer(drafter, cached=False), steer
        self.recomputed: list[int] = []  # step-0 positions computed per round

    def propose(self, ids, aux, k, temperature, generator):
        n = len(ids) - 1
        reused = self.cached.cache.reusable(aux[:n].float(), torch.tensor(ids[1:]))
        got = self.cached.propose(ids, aux, k, 0.0, None)
        want = self.uncached.propose(ids, aux, k, 0.0, None)
        assert got[0] == want[0]
        self.recomputed.append(n - reused)
        return self.steer.propose(ids, aux, k, temperature, generator) if self.steer else got


def test_cached_drafter_proposes_as_the_uncached_one_and_recomputes_only_new_positions(target, drafter, prompts):
    """Rejections (the untrained drafter's own drafts), full acceptance (oracle-steered) and n-gram drafts:
    greedy output equals target-only greedy, and after the prefill each round's drafter step 0 runs only
    over the positions committed since the last round (1 + accepted drafts)."""
    for ids in prompts:
        want = generate_target_only(target, ids, 40, 0.0, EOS)
        for steer in (None, Oracle(target), NgramProposer(512)):
            proposer = CheckedEagle(drafter, steer)
            got = speculative_generate(CachedTarget(target, [1, 2, 3]), proposer, ids, GREEDY_40)
            assert got.tokens == want, steer
            assert proposer.recomputed[0] == len(ids)  # the prompt plus the target's first token
            assert proposer.recomputed[1:] == [a + 1 for a in got.accepted[:len(proposer.recomputed) - 1]]
            if isinstance(steer, Oracle):
                assert got.accepted == got.proposed and max(got.accepted) == 4  # whole chains committed


def test_tau_counts_accepted_drafts_plus_the_target_token(target, prompts):
    for temperature in (0.0, 1.0):
        g = torch.Generator().manual_seed(3)
        r = speculative_generate(Target(target), Oracle(target), prompts[0], DecodeOptions(21, 4, temperature), g)
        # 1 prefill token + 4 rounds of (4 accepted + 1 bonus) = 21 tokens
        assert len(r.tokens) == 21 and r.accepted == [4, 4, 4, 4] and r.tau == 5.0


def test_sampled_decoding_stays_in_vocab_and_stops_at_eos(target, drafter, prompts):
    g = torch.Generator().manual_seed(0)
    r = speculative_generate(Target(target, [1, 2, 3]), EagleProposer(drafter), prompts[1], DecodeOptions(60, 4, 1.0, EOS), g)
    assert 0 < len(r.tokens) <= 60 and all(0 <= t < 512 for t in r.tokens)
    assert EOS not in r.tokens[:-1]
    assert r.tau == pytest.approx((sum(r.accepted) + r.rounds) / r.rounds)


def test_prompt_lookup_continues_the_latest_earlier_match():
    ngram = NgramProposer(512, max_n=3)
    drafts, _ = ngram.propose([5, 6, 7, 8, 9, 1, 5, 6, 7, 4, 5, 6, 7], None, 3, 0.0, None)
    assert drafts == [4, 5, 6]  # "5 6 7" last seen before the tail at position 6, followed by 4 5 6
    assert ngram.propose([5, 6, 7], None, 3, 0.0, None) == ([], [])


def test_cli_reports_tau_for_eagle_and_ngram(drafter, tmp_path, capsys):
    drafter.save(tmp_path / "draft")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "a", "prompt": "Once upon a time"}\n{"id": "b", "prompt_ids": [1, 365, 382]}\n')
    rc = main(["evaluate", "--target", str(stories_dir()), "--draft", str(tmp_path / "draft"), "--prompts", str(prompts),
               "--k", "3", "--max-new-tokens", "16", "-o", str(tmp_path / "report.json")])
    assert rc == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert set(report["methods"]) == {"eagle3", "ngram"} and report["k"] == 3
    for method in report["methods"].values():
        assert method["greedy"]["identical_to_target_greedy"] == "2/2"
        assert method["greedy"]["tau"] >= 1.0 and method["t=1"]["tokens"] > 0
    assert "tau=" in capsys.readouterr().out


def test_verification_keeps_the_target_distribution():
    """Accept-with-min(1, p/q), else resample from norm(max(p - q, 0)): tokens are distributed as p."""
    from kimi_eagle.eagle3.speculative import verify

    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    q = torch.tensor([0.1, 0.6, 0.1, 0.2])
    g = torch.Generator().manual_seed(0)
    n = 10_000
    counts = torch.zeros(4)
    accepted = 0
    for _ in range(n):
        d = int(torch.multinomial(q, 1, generator=g))
        token, ok = verify(p, q, d, g)
        counts[token] += 1
        accepted += ok
    assert torch.allclose(counts / n, p, atol=0.015)
    assert accepted / n == pytest.approx(float(torch.minimum(p, q).sum()), abs=0.015)  # 0.55
    # greedy: one-hot p and q
    onehot = lambda i: torch.nn.functional.one_hot(torch.tensor(i), 4).float()  # noqa: E731
    assert verify(onehot(2), onehot(2), 2) == (2, True)
    assert verify(onehot(2), onehot(1), 1) == (2, False)


def _report(eagle: tuple[float, float], ngram: tuple[float, float] | None) -> dict:
    def method(greedy, sampled):
        return {"greedy": {"tau": greedy, "identical_to_target_greedy": "8/8"}, "t=1": {"tau": sampled}}

    methods = {"eagle3": method(*eagle)} | ({"ngram": method(*ngram)} if ngram else {})
    return {"k": 4, "methods": methods}


def test_tau_table_has_a_row_per_drafter_and_one_for_the_ngram_baseline(tmp_path):
    from kimi_eagle.apps.reports.training_charts import plot_tau
    from kimi_eagle.eagle3.evaluate import tau_table

    table = tau_table({"engine IDs": _report((2.5, 1.9), (1.4, 1.1)), "recon IDs": _report((2.25, 1.75), None)})
    assert table == {
        "EAGLE-3 (engine IDs)": {"greedy": 2.5, "t=1": 1.9, "greedy identical": "8/8"},
        "n-gram (prompt lookup)": {"greedy": 1.4, "t=1": 1.1, "greedy identical": "8/8"},
        "EAGLE-3 (recon IDs)": {"greedy": 2.25, "t=1": 1.75, "greedy identical": "8/8"},
    }
    fig = plot_tau(table, title="τ", path=tmp_path / "tau.png")
    heights = [bar.get_height() for bar in fig.axes[0].patches]
    assert heights == [2.5, 1.9, 1.4, 1.1, 2.25, 1.75]  # rows in table order, modes in order within a row
    assert (tmp_path / "tau.png").read_bytes().startswith(b"\x89PNG")
