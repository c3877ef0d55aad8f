"""`kimi-eagle batch`: a notebook over a parameter grid with papermill — validated up front, parallel,
failures recorded per run, resumable after a failure or a kill, summarised in parquet and HTML."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from kimi_eagle.apps.batch.grid import GridError, expand, is_secret_name, load_grid, run_name, validate
from kimi_eagle.apps.batch.notebooks import parameter_names
from kimi_eagle.apps.batch.run import read_state, run_batch
from kimi_eagle.apps.cli import main as cli_main
from kimi_eagle.apps.reports.batch_summary import write_summary
from kimi_eagle.assets import REPO_ROOT

PROBE = Path(__file__).parent / "data" / "batch_probe.ipynb"  # counts its executions, can sleep, can fail
GRIDS = sorted((REPO_ROOT / "notebooks" / "grids").glob("*.yaml"))


def write_grid(path: Path, spec: dict) -> Path:
    path.write_text(yaml.safe_dump(spec))
    return path


def counts(counter_dir: Path) -> dict[str, int]:
    """How many times each run's notebook started executing (one line per execution)."""
    return {p.name[: -len(".count")]: len(p.read_text().splitlines()) for p in counter_dir.glob("*.count")}


# ---- grids: expansion, names, validation (no notebook executed) ----

def test_sweep_is_the_cartesian_product_and_explicit_runs_follow_with_fixed_merged_in():
    grid = expand({"fixed": {"scale": 2.0}, "sweep": {"x": [1, 2], "label": ["a", "b"]},
                   "runs": [{"x": 7, "fail": True}, {"_name": "tiny", "x": 0}]})
    assert [r.name for r in grid.runs] == ["x=1__label=a", "x=1__label=b", "x=2__label=a", "x=2__label=b",
                                           "x=7__fail=true", "tiny"]
    assert grid.runs[1].params == {"scale": 2.0, "x": 1, "label": "b"}
    assert grid.runs[4].params == {"scale": 2.0, "x": 7, "fail": True}


def test_run_names_are_stable_readable_and_safe_as_directory_names():
    assert run_name({"dataset": "reason-tool-use", "n": 20}) == "dataset=reason-tool-use__n=20"
    assert run_name({"engine": "/data/x/engine.jsonl"}) == "engine=engine.jsonl"  # a path: its last part
    long = run_name({"text": "word " * 40})
    assert len(long) <= 80 and "/" not in long and long == run_name({"text": "word " * 40})
    # two paths with one file name still get distinct directories
    grid = expand({"sweep": {"engine": ["/a/engine.jsonl", "/b/engine.jsonl"]}})
    assert len({r.name for r in grid.runs}) == 2


def test_duplicate_runs_are_an_error():
    with pytest.raises(GridError, match="same run"):
        expand({"runs": [{"x": 1}, {"x": 1}]})


def test_secret_names_are_recognised_without_catching_tokenizer_parameters():
    for name in ["api_key", "OPENROUTER_API_KEY", "hf_token", "apiKey", "client_secret", "password", "token"]:
        assert is_secret_name(name), name
    for name in ["tokenizer", "tokenizer_dir", "max_tokens", "n_tokens", "keyword", "output_dir"]:
        assert not is_secret_name(name), name


@pytest.mark.parametrize("params,message", [
    ({"xx": 1}, "run 'bad': parameter 'xx' is not in batch_probe.ipynb's parameters cell .* did you mean 'x'"),
    ({"x": "1"}, r"run 'bad': parameter 'x' = '1' is str, but the notebook's default 1 is int"),
    ({"x": True}, "parameter 'x' = True is bool, but .* is int"),
    ({"fail": 1}, "parameter 'fail' = 1 is int, but .* is bool"),
    ({"label": None}, "parameter 'label' = None is NoneType"),
    ({"api_key": "abc"}, "parameter 'api_key' looks like a secret"),
    ({"label": "sk-or-v1-0123456789abcdef0123"}, "parameter 'label' has a value that looks like an API key"),
    ({"output_dir": "/tmp/x"}, "parameter 'output_dir' is set by the batch itself"),
])
def test_bad_parameters_are_errors_naming_the_run_and_the_parameter(params, message):
    grid = expand({"runs": [{"_name": "ok", "x": 2}, {"_name": "bad", **params}]})
    with pytest.raises(GridError, match=message):
        validate(grid.runs, parameter_names(PROBE), PROBE.name)


