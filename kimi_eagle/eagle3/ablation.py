"""Drafter ablation: train drafters that differ in one factor, several seeds each, and compare τ with
bootstrap intervals.

Arms (:data:`DEFAULT_ARMS`): hidden-state storage (bf16 shards — the reference —, fp8 shards, online) on
the engine's IDs, and the training IDs (engine, reconstructed, reconstructed with non-canonical
re-segmentations injected into 1 %, 5 %, 20 % of completion tokens) with bf16 shards. Every arm trains one
drafter per seed with identical settings (the seed fixes the drafter's initial weights and the batch
order, so seed ``s`` of two arms differ only in the factor), and every drafter is evaluated on the same
held-out prompts, greedy and at temperature 1, with the KV-cached verifier.

Statistics (:func:`bootstrap_tau`): τ of an arm is pooled over its seeds and prompts (accepted drafts +
rounds over rounds). The 95 % interval resamples seeds and prompts with replacement (a two-way bootstrap,
numpy); the difference to the reference arm is computed on the same resampled seeds and prompts (paired:
seed ``s`` and prompt ``p`` of both arms), and is significant when its interval excludes 0.

Everything is written under ``out`` and a rerun resumes: finished extractions, trainings and evaluations
are kept.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

from kimi_eagle.eagle3.hidden import Row, extract, load_rows, load_target
from kimi_eagle.io import write_figure, write_json, write_jsonl

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@dataclass(frozen=True)
class Arm:
    """One training condition: which IDs (``engine`` or ``recon``), how the hidden states are provided
    (``bf16``, ``fp8`` shards or ``online``), and the injected re-segmentation rate (recon only)."""

    name: str
    ids: str = "engine"
    storage: str = "bf16"
    inject_rate: float = 0.0

    @property
    def data_key(self) -> str:
        """The training rows this arm reads."""
        return self.ids if not self.inject_rate else f"{self.ids}+split{self.inject_rate:g}"


REFERENCE = "engine IDs · bf16"
DEFAULT_ARMS: tuple[Arm, ...] = (
    Arm(REFERENCE),
    Arm("engine IDs · fp8", storage="fp8"),
    Arm("engine IDs · online", storage="online"),
    Arm("recon IDs · bf16", ids="recon"),
    Arm("recon + 1% splits", ids="recon", inject_rate=0.01),
    Arm("recon + 5% splits", ids="recon", inject_rate=0.05),
    Arm("recon + 20% splits", ids="recon", inject_rate=0.20),
)


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name).strip("-").replace("--", "-")


# ------------------------------------------------------------------------------------------
# statistics


def bootstrap_tau(accepted: np.ndarray, rounds: np.ndarray, reference: tuple[np.ndarray, np.ndarray] | None = None,
                  n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> dict:
    """τ = (Σ accepted + Σ rounds) / Σ rounds over ``[seeds, prompts]`` arrays, with a two-way bootstrap
    interval (seeds and prompts resampled with replacement). With ``reference`` (the same-shaped arrays of
    the reference arm) also the paired difference τ − τ_ref on the same resamples. Returns
    ``{tau, lo, hi}`` (+ ``delta, delta_lo, delta_hi, significant``)."""
    accepted, rounds = np.asarray(accepted, float), np.asarray(rounds, float)
    n_s, n_p = accepted.shape
    rng = np.random.default_rng(seed)
    si = rng.integers(0, n_s, size=(n_boot, n_s))
    pi = rng.integers(0, n_p, size=(n_boot, n_p))

    def tau_of(a: np.ndarray, r: np.ndarray) -> np.ndarray:
        # Σ over each resampled (seed, prompt) grid: [n_boot, n_s, n_p] gathers
        a_sum = a[si[:, :, None], pi[:, None, :]].sum(axis=(1, 2))
        r_sum = r[si[:, :, None], pi[:, None, :]].sum(axis=(1, 2))
        return (a_sum + r_sum) / np.maximum(r_sum, 1)

    alpha = (1 - level) / 2
    boot = tau_of(accepted, rounds)
    out = {"tau": float((accepted.sum() + rounds.sum()) / max(rounds.sum(), 1)),
           "lo": float(np.quantile(boot, alpha)), "hi": float(np.quantile(boot, 1 - alpha))}
    if reference is not None:
        ra, rr = np.asarray(reference[0], float), np.asarray(reference[1], float)
        diff = boot - tau_of(ra, rr)
        ref_tau = (ra.sum() + rr.sum()) / max(rr.sum(), 1)
        lo, hi = float(np.quantile(diff, alpha)), float(np.quantile(diff, 1 - alpha))
        out.update(delta=out["tau"] - float(ref_tau), delta_lo=lo, delta_hi=hi, significant=bool(lo > 0 or hi < 0))
    return out


# ------------------------------------------------------------------------------------------
# the experiment


@dataclass
class AblationSettings:
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int = 120
    ttt_steps: int = 7
    batch_size: int = 8
    lr: float = 3e-3
    draft_vocab_size: int = 256
    k: int = 4
    max_new_tokens: int = 48
    temperatures: tuple[float, ...] = (0.0, 1.0)
    n_boot: int = 2000
    inject_seed: int = 0


def run_ablation(target_dir: str | Path, rows: Mapping[str, str | Path], eval_prompts: Sequence[tuple[str, list[int]]],
                 out: str | Path, arms: Sequence[Arm] = DEFAULT_ARMS, settings: AblationSettings = AblationSettings(),
                 reference: str = REFERENCE, progress: bool = False) -> dict:
    """Run every arm × seed (resuming what is done) and return ``{"arms", "table", "data", "settings"}``.

    ``rows`` maps ``engine`` and ``recon`` to row files (what ``kimi-eagle extract`` reads);
    ``eval_prompts`` are ``(id, prompt_ids)`` held out from training. ``table`` has one entry per arm and
    decoding mode: ``arm, mode, tau, lo, hi, delta, delta_lo, delta_hi, significant, n_seeds, n_prompts``.
    Files: ``rows/``, ``hidden/<data>-<dtype>/``, ``train/<arm>/seed<s>/``, ``eval/<arm>/seed<s>.json``,
    ``ablation.json``.
    """
    from kimi_eagle.eagle3.evaluate import evaluate_drafter
    from kimi_eagle.eagle3.resegment import inject_rows
    from kimi_eagle.eagle3.train import TrainConfig, train_drafter
    from kimi_eagle.tokenize.tokenizer import HFTokenizer

    out = Path(out)
    model = load_target(target_dir)
    base_rows = {name: load_rows(path)[0] for name, path in rows.items()}
    data: dict[str, dict] = {}
    row_files: dict[str, Path] = {}
    tok = None
    for arm in arms:
        key = arm.data_key
        if key in row_files:
            continue
        these: list[Row] = base_rows[arm.ids]
        info: dict = {"rows": len(these), "completion_tokens": sum(sum(r.loss_mask) for r in these)}
        if arm.inject_rate:
            tok = tok or HFTokenizer.from_dir(target_dir)
            these, info = inject_rows(these, tok, arm.inject_rate, settings.inject_seed)
            info["rows"] = len(these)
        row_files[key] = out / "rows" / f"{_slug(key)}.jsonl"
        write_jsonl(row_files[key], [{"id": r.id, "input_ids": r.input_ids, "loss_mask": r.loss_mask} for r in these])
        data[key] = info
    hidden_dirs: dict[tuple[str, str], Path] = {}
    for arm in arms:
        if arm.storage == "online" or (arm.data_key, arm.storage) in hidden_dirs:
            continue
        hdir = out / "hidden" / f"{_slug(arm.data_key)}-{arm.storage}"
        these, skipped = load_rows(row_files[arm.data_key])
        m = extract(target_dir, these, hdir, dtype=arm.storage, skipped=skipped, model=model)
        data[arm.data_key][f"{arm.storage}_bytes_per_token"] = m["bytes_per_token"]
        data[arm.data_key][f"{arm.storage}_payload_bytes_per_token"] = m["payload_bytes_per_token"]
        hidden_dirs[(arm.data_key, arm.storage)] = hdir
    s = settings
    per_arm: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    jobs = [(arm, seed) for arm in arms for seed in s.seeds]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(jobs), desc="ablation", unit="drafter")
    for arm, seed in jobs:
        train_dir = out / "train" / _slug(arm.name) / f"seed{seed}"
        eval_path = out / "eval" / _slug(arm.name) / f"seed{seed}.json"
        if not eval_path.exists():
            cfg = TrainConfig(
                data=str(row_files[arm.data_key] if arm.storage == "online" else hidden_dirs[(arm.data_key, arm.storage)]),
                target=str(target_dir), out=str(train_dir), steps=s.steps, ttt_steps=s.ttt_steps, batch_size=s.batch_size,
                lr=s.lr, draft_vocab_size=s.draft_vocab_size, seed=seed, log_every=max(1, s.steps // 20),
                save_every=max(1, s.steps // 2), resume=True, progress=False, online=arm.storage == "online")
            train_drafter(cfg)
            report = evaluate_drafter(target_dir, train_dir / "drafter", eval_prompts, k=s.k, max_new_tokens=s.max_new_tokens,
                                      temperatures=s.temperatures, seed=seed, ngram=False, model=model)
            write_json(eval_path, report, indent=1)
        report = json.loads(eval_path.read_text())
        for mode, entry in report["methods"]["eagle3"].items():
            acc, rnd = per_arm.setdefault(arm.name, {}).setdefault(mode, ([], []))
            acc.append(entry["per_prompt_accepted"])
            rnd.append(entry["per_prompt_rounds"])
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    arrays = {a: {m: (np.array(v[0]), np.array(v[1])) for m, v in modes.items()} for a, modes in per_arm.items()}
    table = []
    for arm in arms:
        for mode, (acc, rnd) in arrays[arm.name].items():
            ref = arrays[reference][mode] if arm.name != reference else None
            stats = bootstrap_tau(acc, rnd, ref, n_boot=s.n_boot)
            table.append({"arm": arm.name, "mode": mode, **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in stats.items()},
                          "inject_rate": arm.inject_rate, "storage": arm.storage, "ids": arm.ids,
                          "n_seeds": int(acc.shape[0]), "n_prompts": int(acc.shape[1])})
    result = {"reference": reference, "arms": [asdict(a) for a in arms], "settings": asdict(s), "data": data,
              "n_eval_prompts": len(eval_prompts), "table": table}
    write_json(out / "ablation.json", result, indent=1)
    return result


def first_significant_rate(table: Sequence[Mapping], mode: str) -> float | None:
    """The smallest injected rate whose τ loss against the reference is significant (interval below 0)."""
    rates = sorted((r["inject_rate"], r) for r in table if r["mode"] == mode and r["inject_rate"] > 0)
    return next((rate for rate, r in rates if r.get("significant") and r["delta_hi"] < 0), None)


# ------------------------------------------------------------------------------------------
# charts


def plot_arms(table: Sequence[Mapping], title: str = "", path: str | Path | None = None) -> "Figure":
    """τ per arm with its 95 % bootstrap interval, one panel per decoding mode; also written to ``path``.

    A standalone ``Figure`` (no pyplot state): display it, or it is simply garbage-collected."""
    from matplotlib.figure import Figure

    modes = list(dict.fromkeys(r["mode"] for r in table))
    fig = Figure(figsize=(5.5 * len(modes), 3.8))
    axes = fig.subplots(1, len(modes), squeeze=False)
    for ax, mode in zip(axes[0], modes):
        rows = [r for r in table if r["mode"] == mode]
        y = np.arange(len(rows))[::-1]
        taus = np.array([r["tau"] for r in rows])
        err = np.array([[r["tau"] - r["lo"] for r in rows], [r["hi"] - r["tau"] for r in rows]])
        colors = ["#c0392b" if r.get("significant") else "C0" for r in rows]
        ax.errorbar(taus, y, xerr=err, fmt="none", ecolor="#555", capsize=3)
        ax.scatter(taus, y, c=colors, zorder=3)
        ax.set_yticks(y, [r["arm"] for r in rows], fontsize=8)
        ax.set(xlabel="acceptance length τ (95% bootstrap interval)", title=f"{mode}")
    fig.suptitle(title or "τ per arm (red: differs significantly from the reference)", fontsize=10)
    fig.tight_layout()
    return _saved(fig, path)


def plot_dose_response(table: Sequence[Mapping], reference_ids: str = "recon", title: str = "",
                       path: str | Path | None = None) -> "Figure":
    """τ against the injected re-segmentation rate (0 = the plain reconstructed-IDs arm), one line per
    decoding mode, with 95 % intervals; also written to ``path`` (a standalone ``Figure``)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.6))
    ax = fig.subplots()
    for i, mode in enumerate(dict.fromkeys(r["mode"] for r in table)):
        rows = sorted((r for r in table if r["mode"] == mode and r["ids"] == reference_ids and r["storage"] == "bf16"),
                      key=lambda r: r["inject_rate"])
        x = [100 * r["inject_rate"] for r in rows]
        ax.errorbar(x, [r["tau"] for r in rows], yerr=[[r["tau"] - r["lo"] for r in rows], [r["hi"] - r["tau"] for r in rows]],
                    marker="o", capsize=3, color=f"C{i}", label=mode)
    ax.set_xscale("symlog", linthresh=1)
    ax.set(xlabel="completion tokens re-segmented (%)", ylabel="τ (95% bootstrap interval)",
           title=title or "τ against injected tokenization drift")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _saved(fig, path)


def _saved(fig: "Figure", path: str | Path | None) -> "Figure":
    if path is not None:
        write_figure(fig, path, dpi=110)
    return fig
