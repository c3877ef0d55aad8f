"""Comparing completions of the same prompts across providers, repeats and a reference engine, by bytes and IDs.

Every comparison goes through the diff stage's byte-level classifier (``kimi_eagle.diff.classify.classify``):
side ``a`` is the reference side (the reference engine's output IDs, or the first provider of a pair), side ``b``
the other; ``identical`` means the same IDs (verdict ``exact``); ``first_divergence`` is side ``a``'s token index of
the first hunk (None when identical); ``length_diff`` is ``len(b) - len(a)`` in tokens.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from statistics import median
from typing import Any, Iterable, Sequence

from kimi_eagle.diff.classify import RecordVerdict, classify
from kimi_eagle.diff.summary import wilson
from kimi_eagle.tokenize.tokenizer import Tokenizer

REFERENCE = "reference"


@dataclass
class Completion:
    """One prompt × provider × repeat: ``ids`` (None unless ``status == "ok"``) and why not."""

    prompt_id: str
    provider: str
    repeat: int
    status: str  # "ok" | "error"
    stage: str | None = None  # where it failed: "input", "collect", "reconstruct", "reference"
    error: str | None = None
    ids: list[int] | None = None
    segments: list[dict] | None = None
    finish_reason: str | None = None


def compare_ids(tok: Tokenizer, a: Sequence[int], b: Sequence[int], segments_b: Sequence[dict] = ()) -> tuple[dict, RecordVerdict]:
    """The comparison row of two ID sequences (see the module docstring) and the classifier's verdict."""
    v = classify(tok, list(a), list(b), list(segments_b))
    identical = v.verdict == "exact"
    return {"identical": identical, "verdict": v.verdict, "label": v.label,
            "first_divergence": None if identical else v.first_divergence,
            "len_a": v.n_engine, "len_b": v.n_recon, "length_diff": v.n_recon - v.n_engine,
            "n_hunks": len(v.hunks)}, v


def hunk_rows(pair: dict, v: RecordVerdict, limit: int = 3) -> list[dict]:
    """The first ``limit`` hunks of a divergent pair, with both sides' bytes and IDs (evidence rows)."""
    al = v.alignment
    rows = []
    for k, hv in enumerate(v.hunks[:limit]):
        h = hv.hunk
        rows.append({"prompt_id": pair["prompt_id"], "a": pair["a"], "b": pair["b"], "hunk": k, "kind": hv.kind,
                     "subclass": hv.subclass, "a_tok_start": h.a_start, "a_tok_end": h.a_end,
                     "b_tok_start": h.b_start, "b_tok_end": h.b_end, "a_ids": list(al.a[h.a_start:h.a_end]),
                     "b_ids": list(al.b[h.b_start:h.b_end]), "a_bytes": al.a.run_bytes(h.a_start, h.a_end),
                     "b_bytes": al.b.run_bytes(h.b_start, h.b_end)})
    return rows


def _pair(tok: Tokenizer, prompt_id: str, a_name: str, a: Completion | None, b_name: str, b: Completion | None,
          kind: str) -> tuple[dict, RecordVerdict | None]:
    row: dict[str, Any] = {"prompt_id": prompt_id, "kind": kind, "a": a_name, "b": b_name, "status": "ok",
                           "error": None, "identical": None, "verdict": None, "label": None, "first_divergence": None,
                           "len_a": None, "len_b": None, "length_diff": None, "n_hunks": None}
    missing = [f"{name}: {c.error if c else 'no completion'}" for name, c in ((a_name, a), (b_name, b))
               if c is None or c.status != "ok"]
    if missing:
        row.update(status="error", error="; ".join(missing))
        return row, None
    try:
        fields, v = compare_ids(tok, a.ids, b.ids, b.segments or ())
    except Exception as e:  # one pair that cannot be aligned is that pair's error, never the audit's
        row.update(status="error", error=f"compare: {type(e).__name__}: {e}")
        return row, None
    row.update(fields)
    return row, v


