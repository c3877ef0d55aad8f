"""Continuing a training run on other data (issue 48): a checkpoint trained on one drafter's layer set, given an
extraction of another layer set or drafter, is refused with one line naming both layer sets — the way EAGLE-3
training on a DFlash extraction is refused (tests/test_hostile_options.py) — and nothing is trained or written."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from kimi_eagle.apps.cli import main
from kimi_eagle.assets import stories_dir

EAGLE3_SET, DFLASH_SET = "[1, 2, 3] (the eagle3 layer set)", "[0, 1, 2, 3, 4] (the dflash layer set)"  # stories260K


@pytest.fixture(scope="module")
def extractions(tmp_path_factory) -> Path:
    """stories260K hidden states of four rows, three times: EAGLE-3's layer set, another 3-layer set, DFlash's."""
    from kimi_eagle.eagle3.extract import extract
    from kimi_eagle.eagle3.hidden import Row, load_target

    root = tmp_path_factory.mktemp("continuation")
    rows = [Row(str(i), [1, 403 + i, 407, 261, 378, 275, 263, 380, 31, 315], [0] * 3 + [1] * 7) for i in range(4)]
    model = load_target(stories_dir())
    extract(stories_dir(), rows, root / "eagle3", model=model)
    extract(stories_dir(), rows, root / "other3", model=model, layer_ids=[0, 2, 4])
    extract(stories_dir(), rows, root / "dflash", drafter="dflash", model=model)
    return root


def train(data: Path, out: Path, *extra: str) -> int:
    return main(["train", str(data), "--target", str(stories_dir()), "-o", str(out), "--steps", "4",
                 "--stop-after", "1", "--no-progress", *extra])


@pytest.fixture(scope="module")
def runs(extractions) -> Path:
    """A stopped EAGLE-3 run and a stopped DFlash run, each at step 1 of 4 on its own drafter's layer set."""
    assert train(extractions / "eagle3", extractions / "runs" / "eagle3") == 0
    assert train(extractions / "dflash", extractions / "runs" / "dflash", "--drafter", "dflash") == 0
    return extractions / "runs"


def continued(runs: Path, tmp_path: Path, run: str) -> Path:
    shutil.copytree(runs / run, tmp_path / run)
    return tmp_path / run


def refusal(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("run,data,extra,saved,now", [
    ("eagle3", "other3", [], EAGLE3_SET, "[0, 2, 4]"),
    ("eagle3", "dflash", ["--drafter", "dflash"], EAGLE3_SET, DFLASH_SET),
    ("dflash", "eagle3", ["--drafter", "dflash"], DFLASH_SET, EAGLE3_SET),
], ids=["eagle3-run-on-another-3-layer-set", "eagle3-run-as-dflash-on-dflash-data", "dflash-run-on-eagle3-data"])
def test_resuming_a_run_on_another_layer_set_is_refused_naming_both(runs, extractions, tmp_path, capsys, run, data,
                                                                      extra, saved, now):
    out = continued(runs, tmp_path, run)
    before = (out / "checkpoint" / "last.pt").read_bytes()
    capsys.readouterr()
    assert train(extractions / data, out, "--resume", *extra) == 2
    err = refusal(capsys)
    assert f"target layers {saved} → {now}" in err and str(out) in err, err
    assert "Traceback" not in err and "shape" not in err
    assert (out / "checkpoint" / "last.pt").read_bytes() == before  # nothing trained


def test_a_checkpoint_from_before_the_layer_set_was_recorded_is_read_by_its_width(runs, extractions, tmp_path, capsys):
    out = continued(runs, tmp_path, "eagle3")
    state = torch.load(out / "checkpoint" / "last.pt", weights_only=False)
    del state["layer_ids"]  # as written before issue 48
    torch.save(state, out / "checkpoint" / "last.pt")
    capsys.readouterr()
    assert train(extractions / "dflash", out, "--resume", "--drafter", "dflash") == 2
    assert f"target layers 3 layers → {DFLASH_SET}" in refusal(capsys)


def test_without_resume_the_other_layer_set_starts_fresh_beside_the_run_and_says_why(runs, extractions, tmp_path,
                                                                                        capsys):
    out = continued(runs, tmp_path, "eagle3")
    assert train(extractions / "other3", out) == 0
    err = capsys.readouterr().err
    assert f"fresh in {out}.run2" in err and f"target layers {EAGLE3_SET} → [0, 2, 4]" in err, err


def test_the_same_layer_set_still_resumes(runs, extractions, tmp_path, capsys):
    out = continued(runs, tmp_path, "eagle3")
    assert train(extractions / "eagle3", out, "--resume") == 0
    assert "resumed from step 1" in capsys.readouterr().err
