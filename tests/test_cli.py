"""The command line a newcomer meets: `--version`, and for every command a description, its defaults and one
example that the command's own parser accepts; tokenizer options default to the bundled Kimi tokenizer."""
from __future__ import annotations

import argparse
import importlib
import shlex

import pytest

from kimi_eagle.apps.cli import COMMANDS, EXAMPLES, build_parser, main, version


def command_parser(name: str) -> argparse.ArgumentParser:
    parser = build_parser([name])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def test_version_prints_the_installed_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"kimi-eagle {version()}" and version()[0].isdigit()


def test_every_command_has_an_example():
    assert set(EXAMPLES) == set(COMMANDS)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_command_help_has_the_modules_description_and_an_example_its_parser_accepts(name):
    parser = command_parser(name)
    page = parser.format_help()
    doc = (importlib.import_module(COMMANDS[name][0]).__doc__ or "").strip()
    assert doc, f"{COMMANDS[name][0]} has no docstring to describe `{name}`"
    first_line = doc.splitlines()[0].replace("``", "`")
    assert first_line in page
    assert f"example:\n  {EXAMPLES[name]}" in page
    words = shlex.split(EXAMPLES[name])
    assert words[:2] == ["kimi-eagle", name]
    parser.parse_args(words[2:])  # exits (SystemExit) if the example is not a valid command line


def test_help_shows_the_defaults_of_options(capsys):
    page = command_parser("train").format_help()
    assert "default: 200" in page  # --steps, which has no help text of its own
    assert "default: 0.003" in page  # --lr
    assert "default: 0\n" in page  # --seed: a zero default is still shown
    assert "--resume" in page and "default: False" not in page  # flags do not advertise False
    batch = command_parser("batch").format_help()
    assert "(default 2)" in batch and "(default: 2)" not in batch  # a help text that states its default is kept


@pytest.mark.parametrize("name", [n for n in COMMANDS if "--tokenizer" in command_parser(n).format_help()])
def test_tokenizer_defaults_to_the_bundled_kimi_tokenizer_everywhere(name):
    action = next(a for a in command_parser(name)._actions if "--tokenizer" in a.option_strings)
    assert not action.required and action.default is None, f"`{name} --tokenizer` must be optional"
    assert "Kimi" in (action.help or ""), f"`{name} --tokenizer` help should say what the default is"


def test_probe_runs_without_a_tokenizer_argument(capsys):
    assert main(["probe", "--check-ids", "163533,163586"]) == 0
    out = capsys.readouterr().out
    assert "n_vocab 163,840" in out
