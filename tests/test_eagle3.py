"""The EAGLE-3 drafter: architecture, the fused attention input, and train/inference consistency."""
import pytest
import torch

from kimi_eagle.assets import stories_dir
from kimi_eagle.eagle3 import draft_vocab
from kimi_eagle.eagle3.hidden import Extractor, load_target
from kimi_eagle.eagle3.model import Eagle3Drafter

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def target():
    return load_target(stories_dir())


@pytest.fixture(scope="module")
def drafter(target):
    counts = torch.arange(512).flip(0)  # any frequencies: keeps the 100 lowest ids
    return Eagle3Drafter.from_target(target, draft_vocab.build(counts, 100), [1, 2, 3], seed=3)


@pytest.fixture(scope="module")
def features(target):
    """The real target's aux states over a real sentence."""
    ids = [1, 403, 407, 261, 378, 275, 263, 380, 31, 315, 386, 338, 290, 429, 270, 263]
    ex = Extractor(target, [1, 2, 3])
    aux, _ = ex(torch.tensor([ids]))
    ex.close()
    return torch.tensor(ids), aux[0].clone()


def test_architecture_matches_the_eagle3_checkpoint_layout(drafter, target):
    shapes = {k: tuple(v.shape) for k, v in drafter.state_dict().items()}
    assert shapes == {
        "embed_tokens.weight": (512, 64),
        "fc.weight": (64, 192),  # 3H -> H, no bias
        "midlayer.input_layernorm.weight": (64,), "midlayer.hidden_norm.weight": (64,),
        "midlayer.self_attn.q_proj.weight": (64, 128), "midlayer.self_attn.k_proj.weight": (32, 128),
        "midlayer.self_attn.v_proj.weight": (32, 128), "midlayer.self_attn.o_proj.weight": (64, 64),
        "midlayer.post_attention_layernorm.weight": (64,),
        "midlayer.mlp.gate_proj.weight": (172, 64), "midlayer.mlp.up_proj.weight": (172, 64),
        "midlayer.mlp.down_proj.weight": (64, 172),
        "norm.weight": (64,), "lm_head.weight": (100, 64), "d2t": (100,), "t2d": (512,),
    }
    assert torch.equal(drafter.embed_tokens.weight, target.model.embed_tokens.weight)
    assert not drafter.embed_tokens.weight.requires_grad
    assert torch.equal(drafter.lm_head.weight, target.lm_head.weight[:100])  # the draft vocab's target rows
    assert drafter.fc.bias is None


def test_attention_reads_normed_embedding_and_normed_hidden_with_hidden_as_residual(drafter, features):
    ids, aux = features
    seen = {}
    hook = drafter.midlayer.self_attn.q_proj.register_forward_pre_hook(lambda m, a: seen.setdefault("x", a[0]))
    hidden = drafter.fc(aux[None])
    tokens = ids[1:][None]
    out, _, _ = drafter.step(hidden[:, :-1], tokens, torch.arange(len(ids) - 1))
    hook.remove()
    m = drafter.midlayer
    expected = torch.cat([m.input_layernorm(drafter.embed_tokens(tokens)), m.hidden_norm(hidden[:, :-1])], -1)
    assert torch.equal(seen["x"], expected)
    # the residual stream is the (un-normed) hidden input
    with torch.no_grad():
        attn, _ = m.self_attn(expected, torch.arange(len(ids) - 1), [], None)
        h = hidden[:, :-1] + attn
        want = h + m.mlp(m.post_attention_layernorm(h))
    assert torch.allclose(out, want, atol=1e-6)


def test_unroll_step_k_at_t_sees_nothing_after_its_inputs(drafter, features):
    """Step k at position t consumes aux[<=t] and tokens x[<=t+1+k] only (it predicts x[t+2+k])."""
    ids, aux = features
    base = drafter.unroll(aux[None], ids[None], 3)
    t = 6
    for k in range(3):
        ids2, aux2 = ids.clone(), aux.clone()
        ids2[t + 2 + k:] = 5
        aux2[t + 1:] = 0.0
        other = drafter.unroll(aux2[None], ids2[None], 3)
        assert torch.allclose(other[k][0, : t + 1], base[k][0, : t + 1], atol=1e-6)
        assert not torch.allclose(other[k][0, t + 1 :], base[k][0, t + 1 :])


def test_chain_drafting_computes_what_training_unrolls(drafter, features):
    """Inference (step 0 over the prefix, then a chain on its own drafts) equals the TTT unroll at the
    last position when the unroll is fed the drafts as tokens."""
    ids, aux = features
    n = 9  # committed x[0..n]; features at 0..n-1
    drafts, dists = drafter.propose(aux[:n], ids[1 : n + 1], 4)
    assert len(drafts) == 4 and all(float(q[d]) == 1.0 for d, q in zip(drafts, dists))
    seq = torch.cat([ids[: n + 1], torch.tensor(drafts[:3])])
    aux_padded = torch.cat([aux[:n], torch.randn(4, aux.shape[1])])
    logits = drafter.unroll(aux_padded[None], seq[None], 4)
    assert [int(drafter.draft_to_target[int(lg[0, n - 1].argmax())]) for lg in logits] == drafts
    # the training-time test in the same setting gives the same numbers
    hidden, lg0, kv0 = drafter.step(drafter.fc(aux[:n][None]), ids[1 : n + 1][None], torch.arange(n))
    assert torch.allclose(lg0[0, -1], logits[0][0, n - 1], atol=1e-5)
    _, lg1, _ = drafter.step(hidden[:, -1:], torch.tensor([[drafts[0]]]), torch.tensor([n]), [kv0], torch.tensor([n - 1]))
    assert torch.allclose(lg1[0, -1], logits[1][0, n - 1], atol=1e-5)


