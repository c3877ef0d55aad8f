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
