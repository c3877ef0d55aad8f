"""`kimi-eagle compare RUN_A RUN_B` (#35): two real diff/report/billing outputs of the simulated benchmark side by
side; every share and every change's interval recomputed here from the records, with a Wilson interval found by
inverting the score test (bisection), not by the closed form the report uses."""
import csv
import html
import json
import math
import re

import pandas as pd
import pytest

from kimi_eagle.apps import cli

Z = 1.959963984540054


def score_bound(k: int, n: int, upper: bool) -> float:
    """The Wilson bound as the p where the score statistic |k/n − p| / sqrt(p(1−p)/n) equals Z (bisection)."""
    if (k == n and upper) or (k == 0 and not upper):
        return 1.0 if upper else 0.0
    lo, hi = (k / n, 1.0) if upper else (0.0, k / n)
    for _ in range(200):
        mid = (lo + hi) / 2
        inside = abs(k / n - mid) <= Z * math.sqrt(mid * (1 - mid) / n)
        if inside == upper:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def newcombe(ka: int, na: int, kb: int, nb: int) -> tuple[float, float]:
    """Newcombe (1998) method 10 for pb − pa, written out from its definition."""
    pa, pb = ka / na, kb / nb
    la, ua = score_bound(ka, na, False), score_bound(ka, na, True)
    lb, ub = score_bound(kb, nb, False), score_bound(kb, nb, True)
    d = pb - pa
    return d - math.sqrt((pb - lb) ** 2 + (ua - pa) ** 2), d + math.sqrt((ub - pb) ** 2 + (pa - la) ** 2)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two benchmark runs of different sizes and seeds, each as a diff, a report and a billing folder."""
    root = tmp_path_factory.mktemp("cmp")
    for name, per_effect, seed in (("a", 2, 0), ("b", 5, 1)):
        sim = root / name
        assert cli.main(["simulate", "-o", str(sim), "--per-effect", str(per_effect), "--seed", str(seed), "--run"]) == 0
        assert cli.main(["report", str(sim / "diff"), "-o", str(sim / "report")]) == 0
        assert cli.main(["billing", str(sim / "reconstructed.parquet"), "-o", str(sim / "billing")]) == 0
    return root


def _compare(runs, kind, capsys, folder="cmp"):
    out = runs / f"{folder}-{kind}"
    assert cli.main(["compare", str(runs / "a" / kind), str(runs / "b" / kind), "-o", str(out)]) == 0
    capsys.readouterr()
    with open(out / "compare.csv", newline="") as f:
        return out, {r["figure"]: r for r in csv.DictReader(f)}


def _interval(text):
    return [float(x) for x in text.strip("[]").split(",")]


def test_diff_shares_and_their_changes_are_recomputed_from_the_records(runs, capsys):
    out, rows = _compare(runs, "diff", capsys)
    recs = {name: pd.read_parquet(runs / name / "diff" / "records.parquet") for name in "ab"}
    ok = {name: r[r.status == "ok"] for name, r in recs.items()}
    for verdict in ("exact", "bpe_split", "semantic"):
        ka, na = int((ok["a"].verdict == verdict).sum()), len(ok["a"])
        kb, nb = int((ok["b"].verdict == verdict).sum()), len(ok["b"])
        row = rows[f"share {verdict} (of counted records)"]
        assert row["A"].endswith(f"({ka}/{na})") and row["B"].endswith(f"({kb}/{nb})")
        assert float(row["change (B − A)"]) == pytest.approx(kb / nb - ka / na, abs=1e-4)
        lo, hi = _interval(row["change 95% CI"])
        want = newcombe(ka, na, kb, nb)
        assert (lo, hi) == (pytest.approx(want[0], abs=1e-4), pytest.approx(want[1], abs=1e-4))
        assert row["changed"] == ("yes" if want[0] > 0 or want[1] < 0 else "no")
    assert rows["records"]["change (B − A)"] == f"+{len(recs['b']) - len(recs['a'])}" and rows["records"]["change 95% CI"] == ""
    # the report folder of the same runs is read to the same figures
    _, from_report = _compare(runs, "report", capsys)
    assert {k: v for k, v in from_report.items() if k != "hunks"} == {k: v for k, v in rows.items() if k != "hunks"}


def test_billing_changes_are_recomputed_from_the_billing_records(runs, capsys):
    _, rows = _compare(runs, "billing", capsys)
    classes = {name: pd.read_parquet(runs / name / "billing" / "billing_records.parquet").verdict.str.split(":").str[0]
               for name in "ab"}
    for cls in ("match", "explained", "unexplained"):
        ka, na, kb, nb = int((classes["a"] == cls).sum()), len(classes["a"]), int((classes["b"] == cls).sum()), len(classes["b"])
        lo, hi = _interval(rows[f"share {cls}"]["change 95% CI"])
        assert (lo, hi) == (pytest.approx(newcombe(ka, na, kb, nb)[0], abs=1e-4), pytest.approx(newcombe(ka, na, kb, nb)[1], abs=1e-4))
    gap = rows["billing gap % · all records"]  # a mean with bootstrap intervals: MOVER over the two intervals
    a, b = (json.loads((runs / n / "billing" / "summary.json").read_text())["all"] for n in "ab")
    d = b["gap_pct"] - a["gap_pct"]
    want = (d - math.hypot(b["gap_pct"] - b["gap_pct_lo"], a["gap_pct_hi"] - a["gap_pct"]),
            d + math.hypot(b["gap_pct_hi"] - b["gap_pct"], a["gap_pct"] - a["gap_pct_lo"]))
    assert _interval(gap["change 95% CI"]) == [pytest.approx(w, abs=1e-4) for w in want]


def test_markdown_csv_and_page_hold_the_same_table_and_state_the_sign(runs, capsys):
    out, rows = _compare(runs, "billing", capsys, folder="same")
    md = (out / "compare.md").read_text()
    page = (out / "compare.html").read_text()
    md_rows = [line for line in md.splitlines() if line.startswith("| ") and not line.startswith("| figure")]
    assert [r.split(" | ")[0][2:] for r in md_rows] == list(rows)
    assert page.count("<tr>") == len(rows) + 1  # header + one row per figure
    for text in (md, page):
        assert "change = B − A" in text and "Newcombe" in text
    body = re.findall(r"<tr>(.*?)</tr>", page)[1:]
    cells = [[html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<td[^>]*>(.*?)</td>", r)] for r in body]
    assert cells == [[v or "–" for v in row.values()] for row in rows.values()]  # the page shows the CSV's table


def test_a_run_against_itself_changes_nothing(runs, capsys):
    out = runs / "self"
    assert cli.main(["compare", str(runs / "a" / "billing"), str(runs / "a" / "billing"), "-o", str(out)]) == 0
    assert "0 changed" in capsys.readouterr().out
    table = pd.read_csv(out / "compare.csv")
    assert (table["change (B − A)"].astype(str) == "0").all() and not (table["changed"] == "yes").any()


def test_outputs_of_different_kinds_or_no_output_are_refused_in_one_line(runs, tmp_path, capsys):
    assert cli.main(["compare", str(runs / "a" / "diff"), str(runs / "b" / "billing"), "-o", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot compare a diff output" in err[0] and "billing output" in err[0]
    assert cli.main(["compare", str(tmp_path), str(runs / "b" / "billing"), "-o", str(tmp_path / "y")]) == 2
    assert "not a diff, report, billing or batch output" in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
