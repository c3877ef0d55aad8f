"""The hand-off runs as written: every line of the emitted ``speculators.sh`` goes through speculators' own CLI
(its argument parsers, ``--dump-config``, ``speculators train --dry-run`` building the drafter with the exported
``d2t``/``t2d``, read back by the kit's ``load_drafter``), and both SpecForge YAMLs through SpecForge's schema,
``specforge train --plan`` and its own draft-model builder (draft vocabulary 256, not SpecForge's 32,000).

A flag that does not exist or is refused fails a test. Skipped, with the reason, only when a trainer cannot be
imported (installed by ``make install`` from requirements-interop.txt). All of it runs on CPU."""
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
import yaml

from kimi_eagle.apps.interop.configs import RECIPE, SPECFORGE_FILL, SPECULATORS_FILL
from kimi_eagle.apps.interop.export_data import export_data
from kimi_eagle.assets import stories_dir
from kimi_eagle.eagle3.layers import convention_table
from kimi_eagle.eagle3.model import load_drafter
from kimi_eagle.io import write_jsonl

DRAFT = 256  # not SpecForge's generated 32,000 (and below stories260K's 512)
BIN = Path(sys.executable).parent
MOONCAKE = {"MOONCAKE_METADATA_SERVER": "http://mooncake-meta.test:8080/metadata",
            "MOONCAKE_MASTER_SERVER_ADDR": "mooncake-master.test:50051"}
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """stories260K-sized rows exported for both trainers with a 256-token draft vocabulary."""
    r = random.Random(0)
    rows = [{"id": f"r{i}", "input_ids": [1] + [r.randrange(3, 512) for _ in range(30)], "loss_mask": [0] * 6 + [1] * 25}
            for i in range(16)]
    root = tmp_path_factory.mktemp("handoff")
    src = write_jsonl(root / "rows.jsonl", rows)
    for to in ("speculators", "specforge"):
        export_data(src, to, root / to, vocab_size=512, draft_vocab_size=DRAFT, target=str(stories_dir()),
                    n_layers=5, hidden_size=64)
    return root


def trainer_cli(name: str, args: list[str], env: dict | None = None, cwd: Path | None = None):
    return subprocess.run([str(BIN / name), *args], capture_output=True, text=True, timeout=600, cwd=cwd,
                          env={**os.environ, **(env or {})})


# ------------------------------------------------------------------------------------------
# speculators


