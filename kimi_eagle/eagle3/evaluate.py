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

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import torch

from kimi_eagle.eagle3.dflash import DFlashDrafter, DFlashProposer
from kimi_eagle.eagle3.drafter_base import read_config_json
from kimi_eagle.eagle3.drafters import load_any_drafter
from kimi_eagle.eagle3.hidden import check_prompts, load_target, token_ids
from kimi_eagle.eagle3.row_space import id_space, model_ids, target_id_map
from kimi_eagle.eagle3.speculative import (
    CachedTarget,
    DecodeOptions,
    EagleProposer,
    NgramProposer,
    Proposer,
    Target,
    generate_target_only,
    speculative_generate,
)
from kimi_eagle.io import read_jsonl
from kimi_eagle.tokenize.tokenizer import HFTokenizer

METHOD_LABELS = {"eagle3": "EAGLE-3", "dflash": "DFlash", "ngram": "n-gram (prompt lookup)"}
DRAFTER_METHODS = ("eagle3", "dflash")  # labelled per report: "EAGLE-3 (<name>)", "DFlash (<name>)"


def load_prompts(path: str | Path, target_dir: str | Path) -> list[tuple[str, list[int]]]:
    """``[(id, prompt_ids)]``; a bad line raises ValueError naming it. A directory of hidden states (any
    layout: kit, speculators, SpecForge) gives each row's ids before its first supervised token. For a
    target with a row map the IDs are its rows (see the module docstring)."""
    path = Path(path)
    if path.is_dir():  # hidden states already hold the target's input IDs (rows for a row-mapped target)
        from kimi_eagle.eagle3.readers import prompts_from_hidden

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
                try:
                    prompts.append((pid, token_ids(obj["prompt_ids"], "prompt_ids")))
                except ValueError as e:
                    raise ValueError(f"{path}: line {line.lineno}: {e}") from None
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
                kimi_ids = token_ids(obj["prompt_ids"], "prompt_ids")
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
    cfg = read_config_json(Path(target_dir) / "config.json", "target config")
    return cfg.get("bos_token_id")


def _eos_id(model) -> int | None:
    eos = model.config.eos_token_id
    return eos[0] if isinstance(eos, (list, tuple)) else eos


@dataclass(frozen=True)
class EvaluateOptions:
    """How :func:`evaluate_drafter` measures: ``k`` drafts per round, at most ``max_new_tokens`` per prompt,
    each of ``temperatures`` (0 = greedy) with a generator seeded with ``seed``; ``ngram``: also the
    prompt-lookup baseline. ``cached``: verify against a KV-cached target (default) or re-run the whole
    sequence each round (the reference); ``cached_drafter`` (default: as ``cached``): keep the drafter's
    step-0 keys/values between rounds."""

    k: int = 4
    max_new_tokens: int = 64
    temperatures: Sequence[float] = (0.0, 1.0)
    seed: int = 0
    ngram: bool = True
    cached: bool = True
    cached_drafter: bool | None = None

    @property
    def drafter_cached(self) -> bool:
        return self.cached if self.cached_drafter is None else self.cached_drafter


def check_context(prompts: Sequence[tuple[str, list[int]]], n_positions: int | None, max_new_tokens: int) -> None:
    """Every prompt plus ``max_new_tokens`` fits the target's ``n_positions`` (its ``max_position_embeddings``);
    ValueError naming the first that does not, before any forward pass allocates for it (a prompt past the
    context would run the target outside what it was trained on, at a cost quadratic in its length)."""
    if not n_positions:
        return
    for pid, ids in prompts:
        if len(ids) + max_new_tokens > n_positions:
            raise ValueError(f"prompt {str(pid)[:60]!r}: {len(ids)} tokens + --max-new-tokens {max_new_tokens} exceed the "
                             f"target's context of {n_positions} positions; shorten the prompt or lower --max-new-tokens")


def evaluate_drafter(target_dir: str | Path, draft_dir: str | Path | None, prompts: Sequence[tuple[str, list[int]]],
                     options: EvaluateOptions = EvaluateOptions(), *, model=None, drafter=None) -> dict:
    """Acceptance length of each method at each temperature; returns a JSON-able report.

    ``report["methods"][method][mode]`` holds ``tau``, ``rounds``, ``accepted``, ``tokens``, timings
    and per-prompt τ; ``mode`` is ``greedy`` (temperature 0, plus ``identical_to_target_greedy``) or
    ``t=<temperature>``. Methods: ``eagle3`` or ``dflash`` (when a drafter is given: ``drafter``, or loaded from
    ``draft_dir``; a DFlash drafter drafts ``min(k, block_size - 1)`` tokens per round) and ``ngram`` (``options.ngram``). ``model``: the loaded target (default: loaded here).
    """
    model = model if model is not None else load_target(target_dir)
    check_prompts(prompts, int(model.config.vocab_size))  # an out-of-vocabulary ID is a message, not an IndexError
    check_context(prompts, getattr(model.config, "max_position_embeddings", None), options.max_new_tokens)
    eos = _eos_id(model)
    if drafter is None and draft_dir is not None:
        drafter = load_any_drafter(draft_dir, target_dir)  # EAGLE-3 (any format) or DFlash
    if drafter is not None:
        drafter.eval()
    references = ({pid: generate_target_only(model, ids, options.max_new_tokens, 0.0, eos) for pid, ids in prompts}
                  if 0.0 in options.temperatures else {})
    report: dict = {"k": options.k, "max_new_tokens": options.max_new_tokens, "n_prompts": len(prompts),
                    "kv_cache": options.cached, "drafter_kv_cache": bool(drafter is not None and options.drafter_cached),
                    "token_ids": id_space(target_id_map(target_dir)), "methods": {}}
    for proposer, target in _proposers(model, drafter, options):
        report["methods"][proposer.name] = {
            _mode(t): _measure(target, proposer, prompts, DecodeOptions(options.max_new_tokens, options.k, t, eos),
                               options.seed, references)
            for t in options.temperatures}
        target.close()
    return report


