"""Charts of drafter training and evaluation: training curves, τ per method, the ablation's arms.

Each chart is drawn on its own :class:`matplotlib.figure.Figure` (pyplot and its backend are never touched):
the function returns the figure (a notebook displays it) and, given ``path``, also writes it as a PNG
(atomically). Every chart carries its data tag (``data``: ``"real"`` for a Kimi target's generations, ``"toy"``
for stories260K and tiny-kimi, ``"simulated"``; see :func:`~kimi_eagle.apps.reports.toolkit.data_tag`); a chart told
no kind says ``[kind not recorded]``, never real (#46). The numbers come from the library: :func:`~kimi_eagle.eagle3.train.read_history` entries,
:func:`~kimi_eagle.eagle3.evaluate.tau_table` rows and :func:`~kimi_eagle.eagle3.ablation.run_ablation`'s table.
"""
from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from kimi_eagle.apps.reports.outputs import write_chart
from kimi_eagle.apps.reports.toolkit import data_tag
from kimi_eagle.data_kinds import meta_kind
from kimi_eagle.eagle3.train import read_history

LINE_STYLES = {"-": "solid", "--": "dashed", ":": "dotted", "-.": "dash-dot"}  # one per run, in turn
TRAIN_CURVES = "train_curves.png"  # the chart `kimi-eagle train` writes beside its log


def _saved(fig: Figure, path: str | Path | None) -> Figure:
    if path is not None:  # PNG, plus the --figure-format beside it, at --dpi when given
        write_chart(fig, path, dpi=110)
    return fig


# ------------------------------------------------------------------------------------------
# training


def position_label(drafter: str, k: int) -> str:
    """The name of the ``k``-th logged draft position: EAGLE-3's TTT step ``k``, DFlash's block slot ``k + 1`` (slot 0
    is the anchor, never trained)."""
    return f"block slot {k + 1}" if drafter == "dflash" else f"TTT step {k}"


def plot_history(history: Sequence[dict], path: str | Path | None = None, data: str | None = None,
                 drafter: str = "eagle3") -> Figure:
    """Loss and accuracy of every draft position (EAGLE-3: unroll step; DFlash: block slot) over one training run;
    also written to ``path`` (PNG, atomically) when given. Returns the figure."""
    steps = [h["step"] for h in history]
    fig = Figure(figsize=(10, 3.6))
    a1, a2 = fig.subplots(1, 2)
    for k in range(len(history[0]["acc"])):
        a1.plot(steps, [h["step_loss"][k] for h in history], label=position_label(drafter, k), alpha=0.8)
        a2.plot(steps, [h["acc"][k] for h in history], label=position_label(drafter, k), alpha=0.8)
    per = "block slot" if drafter == "dflash" else "unroll step"
    a1.set(title=f"cross-entropy per {per}", xlabel="optimizer step", ylabel="loss")
    a2.set(title="top-1 agreement with the target (draft vocab)", xlabel="optimizer step", ylabel="accuracy", ylim=(0, 1))
    a2.legend(fontsize=7)
    fig.suptitle(f"{data_tag(data)} drafter training", fontsize=10)
    fig.tight_layout()
    return _saved(fig, path)


def write_train_curves(train_dir: str | Path) -> Path | None:
    """:func:`plot_history` of ``train_dir/train_log.jsonl`` written to ``train_dir/train_curves.png``, tagged with
    the data kind ``train_metrics.json`` states (#46: a stories260K run is ``toy``, never "[REAL data]"; a folder
    whose ``train_metrics.json`` predates its ``data`` field, or has none, is ``[kind not recorded]``); returns the
    path, or None (nothing written) when the log is missing or empty."""
    train_dir = Path(train_dir)
    history = read_history(train_dir / "train_log.jsonl")
    if not history:
        return None
    metrics = train_dir / "train_metrics.json"
    saved = json.loads(metrics.read_text()) if metrics.exists() else {}
    saved = saved if isinstance(saved, dict) else {}
    drafter, data = saved.get("drafter") or "eagle3", meta_kind(saved)  # None: not recorded, never real
    plot_history(history, train_dir / TRAIN_CURVES, data=data, drafter=drafter).clear()  # standalone: nothing else holds it
    return train_dir / TRAIN_CURVES