def test_types_follow_the_default_ints_fit_floats_and_none_defaults_take_anything():
    grid = expand({"runs": [{"scale": 3}, {"counter_dir": "/tmp"}, {"counter_dir": 5}, {"x": 4, "label": "z"}]})
    validate(grid.runs, parameter_names(PROBE), PROBE.name)  # no error


def test_a_bad_grid_stops_before_anything_runs(tmp_path, capsys):
    grid = write_grid(tmp_path / "g.yaml", {"sweep": {"x": [1, 2]}, "runs": [{"_name": "typo", "lable": "b"}]})
    out = tmp_path / "out"
    rc = cli_main(["batch", str(PROBE), "--grid", str(grid), "-o", str(out), "--no-progress"])
    assert rc == 2
    assert "run 'typo': parameter 'lable'" in capsys.readouterr().err
    assert not out.exists()


def test_one_batch_at_a_time_per_run_dir(tmp_path):
    import fcntl

    (tmp_path / "run").mkdir()
    with open(tmp_path / "run" / "batch.lock", "a+") as held:  # as another running batch holds it
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(GridError, match="in use by another batch"):
            run_batch(PROBE, write_grid(tmp_path / "g.yaml", {"sweep": {"x": [1]}}), tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "x=1").exists()


def test_a_finished_batch_leaves_no_lock_file(tmp_path):
    run_batch(PROBE, write_grid(tmp_path / "g.yaml", {"sweep": {"x": [1]}}), tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "batch.lock").exists()
    assert (tmp_path / "run" / "x=1").is_dir()


def test_a_lock_file_removed_while_waiting_is_not_trusted(tmp_path):
    """A batch that opened the lock file just before the holder removed it locks the file now at the path."""
    import fcntl

    from kimi_eagle.apps.batch import run as batch_run

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    real_flock = fcntl.flock
    calls = []

    def flock_after_removal(f, op):  # the holder finishes between our open() and our flock()
        if not calls:
            (run_dir / "batch.lock").unlink()
        calls.append(op)
        return real_flock(f, op)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fcntl, "flock", flock_after_removal)
        with batch_run._exclusive(run_dir):
            assert len(calls) == 2  # the removed file's lock was dropped and the new file locked
            assert (run_dir / "batch.lock").exists()
    assert not (run_dir / "batch.lock").exists()


def test_a_directory_the_batch_did_not_make_is_never_deleted(tmp_path):
    (tmp_path / "run" / "x=1").mkdir(parents=True)
    (tmp_path / "run" / "x=1" / "precious.txt").write_text("mine")
    result = run_batch(PROBE, write_grid(tmp_path / "g.yaml", {"sweep": {"x": [1]}}), tmp_path / "run", progress=False)
    assert result.failed == ["x=1"] and "not a batch run directory" in result.errors["x=1"]
    assert (tmp_path / "run" / "x=1" / "precious.txt").read_text() == "mine"


# ---- the summary (from run states on disk; no notebook executed) ----

def test_summary_has_a_row_per_planned_run_whatever_its_state_and_any_metrics_fit_parquet(tmp_path):
    def run_dir(name, state, metrics=None):
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.json").write_text(json.dumps(state))
        if metrics is not None:
            (tmp_path / name / "metrics.json").write_text(json.dumps(metrics))

    run_dir("a", {"status": "ok", "duration_s": 1.5, "attempts": 1},
            {"rate": 0.25, "rate_ci": [0.1, 0.5], "verdict": {"exact": 3, "semantic": 1}, "tau": [1.0, 0.5], "tag": "x"})
    run_dir("b", {"status": "ok", "duration_s": 2.0, "attempts": 2},
            {"rate": 0.5, "rate_ci": [0.3, 0.7], "verdict": {"exact": 2, "semantic": 2}, "tau": [0.9], "tag": 7})
    run_dir("c", {"status": "failed", "error": "ValueError: no", "failed_cell": {"index": 3, "source": "1/0"}})
    run_dir("d", {"status": "running"})  # interrupted: not finished
    runs = [(n, {"k": i, "path": "/x"}) for i, n in enumerate(["a", "b", "c", "d", "e"])]  # e never started

    df = write_summary(tmp_path, runs, title="t")
    back = pd.read_parquet(tmp_path / "summary.parquet")
    assert list(back.run) == ["a", "b", "c", "d", "e"]
    assert list(back.status) == ["ok", "ok", "failed", "missing", "missing"]
    assert list(back["param.k"]) == [0, 1, 2, 3, 4]
    assert back["metric.rate"].tolist()[:2] == [0.25, 0.5] and back["metric.verdict.semantic"].tolist()[:2] == [1, 2]
    assert back["metric.rate_ci.0"].tolist()[:2] == [0.1, 0.3]  # an interval becomes two columns
    assert back["metric.tag"].tolist()[:2] == ['"x"', "7"]  # mixed types become JSON text
    assert list(back["metric.tau"][0]) == [1.0, 0.5]  # number lists stay lists
    assert back.loc[2, "error"] == "ValueError: no" and back.loc[2, "failed_cell"] == "1/0"
    assert len(df) == 5
    charts = sorted(p.name for p in (tmp_path / "charts").glob("*.png"))
    assert charts == ["rate.png", "tau.png", "verdict.png"]  # bounds are not charts of their own
    page = (tmp_path / "summary.html").read_text()
    assert "5 runs: 2 ok, 1 failed, 2 missing" in page and "ValueError: no" in page and "charts/verdict.png" in page


