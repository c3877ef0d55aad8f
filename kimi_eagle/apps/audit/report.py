"""The audit's charts and page: ``agreement_matrix.png``, ``first_divergence_cdf.png``, ``self_consistency.png`` and
``report.html`` beside ``summary.json``, drawn from that summary alone with the report toolkit
(:mod:`kimi_eagle.apps.reports.toolkit`), like ``kimi-eagle report`` and ``kimi-eagle billing``.

Every title and the banner say the data kind (:mod:`kimi_eagle.data_kinds`): ``real`` for providers reached over
the network, ``stand-in: <model> served locally`` when the "providers" are a local ``kimi-eagle serve`` table (the
demo's stories260K at three precisions on 127.0.0.1) — real machinery, not real providers. A chart or section that
fails becomes a visible note on the page; the others are drawn.
"""
from __future__ import annotations

import html
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from kimi_eagle import data_kinds
from kimi_eagle.apps.reports.toolkit import (
    chart_embedder,
    draw_charts,
    figure,
    finding,
    html_page,
    html_table,
    left_out_section,
    no_data,
    plain,
    save,
    section,
    title,
)
from kimi_eagle.io import write_text

AUDIT_DATA = "real"  # the kind when a summary does not say (an audit of providers over the network)


def audit_data(summary: dict[str, Any]) -> str:
    """The summary's data kind: its ``data``, else what its ``base_url`` and model make it
    (:func:`kimi_eagle.data_kinds.provider_kind`), else :data:`AUDIT_DATA`."""
    settings = summary.get("settings") or {}
    if summary.get("data"):
        return data_kinds.check(summary["data"])
    return data_kinds.provider_kind(settings["base_url"], settings.get("model", "")) if settings.get("base_url") \
        else AUDIT_DATA


AUDIT_CHARTS = ("agreement_matrix", "first_divergence_cdf", "self_consistency")


