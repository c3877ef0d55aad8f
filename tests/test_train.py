"""Drafter training: which positions are supervised, the soft targets, resume, and DDP on 2 CPU processes."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from kimi_eagle.apps.reports.training_charts import plot_histories
from kimi_eagle.assets import REPO_ROOT, stories_dir
from kimi_eagle.eagle3 import draft_vocab
from kimi_eagle.eagle3.extract import extract
from kimi_eagle.eagle3.hidden import Row, load_target
from kimi_eagle.eagle3.losses import TTTLoss, expected_tau, soft_targets, supervised_mask
from kimi_eagle.eagle3.model import Eagle3Drafter
from kimi_eagle.eagle3.readers import HiddenStates
from kimi_eagle.eagle3.speculative import generate_target_only
from kimi_eagle.eagle3.train import (
    ResumeRefused,
    TrainConfig,
    Trainer,
    lr_schedule,
    param_digest,
    read_history,
    train_drafter,
)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def target():
    return load_target(stories_dir())


@pytest.fixture(scope="module")
def hidden_dir(target, stories, tmp_path_factory):
    """Six real sampled rows of the target, extracted."""
    g = torch.Generator().manual_seed(7)
    rows = []
    for i, text in enumerate(["Once upon a time", "The cat sat", "Lily saw a bird", "One day", "Tim was sad", "A big tree"]):
        prompt = [1] + stories.encode(text)
        completion = generate_target_only(target, prompt, 20, 1.0, 2, g)
        rows.append(Row(f"r{i}", prompt + completion, [0] * len(prompt) + [1] * len(completion)))
    out = tmp_path_factory.mktemp("hs")
    extract(stories_dir(), rows, out, dtype="bf16", shard_rows=4, model=target)
    return out


def test_supervised_positions_are_indexed_by_the_predicted_token():
    # 3 prompt tokens x0..x2, 4 completion tokens x3..x6; step k at t predicts x[t+2+k]
    loss_mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1]])
    assert supervised_mask(loss_mask, 0).tolist() == [[0, 1, 1, 1, 1, 0, 0]]  # t=1 predicts x3, the first completion token
    assert supervised_mask(loss_mask, 1).tolist() == [[1, 1, 1, 1, 0, 0, 0]]  # t=0 predicts x3
    assert supervised_mask(loss_mask, 2).tolist() == [[1, 1, 1, 0, 0, 0, 0]]  # x4..x6 only
    assert supervised_mask(loss_mask, 4).tolist() == [[1, 0, 0, 0, 0, 0, 0]]  # x6
    assert supervised_mask(loss_mask, 5).tolist() == [[0] * 7]


def _loss_module(target, steps=3):
    vocab = draft_vocab.build(torch.arange(512).flip(0), 128)
    drafter = Eagle3Drafter.from_target(target, vocab, [1, 2, 3], seed=0)
    head = target.lm_head.weight[vocab.draft_to_target].detach()
    return TTTLoss(drafter, head, steps, 0.8)


def test_the_loss_reads_the_target_distribution_exactly_where_the_mask_says(target, hidden_dir):
    row = HiddenStates(hidden_dir)[0]
    aux, ids, final = row["aux"].float()[None], row["input_ids"][None], row["final"].float()[None]
    mask = row["loss_mask"][None]
    n_prompt = int((mask[0] == 0).sum())
    module = _loss_module(target)
    with torch.no_grad():
        base, stats = module(aux, ids, mask, final)
        # final[j] is the target's distribution for x[j+1]: it matters iff x[j+1] is a completion token
        for j, matters in [(n_prompt - 2, False), (n_prompt - 1, True), (ids.shape[1] - 1, False)]:
            f2 = final.clone()
            f2[0, j] += 3.0 * torch.randn(64)
            changed = module(aux, ids, mask, f2)[0]
            assert (not torch.equal(changed, base)) == matters, j
        n_completion = int(mask.sum())
        assert stats[0, 2] == n_completion  # step 0 supervises every completion token, the first included
        assert stats[1, 2] == n_completion  # so does step 1 (from position t = n_prompt - 3)
        # normalised by the number of supervised positions: a batch of the row twice has the same loss
        twice = module(aux.repeat(2, 1, 1), ids.repeat(2, 1), mask.repeat(2, 1), final.repeat(2, 1, 1))[0]
    assert torch.allclose(twice, base, atol=1e-5)


def test_soft_targets_are_the_target_softmax_restricted_and_renormalised(target):
    final = torch.randn(2, 5, 64)
    keep = torch.tensor([3, 17, 40, 200, 511])
    full = torch.softmax(target.lm_head(final), -1)[..., keep]
    with torch.no_grad():
        got = soft_targets(final, target.lm_head.weight[keep])
    assert torch.allclose(got, full / full.sum(-1, keepdim=True), atol=1e-6)


def test_expected_tau():
    assert expected_tau([1.0, 1.0, 1.0]) == 4.0
    assert expected_tau([0.5, 0.5]) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tau([0.0, 1.0]) == 1.0


def _cfg(hidden_dir, out, **kw):
    base = dict(data=str(hidden_dir), target=str(stories_dir()), out=str(out), steps=8, ttt_steps=3, batch_size=2,
                draft_vocab_size=128, save_every=100, log_every=2, progress=False)
    return TrainConfig(**{**base, **kw})


def test_training_learns_and_a_resumed_run_equals_an_uninterrupted_one(hidden_dir, tmp_path):
    straight = train_drafter(_cfg(hidden_dir, tmp_path / "a"))
    log = [json.loads(x) for x in (tmp_path / "a" / "train_log.jsonl").read_text().splitlines()]
    assert [h["step"] for h in log] == [2, 4, 6, 8] and log[-1]["loss"] < log[0]["loss"]
    assert straight["finished"] and straight["final"] == log[-1]
    # the library writes data only: the chart of the log is drawn by `kimi-eagle train` (see the DDP test)
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["checkpoint", "drafter", "train_log.jsonl", "train_metrics.json"]

    first = train_drafter(_cfg(hidden_dir, tmp_path / "b", stop_after=3))
    assert first["step"] == 3 and not first["finished"] and not (tmp_path / "b" / "drafter").exists()
    second = train_drafter(_cfg(hidden_dir, tmp_path / "b", resume=True))
    assert second["step"] == 8 and second["finished"]
    a = torch.load(tmp_path / "a" / "checkpoint" / "last.pt", weights_only=False)
    b = torch.load(tmp_path / "b" / "checkpoint" / "last.pt", weights_only=False)
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    for pa, pb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert a["scheduler"] == b["scheduler"]


def test_a_resumed_trainer_continues_at_the_checkpoint_step_and_data_position(hidden_dir, tmp_path):
    stopped = Trainer(_cfg(hidden_dir, tmp_path, stop_after=3))
    stopped.run()
    assert stopped.step == 3 and (tmp_path / "checkpoint" / "last.pt").exists()
    resumed = Trainer(_cfg(hidden_dir, tmp_path, resume=True))
    assert resumed.step == 3 and resumed.batch_rows() == stopped.batch_rows()
    assert param_digest(resumed.drafter) == param_digest(stopped.drafter)
    assert resumed.scheduler.get_last_lr() == stopped.scheduler.get_last_lr()
    assert Trainer(_cfg(hidden_dir, tmp_path, resume=False)).step == 0  # resume=False starts afresh
    auto = Trainer(_cfg(hidden_dir, tmp_path))  # the default resumes what was trained with the same settings
    assert (auto.step, auto.start, auto.out) == (3, "resumed from step 3", tmp_path)


def test_a_rerun_with_other_settings_starts_fresh_in_a_new_run_folder_and_says_why(hidden_dir, tmp_path, capsys):
    out = tmp_path / "run"
    first = train_drafter(_cfg(hidden_dir, out))
    assert (first["start"], first["out"], first["start_note"]) == ("fresh", str(out), "")
    changed = train_drafter(_cfg(hidden_dir, out, lr=1e-3, ttt_steps=2, progress=True))
    assert changed["start"] == "fresh" and changed["out"] == str(tmp_path / "run.run2") and changed["finished"]
    assert "lr 0.003 → 0.001" in changed["start_note"] and "ttt_steps 3 → 2" in changed["start_note"]
    assert f"train: fresh in {tmp_path / 'run.run2'}" in capsys.readouterr().err
    # the first run is untouched; its metrics and log are its own
    assert json.loads((out / "train_metrics.json").read_text())["final"] == first["final"]
    assert json.loads((tmp_path / "run.run2" / "train_metrics.json").read_text())["start"] == "fresh"
    # the same changed settings again: resumed (and finished) in run.run2; the original ones: resumed in run
    again = train_drafter(_cfg(hidden_dir, out, lr=1e-3, ttt_steps=2))
    assert (again["start"], again["out"], again["train_tokens_per_s"]) == ("resumed from step 8", str(tmp_path / "run.run2"), None)
    assert train_drafter(_cfg(hidden_dir, out))["out"] == str(out)
    # more steps of the same run continue it (#35: `train --steps N` extends a finished run); other settings do not
    extended = train_drafter(_cfg(hidden_dir, out, steps=10))
    assert (extended["out"], extended["start"], extended["step"]) == (str(out), "resumed from step 8", 10)
    assert "continuing a 8-step run from step 8 to 10 steps" in extended["start_note"]


def test_resume_true_is_refused_when_the_settings_or_the_data_differ(hidden_dir, target, stories, tmp_path):
    data, out = tmp_path / "hs", tmp_path / "run"
    shutil.copytree(hidden_dir, data)
    train_drafter(_cfg(data, out, stop_after=2))
    with pytest.raises(ResumeRefused, match=r"cannot resume .*batch_size 2 → 3"):
        Trainer(_cfg(data, out, batch_size=3, resume=True))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hs", "run"]  # nothing written
    assert Trainer(_cfg(data, out, resume=True)).start == "resumed from step 2"
    # the same path now holding other rows (a regenerated extraction): the data fingerprint differs
    shutil.rmtree(data)
    rows = [Row(f"q{i}", [1] + stories.encode(t), [0] + [1] * len(stories.encode(t)))
            for i, t in enumerate(["A dog ran home", "The sun was hot", "Sam had a ball", "Mia sang"])]
    extract(stories_dir(), rows, data, dtype="bf16", shard_rows=4, model=target)
    with pytest.raises(ResumeRefused, match="the data changed"):
        Trainer(_cfg(data, out, resume=True))
    assert Trainer(_cfg(data, out)).out == tmp_path / "run.run2"


def test_the_cli_prints_how_a_run_started_and_refuses_a_mismatched_resume_with_exit_2(hidden_dir, tmp_path, capsys):
    from kimi_eagle.apps import cli

    base = [str(hidden_dir), "--target", str(stories_dir()), "-o", str(tmp_path / "t"), "--steps", "4", "--ttt-steps", "2",
            "--batch-size", "2", "--draft-vocab-size", "64", "--log-every", "2", "--no-progress"]
    assert cli.main(["train", *base]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["start"] == "fresh"
    assert cli.main(["train", *base, "--lr", "0.01", "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot resume" in err[0] and "lr 0.003 → 0.01" in err[0]
    assert cli.main(["train", *base]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["start"] == "resumed from step 4"
    assert cli.main(["train", *base, "--fresh"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["start"] == "fresh"


def test_train_drafter_is_a_short_function_over_the_trainer():
    """The loop, resume, logging and saving live in the Trainer; train_drafter only builds and runs it."""
    import ast
    import inspect

    from kimi_eagle.eagle3 import train

    node = next(n for n in ast.walk(ast.parse(inspect.getsource(train))) if isinstance(n, ast.FunctionDef) and n.name == "train_drafter")
    assert node.end_lineno - node.lineno + 1 <= 15
    assert "Trainer" in {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def test_the_lr_schedule_warms_up_linearly_then_decays_by_a_cosine_to_a_tenth():
    factor = lr_schedule(100, 0.05)  # 5 warmup steps
    assert [factor(s) for s in range(5)] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert factor(5) == 1.0 and factor(52) == pytest.approx(0.55, abs=0.01)  # half way down the cosine
    assert factor(100) == pytest.approx(0.1) and factor(500) == pytest.approx(0.1)
    assert lr_schedule(10, 0.0)(0) == 1.0  # at least one warmup step


def _entry(step, loss):
    return {"step": step, "lr": 1e-3, "loss": loss, "step_loss": [loss, loss + 1], "acc": [0.5, 0.25],
            "supervised": [4.0, 4.0], "expected_tau": 1.625}


def test_the_history_leaves_out_a_torn_last_line(tmp_path):
    log = tmp_path / "train_log.jsonl"
    log.write_text(json.dumps(_entry(1, 2.0)) + "\n" + json.dumps(_entry(2, 1.5)) + "\n" + '{"step": 3, "lo')
    assert [h["step"] for h in read_history(log)] == [1, 2]
    assert read_history(tmp_path / "never_written.jsonl") == []


def test_training_curves_of_several_runs_share_one_figure(tmp_path):
    log = tmp_path / "train_log.jsonl"
    log.write_text("".join(json.dumps(_entry(s, 2.0 / s)) + "\n" for s in (1, 2, 3)))
    fig = plot_histories({"engine IDs": log, "recon IDs": [_entry(1, 2.5), _entry(2, 2.0)]}, tmp_path / "curves.png")
    loss_ax, acc_ax = fig.axes
    assert [line.get_label() for line in loss_ax.lines] == ["engine IDs", "recon IDs"]
    assert [line.get_linestyle() for line in loss_ax.lines] == ["-", "--"]
    assert list(loss_ax.lines[0].get_ydata()) == [2.0, 1.0, 2.0 / 3]
    assert len(acc_ax.lines) == 4  # 2 unroll steps x 2 runs, one colour per step
    assert acc_ax.lines[0].get_color() == acc_ax.lines[2].get_color()
    assert (tmp_path / "curves.png").read_bytes().startswith(b"\x89PNG")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curves.png", "train_log.jsonl"]  # no temp file left


def test_torchrun_ddp_with_two_gloo_processes(hidden_dir, tmp_path):
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "kimi_eagle", "train", "--data", str(hidden_dir), "--target", str(stories_dir()), "-o", str(out),
           "--steps", "3", "--ttt-steps", "2", "--batch-size", "1", "--draft-vocab-size", "64", "--log-every", "1",
           "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((out / f"ddp_rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert ranks[0]["params_sha256"] == ranks[1]["params_sha256"]  # gradients were all-reduced
    assert not set(ranks[0]["rows"]) & set(ranks[1]["rows"])  # each rank trained on its own rows
    assert sorted(ranks[0]["rows"] + ranks[1]["rows"]) == list(range(6))  # one epoch of 6 rows in 3 steps
    metrics = json.loads((out / "train_metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["finished"] and (out / "drafter" / "model.safetensors").exists()
    assert (out / "train_curves.png").read_bytes().startswith(b"\x89PNG")  # drawn by the command, once (rank 0)


def test_online_training_matches_offline_training_on_bf16_shards(hidden_dir, tmp_path):
    """Same seed, same rows: the losses of the first steps differ only by the shards' bf16 rounding."""
    from kimi_eagle.io import write_jsonl

    hs = HiddenStates(hidden_dir)
    write_jsonl(tmp_path / "rows.jsonl", [{"id": rid, "input_ids": r["input_ids"].tolist(), "loss_mask": r["loss_mask"].tolist()}
                                          for rid, r in zip(hs.row_ids, hs)])
    kw = dict(steps=4, log_every=1)
    offline = train_drafter(_cfg(hidden_dir, tmp_path / "offline", **kw))
    online = train_drafter(_cfg(tmp_path / "rows.jsonl", tmp_path / "online", online=True, **kw))
    assert online["online"] and online["draft_vocab"] == offline["draft_vocab"]
    for a, b in zip(read_history(tmp_path / "offline" / "train_log.jsonl"), read_history(tmp_path / "online" / "train_log.jsonl")):
        assert a["step"] == b["step"] and a["supervised"] == b["supervised"]
        # bf16 keeps 8 significant bits: a relative rounding of 2**-9 per value; the losses agree to 2**-8
        assert a["step_loss"] == pytest.approx(b["step_loss"], rel=2**-8), a["step"]
        assert a["step_loss"] != b["step_loss"]  # the online run really did not read the shards
