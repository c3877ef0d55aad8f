"""``kimi-eagle report DIFF_DIR -o REPORT_DIR``: summary.json, review charts, and report.html.

Rates come with Wilson 95% intervals. When the diff carries expected labels (from
``kimi-eagle simulate``), the summary and the report include the confusion table and each class's
precision and recall.
"""
from __future__ import annotations

import argparse
import base64
import json
import math
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ..io import atomic_path, write_text
from .classify import LABELS, SUBCLASSES, VERDICTS
from .run import STATUSES, DiffResult, read_diff

Z95 = 1.959963984540054
VERDICT_COLORS = {"exact": "#388e3c", "bpe_split": "#1976d2", "semantic": "#d32f2f"}
CHARTS = ("mismatch_rate_by_dataset", "verdicts", "hunk_sizes", "token_delta", "first_divergence", "billing", "confusion")


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for ``k`` successes in ``n`` trials (``(0, 1)`` when ``n == 0``)."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


# --------------------------------------------------------------------------------------------
# numbers


def _ok(records: pd.DataFrame) -> pd.DataFrame:
    return records[records["status"] == "ok"]


def rates_by_dataset(records: pd.DataFrame) -> pd.DataFrame:
    """Per dataset (and ``all``): ok records, mismatches (not exact), semantic ones, rates and Wilson CIs."""
    ok = _ok(records).assign(dataset=lambda d: d["dataset"].fillna("(none)"))
    rows = []
    for name, group in [*ok.groupby("dataset", sort=True), ("all", ok)]:
        n = len(group)
        row: dict[str, Any] = {"dataset": name, "n": n}
        for what, mask in (("mismatch", group["verdict"] != "exact"), ("semantic", group["verdict"] == "semantic")):
            k = int(mask.sum())
            lo, hi = wilson(k, n)
            row.update({f"{what}": k, f"{what}_rate": k / n if n else None, f"{what}_lo": lo, f"{what}_hi": hi})
        rows.append(row)
    return pd.DataFrame(rows)


def confusion(records: pd.DataFrame) -> pd.DataFrame | None:
    """Expected (rows) against predicted label (columns) for records with an expected label."""
    if "expected" not in records or records["expected"].isna().all():
        return None
    lab = records[records["expected"].notna()]
    predicted = lab["label"].where(lab["status"] == "ok", "status:" + lab["status"].astype(str))
    classes = [c for c in LABELS if c in set(lab["expected"]) | set(predicted)]
    classes += sorted((set(lab["expected"]) | set(predicted)) - set(classes))
    return pd.crosstab(lab["expected"], predicted).reindex(index=classes, columns=classes, fill_value=0)


def precision_recall(table: pd.DataFrame) -> pd.DataFrame:
    """Per class: support, precision, recall (None where undefined)."""
    rows = []
    for c in table.index:
        tp = int(table.loc[c, c]) if c in table.columns else 0
        predicted = int(table[c].sum()) if c in table.columns else 0
        support = int(table.loc[c].sum())
        rows.append({"class": c, "support": support, "predicted": predicted,
                     "precision": tp / predicted if predicted else None, "recall": tp / support if support else None})
    return pd.DataFrame(rows)


def billing_summary(records: pd.DataFrame, hunks: pd.DataFrame) -> dict[str, Any]:
    """Aggregate billed vs reconstructed tokens, the part hunks explain (by hunk class) and the rest."""
    ok = _ok(records)
    billed = ok[ok["billed_completion_tokens"].notna()]
    out: dict[str, Any] = {
        "n_records_billed": len(billed),
        "billed_completion_tokens": int(billed["billed_completion_tokens"].sum()),
        "reconstructed_completion_tokens": int(billed["n_recon_tokens"].sum()),
        "delta": int(billed["billing_delta"].sum()),
        "explained_by_hunks": int(billed["billing_explained"].fillna(0).sum()),
        "unexplained": int(billed["billing_unexplained"].sum()),
        "n_records_unexplained": int((billed["billing_unexplained"] != 0).sum()),
    }
    in_billed = hunks[hunks["id"].isin(set(billed["id"]))]
    cls = in_billed["subclass"].fillna(in_billed["kind"])
    out["explained_by_class"] = {k: int(-v) for k, v in in_billed.groupby(cls)["token_delta"].sum().items()}
    r = ok[ok["billed_reasoning_tokens"].notna()]
    out["reasoning"] = {
        "n_records_billed": len(r),
        "billed_reasoning_tokens": int(r["billed_reasoning_tokens"].sum()),
        "reconstructed_reasoning_tokens": int(r["recon_reasoning_tokens"].sum()),
        "delta": int(r["reasoning_delta"].sum()),
        "explained_by_hunks": int(r["reasoning_explained"].fillna(0).sum()),
        "unexplained": int(r["reasoning_unexplained"].sum()),
    }
    return out


