"""Outputs ready to paste (#35): `--figure-format png|svg|pdf` and `--dpi` wherever charts are written, and
`summary.md` + `summary.csv` beside every `summary.json` holding the same numbers."""
import csv
import json
import struct

import pytest

from kimi_eagle.apps import cli
from kimi_eagle.apps.reports.outputs import DPI_ENV, FORMAT_ENV, write_summary_tables


@pytest.fixture(autouse=True)
def _no_figure_settings(monkeypatch):
    """Each test starts without figure settings, and the settings a command sets do not leak to other tests."""
    monkeypatch.delenv(FORMAT_ENV, raising=False)
    monkeypatch.delenv(DPI_ENV, raising=False)


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    out = tmp_path_factory.mktemp("sim")
    assert cli.main(["simulate", "-o", str(out), "--per-effect", "2", "--run"]) == 0
    return out


def png_width(path) -> int:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">I", data[16:20])[0]


def test_report_writes_every_chart_as_svg_too_at_the_chosen_dpi(sim, tmp_path):
    assert cli.main(["report", str(sim / "diff"), "-o", str(tmp_path / "plain")]) == 0
    assert cli.main(["report", str(sim / "diff"), "-o", str(tmp_path / "svg"), "--figure-format", "svg", "--dpi", "220"]) == 0
    pngs = sorted(p.name for p in (tmp_path / "svg").glob("*.png"))
    assert pngs and pngs == sorted(p.name for p in (tmp_path / "plain").glob("*.png"))
    assert sorted(p.stem for p in (tmp_path / "svg").glob("*.svg")) == sorted(p[:-4] for p in pngs)
    assert not list((tmp_path / "plain").glob("*.svg"))  # PNG only by default
    for name in pngs:
        assert (tmp_path / "svg" / name).with_suffix(".svg").read_text().lstrip().startswith(("<?xml", "<svg"))
        ratio = png_width(tmp_path / "svg" / name) / png_width(tmp_path / "plain" / name)
        assert ratio == pytest.approx(220 / 110, rel=0.03), name  # the report's charts default to 110 dpi


def test_billing_writes_pdf_charts_and_summary_tables(sim, tmp_path):
    out = tmp_path / "billing"
    assert cli.main(["billing", str(sim / "reconstructed.parquet"), "-o", str(out), "--figure-format", "pdf"]) == 0
    pngs = list(out.glob("*.png"))
    assert pngs and all(p.with_suffix(".pdf").read_bytes()[:5] == b"%PDF-" for p in pngs)
    assert_tables_hold_the_summary(out / "summary.json")


def test_a_figure_format_outside_the_choices_is_a_one_line_usage_error(sim, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["report", str(sim / "diff"), "-o", str(tmp_path / "r"), "--figure-format", "jpeg"])
    assert e.value.code == 2 and "invalid choice: 'jpeg'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["report", str(sim / "diff"), "-o", str(tmp_path / "r"), "--dpi", "5"])
    assert not (tmp_path / "r").exists()


def dotted(value, prefix=""):
    """A nested dict's plain values by dotted key (a list of plain values as comma-separated text)."""
    if isinstance(value, dict):
        return {k2: v2 for k, v in value.items() for k2, v2 in dotted(v, f"{prefix}.{k}" if prefix else str(k)).items()}
    if isinstance(value, list) and not any(isinstance(v, (dict, list)) for v in value):
        return {prefix: ", ".join(map(str, value))}
    return {prefix: json.dumps(value) if isinstance(value, list) else value}


