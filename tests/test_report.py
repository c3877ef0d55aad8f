"""`kimi-eagle report`: summary numbers, Wilson intervals, charts and the HTML report."""
from __future__ import annotations

import json
import struct

import pytest

from kimi_eagle.apps.cli import main
from kimi_eagle.apps.reports.diff_report import CHARTS
from kimi_eagle.diff.summary import wilson


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


@pytest.mark.parametrize("k,n,lo,hi", [(0, 10, 0.0, 0.2775), (5, 10, 0.2366, 0.7634), (10, 10, 0.7225, 1.0),
                                       (81, 263, 0.2553, 0.3662)])
def test_wilson_interval_matches_published_values(k, n, lo, hi):
    got = wilson(k, n)
    assert got == pytest.approx((lo, hi), abs=1e-4)


def test_wilson_without_trials_is_uninformative():
    assert wilson(0, 0) == (0.0, 1.0)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    assert main(["simulate", "-o", str(out / "sim"), "--per-effect", "2", "--seed", "5", "--run"]) == 0
    assert main(["report", str(out / "sim" / "diff"), "-o", str(out / "report")]) == 0
    return out / "report"


def test_summary_has_counts_rates_billing_and_confusion(report):
    s = json.loads((report / "summary.json").read_text())
    assert s["n_records"] == 20 and s["status"]["ok"] == 20
    assert sum(s["verdict"].values()) == 20 and s["verdict"]["exact"] == 4
    assert sum(s["label"].values()) == 20
    all_rate = next(r for r in s["rates"] if r["dataset"] == "all")
    assert all_rate["n"] == 20 and all_rate["mismatch"] == 16
    assert (all_rate["mismatch_lo"], all_rate["mismatch_hi"]) == pytest.approx(wilson(16, 20))
    assert s["billing"]["unexplained"] == 0 and s["billing"]["delta"] == s["billing"]["explained_by_hunks"]
    assert len(s["confusion"]["classes"]) == 9
    assert all(r["precision"] == 1.0 and r["recall"] == 1.0 for r in s["precision_recall"])


def test_every_chart_is_a_real_png_and_embedded_in_the_html(report):
    s = json.loads((report / "summary.json").read_text())
    assert set(s["charts"]) == set(CHARTS)
    for name in s["charts"].values():
        w, h = png_size(report / name)
        assert w >= 500 and h >= 350
    page = (report / "report.html").read_text()
    assert page.count("data:image/png;base64,") == len(CHARTS)
    assert "confusion table" in page and "Wilson 95% CI" in page and "Billing reconciliation" in page


def test_a_diff_with_errors_and_no_labels_reports_without_confusion(tmp_path, kimi):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from helpers import build, recon_row, turn, write_engine

    ids, segs = build(kimi, turn())
    pq.write_table(pa.Table.from_pylist([recon_row("a", ids, segs, billed=len(ids)), recon_row("b", ids, segs)]),
                   tmp_path / "recon.parquet")
    write_engine(tmp_path / "engine.jsonl", [{"id": "a", "output_ids": ids[:-1]}, "{broken"])
    assert main(["diff", "--engine", str(tmp_path / "engine.jsonl"), "--reconstructed", str(tmp_path / "recon.parquet"),
                 "-o", str(tmp_path / "diff")]) == 0
    assert main(["report", str(tmp_path / "diff"), "-o", str(tmp_path / "rep")]) == 0
    s = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert s["status"] == {"ok": 1, "missing_engine": 1, "missing_api": 0, "error": 1}
    assert "confusion" not in s and "confusion" not in s["charts"]
    assert "Errors" in (tmp_path / "rep" / "report.html").read_text()


def test_report_on_a_directory_without_a_diff_is_a_clear_error(tmp_path, capsys):
    assert main(["report", str(tmp_path), "-o", str(tmp_path / "rep")]) == 2
    assert "no records.parquet here" in capsys.readouterr().err


def test_a_chart_or_section_that_fails_is_a_visible_note_and_the_rest_renders(report, tmp_path, monkeypatch):
    """Fault injection: two parts raise something no check foresaw; the report is still written."""
    from kimi_eagle.apps.reports import diff_report as report_module
    from kimi_eagle.diff.run import read_diff

    def fails(*args, **kwargs):
        raise RuntimeError("drawing <failed>")

    monkeypatch.setattr(report_module, "chart_hunk_sizes", fails)
    monkeypatch.setattr(report_module, "_hunk_examples", fails)
    s = report_module.write_report(read_diff(report.parent / "sim" / "diff"), tmp_path)
    assert {k: v for k, v in s["left_out"].items() if k != "notes"} == {
        "records": 0, "hunks": 0, "example_hunks": 0, "charts": 1, "sections": 1}
    assert [(n["part"], n["name"], n["reason"]) for n in s["left_out"]["notes"]] == [
        ("chart", "hunk_sizes", "RuntimeError: drawing <failed>"),
        ("section", "example hunks", "RuntimeError: drawing <failed>")]
    assert set(s["charts"]) == set(CHARTS) - {"hunk_sizes"} and s["status"]["ok"] == 20
    page = (tmp_path / "report.html").read_text()
    assert "⚠ chart “hunk_sizes” left out: RuntimeError: drawing &lt;failed&gt;" in page
    assert "⚠ section “example hunks” left out" in page and page.count("data:image/png;base64,") == len(CHARTS) - 1


