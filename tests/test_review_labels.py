"""Issue 46, the small findings of a reviewer's read: what pages, charts and notebooks print is what a person
expects to read — whole token positions, no "-0.0", every count legible on its chart, every curve of a legend
visible, an unexplained billing verdict that names the reconstruction's flag, a defined "expected τ (train)", and
notebook pages whose CJK text has a font to fall back to."""
from __future__ import annotations

import json
import re

import nbformat
import numpy as np
import pandas as pd
import pytest
from helpers import api, row
from matplotlib.backends.backend_agg import FigureCanvasAgg

from kimi_eagle.assets import REPO_ROOT


def _drawn(monkeypatch, module, call):
    """The figure a chart function of ``module`` saves (it returns a path), drawn."""
    made = []
    real = module.save
    monkeypatch.setattr(module, "save", lambda fig, path: made.append(fig) or real(fig, path))
    call()
    monkeypatch.setattr(module, "save", real)
    FigureCanvasAgg(made[0]).draw()
    return made[0]


# ---- token positions are whole numbers ("token 9", never "token 9.0")


def test_the_audits_token_positions_read_back_as_whole_numbers_beside_a_missing_one(tmp_path):
    """pairs.parquet has no first divergence for an identical pair: the column stayed float and notebook 05 printed
    "first divergence at token 9.0"; the median of two positions printed 9.0 in the tables and summary.json."""
    from kimi_eagle.apps.audit.compare import summarize
    from kimi_eagle.apps.audit.run import PAIR_COLUMNS, _write_parquet

    base = {"kind": "pair", "a": "x", "b": "y", "repeat": 0, "status": "ok", "error": None, "verdict": None,
            "label": None, "len_a": 12, "len_b": 12, "length_diff": 0, "n_hunks": None}
    pairs = [{**base, "prompt_id": "p1", "identical": True, "first_divergence": None},
             {**base, "prompt_id": "p2", "identical": False, "first_divergence": 8, "n_hunks": 1},
             {**base, "prompt_id": "p3", "identical": False, "first_divergence": 10, "n_hunks": 1}]
    _write_parquet(pairs, tmp_path / "pairs.parquet", PAIR_COLUMNS)
    back = pd.read_parquet(tmp_path / "pairs.parquet")
    first = back[back.identical == False].sort_values("first_divergence").iloc[0]  # noqa: E712 (notebook 05's line)
    assert f"first divergence at token {first.first_divergence}" == "first divergence at token 8"
    assert [str(v) for v in back.n_hunks] == ["<NA>", "1", "1"]
    summary = summarize(pairs, ["x", "y"], has_reference=False)
    median = summary["pairs"]["x|y"]["median_first_divergence"]
    assert median == 9 and isinstance(median, int) and json.dumps(median) == "9"
    assert summary["divergence_ranking"][0]["median_first_divergence"] == 9


# ---- the billing-verdict chart: no count cut by its segment


def _inside(inner, outer, slack=0.5) -> bool:
    return (inner.x0 >= outer.x0 - slack and inner.x1 <= outer.x1 + slack and inner.y0 >= outer.y0 - slack
            and inner.y1 <= outer.y1 + slack)


@pytest.mark.parametrize("rows", [
    [("Chutes", {"match": 47, "unexplained": 1})],  # the clipped "1": one red record of 48
    [("Chutes", {"match": 47, "unexplained": 1}), ("DeepInfra", {"match": 300, "explained": 5, "no_billing": 1})],
], ids=["linear", "symlog"])
def test_every_count_on_the_billing_verdict_chart_is_legible_inside_the_figure(tmp_path, monkeypatch, rows):
    """#46: a one-record segment of a 48-record bar had its white "1" wider than the segment, cut at its edges.
    A count is drawn inside its segment only when it fits there (white on the colour); otherwise beside the bar's
    end, naming its verdict, inside the axes frame. Every count is on the chart, once."""
    from kimi_eagle.apps.reports import billing_report as b
    from kimi_eagle.diff.billing import VERDICTS

    table = pd.DataFrame([{"provider": name, **{v: counts.get(v, 0) for v in VERDICTS}} for name, counts in rows]
                         + [{"provider": "all", **{v: 0 for v in VERDICTS}}])
    fig = _drawn(monkeypatch, b, lambda: b.chart_verdicts(table, "provider", tmp_path / "v.png", "real"))
    renderer = FigureCanvasAgg(fig).get_renderer()
    ax = fig.axes[0]
    frame, page = ax.get_window_extent(renderer), fig.bbox
    said_inside, said_beside = [], []
    for text in ax.texts:
        box = text.get_window_extent(renderer)
        assert _inside(box, page), f"{text.get_text()!r} runs off the figure"
        if text.get_color() == "#fff":  # inside a segment: within the one patch under it
            under = [p for p in ax.patches if p.get_window_extent(renderer).contains(*box.get_points().mean(axis=0))]
            assert len(under) == 1 and _inside(box, under[0].get_window_extent(renderer), slack=0), text.get_text()
            said_inside.append(int(text.get_text()))
        else:
            assert _inside(box, frame), f"{text.get_text()!r} leaves the axes"
            said_beside += [int(k) for k in re.findall(r"(\d+) \w+", text.get_text())]
    assert "1 unexplained" in " ".join(t.get_text() for t in ax.texts)
    assert sorted(said_inside + said_beside) == sorted(k for _, counts in rows for k in counts.values() if k)


