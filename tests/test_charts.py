"""Every chart the kit draws, rendered: its title and legend say what a reader needs (simulated or real data,
readable names, intervals), nothing hides behind anything else, and importing the package never touches
matplotlib's backend."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap

import pandas as pd
import pytest
from matplotlib.figure import Figure

from kimi_eagle.assets import REPO_ROOT

PACKAGE = REPO_ROOT / "kimi_eagle"


def title(ax) -> str:
    return ax.get_title().replace("\n", " ")


def legend(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def rendered(fig: Figure, tmp_path, name: str = "chart.png") -> Figure:
    """Draw the figure to a PNG (layout errors surface here) and check every title fits inside it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig.savefig(tmp_path / name, format="png")
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    width = fig.bbox.width
    for ax in fig.axes:
        box = ax.title.get_window_extent(renderer)
        assert box.x0 >= -1 and box.x1 <= width + 1, f"title clipped: {ax.get_title()!r}"
    return fig


# ---- the backend -------------------------------------------------------------------------------


def test_no_module_switches_the_matplotlib_backend():
    calls = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("use", "switch_backend") \
                    and ast.unparse(node.func.value) in ("matplotlib", "mpl", "plt", "pyplot", "matplotlib.pyplot"):
                calls.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert calls == []


def test_importing_every_module_leaves_the_users_backend_alone():
    modules = sorted(".".join(p.relative_to(REPO_ROOT).with_suffix("").parts) for p in PACKAGE.rglob("*.py")
                     if p.name != "__main__.py")
    code = textwrap.dedent(f"""
        import importlib, json, matplotlib
        before = matplotlib.get_backend()
        for name in {modules!r}:
            importlib.import_module(name.removesuffix(".__init__"))
        print(json.dumps([before, matplotlib.get_backend()]))
    """)
    backend = "module://matplotlib_inline.backend_inline"  # what a Jupyter kernel sets
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "MPLBACKEND": backend})
    assert out.returncode == 0, out.stderr[-2000:]
    before, after = json.loads(out.stdout.strip().splitlines()[-1])
    assert before == after == backend


# ---- the diff report's charts -----------------------------------------------------------------


