"""The project's set-up contract: two README commands, CI calls the test command, conda and pip agree."""
import re
import tomllib

import yaml

from kimi_eagle.assets import REPO_ROOT


def test_environment_yml_installs_the_project_and_pins_torch_like_pyproject():
    env = yaml.safe_load((REPO_ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    deps = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    torch_pin = next(d for d in deps if d.startswith("torch"))
    assert torch_pin == "torch==2.13.0"
    assert torch_pin in pip
    assert "-e .[dev]" in pip
    assert not [d for d in env["dependencies"] if isinstance(d, str) and not d.startswith(("python", "pip"))], \
        "environment.yml must not list packages of its own: pyproject.toml is the single dependency list"


def test_environment_yml_python_meets_requires_python():
    env = yaml.safe_load((REPO_ROOT / "environment.yml").read_text())
    python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python="))
    required = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert required == ">=3.11" and tuple(map(int, python.split("=")[1].split("."))) >= (3, 11)


def test_readme_shows_exactly_two_setup_commands():
    readme = (REPO_ROOT / "README.md").read_text()
    setup = readme.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"^\s*(make \w[\w-]*)\s*(?:#.*)?$", setup, flags=re.M)
    assert commands == ["make demo", "make test"]
    assert len(re.findall(r"^\s*make \w", readme, flags=re.M)) == 2, "no other make command in the README"


def test_ci_runs_the_readme_test_command():
    assert "make test" in (REPO_ROOT / ".ci" / "run").read_text()


def test_readme_is_a_user_guide_of_at_most_150_lines():
    """Measurements live in docs/results.md; the README stays short enough to read in one sitting."""
    readme = (REPO_ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    assert "docs/results.md" in readme


def test_the_install_prints_its_progress_instead_of_staying_silent():
    """#35: `pip install -q` kept a cold `make demo` silent for minutes; each stage now prints a line, and pip its
    line per package (no -q, no progress bars that a log cannot show)."""
    makefile = (REPO_ROOT / "Makefile").read_text()
    recipe = makefile.split("$(STAMP): pyproject.toml", 1)[1].split("\n\n", 1)[0]
    assert " -q" not in recipe and "PIP_INSTALL" in recipe
    assert re.search(r"^PIP_INSTALL := .*pip install --progress-bar off", makefile, re.M)
    stages = re.findall(r'@echo "\[install (\d)/(\d)\]', recipe)
    assert [int(k) for k, _ in stages] == list(range(1, len(stages) + 1)) and {n for _, n in stages} == {str(len(stages))}
    assert recipe.count("$(PIP_INSTALL)") == 3
