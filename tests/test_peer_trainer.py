"""The peer-trainer interop (bench/peer_trainer.py's parts): a speculators EAGLE-3 checkpoint loads into the
kit's drafter through ``load_drafter``; kit -> speculators -> kit is the identity; a drafter trained by
speculators' own model and loss and saved by its own ``save_pretrained`` gives the kit the logits speculators
computes; architectures the kit's layer does not implement are refused."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from kimi_eagle.apps.interop.export_data import export_data
from kimi_eagle.apps.interop.speculators import export_speculators
from kimi_eagle.assets import stories_dir
from kimi_eagle.eagle3 import draft_vocab
from kimi_eagle.eagle3.evaluate import EvaluateOptions, evaluate_drafter
from kimi_eagle.eagle3.extract import extract
from kimi_eagle.eagle3.hidden import Row, load_target
from kimi_eagle.eagle3.layouts import arrow_rows
from kimi_eagle.eagle3.model import Eagle3Drafter, load_drafter
from kimi_eagle.eagle3.speculative import generate_target_only
from kimi_eagle.eagle3.speculators_checkpoint import kit_config
from kimi_eagle.io import write_jsonl

STEPS = 3
LAYERS = [1, 2, 3]


@pytest.fixture(scope="module")
def target():
    return load_target(stories_dir())


def speculators_logits(path, aux, ids, steps=STEPS):
    """Logits of every TTT step of the speculators checkpoint at ``path``, computed by speculators (eager, CPU),
    fed the way the kit's unroll is (step 0 takes ``x[t+1]`` at position ``t``)."""
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    config = Eagle3SpeculatorConfig.from_pretrained(str(path))
    config.transformer_layer_config._attn_implementation = "eager"
    model = Eagle3DraftModel.from_pretrained(str(path), config=config).eval()
    out: list[torch.Tensor] = []
    hook = model.lm_head.register_forward_hook(lambda _m, _i, o: out.append(o.detach()))
    t = ids.shape[1]
    with torch.no_grad():
        model(hidden_states=aux, input_ids=torch.cat([ids[:, 1:], ids.new_zeros(1, 1)], 1),
              document_ids=torch.zeros(1, t, dtype=torch.long), position_ids=torch.arange(t)[None], ttt_steps=steps)
    hook.remove()
    return out


def inputs(seed=1, t=12):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, t, 3 * 64, generator=g), torch.randint(0, 512, (1, t), generator=g)


def test_kit_to_speculators_to_kit_is_the_identity(target, tmp_path):
    vocab = draft_vocab.build(torch.randint(0, 50, (512,), generator=torch.Generator().manual_seed(0)), 96)
    drafter = Eagle3Drafter.from_target(target, vocab, LAYERS, seed=5)
    with torch.no_grad():  # norms away from 1 so a dropped or swapped norm would show
        for name, p in drafter.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
    drafter.save(tmp_path / "native")
    export_speculators(tmp_path / "native", tmp_path / "spec", verifier=str(stories_dir()))
    back = load_drafter(tmp_path / "spec", stories_dir())
    assert back.config == drafter.config
    assert back.state_dict().keys() == drafter.state_dict().keys()
    assert all(torch.equal(back.state_dict()[k], v) for k, v in drafter.state_dict().items())
    aux, ids = inputs()
    with torch.no_grad():
        for ours, theirs in zip(drafter.unroll(aux, ids, STEPS), back.unroll(aux, ids, STEPS)):
            assert torch.equal(ours, theirs)


@pytest.fixture(scope="module")
def peer_run(target, tmp_path_factory):
    """Real sampled rows exported for speculators, hidden states in its layout, 2 steps of the peer trainer."""
    from kimi_eagle.apps.interop.peer import PeerConfig, PeerData, train_peer

    g = torch.Generator().manual_seed(0)
    rows = []
    for i in range(6):
        prompt = [1, 403, 407, 261, 378][: 2 + i % 3]
        completion = generate_target_only(target, prompt, 8 + i, 1.0, None, g)
        rows.append(Row(f"r{i}", prompt + completion, [0] * len(prompt) + [1] * len(completion)))
    root = tmp_path_factory.mktemp("peer")
    src = write_jsonl(root / "rows.jsonl", ({"id": r.id, "input_ids": r.input_ids, "loss_mask": r.loss_mask} for r in rows))
    export_data(src, "speculators", root / "spec", vocab_size=512, draft_vocab_size=64, target=str(stories_dir()),
                n_layers=5, hidden_size=64)
    extract(stories_dir(), arrow_rows(root / "spec"), root / "spec" / "hidden_states", layout="speculators",
            rows_source=root / "spec", model=target)
    cfg = PeerConfig(str(root / "spec"), str(stories_dir()), str(root / "out"), steps=2, ttt_steps=STEPS,
                     batch_size=3, draft_vocab_size=64)
    result = train_peer(cfg, LAYERS, [[0, 1, 2], [3, 4, 5]])
    return root, rows, result, PeerData(root / "spec", 64)