def summarize_diff(result: DiffResult) -> dict[str, Any]:
    """Everything ``summary.json`` holds."""
    rec, hunks = result.records, result.hunks
    ok = _ok(rec)
    summary: dict[str, Any] = {
        "n_records": len(rec),
        "status": {s: int((rec["status"] == s).sum()) for s in STATUSES},
        "errors": rec.loc[rec["status"] == "error", ["id", "error"]].head(20).to_dict("records"),
        "verdict": {v: int((ok["verdict"] == v).sum()) for v in VERDICTS},
        "label": {k: int(v) for k, v in ok["label"].value_counts().items()},
        "records_with_subclass": {c: int(ok["subclasses"].map(lambda s, c=c: c in list(s)).sum()) for c in SUBCLASSES},
        "n_hunks": len(hunks),
        "hunks_by_class": {k: int(v) for k, v in hunks["subclass"].fillna(hunks["kind"]).value_counts().items()},
        "hunks_by_segment": {k: int(v) for k, v in hunks["segment"].value_counts().items()},
        "rates": rates_by_dataset(rec).replace({np.nan: None}).to_dict("records"),
        "token_delta": {"sum": int(ok["token_delta"].sum()), "mean": float(ok["token_delta"].mean()) if len(ok) else None,
                        "min": int(ok["token_delta"].min()) if len(ok) else None,
                        "max": int(ok["token_delta"].max()) if len(ok) else None},
        "engine_canonical": {"true": int((ok["engine_canonical"] == True).sum()),  # noqa: E712
                             "false": int((ok["engine_canonical"] == False).sum())},  # noqa: E712
        "billing": billing_summary(rec, hunks),
    }
    table = confusion(rec)
    if table is not None:
        pr = precision_recall(table)
        summary["confusion"] = {"classes": list(table.index), "matrix": table.values.tolist()}
        summary["precision_recall"] = pr.replace({np.nan: None}).to_dict("records")
    return summary


# --------------------------------------------------------------------------------------------
# charts


def _save(fig, path: Path) -> Path:
    """Write ``fig`` as a PNG to ``path`` (atomically) and close it."""
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return path


def _no_data(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what}", ha="center", va="center", transform=ax.transAxes, color="#777")


def chart_rates(rates: pd.DataFrame, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(rates) + 2), 4.2))
    x = np.arange(len(rates))
    for off, what, color in ((-0.2, "mismatch", "#ff8f00"), (0.2, "semantic", "#d32f2f")):
        rate = rates[f"{what}_rate"].fillna(0).to_numpy(dtype=float)
        err = np.clip(np.array([rate - rates[f"{what}_lo"], rates[f"{what}_hi"] - rate], dtype=float), 0, None)
        bars = ax.bar(x + off, rate, 0.4, yerr=err, capsize=4, color=color,
                      label=f"{what} (not exact)" if what == "mismatch" else "semantic (bytes differ)")
        ax.bar_label(bars, labels=[f"{k}/{n}" for k, n in zip(rates[what], rates["n"])], padding=3, fontsize=8)
    ax.set_xticks(x, rates["dataset"])
    ax.set_ylim(0, 1.12)
    ax.set(title="Records whose reconstruction differs from the engine (Wilson 95% CI)", xlabel="dataset",
           ylabel="share of ok records")
    ax.legend(fontsize=8, loc="upper right")
    return _save(fig, path)


