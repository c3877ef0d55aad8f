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
from typing import Mapping, Sequence

import numpy as np

from kimi_eagle.eagle3.extract import extract
from kimi_eagle.eagle3.hidden import Row, load_rows, load_target
from kimi_eagle.io import write_json, write_jsonl


@dataclass(frozen=True)
class Arm:
    """One training condition: which IDs (``engine`` or ``recon``), how the hidden states are provided
    (``bf16``, ``fp8`` shards or ``online``), the injected re-segmentation rate (recon only) and the drafter
    (``eagle3``, or ``dflash``: the block drafter of :mod:`kimi_eagle.eagle3.dflash`, on its own layer set)."""

    name: str
    ids: str = "engine"
    storage: str = "bf16"
    inject_rate: float = 0.0
    drafter: str = "eagle3"

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


def dflash_arms(arms: Sequence[Arm] = DEFAULT_ARMS) -> tuple[Arm, ...]:
    """The bf16 arms of ``arms`` again with the DFlash drafter (``"DFlash · <name>"``): the same rows, the
    drafter's own layer set, so both drafters' τ, ID effect and dose-response sit side by side."""
    return tuple(Arm(f"DFlash · {a.name}", a.ids, a.storage, a.inject_rate, "dflash") for a in arms
                 if a.storage == "bf16" and a.drafter == "eagle3")


BOTH_DRAFTERS: tuple[Arm, ...] = DEFAULT_ARMS + dflash_arms()


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
    """The options of :func:`run_ablation`: the training and evaluation settings every drafter shares
    (``seeds``: one drafter per seed and arm; ``k``, ``max_new_tokens``, ``temperatures``: evaluation;
    ``n_boot``: bootstrap resamples; ``inject_seed``: the re-segmentation injection), the ``arms``, the
    ``reference`` arm's name and ``progress`` (a bar over the drafters)."""

    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int = 120
    ttt_steps: int = 7
    batch_size: int = 8
    lr: float | None = None  # None: each drafter's recipe default (kimi_eagle.eagle3.recipes)
    draft_vocab_size: int = 256
    k: int = 4  # drafts per round (DFlash: at most block_size - 1)
    block_size: int | None = None  # DFlash arms: anchor + mask tokens per block (None: the recipe's)
    draft_layers: int | None = None  # DFlash arms: decoder layers (None: the recipe's)
    dflash_recipe: str = "kit"  # DFlash arms: kit | speculators | zlab (kimi_eagle.eagle3.recipes)
    max_new_tokens: int = 48
    temperatures: tuple[float, ...] = (0.0, 1.0)
    n_boot: int = 2000
    inject_seed: int = 0
    arms: tuple[Arm, ...] = DEFAULT_ARMS
    reference: str = REFERENCE
    progress: bool = False

    def record(self) -> dict:
        """The settings ``ablation.json`` records (arms and reference are recorded on their own)."""
        return {k: v for k, v in asdict(self).items() if k not in ("arms", "reference", "progress")}

    def train_config(self, data: str | Path, target_dir: str | Path, out: str | Path, seed: int, online: bool,
                     drafter: str = "eagle3"):
        """The :class:`~kimi_eagle.eagle3.train.TrainConfig` of one drafter (resumable, quiet)."""
        from kimi_eagle.eagle3.train import TrainConfig

        return TrainConfig(data=str(data), target=str(target_dir), out=str(out), steps=self.steps, ttt_steps=self.ttt_steps,
                           batch_size=self.batch_size, lr=self.lr, draft_vocab_size=self.draft_vocab_size, seed=seed,
                           log_every=max(1, self.steps // 20), save_every=max(1, self.steps // 2), resume=True,
                           progress=False, online=online, drafter=drafter, block_size=self.block_size,
                           draft_layers=self.draft_layers, dflash_recipe=self.dflash_recipe)

    def k_of(self, arm: Arm) -> int:
        """Drafts per round of ``arm``'s drafter: ``k``, for DFlash at most ``block_size - 1``."""
        from kimi_eagle.eagle3.recipes import recipe

        block = self.block_size or recipe("dflash", self.dflash_recipe).block_size
        return min(self.k, block - 1) if arm.drafter == "dflash" else self.k

    def reference_of(self, arm: Arm) -> str:
        """The arm ``arm`` is compared with: the reference arm's condition with ``arm``'s drafter."""
        ref = next(a for a in self.arms if a.name == self.reference)
        if arm.drafter == ref.drafter:
            return ref.name
        condition = (ref.ids, ref.storage, ref.inject_rate)
        for a in self.arms:
            if a.drafter == arm.drafter and (a.ids, a.storage, a.inject_rate) == condition:
                return a.name
        raise ValueError(f"no {arm.drafter} arm with the reference's condition ({self.reference}) to compare {arm.name!r} with")


def run_ablation(target_dir: str | Path, rows: Mapping[str, str | Path], eval_prompts: Sequence[tuple[str, list[int]]],
                 out: str | Path, settings: AblationSettings = AblationSettings()) -> dict:
    """Run every arm × seed of ``settings`` (resuming what is done) and return ``{"arms", "table", "data",
    "settings"}``.

    ``rows`` maps ``engine`` and ``recon`` to row files (what ``kimi-eagle extract`` reads);
    ``eval_prompts`` are ``(id, prompt_ids)`` held out from training. ``table`` has one entry per arm and
    decoding mode: ``arm, mode, tau, lo, hi, delta, delta_lo, delta_hi, significant, n_seeds, n_prompts``.
    Files: ``rows/``, ``hidden/<data>-<dtype>/``, ``train/<arm>/seed<s>/``, ``eval/<arm>/seed<s>.json``,
    ``ablation.json``.
    """
    s = settings
    run = _Experiment(target_dir, eval_prompts, Path(out), s)
    run.write_arm_rows(rows)
    run.extract_arm_hidden()
    per_arm: dict[str, dict[str, tuple[list, list]]] = {}
    jobs = [(arm, seed) for arm in s.arms for seed in s.seeds]
    bar = None
    if s.progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(jobs), desc="ablation", unit="drafter")
    for arm, seed in jobs:
        for mode, entry in run.train_and_evaluate(arm, seed)["methods"][arm.drafter].items():
            acc, rnd = per_arm.setdefault(arm.name, {}).setdefault(mode, ([], []))
            acc.append(entry["per_prompt_accepted"])
            rnd.append(entry["per_prompt_rounds"])
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    result = {"reference": s.reference, "arms": [asdict(a) for a in s.arms], "settings": s.record(), "data": run.data,
              "n_eval_prompts": len(eval_prompts), "table": _arm_table(per_arm, s), "reused": run.reused_summary(len(jobs))}
    write_json(Path(out) / "ablation.json", result, indent=1)
    return result