# ---- an unexplained billing verdict names the reconstruction's flag


def test_a_record_cut_inside_its_tool_call_arguments_is_unexplained_naming_args_not_json(kimi, tmp_path):
    """#46: a record cut inside its tool-call arguments (finish_reason stop, arguments not JSON) billed 94 more
    tokens than reconstructed read "unexplained +94" with no word of its flag; the verdict's reason, the page's worst
    records and billing_records.parquet name args_not_json and what it means."""
    from kimi_eagle.apps.reports.billing_report import write_billing

    cut = {"id": "functions.get_weather:0", "type": "function",
           "function": {"name": "get_weather", "arguments": "{\"city\": \"Par"}}
    rows = [row(kimi, api("cut", tool_calls=[cut], content=None), billed=94),
            row(kimi, api("fine", content="Sunny."), billed=5)]
    assert "args_not_json" in rows[0]["flags"] and "args_not_json" not in rows[1]["flags"]
    write_billing(kimi, rows, tmp_path, "real")
    records = pd.read_parquet(tmp_path / "billing_records.parquet").set_index("id")
    assert records.loc["cut", "verdict"] == "unexplained" and records.loc["cut", "unexplained_tokens"] == 94
    reason = records.loc["cut", "reason"]
    assert "+94 completion tokens that no known convention explains" in reason
    assert "the reconstruction flagged args_not_json (tool-call arguments that are not JSON" in reason
    assert records.loc["fine", "verdict"] == "unexplained" and "flagged" not in records.loc["fine", "reason"]
    page = (tmp_path / "report.html").read_text().replace("<wbr>", "")
    assert "+94 completion tokens that no known convention explains; the reconstruction flagged args_not_json" in page


# ---- the audit's first-divergence chart: every legend entry visible


def test_identical_divergence_curves_are_drawn_once_with_a_legend_naming_every_pair():
    """#46: pairs with the same first divergences were drawn on top of each other, so 2 of 6 legend entries had no
    visible line. Identical curves share one line whose legend entry names each pair; every line drawn differs."""
    from kimi_eagle.apps.audit.report import first_divergence_figure

    def pair(a, b, kind, firsts, n=4):
        return {"a": a, "b": b, "kind": kind, "n": n, "first_divergence": firsts}

    pairs = [pair("x", "y", "pair", [3, 7]), pair("x", "z", "pair", [5]), pair("y", "z", "pair", [3, 7]),
             pair("reference", "x", "reference", []), pair("reference", "y", "reference", [3, 7]),
             pair("reference", "z", "reference", [])]
    summary = {"pairs": {f"{p['a']}|{p['b']}": p for p in pairs}, "settings": {"max_tokens": 12}, "data": "real"}
    ax = first_divergence_figure(summary).axes[0]
    curves = [tuple(map(tuple, line.get_xydata())) for line in ax.get_lines()]
    assert len(curves) == len(set(curves)) == 3  # [3, 7] ×3, [5], [] ×2
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert len(legend) == 3
    for p in pairs:  # every pair is named, exactly once
        assert sum(f"{p['a']} vs {p['b']}" in entry for entry in legend) == 1, p
    assert any("x vs y = y vs z = reference vs y (2/4 diverge, identical curves)" == e for e in legend)
    styles = {t.get_text(): line.get_linestyle() for t, line in zip(ax.get_legend().get_texts(), ax.get_lines())}
    assert styles["reference vs x = reference vs z (0/4 diverge, identical curves)"] == "--"  # only reference pairs
    assert styles["x vs z (1/4 diverge)"] == "-"


# ---- expected τ (train) is defined where it is shown


def test_expected_tau_train_is_defined_where_notebook_03_shows_it_and_in_the_docs():
    """#46: notebook 03 showed "expected tau (train)" 1.48 beside a measured τ 2.08 with no definition anywhere."""
    nb = nbformat.read(str(REPO_ROOT / "notebooks" / "03_eagle3_training.ipynb"), as_version=4)
    shown = next(c.source for c in nb.cells if c.cell_type == "code" and "expected_tau" in c.source)
    label = re.search(r'"(expected τ \(train\)[^"]*)": s\["final"\]\["expected_tau"\]', shown)
    assert label, "the row label of the expected τ carries its definition"
    assert "1 + Σ_k ∏_{j≤k} acc_j" in label.group(1) and "teacher-forced" in label.group(1)
    assert "docs/eagle3.md" in label.group(1)
    docs = (REPO_ROOT / "docs" / "eagle3.md").read_text()
    section = docs[docs.index("**Expected τ (train)**"):][:1200]
    for said in ("1 + Σ_k ∏_{j≤k} acc_j", "kimi_eagle.eagle3.losses.expected_tau", "teacher-forced",
                 "kimi-eagle evaluate"):
        assert said in section, said