def chart_verdicts(records: pd.DataFrame, hunks: pd.DataFrame, path: Path) -> Path:
    ok = _ok(records)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    labels = [c for c in LABELS if (ok["label"] == c).any()]
    counts = [int((ok["label"] == c).sum()) for c in labels]
    colors = [VERDICT_COLORS["exact"] if c == "exact" else VERDICT_COLORS["bpe_split"] if c == "bpe_split"
              else VERDICT_COLORS["semantic"] for c in labels]
    if labels:
        bars = ax1.barh(labels[::-1], counts[::-1], color=colors[::-1])
        ax1.bar_label(bars, padding=3, fontsize=8)
        ax1.margins(x=0.15)
    else:
        _no_data(ax1, "ok records")
    ax1.set(title=f"Record labels ({len(ok):,} ok records)", xlabel="records", ylabel="label")
    cls = hunks["subclass"].fillna(hunks["kind"]).value_counts()
    if len(cls):
        bars = ax2.barh(list(cls.index[::-1]), list(cls.values[::-1]),
                        color=["#1976d2" if c == "split" else "#d32f2f" for c in cls.index[::-1]])
        ax2.bar_label(bars, padding=3, fontsize=8)
        ax2.margins(x=0.15)
    else:
        _no_data(ax2, "hunks")
    ax2.set(title=f"Hunks by class ({len(hunks):,} hunks)", xlabel="hunks", ylabel="split or semantic subclass")
    return _save(fig, path)


def chart_hunk_sizes(hunks: pd.DataFrame, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 4))
    if len(hunks):
        size = np.maximum(hunks["engine_tok_end"] - hunks["engine_tok_start"], hunks["recon_tok_end"] - hunks["recon_tok_start"])
        clipped = np.minimum(size, 30)
        for kind, color in (("split", "#1976d2"), ("semantic", "#d32f2f")):
            sel = clipped[hunks["kind"] == kind]
            if len(sel):
                counts, _, bars = ax.hist(sel, bins=np.arange(0.5, 31.5), color=color, alpha=0.75,
                                          label=f"{kind} ({len(sel):,})")
                ax.bar_label(bars, labels=[f"{int(c)}" if c else "" for c in counts], fontsize=7, padding=1)
        ax.legend(fontsize=8)
    else:
        _no_data(ax, "hunks")
    ax.set(title="Hunk size (tokens on the longer side; 30 = 30 or more)", xlabel="tokens", ylabel="hunks")
    return _save(fig, path)


def chart_token_delta(records: pd.DataFrame, path: Path) -> Path:
    ok = _ok(records)
    diff = ok[ok["verdict"] != "exact"]
    fig, ax = plt.subplots(figsize=(8, 4))
    if len(diff):
        d = diff["token_delta"].clip(-20, 20)
        counts, _, bars = ax.hist(d, bins=np.arange(-20.5, 21.5), color="#6a1b9a")
        ax.bar_label(bars, labels=[f"{int(c)}" if c else "" for c in counts], fontsize=7, padding=1)
    else:
        _no_data(ax, "differing records")
    ax.set(title=f"Token-count delta per differing record ({len(diff):,}; reconstructed − engine, clipped ±20)",
           xlabel="reconstructed tokens − engine tokens", ylabel="records")
    return _save(fig, path)


def chart_first_divergence(records: pd.DataFrame, path: Path) -> Path:
    ok = _ok(records)
    diff = ok[ok["first_divergence_frac"].notna()]
    fig, ax = plt.subplots(figsize=(8, 4))
    if len(diff):
        for verdict in ("bpe_split", "semantic"):
            sel = diff.loc[diff["verdict"] == verdict, "first_divergence_frac"]
            if len(sel):
                counts, _, bars = ax.hist(sel, bins=np.linspace(0, 1, 11), alpha=0.7, color=VERDICT_COLORS[verdict],
                                          label=f"{verdict} ({len(sel):,})")
                ax.bar_label(bars, labels=[f"{int(c)}" if c else "" for c in counts], fontsize=7, padding=1)
        ax.legend(fontsize=8)
    else:
        _no_data(ax, "differing records")
    ax.set(title="Where the first difference falls in the engine's completion", xlabel="first differing token / engine tokens",
           ylabel="records")
    return _save(fig, path)