def test_a_billing_chart_that_fails_is_a_visible_note(tmp_path, kimi, monkeypatch):
    from helpers import api, row

    from kimi_eagle.apps.reports import billing_report

    def fails(*args, **kwargs):
        raise RuntimeError("no chart")

    monkeypatch.setattr(billing_report, "chart_gap", fails)
    s = billing_report.write_billing(kimi, [row(kimi, api("a"), billed=2)], tmp_path)
    assert (s["left_out"]["charts"], s["left_out"]["sections"]) == (2, 0)
    assert sorted(s["charts"]) == ["billing_delta", "billing_verdicts_by_provider"]
    page = (tmp_path / "report.html").read_text()
    assert "⚠ chart “billing_gap_by_dataset” left out: RuntimeError: no chart" in page


def test_the_four_report_pages_share_one_stylesheet_and_carry_no_other(report, tmp_path, kimi, stories):
    import re

    from helpers import api, row
    from test_audit import small_audit

    from kimi_eagle.apps.audit.report import write_audit_report
    from kimi_eagle.apps.reports.batch_summary import write_summary
    from kimi_eagle.apps.reports.billing_report import write_billing
    from kimi_eagle.apps.reports.toolkit import STYLESHEET

    write_billing(kimi, [row(kimi, api("a"), billed=2)], tmp_path / "billing")
    (tmp_path / "batch" / "r1").mkdir(parents=True)
    (tmp_path / "batch" / "r1" / "run.json").write_text(json.dumps({"status": "ok", "duration_s": 1.0}))
    (tmp_path / "batch" / "r1" / "metrics.json").write_text(json.dumps({"data": "real", "rate": 0.5}))
    write_summary(tmp_path / "batch", [("r1", {"x": 1}), ("r2", {"x": 2})])
    write_audit_report(small_audit(stories)[1], tmp_path / "audit")
    pages = {"report": report / "report.html", "billing": tmp_path / "billing" / "report.html",
             "batch": tmp_path / "batch" / "summary.html", "audit": tmp_path / "audit" / "report.html"}
    for kind, path in pages.items():
        page = path.read_text()
        assert re.findall(r"<style>(.*?)</style>", page, re.S) == ["\n" + STYLESHEET], kind
        assert page.count("<style") == 1 and "<link" not in page and f"<body class='{kind}'>" in page, kind



def test_a_toy_model_run_says_so_on_the_page_and_on_every_chart(report, tmp_path, kimi, monkeypatch):
    """data="toy" (tiny-kimi): "REAL engine, toy model (not Kimi's rates)" on the diff report, the billing report and
    every chart title of both (read from the figures as they are written)."""
    from helpers import api, row

    from kimi_eagle.apps.reports import billing_report, toolkit
    from kimi_eagle.apps.reports import diff_report as report_module
    from kimi_eagle.diff.run import read_diff

    tag = "REAL engine, toy model (not Kimi's rates)"
    titles = {}
    written = toolkit.write_figure

    def record(fig, path, **kw):
        suptitle = [fig._suptitle.get_text()] if fig._suptitle else []  # a figure of panels: the tag said once, on top
        titles[str(path)] = " ".join(t.replace("\n", " ") for t in suptitle + [ax.get_title() for ax in fig.axes] if t)
        return written(fig, path, **kw)

    monkeypatch.setattr(toolkit, "write_figure", record)
    s = report_module.write_report(read_diff(report.parent / "sim" / "diff"), tmp_path / "diff", "toy", kimi)
    b = billing_report.write_billing(kimi, [row(kimi, api("a"), billed=2), row(kimi, api("b"), billed=5)],
                                     tmp_path / "billing", "toy")
    assert s["data"] == b["data"] == "toy"
    assert len(titles) == len(s["charts"]) + len(b["charts"])
    assert all(tag in t for t in titles.values()), titles
    for page in (tmp_path / "diff" / "report.html", tmp_path / "billing" / "report.html"):
        text = page.read_text(encoding="utf-8").replace("&#x27;", "'")
        assert tag in text and "say nothing about Kimi" in text
    with pytest.raises(ValueError, match="data must be one of"):
        report_module.write_report(read_diff(report.parent / "sim" / "diff"), tmp_path / "x", "kimi")