# ---- execution (papermill; a few seconds per run) ----

def test_grid_runs_in_parallel_failure_is_recorded_and_resume_reruns_only_the_failed_run(tmp_path):
    counter = tmp_path / "counts"
    counter.mkdir()
    grid = write_grid(tmp_path / "g.yaml", {
        "fixed": {"counter_dir": str(counter), "scale": 0.5},
        "sweep": {"x": [2, 4, 6]},
        "runs": [{"_name": "broken", "x": 1, "fail": True, "label": "boom"}],
    })
    out = tmp_path / "run"
    result = run_batch(PROBE, grid, out, workers=2, progress=False)

    assert sorted(result.executed) == ["broken", "x=2", "x=4", "x=6"] and result.failed == ["broken"]
    df = pd.read_parquet(out / "summary.parquet").set_index("run")
    assert list(df.index) == ["x=2", "x=4", "x=6", "broken"]
    assert df.status.to_dict() == {"x=2": "ok", "x=4": "ok", "x=6": "ok", "broken": "failed"}
    assert df.loc["broken", "error"] == "RuntimeError: asked to fail (boom)"
    assert 'raise RuntimeError(f"asked to fail ({label})")' in df.loc["broken", "failed_cell"]
    ok = df[df.status == "ok"]
    assert (ok["metric.value"] == ok["param.x"] * 0.5).all()  # each run got its own parameters
    assert (df["duration_s"] > 0).all() and (df["attempts"] == 1).all()
    for name in df.index:  # each run in its own directory, executed notebook also rendered to HTML
        assert (out / df.loc[name, "notebook"]).is_file() and (out / df.loc[name, "html"]).is_file()
        assert json.loads((out / name / "run.json").read_text())["params"]["counter_dir"] == str(counter)
    assert (out / "x=4" / "metrics.json").is_file() and not (out / "broken" / "metrics.json").exists()
    page = (out / "summary.html").read_text()
    assert 'href="broken/batch_probe.html"' in page and "asked to fail (boom)" in page
    assert "charts/value.png" in page and (out / "charts" / "value.png").is_file()
    assert counts(counter) == {"x=2": 1, "x=4": 1, "x=6": 1, "broken": 1}

    again = run_batch(PROBE, grid, out, workers=2, progress=False, resume=True)
    assert again.executed == ["broken"] and sorted(again.skipped) == ["x=2", "x=4", "x=6"]
    assert counts(counter) == {"x=2": 1, "x=4": 1, "x=6": 1, "broken": 2}
    df = pd.read_parquet(out / "summary.parquet").set_index("run")
    assert len(df) == 4 and df.loc["broken", "attempts"] == 2 and df.loc["broken", "status"] == "failed"


def test_a_worker_that_dies_fails_its_run_and_the_batch_goes_on(tmp_path):
    grid = write_grid(tmp_path / "g.yaml", {"runs": [{"_name": "dies", "kill_worker": True}, {"x": 1}, {"x": 2}]})
    result = run_batch(PROBE, grid, tmp_path / "run", workers=2, progress=False)
    assert result.failed == ["dies"] and "worker process" in result.errors["dies"]
    df = pd.read_parquet(tmp_path / "run" / "summary.parquet")
    assert df.status.tolist() == ["failed", "ok", "ok"]


