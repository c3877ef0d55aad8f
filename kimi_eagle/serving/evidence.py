"""What ``--serving auto`` chose and why, as lines and rows for the pages (read from ``RECONSTRUCTED.serving.json``
and the reconstructed rows' ``serving`` column)."""
from __future__ import annotations

import json
import os
from typing import Any

from kimi_eagle.serving.auto import describe


def describe_use(use: dict[str, Any]) -> str:
    """One line per table entry met: what ``--serving auto`` did with those records, and why."""
    n = f"{use['records']:,} record(s)"
    if use["status"] == "none":
        return f"provider {use['provider']}: not in the provider table ({n}): its group's own evidence decides"
    where = f"provider {use['provider']} ({use['model']}, {use['period']})"
    f = use["figures"]
    figures = (f"calibrated prompt {f['prompt'][0]}/{f['prompt'][1]}, completion {f['completion'][0]}/"
               f"{f['completion'][1]}, held out {f['held_out_prompt'][0]}/{f['held_out_prompt'][1]} and "
               f"{f['held_out_completion'][0]}/{f['held_out_completion'][1]}")
    if use["status"] == "unexplained":
        residual = "; ".join(f"{k} {v}" for k, v in use["residuals"].items() if v != "-")
        if use["applied"]:
            sides = use["unexplained_sides"]
            what = "for the side it explains" if len(sides) < 2 else "(the best rendering found, for neither side)"
            return (f"{where}: UNEXPLAINED {' and '.join(sides)} in the provider table ({figures}; residual "
                    f"{residual}) ({n}): rendered with its best variant {use['variant']} {what}, "
                    + ", ".join(f"rows flagged provider_table_{side}_unexplained" for side in sides))
        return (f"{where}: UNEXPLAINED in the provider table ({figures}; residual {residual}) ({n}): "
                "its group's own evidence decides")
    if not use["applied"]:
        return f"{where}: provider table variant {use['variant']} does not apply to this format ({n}): its group decides"
    if use["status"] == "thin":
        return (f"{where}: THIN provider table variant {use['variant']} ({figures}; rests on "
                f"{use.get('table_records', '?')} calibrated record(s)) ({n}): rendered with it, rows flagged "
                "provider_table_thin")
    return f"{where}: provider table variant {use['variant']} ({figures}; rests on {use.get('table_records', '?')} " \
           f"calibrated record(s)) ({n})"


def serving_by_provider(rows: Any) -> dict[str, dict[str, int]] | None:
    """``{provider: {profile: rows}}`` of reconstructed rows (dicts, or a DataFrame with ``provider`` and
    ``serving`` columns); ``None`` when no row names its profile (a reconstruction from before the ``serving``
    column). A row without a provider counts under ``(none)``; error rows (no profile) are not counted."""
    if hasattr(rows, "columns"):
        if "serving" not in rows.columns:
            return None
        pairs = zip(rows["provider"], rows["serving"])
    else:
        pairs = ((r.get("provider"), r.get("serving")) for r in rows if isinstance(r, dict))
    out: dict[str, dict[str, int]] = {}
    for provider, serving in pairs:
        if isinstance(serving, str):
            counts = out.setdefault(provider if isinstance(provider, str) else "(none)", {})
            counts[serving] = counts.get(serving, 0) + 1
    return {p: dict(sorted(c.items())) for p, c in sorted(out.items())} or None


def serving_line(by_provider: dict[str, dict[str, int]] | None) -> str | None:
    """One line for a report page: ``serving profiles: provider P: vllm profile (412 rows); ...`` (None without)."""
    if not by_provider:
        return None
    parts = [f"provider {p}: " + ", ".join(f"{name} profile ({n:,} rows)" for name, n in counts.items())
             for p, counts in by_provider.items()]
    return "serving profiles (kimi-eagle reconstruct --serving): " + "; ".join(parts)


