"""The DFlash block drafter: block shapes, what a block sees, train/inference consistency, exact greedy output,
τ counting, checkpoints, and the defaults the hand-off reads (layer set, block size, mask token)."""
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kimi_eagle.assets import kimi_dir, stories_dir
from kimi_eagle.eagle3 import draft_vocab
from kimi_eagle.eagle3.dflash import BlockSpec, ContextCache, DFlashDrafter, DFlashProposer
from kimi_eagle.eagle3.dflash_config import BLOCK_SIZE, KIMI_MASK_TOKEN_ID, dflash_layer_ids, mask_token_id
from kimi_eagle.eagle3.drafters import load_any_drafter
from kimi_eagle.eagle3.hidden import Extractor, load_target
from kimi_eagle.eagle3.losses import BlockObjective, DFlashLoss, block_anchors, soft_targets
from kimi_eagle.eagle3.speculative import (
    CachedTarget,
    DecodeOptions,
    Target,
    generate_target_only,
    speculative_generate,
)

torch.set_num_threads(1)
LAYERS = (0, 1, 2, 3, 4)  # stories260K's DFlash set: all 5 blocks
SENTENCE = [1, 403, 407, 261, 378, 275, 263, 380, 31, 315, 386, 338, 290, 429, 270, 263, 380, 31, 315, 386]


@pytest.fixture(scope="module")
def target():
    return load_target(stories_dir())


@pytest.fixture(scope="module")
def drafter(target):
    counts = torch.arange(512).flip(0)  # keeps the 100 lowest ids
    block = BlockSpec(block_size=4, mask_token_id=2, num_draft_layers=2)
    return DFlashDrafter.from_target_weights(target.config, target.model.embed_tokens.weight, target.lm_head.weight,
                                             draft_vocab.build(counts, 100), LAYERS, block, seed=3).eval()


@pytest.fixture(scope="module")
def features(target):
    ex = Extractor(target, LAYERS)
    aux, final = ex(torch.tensor([SENTENCE]))
    ex.close()
    return torch.tensor(SENTENCE), aux[0].clone(), final[0].clone()


def test_the_defaults_follow_z_lab_and_speculators():
    assert BLOCK_SIZE == 8  # DFlashSpeculatorConfig.block_size; the public Kimi-K2.5 DFlash numbers are at block 8
    assert dflash_layer_ids(61) == (1, 15, 30, 44, 58)  # Kimi-K2.5's 61 layers
    assert dflash_layer_ids(36) == (1, 9, 17, 25, 33)  # Qwen3-8B: z-lab's Qwen3-8B-DFlash target_layer_ids
    assert dflash_layer_ids(5) == LAYERS and dflash_layer_ids(4) == (0, 1, 2, 3) and dflash_layer_ids(3) == (0, 1, 2)
    assert mask_token_id(stories_dir()) == 2  # no mask or pad token: speculators falls back to eos
    assert KIMI_MASK_TOKEN_ID == 163839
    config = json.loads((kimi_dir() / "tokenizer_config.json").read_text())
    assert config["added_tokens_decoder"][str(KIMI_MASK_TOKEN_ID)]["content"] == config["pad_token"] == "[PAD]"
    assert "mask_token" not in config


def test_a_block_is_the_anchor_then_mask_tokens_and_every_slot_gets_logits(drafter, features):
    ids, aux, _ = features
    blocks = drafter.block_tokens(torch.tensor([[7, 9, 11]]))
    assert blocks.tolist() == [[[7, 2, 2, 2], [9, 2, 2, 2], [11, 2, 2, 2]]]
    anchors = torch.tensor([0, 5, 12])
    logits = drafter(aux[None], ids[None], anchors)
    assert logits.shape == (1, 3, 4, 100)
    shapes = {k: tuple(v.shape) for k, v in drafter.state_dict().items()}
    assert shapes["fc.weight"] == (64, 5 * 64)  # 5 target layers fused
    assert shapes["layers.1.self_attn.q_proj.weight"] == (64, 64) and shapes["layers.1.self_attn.k_norm.weight"] == (8,)
    assert not drafter.embed_tokens.weight.requires_grad and drafter.fc.bias is None


