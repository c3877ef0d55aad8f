"""Hostile files for the EAGLE-3 commands (train, evaluate, export, extract) and SpecForge readers: every one a
one-line message naming the file (exit 2), refused before anything large is allocated.

Each case is named after what it plants. The drafter, checkpoint and hidden states are real: a two-step training
run of the stories260K target over four extracted rows."""
from __future__ import annotations

import gzip
import json
import pickle
import shutil
import time
import tracemalloc
from pathlib import Path

import pytest
import torch

from kimi_eagle.apps.cli import main
from kimi_eagle.assets import stories_dir
from kimi_eagle.eagle3.extract import extract
from kimi_eagle.eagle3.hidden import Row, check_prompts, row_from_obj, token_ids
from kimi_eagle.eagle3.readers import (
    DecompressedTooLarge,
    SpecForgeHiddenStates,
    load_specforge_file,
    read_gzip_bounded,
)
from kimi_eagle.eagle3.train import TrainConfig, train_drafter

TARGET = str(stories_dir())
TRAIN = ["--steps", "4", "--ttt-steps", "2", "--batch-size", "2", "--draft-vocab-size", "64", "--no-progress"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("trained")
    rows = [Row(f"r{i}", [1, 50 + i, 60, 70, 80, 90, 100, 110, 120, 130], [0, 0, 0, 1, 1, 1, 1, 1, 1, 1]) for i in range(4)]
    extract(TARGET, rows, root / "hs", dtype="bf16", shard_rows=4)
    train_drafter(TrainConfig(data=str(root / "hs"), target=TARGET, out=str(root / "run"), steps=2, ttt_steps=2,
                              batch_size=2, draft_vocab_size=64, save_every=100, log_every=1, progress=False))
    return root


def run_cli(argv, capsys) -> tuple[int, str]:
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    return rc, err.splitlines()[-1] if err else ""


def copy_run(trained, tmp_path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(trained / "run", run)
    return run


# ---- train --resume with a checkpoint that is not one ----

CHECKPOINTS = {
    "truncated_half": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "empty_file": lambda p: p.write_bytes(b""),
    "text_file": lambda p: p.write_text("not a checkpoint"),
    "wrong_keys": lambda p: torch.save({"nothing": 1}, p),
    "a_list": lambda p: torch.save([1, 2], p),
    "a_tensor": lambda p: torch.save(torch.zeros(3), p),
    "missing_the_optimizer": lambda p: torch.save({k: v for k, v in torch.load(p, weights_only=True).items()
                                                   if k != "optimizer"}, p),
    "pickled_callable": lambda p: p.write_bytes(pickle.dumps(print)),
}


@pytest.mark.parametrize("case", sorted(CHECKPOINTS))
def test_train_resume_refuses_a_checkpoint_that_is_not_one(trained, tmp_path, case, capsys):
    run = copy_run(trained, tmp_path)
    CHECKPOINTS[case](run / "checkpoint" / "last.pt")
    rc, last = run_cli(["train", str(trained / "hs"), "--target", TARGET, "-o", str(run), "--resume", *TRAIN], capsys)
    assert rc == 2 and "last.pt" in last, last


# ---- drafter folders (evaluate --draft, export) ----

def _config(trained) -> dict:
    return json.loads((trained / "run" / "drafter" / "config.json").read_text())


def _with_hidden(trained, value):
    raw = _config(trained)
    return json.dumps({**raw, "config": {**raw["config"], "hidden_size": value}})


DRAFTER_CONFIGS = {
    "a_json_string": lambda t: '"hello"',
    "a_json_list": lambda t: "[1, 2]",
    "a_json_number": lambda t: "7",
    "not_json": lambda t: "{format: kimi",
    "latin1_bytes": lambda t: b"\xff\xfe{}",
    "two_mib_config": lambda t: json.dumps({"pad": "x" * (2 << 20)}),
    "config_not_an_object": lambda t: json.dumps({**_config(t), "config": "big"}),
    "config_with_an_unknown_key": lambda t: json.dumps({**_config(t), "config": {**_config(t)["config"], "evil": 1}}),
    "config_missing_a_key": lambda t: json.dumps({**_config(t), "config": {k: v for k, v in _config(t)["config"].items()
                                                                            if k != "head_dim"}}),
    "hidden_size_200000": lambda t: _with_hidden(t, 200000),
    "hidden_size_zero": lambda t: _with_hidden(t, 0),
    "hidden_size_as_text": lambda t: _with_hidden(t, "64"),
    "hidden_size_true": lambda t: _with_hidden(t, True),
    "intermediate_size_10_billion": lambda t: json.dumps({**_config(t), "config": {**_config(t)["config"],
                                                                                    "intermediate_size": 10**10}}),
    "exported_config_without_sizes": lambda t: json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}),
    "neither_format": lambda t: json.dumps({"format": "something/9"}),
}
WEIGHTS = {
    "pickle_renamed_model_safetensors": pickle.dumps({"a": 1}),
    "empty_model_safetensors": b"",
    "random_bytes_model_safetensors": bytes(range(256)) * 8,
    "truncated_model_safetensors": None,  # filled from the real file
}


