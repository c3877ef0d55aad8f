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


def test_demo_steps_print_a_heartbeat_until_they_end(capsys):
    import time

    from kimi_eagle.apps.commands.demo import HEARTBEAT_S, heartbeat

    assert HEARTBEAT_S <= 10  # make demo never stays silent longer than this
    with heartbeat("a long step", every=0.05):
        time.sleep(0.33)
    beats = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[demo] a long step: still running")]
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
