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
    return (0.0 if k == 0 else max(0.0, centre - half)), (1.0 if k == n else min(1.0, centre + half))


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
    rates = {r["dataset"]: r for r in _table_with(soup, "dataset", "mismatch rate")}
    for name, group in [*ok.groupby("dataset"), ("all", ok)]:
        row, n = rates[name], len(group)
        for what, hit in (("mismatch", group.verdict != "exact"), ("semantic", group.verdict == "semantic")):
            k = int(hit.sum())
            lo, hi = _wilson(k, n)
            assert (int(row["records (n)"]), int(row[f"{what} (k)"])) == (n, k)
            assert [_num(row[f"{what} {s}"]) for s in ("rate", "95% low", "95% high")] == pytest.approx([k / n, lo, hi],
                                                                                                     abs=6e-4)
    # billing reconciliation: sums over the billed ok records; explained by hunk class from hunks.parquet
    billed = ok[ok.billed_completion_tokens.notna()]
    bill = _table_with(soup, "records billed", "billed tokens")[0]
    expect = {"records billed": len(billed), "billed tokens": int(billed.billed_completion_tokens.sum()),
              "reconstructed tokens": int(billed.n_recon_tokens.sum()),
              "gap (billed − reconstructed)": int((billed.billed_completion_tokens - billed.n_recon_tokens).sum()),
              "explained by hunks (engine − reconstructed)": int(billed.billing_explained.fillna(0).sum()),
              "gap not explained by hunks (billed − engine)": int(billed.billing_unexplained.sum()),
              "records with a gap not explained by hunks": int((billed.billing_unexplained != 0).sum())}
    assert {k: int(v) for k, v in bill.items()} == expect
    engine_minus_recon = int((billed.n_engine_tokens - billed.n_recon_tokens).sum())
    assert expect["explained by hunks (engine − reconstructed)"] == engine_minus_recon  # the sign the header states
    billed_minus_engine = int((billed.billed_completion_tokens - billed.n_engine_tokens).sum())
    assert expect["gap not explained by hunks (billed − engine)"] == billed_minus_engine  # the one rule, stated
    assert "unexplained" not in text.lower()  # the billing page's word (not explained by a convention) is not used here
    in_billed = hunks[hunks.id.isin(set(billed.id))]
    by_class = (-in_billed.token_delta).groupby(in_billed.subclass.fillna(in_billed.kind)).sum()
    shown = next(t for t in _tables(soup) if t and set(t[0]) == set(by_class.index))[0]
    assert {k: int(v) for k, v in shown.items()} == {k: int(v) for k, v in by_class.items()}
    r = ok[ok.billed_reasoning_tokens.notna()]
    reasoning = next(t for t in _tables(soup) if t and "billed reasoning tokens" in t[0])[0]
    assert int(reasoning["billed reasoning tokens"]) == int(r.billed_reasoning_tokens.sum())
    assert int(reasoning["gap (billed − reconstructed)"]) == int((r.billed_reasoning_tokens - r.recon_reasoning_tokens).sum())
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
    rated = count["match"] + count["explained"] + count["unexplained"]  # ok and billed: the one denominator
    assert rated == int((records.status == "ok").sum() - count["no_billing"])
    assert (f"of {rated:,} rated records (a reconstruction and a billed count; {n:,} records in all; {count['error']:,} error "
            f"rows and {count['no_billing']:,} without a usable billed count not rated), the provider's billed count equals "
            f"the reconstruction for {count['match']:,}, differs by a known provider convention for {count['explained']:,}, "
            f"and is unexplained for {count['unexplained']:,} of {rated:,} ({count['unexplained'] / rated:.0%})") in text
    assert f"{n:,} records: " + ", ".join(f"{v:,} {k}" for k, v in count.items()) in text
    # the headline gap: billed − reconstructed over the billed records, in % of billed tokens
    billed = records[records.billed_completion_tokens.notna()]
    gap = 100 * (billed.billed_completion_tokens - billed.n_recon_tokens).sum() / billed.billed_completion_tokens.sum()
    m = re.search(r"Gap \(billed − reconstructed\):\s+([+\-−]?[\d.]+)%\s+of ([\d,]+) billed tokens", text)
    assert _num(m.group(1)) == pytest.approx(gap, abs=6e-4) and _num(m.group(2)) == billed.billed_completion_tokens.sum()
    # the verdict table: one column per verdict
    verdicts = records.verdict.value_counts()
    assert {k: int(v) for k, v in _table_with(soup, "match", "unexplained")[0].items()} == {k: int(v) for k, v in verdicts.items()}
    # per provider and per dataset: a counts table and a rates table, each narrow enough to fit the page
    gap_h, rate_h = "gap: billed − reconstructed, % of billed [95% CI]", "unexplained records of rated [Wilson 95% CI]"
    for by in ("provider", "dataset"):
        shown = {r[by]: r for r in _table_with(soup, by, "records", "billed tokens")}
        rates = {r[by]: r for r in _table_with(soup, by, gap_h, rate_h)}
        assert max(len(shown["all"]), len(rates["all"])) <= 10  # no table of 20 columns (issue 24: columns were hidden)
        for name, g in [*records.groupby(by), ("all", records)]:
            row, gb = shown[name], g[g.billed_completion_tokens.notna() & (g.status == "ok")]
            counts = g.verdict.map(_class).value_counts()
            assert int(row["records"]) == len(g) and int(row["rated"]) == len(gb)
            assert all(int(row[c.replace("_", " ")]) == int(counts.get(c, 0)) for c in CLASSES)
            assert int(row["billed tokens"]) == int(gb.billed_completion_tokens.sum())
            assert int(row["reconstructed tokens"]) == int(gb.n_recon_tokens.sum())
            g_gap = 100 * (gb.billed_completion_tokens - gb.n_recon_tokens).sum() / gb.billed_completion_tokens.sum()
            assert _num(rates[name][gap_h].split()[0]) == pytest.approx(g_gap, rel=1e-3, abs=1e-3)
            k = int(counts.get("unexplained", 0))
            lo, hi = _wilson(k, len(gb))
            assert rates[name][rate_h] == f"{k}/{len(gb)} ({100 * k / len(gb):.1f}%) [{100 * lo:.1f}%, {100 * hi:.1f}%]"
    # the worst unexplained records: their billed, reconstructed and delta columns
    for row in _table_with(soup, "id", "billed − reconstructed", "reconstructed tokens"):
        rec = records[records.id == row["id"]].iloc[0]
        assert (int(row["billed tokens"]), int(row["reconstructed tokens"]), int(row["billed − reconstructed"])) == \
               (int(rec.billed_completion_tokens), int(rec.n_recon_tokens), int(rec.billed_completion_tokens - rec.n_recon_tokens))
    assert text.count("reference − reconstructed") == 1