def _drafter(trained, tmp_path, config=None, weights=None) -> Path:
    d = copy_run(trained, tmp_path) / "drafter"
    if config is not None:
        (d / "config.json").write_bytes(config if isinstance(config, bytes) else config.encode())
    if weights is not None:
        (d / "model.safetensors").write_bytes(weights)
    return d


@pytest.mark.parametrize("command", ["evaluate", "export"])
@pytest.mark.parametrize("case", sorted(DRAFTER_CONFIGS))
def test_a_drafter_config_that_is_not_one_is_refused_before_allocating(trained, tmp_path, case, command, capsys):
    draft = _drafter(trained, tmp_path, config=DRAFTER_CONFIGS[case](trained))
    argv = (["evaluate", str(tmp_path / "p.jsonl"), "--target", TARGET, "--draft", str(draft), "--max-new-tokens", "2"]
            if command == "evaluate" else ["export", str(draft), "--engine", "sglang", "-o", str(tmp_path / "e")])
    (tmp_path / "p.jsonl").write_text(json.dumps({"id": "a", "prompt_ids": [1, 50, 60]}) + "\n")
    tracemalloc.start()
    rc, last = run_cli(argv, capsys)
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    assert rc == 2 and str(draft) in last, last
    assert peak < 300, f"{case}: {peak:.0f} MiB"


@pytest.mark.parametrize("case", sorted(WEIGHTS))
def test_weights_that_are_not_safetensors_are_refused_naming_the_file(trained, tmp_path, case, capsys):
    real = (trained / "run" / "drafter" / "model.safetensors").read_bytes()
    weights = WEIGHTS[case] if WEIGHTS[case] is not None else real[: len(real) // 2]
    draft = _drafter(trained, tmp_path, weights=weights)
    rc, last = run_cli(["export", str(draft), "--engine", "sglang", "-o", str(tmp_path / "e")], capsys)
    assert rc == 2 and "model.safetensors" in last, last


# ---- prompts and rows: IDs are integer token IDs of the target's vocabulary ----

PROMPTS = {
    "out_of_vocabulary_id": ([1, 50, 99999], "outside the vocabulary [0, 512)"),
    "negative_id": ([1, -4], "outside the vocabulary"),
    "float_id": ([1, 5.9], "is float, not an integer"),
    "bool_id": ([1, True], "is bool, not an integer"),
    "string_id": ([1, "7"], "is str, not an integer"),
    "ids_as_a_string": ("1,2,3", "must be a list of token IDs"),
}


@pytest.mark.parametrize("case", sorted(PROMPTS))
def test_evaluate_refuses_prompt_ids_that_are_not_the_targets(tmp_path, case, capsys):
    ids, message = PROMPTS[case]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "prompt_ids": ids}) + "\n")
    rc, last = run_cli(["evaluate", str(prompts), "--target", TARGET, "--max-new-tokens", "2", "--no-ngram"], capsys)
    assert rc == 2 and message in last, last


