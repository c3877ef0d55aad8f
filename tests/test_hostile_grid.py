"""Hostile grids for `kimi-eagle batch`: every attack is refused before anything runs, with a one-line message.

Each case plants one attack in a grid file and runs the real CLI on the probe notebook: exit 2, a message that
names the problem, no RUN_DIR, and no marker file (the `!!binary` payloads would write one if they became code,
which ``test_the_binary_payload_is_live_code_under_papermill_rendering`` shows they would)."""
from __future__ import annotations

import base64
import math
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kimi_eagle.apps.batch.grid import MAX_NODES, MAX_RUNS, GridError, check_value, expand, load_grid, validate
from kimi_eagle.apps.batch.notebooks import parameter_names
from kimi_eagle.apps.cli import main as cli_main

PROBE = Path(__file__).parent / "data" / "batch_probe.ipynb"


def payload(marker: Path) -> str:
    """Base64 of bytes that papermill's fallback rendering (``"b'...'"`` with the quote left open) turns into
    a statement writing ``marker``."""
    code = f'"; open("{marker}", "w").write("ran"); "'.encode()  # no single quote: bytes repr leaves " bare
    return base64.b64encode(code).decode()


def laughs(levels: int = 9, width: int = 9) -> str:
    """Billion laughs: ``levels`` anchors, each a list of ``width`` aliases of the one before (9**9 values)."""
    lines = [f"  a0: &a0 [{', '.join(['lol'] * width)}]"]
    for k in range(1, levels):
        lines.append(f"  a{k}: &a{k} [{', '.join([f'*a{k - 1}'] * width)}]")
    return "fixed:\n" + "\n".join(lines) + "\n"