# ---- no "-0.0" on a page or a chart


def test_a_number_that_rounds_to_zero_is_never_written_with_a_minus():
    from kimi_eagle.apps.reports.toolkit import html_cell, number, zero_without_sign

    assert number(-0.0001, "+.3f") == "+0.000" and number(-0.0, ".1f") == "0.0" and number(-0.001, ".0%") == "0%"
    assert number(-0.5, ".1f") == "-0.5" and number(-1e-9, ".4g") == "-1e-09"
    assert html_cell(-0.0004) == "<td class='num'>0.000</td>" and html_cell(np.float64(-0.0)) == "<td class='num'>0.000</td>"
    assert zero_without_sign("gap −0.000% and -0.01, run-0.0") == "gap 0.000% and -0.01, run-0.0"


def test_the_billing_page_and_gap_chart_never_say_minus_zero(kimi, tmp_path, monkeypatch):
    """#46: a gap of −0.0004 % was written "-0.000%" on the billing page, its chart labels and its terminal line."""
    from kimi_eagle.apps.reports import billing_report as b

    tiny = {"gap_pct": -0.0004, "gap_pct_lo": -0.0004, "gap_pct_hi": 0.0001, "unexplained_gap_pct": -0.0,
            "unexplained_gap_pct_lo": -0.0002, "unexplained_gap_pct_hi": 0.0, "unexplained_rate": 0.0,
            "unexplained_lo": 0.0, "unexplained_hi": 0.2, "billed_tokens": 2588, "unexplained": 0, "rated": 43}
    table = pd.DataFrame([{"provider": "P", **tiny}, {"provider": "all", **tiny}])
    fig = _drawn(monkeypatch, b, lambda: b.chart_gap(table, "provider", tmp_path / "gap.png", "real"))
    labels = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert labels and not any(re.search(r"[-−]0\.0", t) for t in labels), labels
    assert "+0.000%" in labels
    assert b._with_ci(-0.0004, -0.0004, 0.0001) == "+0.000% [+0.000%, +0.000%]"
    _, rates = b.group_tables([{"provider": "P", **tiny, **{k: 0 for k in ("records", "match", "explained",
                                "no_billing", "error", "reconstructed_tokens")}}], "provider")
    assert not any(re.search(r"[-−]0\.0", str(v)) for v in rates.to_numpy().ravel())


# ---- CJK text on notebook pages


def test_notebook_pages_fall_back_to_a_cjk_font_and_say_what_to_install(tmp_path):
    """#46: notebook 01's Kimi tokens (Chinese) rendered as boxes in a browser without CJK fonts. Every notebook
    page names CJK fonts after its own (JupyterLab's font variables and plain text and code), and a page that shows
    CJK text says, at its top, what to install when they still show as boxes."""
    from kimi_eagle.apps.widgets.snapshot import CJK_NOTE, notebook_html

    def page(text: str) -> str:
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(text)])
        path = tmp_path / f"{len(text)}.ipynb"
        nbformat.write(nb, str(path))
        return notebook_html(path)

    chinese, plain = page("Kimi 的分词器: 你好"), page("no such text")
    for html in (chinese, plain):
        style = re.search(r"<style id='ke-cjk-fonts'>(.*?)</style>", html, re.S)
        assert style and html.index("ke-cjk-fonts") > html.rindex("<style", 0, html.index("ke-cjk-fonts") - 20)
        rules = style.group(1)
        for variable in ("--jp-content-font-family", "--jp-code-font-family", "--jp-ui-font-family"):
            assert re.search(variable + r":[^;}]*Noto Sans CJK SC[^;}]*", rules), variable
        assert re.search(r"pre,code[^{]*\{font-family:[^}]*Noto Sans Mono CJK SC[^}]*monospace\}", rules)
        assert html.index("ke-cjk-fonts") < html.index("</head>")
    assert CJK_NOTE in chinese and chinese.index(CJK_NOTE) < chinese.index("你好")
    assert CJK_NOTE not in plain
    nb01 = (REPO_ROOT / "notebooks" / "01_tokenizer_probe.ipynb").read_text(encoding="utf-8")
    assert re.search("[\u4e00-\u9fff]", nb01), "notebook 01 shows CJK text, so its page carries the note"
