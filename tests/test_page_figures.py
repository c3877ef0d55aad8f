"""Every figure shown on report.html and on the billing report is recomputed here from the parquet outputs, with
pandas and a Wilson formula of its own (nothing from the kit's summaries), and compared with what the page says."""
import math
import re

import pandas as pd
import pytest
from bs4 import BeautifulSoup

from kimi_eagle.apps.cli import main


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    out = tmp_path_factory.mktemp("pages")
    assert main(["simulate", "-o", str(out / "sim"), "--per-effect", "2", "--seed", "5", "--run"]) == 0
    assert main(["report", str(out / "sim" / "diff"), "-o", str(out / "report")]) == 0
    assert main(["billing", str(out / "sim" / "reconstructed.parquet"), "-o", str(out / "billing"), "--data", "simulated"]) == 0
    return out


def _soup(path):
    return BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")


def _tables(soup):
    """Every table of the page as a list of {header: cell text} rows."""
    out = []
    for t in soup.find_all("table"):
        head = [th.get_text() for th in t.find("thead").find_all("th")] if t.find("thead") else []
        rows = [[td.get_text() for td in tr.find_all("td")] for tr in t.find("tbody").find_all("tr")]
        out.append([dict(zip(head, r)) for r in rows])
    return out


def _table_with(soup, *headers):
    return next(t for t in _tables(soup) if t and all(h in t[0] for h in headers))


def _wilson(k, n, z=1.959963984540054):
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _num(text):
    return float(text.replace(",", "").replace("%", "").replace("+", "").replace("−", "-"))


def test_every_figure_on_report_html_is_recomputed_from_the_parquet(pages):
    records = pd.read_parquet(pages / "sim" / "diff" / "records.parquet")
    hunks = pd.read_parquet(pages / "sim" / "diff" / "hunks.parquet")
    soup = _soup(pages / "report" / "report.html")
    ok = records[records.status == "ok"]
    verdicts = {v: int((ok.verdict == v).sum()) for v in ("exact", "bpe_split", "semantic")}
    text = soup.get_text(" ")
    # the finding at the top and the status line
    assert (f"of {len(ok):,} records compared, {verdicts['exact']:,} have identical token IDs, {verdicts['bpe_split']:,} "
            f"the same bytes split into other tokens, and {verdicts['semantic']:,} differ") in text
    status = records.status.value_counts()
    assert f"{len(records):,} records: {int(status.get('ok', 0)):,} ok" in text
    # the verdict table
    assert {k: int(v) for k, v in _table_with(soup, "exact", "bpe_split", "semantic")[0].items()} == verdicts
    # the mismatch-rate table, per dataset and all, with Wilson intervals
    rates = {r["dataset"]: r for r in _table_with(soup, "dataset", "mismatch_rate")}
    for name, group in [*ok.groupby("dataset"), ("all", ok)]:
        row, n = rates[name], len(group)
        for what, hit in (("mismatch", group.verdict != "exact"), ("semantic", group.verdict == "semantic")):
            k = int(hit.sum())
            lo, hi = _wilson(k, n)
            assert (int(row["n"]), int(row[what])) == (n, k)
            assert [_num(row[f"{what}_{s}"]) for s in ("rate", "lo", "hi")] == pytest.approx([k / n, lo, hi], abs=6e-4)
    # billing reconciliation: sums over the billed ok records; explained by hunk class from hunks.parquet
    billed = ok[ok.billed_completion_tokens.notna()]
    bill = _table_with(soup, "n_records_billed", "billed_completion_tokens")[0]
    expect = {"n_records_billed": len(billed), "billed_completion_tokens": int(billed.billed_completion_tokens.sum()),
              "reconstructed_completion_tokens": int(billed.n_recon_tokens.sum()),
              "delta (billed − reconstructed)": int((billed.billed_completion_tokens - billed.n_recon_tokens).sum()),
              "explained by hunks (engine − reconstructed)": int(billed.billing_explained.fillna(0).sum()),
              "unexplained (billed − engine)": int(billed.billing_unexplained.sum()),
              "n_records_unexplained": int((billed.billing_unexplained != 0).sum())}
    assert {k: int(v) for k, v in bill.items()} == expect
    engine_minus_recon = int((billed.n_engine_tokens - billed.n_recon_tokens).sum())
    assert expect["explained by hunks (engine − reconstructed)"] == engine_minus_recon  # the sign the header states
    in_billed = hunks[hunks.id.isin(set(billed.id))]
    by_class = (-in_billed.token_delta).groupby(in_billed.subclass.fillna(in_billed.kind)).sum()
    shown = next(t for t in _tables(soup) if t and set(t[0]) == set(by_class.index))[0]
    assert {k: int(v) for k, v in shown.items()} == {k: int(v) for k, v in by_class.items()}
    r = ok[ok.billed_reasoning_tokens.notna()]
    reasoning = next(t for t in _tables(soup) if t and "billed_reasoning_tokens" in t[0])[0]
    assert int(reasoning["billed_reasoning_tokens"]) == int(r.billed_reasoning_tokens.sum())
    assert int(reasoning["delta (billed − reconstructed)"]) == int((r.billed_reasoning_tokens - r.recon_reasoning_tokens).sum())
    # the sign convention is stated once at the top and in the token-delta chart's axis (its source says so)
    assert text.count("reference − reconstructed") == 1