@pytest.fixture(scope="module")
def script_calls(exported):
    """Run ``speculators.sh`` with the real shell (``set -e``, its quoting and variables); each ``speculators``
    invocation is recorded as its argv instead of starting vLLM or a GPU run."""
    pytest.importorskip("speculators", reason="speculators is not installed (pip install --no-deps -r requirements-interop.txt)")
    log = exported / "calls.jsonl"
    record = f'{shlex.quote(sys.executable)} -c "import json,sys; print(json.dumps(sys.argv[1:]))" "$@" >> {shlex.quote(str(log))}'
    shell = f'speculators() {{ {record}; }}\n. {shlex.quote(str(exported / "speculators" / "speculators.sh"))}\n'
    done = subprocess.run(["sh", "-c", shell], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [c[0] for c in calls] == ["generate-offline-data", "train"]
    return calls


def offline_data_command():
    import typer
    from speculators.cli import app

    group = typer.main.get_command(app)
    return group.get_command(group.context_class(group), "generate-offline-data")


def test_generate_offline_data_line_parses_with_speculators_own_options(script_calls, exported):
    command = offline_data_command()
    params = command.make_context("generate-offline-data", script_calls[0][1:]).params
    assert params["validate_outputs"] is True
    assert params["preprocessed_data"] == str(exported / "speculators")
    assert params["output"] == str(exported / "speculators" / "hidden_states")
    assert params["endpoint"] == "http://localhost:8000/v1" and params["model"] == str(stories_dir())
    # the check can fail: the value the kit once emitted after the flag is refused by the same parser
    with pytest.raises(Exception, match="unexpected extra argument"):
        command.make_context("generate-offline-data", [*script_calls[0][1:], "true"])


def test_train_line_resolves_and_every_flag_exists(script_calls):
    from speculators.train.config import TrainConfig

    args = script_calls[1][1:]
    flat = TrainConfig.resolve(args).flatten()
    assert flat["speculator_type"] == "eagle3" and flat["draft_vocab_size"] == DRAFT
    assert flat["target_layer_ids"] == convention_table(5)["vllm_speculators"]
    assert (flat["norm_before_residual"], flat["norm_before_fc"], flat["norm_output"]) == (False, False, False)
    assert flat["full_attention_indices"] == [0] and flat["ttt_steps"] == RECIPE.ttt_steps
    assert flat["ttt_step_loss_decay"] == RECIPE.ttt_step_loss_decay
    with pytest.raises(SystemExit) as e:  # an unknown flag is refused by the same resolver
        TrainConfig.resolve([*args, "--no-such-flag", "1"])
    assert e.value.code == 2


def test_train_line_dump_config_through_the_cli(script_calls, tmp_path):
    done = trainer_cli("speculators", [*script_calls[1], "--dump-config"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    dumped = yaml.safe_load(done.stdout)
    text = json.dumps(dumped)
    assert f'"draft_vocab_size": {DRAFT}' in text and '"norm_before_residual": false' in text


@pytest.fixture(scope="module")
def dry_run(script_calls, exported):
    """``speculators train --dry-run``: the emitted line, only ``--save-path`` moved; the saved drafter's folder."""
    save = exported / "dry"
    done = trainer_cli("speculators", [*script_calls[1], "--dry-run", "--save-path", str(save)], cwd=exported)
    assert done.returncode == 0, done.stderr[-3000:]
    return save


def test_train_line_dry_run_builds_the_drafter_the_kit_reads(script_calls, dry_run, exported, tmp_path):
    """The dry run builds and saves the drafter with the exported ``d2t``/``t2d``; ``load_drafter`` (hence
    ``kimi-eagle evaluate``) reads it as it is. Without the recipe's flags (speculators' defaults) the kit
    refuses the checkpoint: the flags matter."""
    kit = load_drafter(dry_run, stories_dir())
    spec = exported / "speculators"
    assert torch.equal(kit.d2t, torch.from_numpy(np.load(spec / f"d2t-{DRAFT}.npy")))
    assert torch.equal(kit.t2d, torch.from_numpy(np.load(spec / f"t2d-{DRAFT}.npy")))
    assert kit.config.aux_layer_ids == convention_table(5)["kimi_block_output"] and kit.config.draft_vocab_size == DRAFT
    defaults = [a for a in script_calls[1] if a not in RECIPE.flags()]
    save = tmp_path / "dry-defaults"
    done = trainer_cli("speculators", [*defaults, "--dry-run", "--save-path", str(save)], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    with pytest.raises(ValueError, match="norm_before_residual"):
        load_drafter(save, stories_dir())


def test_speculators_script_marks_what_to_fill(exported):
    text = (exported / "speculators" / "speculators.sh").read_text()
    docs = (ROOT / "docs" / "scale.md").read_text()
    for key, _ in SPECULATORS_FILL:
        assert f"{key}=${{{key}:-" in text and f"`{key}`" in docs


# ------------------------------------------------------------------------------------------
# SpecForge


def specforge_yaml(exported, name):
    pytest.importorskip("specforge.config", reason="SpecForge is not installed (pip install --no-deps -r requirements-interop.txt)")
    return exported / "specforge" / name


@pytest.mark.parametrize("name", ["specforge.yaml", "specforge_offline.yaml"])
def test_specforge_plan_accepts_both_yamls(exported, name):
    path = specforge_yaml(exported, name)
    done = trainer_cli("specforge", ["train", "--config", str(path), "--plan"], env=MOONCAKE, cwd=exported)
    assert done.returncode == 0, done.stderr[-2000:]
    plan = json.loads(done.stdout)
    if name == "specforge.yaml":
        assert [c["label"] for c in plan["commands"]] == ["producer", "consumer"]
        assert all(c["env"]["MOONCAKE_METADATA_SERVER"] == MOONCAKE["MOONCAKE_METADATA_SERVER"] for c in plan["commands"])
    else:
        assert plan["kind"] == "worker"


def test_online_yaml_needs_the_mooncake_endpoints_it_marks(exported):
    path = specforge_yaml(exported, "specforge.yaml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOONCAKE_")}
    done = subprocess.run([str(BIN / "specforge"), "train", "--config", str(path), "--plan"], capture_output=True,
                          text=True, timeout=600, env=env, cwd=exported)
    assert done.returncode != 0 and all(k in done.stderr for k in MOONCAKE)
    text = path.read_text()
    docs = (ROOT / "docs" / "scale.md").read_text()
    for key, _ in SPECFORGE_FILL:
        leaf = key.rsplit(".", 1)[1]
        assert f"#   {key}:" in text and any(line.strip().startswith(f"{leaf}:") and line.endswith("# FILL")
                                              for line in text.splitlines())
        assert f"`{leaf}`" in docs
    assert all(f"`{k}`" in docs for k in MOONCAKE)


def specforge_draft(path, draft_model_config: str | None = "keep"):
    from specforge.application import resolve_run
    from specforge.config import load_config
    from specforge.training.model_loading import resolve_draft_config

    cfg = load_config(str(path), [])
    if draft_model_config != "keep":
        cfg.model.draft_model_config = draft_model_config
    provider = resolve_run(cfg).algorithm.providers.model
    draft_config = resolve_draft_config(cfg, provider=provider.draft_config)
    return cfg, provider, draft_config, provider.build_draft(cfg, draft_config)


@pytest.mark.parametrize("name", ["specforge.yaml", "specforge_offline.yaml"])
def test_specforge_builds_its_draft_from_the_exported_config(exported, name, monkeypatch):
    """SpecForge's own resolver and builder (what ``specforge train`` runs before its GPU loop) take the emitted
    ``draft_config.json`` and load ``vocab_mapping.pt`` into the drafter; without the config SpecForge's generated
    32,000-token draft vocabulary refuses the 256-token mapping, as it did before the config was emitted."""
    for k, v in MOONCAKE.items():
        monkeypatch.setenv(k, v)
    path = specforge_yaml(exported, name)
    cfg, provider, draft_config, draft = specforge_draft(path)
    from transformers import AutoConfig

    target = AutoConfig.from_pretrained(str(stories_dir()))
    table = convention_table(5)
    assert (draft_config.draft_vocab_size, draft_config.vocab_size, draft_config.hidden_size) == (DRAFT, 512, 64)
    assert draft_config.eagle_config["eagle_aux_hidden_state_layer_ids"] == table["sglang_specforge"]
    assert provider.resolve_capture_layers(cfg, draft_config, target) == table["sglang_specforge"]
    mapping = torch.load(exported / "specforge" / "vocab_mapping.pt", weights_only=True)
    assert torch.equal(draft.d2t, mapping["d2t"]) and torch.equal(draft.t2d, mapping["t2d"])
    with pytest.raises(RuntimeError, match="32000"):
        specforge_draft(path, None)


def test_the_benchmark_peer_is_the_drafter_the_runbook_trains(dry_run, exported, tmp_path):
    """bench/peer_trainer.py's speculators model (``peer.build_model`` with ``RECIPE``) has the architecture the
    emitted ``speculators train`` line builds (compared on speculators' own saved configs)."""
    from kimi_eagle.apps.interop.peer import PeerConfig, build_model

    runbook = json.loads((dry_run / "config.json").read_text())
    peer = build_model(PeerConfig(str(exported / "speculators"), str(stories_dir()), "", draft_vocab_size=DRAFT),
                       convention_table(5)["kimi_block_output"])
    peer.save_pretrained(str(tmp_path / "peer"))
    bench = json.loads((tmp_path / "peer" / "config.json").read_text())
    keys = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output", "draft_vocab_size",
            "eagle_aux_hidden_state_layer_ids", "embed_requires_grad")
    assert {k: bench[k] for k in keys} == {k: runbook[k] for k in keys}
    layer = ("layer_types", "sliding_window", "hidden_size", "num_attention_heads", "intermediate_size", "num_hidden_layers")
    assert {k: bench["transformer_layer_config"][k] for k in layer} == {k: runbook["transformer_layer_config"][k] for k in layer}
    assert bench["speculators_config"]["proposal_methods"] == runbook["speculators_config"]["proposal_methods"]


def test_without_a_target_config_the_draft_config_still_fixes_the_vocabularies(exported, tmp_path):
    """An export without ``--target`` (sizes given by flags) writes the facts it knows; SpecForge's own loader
    takes that config with the export's draft vocabulary, target vocabulary, hidden size and layer ids."""
    pytest.importorskip("specforge.config", reason="SpecForge is not installed (pip install --no-deps -r requirements-interop.txt)")
    from specforge.training.model_loading import load_draft_config_source

    from kimi_eagle.apps.interop.configs import draft_model_config

    path = tmp_path / "draft_config.json"
    path.write_text(json.dumps(draft_model_config(None, n_layers=61, hidden_size=7168, vocab_size=163840,
                                                  draft_vocab_size=DRAFT)))
    loaded = load_draft_config_source(str(path))
    assert (loaded.draft_vocab_size, loaded.vocab_size, loaded.hidden_size) == (DRAFT, 163840, 7168)
    assert loaded.eagle_config["eagle_aux_hidden_state_layer_ids"] == convention_table(61)["sglang_specforge"] == [1, 29, 57]