def test_the_peer_packs_the_rows_of_each_step_shifted_by_one(peer_run):
    root, rows, result, data = peer_run
    batch = data.batch([0, 2])
    assert batch["input_ids"][0].tolist() == rows[0].input_ids[1:] + rows[2].input_ids[1:]
    assert batch["document_ids"][0].tolist() == [0] * (len(rows[0].input_ids) - 1) + [1] * (len(rows[2].input_ids) - 1)
    assert result["tokens"] == sum(len(rows[i].input_ids) - 1 for i in range(6))
    assert len(result["losses"]) == 2 and all(x == x and x > 0 for x in result["losses"])


def test_a_drafter_trained_and_saved_by_speculators_loads_with_its_logits(peer_run, target):
    root, rows, result, _ = peer_run
    path = root / "out" / "drafter"
    raw = json.loads((path / "config.json").read_text())
    assert raw["speculators_model_type"] == "eagle3" and "kimi_eagle" not in raw  # speculators' own file
    kit = load_drafter(path, stories_dir())
    assert kit.config.aux_layer_ids == LAYERS and kit.config.target_num_layers == 5 and kit.config.draft_vocab_size == 64
    assert torch.equal(kit.d2t, torch.from_numpy(np.load(root / "spec" / "d2t-64.npy")))
    aux, ids = inputs(2)
    with torch.no_grad():
        ours = kit.unroll(aux, ids, STEPS)
    theirs = speculators_logits(path, aux, ids)
    for k in range(STEPS):
        valid = ids.shape[1] - 1 - k  # past the end both sides see padding tokens
        torch.testing.assert_close(ours[k][:, :valid], theirs[k][:, :valid], rtol=1e-5, atol=1e-5)
    # and the kit's evaluate takes the directory as it is (greedy output = the target's own)
    report = evaluate_drafter(stories_dir(), path, [("p", rows[0].input_ids[:4])],
                              EvaluateOptions(k=2, max_new_tokens=6, temperatures=(0.0,), ngram=False), model=target)
    assert report["methods"]["eagle3"]["greedy"]["identical_to_target_greedy"] == "1/1"


def test_architectures_the_kit_layer_lacks_are_refused(peer_run):
    root, *_ = peer_run
    raw = json.loads((root / "out" / "drafter" / "config.json").read_text())
    assert kit_config(raw)["hidden_size"] == 64
    for flag in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output"):
        with pytest.raises(ValueError, match=flag):
            kit_config({**raw, flag: True})
    with pytest.raises(ValueError, match="decoder layers"):
        kit_config({**raw, "transformer_layer_config": {**raw["transformer_layer_config"], "num_hidden_layers": 2}})
    window = {**raw["transformer_layer_config"], "layer_types": ["sliding_attention"], "sliding_window": 64}
    with pytest.raises(ValueError, match="sliding window"):
        kit_config({**raw, "transformer_layer_config": window})


def test_sdpa_gives_eager_s_losses_and_unpacked_steps_train_the_same_rows(peer_run):
    """The bench's fastest CPU attention (speculators' ``sdpa``) computes the loss eager does on the same packed
    rows; one row at a time (``pack=False``) sees the same tokens, each row's loss averaged."""
    from speculators.losses import resolve_loss_config

    from kimi_eagle.apps.interop.peer import PeerConfig, build_model, peer_step

    root, rows, _result, data = peer_run
    losses = {}
    for impl, pack in (("eager", True), ("sdpa", True), ("sdpa", False)):
        cfg = PeerConfig(str(root / "spec"), str(stories_dir()), "", ttt_steps=STEPS, draft_vocab_size=64,
                         attn_impl=impl, pack=pack)
        model = build_model(cfg, LAYERS)
        losses[impl, pack] = peer_step(model, data, [0, 1, 2], cfg, resolve_loss_config("kl_div", "eager"))
        assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())
    assert losses["sdpa", True][0] == pytest.approx(losses["eager", True][0], rel=1e-4)
    assert losses["sdpa", True][2] == losses["sdpa", False][2] == sum(len(rows[i].input_ids) - 1 for i in range(3))
    assert losses["sdpa", False][0] > 0