def _class(verdict):
    return verdict.split(":")[0]


def test_every_figure_on_the_billing_report_is_recomputed_from_the_parquet(pages):
    records = pd.read_parquet(pages / "billing" / "billing_records.parquet")
    soup = _soup(pages / "billing" / "report.html")
    text = soup.get_text(" ")
    cls = records.verdict.map(_class).value_counts()
    n = len(records)
    count = {c: int(cls.get(c, 0)) for c in ("match", "explained", "unexplained", "no_billing", "error")}
    assert (f"of {n:,} records, the provider's billed count equals the reconstruction for {count['match']:,}, differs by a "
            f"known provider convention for {count['explained']:,}, and differs unexplained for {count['unexplained']:,}") in text
    assert f"{n:,} records: " + ", ".join(f"{v:,} {k}" for k, v in count.items()) in text
    # the headline gap: billed − reconstructed over the billed records, in % of billed tokens
    billed = records[records.billed_completion_tokens.notna()]
    gap = 100 * (billed.billed_completion_tokens - billed.n_recon_tokens).sum() / billed.billed_completion_tokens.sum()
    m = re.search(r"Gap:\s+([+\-−]?[\d.]+)%\s+of ([\d,]+) billed tokens", text)
    assert _num(m.group(1)) == pytest.approx(gap, abs=6e-4) and _num(m.group(2)) == billed.billed_completion_tokens.sum()
    # the verdict table: one column per verdict
    verdicts = records.verdict.value_counts()
    assert {k: int(v) for k, v in _table_with(soup, "match", "unexplained")[0].items()} == {k: int(v) for k, v in verdicts.items()}
    # per provider and per dataset
    for by in ("provider", "dataset"):
        shown = {r[by]: r for r in _table_with(soup, by, "gap_pct", "billed_tokens")}
        for name, g in records.groupby(by):
            row, gb = shown[name], g[g.billed_completion_tokens.notna()]
            counts = g.verdict.map(_class).value_counts()
            assert int(row["records"]) == len(g)
            assert all(int(row[c]) == int(counts.get(c, 0)) for c in ("match", "explained", "unexplained", "no_billing", "error"))
            assert int(row["billed_tokens"]) == int(gb.billed_completion_tokens.sum())
            assert int(row["reconstructed_tokens"]) == int(gb.n_recon_tokens.sum())
            g_gap = 100 * (gb.billed_completion_tokens - gb.n_recon_tokens).sum() / gb.billed_completion_tokens.sum()
            assert _num(row["gap_pct"]) == pytest.approx(g_gap, rel=1e-3, abs=1e-3)
    # the worst unexplained records: their billed, reconstructed and delta columns
    for row in _table_with(soup, "id", "billing_delta", "n_recon_tokens"):
        rec = records[records.id == row["id"]].iloc[0]
        assert (int(row["billed_completion_tokens"]), int(row["n_recon_tokens"]), int(row["billing_delta"])) == \
               (int(rec.billed_completion_tokens), int(rec.n_recon_tokens), int(rec.billed_completion_tokens - rec.n_recon_tokens))
    assert text.count("reference − reconstructed") == 1
