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


# ---- summary.html: every figure recomputed from each run's run.json and metrics.json

BATCH_RUNS = {  # name: (data kind, evidence, n records, engine verdicts or None, billing classes)
    "sim-glaive": ("simulated", "engine", 30, {"exact": 12, "bpe_split": 9, "semantic": 9}, [20, 6, 2, 1, 1]),
    "real-stories-engine": ("real", "engine", 96, {"exact": 92, "bpe_split": 3, "semantic": 1}, [90, 0, 4, 2, 0]),
    "real-stories-billing-only": ("real", "billing-only", 96, None, [89, 0, 5, 2, 0]),
    "real-tiny-kimi-engine": ("toy", "engine", 48, {"exact": 6, "bpe_split": 11, "semantic": 26}, [12, 2, 29, 0, 5]),
}
CLASSES = ("match", "explained", "unexplained", "no_billing", "error")


def _batch_metrics(data, evidence, n, verdict, billing):
    """A metrics.json as notebook 02 writes it (the keys of kimi_eagle.diff.metrics), counts consistent with ``n``."""
    judged = n - billing[3] - billing[4]
    m = {"data": data, "evidence": evidence, "n_records": n,
         **{f"billing_{c}": k for c, k in zip(CLASSES, billing)},
         "billing_unexplained_rate": billing[2] / judged, "billing_unexplained_rate_ci": list(_wilson(billing[2], judged))}
    if verdict is not None:
        ok = sum(verdict.values())
        m.update(status={"ok": ok, "missing_engine": 0, "missing_api": 0, "error": n - ok}, verdict=verdict,
                 mismatch_rate=(ok - verdict["exact"]) / ok, mismatch_rate_ci=list(_wilson(ok - verdict["exact"], ok)))
    return m


@pytest.fixture(scope="module")
def batch_page(tmp_path_factory):
    import json

    from kimi_eagle.apps.reports.batch_summary import write_summary

    run_dir = tmp_path_factory.mktemp("batch")
    runs = []
    for i, (name, spec) in enumerate(BATCH_RUNS.items()):
        (run_dir / name).mkdir()
        (run_dir / name / "run.json").write_text(json.dumps({"status": "ok", "duration_s": 3.5 + i, "attempts": 1}))
        (run_dir / name / "metrics.json").write_text(json.dumps(_batch_metrics(*spec)))
        runs.append((name, {"simulate": spec[0] == "simulated", "sample_size": 5 if spec[0] == "simulated" else None}))
    write_summary(run_dir, runs, "diff_datasets")
    return run_dir


def _rows(table):
    """A summary table as its header (the last row of <th>) and its data rows ({header: cell text})."""
    trs = table.find_all("tr")
    heads = [tr for tr in trs if tr.find("th") and not tr.find("td") and "group" not in (tr.get("class") or [])]
    head = [th.get_text() for th in heads[-1].find_all("th")]
    return head, [dict(zip(head, [td.get_text() for td in tr.find_all("td")])) for tr in trs if tr.find("td")]


def _numbers(text):
    return [float(x.replace(",", "")) for x in re.findall(r"-?[\d,]*\.?\d+(?:e[-+]?\d+)?", text)]


def _flat(obj, prefix=""):
    out = {}
    for k, v in obj.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _say(key):
    return key.replace(".", " › ").replace("_", " ")