class _Experiment:
    """The files of one ablation under ``out`` and the target model every step shares."""

    def __init__(self, target_dir: str | Path, eval_prompts: Sequence[tuple[str, list[int]]], out: Path,
                 settings: AblationSettings):
        self.target_dir, self.eval_prompts, self.out, self.settings = target_dir, eval_prompts, out, settings
        self.model = load_target(target_dir)
        self.row_files: dict[str, Path] = {}  # data key -> training rows
        self.data: dict[str, dict] = {}  # data key -> facts about its rows (ablation.json's "data")
        self.hidden_dirs: dict[tuple[str, str, str], Path] = {}  # (data key, storage, drafter) -> stored hidden states
        self.kept = {"extraction rows": [0, 0], "training": 0, "evaluation": 0}  # what an earlier run had done

    def reused_summary(self, drafters: int) -> dict[str, str]:
        """What this run found done (:mod:`kimi_eagle.reuse`): extracted rows, resumed trainings, evaluations."""
        from kimi_eagle.reuse import note_count

        reused: dict[str, str] = {}
        note_count(reused, "extraction", *self.kept["extraction rows"])
        note_count(reused, "evaluation (drafters)", self.kept["evaluation"], drafters)
        note_count(reused, "training resumed (drafters)", self.kept["training"], drafters)
        return reused

    def write_arm_rows(self, rows: Mapping[str, str | Path]) -> None:
        """Each arm's training rows as ``out/rows/<data>.jsonl`` (re-segmentations injected where the arm asks)."""
        from kimi_eagle.eagle3.resegment import inject_rows
        from kimi_eagle.eagle3.row_space import target_id_map
        from kimi_eagle.tokenize.tokenizer import load_tokenizer

        base_rows = {name: load_rows(path)[0] for name, path in rows.items()}
        tok = None
        for arm in self.settings.arms:
            key = arm.data_key
            if key in self.row_files:
                continue
            these: list[Row] = base_rows[arm.ids]
            info: dict = {"rows": len(these), "completion_tokens": sum(sum(r.loss_mask) for r in these)}
            if arm.inject_rate:
                tok = tok or load_tokenizer(self.target_dir)
                id_map = target_id_map(self.target_dir)  # tiny-kimi: split only into Kimi IDs the model has rows for
                keep = (lambda i: i in id_map) if id_map is not None else None  # noqa: E731
                these, info = inject_rows(these, tok, arm.inject_rate, self.settings.inject_seed, keep=keep)
                info["rows"] = len(these)
            self.row_files[key] = self.out / "rows" / f"{_slug(key)}.jsonl"
            write_jsonl(self.row_files[key], [{"id": r.id, "input_ids": r.input_ids, "loss_mask": r.loss_mask} for r in these])
            self.data[key] = info

    def extract_arm_hidden(self) -> None:
        """The stored hidden states of every (data, storage, drafter) an arm reads (online arms store none; a
        drafter extracts its own layer set), under ``out/hidden/<data>-<dtype>[-dflash]/``; their bytes per token
        are added to :attr:`data` (EAGLE-3's layer set)."""
        for arm in self.settings.arms:
            if arm.storage == "online" or (arm.data_key, arm.storage, arm.drafter) in self.hidden_dirs:
                continue
            suffix = "" if arm.drafter == "eagle3" else f"-{arm.drafter}"
            hdir = self.out / "hidden" / f"{_slug(arm.data_key)}-{arm.storage}{suffix}"
            these, skipped = load_rows(self.row_files[arm.data_key], target=self.target_dir)  # a row-mapped target's rows
            m = extract(self.target_dir, these, hdir, dtype=arm.storage, skipped=skipped, model=self.model, drafter=arm.drafter)
            self.hidden_dirs[(arm.data_key, arm.storage, arm.drafter)] = hdir
            self.kept["extraction rows"][0] += m["reused_rows"]
            self.kept["extraction rows"][1] += m["n_rows"]
            if arm.drafter == "eagle3":
                self.data[arm.data_key][f"{arm.storage}_bytes_per_token"] = m["bytes_per_token"]
                self.data[arm.data_key][f"{arm.storage}_payload_bytes_per_token"] = m["payload_bytes_per_token"]

    def train_and_evaluate(self, arm: Arm, seed: int) -> dict:
        """One drafter of ``arm`` trained with ``seed`` (:func:`~kimi_eagle.eagle3.train.train_drafter`) and
        its evaluation report, kept in ``out/eval/<arm>/seed<s>.json``: a finished evaluation is read back."""
        from kimi_eagle.eagle3.evaluate import EvaluateOptions, evaluate_drafter
        from kimi_eagle.eagle3.train import train_drafter

        s, online = self.settings, arm.storage == "online"
        train_dir = self.out / "train" / _slug(arm.name) / f"seed{seed}"
        eval_path = self.out / "eval" / _slug(arm.name) / f"seed{seed}.json"
        if not eval_path.exists():
            train_data = self.row_files[arm.data_key] if online else self.hidden_dirs[(arm.data_key, arm.storage, arm.drafter)]
            trained = train_drafter(s.train_config(train_data, self.target_dir, train_dir, seed, online=online, drafter=arm.drafter))
            self.kept["training"] += trained["start"] != "fresh"
            options = EvaluateOptions(k=s.k_of(arm), max_new_tokens=s.max_new_tokens, temperatures=s.temperatures, seed=seed, ngram=False)
            report = evaluate_drafter(self.target_dir, train_dir / "drafter", self.eval_prompts, options, model=self.model)
            write_json(eval_path, report, indent=1)
        else:
            self.kept["evaluation"] += 1
        return json.loads(eval_path.read_text())