def cells(summary):
    """Every number of a summary as ``(section, row, field) -> value``: top-level plain values in section
    ``summary``, a dict as its own section, a list of records one row each, named by its first text field."""
    for key, value in summary.items():
        if isinstance(value, dict) and set(value) == {"classes", "matrix"}:  # a confusion matrix: a row per class
            for c, row in zip(value["classes"], value["matrix"]):
                yield (key, c, "expected"), c
                for col, n in zip(value["classes"], row):
                    yield (key, c, col), n
        elif isinstance(value, list) and value and all(isinstance(r, dict) for r in value):
            for i, record in enumerate(value):
                name = next((v for v in record.values() if isinstance(v, str)), str(i))
                for field, v in dotted(record).items():
                    yield (key, name, field), v
        elif isinstance(value, dict):
            for field, v in dotted(value).items():
                yield (key, "", field), v
        elif not isinstance(value, list) or not any(isinstance(v, (dict, list)) for v in value):
            yield ("summary", "", key), dotted(value)[""]


def assert_tables_hold_the_summary(json_path):
    summary = json.loads(json_path.read_text())
    with open(json_path.with_suffix(".csv"), newline="") as f:
        got = {(r["section"], r["row"], r["field"]): r["value"] for r in csv.DictReader(f)}
    want = {k: "" if v is None else str(v) for k, v in cells(summary)}
    assert got == want
    md = json_path.with_suffix(".md").read_text()
    assert all(f"## {k}" in md for k, v in summary.items() if isinstance(v, dict) and v)


def test_report_writes_summary_md_and_csv_beside_summary_json(sim, tmp_path):
    assert cli.main(["report", str(sim / "diff"), "-o", str(tmp_path / "r")]) == 0
    assert_tables_hold_the_summary(tmp_path / "r" / "summary.json")


def test_a_collection_summary_gets_its_tables_under_its_own_name(tmp_path):
    summary = {"prompts": 3, "already_done": 1, "requested": 2, "failure_reasons": {"http_503": 2}, "aborted": None,
               "totals": {"records": 3, "cost": 0.25}}
    path = tmp_path / "responses.jsonl.summary.json"
    path.write_text(json.dumps(summary))
    md, table = write_summary_tables(summary, path)
    assert (md.name, table.name) == ("responses.jsonl.summary.md", "responses.jsonl.summary.csv")
    assert_tables_hold_the_summary(path)
    assert "| http_503 | 2 |" in md.read_text()


def test_a_confusion_matrix_is_a_table_of_its_own_in_summary_md(tmp_path):
    """#46: the matrix is a row per expected class, a column per given label, never one JSON cell."""
    summary = {"confusion": {"classes": ["exact", "semantic"], "matrix": [[3, 1], [0, 2]]}}
    md, table = write_summary_tables(summary, tmp_path / "summary.json")
    text = md.read_text()
    assert "| expected | exact | semantic |" in text and "| exact | 3 | 1 |" in text and "| semantic | 0 | 2 |" in text
    assert "[[3, 1]" not in text and "[[3, 1]" not in table.read_text()


def test_summary_tables_neutralise_formulas_and_escape_markdown_but_keep_numbers(tmp_path):
    """#47: a provider named like a formula is text in the CSV; numbers (negative ones too) stay numbers; -0.0 is 0."""
    summary = {"by_provider": [{"provider": "=HYPERLINK(\"http://e\",\"x\")", "gap": -3.5, "n": -2},
                               {"provider": "@SUM(A1)", "gap": -0.0, "n": 4},
                               {"provider": "a|b\n## heading\x1b[31m", "gap": 1.0, "n": 1}]}
    md, table = write_summary_tables(summary, tmp_path / "summary.json")
    with open(table, newline="") as f:
        rows = list(csv.reader(f))
    cells = {c for r in rows for c in r}
    assert "'=HYPERLINK(\"http://e\",\"x\")" in cells and "'@SUM(A1)" in cells
    assert not any(c.startswith(("=", "@", "+", "\t", "\r")) for c in cells)
    assert "-3.5" in cells and "-2" in cells and "-0.0" not in cells  # numbers stay numbers
    text = md.read_text()
    assert "\n## heading" not in text and "| a\\|b ## heading\\\\x1b[31m |" in text and "\x1b" not in text
    assert "-0 " not in text and "| 0 |" in text
