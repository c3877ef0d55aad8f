"""`kimi-eagle export --engine speculators`: speculators' own Eagle3DraftModel loads the checkpoint on CPU
and its logits match the kit drafter's at every unroll step within ``LOGIT_TOL`` (max abs difference; float32
summation order differs, so not bitwise: docs/scale.md states the measured value)."""
from __future__ import annotations

import json

import pytest
import torch

from kimi_eagle.apps.cli import main
from kimi_eagle.assets import stories_dir
from kimi_eagle.eagle3 import draft_vocab
from kimi_eagle.eagle3.hidden import load_target
from kimi_eagle.eagle3.model import Eagle3Drafter

STEPS = 3
LOGIT_TOL = 1e-5  # max abs logit difference allowed (measured 1.6e-6 here; docs/scale.md)


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    """A stories260K drafter with non-trivial weights (norms away from 1), saved natively."""
    target = load_target(stories_dir())
    vocab = draft_vocab.build(torch.randint(0, 50, (512,), generator=torch.Generator().manual_seed(0)), 96)
    drafter = Eagle3Drafter.from_target(target, vocab, [1, 2, 3], seed=5)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("draft")
    drafter.save(path)
    return path, drafter.eval()


def test_speculators_loads_the_export_and_reproduces_the_logits(native, tmp_path, capsys):
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    path, drafter = native
    assert main(["export", str(path), "--engine", "speculators", "-o", str(tmp_path), "--verifier", str(stories_dir())]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["eagle_aux_hidden_state_layer_ids"] == [2, 3, 4]  # capture-before ids of blocks 1, 2, 3
    config = Eagle3SpeculatorConfig.from_pretrained(str(tmp_path))
    config.transformer_layer_config._attn_implementation = "eager"  # flex attention's kernels need a GPU
    model = Eagle3DraftModel.from_pretrained(str(tmp_path), config=config).eval()
    assert model.config.speculators_model_type == "eagle3" and model.config.draft_vocab_size == 96
    assert torch.equal(model.d2t, drafter.d2t) and torch.equal(model.t2d, drafter.t2d)

    g = torch.Generator().manual_seed(1)
    t = 12
    ids = torch.randint(0, 512, (1, t), generator=g)
    aux = torch.randn(1, t, 3 * 64, generator=g)
    with torch.no_grad():
        ours = drafter.unroll(aux, ids, STEPS)
    theirs: list[torch.Tensor] = []
    hook = model.lm_head.register_forward_hook(lambda _m, _i, out: theirs.append(out.detach()))
    # kit step 0 feeds x[t+1] at rope position t; speculators feeds input_ids[t] at position_ids[t]
    step0_tokens = torch.cat([ids[:, 1:], ids.new_zeros(1, 1)], dim=1)
    with torch.no_grad():
        model(hidden_states=aux, input_ids=step0_tokens, document_ids=torch.zeros(1, t, dtype=torch.long),
              position_ids=torch.arange(t)[None], ttt_steps=STEPS)
    hook.remove()
    assert len(theirs) == STEPS
    diff = max(float((theirs[k][:, : t - 1 - k] - ours[k][:, : t - 1 - k]).abs().max()) for k in range(STEPS))
    print(f"max abs logit difference kit vs speculators: {diff:.2e}")  # past the row's end both see padding
    assert diff <= LOGIT_TOL
    assert all(torch.equal(theirs[k].argmax(-1)[:, : t - 1 - k], ours[k].argmax(-1)[:, : t - 1 - k]) for k in range(STEPS))


def test_a_speculators_export_without_a_verifier_is_refused(native, tmp_path, capsys):
    path, _ = native
    assert main(["export", str(path), "--engine", "speculators", "-o", str(tmp_path)]) == 2
    assert "--verifier" in capsys.readouterr().err
    assert not (tmp_path / "config.json").exists()