def plot_histories(runs: Mapping[str, str | Path | Sequence[dict]], path: str | Path | None = None,
                   data: str | None = None, drafter: str = "eagle3") -> Figure:
    """Several training runs side by side: step-0 loss per run, and accuracy per unroll step (one colour
    per step, one line style per run, in the order of ``runs``). ``runs`` maps a name to a
    ``train_log.jsonl`` path or its :func:`~kimi_eagle.eagle3.train.read_history` entries. Also written to
    ``path`` (PNG, atomically) when given. Returns the figure (not registered with pyplot). The first run is
    drawn wide and translucent, later runs thin and opaque on top, so a dashed line stays visible where
    runs coincide."""
    fig = Figure(figsize=(11, 4.2))
    a_loss, a_acc = fig.subplots(1, 2)
    for i, (name, run) in enumerate(runs.items()):
        history = read_history(run) if isinstance(run, (str, Path)) else list(run)
        style = list(LINE_STYLES)[i % len(LINE_STYLES)]
        look = {"linewidth": 3.0, "alpha": 0.45, "zorder": 2} if i == 0 else {"linewidth": 1.3, "alpha": 1.0, "zorder": 3 + i}
        steps = [h["step"] for h in history]
        a_loss.plot(steps, [h["loss"] for h in history], style, label=name, **look)
        for k in range(len(history[0]["acc"]) if history else 0):
            a_acc.plot(steps, [h["acc"][k] for h in history], style, color=f"C{k}",
                       label=position_label(drafter, k) if i == 0 else None, **look)
    styles = ", ".join(f"{list(LINE_STYLES.values())[i % len(LINE_STYLES)]}: {name}" for i, name in enumerate(runs))
    a_loss.set(title="block-slot-1 cross-entropy" if drafter == "dflash" else "step-0 soft cross-entropy", xlabel="optimizer step")
    a_acc.set(xlabel="optimizer step", ylim=(0, 1))
    a_acc.set_title(f"agreement with the target\n({styles})", fontsize=10)
    a_loss.legend()
    a_acc.legend(fontsize=7, ncols=2)
    fig.suptitle(f"{data_tag(data)} drafter training", fontsize=10)
    fig.tight_layout()
    return _saved(fig, path)


# ------------------------------------------------------------------------------------------
# evaluation


def plot_tau(table: Mapping[str, Mapping[str, float]], modes: Sequence[str] = ("greedy", "t=1"), title: str = "",
             path: str | Path | None = None, intervals: Mapping[str, Mapping[str, tuple[float, float]]] | None = None,
             model: str = "", data: str | None = None) -> Figure:
    """Grouped bars of τ per decoding mode, one bar per row of a :func:`~kimi_eagle.eagle3.evaluate.tau_table`,
    with error bars from ``intervals`` (:func:`~kimi_eagle.eagle3.evaluate.tau_intervals`) where given;
    ``model`` (the target) is named in the title. Also written to ``path`` (PNG, atomically) when given.
    Returns the figure (not registered with pyplot)."""
    fig = Figure(figsize=(7.5, 3.9))
    ax = fig.subplots()
    width = 0.8 / max(1, len(table))
    for i, (label, row) in enumerate(table.items()):
        heights = [row[m] for m in modes]
        err = None
        if intervals and label in intervals:
            ci = [intervals[label].get(m) for m in modes]
            err = [[h - c[0] if c else 0.0 for h, c in zip(heights, ci)], [c[1] - h if c else 0.0 for h, c in zip(heights, ci)]]
        bars = ax.bar([j + width * i for j in range(len(modes))], heights, width=width, label=label, yerr=err,
                      capsize=3, error_kw={"ecolor": "#333", "elinewidth": 0.9})
        ax.bar_label(bars, fmt="%.2f", fontsize=8, padding=2, label_type="center", color="white")
    ax.set_xticks([j + width * (len(table) - 1) / 2 for j in range(len(modes))], list(modes))
    ax.axhline(1, color="#999", linewidth=0.8)
    ax.margins(y=0.12)
    heading = f"{data_tag(data)} {title or 'acceptance length τ'}"
    if model:
        heading = f"{heading} — target {model}"
    if intervals:
        heading += " (error bars: 95% interval over prompts)"
    ax.set_title("\n".join(textwrap.wrap(heading, 80)), fontsize=10)
    ax.set(xlabel="decoding", ylabel="acceptance length τ")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _saved(fig, path)


# ------------------------------------------------------------------------------------------
# the ablation


