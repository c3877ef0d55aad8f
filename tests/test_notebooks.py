"""Every notebook runs under papermill with small parameters and is committed without outputs."""
import json
import subprocess
import sys

import pytest

from kimi_eagle.apps.batch.notebooks import NOTEBOOK_DIR, execute, notebook_runs

NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
STRIP_KEYS = "metadata.papermill cell.metadata.papermill cell.metadata.execution metadata.widgets"


def test_every_notebook_has_demo_and_test_parameters():
    assert {p.name for p, _ in notebook_runs("test")} == {p.name for p in NOTEBOOKS}


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_clean_and_parameterised(notebook):
    nb = json.loads(notebook.read_text())
    assert any("parameters" in c.get("metadata", {}).get("tags", []) for c in nb["cells"])
    subprocess.run([sys.executable, "-m", "nbstripout", "--verify", "--extra-keys", STRIP_KEYS, str(notebook)], check=True)


@pytest.mark.parametrize("notebook,params", notebook_runs("test"), ids=lambda v: getattr(v, "name", ""))
def test_notebook_executes_with_small_parameters(notebook, params, tmp_path):
    executed = execute(notebook, tmp_path, params)
    nb = json.loads(executed.read_text())
    errors = [o for c in nb["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics, "every notebook writes its headline numbers to metrics.json"
    from kimi_eagle.data_kinds import base_kind

    assert base_kind(metrics.get("data", "missing")), "metrics.json says its data kind (#35: real, simulated, toy, stand-in)"


def test_demo_steps_print_a_heartbeat_until_they_end(capsys):
    import time

    from kimi_eagle.apps.commands.demo import HEARTBEAT_S, heartbeat

    assert HEARTBEAT_S <= 10  # make demo never stays silent longer than this
    with heartbeat("a long step", every=0.05):
        time.sleep(0.33)
    beats = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[demo] still running: a long step [")]
    assert 3 <= len(beats) <= 7
    time.sleep(0.15)
    assert "still running" not in capsys.readouterr().out  # stops with the step


def test_demo_grids_read_this_demos_collections_not_a_stale_runs_demo(tmp_path):
    """`kimi-eagle demo -o ELSEWHERE` points every shipped grid path under runs/demo/ at ELSEWHERE."""
    from kimi_eagle.apps.batch.grid import load_grid
    from kimi_eagle.apps.batch.notebooks import NOTEBOOK_DIR
    from kimi_eagle.apps.commands.demo import demo_grid

    grid = load_grid(NOTEBOOK_DIR / "grids" / "diff_datasets.yaml")
    shipped = [v for r in grid.runs for v in r.params.values() if isinstance(v, str) and v.startswith("runs/demo/")]
    assert shipped, "the shipped grid reads the demo's collections"
    moved = demo_grid(grid, tmp_path / "d")
    values = [v for r in moved.runs for v in r.params.values() if isinstance(v, str)]
    assert not [v for v in values if v.startswith("runs/demo/")]
    assert str(tmp_path / "d" / "00_collect" / "engine_records.jsonl") in values
    assert [r.name for r in moved.runs] == [r.name for r in grid.runs]


def test_demo_heartbeat_names_each_running_notebook_with_its_time_and_what_is_queued():
    import time
    from concurrent.futures import Future

    from kimi_eagle.apps.commands.demo import running_label

    pending = {Future(): "03_eagle3_training.ipynb", Future(): "04_drafter_ablation.ipynb", Future(): "05_provider_audit.ipynb"}
    started = {"03_eagle3_training.ipynb": time.time() - 80, "04_drafter_ablation.ipynb": time.time() - 7}
    building = Future()
    assert running_label(pending, started, building) == ("notebook 03_eagle3_training (1m20s), notebook 04_drafter_ablation (7s); "
                                                         "1 notebook(s) queued; tiny-kimi model training in the background")
    building.set_result(None)
    assert running_label(pending, {}, building) == "notebooks starting; 3 notebook(s) queued"


REUSING = {  # the notebooks that keep an earlier run's work in the same output_dir, and what their rerun must say
    "00_collect.ipynb": lambda p: {"collect": f"{p['limit']}/{p['limit']}"},
    "03_eagle3_training.ipynb": lambda p: {
        **{f"extraction {n}": f"{p['n_samples']}/{p['n_samples']}" for n in ("engine", "recon")},
        **{f"training {n}": f"from step {p['steps']} (trained to {p['steps']})" for n in ("engine", "recon")}},
    "05_provider_audit.ipynb": lambda p: {"collect": f"{3 * p['n_prompts'] * p['repeats']}/{3 * p['n_prompts'] * p['repeats']}"},
}


@pytest.mark.parametrize("notebook,params", [(n, p) for n, p in notebook_runs("test") if n.name in REUSING],
                         ids=lambda v: getattr(v, "name", ""))
def test_a_rerun_says_what_it_reused_and_counts_only_what_it_did(notebook, params, tmp_path):
    """#35: a second run into the same folder used to keep collections and trainings silently while metrics.json
    reported the first run's requests; now ``reused`` names what was kept and the counts are this run's."""
    execute(notebook, tmp_path, params)
    first = json.loads((tmp_path / "metrics.json").read_text())
    assert first["reused"] == {}
    executed = execute(notebook, tmp_path, params)
    second = json.loads((tmp_path / "metrics.json").read_text())
    assert second["reused"] == REUSING[notebook.name](params)
    if "requests" in second or "requested" in second:  # the collections: nothing asked again
        assert second.get("requested", second.get("requests")) == 0 and second.get("retries", 0) == 0
    shown = "".join(o.get("text", "") if isinstance(o.get("text", ""), str) else "".join(o["text"])
                    for c in json.loads(executed.read_text())["cells"] for o in c.get("outputs", []))
    assert "reused: " + ", ".join(f"{k} {v}" for k, v in second["reused"].items()) in shown  # said on screen too


def test_demo_pages_are_the_pages_the_readme_lists():
    """#35: the demo's last lines and README.md listed different pages; both now come from demo_pages."""
    import re
    from pathlib import Path

    from kimi_eagle.apps.commands.demo import demo_pages
    from kimi_eagle.assets import REPO_ROOT

    readme = set(re.findall(r"`(runs/demo/[^`]+\.html)`", (REPO_ROOT / "README.md").read_text()))
    pages = {str(p) for p in demo_pages(Path("runs/demo"))}
    notebook_pages = {f"runs/demo/{n.stem}/{n.stem}.html" for n, _ in notebook_runs("demo")}
    assert notebook_pages <= pages
    assert readme == (pages - notebook_pages) | {"runs/demo/<notebook>/<notebook>.html"}


def test_the_demo_renders_each_executed_notebook_to_html_beside_it(tmp_path):
    from kimi_eagle.apps.commands.demo import _execute_notebook

    notebook, params = next((n, p) for n, p in notebook_runs("test") if n.name == "01_tokenizer_probe.ipynb")
    status, detail, _ = _execute_notebook(notebook, tmp_path, params)
    assert status == "ok", detail
    page = (tmp_path / "01_tokenizer_probe.html").read_text()
    assert page.count("data:image/png;base64,") >= 2  # its charts are in the page, not only on disk
    assert "01 · Tokenizer probe" in page and "output_error" not in page  # the notebook itself, no error output


def test_demo_fresh_removes_earlier_outputs_but_keeps_the_tiny_kimi_cache(tmp_path):
    from kimi_eagle.apps.commands.demo import clear_outputs

    out, cache = tmp_path / "demo", tmp_path / "cache"
    for folder in (out / "00_collect", out / "03_eagle3_training" / "train_engine", out / "batch" / "diff_datasets",
                   out / "tiny_kimi", cache / "tiny_kimi" / "k"):
        folder.mkdir(parents=True)
        (folder / "f").write_text("x")
    (out / "notes.txt").write_text("mine")
    removed = clear_outputs(out, cache)
    assert sorted(p.name for p in removed) == ["00_collect", "03_eagle3_training", "diff_datasets", "tiny_kimi"]
    assert (cache / "tiny_kimi" / "k" / "f").exists() and (out / "notes.txt").exists()
    assert not (out / "00_collect").exists() and (out / "batch").is_dir()
    with pytest.raises(ValueError, match="holds the cache"):
        clear_outputs(out, out / "tiny_kimi" / "cache")


def test_demo_closing_lines_say_what_ran_fresh_and_what_was_reused():
    from kimi_eagle.apps.commands.demo import ledger_lines

    lines = ledger_lines({"notebook 00_collect": {"collect": "48/48"}, "notebook 01_tokenizer_probe": {},
                          "notebook 03_eagle3_training": {"training engine": "from step 120 (trained to 120)"},
                          "batch diff_datasets": {}})
    assert lines[0] == "fresh: notebook 01_tokenizer_probe, batch diff_datasets"
    assert lines[1] == ("reused: notebook 00_collect (collect 48/48); notebook 03_eagle3_training "
                        "(training engine from step 120 (trained to 120))")
    assert "--fresh" in lines[2]
    assert ledger_lines({"a": {}}) == ["fresh: a", "reused: nothing (every step ran fresh)"]


def test_demo_fresh_is_a_flag_without_a_misleading_default():
    import subprocess

    out = subprocess.run([sys.executable, "-m", "kimi_eagle", "demo", "--help"], capture_output=True, text=True, check=True).stdout
    assert "--fresh" in out and "tiny-kimi model under --cache is kept" in " ".join(out.split())