def chart_billing(records: pd.DataFrame, path: Path) -> Path:
    ok = _ok(records)
    b = ok[ok["billed_completion_tokens"].notna()]
    fig, ax = plt.subplots(figsize=(6.5, 5.5))
    if len(b):
        for verdict, color in VERDICT_COLORS.items():
            sel = b[b["verdict"] == verdict]
            if len(sel):
                ax.scatter(sel["billed_completion_tokens"], sel["n_recon_tokens"], s=14, alpha=0.7, color=color,
                           label=f"{verdict} ({len(sel):,})")
        hi = float(max(b["billed_completion_tokens"].max(), b["n_recon_tokens"].max())) * 1.05
        ax.plot([0, hi], [0, hi], color="#555", linewidth=0.8, linestyle="--", label="billed = reconstructed")
        ax.legend(fontsize=8)
        n_off = int((b["billing_delta"] != 0).sum())
        ax.set_title(f"Billed vs reconstructed completion tokens\n({len(b):,} records, {n_off:,} off the diagonal, "
                     f"{int((b['billing_unexplained'] != 0).sum()):,} not explained by hunks)", fontsize=10)
    else:
        _no_data(ax, "billed records")
        ax.set_title("Billed vs reconstructed completion tokens")
    ax.set(xlabel="usage.completion_tokens (billed)", ylabel="reconstructed completion tokens")
    return _save(fig, path)


def chart_confusion(table: pd.DataFrame, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(0.75 * len(table.columns) + 3, 0.6 * len(table.index) + 2.5))
    values = table.to_numpy()
    ax.imshow(values > 0, cmap="Blues", vmin=0, vmax=1.6)
    for i in range(values.shape[0]):
        for j in range(values.shape[1]):
            if values[i, j]:
                ax.text(j, i, str(values[i, j]), ha="center", va="center", fontsize=9,
                        color="#b71c1c" if i != j else "#000")
    ax.set_xticks(range(len(table.columns)), table.columns, rotation=35, ha="right", fontsize=8)
    ax.set_yticks(range(len(table.index)), table.index, fontsize=8)
    ax.set(title=f"Confusion: injected effect's expected label vs diff label ({int(values.sum())} records)",
           xlabel="label from the diff", ylabel="expected label")
    return _save(fig, path)


def make_charts(result: DiffResult, out: Path) -> dict[str, Path]:
    rec, hunks = result.records, result.hunks
    charts = {
        "mismatch_rate_by_dataset": chart_rates(rates_by_dataset(rec), out / "mismatch_rate_by_dataset.png"),
        "verdicts": chart_verdicts(rec, hunks, out / "verdicts.png"),
        "hunk_sizes": chart_hunk_sizes(hunks, out / "hunk_sizes.png"),
        "token_delta": chart_token_delta(rec, out / "token_delta.png"),
        "first_divergence": chart_first_divergence(rec, out / "first_divergence.png"),
        "billing": chart_billing(rec, out / "billing.png"),
    }
    table = confusion(rec)
    if table is not None:
        charts["confusion"] = chart_confusion(table, out / "confusion.png")
    return charts


# --------------------------------------------------------------------------------------------
# HTML


def _table_html(df: pd.DataFrame, floats: str = "{:.3f}") -> str:
    return df.to_html(index=False, border=0, classes="t", na_rep="–",
                      float_format=lambda v: floats.format(v), escape=True)


def _hunk_examples(hunks: pd.DataFrame, per_class: int = 3) -> pd.DataFrame:
    if not len(hunks):
        return pd.DataFrame(columns=["id", "class", "segment", "engine bytes", "reconstructed bytes"])
    h = hunks.assign(**{"class": hunks["subclass"].fillna(hunks["kind"])})
    ex = h.groupby("class", sort=True).head(per_class)
    show = lambda b: repr(bytes(b))[2:-1][:80]  # noqa: E731
    return pd.DataFrame({"id": ex["id"], "class": ex["class"], "segment": ex["segment"],
                         "engine bytes": ex["engine_bytes"].map(show), "reconstructed bytes": ex["recon_bytes"].map(show)})