def test_cached_step0_keys_give_the_uncached_proposals(drafter, features):
    """A DraftCache reuses step-0 keys/values for the longest prefix whose inputs (features and tokens)
    are unchanged and recomputes only the rest: a growing sequence (by 1 or by a whole accepted chain), a
    rollback to a shorter prefix and a changed feature row all give the uncached drafter's proposals."""
    from kimi_eagle.eagle3.model import DraftCache

    ids, aux = features
    aux_changed = aux.clone()
    aux_changed[4] += 0.5  # e.g. another prompt that shares the first 4 positions
    cache = DraftCache()
    # (features, n committed positions, positions the cache may reuse)
    calls = [(aux, 2, 0), (aux, 3, 2), (aux, 8, 3), (aux, 9, 8), (aux, 14, 9), (aux, 14, 13), (aux, 6, 5),
             (aux, 10, 6), (aux_changed, 12, 4)]
    for feats, n, reusable in calls:
        assert cache.reusable(feats[:n], ids[1 : n + 1]) == reusable
        for temperature in (0.0, 1.0):
            got = drafter.propose(feats[:n], ids[1 : n + 1], 4, temperature, torch.Generator().manual_seed(n), cache=cache)
            want = drafter.propose(feats[:n], ids[1 : n + 1], 4, temperature, torch.Generator().manual_seed(n))
            assert got[0] == want[0], (n, temperature)
            for q_got, q_want in zip(got[1], want[1]):
                torch.testing.assert_close(q_got, q_want, rtol=1e-5, atol=1e-6)
        assert len(cache) == n and cache.k.shape[2] == n


def test_sampled_proposals_live_in_the_draft_vocab(drafter, features):
    ids, aux = features
    g = torch.Generator().manual_seed(0)
    drafts, dists = drafter.propose(aux[:9], ids[1:10], 3, temperature=1.0, generator=g)
    for d, q in zip(drafts, dists):
        assert d < 100 and float(q.sum()) == pytest.approx(1.0) and float(q[100:].sum()) == 0.0


def test_attention_matches_a_naive_reference(drafter):
    """Step 0 is causal attention; at step k a query at t sees step-0 keys <= t plus its own position's
    keys of steps 1..k (checked against a per-position loop with explicit key lists)."""
    import torch.nn.functional as F

    attn = drafter.midlayer.self_attn
    g = torch.Generator().manual_seed(0)
    b, t = 2, 7
    xs = [torch.randn(b, t, 128, generator=g) for _ in range(3)]
    pos = torch.arange(t)
    with torch.no_grad():
        out0, kv0 = attn(xs[0], pos, [], None)
        out1, kv1 = attn(xs[1], pos + 1, [kv0], pos)
        out2, _ = attn(xs[2], pos + 2, [kv0, kv1], pos)
        # reference: repeat kv heads, loop over positions, softmax over the explicit key list
        rep = attn.n_heads // attn.n_kv

        def qkv(x, p):
            from kimi_eagle.eagle3.drafter_base import apply_rope, rope_cos_sin

            cos, sin = rope_cos_sin(p, attn.head_dim, attn.theta)
            q = apply_rope(attn.q_proj(x).view(b, t, attn.n_heads, -1).transpose(1, 2), cos, sin)
            k = apply_rope(attn.k_proj(x).view(b, t, attn.n_kv, -1).transpose(1, 2), cos, sin)
            v = attn.v_proj(x).view(b, t, attn.n_kv, -1).transpose(1, 2)
            return q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)

        steps = [qkv(x, pos + i) for i, x in enumerate(xs)]
        q0, k0, v0 = steps[0]
        ref0 = F.scaled_dot_product_attention(q0, k0, v0, is_causal=True)
        assert torch.allclose(out0, attn.o_proj(ref0.transpose(1, 2).reshape(b, t, -1)), atol=1e-5)
        for step, out in ((1, out1), (2, out2)):
            q = steps[step][0]
            rows = []
            for i in range(t):
                keys = torch.cat([k0[:, :, : i + 1]] + [steps[j][1][:, :, i : i + 1] for j in range(1, step + 1)], 2)
                vals = torch.cat([v0[:, :, : i + 1]] + [steps[j][2][:, :, i : i + 1] for j in range(1, step + 1)], 2)
                rows.append(F.scaled_dot_product_attention(q[:, :, i : i + 1], keys, vals))
            ref = torch.cat(rows, 2).transpose(1, 2).reshape(b, t, -1)
            assert torch.allclose(out, attn.o_proj(ref), atol=1e-5)