def _proposers(model, drafter, options: EvaluateOptions) -> list[tuple[Proposer, Target | CachedTarget]]:
    """Each method's proposer with its own verifier (the EAGLE-3 one records the drafter's aux layers)."""
    verifier = CachedTarget if options.cached else Target
    proposers: list[tuple[Proposer, Target | CachedTarget]] = []
    if drafter is not None:
        proposers.append((drafter_proposer(drafter, options.drafter_cached), verifier(model, drafter.config.aux_layer_ids)))
    if options.ngram:
        proposers.append((NgramProposer(model.config.vocab_size), verifier(model)))
    return proposers


def drafter_proposer(drafter, cached: bool = True) -> Proposer:
    """The proposer of a loaded drafter: :class:`EagleProposer` (method ``eagle3``) or, for a DFlash block drafter,
    :class:`~kimi_eagle.eagle3.dflash.DFlashProposer` (method ``dflash``)."""
    return DFlashProposer(drafter, cached=cached) if isinstance(drafter, DFlashDrafter) else EagleProposer(drafter, cached=cached)


def _label(method: str, name: str) -> str:
    return f"{METHOD_LABELS[method]} ({name})" if method in DRAFTER_METHODS else METHOD_LABELS.get(method, method)


def _mode(temperature: float) -> str:
    return "greedy" if temperature == 0.0 else f"t={temperature:g}"


def _measure(target: Target | CachedTarget, proposer: Proposer, prompts: Sequence[tuple[str, list[int]]],
             decode: DecodeOptions, seed: int, references: Mapping[str, list[int]]) -> dict:
    """One method at one temperature over every prompt (one generator seeded with ``seed``): the report entry."""
    g = torch.Generator().manual_seed(seed)
    results = [(pid, speculative_generate(target, proposer, ids, decode, g)) for pid, ids in prompts]
    accepted = sum(sum(r.accepted) for _, r in results)
    rounds = sum(r.rounds for _, r in results)
    tokens = sum(len(r.tokens) for _, r in results)
    seconds = sum(r.seconds for _, r in results)
    entry = {"tau": round((accepted + rounds) / rounds, 4) if rounds else None, "rounds": rounds,
             "accepted": accepted, "tokens": tokens, "seconds": round(seconds, 3),
             "tokens_per_s": round(tokens / seconds, 1) if seconds else None,
             "per_prompt_tau": [round(r.tau, 3) for _, r in results],
             "per_prompt_accepted": [sum(r.accepted) for _, r in results],
             "per_prompt_rounds": [r.rounds for _, r in results]}
    if decode.temperature == 0.0:
        identical = sum(r.tokens == references[pid] for pid, r in results)
        entry["identical_to_target_greedy"] = f"{identical}/{len(prompts)}"
    return entry


def tau_table(reports: Mapping[str, dict]) -> dict[str, dict]:
    """τ of every method of every report, by decoding mode: ``{label: {mode: tau, ..., "greedy identical": "n/m"}}``.

    ``reports`` maps a name to an :func:`evaluate_drafter` report. Drafter rows are labelled
    ``EAGLE-3 (<name>)`` or ``DFlash (<name>)``; the n-gram baseline, which does not depend on the drafter, is one row
    ``n-gram (prompt lookup)`` (the last report holding it wins). Rows keep the reports' order.
    """
    table: dict[str, dict] = {}
    for name, report in reports.items():
        for method, per_mode in report["methods"].items():
            label = _label(method, name)
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
            label = _label(method, name)
            row = {}
            for mode, entry in per_mode.items():
                per = [float(t) for t in entry.get("per_prompt_tau") or []]
                if len(per) >= 2 and entry.get("tau") is not None:
                    mean = sum(per) / len(per)
                    se = (sum((t - mean) ** 2 for t in per) / (len(per) - 1) / len(per)) ** 0.5
                    row[mode] = (max(1.0, entry["tau"] - z * se), entry["tau"] + z * se)
            out[label] = row
    return out