def render_html(summary: dict[str, Any], result: DiffResult, charts: dict[str, Path]) -> str:
    img = {k: base64.b64encode(Path(p).read_bytes()).decode() for k, p in charts.items()}
    rates = pd.DataFrame(summary["rates"])
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>kimi-eagle diff report</title><style>",
        "body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}table.t{border-collapse:collapse;font-size:13px}",
        "table.t td,table.t th{border:1px solid #ddd;padding:3px 8px;text-align:right}h2{margin-top:1.6em}",
        "img{max-width:100%;border:1px solid #eee}</style></head><body>",
        "<h1>Engine IDs vs reconstructed IDs</h1>",
        f"<p>{summary['n_records']:,} records: " + ", ".join(f"{v:,} {k}" for k, v in summary["status"].items()) + ".</p>",
        "<h2>Verdicts</h2>",
        _table_html(pd.DataFrame([summary["verdict"]])),
        f"<img alt='verdicts' src='data:image/png;base64,{img['verdicts']}'>",
        "<h2>Mismatch rate per dataset (Wilson 95% CI)</h2>",
        _table_html(rates),
        f"<img alt='mismatch rate' src='data:image/png;base64,{img['mismatch_rate_by_dataset']}'>",
    ]
    if "confusion" in summary:
        classes = summary["confusion"]["classes"]
        conf = pd.DataFrame(summary["confusion"]["matrix"], index=classes, columns=classes)
        conf.insert(0, "expected \\ diff", classes)
        parts += ["<h2>Labelled benchmark: confusion table</h2>", _table_html(conf),
                  _table_html(pd.DataFrame(summary["precision_recall"])),
                  f"<img alt='confusion' src='data:image/png;base64,{img['confusion']}'>"]
    bill = summary["billing"]
    parts += [
        "<h2>Billing reconciliation</h2>",
        _table_html(pd.DataFrame([{k: v for k, v in bill.items() if not isinstance(v, dict)}])),
        "<p>Explained by hunk class (engine − reconstructed tokens):</p>",
        _table_html(pd.DataFrame([bill["explained_by_class"]]) if bill["explained_by_class"] else pd.DataFrame([{"none": 0}])),
        "<p>Reasoning tokens:</p>", _table_html(pd.DataFrame([bill["reasoning"]])),
        f"<img alt='billing' src='data:image/png;base64,{img['billing']}'>",
        "<h2>Hunks</h2>",
        f"<img alt='hunk sizes' src='data:image/png;base64,{img['hunk_sizes']}'>",
        f"<img alt='token delta' src='data:image/png;base64,{img['token_delta']}'>",
        f"<img alt='first divergence' src='data:image/png;base64,{img['first_divergence']}'>",
        "<h3>Example hunks</h3>", _table_html(_hunk_examples(result.hunks)),
    ]
    if summary["errors"]:
        parts += ["<h2>Errors (first 20)</h2>", _table_html(pd.DataFrame(summary["errors"]))]
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(result: DiffResult, out_dir: str | Path) -> dict[str, Any]:
    """Write summary.json, the charts and report.html into ``out_dir``; return the summary."""
    out = Path(out_dir)
    summary = summarize_diff(result)
    charts = make_charts(result, out)
    summary["charts"] = {k: p.name for k, p in charts.items()}
    for name, text in (("summary.json", json.dumps(summary, indent=2, default=str)),
                       ("report.html", render_html(summary, result, charts))):
        write_text(out / name, text)
    return summary


# --------------------------------------------------------------------------------------------
# CLI


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("diff_dir", help="output directory of `kimi-eagle diff`")
    p.add_argument("-o", "--out", required=True, help="report directory (summary.json, *.png, report.html)")


def run(args: argparse.Namespace) -> int:
    summary = write_report(read_diff(args.diff_dir), args.out)
    v = summary["verdict"]
    print(f"{summary['n_records']} records; exact {v['exact']}, bpe_split {v['bpe_split']}, semantic {v['semantic']}; "
          f"{len(summary['charts'])} charts -> {Path(args.out) / 'report.html'}")
    return 0