def attacks(marker: Path) -> dict[str, tuple[str, str]]:
    """``{case: (grid YAML, expected message part)}``; each case named after what it plants."""
    b64 = payload(marker)
    return {
        "binary_in_a_list_parameter": (f"fixed:\n  counter_dir: [a, !!binary {b64}]\n", "!!binary is bytes"),
        "binary_for_a_none_default": (f"fixed:\n  counter_dir: !!binary {b64}\n", "!!binary is bytes"),
        "binary_nested_in_a_mapping": (f"fixed:\n  counter_dir: {{a: {{b: [1, !!binary {b64}]}}}}\n", "!!binary is bytes"),
        "binary_as_a_sweep_value": (f"sweep:\n  label: [a, !!binary {b64}]\n", "!!binary is bytes"),
        "binary_as_a_run_name": (f"runs:\n  - {{_name: !!binary {b64}, x: 1}}\n", "!!binary is bytes"),
        "set_value": ("fixed:\n  counter_dir: !!set {a, b}\n", "!!set is a set"),
        "omap_value": ("fixed:\n  counter_dir: !!omap [{a: 1}]\n", "!!omap is ordered pairs"),
        "pairs_value": ("fixed:\n  counter_dir: !!pairs [{a: 1}]\n", "!!pairs is pairs"),
        "date_value": ("fixed:\n  label: 2024-01-01\n", "a date (quote it"),
        "datetime_value": ("fixed:\n  label: 2024-01-01T10:00:00Z\n", "a date (quote it"),
        "python_object_apply": (f"fixed:\n  label: !!python/object/apply:os.system [\"touch {marker}\"]\n",
                                "is not allowed (plain data only)"),
        "python_name": ("fixed:\n  label: !!python/name:os.system\n", "is not allowed (plain data only)"),
        "python_module": ("fixed:\n  label: !!python/module:os\n", "is not allowed (plain data only)"),
        "python_bytes": ("fixed:\n  label: !!python/bytes YWJj\n", "is not allowed (plain data only)"),
        "python_tuple": ("fixed:\n  label: !!python/tuple [1, 2]\n", "is not allowed (plain data only)"),
        "custom_local_tag": ("fixed:\n  label: !evil x\n", "is not allowed (plain data only)"),
        "billion_laughs": (laughs(), f"more than {MAX_NODES} values"),
        "billion_laughs_in_a_parameter": ("fixed:\n  counter_dir: &a [[1,1,1,1,1,1,1,1,1,1]]\n"
                                          + "".join(f"  p{k}: &a{k} [{', '.join(['*a' if k == 0 else f'*a{k - 1}'] * 10)}]\n"
                                                    for k in range(8)), f"more than {MAX_NODES} values"),
        "recursive_alias_list": ("fixed:\n  counter_dir: &a [1, *a]\n", "recursive alias"),
        "recursive_alias_mapping": ("fixed: &a {counter_dir: *a}\n", "recursive alias"),
        "recursive_alias_via_merge": ("fixed: &a {<<: *a, x: 1}\n", "recursive alias"),
        "nesting_5000_deep": ("fixed:\n  counter_dir: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
        "nesting_40_deep": ("fixed:\n  counter_dir: " + "[" * 40 + "]" * 40 + "\n", "nested more than 32 levels"),
        "integer_of_5000_digits": ("fixed:\n  x: " + "9" * 5000 + "\n", "a value cannot be read"),
        "infinite_float": ("fixed:\n  scale: .inf\n", "not a finite number"),
        "nan_float": ("fixed:\n  scale: .nan\n", "not a finite number"),
        "overflowing_float": ("fixed:\n  scale: 1.0e+999\n", "not a finite number"),
        "float_spelled_without_a_dot_is_text": ("fixed:\n  scale: 1e999\n", "'1e999' is str"),
        "lone_surrogate": ('fixed:\n  label: "\\ud83d"\n', "lone surrogate"),
        "integer_parameter_name": ("fixed: {1: 2}\n", "parameter name 1 is int"),
        "null_parameter_name": ("fixed: {null: 2}\n", "parameter name None is NoneType"),
        "bool_key_inside_a_value": ("fixed:\n  counter_dir: {yes: 1}\n", "keys are strings"),
        "name_is_batch_json": ("runs:\n  - {_name: batch.json, x: 1}\n", "one of the batch's own files"),
        "name_is_batch_lock": ("runs:\n  - {_name: batch.lock, x: 1}\n", "one of the batch's own files"),
        "name_is_summary_html": ("runs:\n  - {_name: summary.html, x: 1}\n", "one of the batch's own files"),
        "name_is_summary_parquet_uppercase": ("runs:\n  - {_name: SUMMARY.PARQUET, x: 1}\n", "one of the batch's own files"),
        "name_is_charts": ("runs:\n  - {_name: charts, x: 1}\n", "one of the batch's own files"),
        "name_of_300_characters": ("runs:\n  - {_name: " + "a" * 300 + ", x: 1}\n", "at most 80"),
        "name_is_a_number": ("runs:\n  - {_name: 7, x: 1}\n", "_name must be a string"),
        "names_differing_in_case": ("runs:\n  - {_name: Run, x: 1}\n  - {_name: run, x: 2}\n", "the same run"),
        "sweep_of_100000_runs": ("sweep:\n" + "".join(f"  p{k}: [1,2,3,4,5,6,7,8,9,10]\n" for k in range(5)),
                                 f"at most {MAX_RUNS}"),
        "notebook_entry_not_a_path": ("notebook: 5\nfixed: {x: 1}\n", "notebook must be a path"),
        "grid_of_2_mib": ("fixed:\n  label: " + "a" * (2 << 20) + "\n", "bytes; at most"),
        "grid_not_yaml": ("fixed: [unclosed\n", "not valid YAML"),
        "grid_is_a_list": ("- 1\n- 2\n", "a grid is a mapping"),
    }


CASES = sorted(attacks(Path("/m")))


@pytest.mark.parametrize("case", CASES)
def test_each_planted_attack_is_refused_before_anything_runs(case, tmp_path, capsys):
    marker = tmp_path / "MARKER"
    text, message = attacks(marker)[case]
    grid = tmp_path / "grid.yaml"
    grid.write_text(text)
    out = tmp_path / "run"
    t0 = time.monotonic()
    rc = cli_main(["batch", str(PROBE), "--grid", str(grid), "-o", str(out), "--no-progress"])
    elapsed = time.monotonic() - t0
    err = capsys.readouterr().err
    assert rc == 2, err
    assert message in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err  # one line, no traceback
    assert not marker.exists() and not out.exists()
    assert elapsed < 120, f"{case} took {elapsed:.1f} s"  # refused up front: a hang guard, not a speed test


def test_the_binary_payload_is_live_code_under_papermill_rendering(tmp_path):
    """The positive control: papermill's fallback rendering of the bytes a `!!binary` value holds is a statement
    that writes the marker (what the grid loader now refuses)."""
    from papermill.translators import PythonTranslator

    marker = tmp_path / "MARKER"
    value = base64.b64decode(payload(marker))
    source = f"counter_dir = {PythonTranslator.translate(value)}"
    exec(compile(source, "<injected cell>", "exec"), {})  # noqa: S102 - the control proves the attack is real
    assert marker.read_text() == "ran"


def test_values_built_in_python_are_checked_too(tmp_path):
    """A grid made in Python (``run_batch(grid=...)``) passes through the same whitelist in ``validate``."""
    declared = parameter_names(PROBE)
    for bad, message in [(b"x", "bytes"), ({1, 2}, "set"), ((1, 2), "tuple"), (math.inf, "not a finite"),
                         ([[object()]], "object"), ({"k": {"n": b"y"}}, "bytes")]:
        grid = expand({"runs": [{"_name": "r", "counter_dir": "ok"}]})
        grid.runs[0].params["counter_dir"] = bad
        with pytest.raises(GridError, match=message):
            validate(grid.runs, declared, PROBE.name)


def test_plain_grids_still_load_unchanged(tmp_path):
    grid = tmp_path / "g.yaml"
    grid.write_text("base: &base {scale: 2.0, label: b}\n".replace("base:", "fixed:") +
                    "sweep: {x: [1, 2]}\nruns:\n  - {_name: tiny, x: 0, counter_dir: {a: [1, null, true, 'x']}}\n")
    runs = load_grid(grid).runs
    assert [r.name for r in runs] == ["x=1", "x=2", "tiny"]
    assert runs[2].params == {"scale": 2.0, "label": "b", "x": 0, "counter_dir": {"a": [1, None, True, "x"]}}
    validate(runs, parameter_names(PROBE), PROBE.name)


def test_small_aliases_and_merge_keys_are_still_plain_data(tmp_path):
    grid = tmp_path / "g.yaml"
    grid.write_text("fixed: &f {label: a, scale: 1.5}\nruns:\n  - {<<: *f, _name: one, x: 3}\n")
    runs = load_grid(grid).runs
    assert runs[-1].params == {"label": "a", "scale": 1.5, "x": 3}


# ---- fuzzing: whatever the YAML, plain data comes back or a GridError, never anything else ----

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=False, allow_infinity=False),
                     st.text(alphabet=st.characters(blacklist_categories=("Cs",),  # YAML line breaks: PyYAML's
                                                    blacklist_characters="\x85\u2028\u2029"), max_size=12))  # dumper folds them