def _arm_table(per_arm: Mapping[str, Mapping[str, tuple[list, list]]], settings: AblationSettings) -> list[dict]:
    """One row per arm and decoding mode: its pooled τ with the bootstrap interval and, except for a reference
    arm, the paired difference to the reference arm of its drafter (:func:`bootstrap_tau`, :meth:`reference_of`)."""
    arrays = {a: {m: (np.array(v[0]), np.array(v[1])) for m, v in modes.items()} for a, modes in per_arm.items()}
    table = []
    for arm in settings.arms:
        for mode, (acc, rnd) in arrays[arm.name].items():
            reference = settings.reference_of(arm)
            ref = arrays[reference][mode] if arm.name != reference else None
            stats = bootstrap_tau(acc, rnd, ref, n_boot=settings.n_boot)
            table.append({"arm": arm.name, "mode": mode, **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in stats.items()},
                          "inject_rate": arm.inject_rate, "storage": arm.storage, "ids": arm.ids, "drafter": arm.drafter,
                          "reference": reference, "k": settings.k_of(arm),
                          "n_seeds": int(acc.shape[0]), "n_prompts": int(acc.shape[1])})
    return table


def first_significant_rate(table: Sequence[Mapping], mode: str, drafter: str = "eagle3") -> float | None:
    """The smallest injected rate whose τ loss against the reference is significant (interval below 0), for
    ``drafter``'s arms."""
    rates = sorted((r["inject_rate"], r) for r in table
                   if r["mode"] == mode and r["inject_rate"] > 0 and r.get("drafter", "eagle3") == drafter)
    return next((rate for rate, r in rates if r.get("significant") and r["delta_hi"] < 0), None)