def agreement_shares(summary: dict[str, Any]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The agreement matrix as arrays: the names (reference first), the identical share per cell (NaN where
    nothing was compared) and the ``k/n`` count per cell (-1 where nothing was compared)."""
    names = list(summary["names"])
    share = np.full((len(names), len(names)), np.nan)
    counts = np.full((len(names), len(names), 2), -1, dtype=int)
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            cell = summary["matrix"].get(a, {}).get(b)
            if cell and cell["n"]:
                share[i, j] = cell["k"] / cell["n"]
                counts[i, j] = (cell["k"], cell["n"])
    return names, share, counts


def agreement_matrix_figure(summary: dict[str, Any]) -> Figure:
    """Heatmap of the share of prompts whose greedy completions are identical, with ``k/n`` in each cell; the
    diagonal is self-consistency (all repeats of a provider identical)."""
    names, share, counts = agreement_shares(summary)
    fig, ax = figure((1.4 * len(names) + 2, 1.2 * len(names) + 1.5))
    im = ax.imshow(share, vmin=0, vmax=1, cmap="viridis")
    for i in range(len(names)):
        for j in range(len(names)):
            if counts[i, j, 1] > 0:
                ax.text(j, i, f"{share[i, j]:.0%}\n{counts[i, j, 0]}/{counts[i, j, 1]}", ha="center", va="center",
                        color="white" if share[i, j] < 0.6 else "black")
    ax.set_xticks(range(len(names)), [plain(n) for n in names])
    ax.set_yticks(range(len(names)), [plain(n) for n in names])
    fig.colorbar(im, ax=ax, label="share identical")
    title(ax, f"Identical greedy completions ({summary.get('settings', {}).get('model', '')})", audit_data(summary))
    return fig


def divergence_steps(pair: dict[str, Any], max_tokens: int | None) -> tuple[list[float], list[float]]:
    """One pair's first-divergence CDF as a step line: the share of compared prompts diverged by each token
    position (ending at the pair's divergence rate, at ``max_tokens`` or the last divergence)."""
    firsts, n = sorted(pair["first_divergence"]), pair["n"]
    xs = [0] + [x for x in firsts for _ in (0, 1)] + [max_tokens or (firsts[-1] if firsts else 1)]
    ys = [0] + [v for k in range(len(firsts)) for v in (k / n, (k + 1) / n)] + [len(firsts) / n]
    return xs, ys


def first_divergence_figure(summary: dict[str, Any]) -> Figure:
    """Per compared pair, the share of prompts diverged by each token position (dashed: against the reference).
    Pairs whose curves are identical are drawn once, their legend entry naming every pair (``x vs y = ref vs y``):
    drawn one on top of the other, all but the last were invisible (#46)."""
    fig, ax = figure((8, 4.5))
    max_tokens = summary.get("settings", {}).get("max_tokens")
    curves: dict[tuple, list[dict[str, Any]]] = {}  # pairs with the same curve share one line and one legend entry
    for p in summary["pairs"].values():
        if p["n"]:
            xs, ys = divergence_steps(p, max_tokens)
            curves.setdefault((tuple(xs), tuple(ys)), []).append(p)
    for (xs, ys), same in curves.items():
        names = " = ".join(f"{p['a']} vs {p['b']}" for p in same)
        p = same[0]
        ax.plot(xs, ys, label=plain(f"{names} ({len(p['first_divergence'])}/{p['n']} diverge"
                                    + (", identical curves)" if len(same) > 1 else ")")),
                linestyle="--" if all(q["kind"] == "reference" for q in same) else "-")
    if curves:
        ax.legend(fontsize=8)
    else:
        no_data(ax, "compared pairs")
    ax.set(xlabel="first differing token (position in the completion)", ylabel="share of prompts diverged by then",
           ylim=(0, 1))
    title(ax, "Where completions part: first-divergence CDF per pair", audit_data(summary))
    return fig


def self_consistency_figure(summary: dict[str, Any]) -> Figure:
    """Per provider, the share of prompts whose repeats came back identical, with Wilson 95% intervals."""
    providers = list(summary["providers"])
    cells = [summary["matrix"][p][p] for p in providers]
    rates = [c["rate"] if c["n"] else 0.0 for c in cells]
    err = np.array([[max(0.0, r - c["ci95"][0]) for r, c in zip(rates, cells)],
                    [max(0.0, c["ci95"][1] - r) for r, c in zip(rates, cells)]])
    fig, ax = figure((1.5 * len(providers) + 2, 3.5))
    ax.bar(range(len(providers)), rates, yerr=err, capsize=4)
    for k, c in enumerate(cells):
        ax.text(k, 0.05, f"{c['k']}/{c['n']}", ha="center", color="white")
    ax.set_xticks(range(len(providers)), [plain(p) for p in providers])
    ax.set(ylim=(0, 1.05), ylabel="repeats identical")
    title(ax, "Self-consistency: repeats identical (Wilson 95% CI)", audit_data(summary))
    return fig


def make_charts(summary: dict[str, Any], out: Path, notes: list[dict[str, Any]] | None = None) -> dict[str, Path]:
    """The three audit charts as PNGs in ``out`` (a chart that fails is noted in ``notes``, see
    :func:`~kimi_eagle.apps.reports.toolkit.draw_charts`)."""
    figures: dict[str, Callable[[dict[str, Any]], Figure]] = {
        "agreement_matrix": agreement_matrix_figure, "first_divergence_cdf": first_divergence_figure,
        "self_consistency": self_consistency_figure}
    return draw_charts({name: (lambda path, f=f: save(f(summary), path)) for name, f in figures.items()}, out, notes)


# --------------------------------------------------------------------------------------------
# the page

Image = Callable[[str, str], str]


def matrix_table(summary: dict[str, Any]) -> pd.DataFrame:
    """The agreement matrix as text: ``k/n`` per cell (``–`` where nothing was compared)."""
    names, _, counts = agreement_shares(summary)
    rows = [{"": a, **{b: f"{counts[i, j, 0]}/{counts[i, j, 1]}" if counts[i, j, 1] > 0 else "–"
                       for j, b in enumerate(names)}} for i, a in enumerate(names)]
    return pd.DataFrame(rows, columns=["", *names])


def _settings_html(summary: dict[str, Any]) -> list[str]:
    s = summary.get("settings", {})
    return [f"<p>{summary['prompts']:,} prompts ({summary['bad_prompts']:,} unreadable), {summary['repeats']} "
            f"repeats, {summary['requests']:,} requests: "
            + ", ".join(f"{v:,} {html.escape(k)}" for k, v in summary["completions"].items()) + ".</p>",
            html_table(pd.DataFrame([s])) if s else ""]


def _matrix_html(summary: dict[str, Any], image: Image) -> list[str]:
    return ["<h2>Agreement matrix: identical greedy completions</h2>",
            "<p>Each cell: prompts whose completions are identical (same IDs), <code>k/n</code>; the diagonal is "
            "self-consistency (all repeats identical).</p>",
            html_table(matrix_table(summary)), image("agreement_matrix", "agreement matrix")]


MEDIAN_HEADER = "median first difference (token position, of the divergent prompts)"
PAIR_HEADERS = {"a": "a", "b": "b", "kind": "kind", "k": "identical prompts (k)", "n": "compared prompts (n)",
                "rate": "identical share (k/n)", "not_compared": "requests not compared",
                "median_first_divergence": MEDIAN_HEADER, "mean_abs_length_diff": "mean |length difference| (tokens)",
                "length_diff_nonzero": "prompts whose lengths differ"}
RANKING_HEADERS = {"provider": "provider", "against": "against", "k": "divergent prompts (k)", "n": "compared prompts (n)",
                   "rate": "divergent share (k/n)", "median_first_divergence": MEDIAN_HEADER}


def _pairs_html(summary: dict[str, Any], image: Image) -> list[str]:
    rows = pd.DataFrame([{h: p.get(k) for k, h in PAIR_HEADERS.items()} for p in summary["pairs"].values()],
                        columns=list(PAIR_HEADERS.values()))
    return ["<h2>Where completions part</h2>",
            "<p>Per pair of providers: <i>k</i> counts the prompts whose completions are <b>identical</b>; the first "
            "difference is over the prompts that diverge.</p>", html_table(rows),
            image("first_divergence_cdf", "first divergence")]


def _consistency_html(summary: dict[str, Any], image: Image) -> list[str]:
    ranking = pd.DataFrame(summary["divergence_ranking"])
    ranking = ranking[[k for k in RANKING_HEADERS if k in ranking]].rename(columns=RANKING_HEADERS)
    return ["<h2>Self-consistency and divergence ranking</h2>", image("self_consistency", "self-consistency"),
            "<p>Divergence ranking, most divergent first: here <i>k</i> counts the prompts whose completion "
            "<b>differs</b> from the reference.</p>", html_table(ranking)]


def audit_finding(summary: dict[str, Any]) -> str:
    """The page's one-line finding in plain words, from the divergence ranking (most divergent provider first)."""
    ranking = summary.get("divergence_ranking") or []
    if not ranking:
        return f"no provider completions could be compared ({summary.get('requests', 0):,} requests)."
    said = []
    for r in ranking:
        where = (f", median first difference at token {r['median_first_divergence']:g} (of {r['k']:,} divergent "
                 f"prompts)" if r.get("median_first_divergence") is not None else "")
        said.append(f"{r['provider']} returns a different completion than {r['against']} for {r['k']:,} of {r['n']:,} "
                    f"prompts{where}")
    return "; ".join(said) + "."


def render_html(summary: dict[str, Any], charts: dict[str, Path], notes: list[dict[str, Any]] | None = None) -> str:
    """The audit's self-contained page (sections that fail become visible notes, listed near the top)."""
    notes = notes if notes is not None else []
    image = chart_embedder(charts, notes)
    sections: tuple[tuple[str, Callable[[], list[str]]], ...] = (
        ("requests", lambda: _settings_html(summary)), ("agreement matrix", lambda: _matrix_html(summary, image)),
        ("pairs", lambda: _pairs_html(summary, image)), ("self-consistency", lambda: _consistency_html(summary, image)))
    body: list[str] = []
    for name, build in sections:
        body += section(notes, name, build)
    stopped = [f"<p class='left-out'>⚠ the audit stopped: {html.escape(str(summary['aborted']))}</p>"] \
        if summary.get("aborted") else []
    data = audit_data(summary)
    kind = data_kinds.base_kind(data)
    what = ("REAL data: greedy, seeded completions each provider returned for the same prompts" if kind == "real" else
            f"{html.escape(data_kinds.data_tag(data)[1:-1])}: {html.escape(data_kinds.describe(data))}. Greedy, seeded "
            "completions each local stand-in returned for the same prompts")
    return html_page(f"kimi-eagle provider audit ({html.escape(data)})", [
        f"<h1>Provider audit: does each provider return what the model produces? — {html.escape(data)}</h1>",
        finding(html.escape(audit_finding(summary))),
        f"<p class='data {kind}'>{what}, reconstructed to token IDs and compared by bytes and IDs.</p>",
        *stopped,
        *left_out_section(notes, f"{len(notes):,} part(s) could not be drawn or rendered; the rest of the page stands "
                                 "without them."),
        *body,
    ], "audit")


def write_audit_report(summary: dict[str, Any], out_dir: str | Path) -> dict[str, Path]:
    """Write the audit's charts and ``report.html`` into ``out_dir`` (beside ``summary.json``); return the
    paths by name (the charts, and ``"report"``)."""
    out = Path(out_dir)
    notes: list[dict[str, Any]] = []
    charts = make_charts(summary, out, notes)
    page = render_html(summary, charts, notes)
    return {**charts, "report": write_text(out / "report.html", page)}