# the billing cause of each diff label, and the record-level part of a verdict (spelled out here, not imported)
LABEL_BILLING_CAUSE = {"exact": "match", "bpe_split": "non_canonical_split", "whitespace": "whitespace_stripped",
                       "tool_call_id": "tool_id_rewritten", "tool_args_json_equal": "args_reserialised",
                       "special_token": "think_end_not_generated", "truncation": "length_truncation",
                       "replacement_char": "replacement_char", "other": "unexplained"}


def _verdict_cause(verdict):
    if not verdict.startswith("explained:"):
        return verdict
    alts = {"+".join(c for c in a.split("+") if c not in {"eot_not_counted", "reasoning_with_think_end",
                                                           "reasoning_not_reported", "truncation_resolved_by_billing"})
            for a in verdict[len("explained:"):].split("|")}
    return "ambiguous" if len(alts) > 1 else (alts.pop() or "match")


def test_the_billing_page_shows_its_verdicts_against_the_labels_recomputed(pages):
    """#35: on labelled input (simulate's labels.parquet beside the reconstruction) the billing page carries the
    confusion of billing verdicts against the labels and each cause's precision and recall with Wilson intervals."""
    records = pd.read_parquet(pages / "billing" / "billing_records.parquet")
    labels = pd.read_parquet(pages / "sim" / "labels.parquet").set_index("id")["expected"]
    truth = records.id.map(labels).map(LABEL_BILLING_CAUSE)
    said = records.verdict.map(_verdict_cause)
    soup = _soup(pages / "billing" / "report.html")
    conf = {r["label \\ billing verdict"]: r for r in _table_with(soup, "label \\ billing verdict")}
    expect = pd.crosstab(truth, said)
    assert set(conf) == set(expect.index)
    for label, row in conf.items():
        for verdict, n in expect.loc[label].items():
            assert int(row[verdict]) == int(n), (label, verdict)
    per = {r["cause (from the label)"]: r for r in _table_with(soup, "cause (from the label)", "recall [Wilson 95% CI]")}
    for cause in expect.index:
        tp, support, named = int(((truth == cause) & (said == cause)).sum()), int((truth == cause).sum()), int((said == cause).sum())
        lo, hi = _wilson(tp, support)
        assert per[cause]["recall [Wilson 95% CI]"] == f"{tp}/{support} ({100 * tp / support:.1f}%) [{100 * lo:.1f}%, {100 * hi:.1f}%]"
        if named:
            lo, hi = _wilson(tp, named)
            assert per[cause]["precision [Wilson 95% CI]"] == \
                f"{tp}/{named} ({100 * tp / named:.1f}%) [{100 * lo:.1f}%, {100 * hi:.1f}%]"
    explained = records.verdict.str.startswith("explained:")
    wrong = int((explained & ~said.isin(["ambiguous", "match"]) & (said != truth)).sum())
    text = soup.get_text(" ")
    assert f"{int(explained.sum()):,} explained verdicts, {wrong:,} of them naming a single cause" in text
    assert wrong == 0  # the attribution rules name the injected cause or say billing cannot tell


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
    finding = soup.find(class_="finding").get_text(" ")
    for kind, say in (("simulated", "simulated data"), ("real", "real data"), ("toy", "the toy model")):
        mm = [m for m in metrics.values() if m["data"] == kind and "mismatch_rate" in m]
        un = [m for m in metrics.values() if m["data"] == kind]
        assert say in finding
        if len(mm) == 1:  # one run: k of n, with the denominator named (the billing page's, for the billing rate)
            n = mm[0]["status"]["ok"]
            k = n - mm[0]["verdict"]["exact"]
            assert f"differs from the engine in {k} of {n} compared records ({k / n:.0%}; 1 run)" in finding
        if len(un) == 1:
            c = [un[0][f"billing_{c}"] for c in CLASSES]
            rated = c[0] + c[1] + c[2]
            assert f"unexplained for {c[2]} of {rated} rated records ({c[2] / rated:.0%}; 1 run" in finding
            assert un[0]["billing_unexplained_rate"] == pytest.approx(c[2] / rated)  # the same denominator as the metric
            if c[4]:
                assert f"{c[4]} error rows" in finding and "not rated" in finding
        else:
            v = [m["billing_unexplained_rate"] for m in un]
            span = f"{min(v):.0%}" if f"{min(v):.0%}" == f"{max(v):.0%}" else f"{min(v):.0%}–{max(v):.0%}"
            assert f"unexplained for {span} of rated records ({len(un)} runs)" in finding
    # the runs table: the real record count of every run (never a requested sample size), its duration and data kind
    head, rows = _rows(next(t for t in soup.find_all("table") if "records (n)" in t.get_text()))
    assert [r["run"] for r in rows] == ["sim-glaive", "real-stories-engine", "real-stories-billing-only",
                                        "real-tiny-kimi-engine"]  # simulated, real, then the toy model apart
    for r in rows:
        assert int(r["records (n)"].replace(",", "")) == metrics[r["run"]]["n_records"]
        assert float(r["duration (s)"]) == pytest.approx(states[r["run"]]["duration_s"], abs=0.05)
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
                name = h.replace(" (95% interval)", "").replace(" (billed − reconstructed)", "")  # the stated sign
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
    from kimi_eagle.apps.reports.batch_summary import readable

    assert readable("metric.billing_gap_pct") == "billing gap pct (billed − reconstructed)"  # a difference states its sign
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


