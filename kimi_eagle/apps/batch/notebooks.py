"""Execute the kit's parameterised notebooks with papermill.

``notebooks/runs.yaml`` names, for every notebook, the parameters of its ``demo`` run and its
small ``test`` run; ``make demo`` and the tests both read it, so neither can forget a notebook.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from kimi_eagle.assets import REPO_ROOT

NOTEBOOK_DIR = REPO_ROOT / "notebooks"
RUNS_FILE = NOTEBOOK_DIR / "runs.yaml"
KERNEL = "python3"
# the kernel logs only errors: no "Kernel is running over TCP without encryption" warning per notebook (the
# kernel listens on 127.0.0.1 only, for the one client papermill starts)
KERNEL_ARGUMENTS = ["--IPKernelApp.log_level=ERROR"]


def notebook_runs(kind: str) -> list[tuple[Path, dict[str, Any]]]:
    """``[(notebook path, parameters)]`` for ``kind`` (``demo`` or ``test``), in file order."""
    spec = yaml.safe_load(RUNS_FILE.read_text()) or {}
    return [(NOTEBOOK_DIR / name, dict(entry.get(kind) or {})) for name, entry in spec.items()]


def execute(notebook: str | Path, output_dir: str | Path, parameters: dict[str, Any] | None = None,
            progress: bool = False, cwd: str | Path | None = None) -> Path:
    """Run ``notebook`` into ``output_dir/<name>`` with ``output_dir`` passed as a parameter.

    Returns the executed notebook's path. papermill raises ``PapermillExecutionError`` naming
    the failing cell; the partially executed notebook is still written.
    """
    import papermill as pm

    notebook, output_dir = Path(notebook), Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    params = {"output_dir": str(output_dir.resolve()), **(parameters or {})}
    out = output_dir / notebook.name
    pm.execute_notebook(
        str(notebook), str(out), parameters=params, kernel_name=KERNEL, progress_bar=progress,
        cwd=str(cwd or REPO_ROOT), log_output=False, extra_arguments=KERNEL_ARGUMENTS,
    )
    return out


def parameter_names(notebook: str | Path) -> dict[str, dict[str, Any]]:
    """The notebook's declared parameters (name -> papermill's inferred type, default, help)."""
    import papermill as pm

    return pm.inspect_notebook(str(notebook))