@pytest.mark.parametrize("planted,message", [
    ({"input_ids": [1, 2.5, 3], "loss_mask": [0, 1, 1]}, "input_ids[1] = 2.5 is float"),
    ({"input_ids": [1, True, 3], "loss_mask": [0, 1, 1]}, "input_ids[1] = True is bool"),
    ({"input_ids": [1, 2, 3], "loss_mask": [0, 0.5, 1]}, "loss_mask[1] = 0.5 is not 0 or 1"),
    ({"input_ids": [1, 2, 3], "loss_mask": [0, 2, 1]}, "loss_mask[1] = 2 is not 0 or 1"),
    ({"input_ids": [1, 2, 3], "loss_mask": [0, True, 1]}, "loss_mask[1] = True is not 0 or 1"),
    ({"prompt_ids": [1, "2"], "output_ids": [3, 4]}, "prompt_ids[1] = '2' is str"),
    ({"prompt_ids": [1, 2], "output_ids": [3, float("inf")]}, "output_ids[1] = inf is float"),
    ({"input_ids": "1 2 3"}, "must be a list of token IDs"),
])
def test_rows_with_ids_or_masks_that_would_be_coerced_are_refused(planted, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        row_from_obj({"id": "r", **planted}, 0)


def test_good_rows_and_prompts_pass_unchanged():
    assert row_from_obj({"id": "r", "input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}, 0) == Row("r", [1, 2, 3], [0, 1, 1])
    assert token_ids([0, 511], n_vocab=512) == [0, 511]
    check_prompts([("a", [1, 2])], 512)


def test_extract_skips_rows_with_coerced_ids_by_name(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(json.dumps(r) for r in [
        {"id": "good", "input_ids": [1, 50, 60, 70], "loss_mask": [0, 1, 1, 1]},
        {"id": "floaty", "input_ids": [1, 50.5, 60, 70], "loss_mask": [0, 1, 1, 1]}]) + "\n")
    rc, _ = run_cli(["extract", str(rows), "--target", TARGET, "-o", str(tmp_path / "x")], capsys)
    manifest = json.loads((tmp_path / "x" / "manifest.json").read_text())
    assert rc == 0 and manifest["n_rows"] == 1
    assert manifest["skipped"] == [{"index": 1, "id": "floaty",
                                    "reason": "input_ids[1] = 50.5 is float, not an integer token ID"}]


# ---- a target whose config.json is not an object ----

@pytest.mark.parametrize("command", ["train", "evaluate"])
@pytest.mark.parametrize("config", ["[1, 2]", '"llama"', "null"])
def test_a_target_whose_config_is_not_an_object_is_refused(trained, tmp_path, command, config, capsys):
    target = tmp_path / "target"
    shutil.copytree(TARGET, target)
    (target / "config.json").write_text(config)
    (tmp_path / "p.jsonl").write_text(json.dumps({"id": "a", "prompt_ids": [1, 50]}) + "\n")
    argv = (["train", str(trained / "hs"), "--target", str(target), "-o", str(tmp_path / "o"), *TRAIN]
            if command == "train" else ["evaluate", str(tmp_path / "p.jsonl"), "--target", str(target)])
    rc, last = run_cli(argv, capsys)
    assert rc == 2 and "config.json" in last and "must be a JSON object" in last, last


# ---- SpecForge hidden states: a gzip bomb ----

def _bomb(path: Path, mib: int) -> Path:
    with gzip.open(path, "wb", compresslevel=9) as f:
        block = bytes(1 << 20)
        for _ in range(mib):
            f.write(block)
    return path


def test_a_gzip_bomb_is_refused_after_its_limit_in_bounded_memory(tmp_path):
    bomb = _bomb(tmp_path / "data_0.ckpt.gz", 256)  # 256 MiB of zeros in about 250 KB
    assert bomb.stat().st_size < 1 << 20
    tracemalloc.start()
    t0 = time.monotonic()
    with pytest.raises(DecompressedTooLarge, match="refused as a gzip bomb"):
        load_specforge_file(bomb)
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    assert peak < 200 and time.monotonic() - t0 < 30


def test_a_gzip_bomb_among_hidden_states_is_skipped_with_its_reason(tmp_path):
    rows = tmp_path / "sf"
    rows.mkdir()
    _bomb(rows / "data_0.ckpt.gz", 80)
    reader = SpecForgeHiddenStates(rows, TARGET)
    assert len(reader) == 0 and "gzip bomb" in reader.skipped[0]["reason"]


def test_an_honest_gzip_file_reads_back(tmp_path):
    data = {"input_ids": torch.arange(5)}
    raw = tmp_path / "x.ckpt"
    torch.save(data, raw)
    packed = tmp_path / "x.ckpt.gz"
    packed.write_bytes(gzip.compress(raw.read_bytes()))
    assert torch.equal(load_specforge_file(packed)["input_ids"], data["input_ids"])
    assert read_gzip_bounded(packed, limit=raw.stat().st_size) == raw.read_bytes()
    with pytest.raises(DecompressedTooLarge):
        read_gzip_bounded(packed, limit=raw.stat().st_size - 1)