def test_every_figure_on_summary_html_is_recomputed_from_the_runs_json(batch_page):
    import json

    metrics = {n: json.loads((batch_page / n / "metrics.json").read_text()) for n in BATCH_RUNS}
    states = {n: json.loads((batch_page / n / "run.json").read_text()) for n in BATCH_RUNS}
    soup = _soup(batch_page / "summary.html")
    text = soup.get_text(" ")
    # the finding: per data kind, the range of the engine mismatch rate and of the billing unexplained rate
    assert f"{len(BATCH_RUNS)} of {len(BATCH_RUNS)} runs finished" in soup.find(class_="finding").get_text()
    for kind, say in (("simulated", "simulated data"), ("real", "real data"), ("toy", "the toy model")):
        mm = [m["mismatch_rate"] for m in metrics.values() if m["data"] == kind and "mismatch_rate" in m]
        un = [m["billing_unexplained_rate"] for m in metrics.values() if m["data"] == kind]
        span = lambda v: f"{min(v):.0%}" if f"{min(v):.0%}" == f"{max(v):.0%}" else f"{min(v):.0%}–{max(v):.0%}"  # noqa: E731
        finding = soup.find(class_="finding").get_text(" ")
        assert f"{say}" in finding and f"differs from the engine in {span(mm)} of records ({len(mm)} run" in finding
        assert f"unexplained for {span(un)} of records ({len(un)} run" in finding
    # the runs table: the real record count of every run (never a requested sample size), its duration and data kind
    head, rows = _rows(next(t for t in soup.find_all("table") if "records (n)" in t.get_text()))
    assert [r["run"] for r in rows] == ["sim-glaive", "real-stories-engine", "real-stories-billing-only",
                                        "real-tiny-kimi-engine"]  # simulated, real, then the toy model apart
    for r in rows:
        assert int(r["records (n)"].replace(",", "")) == metrics[r["run"]]["n_records"]
        assert float(r["duration s"]) == pytest.approx(states[r["run"]]["duration_s"], abs=0.05)
        assert r["data"] == metrics[r["run"]]["data"]
    assert "1,000" not in text
    # the toy model: its own header row in every table and its note
    assert soup.find(class_="data toy") and "REAL engine, toy model (not Kimi's rates)" in soup.find(class_="data toy").get_text()
    for table in soup.find_all("table"):
        toy_rows = [tr for tr in table.find_all("tr") if "toy" in (tr.get("class") or [])]
        if "real-tiny-kimi-engine" in table.get_text():
            assert len(toy_rows) == 1 and "toy model" in toy_rows[0].get_text()
    # every metric cell: the value in metrics.json, with its 95% interval beside it where there is one
    checked = 0
    for table in soup.find_all("table", class_="metrics"):
        group = table.find("tr").find_all("th")[-1].get_text()
        head, rows = _rows(table)
        for r in rows:
            flat = _flat(metrics[r["run"]])
            for h in head[1:]:
                name = h.replace(" (95% interval)", "")
                key = next((k for k in flat if _say(k) in (name, f"{group} › {name}")), None)
                if key is None:  # a metric this run does not have (a billing-only run has no engine metrics)
                    assert r[h] == "", (r["run"], h)
                    continue
                shown = _numbers(r[h])
                want = [flat[key], *(flat.get(f"{key}_ci") or [])] if "(95% interval)" in h else [flat[key]]
                if isinstance(flat[key], str):
                    assert r[h] == flat[key]
                    continue
                assert shown == pytest.approx(want, rel=1e-3, abs=1e-4), (r["run"], h)
                checked += 1
    assert checked >= 40
    # the billing-only run is in the stacked charts (billing verdicts drawn for every run; engine verdicts say n/a)
    assert (batch_page / "charts" / "billing_verdict.png").is_file() and (batch_page / "charts" / "verdict.png").is_file()


def test_the_stacked_charts_show_every_finished_run_with_its_counts(batch_page):
    import pandas as pd

    from kimi_eagle.apps.reports.batch_summary import stacked_chart

    df = pd.read_parquet(batch_page / "summary.parquet")
    cols = [f"metric.billing_{c}" for c in CLASSES]
    ax = stacked_chart(df, cols, "billing verdict").axes[0]
    labels = [t.get_text().split("\n")[0].split(" [")[0] for t in ax.get_yticklabels()]
    assert labels == list(BATCH_RUNS)
    assert "REAL engine, toy model (not Kimi's rates)" in ax.get_yticklabels()[-1].get_text()
    widths = {}
    for patch in ax.patches:
        widths.setdefault(round(patch.get_y() + patch.get_height() / 2), []).append(patch.get_width())
    for i, spec in enumerate(BATCH_RUNS.values()):
        assert widths[i] == spec[4]  # one segment per class, in order, from the run's counts
    ax = stacked_chart(df, ["metric.verdict.exact", "metric.verdict.bpe_split", "metric.verdict.semantic"], "verdict").axes[0]
    assert len(ax.get_yticklabels()) == len(BATCH_RUNS)
    assert any("n/a" in t.get_text() for t in ax.texts)  # the billing-only run: shown, and says it has no engine verdicts


# ---- the audit page: every figure recomputed from the comparisons (pairs.parquet's rows)


@pytest.fixture(scope="module")
def audit_page(tmp_path_factory, stories):
    from kimi_eagle.apps.audit.compare import REFERENCE, Completion, compare_all, summarize
    from kimi_eagle.apps.audit.report import write_audit_report

    out = tmp_path_factory.mktemp("audit")
    texts = [" Lily saw a big red bird", " Lily saw a big blue bird", " Tom ran to the park", " Tom ran to the shop"]
    a, b, c, d = (stories.encode(t) for t in texts)
    plan = {  # prompt: {provider: [ids of repeat 0, repeat 1]}, None: the request failed
        "p1": {"x": [a, a], "y": [a, b], "z": [b, b]}, "p2": {"x": [c, c], "y": [d, d], "z": [c, c]},
        "p3": {"x": [None, a], "y": [a[:3], a[:3]], "z": [a, a]}, "p4": {"x": [d, d], "y": [d, c], "z": [c, d]},
    }
    completions = [Completion(pid, prov, rep, "ok", ids=ids) if ids is not None else
                   Completion(pid, prov, rep, "error", "collect", "exhausted: 503")
                   for pid, by in plan.items() for prov, reps in by.items() for rep, ids in enumerate(reps)]
    reference = {"p1": a, "p2": c, "p3": a, "p4": d}
    pairs, _ = compare_all(stories, completions, ["x", "y", "z"],
                           {pid: Completion(pid, REFERENCE, 0, "ok", ids=ids) for pid, ids in reference.items()})
    pd.DataFrame(pairs).to_parquet(out / "pairs.parquet", index=False)
    summary = summarize(pairs, ["x", "y", "z"], has_reference=True)
    counts = pd.Series([f"{c.status}:{c.stage}" if c.status != "ok" else "ok" for c in completions]).value_counts()
    summary.update(prompts=len(plan), bad_prompts=0, repeats=2, requests=len(completions),
                   completions={k: int(v) for k, v in counts.items()}, aborted=None, settings={"model": "stories260K"})
    write_audit_report(summary, out)
    return out, len(completions)