def compare_all(tok: Tokenizer, completions: Iterable[Completion], providers: Sequence[str],
                reference: dict[str, Completion] | None = None, hunk_limit: int = 3) -> tuple[list[dict], list[dict]]:
    """Pair rows and evidence hunk rows for every prompt: each provider pair (repeat 0 of both, kind ``pair``), each
    provider against the reference (kind ``reference``), and each later repeat against repeat 0 (kind ``repeat``)."""
    by_key: dict[tuple[str, str, int], Completion] = {}
    prompt_ids: list[str] = []
    max_repeat: dict[str, int] = {}
    for c in completions:
        by_key[(c.prompt_id, c.provider, c.repeat)] = c
        if c.prompt_id not in max_repeat:
            prompt_ids.append(c.prompt_id)
        max_repeat[c.prompt_id] = max(max_repeat.get(c.prompt_id, 0), c.repeat)
    pairs: list[dict] = []
    hunks: list[dict] = []

    def add(row: dict, v: RecordVerdict | None) -> None:
        pairs.append(row)
        if v is not None and not row["identical"]:
            hunks.extend(hunk_rows(row, v, hunk_limit))

    for pid in prompt_ids:
        for pa, pb in combinations(providers, 2):
            add(*_pair(tok, pid, pa, by_key.get((pid, pa, 0)), pb, by_key.get((pid, pb, 0)), "pair"))
        if reference is not None:
            for p in providers:
                add(*_pair(tok, pid, REFERENCE, reference.get(pid), p, by_key.get((pid, p, 0)), "reference"))
        for p in providers:
            for r in range(1, max_repeat[pid] + 1):
                row, v = _pair(tok, pid, p, by_key.get((pid, p, 0)), p, by_key.get((pid, p, r)), "repeat")
                row["repeat"] = r
                add(row, v)
    return pairs, hunks


def _rate(k: int, n: int) -> dict[str, Any]:
    lo, hi = wilson(k, n)
    return {"k": k, "n": n, "rate": k / n if n else None, "ci95": [lo, hi]}


def summarize(pairs: Sequence[dict], providers: Sequence[str], has_reference: bool) -> dict[str, Any]:
    """The audit's headline numbers: the agreement matrix (identical share with counts and Wilson 95 % intervals),
    per-provider self-consistency, per-pair first-divergence and length statistics, and the early/often ranking."""
    names = ([REFERENCE] if has_reference else []) + list(providers)
    ok = [p for p in pairs if p["status"] == "ok"]
    matrix: dict[str, dict[str, Any]] = {a: {} for a in names}
    per_pair: dict[str, Any] = {}
    for p in providers:
        rows = [r for r in ok if r["kind"] == "repeat" and r["a"] == p]
        prompts = {r["prompt_id"] for r in rows}
        consistent = sum(all(r["identical"] for r in rows if r["prompt_id"] == pid) for pid in prompts)
        matrix[p][p] = {**_rate(consistent, len(prompts)), "what": "self-consistency: all repeats identical"}
    for kind in ("pair", "reference"):
        keys = {(r["a"], r["b"]) for r in pairs if r["kind"] == kind}
        for a, b in sorted(keys):
            rows = [r for r in ok if r["kind"] == kind and r["a"] == a and r["b"] == b]
            errors = sum(1 for r in pairs if r["kind"] == kind and r["a"] == a and r["b"] == b and r["status"] != "ok")
            same = sum(r["identical"] for r in rows)
            cell = _rate(same, len(rows))
            matrix[a][b] = matrix[b][a] = cell
            firsts = sorted(r["first_divergence"] for r in rows if not r["identical"] and r["first_divergence"] is not None)
            diffs = [r["length_diff"] for r in rows]
            per_pair[f"{a}|{b}"] = {"a": a, "b": b, "kind": kind, **cell, "not_compared": errors,
                                    "first_divergence": firsts,
                                    "median_first_divergence": _median(firsts),
                                    "mean_abs_length_diff": sum(map(abs, diffs)) / len(diffs) if diffs else None,
                                    "length_diff_nonzero": sum(d != 0 for d in diffs)}
    ranking = []
    for p in providers:  # against the reference when there is one, else against every other provider
        rows = [r for r in ok if (r["kind"] == "reference" and r["b"] == p) if has_reference] or \
               [r for r in ok if r["kind"] == "pair" and p in (r["a"], r["b"]) and not has_reference]
        diverged = [r for r in rows if not r["identical"]]
        firsts = [r["first_divergence"] for r in diverged if r["first_divergence"] is not None]
        ranking.append({"provider": p, "against": REFERENCE if has_reference else "other providers",
                        **_rate(len(diverged), len(rows)), "median_first_divergence": _median(firsts)})
    ranking.sort(key=lambda r: (-(r["rate"] or 0), r["median_first_divergence"] if r["median_first_divergence"] is not None else 1e9))
    return {"providers": list(providers), "names": names, "matrix": matrix, "pairs": per_pair,
            "divergence_ranking": ranking}


def _median(positions: list[int]) -> int | float | None:
    """The median token position: a whole number as an int (``9``, never ``9.0``), between two as ``9.5``; None
    for none."""
    if not positions:
        return None
    m = median(positions)
    return int(m) if float(m).is_integer() else float(m)
