"""``--serving auto`` for a file: each (provider, dataset) group's serving profile chosen from its own evidence.

:func:`choose_for_file` reads the JSONL input once (bad lines skipped: the job names them) and runs
:func:`~kimi_eagle.chat.serving_choice.choose_profiles` with a counter that reconstructs a record under each
candidate profile, so both the prompt count (against ``usage.prompt_tokens``) and the completion count
under each candidate's completion handling (against ``usage.completion_tokens``) are evidence.
:func:`auto_options` turns the choices into the job's reconstruction options and tool declaration.
"""
from __future__ import annotations

import json
import os
from dataclasses import replace
from typing import Any, Callable

from kimi_eagle.chat.encoder import PieceEncoder
from kimi_eagle.chat.formats import get_format
from kimi_eagle.chat.serving import PROFILES, get_profile
from kimi_eagle.chat.serving_choice import CANDIDATES, choose_profiles
from kimi_eagle.io import fast_loads
from kimi_eagle.reconstruct.log_shapes import as_api_record
from kimi_eagle.reconstruct.periods import scope
from kimi_eagle.reconstruct.provider_table import entry_applies, unexplained_sides
from kimi_eagle.reconstruct.record import ReconstructOptions, reconstruct_record, serving_groups, serving_options
from kimi_eagle.records import RecordError
from kimi_eagle.tokenize.tokenizer import Tokenizer


def reconstruct_counter(tok: Tokenizer, format_name: str) -> Callable[[dict], dict[str, Any]]:
    """``record -> {name: (prompt count, completion count, dropped_by_server) | None}``: the record reconstructed under each
    candidate profile (``None`` where that profile's server refuses it or the record is bad)."""
    formats = {name: get_format(format_name, tok, PROFILES[name].tool_declaration) for name in CANDIDATES}
    encoder = PieceEncoder(tok)

    def count(record: dict) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in CANDIDATES:
            try:
                row = reconstruct_record(record, tok, formats[name], serving_options(PROFILES[name]), encoder)
                out[name] = (row.n_prompt_tokens, row.n_completion_tokens, "dropped_by_server" in row.flags)
            except (RecordError, ValueError, TypeError, KeyError, AttributeError, RecursionError):
                out[name] = None
        return out
    return count


def _records(path: str | os.PathLike) -> Any:
    """The file's good records (bad lines skipped: the job names them)."""
    with open(path, "rb") as f:
        for line in f:
            try:
                parsed, value = fast_loads(line)  # orjson where it provably agrees with json.loads
                yield as_api_record(value if parsed else json.loads(line))
            except (ValueError, RecursionError):
                continue  # the job names every bad line; the choice only reads good ones


def _not_rendered_by(records: Any, table: str | os.PathLike | None, format_name: str, met: dict) -> Any:
    """``records`` without those the provider ``table`` renders (an explained entry whose template applies to
    ``format_name``), tallying every entry met into ``met`` (:func:`table_use`'s entries) on the way: one pass."""
    from kimi_eagle.chat.server_variants import template_format
    from kimi_eagle.reconstruct.provider_table import record_entry

    for record in records:
        response = record.get("response") if isinstance(record, dict) and table is not None else None
        provider = response.get("provider") if isinstance(response, dict) else None
        if not isinstance(provider, str):
            yield record
            continue
        entry = record_entry(record, table)
        key = (entry.provider, entry.model, entry.period, entry.deployment) if entry is not None else provider
        if key not in met:
            met[key] = _entry_use(entry, provider, format_name, template_format)
        met[key]["records"] += 1
        if not met[key]["applied"]:
            yield record


def _uses(met: dict) -> list[dict[str, Any]]:
    return sorted(met.values(), key=lambda u: (u["status"] != "unexplained", u["provider"], u["model"], u["period"]))


def choose_for_file(path: str | os.PathLike, tok: Tokenizer, format_name: str = "kimi-k2.5",
                    per_group: int = 512, table: str | os.PathLike | None = None,
                    met: dict | None = None) -> list[dict[str, Any]]:
    """The choice per (provider, dataset) of the JSONL file ``path`` (:func:`choose_profiles`' entries), on the
    records the provider ``table`` does not render (None: every record); ``met`` receives the table entries met."""
    records = _not_rendered_by(_records(path), table, format_name, met if met is not None else {})
    return choose_profiles(records, tok, format_name, per_group, reconstruct_counter(tok, format_name))


