"""Absurd options refused before any work (issue 48): each is one line naming the option, its value and its range
(exit 2), checked against the data it applies to (layers against the target's config, a drafter against the layer
set of its hidden states); unknown enumerated values are refused with the valid ones listed."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from kimi_eagle.apps.cli import main
from kimi_eagle.assets import stories_dir
from kimi_eagle.eagle3 import recipes
from kimi_eagle.eagle3.dflash_config import MaskTokenInvalid, mask_token_id
from kimi_eagle.eagle3.train import TrainConfig
from kimi_eagle.reconstruct.flags import ROW_FLAGS, is_row_flag

TRAIN = ["train", "hs", "--target", "t", "-o", "o", "--drafter", "dflash"]


@pytest.mark.parametrize("flag,value,bounds", [("--draft-layers", "1000", "[1, 64]"), ("--block-size", "100000", "[2, 64]"),
                                               ("--steps", str(10 ** 23), "[1, 1e+07]"), ("--block-size", "1", "[2, 64]")])
def test_train_refuses_an_absurd_size_naming_the_option_value_and_range(flag, value, bounds, capsys):
    with pytest.raises(SystemExit) as stop:
        main([*TRAIN, flag, value])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert stop.value.code == 2 and f"argument {flag}" in last and value in last and bounds in last, last


@pytest.mark.parametrize("setting,value", [("draft_layers", 1000), ("block_size", 100000), ("steps", 10 ** 23)])
def test_the_library_refuses_the_same_settings_before_reading_data(setting, value, tmp_path):
    cfg = TrainConfig(data=str(tmp_path / "missing"), target=str(tmp_path), out=str(tmp_path / "o"), drafter="dflash",
                      **{setting: value})
    with pytest.raises(ValueError, match=re.escape(f"--{setting.replace('_', '-')} {value!r}: outside")):
        recipes.resolve(cfg)


def _rows(tmp_path) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"id": "a", "input_ids": [1, 2, 3, 4], "loss_mask": [0, 0, 1, 1]}) + "\n")
    return path


def _export(tmp_path, *extra, target=None, to="speculators"):
    return main(["export-data", str(_rows(tmp_path)), "--to", to, "-o", str(tmp_path / "out"),
                 "--target", str(target or stories_dir()), *extra])


def test_export_data_refuses_layers_the_target_does_not_have(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        _export(tmp_path, "--n-layers", "1000000")
    assert stop.value.code == 2 and "argument --n-layers" in capsys.readouterr().err
    assert _export(tmp_path, "--n-layers", "6") == 2  # stories260K has 5 layers
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--n-layers 6" in err and "has 5" in err, err
    assert not (tmp_path / "out").exists()  # refused before anything was written
    assert _export(tmp_path, "--n-layers", "5") == 0


def _target_with(tmp_path, **config) -> Path:
    target = tmp_path / "target"
    shutil.copytree(stories_dir(), target)
    cfg = json.loads((target / "config.json").read_text()) | config
    (target / "config.json").write_text(json.dumps(cfg))
    return target


@pytest.mark.parametrize("eos", ["2", 2.0, True, ["x"]])
def test_a_target_whose_eos_id_is_not_an_integer_is_refused_never_mask_0(tmp_path, eos, capsys):
    target = _target_with(tmp_path, eos_token_id=eos)  # pad null, unk 0: the old fallback gave --mask-token-id 0
    with pytest.raises(MaskTokenInvalid, match="eos_token_id"):
        mask_token_id(target)
    assert _export(tmp_path, target=target) == 2
    err = capsys.readouterr().err
    assert "eos_token_id" in err and "not an integer" in err and not (tmp_path / "out").exists()


def test_the_mask_token_of_a_sound_config_is_unchanged(tmp_path):
    assert mask_token_id(stories_dir()) == 2
    assert mask_token_id(_target_with(tmp_path, eos_token_id=None)) == 0  # none set before unk: unk, as speculators


def test_an_unknown_drop_flag_is_refused_listing_the_valid_ones(tmp_path, capsys):
    assert _export(tmp_path, "--drop-flag", "literal-marker") == 2
    err = capsys.readouterr().err
    assert "--drop-flag 'literal-marker'" in err and "literal_marker" in err and "dropped_by_server" in err
    assert not (tmp_path / "out").exists()
    assert _export(tmp_path, "--drop-flag", "choices_dropped:1", "--drop-flag", "truncated") == 0


def test_every_flag_the_library_writes_is_a_known_drop_flag():
    root = Path(__file__).resolve().parents[1] / "kimi_eagle"
    written = set()
    for path in root.rglob("*.py"):
        text = path.read_text()
        written |= set(re.findall(r'flags\.append\("([a-z_]+)"', text))
        for group in re.findall(r'^[A-Z_]*FLAGS = \(([^)]*)\)', text, re.M):
            written |= set(re.findall(r'"([a-z_{}]+)"', group))
    written = {f.replace("{policy}", p) for f in written for p in ("auto", "normalise", "keep")}
    written -= {"norm_before_residual", "norm_before_fc", "fc_norm", "norm_output"}  # a checkpoint's, not a row's
    assert sorted(f for f in written if not is_row_flag(f)) == []
    assert len(set(ROW_FLAGS)) == len(ROW_FLAGS)


def test_eagle3_training_on_a_dflash_extraction_is_refused_naming_both_layer_sets(tmp_path, capsys):
    from kimi_eagle.eagle3.extract import extract
    from kimi_eagle.eagle3.hidden import Row, load_target

    rows = [Row(str(i), [1, 403 + i, 407, 261, 378, 275, 263, 380, 31, 315], [0] * 3 + [1] * 7) for i in range(4)]
    extract(stories_dir(), rows, tmp_path / "hidden", drafter="dflash", model=load_target(stories_dir()))
    capsys.readouterr()
    code = main(["train", str(tmp_path / "hidden"), "--target", str(stories_dir()), "-o", str(tmp_path / "train"),
                 "--steps", "2", "--no-progress"])  # was: RuntimeError mat1 and mat2 shapes cannot be multiplied
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "[0, 1, 2, 3, 4] (the dflash layer set)" in err and "eagle3 drafter reads 3 layers ([1, 2, 3]" in err, err
    assert not (tmp_path / "train" / "checkpoint").exists()