MEDIAN = "median first difference (token position, of the divergent prompts)"
AUDIT_PAIRS = {"identical prompts (k)": "k", "compared prompts (n)": "n", "identical share (k/n)": "rate",
               "requests not compared": "not_compared", MEDIAN: "median_first_divergence",
               "mean |length difference| (tokens)": "mean_abs_length_diff", "prompts whose lengths differ": "length_diff_nonzero"}
AUDIT_RANKING = {"divergent prompts (k)": "k", "compared prompts (n)": "n", "divergent share (k/n)": "rate",
                 MEDIAN: "median_first_divergence"}  # each table's header says what its k counts


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
    shown = next(f for f in _frames(soup) if "requests not compared" in f.columns).rename(columns=AUDIT_PAIRS)
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
    ranking = next(f for f in _frames(soup) if "provider" in f.columns and "against" in f.columns).rename(columns=AUDIT_RANKING)
    assert sorted(ranking.provider) == sorted(providers)
    finding = soup.find(class_="finding").get_text(" ")
    for _, row in ranking.iterrows():
        vs = ok[(ok.kind == "reference") & (ok.b == row.provider)]
        diverged = vs[~vs.identical]
        assert (int(row.k), int(row.n)) == (len(diverged), len(vs))
        assert float(row.rate) == pytest.approx(len(diverged) / len(vs), abs=6e-4)
        said = f"{row.provider} returns a different completion than {REFERENCE} for {len(diverged)} of {len(vs)} prompts"
        assert said in finding
        if len(diverged):
            median = diverged.first_divergence.median()
            assert float(row.median_first_divergence) == pytest.approx(median)
            assert f"{said}, median first difference at token {median:g} (of {len(diverged)} divergent prompts)" in finding
    rates = [len(ok[(ok.kind == "reference") & (ok.b == p) & ~ok.identical]) / len(ok[(ok.kind == "reference") & (ok.b == p)])
             for p in ranking.provider]
    assert rates == sorted(rates, reverse=True)  # most divergent first