_values = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(st.text(st.characters(
                                                             blacklist_categories=("Cs",), blacklist_characters="\x85\u2028\u2029"),
                                                             min_size=1, max_size=6), inner, max_size=4)),
                       max_leaves=20)
_tokens = st.sampled_from(["!!binary YWJj", "!!set {a}", "!!python/tuple [1]", "!!timestamp 2020-01-01", "&a [1, 2]",
                           "*a", "&b {k: *b}", "[", "]", "{", "}", ": ", "- ", "\n  ", "x", "1", "1e999", ".nan",
                           "<<: *a", "? ", "|\n  text", "!foo 1", "\"\\ud800\"", "~", "2024-02-30", "'q'", ","])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_tokens, max_size=25))
def test_fuzzed_grid_yaml_gives_plain_data_or_a_grid_error(tmp_path, tokens):
    grid = tmp_path / "fuzz.yaml"
    grid.write_text("fixed:\n  p: " + "".join(tokens) + "\n")
    t0 = time.monotonic()
    try:
        runs = load_grid(grid).runs
    except GridError as e:
        assert "\n" not in str(e).strip()
        return
    finally:
        assert time.monotonic() - t0 < 120  # a hang guard, not a speed test
    for run in runs:
        for name, value in run.params.items():
            check_value(value, name)  # would raise for anything but plain, finite, valid-Unicode data


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True), _values, min_size=1, max_size=4))
def test_fuzzed_plain_values_round_trip_through_a_grid_file_without_coercion(tmp_path, params):
    grid = tmp_path / "plain.yaml"
    grid.write_text(yaml.safe_dump({"runs": [{"_name": "r", **params}]}, allow_unicode=True))
    assert load_grid(grid).runs[0].params == params
