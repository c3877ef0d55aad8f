"""The diff's numbers: which records and hunks can be counted, and what ``summary.json`` says about them.

:func:`screen_diff` leaves out every record or hunk whose fields cannot be counted (NaN or None in a number an
ok record needs, an unknown status or verdict, text that is not valid UTF-8) with a note naming it and why
(:func:`left_out_note`); :func:`summarize_diff` counts what is left: statuses, verdicts, labels, hunk classes,
per-dataset mismatch rates with Wilson 95% intervals (:func:`wilson`), the billing reconciliation and, when the
records carry expected labels (``kimi-eagle simulate``), the confusion table with each class's precision and recall.
Charts and the HTML page are the report app's (``kimi_eagle.apps.reports.diff_report``).
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
import pandas as pd

from kimi_eagle.data_kinds import REAL, SIMULATED, TOY, meta_kind, model_kind
from kimi_eagle.diff.classify import LABELS, SUBCLASSES, VERDICTS
from kimi_eagle.diff.run import HUNK_SCHEMA, RECORD_SCHEMA, STATUSES, DiffResult
from kimi_eagle.records import printable_id, storable_text

Z95 = 1.959963984540054
DATA_KINDS = ("simulated", "real")


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for ``k`` successes in ``n`` trials (``(0, 1)`` when ``n == 0``). The bounds at
    ``k == 0`` and ``k == n`` are exactly 0 and 1 (the formula's float rounding would give 6.9e-18 there).

    >>> wilson(0, 48)[0], wilson(48, 48)[1]
    (0.0, 1.0)
    """
    if n == 0:
        return 0.0, 1.0
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if k == 0 else max(0.0, centre - half)
    hi = 1.0 if k == n else min(1.0, centre + half)
    return lo, hi


def data_kind(records: pd.DataFrame) -> str:
    """``"simulated"`` when the diff carries expected labels (``kimi-eagle simulate``), else ``"real"``."""
    return "simulated" if "expected" in records and records["expected"].notna().any() else "real"


def diff_data_kind(records: pd.DataFrame, meta: Mapping[str, Any] | None = None) -> tuple[str, str]:
    """``(kind, why)``: what a diff's data are, from its provenance: the kind its ``meta.json`` states (the notebook
    and ``kimi-eagle diff`` write it), else ``simulated`` when the records carry expected labels, else ``toy`` when
    the meta names a toy model or tokenizer (stories260K, tiny-kimi; ``api_model``: the model the reconstruction's API
    records name), else ``real``."""
    meta = meta if isinstance(meta, Mapping) else {}
    if kind := meta_kind(dict(meta)):
        return kind, "its meta.json says so"
    if data_kind(records) == SIMULATED:
        return SIMULATED, "its records carry the expected labels of `kimi-eagle simulate`"
    for field in ("model", "engine_model", "api_model", "tokenizer"):
        if isinstance(meta.get(field), str) and model_kind(meta[field]) == TOY:
            return TOY, f"its meta.json names the toy model {meta[field]!r}"
    return REAL, "no expected labels and no toy model named"


# --------------------------------------------------------------------------------------------
# screening: what cannot be counted is left out, named, and counted — never a crash

TEXT_FIELDS = ("id", "dataset", "status", "error", "verdict", "label", "expected", "provider", "format",
               "finish_reason", "engine_finish_reason")
OK_COUNTS = ("n_engine_tokens", "n_recon_tokens", "token_delta", "n_hunks")
OPTIONAL_COUNTS = ("first_divergence", "billing_explained", "reasoning_explained")
BILLED_COUNTS = {"billed_completion_tokens": ("billing_delta", "billing_unexplained"),
                 "billed_reasoning_tokens": ("recon_reasoning_tokens", "reasoning_delta", "reasoning_unexplained")}
HUNK_KINDS = ("split", "semantic")
HUNK_COUNTS = ("engine_tok_start", "engine_tok_end", "recon_tok_start", "recon_tok_end", "token_delta")
LEFT_OUT_PARTS = ("records", "hunks", "example_hunks", "charts", "sections")
MAX_NOTES = 100  # notes listed in summary.json and the report (the counts cover all of them)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, (float, np.floating)) and math.isnan(value))


def _whole_problem(value: Any, name: str) -> str | None:
    """Why ``value`` is not a whole number (missing, not a number, NaN, infinite, fractional), or None."""
    if _missing(value):
        return f"{name} is missing (null or NaN)"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        return f"{name} is a {type(value).__name__}, not a number"
    if not math.isfinite(value) or not float(value).is_integer():
        return f"{name} is {value!r}, not a whole number"
    return None


def _text_problem(value: Any, name: str) -> str | None:
    """Why ``value`` is not storable text, or None (missing text is fine: null, or pandas' NaN for it)."""
    if _missing(value):
        return None
    if not isinstance(value, str):
        return f"{name} is a {type(value).__name__}, not text"
    if not storable_text(value):
        return f"{name} is not valid UTF-8 text (a lone surrogate)"
    return None


