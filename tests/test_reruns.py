"""Reruns say what they reused (#35): `train --steps N` continues a finished run with the same settings to N
steps and says so, other settings are refused in one line; the commands print what they kept."""
import json

import pytest
import torch

from kimi_eagle.apps import cli
from kimi_eagle.assets import stories_dir
from kimi_eagle.eagle3.extract import extract
from kimi_eagle.eagle3.hidden import Row, load_target
from kimi_eagle.eagle3.speculative import generate_target_only
from kimi_eagle.eagle3.train import read_history
from kimi_eagle.reuse import note_collect, note_training, reused_line

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def hidden_dir(stories, tmp_path_factory):
    """Four real sampled rows of stories260K, extracted."""
    target, g, rows = load_target(stories_dir()), torch.Generator().manual_seed(3), []
    for i, text in enumerate(["Once upon a time", "The cat sat", "Lily saw a bird", "One day"]):
        prompt = [1] + stories.encode(text)
        completion = generate_target_only(target, prompt, 16, 1.0, 2, g)
        rows.append(Row(f"r{i}", prompt + completion, [0] * len(prompt) + [1] * len(completion)))
    out = tmp_path_factory.mktemp("hs")
    extract(stories_dir(), rows, out, dtype="bf16", shard_rows=4, model=target)
    return out


def _train(hidden_dir, out, *extra):
    return cli.main(["train", str(hidden_dir), "--target", str(stories_dir()), "-o", str(out), "--ttt-steps", "2",
                     "--batch-size", "2", "--draft-vocab-size", "64", "--log-every", "2", "--no-progress", *extra])


def test_train_steps_continues_a_finished_run_to_n_steps_and_says_so(hidden_dir, tmp_path, capsys):
    out = tmp_path / "t"
    assert _train(hidden_dir, out, "--steps", "4") == 0
    first = capsys.readouterr()
    assert json.loads(first.out.strip().splitlines()[-1])["start"] == "fresh"
    assert "reused: nothing (all fresh)" in first.err
    assert _train(hidden_dir, out, "--steps", "6") == 0
    again = capsys.readouterr()
    summary = json.loads(again.out.strip().splitlines()[-1])
    assert (summary["start"], summary["step"], summary["out"]) == ("resumed from step 4", 6, str(out))
    assert "continuing a 4-step run from step 4 to 6 steps" in summary["start_note"]
    assert "reused: training from step 4 (trained to 6)" in again.err
    assert [h["step"] for h in read_history(out / "train_log.jsonl")] == [2, 4, 6]  # one run, one log
    assert not (tmp_path / "t.run2").exists()
    assert torch.load(out / "checkpoint" / "last.pt", weights_only=False)["step"] == 6


def test_train_steps_with_other_settings_is_refused_in_one_line(hidden_dir, tmp_path, capsys):
    out = tmp_path / "t"
    assert _train(hidden_dir, out, "--steps", "4") == 0
    capsys.readouterr()
    assert _train(hidden_dir, out, "--steps", "8", "--lr", "0.01", "--resume") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot resume" in err[0] and "lr 0.003 → 0.01" in err[0]
    assert _train(hidden_dir, out, "--steps", "2", "--resume") == 2  # fewer steps than it already has: not a continuation
    assert "steps 4 → 2" in capsys.readouterr().err


def test_the_reuse_vocabulary_is_one_line_per_run():
    reused = {}
    note_collect(reused, "collect", {"prompts": 48, "already_done": 0})
    assert reused == {} and reused_line(reused) == "reused: nothing (all fresh)"
    note_collect(reused, "collect", {"prompts": 48, "already_done": 48})
    note_training(reused, "training", {"start": "fresh", "step": 4})
    assert reused_line(reused) == "reused: collect 48/48"
    note_training(reused, "training", {"start": "resumed from step 120", "step": 120})
    assert reused_line(reused) == "reused: collect 48/48, training from step 120 (trained to 120)"


def test_train_writes_its_curves_in_the_chosen_format_and_dpi(hidden_dir, tmp_path, monkeypatch):
    from kimi_eagle.apps.reports.outputs import DPI_ENV, FORMAT_ENV

    monkeypatch.delenv(FORMAT_ENV, raising=False)  # restored after the test: the command sets them for its run
    monkeypatch.delenv(DPI_ENV, raising=False)
    assert _train(hidden_dir, tmp_path / "t", "--steps", "2", "--figure-format", "pdf", "--dpi", "55") == 0
    curves = tmp_path / "t" / "train_curves.png"
    assert curves.with_suffix(".pdf").read_bytes()[:5] == b"%PDF-"
    width = int.from_bytes(curves.read_bytes()[16:20], "big")
    assert width == pytest.approx(10 * 55, rel=0.1)  # the curves are 10 in wide


def test_batch_resume_says_which_runs_it_reused(tmp_path, capsys):
    import yaml

    from kimi_eagle.assets import REPO_ROOT

    probe = REPO_ROOT / "tests" / "data" / "batch_probe.ipynb"
    (tmp_path / "counts").mkdir()
    grid = tmp_path / "g.yaml"
    grid.write_text(yaml.safe_dump({"fixed": {"counter_dir": str(tmp_path / "counts")}, "sweep": {"x": [1, 2]}}))
    args = ["batch", str(probe), "--grid", str(grid), "-o", str(tmp_path / "run"), "--workers", "1", "--no-progress"]
    assert cli.main(args) == 0
    assert "batch: reused: nothing (all fresh)" in capsys.readouterr().out
    assert cli.main([*args, "--resume"]) == 0
    assert "batch: reused: runs 2/2" in capsys.readouterr().out
