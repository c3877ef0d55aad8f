"""The data kind a page states comes from the data (#46): `billing` and `report` read it from their inputs'
provenance (a benchmark's labels, the diff's meta.json, the engine's model), `--data` may only make it more
cautious, and `compare` reads a diff folder's kind the same way."""
import json

import pytest

from kimi_eagle.apps import cli


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    root = tmp_path_factory.mktemp("prov") / "sim"
    assert cli.main(["simulate", "-o", str(root), "--per-effect", "1", "--seed", "0", "--run"]) == 0
    return root


def test_billing_on_a_simulated_reconstruction_says_simulated_without_being_told(sim, tmp_path, capsys):
    assert cli.main(["billing", str(sim / "reconstructed.parquet"), "-o", str(tmp_path / "b")]) == 0
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    metrics = json.loads((tmp_path / "b" / "metrics.json").read_text())
    assert summary["data"] == "simulated" and metrics["data"] == "simulated"
    page = (tmp_path / "b" / "report.html").read_text()
    assert "[REAL data]" not in page and "real data" not in page.lower().replace("not real data", "")


def test_billing_refuses_to_call_a_benchmark_real(sim, tmp_path, capsys):
    code = cli.main(["billing", str(sim / "reconstructed.parquet"), "-o", str(tmp_path / "b"), "--data", "real"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--data real: the inputs are simulated data" in err[0]
    assert not (tmp_path / "b" / "summary.json").exists()


def toy_engine(sim, tmp_path):
    """The benchmark's engine records as a tiny-kimi engine wrote them (each names its model)."""
    path = tmp_path / "engine.jsonl"
    lines = [json.loads(line) for line in (sim / "engine.jsonl").read_text().splitlines() if line.strip()]
    path.write_text("".join(json.dumps({**r, "model": "tiny-kimi"}) + "\n" for r in lines))
    return path


def test_a_toy_engine_diff_is_toy_in_its_meta_its_report_and_compare(sim, tmp_path, capsys):
    diff = tmp_path / "diff"
    assert cli.main(["diff", "--engine", str(toy_engine(sim, tmp_path)), "--reconstructed",
                     str(sim / "reconstructed.parquet"), "-o", str(diff)]) == 0
    assert json.loads((diff / "meta.json").read_text())["data"] == "toy"
    capsys.readouterr()
    assert cli.main(["report", str(diff), "-o", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("toy data:") and "real data" not in out
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["data"] == "toy"
    assert cli.main(["compare", str(diff), str(sim / "diff"), "-o", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "different kinds of data (A toy, B simulated)" in out


def test_report_reads_the_kind_a_diff_folders_meta_states(sim, tmp_path, capsys):
    import shutil

    diff = tmp_path / "diff"
    shutil.copytree(sim / "diff", diff)
    meta = json.loads((diff / "meta.json").read_text())
    (diff / "meta.json").write_text(json.dumps({**meta, "data": "toy"}))
    assert cli.main(["report", str(diff), "-o", str(tmp_path / "r")]) == 0
    assert capsys.readouterr().out.startswith("toy data: ")
    assert cli.main(["report", str(diff), "-o", str(tmp_path / "r2"), "--data", "real"]) == 2
    assert "--data real: the inputs are toy data (its meta.json says so)" in capsys.readouterr().err


def test_notebook_04_takes_its_data_kind_from_its_target_not_a_hard_coded_real():
    """#46: notebook 04 titled its stories260K chart "[REAL data]" and wrote "data": "real"; both now come from the
    target model (stories260K: toy)."""
    from kimi_eagle.assets import REPO_ROOT, stories_dir
    from kimi_eagle.data_kinds import model_kind

    nb = json.loads((REPO_ROOT / "notebooks" / "04_drafter_ablation.ipynb").read_text())
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert '"data": "real"' not in code and 'data="real"' not in code
    assert '"data": model_kind(target_dir)' in code and "data=model_kind(target_dir))" in code
    assert model_kind(str(stories_dir())) == "toy"