def plot_arms(table: Sequence[Mapping], title: str = "", path: str | Path | None = None,
              data: str | None = None) -> Figure:
    """τ per arm with its 95 % bootstrap interval, one panel per decoding mode; also written to ``path``.

    A standalone ``Figure`` (no pyplot state): display it, or it is simply garbage-collected."""
    modes = list(dict.fromkeys(r["mode"] for r in table))
    fig = Figure(figsize=(5.5 * len(modes), 3.8))
    axes = fig.subplots(1, len(modes), squeeze=False, sharex=True)  # one τ scale: panels compare at a glance
    for ax, mode in zip(axes[0], modes):
        rows = [r for r in table if r["mode"] == mode]
        y = np.arange(len(rows))[::-1]
        taus = np.array([r["tau"] for r in rows])
        err = np.array([[r["tau"] - r["lo"] for r in rows], [r["hi"] - r["tau"] for r in rows]])
        colors = ["#c0392b" if r.get("significant") else "C0" for r in rows]
        ax.errorbar(taus, y, xerr=err, fmt="none", ecolor="#555", capsize=3)
        ax.scatter(taus, y, c=colors, zorder=3)
        ax.set_yticks(y, [r["arm"] for r in rows], fontsize=8)
        ax.tick_params(axis="x", labelbottom=True)
        ax.set(xlabel="acceptance length τ (95% bootstrap interval)", title=f"{mode}")
    fig.suptitle(f"{data_tag(data)} {title or 'τ per arm (red: differs significantly from the reference)'}", fontsize=10)
    fig.tight_layout()
    return _saved(fig, path)


def plot_dose_response(table: Sequence[Mapping], reference_ids: str = "recon", title: str = "",
                       path: str | Path | None = None, data: str = "simulated") -> Figure:
    """τ against the injected re-segmentation rate (0 = the plain reconstructed-IDs arm), one line per
    decoding mode (and drafter, when the table holds EAGLE-3 and DFlash arms), with 95 % intervals; also written
    to ``path`` (a standalone ``Figure``). The rate is injected by the kit (``resegment.inject_rows``), so the
    chart is tagged ``simulated`` by default."""
    fig = Figure(figsize=(6, 3.6))
    ax = fig.subplots()
    doses: set[float] = set()
    drafters = list(dict.fromkeys(r.get("drafter", "eagle3") for r in table))
    lines = [(d, m) for d in drafters for m in dict.fromkeys(r["mode"] for r in table)]
    for i, (drafter, mode) in enumerate(lines):
        rows = sorted((r for r in table if r["mode"] == mode and r["ids"] == reference_ids and r["storage"] == "bf16"
                       and r.get("drafter", "eagle3") == drafter), key=lambda r: r["inject_rate"])
        if not rows:
            continue
        x = [100 * r["inject_rate"] for r in rows]
        doses.update(x)
        label = mode if len(drafters) == 1 else f"{DRAFTER_NAMES.get(drafter, drafter)} · {mode}"
        ax.errorbar(x, [r["tau"] for r in rows], yerr=[[r["tau"] - r["lo"] for r in rows], [r["hi"] - r["tau"] for r in rows]],
                    marker="o" if drafter == "eagle3" else "s", capsize=3, color=f"C{i}", label=label,
                    linestyle="-" if drafter == "eagle3" else "--")
    ax.set_xticks(sorted(doses), [f"{d:g}" for d in sorted(doses)])  # a linear axis, a tick at every dose given
    ax.set(xlabel="completion tokens re-segmented by injection (%)", ylabel="τ (95% bootstrap interval)",
           title=f"{data_tag(data)} {title or 'τ against injected tokenization drift'}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _saved(fig, path)


DRAFTER_NAMES = {"eagle3": "EAGLE-3", "dflash": "DFlash"}


def plot_rows_curve(curve: Sequence[Mapping], path: str | Path | None = None, data: str = "toy",
                    title: str = "") -> Figure:
    """τ and held-out next-token accuracy of each drafter against its training rows (``bench/drafters.py``'s
    ``curve.json`` ``curve`` entries), with their 95 % intervals; log-scaled rows. Also written to ``path`` when given."""
    fig = Figure(figsize=(10, 3.8))
    a_tau, a_acc = fig.subplots(1, 2)
    for i, drafter in enumerate(dict.fromkeys(r["drafter"] for r in curve)):
        rows = sorted((r for r in curve if r["drafter"] == drafter), key=lambda r: r["rows"])
        x = [r["rows"] for r in rows]
        for ax, key in ((a_tau, "tau"), (a_acc, "next_token_acc")):
            y = np.array([r[key] for r in rows])
            ci = np.array([r[f"{key}_ci95"] for r in rows])
            ax.errorbar(x, y, yerr=[y - ci[:, 0], ci[:, 1] - y], marker="o", capsize=3, color=f"C{i}",
                        label=DRAFTER_NAMES.get(drafter, drafter))
    a_tau.set(xscale="log", xlabel="training rows", ylabel="τ (greedy)", title="acceptance length on held-out prompts")
    a_acc.set(xscale="log", xlabel="training rows", ylabel="accuracy", ylim=(0, 1),
              title="held-out next-token agreement (teacher-forced)")
    a_tau.legend()
    fig.suptitle(f"{data_tag(data)} {title}".strip(), fontsize=10)
    fig.tight_layout()
    return _saved(fig, path)
