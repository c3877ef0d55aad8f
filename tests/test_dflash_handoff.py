"""The block-drafter hand-off runs as written: ``export-data --to speculators`` emits ``speculators_dflash.sh`` and
``speculators_dspark.sh``; every line of both goes through speculators' own CLI (``generate-offline-data``'s options,
``TrainConfig.resolve``, ``--dump-config``, ``train --dry-run`` building the ``dflash`` / ``dspark`` drafter with the
exported ``d2t``/``t2d``, DFlash's layer set, the kit's block size and the target's mask token), and speculators'
own ``ArrowDataset`` reads the rows with the hidden states ``kimi-eagle extract --layout speculators --drafter
dflash`` wrote, which its drafters then train on for a step.

Facts checked here come from speculators 0.9.0 (``speculators/models/dflash``, ``speculators/train``); the kit's
DFlash defaults are :mod:`kimi_eagle.eagle3.dflash_config`. Skipped, with the reason, only when speculators cannot
be imported. All of it runs on CPU (``sdpa`` attention: flex attention has no CPU backward)."""
from __future__ import annotations

import json
import os
import random
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from kimi_eagle.apps.interop.configs import BLOCK_HIDDEN_DIR, BLOCK_RECIPES, KIMI_K25, dflash_table
from kimi_eagle.apps.interop.export_data import export_data
from kimi_eagle.assets import stories_dir
from kimi_eagle.eagle3.dflash_config import BLOCK_SIZE, KIMI_MASK_TOKEN_ID, dflash_layer_ids, mask_token_id
from kimi_eagle.eagle3.extract import extract
from kimi_eagle.eagle3.layouts import arrow_rows
from kimi_eagle.io import write_jsonl

DRAFT = 256
BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[1]
N_LAYERS = 5  # stories260K
KINDS = tuple(BLOCK_RECIPES)  # dflash, dspark


def block_ids() -> list[int]:
    """DFlash's layer set for stories260K in speculators' capture-before convention (block output i -> i + 1)."""
    return [i + 1 for i in dflash_layer_ids(N_LAYERS)]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """stories260K-sized rows exported for speculators (draft vocabulary 256) and DFlash's hidden states extracted
    into ``hidden_states_dflash`` by the kit (what ``generate-offline-data`` writes from vLLM)."""
    pytest.importorskip("speculators", reason="speculators is not installed (pip install --no-deps -r requirements-interop.txt)")
    r = random.Random(1)
    rows = [{"id": f"r{i}", "input_ids": [1] + [r.randrange(3, 512) for _ in range(30 + i)],
             "loss_mask": [0] * 6 + [1] * (25 + i)} for i in range(12)]
    root = tmp_path_factory.mktemp("block_handoff")
    src = write_jsonl(root / "rows.jsonl", rows)
    spec = root / "speculators"
    export_data(src, "speculators", spec, vocab_size=512, draft_vocab_size=DRAFT, target=str(stories_dir()),
                n_layers=N_LAYERS, hidden_size=64)
    extract(stories_dir(), arrow_rows(spec), spec / BLOCK_HIDDEN_DIR, layout="speculators", drafter="dflash",
            dtype="bf16", rows_source=spec)
    return root