@pytest.mark.slow
def test_a_killed_batch_resumes_without_rerunning_finished_runs(tmp_path):
    """SIGTERM to the batch (it stops its workers), then SIGKILL to the whole process group mid-way:
    each time the finished runs stay finished, and --resume executes only the rest."""
    counter = tmp_path / "counts"
    counter.mkdir()
    names = [f"x={x}" for x in range(1, 6)]
    grid = write_grid(tmp_path / "g.yaml", {"fixed": {"counter_dir": str(counter), "sleep_s": 1.5},
                                            "sweep": {"x": list(range(1, 6))}})
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "kimi_eagle", "batch", str(PROBE), "--grid", str(grid), "-o", str(out),
           "--workers", "2", "--no-progress"]

    def ok_runs() -> set[str]:
        return {n for n in names if read_state(out / n).get("status") == "ok"}

    def start_and_kill(args: list[str], after_ok: int, kill) -> set[str]:
        proc = subprocess.Popen(args, cwd=REPO_ROOT, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 180
        while len(ok_runs()) < after_ok:
            assert proc.poll() is None and time.time() < deadline, "the batch ended before it could be killed"
            time.sleep(0.05)
        kill(proc)
        assert proc.wait(timeout=60) != 0
        return ok_runs()

    # 1. SIGTERM to the batch process alone: it terminates its workers and exits
    finished = start_and_kill(cmd, 1, lambda p: os.kill(p.pid, signal.SIGTERM))
    workers = {read_state(out / n).get("pid") for n in names if read_state(out / n).get("status") == "running"}
    assert workers and all(_gone(pid) for pid in workers), "workers outlived the batch"
    assert 1 <= len(finished) < len(names) and not (out / "summary.parquet").exists()
    before = counts(counter)

    # 2. --resume, then SIGKILL of the whole process group (no clean-up possible) once one more run is done
    finished2 = start_and_kill([*cmd, "--resume"], len(finished) + 1, lambda p: os.killpg(p.pid, signal.SIGKILL))
    assert finished < finished2 < set(names)
    assert {n: counts(counter)[n] for n in finished} == {n: 1 for n in finished}

    # 3. --resume completes the batch, executing only the runs not finished before
    result = run_batch(PROBE, grid, out, workers=2, progress=False, resume=True)
    assert set(result.skipped) == finished2 and set(result.executed) == set(names) - finished2
    df = pd.read_parquet(out / "summary.parquet")
    assert list(df.run) == names and (df.status == "ok").all()
    after = counts(counter)
    assert {n: after[n] for n in finished} == {n: 1 for n in finished}  # never executed again
    assert all(after[n] > before.get(n, 0) for n in set(names) - finished)


def _gone(pid: int, wait_s: float = 15) -> bool:
    deadline = time.time() + wait_s
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


# ---- the grids shipped in notebooks/grids ----

@pytest.mark.parametrize("path", GRIDS, ids=lambda p: p.name)
def test_shipped_grids_name_their_notebook_and_validate_against_it(path):
    grid = load_grid(path)
    assert grid.notebook is not None and grid.notebook.is_file(), "a shipped grid names its notebook"
    validate(grid.runs, parameter_names(grid.notebook), grid.notebook.name)
    assert len(grid.runs) >= 2


# ---- a summary a reader trusts at a glance ----

def test_a_value_missing_from_some_finished_run_is_not_the_same_in_every_run(tmp_path):
    """#35: a metric two runs share and a third lacks was listed as "the same in every run"."""
    from kimi_eagle.apps.reports.batch_summary import constant_metrics, write_summary

    for name, metrics in (("a", {"data": "real", "n_records": 5, "precision": 1.0}),
                          ("b", {"data": "real", "n_records": 5, "precision": 1.0}),
                          ("c", {"data": "real", "n_records": 5})):  # billing-only: no precision
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.json").write_text(json.dumps({"status": "ok", "duration_s": 1.0, "attempts": 1}))
        (tmp_path / name / "metrics.json").write_text(json.dumps(metrics))
    df = write_summary(tmp_path, [(n, {"x": n}) for n in "abc"])
    assert constant_metrics(df) == {"metric.n_records": 5}
    page = (tmp_path / "summary.html").read_text()
    same = page.split("The same in every run")[1].split("</ul>")[0]
    assert "n records = <b>5</b>" in same and "precision" not in same


def test_summary_page_shows_plain_values_states_constants_once_and_labels_simulated_and_real_runs(tmp_path):
    import numpy as np

    def run_dir(name, metrics):
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.json").write_text(json.dumps({"status": "ok", "duration_s": 1.0, "attempts": 1}))
        (tmp_path / name / "metrics.json").write_text(json.dumps(metrics))

    run_dir("sim", {"data": "simulated", "mismatch_rate": 0.8, "mismatch_rate_ci": [0.6, 0.9], "n_records": 5,
                    "precision": {"whitespace": 1.0, "truncation": 1.0}, "tokens_per_s": 234549.45667536938})
    run_dir("real", {"data": "real", "mismatch_rate": 0.256, "mismatch_rate_ci": [0.22, 0.29], "n_records": 5,
                     "precision": {"whitespace": 1.0, "truncation": 0.5}, "tokens_per_s": 1234.5})
    runs = [("sim", {"simulate": np.True_, "sample_size": np.int64(5), "sources": ["glaive"]}),
            ("real", {"simulate": np.False_, "sample_size": np.int64(5), "sources": ["glaive"]})]
    write_summary(tmp_path, runs, title="diff")
    page = (tmp_path / "summary.html").read_text()
    assert "np.True_" not in page and "np.int64" not in page and "np.False_" not in page
    assert "<code>sample_size</code> = 5</li>" in page  # a fixed parameter, as written
    assert "1 run on <b>simulated</b> data, 1 run on <b>real</b> data" in page
    assert "<li>n records = <b>5</b></li>" in page  # the same in every run: said once ...
    charts = sorted(p.name for p in (tmp_path / "charts").glob("*.png"))
    assert "n_records.png" not in charts and "mismatch_rate.png" in charts  # ... and not charted
    assert "234,549" in page and "234549.45" not in page
    assert "mismatch rate (95% interval)" in page and "<td class='num'>0.8 [0.6, 0.9]</td>" in page  # value with its interval
    assert "mismatch_rate_ci" not in page.split("<h2>Comparison")[0]  # readable names, no raw columns
    # no table wider than the page: at most a handful of metric columns per table
    import re
    for table in re.findall(r"<table.*?</table>", page, re.S):
        first_row = re.search(r"<tr>(.*?)</tr>", table, re.S).group(1)
        assert first_row.count("<th") <= 10
    assert "max-width:1400px" in page


def test_papermill_kernels_do_not_print_the_tcp_encryption_warning(tmp_path):
    code = ("import sys; from kimi_eagle.apps.batch.notebooks import execute; "
            f"execute({str(PROBE)!r}, {str(tmp_path / 'out')!r}, {{'x': 2}})")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "without encryption" not in out.stderr + out.stdout
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["value"] == 2.0


def test_resume_reruns_a_finished_run_whose_metrics_were_corrupted_since(tmp_path):
    """#48: a kept run's metrics.json is checked again on --resume: a NaN or torn file is rerun, never kept ok."""
    counter = tmp_path / "counts"
    counter.mkdir()
    grid = write_grid(tmp_path / "g.yaml", {"fixed": {"counter_dir": str(counter)}, "sweep": {"x": [2, 4, 6]}})
    out = tmp_path / "run"
    run_batch(PROBE, grid, out, workers=1, progress=False)
    (out / "x=2" / "metrics.json").write_text('{"value": NaN}')
    (out / "x=4" / "metrics.json").write_text('{"value": 1')
    df = write_summary(out, [(n, {"x": x}) for n, x in (("x=2", 2), ("x=4", 4), ("x=6", 6))])
    assert df.set_index("run").status.to_dict() == {"x=2": "failed", "x=4": "failed", "x=6": "ok"}  # marked
    assert "metrics.json does not read" in df.set_index("run").loc["x=2", "error"]
    again = run_batch(PROBE, grid, out, workers=1, progress=False, resume=True)
    assert sorted(again.executed) == ["x=2", "x=4"] and again.skipped == ["x=6"]
    back = pd.read_parquet(out / "summary.parquet").set_index("run")
    assert (back.status == "ok").all() and back["metric.value"].notna().all()
