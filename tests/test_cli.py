"""The command line a newcomer meets: `--version`, and for every command a description, its defaults and one
example that the command's own parser accepts; tokenizer options default to the bundled Kimi tokenizer; one
vocabulary (`-o/--output`, `--format`, `--model-dir` vs `--model`, the main input positional) in which every old
spelling still parses, as a deprecated alias, to the same arguments."""
from __future__ import annotations

import argparse
import importlib
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from kimi_eagle.apps.cli import COMMANDS, EXAMPLES, build_parser, deprecated_aliases, main, version


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


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_asset_path_in_a_help_example_exists(name):
    """#35: the examples pointed at ../shared/assets/stories260K, which does not exist (the model is under
    models/stories260K/hf). Every path into the assets that an example names exists, as the page prints it."""
    from kimi_eagle.assets import REPO_ROOT, assets_root

    page = command_parser(name).format_help()
    paths = [w for w in shlex.split(EXAMPLES[name]) if "shared/assets" in w]
    for word in paths:
        assert word in page
        relative = word.split("shared/assets/", 1)[1]
        assert (REPO_ROOT / word).exists() or (assets_root() / relative).exists(), f"{name}: {word} does not exist"
    if name in ("generate", "serve", "audit", "extract", "train", "export-data", "evaluate"):
        assert paths, f"{name}'s example names its model under the assets"