def test_a_block_sees_the_context_before_its_anchor_and_nothing_after(drafter, features):
    ids, aux, _ = features
    a = 9
    base = drafter(aux[None], ids[None], torch.tensor([a]))
    later = aux.clone()
    later[a:] += torch.randn_like(later[a:])
    ids_later = ids.clone()
    ids_later[a + 1:] = 5
    torch.testing.assert_close(drafter(later[None], ids_later[None], torch.tensor([a])), base)
    earlier = aux.clone()
    earlier[a - 1] += 1.0
    assert not torch.allclose(drafter(earlier[None], ids[None], torch.tensor([a])), base)
    other_anchor = ids.clone()
    other_anchor[a] = 17
    assert not torch.allclose(drafter(aux[None], other_anchor[None], torch.tensor([a])), base)


def _naive_block_logits(drafter, aux, anchor_token, a):
    """One block by explicit per-query loops: context keys at 0..a-1, block keys bidirectional, GQA by head index."""
    cfg = drafter.config
    from kimi_eagle.eagle3.drafter_base import apply_rope, rope_cos_sin

    ctx = drafter.hidden_norm(drafter.fc(aux[:a]))
    x = drafter.embed_tokens(torch.tensor([anchor_token] + [cfg.mask_token_id] * (cfg.block_size - 1)))
    pos = torch.arange(a, a + cfg.block_size)
    for layer in drafter.layers:
        att = layer.self_attn
        h = layer.input_layernorm(x)

        def heads(proj, inp, n, norm=None):
            y = proj(inp).view(inp.shape[0], n, cfg.head_dim)
            return norm(y) if norm is not None else y

        q = heads(att.q_proj, h, cfg.num_attention_heads, att.q_norm)
        keys = torch.cat([heads(att.k_proj, ctx, cfg.num_key_value_heads, att.k_norm),
                          heads(att.k_proj, h, cfg.num_key_value_heads, att.k_norm)])
        values = torch.cat([heads(att.v_proj, ctx, cfg.num_key_value_heads), heads(att.v_proj, h, cfg.num_key_value_heads)])
        kpos = torch.cat([torch.arange(a), pos])
        cq, sq = rope_cos_sin(pos, cfg.head_dim, cfg.rope_theta)
        ck, sk = rope_cos_sin(kpos, cfg.head_dim, cfg.rope_theta)
        q, keys = apply_rope(q, cq[:, None], sq[:, None]), apply_rope(keys, ck[:, None], sk[:, None])
        rep = cfg.num_attention_heads // cfg.num_key_value_heads
        out = torch.zeros(cfg.block_size, cfg.num_attention_heads, cfg.head_dim)
        for i in range(cfg.block_size):
            for head in range(cfg.num_attention_heads):
                kv = head // rep
                w = torch.softmax(keys[:, kv] @ q[i, head] / math.sqrt(cfg.head_dim), dim=0)
                out[i, head] = w @ values[:, kv]
        x = x + att.o_proj(out.reshape(cfg.block_size, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return drafter.lm_head(drafter.norm(x))


def test_block_attention_matches_a_naive_reference(drafter, features):
    ids, aux, _ = features
    anchors = torch.tensor([0, 3, 11])
    batched = drafter(aux[None], ids[None], anchors)[0]
    for i, a in enumerate(anchors.tolist()):
        torch.testing.assert_close(batched[i], _naive_block_logits(drafter, aux, int(ids[a]), a), rtol=1e-4, atol=1e-4)


def test_drafting_computes_what_training_computes_and_the_cache_changes_nothing(drafter, features):
    """A fresh drafter's slots are near ties, so distributions are compared (temperature 1), not argmaxes."""
    ids, aux, _ = features
    cache = ContextCache()
    for n, reusable in ((6, 0), (9, 6), (14, 9), (7, 7), (12, 7)):
        training = drafter(aux[None], ids[None], torch.tensor([n]))[0, 0]
        assert cache.reusable(aux[:n]) == reusable
        for cached in (cache, None):
            drafts, dists = drafter.propose(aux[:n], int(ids[n]), 7, 1.0, torch.Generator().manual_seed(n), cache=cached)
            assert len(drafts) == 3  # k is capped at block_size - 1
            for j, (d, q) in enumerate(zip(drafts, dists), start=1):
                torch.testing.assert_close(q[drafter.draft_to_target], torch.softmax(training[j], -1), rtol=1e-4, atol=1e-5)
                assert float(q[d]) > 0 and float(q.sum()) == pytest.approx(1.0)
        assert len(cache) == n
        greedy, one_hot = drafter.propose(aux[:n], int(ids[n]), 2)
        assert len(greedy) == 2 and all(float(q[d]) == 1.0 == float(q.sum()) for d, q in zip(greedy, one_hot))


def test_the_loss_supervises_slot_j_with_the_target_distribution_of_the_token_it_predicts(drafter, features):
    ids, aux, final = features
    mask = torch.zeros(len(ids), dtype=torch.long)
    mask[10:] = 1
    assert block_anchors(mask[None], 4).tolist() == list(range(7, 19))  # blocks reaching a supervised token
    head = torch.randn(100, 64)
    loss_fn = DFlashLoss(drafter, head, BlockObjective(step_weight=0.5))
    loss, stats = loss_fn(aux[None], ids[None], mask[None], final[None])
    assert stats.shape == (3, 3) and loss_fn.stat_rows == 3
    logits = drafter(aux[None], ids[None], torch.arange(7, 19))[0]
    want_loss, t = 0.0, len(ids)
    for j in (1, 2, 3):
        ces = [-(soft_targets(final[a + j - 1][None], head)[0] * F.log_softmax(logits[a - 7, j], -1)).sum()
               for a in range(7, 19) if a + j < t and mask[a + j]]
        assert float(stats[j - 1, 2]) == len(ces)
        torch.testing.assert_close(stats[j - 1, 0], torch.stack(ces).sum(), rtol=1e-4, atol=1e-4)
        want_loss += 0.5 ** (j - 1) * float(torch.stack(ces).mean().detach())
    assert float(loss.detach()) == pytest.approx(want_loss, rel=1e-4)


@pytest.mark.parametrize("verifier", [CachedTarget, Target])
def test_speculative_decoding_with_dflash_is_target_greedy_token_for_token(target, drafter, verifier):
    """A fresh drafter (its blocks mostly rejected; the trained drafter below has blocks accepted): the output is
    target-only greedy decoding, at most k drafts per round, and τ counts the bonus token."""
    for prompt in ([1, 403, 407, 261], SENTENCE[:12], [1, 31]):
        want = generate_target_only(target, prompt, 30, 0.0, 2)
        result = speculative_generate(verifier(target, LAYERS), DFlashProposer(drafter), prompt, DecodeOptions(30, k=3, eos_id=2))
        assert result.tokens == want
        assert all(0 <= a <= p <= 3 for a, p in zip(result.accepted, result.proposed))
        assert result.tau == pytest.approx((sum(result.accepted) + result.rounds) / result.rounds)
        assert 1.0 <= result.tau <= 4.0  # at most block_size tokens per round


def test_a_trained_dflash_drafter_is_accepted_and_round_trips_through_its_checkpoint(target, tmp_path):
    """Train a few steps with the kit's Trainer on stories260K rows (DFlash layer set), save, load: same weights,
    same drafts; a perfect draft stream gives exactly block_size tokens per round."""
    from kimi_eagle.eagle3.extract import extract
    from kimi_eagle.eagle3.hidden import Row
    from kimi_eagle.eagle3.train import TrainConfig, train_drafter

    rows = []
    for i, start in enumerate(([1, 403, 407], [1, 31, 315], [1, 275, 263], [1, 386, 338])):
        out = generate_target_only(target, start, 40, 0.0, 2)
        rows.append(Row(str(i), start + out, [0] * len(start) + [1] * len(out)))
    manifest = extract(stories_dir(), rows, tmp_path / "hidden", drafter="dflash", model=target)
    assert manifest["layer_ids"] == list(LAYERS)
    cfg = TrainConfig(data=str(tmp_path / "hidden"), target=str(stories_dir()), out=str(tmp_path / "train"), steps=30,
                      batch_size=4, lr=1e-2, draft_vocab_size=128, drafter="dflash", block_size=4, progress=False)
    summary = train_drafter(cfg)
    assert len(summary["final"]["acc"]) == 3 and summary["layer_ids"] == list(LAYERS)
    loaded = load_any_drafter(tmp_path / "train" / "drafter")
    assert isinstance(loaded, DFlashDrafter) and loaded.config.mask_token_id == 2 and loaded.config.block_size == 4
    saved = json.loads((tmp_path / "train" / "drafter" / "config.json").read_text())
    assert saved["format"] == "kimi-eagle-dflash/1" and saved["training"]["drafter"] == "dflash"
    state = torch.load(tmp_path / "train" / "checkpoint" / "last.pt", weights_only=True)["model"]
    assert all(torch.equal(state[k], v) for k, v in loaded.state_dict().items())
    prompt = rows[0].input_ids[:6]
    result = speculative_generate(CachedTarget(target, LAYERS), DFlashProposer(loaded), prompt, DecodeOptions(30, k=3, eos_id=2))
    assert result.tokens == generate_target_only(target, prompt, 30, 0.0, 2)
    assert sum(result.accepted) > 0  # trained on these very continuations: some blocks are accepted


def test_a_hostile_dflash_config_is_refused_with_a_message(drafter, tmp_path):
    drafter.save(tmp_path / "d")
    raw = json.loads((tmp_path / "d" / "config.json").read_text())
    for key, value in (("mask_token_id", 512), ("block_size", 1), ("num_draft_layers", 0), ("hidden_size", -1)):
        (tmp_path / "d" / "config.json").write_text(json.dumps({**raw, "config": {**raw["config"], key: value}}))
        with pytest.raises(ValueError, match="config.json"):
            load_any_drafter(tmp_path / "d")
    (tmp_path / "d" / "config.json").write_text(json.dumps(raw))
    assert np.array_equal(load_any_drafter(tmp_path / "d").fc.weight.detach().numpy(), drafter.fc.weight.detach().numpy())


def _notebook_params(name):
    from kimi_eagle.apps.batch.notebooks import notebook_runs

    return next((n, p) for n, p in notebook_runs("test") if n.name == name)


def test_notebook_04_shows_its_charts_as_images_and_both_drafters_side_by_side(tmp_path):
    """#35 finding 1: the chart cells printed `<Figure size 1100x380 with 2 Axes>`; now each carries image/png. #36: the
    ablation runs EAGLE-3 and DFlash on the same rows and the side-by-side numbers are the table's."""
    from kimi_eagle.apps.batch.notebooks import execute

    notebook, params = _notebook_params("04_drafter_ablation.ipynb")
    executed = json.loads(execute(notebook, tmp_path, params).read_text())
    charts = [c for c in executed["cells"] if "plot_arms(" in "".join(c["source"]) or "plot_dose_response(" in "".join(c["source"])]
    assert charts
    for cell in charts:
        kinds = [kind for o in cell["outputs"] for kind in o.get("data", {})]
        assert kinds.count("image/png") == "".join(cell["source"]).count("display(Image(") >= 1, kinds
        text = "".join("".join(o.get("data", {}).get("text/plain", "")) for o in cell["outputs"])
        assert "<Figure size" not in text
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    table = {(r["drafter"], r["arm"], r["mode"]): r for r in metrics["table"]}
    assert {d for d, _, _ in table} == {"eagle3", "dflash"}
    for row in metrics["drafters"]["tau"]:
        arm = "engine IDs · bf16" if row["drafter"] == "eagle3" else "DFlash · engine IDs · bf16"
        assert row["tau"] == table[(row["drafter"], arm, row["mode"])]["tau"]
        assert row["ci95"] == [table[(row["drafter"], arm, row["mode"])]["lo"], table[(row["drafter"], arm, row["mode"])]["hi"]]
    for row in metrics["drafters"]["engine_minus_recon"]:
        arm = "recon IDs · bf16" if row["drafter"] == "eagle3" else "DFlash · recon IDs · bf16"
        assert row["engine_minus_recon"] == pytest.approx(-table[(row["drafter"], arm, row["mode"])]["delta"], abs=1e-4)
        assert table[(row["drafter"], arm, row["mode"])]["reference"].endswith("engine IDs · bf16")


def test_notebook_03_trains_and_evaluates_a_dflash_drafter_with_greedy_output_identical(tmp_path):
    from kimi_eagle.apps.batch.notebooks import execute

    notebook, params = _notebook_params("03_eagle3_training.ipynb")
    execute(notebook, tmp_path, {**params, "drafter": "dflash", "block_size": 4})
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["drafter"] == {"name": "dflash", "k": 3}
    assert metrics["extraction"]["engine"]["layer_ids"] == list(LAYERS)
    n = params["eval_prompts"]
    assert metrics["tau"]["DFlash (engine IDs)"]["greedy identical"] == f"{n}/{n}"
    assert metrics["tau"]["DFlash (recon IDs)"]["greedy identical"] == f"{n}/{n}"


# ---- the recipes (issue 45): defaults in one place, the objectives they select ----


def test_recipes_hold_every_drafter_default_and_train_resolves_them():
    from kimi_eagle.eagle3 import recipes
    from kimi_eagle.eagle3.train import TrainConfig

    assert recipes.default_lr("eagle3") == 3e-3 and recipes.default_lr("dflash") == 1e-2
    spec, zlab = recipes.recipe("dflash", "speculators"), recipes.recipe("dflash", "zlab")
    assert (spec.block_size, spec.draft_layers, spec.freeze_lm_head, spec.objective.weighting, spec.objective.ce,
            spec.objective.normalise, spec.objective.max_anchors) == (16, 5, True, "dpace", "argmax", "pooled", 512)
    assert (zlab.block_size, zlab.draft_layers, zlab.objective.gamma, zlab.objective.ce) == (8, 6, 4.0, "data")
    cfg = recipes.resolve(TrainConfig("d", "t", "o", drafter="dflash", dflash_recipe="speculators", lr=5e-4))
    assert (cfg.lr, cfg.block_size, cfg.draft_layers) == (5e-4, 16, 5)
    assert recipes.resolve(TrainConfig("d", "t", "o")).lr == 3e-3  # EAGLE-3 keeps its learning rate
    assert recipes.objective(TrainConfig("d", "t", "o", drafter="dflash", dflash_recipe="speculators",
                                         dflash_weighting="exp", max_anchors=0)) == BlockObjective(
        ce="argmax", weighting="exp", normalise="pooled", max_anchors=None)
    with pytest.raises(ValueError, match="D-PACE"):
        recipes.objective(TrainConfig("d", "t", "o", drafter="dflash", dflash_weighting="dpace"))  # kit: soft CE


def test_train_help_shows_the_recipe_options(capsys):
    from kimi_eagle.apps.cli import main

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for needle in ("--dflash-recipe {kit,speculators,zlab}", "--dflash-weighting", "--max-anchors", "--dflash-gamma",
                   "speculators: lr 0.001, block 16, 5 draft layer(s)", "eagle3 0.003"):
        assert needle in text, needle


def test_sampled_anchors_are_supervised_never_in_the_last_block_and_capped():
    from kimi_eagle.eagle3.losses import sampled_anchors

    mask = torch.zeros(2, 20, dtype=torch.long)
    mask[0, 5:20] = 1  # row 0 ends at 20: anchors 5..11 (a < 20 - 8)
    mask[1, 3:12] = 1  # row 1 ends at 12: anchors 3 only (a < 4)
    anchors, valid = sampled_anchors(mask, 8, 512)
    assert anchors.tolist() == [3, 5, 6, 7, 8, 9, 10, 11]
    assert valid[0].tolist() == [False] + [True] * 7 and valid[1].tolist() == [True] + [False] * 7
    torch.manual_seed(0)
    few, _ = sampled_anchors(mask, 8, 3)
    assert len(few) == 3 and set(few.tolist()) <= set(anchors.tolist()) and few.tolist() == sorted(few.tolist())


def test_the_zlab_objective_is_the_weighted_mean_of_hard_ce_on_the_data_tokens(drafter, features):
    """``ce data``, ``exp`` weights γ = 4, ``weighted`` normalisation, all anchors (the cap above their number): the
    loss is Σ w_j CE(x[a+j]) / Σ w_j over supervised slots whose token is in the draft vocabulary."""
    ids, aux, final = features
    mask = torch.zeros(len(ids), dtype=torch.long)
    mask[10:] = 1
    objective = BlockObjective(ce="data", weighting="exp", gamma=4.0, normalise="weighted", max_anchors=512)
    loss, stats = DFlashLoss(drafter, torch.randn(100, 64), objective)(aux[None], ids[None], mask[None], final[None])
    t, s = len(ids), drafter.config.block_size
    anchors = [a for a in range(t) if mask[a] and a < t - s]
    logits = drafter(aux[None], ids[None], torch.tensor(anchors))[0].detach()
    to_draft = {int(tid): d for d, tid in enumerate(drafter.draft_to_target.tolist())}
    num = den = 0.0
    for i, a in enumerate(anchors):
        for j in range(1, s):
            tok = int(ids[a + j])
            if mask[a + j] and tok in to_draft:
                w = math.exp(-(j - 1) / 4.0)
                num += w * float(-F.log_softmax(logits[i, j], -1)[to_draft[tok]])
                den += w
    assert float(loss.detach()) == pytest.approx(num / den, rel=1e-4)