def _frames(soup):
    """Every thead/tbody table of the page as a frame of its cell texts (``–`` where nothing is there)."""
    out = []
    for t in soup.find_all("table"):
        if t.find("thead") and t.find("tbody"):
            head = [th.get_text() for th in t.find("thead").find_all("th")]
            rows = [[td.get_text() for td in tr.find_all(["td", "th"])] for tr in t.find("tbody").find_all("tr")]
            out.append(pd.DataFrame(rows, columns=head))
    return out


def test_every_figure_on_the_audit_page_is_recomputed_from_the_comparisons(audit_page):
    from kimi_eagle.apps.audit.compare import REFERENCE

    out, n_requests = audit_page
    pairs = pd.read_parquet(out / "pairs.parquet")
    soup = _soup(out / "report.html")
    text = soup.get_text(" ")
    pairs = pairs.assign(identical=pairs.identical.map(lambda v: bool(v) if v is not None else None))
    ok = pairs[pairs.status == "ok"].astype({"identical": bool})
    assert f"{n_requests:,} requests" in text
    # the agreement matrix: k/n identical completions per pair; the diagonal: prompts whose repeats all agree
    matrix = next(f for f in _frames(soup) if REFERENCE in f.columns)
    providers = [p for p in matrix.columns[1:] if p != REFERENCE]
    for _, row in matrix.iterrows():
        for b in matrix.columns[1:]:
            a = row.iloc[0]
            if a == b == REFERENCE:
                want = "–"
            elif a == b:
                reps = ok[(ok.kind == "repeat") & (ok.a == a)]
                agree = reps.groupby("prompt_id").identical.all()
                want = f"{int(agree.sum())}/{len(agree)}"
            else:
                cell = ok[(ok.kind != "repeat") & (((ok.a == a) & (ok.b == b)) | ((ok.a == b) & (ok.b == a)))]
                want = f"{int(cell.identical.sum())}/{len(cell)}"
            assert row[b] == want, (a, b)
    # the pairs table: counts, rates, not-compared requests, median first divergence and length differences
    shown = next(f for f in _frames(soup) if "not_compared" in f.columns)
    assert len(shown) == len(pairs[pairs.kind != "repeat"].groupby(["a", "b"]))
    for _, row in shown.iterrows():
        rows = pairs[(pairs.kind != "repeat") & (pairs.a == row.a) & (pairs.b == row.b)]
        good = rows[rows.status == "ok"].astype({"identical": bool})
        firsts = good[~good.identical].first_divergence.dropna()
        assert (int(row.k), int(row.n), int(row.not_compared)) == (int(good.identical.sum()), len(good), int((rows.status != "ok").sum()))
        assert float(row.rate) == pytest.approx(good.identical.mean(), abs=6e-4)
        assert (row.median_first_divergence == "–" and firsts.empty) or \
            float(row.median_first_divergence) == pytest.approx(firsts.median(), abs=6e-4)
        assert float(row.mean_abs_length_diff) == pytest.approx(good.length_diff.abs().mean(), abs=6e-4)
        assert int(row.length_diff_nonzero) == int((good.length_diff != 0).sum())
    # the ranking against the reference, and the finding that says it in words
    ranking = next(f for f in _frames(soup) if "provider" in f.columns and "against" in f.columns)
    assert sorted(ranking.provider) == sorted(providers)
    finding = soup.find(class_="finding").get_text(" ")
    for _, row in ranking.iterrows():
        vs = ok[(ok.kind == "reference") & (ok.b == row.provider)]
        diverged = vs[~vs.identical]
        assert (int(row.k), int(row.n)) == (len(diverged), len(vs))
        assert float(row.rate) == pytest.approx(len(diverged) / len(vs), abs=6e-4)
        assert f"{row.provider} returns a different completion than {REFERENCE} for {len(diverged)} of {len(vs)} prompts" in finding
        if len(diverged):
            assert float(row.median_first_divergence) == pytest.approx(diverged.first_divergence.median())
    rates = [len(ok[(ok.kind == "reference") & (ok.b == p) & ~ok.identical]) / len(ok[(ok.kind == "reference") & (ok.b == p)])
             for p in ranking.provider]
    assert rates == sorted(rates, reverse=True)  # most divergent first