def record_problem(row: Mapping[str, Any]) -> str | None:
    """Why one ``records.parquet`` row cannot enter the report's numbers, or None when it can."""
    if not isinstance(row.get("id"), str):
        return _text_problem(row.get("id"), "id") or "id is missing"
    for name in TEXT_FIELDS:
        if problem := _text_problem(row.get(name), name):
            return problem
    status = row.get("status")
    if status not in STATUSES:
        return f"status {status!r} is not one of {', '.join(STATUSES)}"
    if status != "ok":
        return None
    if row.get("verdict") not in VERDICTS:
        return f"verdict {row.get('verdict')!r} is not one of {', '.join(VERDICTS)}"
    if not isinstance(row.get("label"), str):
        return "label is missing"
    subclasses = row.get("subclasses")
    if not isinstance(subclasses, (list, tuple, np.ndarray)) or not all(isinstance(c, str) for c in subclasses):
        return f"subclasses is {subclasses!r}, not a list of names"
    for name in OK_COUNTS:
        if problem := _whole_problem(row.get(name), name):
            return problem
    for name in OPTIONAL_COUNTS:
        if not _missing(row.get(name)) and (problem := _whole_problem(row.get(name), name)):
            return problem
    frac = row.get("first_divergence_frac")
    if not _missing(frac) and (isinstance(frac, (bool, np.bool_)) or not isinstance(frac, (int, float, np.number))
                               or not 0 <= frac <= 1):
        return f"first_divergence_frac is {frac!r}, not a number in 0..1"
    for billed, needed in BILLED_COUNTS.items():
        if _missing(row.get(billed)):
            continue
        for name in (billed, *needed):
            if problem := _whole_problem(row.get(name), name):
                return problem
    if not _missing(row.get("engine_canonical")) and not isinstance(row.get("engine_canonical"), (bool, np.bool_)):
        return f"engine_canonical is {row.get('engine_canonical')!r}, not true or false"
    return None


def hunk_problem(hunk: Mapping[str, Any], counted_ids: set[str]) -> str | None:
    """Why one ``hunks.parquet`` row cannot enter the report's numbers, or None. ``counted_ids``: the ids of
    the ok records the report counts."""
    rid = hunk.get("id")
    if problem := _text_problem(rid, "id") or (None if isinstance(rid, str) else "id is missing"):
        return problem
    if rid not in counted_ids:
        return f"no ok record {printable_id(rid)!r} in the report"
    if hunk.get("kind") not in HUNK_KINDS:
        return f"kind {hunk.get('kind')!r} is not one of {', '.join(HUNK_KINDS)}"
    for name in ("subclass", "segment"):
        if problem := _text_problem(hunk.get(name), name):
            return problem
    for name in HUNK_COUNTS:
        if problem := _whole_problem(hunk.get(name), name):
            return problem
    return None


def left_out_note(part: str, rid: Any, reason: str, **where: Any) -> dict[str, Any]:
    """One left-out part: ``part`` (record, hunk, example hunk, chart, section, ...), the record's id (printable,
    None when the part belongs to no record), where (e.g. ``name``, ``hunk``) and why."""
    return {"part": part, "id": None if rid is None else printable_id(rid), **where, "reason": printable_id(reason)}


def error_reason(e: BaseException) -> str:
    """An exception as a note's reason: ``"TypeName: message"``."""
    return f"{type(e).__name__}: {e}"


def screen_diff(result: DiffResult) -> tuple[DiffResult, list[dict[str, Any]]]:
    """The records and hunks the report can count (every schema column present), and a note for each one left
    out: ``{"part": "record" | "hunk", "id", "reason"}`` (hunks also carry ``hunk``, their index)."""
    notes: list[dict[str, Any]] = []
    records = result.records.reindex(columns=list(dict.fromkeys([*result.records.columns, *RECORD_SCHEMA.names])))
    hunks = result.hunks.reindex(columns=list(dict.fromkeys([*result.hunks.columns, *HUNK_SCHEMA.names])))
    keep = []
    for row in records.to_dict("records"):
        try:
            problem = record_problem(row)
        except Exception as e:  # a value no check foresaw
            problem = f"unexpected {error_reason(e)}"
        keep.append(problem is None)
        if problem is not None:
            notes.append(left_out_note("record", row.get("id"), problem))
    records = records[np.array(keep, dtype=bool)] if len(records) else records
    counted = set(records.loc[records["status"] == "ok", "id"])
    keep = []
    for k, hunk in enumerate(hunks.to_dict("records")):
        try:
            problem = hunk_problem(hunk, counted)
        except Exception as e:
            problem = f"unexpected {error_reason(e)}"
        keep.append(problem is None)
        if problem is not None:
            notes.append(left_out_note("hunk", hunk.get("id"), problem, hunk=hunk.get("hunk") if not _missing(hunk.get("hunk")) else k))
    hunks = hunks[np.array(keep, dtype=bool)] if len(hunks) else hunks
    return DiffResult(records.reset_index(drop=True), hunks.reset_index(drop=True)), notes


def left_out_counts(notes: list[dict[str, Any]]) -> dict[str, Any]:
    """``summary.json["left_out"]``: how many records, hunks, example hunks, charts and sections were left out,
    and the first notes saying which and why."""
    parts = {"record": "records", "hunk": "hunks", "example hunk": "example_hunks", "chart": "charts",
             "section": "sections"}
    counts = {name: sum(n["part"] == part for n in notes) for part, name in parts.items()}
    return {**counts, "notes": notes[:MAX_NOTES]}


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


