"""Export for SGLang and vLLM: config fields, weight names, per-engine layer ids, exact reload."""
import json
from dataclasses import replace

import pytest
import torch
from safetensors import safe_open

from kimi_eagle.apps.cli import main
from kimi_eagle.assets import stories_dir
from kimi_eagle.eagle3 import draft_vocab
from kimi_eagle.eagle3.hidden import load_target
from kimi_eagle.eagle3.model import Eagle3Config, Eagle3Drafter, load_drafter

torch.set_num_threads(1)

WEIGHTS = {
    "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
    "midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight", "midlayer.post_attention_layernorm.weight",
    "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight", "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight", "midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight",
}


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    """A drafter with non-trivial weights everywhere, saved in the native format."""
    target = load_target(stories_dir())
    vocab = draft_vocab.build(torch.randint(0, 50, (512,), generator=torch.Generator().manual_seed(0)), 96)
    drafter = Eagle3Drafter.from_target(target, vocab, [1, 2, 3], seed=5)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))  # norms away from 1 so a mixed-up norm would show
    path = tmp_path_factory.mktemp("draft")
    drafter.save(path)
    return path, drafter


@pytest.mark.parametrize("engine,ids", [("sglang", [1, 2, 3]), ("vllm", [2, 3, 4])])
def test_export_layout_and_layer_ids(native, tmp_path, engine, ids, capsys):
    path, drafter = native
    assert main(["export", str(path), "--engine", engine, "-o", str(tmp_path)]) == 0
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == ids
    assert cfg["draft_vocab_size"] == 96 and cfg["vocab_size"] == 512 and cfg["target_hidden_size"] == 64
    assert cfg["num_hidden_layers"] == 1 and cfg["hidden_size"] == 64 and cfg["tie_word_embeddings"] is False
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        assert names == WEIGHTS  # no embeddings
        assert f.get_tensor("d2t").dtype == torch.int64 and f.get_tensor("t2d").dtype == torch.bool
        assert f.get_tensor("midlayer.self_attn.q_proj.weight").shape == (64, 128)


def test_reloaded_export_reproduces_the_drafter_logits_exactly(native, tmp_path):
    path, drafter = native
    g = torch.Generator().manual_seed(1)
    aux = torch.randn(1, 12, 192, generator=g)
    ids = torch.randint(3, 512, (1, 12), generator=g)
    want = drafter.unroll(aux, ids, 3)
    for engine in ("sglang", "vllm"):
        main(["export", str(path), "--engine", engine, "-o", str(tmp_path / engine)])
        reloaded = load_drafter(tmp_path / engine, stories_dir())
        assert reloaded.config.aux_layer_ids == [1, 2, 3]
        got = reloaded.unroll(aux, ids, 3)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    with pytest.raises(ValueError, match="target directory"):
        load_drafter(tmp_path / "vllm")


def test_unknown_engine_is_refused(native, tmp_path):
    from kimi_eagle.apps.interop.export_drafter import export_drafter

    with pytest.raises(ValueError, match="unknown engine"):
        export_drafter(native[0], "tgi", tmp_path)


def test_a_foreign_export_is_read_in_the_capture_before_block_convention(native, tmp_path):
    """An export without the kit's ``kimi_eagle`` block: its vLLM-style ids 2, 3, 4 are block outputs 1, 2, 3."""
    path, drafter = native
    main(["export", str(path), "--engine", "vllm", "-o", str(tmp_path)])
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["kimi_eagle"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    config = Eagle3Config.from_engine_config(cfg)
    assert config.aux_layer_ids == [1, 2, 3]
    assert replace(config, target_num_layers=drafter.config.target_num_layers) == drafter.config
    reloaded = load_drafter(tmp_path, stories_dir())
    aux, ids = torch.randn(1, 6, 192), torch.randint(3, 512, (1, 6))
    assert all(torch.equal(a, b) for a, b in zip(reloaded.unroll(aux, ids, 2), drafter.unroll(aux, ids, 2)))