def auto_options(choices: list[dict[str, Any]], overrides: dict[str, Any] | None = None,
                 keep_tool_ids: bool = False) -> tuple[ReconstructOptions, str]:
    """The job's ``(completion options, tool declaration)`` for ``choices`` (``overrides``: profile fields set by
    the user, applied to every group's profile). One profile for every group: its plain options (a file
    without evidence is reconstructed exactly as ``--serving template``); several: one per group."""
    overrides = overrides or {}
    profiles = {(c["provider"], c["dataset"]): get_profile(c["profile"], **overrides) for c in choices}
    if len({p.name for p in profiles.values()}) <= 1:
        profile = next(iter(profiles.values()), get_profile("template", **overrides))
        return serving_options(profile, keep_tool_ids), profile.tool_declaration
    template = get_profile("template", **overrides)
    options = serving_options(template, keep_tool_ids)
    return replace(options, serving_by_group=serving_groups(profiles)), template.tool_declaration



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
    from kimi_eagle.chat.serving_choice import describe

    if not reconstructed:
        return []
    path = f"{reconstructed}.serving.json"
    try:
        with open(path, encoding="utf-8") as f:
            groups = json.load(f).get("groups", [])
        return [describe(g) for g in groups if isinstance(g, dict)]
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return []


def table_use(path: str | os.PathLike, table: str | os.PathLike, format_name: str) -> list[dict[str, Any]]:
    """Which provider table entries the records of the JSONL file ``path`` fall under: one dict per entry met
    (``provider``, ``model``, ``period``, ``status``, ``variant``, ``records``, ``applied``: whether
    ``reconstruct`` renders those records with it: explained, and its template applies to ``format_name``;
    ``figures`` and ``residuals`` as calibrated), then one per provider without an entry (``status`` ``none``)."""
    met: dict[Any, dict[str, Any]] = {}
    for _ in _not_rendered_by(_records(path), table, format_name, met):
        pass
    return _uses(met)


def _entry_use(entry: Any, provider: str, format_name: str, template_format: Any) -> dict[str, Any]:
    if entry is None:
        return {"provider": provider, "model": "", "period": "", "status": "none", "variant": None, "records": 0,
                "applied": False, "figures": {}, "residuals": {}}
    applies = entry_applies(entry) and template_format(entry.variant.template, format_name) is not None
    return {"provider": entry.provider, "model": entry.model, "period": scope(entry.period, entry.deployment),
            "status": entry.status,
            "variant": entry.variant.describe(), "records": 0, "applied": applies,
            "unexplained_sides": unexplained_sides(entry),
            "figures": {k: list(v) for k, v in entry.figures.items()}, "residuals": dict(entry.residuals)}


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
            return (f"{where}: UNEXPLAINED {' and '.join(sides)} in the provider table ({figures}; residual "
                    f"{residual}) ({n}): rendered with its best variant {use['variant']} for the side it explains, "
                    + ", ".join(f"rows flagged provider_table_{side}_unexplained" for side in sides))
        return (f"{where}: UNEXPLAINED in the provider table ({figures}; residual {residual}) ({n}): "
                "its group's own evidence decides")
    if not use["applied"]:
        return f"{where}: provider table variant {use['variant']} does not apply to this format ({n}): its group decides"
    return f"{where}: provider table variant {use['variant']} ({figures}) ({n})"


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
        chosen = f"UNEXPLAINED (best: {u['variant']}): its group's own evidence decides"
    else:
        chosen = f"{u['variant']} (provider table{'' if u['applied'] else ': not for this format, its group decides'})"
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


def auto_serving_options(path: str | os.PathLike, output: str | os.PathLike, tok: Tokenizer,
                         format_name: str = "kimi-k2.5", table: str | os.PathLike | None = None,
                         overrides: dict[str, Any] | None = None, keep_tool_ids: bool = False,
                         always_write: bool = False) -> tuple[ReconstructOptions, str, list[str]]:
    """``--serving auto`` for the JSONL file ``path`` reconstructed to ``output``: the provider ``table``'s entries
    (:func:`table_use`; None: no table), then each remaining group's choice (:func:`choose_for_file`). Returns the
    job's completion options and tool declaration, and one line per entry and group; writes the evidence to
    ``OUTPUT.serving.json`` when anything other than ``template`` was chosen (or ``always_write``)."""
    met: dict[Any, dict[str, Any]] = {}
    choices = choose_for_file(path, tok, format_name, table=table, met=met)  # one pass: the table, then the groups
    uses = _uses(met)
    from kimi_eagle.chat.serving_choice import describe

    # a provider without an entry is listed in the JSON; its line is its group's (no second line saying so)
    lines = [describe_use(u) for u in uses if u["status"] != "none"] + [describe(c) for c in choices]
    if always_write or any(c["profile"] != "template" for c in choices) or any(u["applied"] for u in uses):
        os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
        with open(f"{output}.serving.json", "w", encoding="utf-8") as f:
            json.dump({"rule": "auto", "provider_table": str(table) if table else None, "summary": lines,
                       "table": uses, "groups": choices}, f, indent=1)
    options, tool_declaration = auto_options(choices, overrides, keep_tool_ids)
    return replace(options, provider_table=str(table) if table else None), tool_declaration, lines
