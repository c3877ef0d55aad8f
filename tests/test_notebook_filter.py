"""Tracked notebooks carry no outputs, and git strips the outputs JupyterLab writes before a notebook is staged (#35)."""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

import pytest

from kimi_eagle.assets import REPO_ROOT

STRIP_KEYS = "metadata.papermill cell.metadata.papermill cell.metadata.execution metadata.widgets"


def tracked_notebooks() -> list[str]:
    out = subprocess.run(["git", "ls-files", "*.ipynb"], cwd=REPO_ROOT, capture_output=True, text=True)
    if out.returncode:
        pytest.skip("not a git checkout")
    return out.stdout.split()


def test_every_tracked_notebook_carries_no_outputs():
    names = tracked_notebooks()
    assert any(n.startswith("notebooks/") for n in names)
    for name in names:
        nb = json.loads((REPO_ROOT / name).read_text(encoding="utf-8"))
        code = [c for c in nb["cells"] if c["cell_type"] == "code"]
        assert all(not c.get("outputs") and c.get("execution_count") is None for c in code), f"{name} has outputs"
        assert not {"papermill", "widgets"} & set(nb["metadata"]), f"{name} keeps run metadata"
        assert not any({"papermill", "execution"} & set(c.get("metadata", {})) for c in nb["cells"]), name


def test_git_routes_notebooks_through_the_documented_strip_filter():
    attributes = (REPO_ROOT / ".gitattributes").read_text(encoding="utf-8")
    assert re.search(r"^\*\.ipynb\s+filter=nbstripout\s*$", attributes, re.M)
    docs = (REPO_ROOT / "docs" / "reference.md").read_text(encoding="utf-8")
    clean = re.search(r"git config filter\.nbstripout\.clean (\".*\")", docs).group(1)
    command = shlex.split(shlex.split(clean)[0])
    assert command[-2:] == ["--extra-keys", STRIP_KEYS]  # the same keys the check above verifies
    assert "git config filter.nbstripout.smudge cat" in docs


def test_the_documented_clean_command_strips_an_executed_notebook(tmp_path):
    """What git would stage: the clean filter, fed a notebook with outputs on stdin, writes it without them."""
    nb = json.loads((REPO_ROOT / "notebooks" / "01_tokenizer_probe.ipynb").read_text(encoding="utf-8"))
    cell = next(c for c in nb["cells"] if c["cell_type"] == "code")
    cell.update(execution_count=3, outputs=[{"output_type": "stream", "name": "stdout", "text": "hello\n"}])
    nb["metadata"]["papermill"] = {"duration": 1.0}
    out = subprocess.run([sys.executable, "-m", "nbstripout", "--extra-keys", STRIP_KEYS],
                         input=json.dumps(nb), capture_output=True, text=True, check=True).stdout
    stripped = json.loads(out)
    code = [c for c in stripped["cells"] if c["cell_type"] == "code"]
    assert all(not c["outputs"] and c["execution_count"] is None for c in code)
    assert "papermill" not in stripped["metadata"]