def diff_frames(simulated: bool = True, outlier: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A small diff: 3 exact, 2 bpe_split, 3 semantic records and their hunks (one split and one semantic hunk
    of the same size, so their bars share a bin)."""
    verdicts = ["exact"] * 3 + ["bpe_split"] * 2 + ["semantic"] * 3
    labels = ["exact"] * 3 + ["bpe_split"] * 2 + ["whitespace", "truncation", "truncation"]
    n = len(verdicts)
    billed = [40, 55, 61, 70, 80, 90, 33, 2000 if outlier else 48]
    records = pd.DataFrame({
        "id": [f"r{i}" for i in range(n)], "dataset": ["glaive"] * 4 + ["sharegpt"] * 4, "status": ["ok"] * n,
        "verdict": verdicts, "label": labels, "subclasses": [[] for _ in range(n)],
        "expected": labels if simulated else [None] * n,
        "token_delta": [0, 0, 0, 1, 1, -2, 0, -5], "first_divergence_frac": [None] * 3 + [0.45, 0.45, 0.45, 0.9, 0.1],
        "billed_completion_tokens": billed, "n_recon_tokens": [b - d for b, d in zip(billed, [0, 0, 0, 1, 1, -2, 0, -5])],
        "billing_delta": [0, 0, 0, 1, 1, -2, 0, -5], "billing_unexplained": [0] * n,
    })
    hunks = pd.DataFrame({
        "id": ["r3", "r4", "r5", "r6", "r7"], "kind": ["split", "split", "semantic", "semantic", "semantic"],
        "subclass": [None, None, "whitespace", "truncation", "truncation"],
        "engine_tok_start": [5, 5, 5, 5, 5], "engine_tok_end": [7, 7, 7, 6, 10],
        "recon_tok_start": [5, 5, 5, 5, 5], "recon_tok_end": [6, 6, 7, 6, 5],
    })
    return records, hunks


@pytest.mark.parametrize("data", ["simulated", "real"])
def test_every_report_chart_says_which_data_it_shows(tmp_path, data):
    from kimi_eagle.apps.reports import diff_report as report

    records, hunks = diff_frames(simulated=data == "simulated")
    assert report.data_kind(records) == data
    figures = [report.chart_rates(report.rates_by_dataset(records), data),
               report.chart_verdicts(records, hunks, data), report.chart_hunk_sizes(hunks, data),
               report.chart_token_delta(records, data), report.chart_first_divergence(records, data),
               report.chart_billing(records, data)]
    for k, fig in enumerate(figures):
        rendered(fig, tmp_path, f"{k}.png")
        for ax in fig.axes:
            assert title(ax).startswith(f"[{data.upper()} data] "), title(ax)


def test_report_chart_titles_and_legends(tmp_path):
    from kimi_eagle.apps.reports import diff_report as report

    records, hunks = diff_frames()
    ax = rendered(report.chart_rates(report.rates_by_dataset(records), "simulated"), tmp_path).axes[0]
    assert "Records whose reconstruction differs from the engine (Wilson 95% CI)" in title(ax)
    assert legend(ax) == ["mismatch (not exact)", "semantic (bytes differ)"]
    ax1, ax2 = rendered(report.chart_verdicts(records, hunks, "simulated"), tmp_path).axes
    assert "Record labels (8 ok records)" in title(ax1) and "Hunks by class (5 hunks)" in title(ax2)
    ax = rendered(report.chart_token_delta(records, "simulated"), tmp_path).axes[0]
    assert "Token-count delta per differing record (5 records)" in title(ax)
    assert legend(ax) == ["differing records (5)"]
    ax = rendered(report.chart_first_divergence(records, "simulated"), tmp_path).axes[0]
    assert "Where the first difference falls" in title(ax) and legend(ax) == ["bpe_split (2)", "semantic (3)"]
    table = report.confusion(records)
    ax = rendered(report.chart_confusion(table, "simulated"), tmp_path).axes[0]
    assert "Confusion: injected effect's expected label vs diff label (8 records)" in title(ax)


@pytest.mark.parametrize("chart", ["hunk_sizes", "first_divergence"])
def test_split_bars_stand_beside_the_semantic_ones_never_under_them(tmp_path, chart):
    from kimi_eagle.apps.reports import diff_report as report

    records, hunks = diff_frames()
    fig = report.chart_hunk_sizes(hunks, "real") if chart == "hunk_sizes" else \
        report.chart_first_divergence(records, "real")
    ax = rendered(fig, tmp_path).axes[0]
    assert legend(ax)[0].startswith(("split", "bpe_split")) and legend(ax)[1].startswith("semantic")
    split, semantic = ax.containers[0], ax.containers[1]
    drawn = lambda bars: [b for b in bars if b.get_height() > 0]  # noqa: E731
    shared = 0
    for a in drawn(split):
        for b in drawn(semantic):
            overlap = min(a.get_x() + a.get_width(), b.get_x() + b.get_width()) - max(a.get_x(), b.get_x())
            assert overlap <= 1e-9, "a split bar is hidden under a semantic bar"
            shared += abs(a.get_x() - b.get_x()) < 1.0  # same bin, side by side
    assert shared >= 1  # the test data puts both kinds in one bin


def test_one_long_record_puts_the_billing_scatter_on_log_axes(tmp_path):
    from kimi_eagle.apps.reports import diff_report as report

    ax = rendered(report.chart_billing(diff_frames()[0], "real"), tmp_path).axes[0]
    assert ax.get_xscale() == "linear" and "log axes" not in title(ax)
    ax = rendered(report.chart_billing(diff_frames(outlier=True)[0], "real"), tmp_path).axes[0]
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert "log axes: counts span 33–2,005" in title(ax)
    assert "Billed vs reconstructed completion tokens (8 records, 4 off the diagonal" in title(ax)
    assert legend(ax) == ["exact (3)", "bpe_split (2)", "semantic (3)", "billed = reconstructed"]


def test_example_hunks_show_token_boundaries(kimi):
    from kimi_eagle.apps.reports.diff_report import token_run_text

    ids = [kimi.encode(" a")[0], kimi.encode("n")[0]]
    whole = kimi.encode(" an")
    assert token_run_text(ids, b" an", kimi) == "' a' 'n'"
    assert token_run_text(whole, b" an", kimi) == "' an'"
    assert token_run_text(ids, b" an") == f"' an'  [2 tokens: {ids[0]}, {ids[1]}]"  # no tokenizer: the IDs


# ---- the batch summary's charts ---------------------------------------------------------------


def summary_frame() -> pd.DataFrame:
    return pd.DataFrame({
        "run": ["sim-glaive", "sim-sharegpt", "real-stories"], "status": ["ok"] * 3,
        "metric.data": ["simulated", "simulated", "real"],
        "metric.mismatch_rate": [0.8, 0.67, 0.256], "metric.mismatch_rate_ci.0": [0.6, 0.4, 0.22],
        "metric.mismatch_rate_ci.1": [0.9, 0.85, 0.29], "metric.precision.whitespace": [1.0, 1.0, 0.98],
        "metric.verdict.exact": [2, 3, 372], "metric.verdict.semantic": [8, 6, 75],
        "metric.loss": [[3.0, 2.0, 1.5], [3.1, 2.2, 1.4], [2.9, 1.9, 1.2]],
    })


def test_summary_bar_chart_names_the_metric_readably_and_labels_each_runs_data(tmp_path):
    from kimi_eagle.apps.reports.batch_summary import bar_chart

    df = summary_frame()
    ax = rendered(bar_chart(df, "metric.mismatch_rate", ("metric.mismatch_rate_ci.0", "metric.mismatch_rate_ci.1")),
                  tmp_path).axes[0]
    assert title(ax) == "mismatch rate per run (error bars: 95% interval)"
    assert ax.get_xlabel() == "mismatch rate" and ax.get_legend() is None  # one series: the title says it all
    assert [t.get_text() for t in ax.get_yticklabels()] == ["sim-glaive [simulated]", "sim-sharegpt [simulated]",
                                                            "real-stories [real]"]
    assert ax.get_xlim() == (0.0, 1.0)  # a rate never gets an axis past 1
    ax = rendered(bar_chart(df, "metric.precision.whitespace"), tmp_path).axes[0]
    assert title(ax) == "precision › whitespace per run" and ax.get_xlim() == (0.0, 1.0)


def test_summary_stacked_and_line_charts_have_readable_titles_and_legends(tmp_path):
    from kimi_eagle.apps.reports.batch_summary import line_chart, stacked_chart

    df = summary_frame()
    ax = rendered(stacked_chart(df, ["metric.verdict.exact", "metric.verdict.semantic"], "verdict"), tmp_path).axes[0]
    assert title(ax) == "verdict per run" and legend(ax) == ["exact", "semantic"]
    ax = rendered(line_chart(df, "metric.loss"), tmp_path).axes[0]
    assert title(ax) == "loss per run"
    assert legend(ax) == ["sim-glaive [simulated]", "sim-sharegpt [simulated]", "real-stories [real]"]


def test_summary_readable_names():
    from kimi_eagle.apps.reports.batch_summary import readable

    assert readable("metric.mismatch_rate_ci.0") == "mismatch rate (CI low)"
    assert readable("metric.mismatch_rate_hi") == "mismatch rate (CI high)"
    assert readable("metric.verdict.bpe_split") == "verdict › bpe split"


# ---- tokenizer, training and τ charts ---------------------------------------------------------


def test_tokenizer_charts_name_the_tokenizer_once(kimi, tmp_path):
    from kimi_eagle.apps.reports.tokenizer_charts import special_id_figure, token_length_figure

    ax = rendered(token_length_figure(kimi), tmp_path).axes[0]
    assert title(ax).startswith("kimi tokenizer: token length in bytes (163,") and "kimi:kimi" not in title(ax)
    assert legend(ax)[0].startswith("ordinary tokens (")
    ax = rendered(special_id_figure(kimi), tmp_path).axes[0]
    assert title(ax) == "kimi tokenizer: special tokens in the ID space"
    assert legend(ax)[0].startswith("reserved (") and "HF special=True" in legend(ax)


def test_tau_chart_has_intervals_and_names_the_model(tmp_path):
    from kimi_eagle.apps.reports.training_charts import plot_tau
    from kimi_eagle.eagle3.evaluate import tau_intervals, tau_table

    def report(greedy, per_prompt):
        return {"methods": {"eagle3": {"greedy": {"tau": greedy, "identical_to_target_greedy": "3/3",
                                                  "per_prompt_tau": per_prompt}}}}

    reports = {"engine IDs": report(2.0, [1.8, 2.0, 2.2]), "recon IDs": report(2.1, [2.1, 2.1, 2.1])}
    intervals = tau_intervals(reports)
    lo, hi = intervals["EAGLE-3 (engine IDs)"]["greedy"]
    assert lo == pytest.approx(2.0 - 1.96 * 0.2 / 3 ** 0.5) and hi == pytest.approx(2.0 + 1.96 * 0.2 / 3 ** 0.5)
    assert intervals["EAGLE-3 (recon IDs)"]["greedy"] == pytest.approx((2.1, 2.1))
    # told no kind, the chart says so: never "[REAL data]" (#46)
    fig = plot_tau(tau_table(reports), ("greedy",), title="τ with k=4", intervals=intervals, model="stories260K")
    ax = rendered(fig, tmp_path).axes[0]
    assert title(ax) == "[kind not recorded] τ with k=4 — target stories260K (error bars: 95% interval over prompts)"
    assert legend(ax) == ["EAGLE-3 (engine IDs)", "EAGLE-3 (recon IDs)"]
    caps = [line for c in ax.containers if hasattr(c, "errorbar") and c.errorbar for line in c.errorbar.lines[1]]
    assert caps, "error bars are drawn"


def test_training_curves_keep_the_dashed_run_visible_on_top(tmp_path):
    from kimi_eagle.apps.reports.training_charts import plot_histories

    entry = lambda s: {"step": s, "loss": 2.0 / s, "acc": [0.5, 0.25]}  # noqa: E731
    same = [entry(1), entry(2)]
    fig = rendered(plot_histories({"engine IDs": same, "recon IDs": same}), tmp_path)
    loss_ax, acc_ax = fig.axes
    assert legend(loss_ax) == ["engine IDs", "recon IDs"]
    solid, dashed = loss_ax.lines
    assert solid.get_linestyle() == "-" and dashed.get_linestyle() == "--"
    assert dashed.get_zorder() > solid.get_zorder() and dashed.get_linewidth() < solid.get_linewidth()
    assert "dashed: recon IDs" in title(acc_ax) and legend(acc_ax) == ["TTT step 0", "TTT step 1"]


def test_every_training_and_evaluation_chart_carries_its_data_tag():
    """The charts of notebooks 03/04 say real / toy model like the report pages (issue 24)."""
    from kimi_eagle.apps.reports.training_charts import (
        plot_arms,
        plot_dose_response,
        plot_histories,
        plot_history,
        plot_tau,
    )

    history = [{"step": s, "loss": 3.0 - s / 10, "step_loss": [3.0 - s / 10, 3.2], "acc": [0.1 * s, 0.05 * s]} for s in (1, 2, 3)]
    arms = [{"mode": "greedy", "arm": a, "tau": 1.2, "lo": 1.1, "hi": 1.3, "ids": "recon", "storage": "bf16", "inject_rate": r}
            for a, r in (("recon IDs · bf16", 0.0), ("recon + 5 % splits", 0.05))]
    tau = {"EAGLE-3 (engine IDs)": {"greedy": 2.0, "t=1": 1.4}}

    def titles(fig):
        return " ".join([fig._suptitle.get_text() if fig._suptitle else ""] + [ax.get_title() for ax in fig.axes])

    for data, tag in (("real", "[REAL data]"), ("toy", "[REAL engine, toy model (not Kimi's rates)]")):
        for fig in (plot_history(history, data=data), plot_histories({"a": history}, data=data),
                    plot_tau(tau, data=data), plot_arms(arms, data=data), plot_dose_response(arms, data=data)):
            assert tag in titles(fig).replace("\n", " ")


def test_one_verdict_colour_scheme_on_every_page():
    from kimi_eagle.apps.reports import batch_summary, billing_report, diff_report, toolkit

    assert diff_report.VERDICT_COLORS is toolkit.VERDICT_COLORS
    assert all(billing_report.CLASS_COLORS[c] == toolkit.VERDICT_COLORS[c] for c in billing_report.CLASS_COLORS)
    df = pd.DataFrame({"run": ["a", "b"], "metric.verdict.exact": [3, 1], "metric.verdict.semantic": [1, 2],
                       "metric.verdict.bpe_split": [0, 1]})
    fig = batch_summary.stacked_chart(df, ["metric.verdict.exact", "metric.verdict.semantic", "metric.verdict.bpe_split"], "verdict")
    from matplotlib.colors import to_hex

    drawn = {to_hex(p.get_facecolor()) for p in fig.axes[0].patches}
    assert drawn == {toolkit.VERDICT_COLORS[v] for v in ("exact", "semantic", "bpe_split")}
    assert toolkit.verdict_color("explained:think_end_not_generated") == toolkit.VERDICT_COLORS["explained"]


# ---- issue 24: count axes, overlapping titles and labels, the ablation's axes, the summary's n/a runs


def _integer_ticks(axis) -> bool:
    lo, hi = axis.get_view_interval()
    return all(float(t).is_integer() for t in axis.get_ticklocs() if lo <= t <= hi)


def _drawn(monkeypatch, module, call):
    """The figure a chart function of ``module`` saves (it returns a path)."""
    made = []
    real = module.save
    monkeypatch.setattr(module, "save", lambda fig, path: made.append(fig) or real(fig, path))
    call()
    monkeypatch.setattr(module, "save", real)
    return made[0]


def test_every_count_axis_has_whole_number_ticks(tmp_path, monkeypatch):
    """Two hunks, one differing record: ticks 0, 1, 2 (never 0.25 steps) on every axis that counts something."""
    from kimi_eagle.apps.reports import batch_summary, billing_report
    from kimi_eagle.apps.reports import diff_report as report

    records, hunks = diff_frames()
    records, hunks = records[records.verdict != "semantic"].head(4), hunks.head(2)  # 1 bpe_split record, 2 hunks
    checks = []
    ax1, ax2 = rendered(report.chart_verdicts(records, hunks, "real"), tmp_path, "v.png").axes
    checks += [ax1.xaxis, ax2.xaxis]
    for fig in (report.chart_hunk_sizes(hunks, "real"), report.chart_token_delta(records, "real"),
                report.chart_first_divergence(records, "real")):
        ax = rendered(fig, tmp_path, "h.png").axes[0]
        checks += [ax.yaxis]
    table = pd.DataFrame([{"provider": "P", **{c: k for c, k in zip(billing_report.VERDICTS, (1, 0, 1, 0, 0))}}])
    fig = _drawn(monkeypatch, billing_report,
                 lambda: billing_report.chart_verdicts(table, "provider", tmp_path / "bv.png", "real"))
    checks += [fig.axes[0].xaxis]
    bill = pd.DataFrame({"billing_delta": [0, 1], "verdict": ["match", "unexplained"]})
    fig = _drawn(monkeypatch, billing_report, lambda: billing_report.chart_delta_histogram(bill, tmp_path / "d.png", "real"))
    checks += [fig.axes[0].yaxis]
    df = summary_frame().assign(**{"metric.n_hunks": [2, 1, 0]})
    checks += [rendered(batch_summary.stacked_chart(df, ["metric.verdict.exact", "metric.verdict.semantic"], "verdict"),
                        tmp_path, "s.png").axes[0].xaxis,
               rendered(batch_summary.bar_chart(df, "metric.n_hunks"), tmp_path, "b.png").axes[0].xaxis]
    assert all(_integer_ticks(a) for a in checks), [list(a.get_ticklocs()) for a in checks if not _integer_ticks(a)]
    assert all(len([t for t in a.get_ticklocs()]) >= 2 for a in checks)


def _boxes(fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def test_the_billing_gap_chart_titles_labels_and_legend_never_overlap(tmp_path, monkeypatch):
    """Side-by-side panel titles do not collide (the tag is the suptitle), every bar label sits inside its frame,
    and the legend is outside the bars."""
    from kimi_eagle.apps.reports import billing_report as b

    row = {"gap_pct": 7.973, "gap_pct_lo": 5.0, "gap_pct_hi": 10.5, "unexplained_gap_pct": 7.9, "unexplained_gap_pct_lo": 4.0,
           "unexplained_gap_pct_hi": 10.0, "unexplained_rate": 29 / 43, "unexplained_lo": 0.52, "unexplained_hi": 0.8,
           "billed_tokens": 2588, "unexplained": 29, "rated": 43}
    table = pd.DataFrame([{"provider": "kimi-eagle-local", **row}, {"provider": "all", **row}])
    fig = _drawn(monkeypatch, b, lambda: b.chart_gap(table, "provider", tmp_path / "gap.png", "toy"))
    renderer = _boxes(fig)
    ax1, ax2 = fig.axes
    t1, t2 = ax1.title.get_window_extent(renderer), ax2.title.get_window_extent(renderer)
    assert t1.x1 < t2.x0 and not t1.overlaps(fig._suptitle.get_window_extent(renderer))
    assert "toy model" in fig._suptitle.get_text() and "billing-only" in fig._suptitle.get_text()
    for ax in (ax1, ax2):
        frame = ax.get_window_extent(renderer)
        for text in ax.texts:
            box = text.get_window_extent(renderer)
            assert frame.y0 <= box.y0 and box.y1 <= frame.y1, text.get_text()  # labels inside the frame
    legend = ax1.get_legend().get_window_extent(renderer)
    assert not any(legend.overlaps(p.get_window_extent(renderer)) for p in ax1.patches)


def test_the_ablation_charts_use_a_linear_dose_axis_and_one_tau_scale():
    from kimi_eagle.apps.reports.training_charts import plot_arms, plot_dose_response

    table = [{"mode": m, "arm": f"recon + {r:g}", "tau": t, "lo": t - 0.05, "hi": t + 0.05, "ids": "recon", "storage": "bf16",
              "inject_rate": r / 100} for m, shift in (("greedy", 0.0), ("t=1", 0.05))
             for r, t in ((0, 1.17 + shift), (1, 1.16 + shift), (5, 1.14 + shift), (20, 1.10 + shift))]
    ax = plot_dose_response(table).axes[0]
    assert ax.get_xscale() == "linear" and list(ax.get_xticks()) == [0, 1, 5, 20]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1", "5", "20"]  # every dose labelled
    a, b = plot_arms(table).axes
    assert a.get_xlim() == b.get_xlim()


def test_a_run_without_the_metric_says_na_and_status_uses_the_scheme(tmp_path):
    from matplotlib.colors import to_hex

    from kimi_eagle.apps.reports import toolkit
    from kimi_eagle.apps.reports.batch_summary import comparison_charts, stacked_chart

    df = summary_frame().assign(**{"metric.n_hunks": [3, 5, None], "metric.status.ok": [10, 10, 8],
                                   "metric.status.error": [0, 0, 2]})
    paths = comparison_charts(df, tmp_path)
    assert "n_hunks.png" in [p.name for p in paths]
    from kimi_eagle.apps.reports.batch_summary import bar_chart

    ax = bar_chart(df, "metric.n_hunks").axes[0]
    assert len(ax.get_yticklabels()) == 3 and any("n/a" in t.get_text() for t in ax.texts)
    ax = stacked_chart(df, ["metric.status.ok", "metric.status.error"], "status").axes[0]
    drawn = {to_hex(p.get_facecolor()) for p in ax.patches if p.get_width()}
    assert drawn == {toolkit.STATUS_COLORS["ok"], toolkit.STATUS_COLORS["error"]}
    assert toolkit.STATUS_COLORS["ok"] == toolkit.VERDICT_COLORS["exact"]  # finished: the agreement green


def test_a_batch_chart_title_is_never_cut_off_by_long_run_names(tmp_path):
    """#35: with long run names the axes moves right and a title wrapped to the figure's width ran past its edge
    (and, re-wrapped, past its top). Saved, every title lies inside the figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from kimi_eagle.apps.reports import batch_summary
    from kimi_eagle.apps.reports.toolkit import save

    df = pd.DataFrame({"run": ["sim-glaive", "real-stories260K-billing-only", "real-tiny-kimi-engine-with-a-long-name"],
                       "status": ["ok"] * 3, "metric.data": ["simulated", "real", "toy"],
                       "metric.billing_gap_pct": [0.0, 1.5, 3.0], "metric.billing_gap_pct_ci.0": [0.0, 0.0, 0.0],
                       "metric.billing_gap_pct_ci.1": [3.0, 3.0, 3.0]})
    fig = batch_summary.bar_chart(df, "metric.billing_gap_pct",
                                  ("metric.billing_gap_pct_ci.0", "metric.billing_gap_pct_ci.1"))
    save(fig, tmp_path / "gap.png", tight=False)
    renderer = FigureCanvasAgg(fig).get_renderer()
    box = fig.axes[0].title.get_window_extent(renderer)
    assert "95% interval" in fig.axes[0].get_title()
    assert -1 <= box.x0 and box.x1 <= fig.bbox.width + 1 and -1 <= box.y0 and box.y1 <= fig.bbox.height + 1, box