def test_a_misspelt_option_is_named_with_the_nearest_spelling_not_reported_as_a_missing_one(capsys):
    """#35: `--ouput` was reported as "the following arguments are required: -o/--output"."""
    with pytest.raises(SystemExit) as e:
        main(["billing", "runs/x.parquet", "--ouput", "runs/b"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "unrecognized option --ouput (did you mean --output?)" in err
    assert "required" not in err and "Traceback" not in err
    assert command_parser("billing").parse_args(["x.parquet", "--outp", "o"]).out == "o"  # a prefix still works


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_flag_says_what_it_does_and_never_shows_a_default(name):
    """#35: `--fresh` said "(default: True)" and `--no-progress` had no help at all."""
    parser = command_parser(name)
    formatter = parser._get_formatter()
    for action in parser._actions:
        if action.option_strings and action.nargs == 0 and action.help != argparse.SUPPRESS \
                and not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            text = formatter._get_help_string(action) or ""
            assert text.strip() and "default: True" not in text and "default: False" not in text, \
                f"{name} {action.option_strings}: {text!r}"


def test_probe_names_the_tokenizer_once(capsys):
    assert main(["probe"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "kimi:kimi:" not in first and first.startswith("tokenizer kimi (kimi:kimi) — n_vocab 163,840")


def test_a_long_error_reason_is_cut_at_a_word_and_says_so():
    from kimi_eagle.records import error_table

    reason = 'line 3: field "response": ' + "an object with choices and a message " * 8
    line = error_table([reason, reason.replace("3", "4")]).splitlines()[1]
    assert line.endswith(" […] (and alike)") and len(line) < 190
    kept = re.fullmatch(r"\s*2  (.*) \[…\] \(and alike\)", line).group(1)
    assert reason.startswith(kept) and reason[len(kept)] == " "  # cut between words, never inside one


def test_help_shows_the_defaults_of_options(capsys):
    page = command_parser("train").format_help()
    assert "default: 200" in page  # --steps, which has no help text of its own
    assert "eagle3 0.003" in " ".join(page.split())  # --lr: each drafter's recipe default (kimi_eagle.eagle3.recipes)
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


# ---- one vocabulary -------------------------------------------------------------------------------------------

WITHOUT_OUTPUT = {"probe", "parse-completion", "serve"}  # print to stdout, or (serve) append to --records
WITH_CHAT_FORMAT = {"reconstruct", "parse-completion", "simulate", "generate", "serve", "audit"}
MAIN_INPUT_ALIASES = {"billing": "--reconstructed", "evaluate": "--prompts", "extract": "--data", "train": "--data"}
# every old spelling that still parses, by command
OLD_SPELLINGS = {
    **{name: {"--out"} for name in ("audit", "batch", "diff", "export", "export-data", "report", "simulate", "demo")},
    **{name: {"--out", alias} for name, alias in MAIN_INPUT_ALIASES.items()},
    "generate": {"--model", "--chat-format"}, "serve": {"--model", "--chat-format"},
}


def option(parser: argparse.ArgumentParser, spelling: str) -> argparse.Action | None:
    return next((a for a in parser._actions if spelling in a.option_strings), None)


def aliased_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if deprecated_aliases(a)]


def help_page(parser: argparse.ArgumentParser) -> str:
    return " ".join(parser.format_help().split())


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_command_that_writes_files_takes_dash_o_or_dash_dash_output(name):
    parser = command_parser(name)
    short, long = option(parser, "-o"), option(parser, "--output")
    if name in WITHOUT_OUTPUT:
        assert short is None and long is None
    else:
        assert short is not None and short is long, f"`{name}`: -o and --output must be one option"


@pytest.mark.parametrize("name", list(COMMANDS))
def test_the_chat_format_is_spelled_format(name):
    parser = command_parser(name)
    formats = [a for a in parser._actions if a.dest in ("format", "chat_format")]
    assert [a.option_strings[0] for a in formats] == (["--format"] if name in WITH_CHAT_FORMAT else [])


@pytest.mark.parametrize("name", list(COMMANDS))
def test_old_spellings_are_only_deprecated_aliases(name):
    parser = command_parser(name)
    old = {alias for action in aliased_actions(parser) for alias in deprecated_aliases(action)}
    assert old == OLD_SPELLINGS.get(name, set())
    for action in parser._actions:
        for spelling in ("--out", "--chat-format"):
            assert spelling not in action.option_strings or spelling in deprecated_aliases(action)


def test_model_dir_is_a_local_directory_and_model_an_api_name():
    for name in ("generate", "serve"):
        model_dir = option(command_parser(name), "--model-dir")
        assert model_dir is not None and model_dir.required and "directory" in model_dir.help
    for name in ("collect", "audit"):
        parser = command_parser(name)
        model = option(parser, "--model")
        assert option(parser, "--model-dir") is None and not deprecated_aliases(model)
        assert "API model name" in model.help


def alias_cases() -> list[tuple[str, str]]:
    return [(name, alias) for name in COMMANDS for action in aliased_actions(command_parser(name))
            for alias in deprecated_aliases(action)]


def spelled_both_ways(name: str, alias: str) -> tuple[list[str], list[str]]:
    """The command's example, and the same command line with ``alias`` spelling what the example spells anew
    (an option the example lacks is added, with a value its parser accepts)."""
    parser = command_parser(name)
    words = shlex.split(EXAMPLES[name])[2:]
    action = next(a for a in aliased_actions(parser) if alias in deprecated_aliases(a))
    if not action.option_strings:  # a positional main input, given with its old option instead
        value = getattr(parser.parse_args(words), action.dest)
        return words, [w for w in words if w != value] + [alias, value]
    current = [s for s in action.option_strings if s not in deprecated_aliases(action)]
    given = next((w for w in words if w in current), None)
    if given is not None:
        return words, [alias if w == given else w for w in words]
    value = [] if action.nargs == 0 else [str((action.choices or ["x"])[0])]
    return words + [current[-1], *value], words + [alias, *value]


@pytest.mark.parametrize("name, alias", alias_cases())
def test_an_old_spelling_parses_to_the_same_arguments_as_the_new_one(name, alias):
    new, old = spelled_both_ways(name, alias)
    assert new != old
    parser = command_parser(name)
    assert parser.parse_args(old) == parser.parse_args(new)


@pytest.mark.parametrize("name, alias", alias_cases())
def test_help_names_each_old_spelling_as_a_deprecated_alias(name, alias):
    parser = command_parser(name)
    page = help_page(parser)
    assert f"({alias}: deprecated alias)" in page
    spelled = option(parser, alias)
    value = spelled.metavar or ("{" + ",".join(spelled.choices) + "}" if spelled.choices else spelled.dest.upper())
    assert f"{alias} {value}" not in page, "an alias is not listed as a spelling of its own"


@pytest.mark.parametrize("name, alias", MAIN_INPUT_ALIASES.items())
def test_a_main_input_is_positional_and_required_once(name, alias):
    parser = command_parser(name)
    words = shlex.split(EXAMPLES[name])[2:]
    assert alias not in words
    main_input = next(a for a in aliased_actions(parser) if not a.option_strings)
    usage = " ".join(parser.format_usage().split())
    assert f" {main_input.metavar}" in usage and f"[{main_input.metavar}]" not in usage  # shown as required
    value = getattr(parser.parse_args(words), main_input.dest)
    without = [w for w in words if w != value]
    for wrong in (without, words + [alias, value]):  # missing, or given twice
        with pytest.raises(SystemExit):
            parser.parse_args(wrong)


def test_old_spellings_still_run_a_command(tmp_path, capsys):
    """``convert --out`` (an abbreviation argparse always allowed) and ``billing --reconstructed`` keep working."""
    api = tmp_path / "api.jsonl"
    assert main(["convert", "--from", "glaive", "--limit", "2", "--out", str(api)]) == 0
    recon = tmp_path / "recon.parquet"
    assert main(["reconstruct", str(api), "--output", str(recon), "--no-progress"]) == 0
    assert main(["billing", "--reconstructed", str(recon), "--out", str(tmp_path / "old")]) == 0
    assert main(["billing", str(recon), "-o", str(tmp_path / "new")]) == 0
    assert (tmp_path / "old" / "summary.json").read_text() == (tmp_path / "new" / "summary.json").read_text()


def test_the_top_level_help_states_the_vocabulary(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    page = " ".join(capsys.readouterr().out.split())
    for rule in ("main input", "is positional", "-o/--output", "chat format: --format", "--model-dir is a local model "
                 "directory", "--model is a model name sent to an API", "deprecated alias"):
        assert rule in page


def test_only_the_cli_defines_main():
    package = Path(__file__).resolve().parents[1] / "kimi_eagle"
    defining = sorted(str(p.relative_to(package)) for p in package.rglob("*.py")
                      if re.search(r"^def main\(", p.read_text(), re.M))
    assert defining == ["apps/cli.py"]


def test_python_dash_m_kimi_eagle_is_the_cli():
    done = subprocess.run([sys.executable, "-m", "kimi_eagle", "--version"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == f"kimi-eagle {version()}"
