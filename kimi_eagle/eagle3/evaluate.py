"""``kimi-eagle evaluate --target DIR --draft DIR --prompts FILE [--k 4]``: measured acceptance length.

Runs real speculative decoding (:mod:`kimi_eagle.eagle3.speculative`) on CPU for every prompt, greedy and
sampled, with the EAGLE-3 drafter and with the prompt-lookup n-gram baseline on the same prompts.
τ = (accepted drafts + 1) per verification round, pooled over prompts (total tokens / total rounds).
Greedy outputs are also checked token for token against target-only greedy decoding.

Prompts: ``.jsonl`` lines with ``prompt`` (text; encoded as ``[BOS] + encode(text)``, the ``plain``
format) or ``prompt_ids``; or a text file with one prompt per line. A target with a ``kimi_ids.json`` row
map (tiny-kimi) speaks Kimi-K2.5: ``prompt_ids`` are Kimi IDs, ``messages`` (+ ``tools``) lines — e.g. the
``prompts.jsonl`` of ``kimi-eagle tiny-kimi --collect`` — and text prompts (one user message) are rendered
in K2.5 with the generation prompt, and every prompt is mapped to the model's rows
(:mod:`kimi_eagle.eagle3.row_space`); decoding, τ and the greedy check then run in rows.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

import torch

from kimi_eagle.eagle3.hidden import load_target
from kimi_eagle.eagle3.model import load_drafter
from kimi_eagle.eagle3.row_space import id_space, model_ids, target_id_map
from kimi_eagle.eagle3.speculative import (
    CachedTarget,
    EagleProposer,
    NgramProposer,
    Target,
    generate_target_only,
    speculative_generate,
)
from kimi_eagle.io import read_jsonl, write_figure
from kimi_eagle.tokenize.tokenizer import HFTokenizer

if TYPE_CHECKING:
    from matplotlib.figure import Figure

METHOD_LABELS = {"eagle3": "EAGLE-3", "ngram": "n-gram (prompt lookup)"}


def load_prompts(path: str | Path, target_dir: str | Path) -> list[tuple[str, list[int]]]:
    """``[(id, prompt_ids)]``; a bad line raises ValueError naming it. A directory of hidden states (any
    layout: kit, speculators, SpecForge) gives each row's ids before its first supervised token. For a
    target with a row map the IDs are its rows (see the module docstring)."""
    path = Path(path)
    if path.is_dir():  # hidden states already hold the target's input IDs (rows for a row-mapped target)
        from kimi_eagle.eagle3.layouts import prompts_from_hidden

        return prompts_from_hidden(path, target_dir)
    id_map = target_id_map(target_dir)
    if id_map is not None:
        return _kimi_prompts(path, target_dir, id_map)
    tok = HFTokenizer.from_dir(target_dir)
    bos = _bos_id(target_dir)
    encode = lambda text: ([bos] if bos is not None else []) + tok.encode(text)  # noqa: E731
    prompts = []
    if path.suffix == ".jsonl":
        for line in read_jsonl(path):
            if line.error or not isinstance(line.obj, dict):
                raise ValueError(f"{path}: {line.error or f'line {line.lineno}: not an object'}")
            obj = line.obj
            pid = str(obj.get("id", line.lineno))
            if "prompt_ids" in obj:
                prompts.append((pid, [int(i) for i in obj["prompt_ids"]]))
            elif isinstance(obj.get("prompt", obj.get("text")), str):
                prompts.append((pid, encode(obj.get("prompt", obj.get("text")))))
            else:
                raise ValueError(f"{path}: line {line.lineno}: needs prompt or prompt_ids")
    else:
        for n, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if text.strip():
                prompts.append((str(n), encode(text)))
    return prompts


def _kimi_prompts(path: Path, target_dir: str | Path, id_map) -> list[tuple[str, list[int]]]:
    """``load_prompts`` for a row-mapped (Kimi-ID) target: K2.5-rendered prompts as the model's rows."""
    from kimi_eagle.engine.kimi_format import KimiPromptError, KimiPromptRenderer
    from kimi_eagle.tokenize.tokenizer import load_tokenizer

    renderer = KimiPromptRenderer(load_tokenizer(target_dir))
    lines: list[tuple[str, str, dict]] = []  # (id, where, line object)
    if path.suffix == ".jsonl":
        for line in read_jsonl(path):
            if line.error or not isinstance(line.obj, dict):
                raise ValueError(f"{path}: {line.error or f'line {line.lineno}: not an object'}")
            lines.append((str(line.obj.get("id", line.lineno)), f"line {line.lineno}", line.obj))
    else:
        for n, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if text.strip():
                lines.append((str(n), f"line {n}", {"prompt": text}))
    prompts = []
    for pid, where, obj in lines:
        text = obj.get("prompt", obj.get("text"))
        try:
            if "prompt_ids" in obj:
                kimi_ids = [int(i) for i in obj["prompt_ids"]]
            elif "messages" in obj:
                kimi_ids = renderer.prompt_ids(obj["messages"], obj.get("tools"))
            elif isinstance(text, str):
                kimi_ids = renderer.prompt_ids([{"role": "user", "content": text}])
            else:
                raise ValueError("needs prompt_ids, messages or prompt")
            prompts.append((pid, model_ids(kimi_ids, id_map)))
        except (KimiPromptError, ValueError, TypeError) as e:
            raise ValueError(f"{path}: {where}: {e}") from None
    return prompts