@pytest.fixture(scope="module")
def calls(exported):
    """Each ``speculators_{kind}.sh`` run by the real shell, every ``speculators`` invocation recorded as its argv."""
    out = {}
    for kind in KINDS:
        log = exported / f"calls-{kind}.jsonl"
        record = f'{shlex.quote(sys.executable)} -c "import json,sys; print(json.dumps(sys.argv[1:]))" "$@" >> {shlex.quote(str(log))}'
        script = exported / "speculators" / f"speculators_{kind}.sh"
        done = subprocess.run(["sh", "-c", f"speculators() {{ {record}; }}\n. {shlex.quote(str(script))}\n"],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        out[kind] = [json.loads(line) for line in log.read_text().splitlines()]
        assert [c[0] for c in out[kind]] == ["generate-offline-data", "train"]
    return out


def speculators_cli(args: list[str], cwd: Path):
    return subprocess.run([str(BIN / "speculators"), *args], capture_output=True, text=True, timeout=600, cwd=cwd,
                          env={**os.environ})


@pytest.mark.parametrize("kind", KINDS)
def test_train_line_resolves_to_the_kits_block_drafter(calls, kind):
    """speculators' own resolver takes every flag: the type, DFlash's layer set (capture-before ids), the kit's block
    size (not the CLI's 16 for dflash), the target's mask token, the export's draft vocabulary and hidden states."""
    from speculators.train.config import TrainConfig

    args = calls[kind][1][1:]
    flat = TrainConfig.resolve(args).flatten()
    assert flat["speculator_type"] == kind and flat["draft_vocab_size"] == DRAFT
    assert flat["target_layer_ids"] == block_ids() == [1, 2, 3, 4, 5]
    assert flat["block_size"] == BLOCK_SIZE == 8
    assert flat["mask_token_id"] == mask_token_id(stories_dir()) == 2  # stories260K: no pad, so its eos
    assert flat["hidden_states_path"].endswith(BLOCK_HIDDEN_DIR)
    assert TrainConfig.resolve([a for a in args if a not in ("--block-size", "8")]).flatten()["block_size"] == (
        16 if kind == "dflash" else 8)  # speculators' own default: why the line pins it
    with pytest.raises(SystemExit) as e:
        TrainConfig.resolve([*args, "--no-such-flag", "1"])
    assert e.value.code == 2


@pytest.mark.parametrize("kind", KINDS)
def test_generate_offline_data_line_parses_with_speculators_own_options(calls, exported, kind):
    import typer
    from speculators.cli import app

    group = typer.main.get_command(app)
    command = group.get_command(group.context_class(group), "generate-offline-data")
    params = command.make_context("generate-offline-data", calls[kind][0][1:]).params
    assert params["preprocessed_data"] == str(exported / "speculators")
    assert params["output"] == str(exported / "speculators" / BLOCK_HIDDEN_DIR) and params["validate_outputs"] is True


@pytest.mark.parametrize("kind", KINDS)
def test_dump_config_through_the_cli(calls, tmp_path, kind):
    import yaml

    done = speculators_cli([*calls[kind][1], "--dump-config"], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    text = json.dumps(yaml.safe_load(done.stdout))
    assert f'"speculator_type": "{kind}"' in text and '"block_size": 8' in text and '"mask_token_id": 2' in text


@pytest.fixture(scope="module")
def dry_runs(calls, exported):
    """``speculators train --dry-run`` of both emitted lines (only ``--save-path`` moved): the saved drafters."""
    out = {}
    for kind in KINDS:
        save = exported / f"dry-{kind}"
        done = speculators_cli([*calls[kind][1], "--dry-run", "--save-path", str(save)], exported)
        assert done.returncode == 0, done.stderr[-3000:]
        out[kind] = save
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_dry_run_builds_the_block_drafter_from_the_kits_files(dry_runs, exported, kind):
    """The saved config names the kit's layer set, block size and mask token; the saved vocabulary maps are the
    exported ``d2t``/``t2d``."""
    from safetensors.torch import load_file

    cfg = json.loads((dry_runs[kind] / "config.json").read_text())
    assert cfg["speculators_model_type"] == kind and cfg["draft_vocab_size"] == DRAFT
    assert cfg["aux_hidden_state_layer_ids"] == block_ids()
    assert (cfg["block_size"], cfg["mask_token_id"]) == (BLOCK_SIZE, 2)
    assert cfg["sample_from_anchor"] is (kind == "dspark")  # speculators' defaults: dspark drafts the anchor too
    weights = load_file(str(dry_runs[kind] / "model.safetensors"))
    spec = exported / "speculators"
    assert torch.equal(weights["d2t"], torch.from_numpy(np.load(spec / f"d2t-{DRAFT}.npy")))
    assert torch.equal(weights["t2d"], torch.from_numpy(np.load(spec / f"t2d-{DRAFT}.npy")))


def dataset(exported):
    from hs_connectors import FileTransfer
    from speculators.train.data import ArrowDataset

    spec = exported / "speculators"
    return ArrowDataset(max_len=1 << 30, datapath=str(spec), transfer=FileTransfer(spec / BLOCK_HIDDEN_DIR),
                        on_missing="raise", hidden_states_dtype=torch.float32)


def test_speculators_dataset_reads_the_kits_rows_and_dflash_hidden_states(exported):
    """speculators' ``ArrowDataset`` reads every row with its file: the row's exact IDs and loss mask, DFlash's 5
    layers concatenated, and the last block's output as ``verifier_last_hidden_states``. The layers are the target's
    own block outputs (HF ``output_hidden_states[i + 1]``, computed here independently of the extraction)."""
    from transformers import AutoModelForCausalLM

    ds, rows = dataset(exported), arrow_rows(exported / "speculators")
    model = AutoModelForCausalLM.from_pretrained(str(stories_dir()), dtype=torch.float32).eval()
    assert len(ds) == len(rows) == 12
    for k in (0, 11):
        item = ds[k]
        t = len(rows[k].input_ids)
        assert item["input_ids"].tolist() == rows[k].input_ids and item["loss_mask"].tolist() == rows[k].loss_mask
        assert tuple(item["hidden_states"].shape) == (t, 5 * 64) and tuple(item["verifier_last_hidden_states"].shape) == (t, 64)
        with torch.no_grad():
            hs = model(torch.tensor([rows[k].input_ids]), output_hidden_states=True).hidden_states
        layers = item["hidden_states"].float().reshape(t, 5, 64)  # the loader casts in its collate, not here
        for j, block in enumerate(dflash_layer_ids(N_LAYERS)[:-1]):  # the last block's HF entry is after the norm
            torch.testing.assert_close(layers[:, j], hs[block + 1][0], atol=0.05, rtol=0.02)  # stored in bf16
        torch.testing.assert_close(item["verifier_last_hidden_states"].float(), layers[:, -1])  # block 4 = the last block


def test_the_kit_reads_its_dflash_speculators_dump(exported):
    """``kimi-eagle train``/``evaluate``'s reader takes the same files: 5 aux layers, the final state normed."""
    from kimi_eagle.eagle3.readers import open_hidden_states

    data = open_hidden_states(exported / "speculators" / BLOCK_HIDDEN_DIR, stories_dir())
    assert list(data.layer_ids) == list(dflash_layer_ids(N_LAYERS)) and len(data) == 12
    item = data[3]
    assert tuple(item["aux"].shape) == (len(item["input_ids"]), 5 * 64) and tuple(item["final"].shape) == (len(item["input_ids"]), 64)


@pytest.mark.parametrize("kind", KINDS)
def test_speculators_block_drafter_trains_a_step_on_the_kits_rows(dry_runs, exported, kind):
    """The dry-run drafter, loaded by speculators' own ``from_pretrained`` the way its CLI does (``sdpa``), takes a
    packed batch of the kit's rows from its ``CollateFn`` and gives a finite loss whose gradient reaches ``fc``."""
    from speculators import SpeculatorModel
    from speculators.train.data import CollateFn

    cls = SpeculatorModel.registry[kind]
    config = cls.config_class.from_pretrained(str(dry_runs[kind]))
    config.transformer_layer_config._attn_implementation = "sdpa"
    model = cls.from_pretrained(str(dry_runs[kind]), config=config, verifier=str(stories_dir())).float().train()
    ds = dataset(exported)
    items = [ds[i] for i in range(4)]
    total = sum(int(it["input_ids"].shape[0]) for it in items)
    batch = CollateFn(max_len=total, hidden_size=64, num_target_layers=5, dtype=torch.float32)(items)
    batch.pop("error_records", None)
    loss_fn = "ce" if kind == "dflash" else "kl_div"
    weight = "dpace" if kind == "dflash" else "fixed-exp-decay"
    kwargs, _ = cls.get_trainer_kwargs(loss_fn=loss_fn, loss_implementation="eager", per_position_loss_weight=weight,
                                       max_anchors=32)
    torch.manual_seed(0)
    _, loss, _ = model(**batch, **kwargs)
    loss.backward()
    assert torch.isfinite(loss.detach()) and float(loss.detach()) > 0
    assert model.fc.weight.grad is not None and float(model.fc.weight.grad.abs().sum()) > 0


def test_layer_ids_json_and_kimi_values():
    """The convention table the export writes for DFlash, and Kimi-K2.5's values (61 layers, ``[PAD]`` mask)."""
    t = dflash_table(KIMI_K25["n_layers"], KIMI_MASK_TOKEN_ID)
    assert t["kimi_block_output"] == [1, 15, 30, 44, 58] and t["vllm_speculators"] == [2, 16, 31, 45, 59]
    assert t["speculators_file_layers"] == [2, 16, 31, 45, 59, 61] and t["mask_token_id"] == 163839


def test_layer_ids_json_written_with_the_export(exported):
    table = json.loads((exported / "speculators" / "layer_ids.json").read_text())
    assert table["dflash"] == dflash_table(N_LAYERS, 2)
    assert table["kimi_block_output"] == [1, 2, 3]  # EAGLE-3's entries unchanged


def test_runbook_names_the_block_drafter_lines():
    docs = (ROOT / "docs" / "scale.md").read_text()
    for needle in ("speculators_dflash.sh", "speculators_dspark.sh", "--drafter dflash", "--speculator-type dspark",
                   "1, 12, 24, 35, 47, 58"):
        assert needle in docs, needle


@pytest.mark.parametrize("kind", KINDS)
def test_the_benchmark_peer_is_the_block_drafter_the_runbook_trains(dry_runs, exported, tmp_path, kind):
    """bench/peer_trainer.py's speculators block drafter (``peer.build_block_model``) has the architecture the
    emitted ``speculators train`` line builds (compared on speculators' own saved configs)."""
    from kimi_eagle.apps.interop.peer import BlockPeerConfig, build_block_model

    runbook = json.loads((dry_runs[kind] / "config.json").read_text())
    cfg = BlockPeerConfig(str(exported / "speculators"), str(stories_dir()), kind, DRAFT)
    build_block_model(cfg, dflash_layer_ids(N_LAYERS), mask_token_id(stories_dir())).save_pretrained(str(tmp_path / "peer"))
    bench = json.loads((tmp_path / "peer" / "config.json").read_text())
    keys = ("speculators_model_type", "aux_hidden_state_layer_ids", "block_size", "mask_token_id", "draft_vocab_size",
            "sample_from_anchor", "sliding_window_non_causal")
    assert {k: bench[k] for k in keys} == {k: runbook[k] for k in keys}
    layer = ("layer_types", "sliding_window", "hidden_size", "num_attention_heads", "intermediate_size", "num_hidden_layers")
    assert {k: bench["transformer_layer_config"][k] for k in layer} == {k: runbook["transformer_layer_config"][k] for k in layer}


def test_extract_cli_writes_dflash_layers_and_names_the_mask_token(exported, tmp_path, capsys):
    """``kimi-eagle extract --layout speculators --drafter dflash``: DFlash's layer set in the files (5 layers, then the
    last block), the capture-before ids and the mask token the train line needs, on one JSON line."""
    from safetensors import safe_open

    from kimi_eagle.apps.cli import main

    out = tmp_path / "hs"
    assert main(["extract", "--target", str(stories_dir()), "--data", str(exported / "speculators"), "-o", str(out),
                 "--layout", "speculators", "--drafter", "dflash"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["layer_ids"] == list(dflash_layer_ids(N_LAYERS)) and summary["trainer_layer_ids"] == block_ids() + [N_LAYERS]
    assert (summary["mask_token_id"], summary["block_size"], summary["written"]) == (2, BLOCK_SIZE, 12)
    with safe_open(str(out / "hs_0.safetensors"), "pt") as f:
        assert f.get_slice("hidden_states").get_shape() == [31, 6, 64]


# ---- the kit's DFlash held to speculators' DFlashDraftModel (issue 45) ----

SPEC_LAYERS = (0, 1, 2, 3, 4)  # DFlash's stories260K layer set (block outputs); capture-before ids 1..5
SPEC_SENTENCE = [1, 403, 407, 261, 378, 275, 263, 380, 31, 315, 386, 338, 290, 429, 270, 263, 380, 31, 315, 386,
                 263, 380, 401, 275, 290, 31, 386, 429]


@pytest.fixture(scope="module")
def spec_batch():
    """One stories260K row (prompt 6 tokens, the rest supervised) with the kit's aux/final and speculators' inputs."""
    pytest.importorskip("speculators", reason="speculators is not installed (pip install --no-deps -r requirements-interop.txt)")
    from kimi_eagle.eagle3.hidden import Extractor, load_target

    target = load_target(stories_dir())
    ex = Extractor(target, SPEC_LAYERS)
    ids = torch.tensor([SPEC_SENTENCE])
    aux, final = ex(ids)
    ex.close()
    mask = torch.ones_like(ids)
    mask[:, :6] = 0
    aux, final = aux.float().clone(), final.float().clone()  # plain tensors (the extractor runs in inference mode)
    return {"target": target, "ids": ids, "aux": aux, "final": final, "mask": mask,
            "last": aux[..., -64:].clone()}  # block 4 = the last block, before the final norm (speculators' input)


def kit_dflash(target, recipe_name: str, weighting: str | None = None, seed: int = 3):
    """A kit DFlash drafter under ``recipe_name`` (block 4, 2 draft layers to stay small) and its loss."""
    from kimi_eagle.eagle3 import draft_vocab, recipes
    from kimi_eagle.eagle3.dflash import BlockSpec
    from kimi_eagle.eagle3.train import TrainConfig

    cfg = recipes.resolve(TrainConfig("", "", "", drafter="dflash", dflash_recipe=recipe_name, dflash_weighting=weighting,
                                      block_size=4, draft_layers=2, seed=seed))
    vocab = draft_vocab.build(torch.arange(512).flip(0), 100)
    block = BlockSpec(cfg.block_size, 2, cfg.draft_layers)
    r = recipes.recipe("dflash", recipe_name)
    drafter, loss = recipes.dflash_with_loss(target.config, target.model.embed_tokens.weight.detach(),
                                             target.lm_head.weight.detach(), vocab, SPEC_LAYERS, block,
                                             recipes.objective(cfg), seed, r.freeze_lm_head)
    return drafter, loss


def speculators_from_kit(drafter, tmp_path):
    """speculators' own ``DFlashDraftModel`` holding the kit drafter's weights: the kit's speculators export read by
    ``from_pretrained`` (speculators reloads the embeddings, verifier head and norm from the verifier)."""
    from speculators.models.dflash import DFlashDraftModel, DFlashSpeculatorConfig

    from kimi_eagle.apps.interop.speculators import export_speculators

    drafter.save(tmp_path / "kit")
    export_speculators(tmp_path / "kit", tmp_path / "spec", verifier=str(stories_dir()))
    config = DFlashSpeculatorConfig.from_pretrained(str(tmp_path / "spec"))
    config.transformer_layer_config._attn_implementation = "eager"
    return DFlashDraftModel.from_pretrained(str(tmp_path / "spec"), config=config).float()


def spec_inputs(b):
    return {"hidden_states": b["aux"], "input_ids": b["ids"], "loss_mask": b["mask"],
            "verifier_last_hidden_states": b["last"], "document_ids": torch.zeros_like(b["ids"])}


def valid_anchor_count(b, block_size: int) -> int:
    mask = b["mask"].bool().clone()
    mask[:, -block_size:] = False
    return int(mask.sum())


def test_an_exported_kit_dflash_drafter_gives_speculators_the_same_logits(spec_batch, tmp_path):
    """``export --engine speculators`` of a kit DFlash drafter loads in speculators' ``DFlashDraftModel`` (its own
    ``from_pretrained``): every block's logits equal the kit's within 1e-5, and speculators' targets are the kit's
    soft-target logits."""
    from kimi_eagle.eagle3.losses import sampled_anchors

    b = spec_batch
    drafter, _ = kit_dflash(b["target"], "speculators")
    peer = speculators_from_kit(drafter.eval(), tmp_path).eval()
    assert json.loads((tmp_path / "spec" / "config.json").read_text())["aux_hidden_state_layer_ids"] == [1, 2, 3, 4, 5]
    n = valid_anchor_count(b, 4)
    with torch.no_grad():
        _, logits, targets, mask, _ = peer._backbone_forward(**spec_inputs(b), max_anchors=n)
        anchors, valid = sampled_anchors(b["mask"], 4, 512)
        assert anchors.numel() == n and bool(valid.all())
        kit = drafter(b["aux"], b["ids"], anchors)
    torch.testing.assert_close(logits.view(1, n, 4, -1), kit, rtol=1e-5, atol=1e-5)
    head = b["target"].lm_head.weight[drafter.draft_to_target]
    index = (anchors[:, None] + torch.arange(4) - 1).flatten()
    torch.testing.assert_close(targets[0], b["final"][0, index] @ head.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("weighting", ["dpace", "exp"])
def test_the_speculators_recipe_gives_speculators_loss_and_gradients(spec_batch, tmp_path, weighting):
    """The same weights and batch through the kit's ``DFlashLoss`` under ``--dflash-recipe speculators`` and through
    speculators' ``DFlashDraftModel.forward`` (``ce`` loss, eager; D-PACE or ``fixed-exp-decay`` γ = 4): the same loss
    and the same gradient on every trained weight (``lm_head`` frozen in both)."""
    from speculators.losses import resolve_loss_config

    b = spec_batch
    drafter, loss_fn = kit_dflash(b["target"], "speculators", weighting)
    peer = speculators_from_kit(drafter, tmp_path).train()
    assert not drafter.lm_head.weight.requires_grad and not peer.lm_head.weight.requires_grad
    kit_loss, stats = loss_fn(b["aux"], b["ids"], b["mask"], b["final"])
    kit_loss.backward()
    _, peer_loss, metrics = peer(**spec_inputs(b), loss_config=resolve_loss_config("ce", "eager"), gamma=4.0,
                                 max_anchors=valid_anchor_count(b, 4), dpace_alpha=0.5,
                                 per_position_loss_weight="dpace" if weighting == "dpace" else "fixed-exp-decay")
    peer_loss.backward()
    assert float(kit_loss.detach()) == pytest.approx(float(peer_loss.detach()), rel=1e-5)
    assert float(stats[:, 2].sum()) == float(metrics["full_acc_total"])  # the same supervised slots
    assert float(stats[:, 1].sum()) == float(metrics["full_acc_sum"])  # the same argmax agreements
    peer_params = dict(peer.named_parameters())
    checked = 0
    for name, p in drafter.named_parameters():
        if not p.requires_grad:
            continue
        g, h = p.grad.flatten(), peer_params[name].grad.flatten()
        torch.testing.assert_close(g, h, rtol=1e-4, atol=1e-6)
        assert float(torch.nn.functional.cosine_similarity(g, h, dim=0)) > 0.99999 or float(g.norm()) == 0
        checked += 1
    assert checked == len([p for p in drafter.parameters() if p.requires_grad]) > 10