def serving_evidence(reconstructed: str | os.PathLike | None) -> list[str]:
    """The ``--serving auto`` choice per provider with its evidence, one line each (``describe``), read from the
    ``RECONSTRUCTED.serving.json`` written beside a reconstruction; ``[]`` when there is none or it is unreadable."""

    if not reconstructed:
        return []
    path = f"{reconstructed}.serving.json"
    try:
        with open(path, encoding="utf-8") as f:
            groups = json.load(f).get("groups", [])
        return [describe(g) for g in groups if isinstance(g, dict)]
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return []


def provider_rows(reconstructed: str | os.PathLike | None) -> list[dict[str, Any]]:
    """The per-provider table of a ``--serving auto`` reconstruction, read from ``RECONSTRUCTED.serving.json``: one
    row per provider table entry met and per group chosen from its own evidence, unexplained entries first.
    Columns: ``provider``, ``scope`` (model and period, or dataset), ``chosen`` (the variant or profile, and how),
    ``prompt`` and ``completion`` (equal/compared), ``residual``, ``records``, ``unexplained``. ``[]`` without one."""
    try:
        with open(f"{reconstructed}.serving.json", encoding="utf-8") as f:
            data = json.load(f)
        uses, groups = data.get("table") or [], data.get("groups") or []
        return [_use_row(u) for u in uses if u.get("status") != "none"] + [_group_row(g) for g in groups]
    except (OSError, ValueError, AttributeError, KeyError, TypeError, IndexError):
        return []


def _pair(pair: Any) -> str:
    return f"{pair[0]}/{pair[1]}" if pair else "-"


def _use_row(u: dict[str, Any]) -> dict[str, Any]:
    unexplained = u["status"] == "unexplained"
    if unexplained:
        chosen = (f"UNEXPLAINED (best: {u['variant']}): " + ("rendered with it, rows flagged on the side(s) it leaves "
                  "unexplained" if u["applied"] else "its group's own evidence decides"))
    else:
        thin = ", THIN: rows flagged provider_table_thin" if u["status"] == "thin" else ""
        chosen = (f"{u['variant']} (provider table{'' if u['applied'] else ': not for this format, its group decides'}"
                  f"{thin}; rests on {u.get('table_records', '?')} calibrated record(s))")
    residual = "; ".join(f"{k} {v}" for k, v in u["residuals"].items() if v != "-" and "+0 (range +0..+0)" not in v)
    return {"provider": u["provider"], "scope": f"{u['model']} ({u['period']})", "chosen": chosen,
            "prompt": _pair(u["figures"].get("prompt")), "completion": _pair(u["figures"].get("completion")),
            "residual": residual or "-", "records": u["records"], "unexplained": unexplained}


def _group_row(g: dict[str, Any]) -> dict[str, Any]:
    name = g["profile"]
    chosen = f"{name} (group evidence)" if not g.get("no_evidence") else f"template ({g['no_evidence']})"
    return {"provider": g["provider"] or "(none)", "scope": f"dataset {g['dataset']}" if g["dataset"] else "-",
            "chosen": chosen, "prompt": f"{g['prompt_matched'].get(name, 0)}/{g['compared']}",
            "completion": f"{g['completion_matched'].get(name, 0)}/{g['completion_compared']}",
            "residual": "-", "records": g.get("billed_records", g["compared"]), "unexplained": False}


def unexplained_finding(rows: list[dict[str, Any]]) -> str | None:
    """The first finding of a page when the provider table explains some provider's billed counts by no variant."""
    bad = [r for r in rows if r["unexplained"]]
    if not bad:
        return None
    names = "; ".join(f"{r['provider']} {r['scope']}, {r['records']:,} record(s), residual {r['residual']}" for r in bad)
    return (f"{len(bad)} provider table entr{'y' if len(bad) == 1 else 'ies'} explain the billed counts by no known "
            f"server variant (billed - reconstructed): {names}. Their rows are reconstructed from their group's own "
            "evidence; their counts are not proof of their IDs.")