def _bos_id(target_dir: str | Path) -> int | None:
    cfg = json.loads((Path(target_dir) / "config.json").read_text())
    return cfg.get("bos_token_id")


def _eos_id(model) -> int | None:
    eos = model.config.eos_token_id
    return eos[0] if isinstance(eos, (list, tuple)) else eos


def evaluate_drafter(target_dir: str | Path, draft_dir: str | Path | None, prompts: Sequence[tuple[str, list[int]]], *,
                     k: int = 4, max_new_tokens: int = 64, temperatures: Sequence[float] = (0.0, 1.0), seed: int = 0,
                     ngram: bool = True, model=None, drafter=None, cached: bool = True,
                     cached_drafter: bool | None = None) -> dict:
    """Acceptance length of each method at each temperature; returns a JSON-able report.

    ``report["methods"][method][mode]`` holds ``tau``, ``rounds``, ``accepted``, ``tokens``, timings
    and per-prompt τ; ``mode`` is ``greedy`` (temperature 0, plus ``identical_to_target_greedy``) or
    ``t=<temperature>``. Methods: ``eagle3`` (when a drafter is given) and ``ngram``. ``cached``: verify
    against a KV-cached target (default) or re-run the whole sequence each round (the reference);
    ``cached_drafter`` (default: as ``cached``): keep the drafter's step-0 keys/values between rounds.
    """
    model = model if model is not None else load_target(target_dir)
    eos = _eos_id(model)
    proposers = []
    verifier = CachedTarget if cached else Target
    if drafter is None and draft_dir is not None:
        drafter = load_drafter(draft_dir, target_dir)
    if drafter is not None:
        drafter.eval()
        cached_drafter = cached if cached_drafter is None else cached_drafter
        proposers.append((EagleProposer(drafter, cached=cached_drafter), verifier(model, drafter.config.aux_layer_ids)))
    if ngram:
        proposers.append((NgramProposer(model.config.vocab_size), verifier(model)))
    references = {pid: generate_target_only(model, ids, max_new_tokens, 0.0, eos) for pid, ids in prompts} if 0.0 in temperatures else {}
    report: dict = {"k": k, "max_new_tokens": max_new_tokens, "n_prompts": len(prompts), "kv_cache": cached,
                    "drafter_kv_cache": bool(drafter is not None and cached_drafter),
                    "token_ids": id_space(target_id_map(target_dir)), "methods": {}}
    for proposer, target in proposers:
        per_method = {}
        for temperature in temperatures:
            g = torch.Generator().manual_seed(seed)
            accepted = rounds = tokens = identical = 0
            taus, seconds, per_accepted, per_rounds = [], 0.0, [], []
            for pid, ids in prompts:
                r = speculative_generate(target, proposer, ids, max_new_tokens, k, temperature, eos, g)
                accepted += sum(r.accepted)
                rounds += r.rounds
                tokens += len(r.tokens)
                seconds += r.seconds
                taus.append(r.tau)
                per_accepted.append(sum(r.accepted))
                per_rounds.append(r.rounds)
                if temperature == 0.0:
                    identical += r.tokens == references[pid]
            entry = {"tau": round((accepted + rounds) / rounds, 4) if rounds else None, "rounds": rounds,
                     "accepted": accepted, "tokens": tokens, "seconds": round(seconds, 3),
                     "tokens_per_s": round(tokens / seconds, 1) if seconds else None,
                     "per_prompt_tau": [round(t, 3) for t in taus], "per_prompt_accepted": per_accepted,
                     "per_prompt_rounds": per_rounds}
            if temperature == 0.0:
                entry["identical_to_target_greedy"] = f"{identical}/{len(prompts)}"
            per_method["greedy" if temperature == 0.0 else f"t={temperature:g}"] = entry
        report["methods"][proposer.name] = per_method
        target.close()
    return report


