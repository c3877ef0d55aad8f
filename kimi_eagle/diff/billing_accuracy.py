"""How right the billing-only verdicts are, on labelled input (``kimi-eagle simulate``'s ``labels.parquet``).

Each labelled record's expected diff label has one billing cause (:data:`LABEL_CAUSES`: a ``bpe_split`` is a
``non_canonical_split`` to billing, a ``special_token`` record a ``think_end_not_generated``, an ``other`` edit is
``unexplained``). A verdict's predicted cause is ``match``, ``unexplained``, the record-level convention(s) it
names (provider-wide conventions such as ``eot_not_counted`` are not a record's cause), or ``ambiguous`` when it
names alternatives billing cannot tell apart. The confusion of label causes (rows) against predicted causes
(columns) gives, per cause, precision and recall with Wilson 95% intervals. An effect that leaves the token count
unchanged (a re-serialised argument of the same length, an edit that keeps the count) is ``match`` to billing:
such records count against recall, as they should — billing alone cannot see them.
"""
from __future__ import annotations

from typing import Any, Mapping

import pandas as pd

from kimi_eagle.diff.billing import PROVIDER_CONVENTIONS, verdict_class
from kimi_eagle.diff.summary import wilson

LABEL_CAUSES = {"exact": "match", "bpe_split": "non_canonical_split", "whitespace": "whitespace_stripped",
                "tool_call_id": "tool_id_rewritten", "tool_args_json_equal": "args_reserialised",
                "special_token": "think_end_not_generated", "truncation": "length_truncation",
                "replacement_char": "replacement_char", "other": "unexplained"}
AMBIGUOUS = "ambiguous"
NOT_RECORD_CAUSES = (*PROVIDER_CONVENTIONS, "truncation_resolved_by_billing")


def predicted_cause(verdict: str | None) -> str:
    """The cause a billing verdict names: ``explained:eot_not_counted+length_truncation`` -> ``length_truncation``,
    ``explained:a|b`` -> ``ambiguous``, ``explained:eot_not_counted`` -> ``match`` (nothing record-level)."""
    cls = verdict_class(verdict)
    if cls != "explained":
        return cls
    alternatives = {"+".join(c for c in alt.split("+") if c not in NOT_RECORD_CAUSES)
                    for alt in str(verdict).split(":", 1)[1].split("|")}
    if len(alternatives) > 1:
        return AMBIGUOUS
    return alternatives.pop() or "match"


def label_cause(expected: str) -> str:
    """The billing cause of a diff label (:data:`LABEL_CAUSES`; any other label stands for itself)."""
    return LABEL_CAUSES.get(expected, expected)


def billing_confusion(records: pd.DataFrame, labels: Mapping[str, str | None]) -> pd.DataFrame | None:
    """Label cause (rows) against predicted cause (columns) over the records with a label; None without any."""
    lab = records[records["id"].map(lambda i: labels.get(i) is not None)]
    if lab.empty:
        return None
    truth = lab["id"].map(lambda i: label_cause(labels[i])).rename("label")
    predicted = lab["verdict"].map(predicted_cause).rename("verdict")
    order = ["match", *LABEL_CAUSES.values()]
    seen = set(truth) | set(predicted)
    classes = list(dict.fromkeys(c for c in [*order, *sorted(seen - {AMBIGUOUS}), AMBIGUOUS] if c in seen))
    rows = [c for c in classes if c != AMBIGUOUS]  # a label is never ambiguous; a verdict may be
    return pd.crosstab(truth, predicted).reindex(index=rows, columns=classes, fill_value=0)


def per_cause(table: pd.DataFrame) -> list[dict[str, Any]]:
    """Per label cause: support, predicted, correct, precision and recall with Wilson 95% intervals (None where
    nothing is predicted / labelled), and how many of its records got an ambiguous verdict."""
    rows = []
    for c in table.index:
        tp, support = int(table.loc[c, c]), int(table.loc[c].sum())
        predicted = int(table[c].sum())
        p_lo, p_hi = wilson(tp, predicted) if predicted else (None, None)
        r_lo, r_hi = wilson(tp, support) if support else (None, None)
        rows.append({"cause": c, "support": support, "predicted": predicted, "correct": tp,
                     "precision": tp / predicted if predicted else None, "precision_lo": p_lo, "precision_hi": p_hi,
                     "recall": tp / support if support else None, "recall_lo": r_lo, "recall_hi": r_hi,
                     "ambiguous": int(table.loc[c, AMBIGUOUS]) if AMBIGUOUS in table.columns else 0})
    return rows


def billing_accuracy(records: pd.DataFrame, labels: Mapping[str, str | None]) -> dict[str, Any] | None:
    """``summary.json["accuracy"]``: the confusion, per-cause precision/recall, and the headline counts —
    ``explained`` verdicts, those naming one cause that is not the label's (``wrong_cause``), ``ambiguous`` ones,
    and labelled effects billing cannot see (``match`` on a record whose label is not ``exact``)."""
    table = billing_confusion(records, labels)
    if table is None:
        return None
    lab = records[records["id"].map(lambda i: labels.get(i) is not None)]
    truth = lab["id"].map(lambda i: label_cause(labels[i]))
    predicted = lab["verdict"].map(predicted_cause)
    explained = lab["verdict"].map(verdict_class) == "explained"
    single = explained & (predicted != AMBIGUOUS) & (predicted != "match")
    return {"labels": list(table.index), "verdicts": list(table.columns), "matrix": table.values.tolist(),
            "per_cause": per_cause(table),
            "n_labelled": len(lab), "explained": int(explained.sum()),
            "wrong_cause": int((single & (predicted != truth)).sum()),
            "ambiguous": int((predicted == AMBIGUOUS).sum()),
            "unseen_effects": int(((predicted == "match") & (truth != "match")).sum())}
