"""#46: the README's "Review outputs" section names compare, --figure-format, summary.md/csv and providers, and gives
one papermill command line per notebook family, each naming a notebook that exists and only parameters it declares."""
import re
import shlex

from kimi_eagle.apps.batch.notebooks import parameter_names
from kimi_eagle.assets import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()
FAMILIES = ("00_", "01_", "02_", "03_", "05_")  # collect, tokenizer/reconstruct, validation, drafters, audit


def test_the_review_section_names_every_review_output():
    section = README.split("## Review outputs", 1)[1].split("\n## ", 1)[0]
    for word in ("kimi-eagle compare", "--figure-format", "summary.md", "summary.csv", "kimi-eagle providers"):
        assert word in section


def test_one_papermill_line_per_notebook_family_with_declared_parameters_only():
    lines = [line.split("#", 1)[0] for line in README.splitlines() if line.strip().startswith(".venv/bin/papermill")]
    notebooks = [shlex.split(line)[1] for line in lines]
    assert [re.sub(r"^notebooks/", "", n)[:3] for n in notebooks] == list(FAMILIES)
    for line, notebook in zip(lines, notebooks):
        declared = parameter_names(REPO_ROOT / notebook)
        given = re.findall(r"-p (\w+)", line)
        assert "output_dir" in given and set(given) <= set(declared), (notebook, set(given) - set(declared))


def test_providers_prints_a_column_key_and_never_shows_a_one_record_group_as_explained(capsys):
    from kimi_eagle.apps.cli import main

    assert main(["providers", str(REPO_ROOT / "docs" / "examples" / "openai_log.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "\ncolumns: n = the group's records;" in out
    one_record = [line for line in out.splitlines() if line.startswith("| Together |")]
    assert one_record and "THIN" in one_record[0] and "rests on 1 record(s)" in one_record[0]