def drafter_tables(table: Sequence[Mapping], modes: Sequence[str] = ("greedy", "t=1")) -> dict:
    """EAGLE-3 beside DFlash from a :func:`run_ablation` table holding both drafters' engine, recon and recon + dose
    arms: ``tau`` (engine IDs, 95 % interval, ratio to EAGLE-3's τ), ``engine_minus_recon`` (τ(engine IDs) −
    τ(recon IDs), paired 95 % interval: positive = reconstruction costs τ), ``dose`` (τ(recon + dose) − τ(engine
    IDs), paired) and ``first_significant_rate`` per drafter and mode (:func:`first_significant_rate`)."""
    rows = {(r.get("drafter", "eagle3"), r["ids"], r["inject_rate"], r["mode"]): r for r in table if r["storage"] == "bf16"}
    rates = sorted({r["inject_rate"] for r in table if r["inject_rate"] > 0})
    tau, ids_effect, dose = [], [], []
    for mode in modes:
        base = rows[("eagle3", "engine", 0.0, mode)]
        for drafter in ("eagle3", "dflash"):
            eng, rec = rows[(drafter, "engine", 0.0, mode)], rows[(drafter, "recon", 0.0, mode)]
            tau.append({"drafter": drafter, "mode": mode, "k": eng["k"], "tau": eng["tau"], "ci95": [eng["lo"], eng["hi"]],
                        "tau_over_eagle3": round(eng["tau"] / base["tau"], 4)})
            # the ablation's delta is recon − engine (paired); this table states engine − recon
            ids_effect.append({"drafter": drafter, "mode": mode, "engine_minus_recon": round(-rec["delta"], 4) + 0.0,
                               "ci95": [round(-rec["delta_hi"], 4) + 0.0, round(-rec["delta_lo"], 4) + 0.0], "significant": rec["significant"]})
            for rate in rates:
                r = rows[(drafter, "recon", rate, mode)]
                dose.append({"drafter": drafter, "mode": mode, "injected_rate": rate, "tau": r["tau"],
                             "dose_minus_engine": r["delta"] + 0.0, "ci95": [r["delta_lo"] + 0.0, r["delta_hi"] + 0.0], "significant": r["significant"]})
    first = {f"{d} {m}": first_significant_rate(table, m, d) for d in ("eagle3", "dflash") for m in modes}
    return {"tau": tau, "engine_minus_recon": ids_effect, "dose": dose, "first_significant_rate": first}
