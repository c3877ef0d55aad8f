"""Wrong file kinds are refused before any output (one line, exit 2, nothing written), error summaries keep
real field names and digits, and no command's output replaces another's (issue 24)."""
import gzip
import json
import shutil

import pytest

from kimi_eagle.apps import cli
from kimi_eagle.assets import REPO_ROOT
from kimi_eagle.io import check_jsonl, check_parquet, file_kind_problem
from kimi_eagle.records import error_table

EXAMPLE = REPO_ROOT / "docs" / "examples" / "openai_log.jsonl"


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A real reconstruction (parquet), its gzip, a JSON array and a folder."""
    d = tmp_path_factory.mktemp("kinds")
    assert cli.main(["reconstruct", str(EXAMPLE), "-o", str(d / "recon.parquet"), "--no-progress"]) == 0
    (d / "log.jsonl.gz").write_bytes(gzip.compress(EXAMPLE.read_bytes()))
    (d / "array.json").write_text(json.dumps([json.loads(x) for x in EXAMPLE.read_text().splitlines()]))
    (d / "folder").mkdir()
    return d


KINDS = {"parquet": ("recon.parquet", "Parquet file"), "gzip": ("log.jsonl.gz", "gzip file"),
         "array": ("array.json", "JSON array"), "folder": ("folder", "folder")}


def _refused(argv, capsys, says, out):
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], captured.err
    assert not out.exists(), f"{out} was written"


@pytest.mark.parametrize("kind", ["parquet", "gzip", "array", "folder"])
def test_reconstruct_refuses_a_wrong_file_kind_before_any_output(made, tmp_path, capsys, kind):
    name, says = KINDS[kind]
    out = tmp_path / "new" / "out.parquet"
    _refused(["reconstruct", str(made / name), "-o", str(out), "--no-progress"], capsys, says, out.parent)


@pytest.mark.parametrize("kind", ["parquet", "gzip", "folder"])
def test_convert_refuses_a_wrong_file_kind_before_any_output(made, tmp_path, capsys, kind):
    name, says = KINDS[kind]
    out = tmp_path / "new" / "api.jsonl"
    _refused(["convert", "--from", "openai", str(made / name), "-o", str(out)], capsys, says, out.parent)


@pytest.mark.parametrize("kind", ["parquet", "gzip", "array", "folder"])
def test_diff_refuses_a_wrong_engine_file_kind_before_any_output(made, tmp_path, capsys, kind):
    name, says = KINDS[kind]
    out = tmp_path / "diff"
    _refused(["diff", "--engine", str(made / name), "--reconstructed", str(made / "recon.parquet"), "-o", str(out)],
             capsys, says, out)


@pytest.mark.parametrize("given,says", [("log.jsonl.gz", "gzip file"), ("folder", "folder"), ("array.json", "JSON text")])
def test_billing_and_diff_refuse_what_is_not_the_reconstructed_parquet(made, tmp_path, capsys, given, says):
    _refused(["billing", str(made / given), "-o", str(tmp_path / "b")], capsys, says, tmp_path / "b")
    _refused(["diff", "--engine", str(EXAMPLE), "--reconstructed", str(made / given), "-o", str(tmp_path / "d")],
             capsys, says, tmp_path / "d")


def test_report_refuses_a_file_where_the_diff_folder_is_expected(made, tmp_path, capsys):
    _refused(["report", str(made / "recon.parquet"), "-o", str(tmp_path / "r")], capsys, "this is a file", tmp_path / "r")


def test_the_file_kind_checks_name_each_kind():
    assert "Parquet" in file_kind_problem(b"PAR1\x15\x04")
    assert "gzip" in file_kind_problem(b"\x1f\x8b\x08")
    assert file_kind_problem(b'{"id": "a"}') is None


def test_a_json_array_is_refused_where_jsonl_is_expected_and_accepted_by_convert(made, tmp_path):
    with pytest.raises(ValueError, match="JSON array, not JSONL"):
        check_jsonl(made / "array.json")
    check_jsonl(EXAMPLE)
    check_parquet(made / "recon.parquet")
    assert cli.main(["convert", "--from", "openai", str(made / "array.json"), "-o", str(tmp_path / "a.jsonl")]) == 0


def test_error_summaries_keep_field_names_and_digits(tmp_path, capsys):
    table = error_table(["line 12: invalid UTF-8 at byte 3 (ff: invalid start byte); not UTF-8 text (CESU-8, Latin-1)",
                         "line 40: invalid UTF-8 at byte 7 (ff: invalid start byte); not UTF-8 text (CESU-8, Latin-1)",
                         "missing field 'messages' (is this a glaive file? check --from)"])
    assert "2 kinds" in table and "line 12: invalid UTF-8 at byte 3" in table and "CESU-8, Latin-1" in table
    assert "missing field 'messages'" in table and "UTF-N" not in table
    src = tmp_path / "bad.jsonl"
    src.write_bytes(EXAMPLE.read_bytes() + b'{"id": "x", "request": 5}\n' + b'{"id": "y\xff"}\n')
    assert cli.main(["reconstruct", str(src), "-o", str(tmp_path / "r.parquet"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "line 6: invalid UTF-8 at byte" in out and "UTF-N" not in out


def test_reconstruct_writes_no_lock_file_and_refuses_a_jsonl_output_name(tmp_path, capsys):
    assert cli.main(["reconstruct", str(EXAMPLE), "-o", str(tmp_path / "r.parquet"), "--no-progress"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.parquet"]
    _refused(["reconstruct", str(EXAMPLE), "-o", str(tmp_path / "x.jsonl"), "--no-progress"], capsys,
             "reconstruct writes Parquet", tmp_path / "x.jsonl")


def test_billing_and_report_never_replace_each_others_report(made, tmp_path, capsys):
    shared = tmp_path / "out"
    assert cli.main(["billing", str(made / "recon.parquet"), "-o", str(shared)]) == 0
    before = {p.name: p.read_bytes() for p in shared.iterdir()}
    diff = tmp_path / "diff"
    engine = tmp_path / "engine.jsonl"
    import pandas as pd

    rows = pd.read_parquet(made / "recon.parquet")
    engine.write_text("".join(json.dumps({"id": r.id, "output_ids": [int(x) for x in r.completion_ids]}) + "\n"
                              for r in rows.itertuples()))
    assert cli.main(["diff", "--engine", str(engine), "--reconstructed", str(made / "recon.parquet"), "-o", str(diff)]) == 0
    capsys.readouterr()
    assert cli.main(["report", str(diff), "-o", str(shared)]) == 2
    assert "holds the output of `kimi-eagle billing`" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in shared.iterdir()} == before  # billing's files untouched
    assert cli.main(["report", str(diff), "-o", str(tmp_path / "report")]) == 0
    assert cli.main(["billing", str(made / "recon.parquet"), "-o", str(tmp_path / "report")]) == 2
    assert "holds the output of `kimi-eagle report`" in capsys.readouterr().err
    shutil.rmtree(shared)