# ---- issue 24: every table fits, no word broken inside, text left and numbers right


def test_the_stylesheet_wraps_at_spaces_and_marked_points_never_inside_a_word():
    from kimi_eagle.apps.reports.toolkit import STYLESHEET, breakable, html_table

    rules = dict(re.findall(r"([^{}]+)\{([^}]*)\}", STYLESHEET.replace("\n", "")))
    cells = next(v for k, v in rules.items() if "table.t td" in k and "body.batch th" in k)
    assert "word-break:normal" in cells and "hyphens:none" in cells and "text-align:left" in cells
    assert "anywhere" not in STYLESHEET and "break-all" not in STYLESHEET and "keep-all" not in STYLESHEET
    assert "overflow-x" not in STYLESHEET and "display:block" not in STYLESHEET  # tables wrap, never scroll
    assert "text-align:right" in next(v for k, v in rules.items() if "td.num" in k)
    assert "white-space:normal" in next(v for k, v in rules.items() if k.startswith("table.t th"))
    assert breakable("tool_args_json_equal") == "tool_<wbr>args_<wbr>json_<wbr>equal"
    assert breakable("models/stories260K/hf") == "models/<wbr>stories260K/<wbr>hf"
    page = html_table(pd.DataFrame({"unexplained_gap_pct": [1.5], "reason": ["tool_args_json_equal and more"],
                                    "provider": ["kimi-eagle-local"]}))
    assert "<th>unexplained_<wbr>gap_<wbr>pct</th>" in page and "<td class='num'>1.500</td>" in page
    assert "<td class='tok'>kimi-eagle-local</td>" in page  # a short name is kept whole


MEASURE = r"""() => {
  const meas = document.createElement('span'); meas.style.cssText = 'position:absolute;visibility:hidden;white-space:nowrap';
  document.body.appendChild(meas);
  const out = {wide: [], broken: [], body: document.body.clientWidth};
  document.querySelectorAll('table').forEach((t, i) => {
    if (t.scrollWidth > t.clientWidth + 1 || t.getBoundingClientRect().width > out.body + 1) out.wide.push([i, t.scrollWidth]);
    t.querySelectorAll('td,th').forEach(c => {
      const cs = getComputedStyle(c); meas.style.font = cs.font;
      const room = c.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
      if (c.classList.contains('num')) { if (c.scrollWidth > c.clientWidth + 1) out.broken.push([i, c.textContent]); return; }
      for (const piece of c.textContent.split(/\s+|(?<=[_\/:#=,.|\-])/)) {
        meas.textContent = piece; if (piece && meas.getBoundingClientRect().width > room + 0.5) out.broken.push([i, piece]);
      }
    });
  });
  return out; }"""


def test_every_table_fits_the_page_and_no_word_breaks_inside_in_a_real_browser(pages, batch_page, audit_page):
    """Rendered in chromium at 1,400 px: no table wider than the page or scrolling (no column hidden), and no cell
    whose words (split at spaces and the marked break points) are wider than the cell: nothing broken mid-word."""
    from pathlib import Path

    if not Path("/usr/bin/chromium").exists():
        pytest.skip("/usr/bin/chromium not installed")
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=["--no-sandbox"])
        try:
            view = browser.new_page(viewport={"width": 1400, "height": 900})
            for page in (pages / "report" / "report.html", pages / "billing" / "report.html",
                         batch_page / "summary.html", audit_page[0] / "report.html"):
                view.goto(page.resolve().as_uri())
                seen = view.evaluate(MEASURE)
                assert seen["wide"] == [] and seen["broken"] == [], (page, seen)
        finally:
            browser.close()


def test_a_page_without_conventions_says_so_in_a_sentence_not_a_none_table(tmp_path, kimi):
    from helpers import api, row

    from kimi_eagle.apps.reports.billing_report import write_billing

    write_billing(kimi, [row(kimi, api("a")), row(kimi, api("b"))], tmp_path / "b")
    soup = _soup(tmp_path / "b" / "report.html")
    assert "(none)" not in soup.get_text() and "No record's gap is explained by a known provider convention" in soup.get_text()
    for t in soup.find_all("table"):  # text left, numbers right: every number cell is marked num
        for td in t.find_all("td"):
            text = td.get_text().replace(",", "")
            assert ("num" in (td.get("class") or [])) == bool(re.fullmatch(r"[+\-−]?[\d.]+|–", text)), td
