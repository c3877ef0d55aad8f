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