def tau_table(reports: Mapping[str, dict]) -> dict[str, dict]:
    """τ of every method of every report, by decoding mode: ``{label: {mode: tau, ..., "greedy identical": "n/m"}}``.

    ``reports`` maps a name to an :func:`evaluate_drafter` report. EAGLE-3 rows are labelled
    ``EAGLE-3 (<name>)``; the n-gram baseline, which does not depend on the drafter, is one row
    ``n-gram (prompt lookup)`` (the last report holding it wins). Rows keep the reports' order.
    """
    table: dict[str, dict] = {}
    for name, report in reports.items():
        for method, per_mode in report["methods"].items():
            label = f"{METHOD_LABELS['eagle3']} ({name})" if method == "eagle3" else METHOD_LABELS.get(method, method)
            row = {mode: entry["tau"] for mode, entry in per_mode.items()}
            if "greedy" in per_mode:
                row["greedy identical"] = per_mode["greedy"]["identical_to_target_greedy"]
            table[label] = row
    return table


def tau_intervals(reports: Mapping[str, dict], z: float = 1.96) -> dict[str, dict[str, tuple[float, float]]]:
    """95% intervals for the τ of :func:`tau_table`, keyed like it: ``{label: {mode: (lo, hi)}}``.

    Centred on the pooled τ, half-width ``z`` standard errors of the per-prompt τ (``per_prompt_tau``);
    modes with fewer than two prompts get no interval."""
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for name, report in reports.items():
        for method, per_mode in report["methods"].items():
            label = f"{METHOD_LABELS['eagle3']} ({name})" if method == "eagle3" else METHOD_LABELS.get(method, method)
            row = {}
            for mode, entry in per_mode.items():
                per = [float(t) for t in entry.get("per_prompt_tau") or []]
                if len(per) >= 2 and entry.get("tau") is not None:
                    mean = sum(per) / len(per)
                    se = (sum((t - mean) ** 2 for t in per) / (len(per) - 1) / len(per)) ** 0.5
                    row[mode] = (max(1.0, entry["tau"] - z * se), entry["tau"] + z * se)
            out[label] = row
    return out


def plot_tau(table: Mapping[str, Mapping[str, float]], modes: Sequence[str] = ("greedy", "t=1"), title: str = "",
             path: str | Path | None = None, intervals: Mapping[str, Mapping[str, tuple[float, float]]] | None = None,
             model: str = "") -> "Figure":
    """Grouped bars of τ per decoding mode, one bar per row of a :func:`tau_table`, with error bars from
    ``intervals`` (:func:`tau_intervals`) where given; ``model`` (the target) is named in the title. Also
    written to ``path`` (PNG, atomically) when given. Returns the figure (not registered with pyplot)."""
    from matplotlib.figure import Figure

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
    heading = title or "acceptance length τ"
    if model:
        heading = f"{heading} — target {model}"
    if intervals:
        heading += " (error bars: 95% interval over prompts)"
    import textwrap

    ax.set_title("\n".join(textwrap.wrap(heading, 80)), fontsize=10)
    ax.set(xlabel="decoding", ylabel="acceptance length τ")
    ax.legend(fontsize=8)
    fig.tight_layout()
    if path is not None:
        write_figure(fig, path, dpi=110)
    return fig
