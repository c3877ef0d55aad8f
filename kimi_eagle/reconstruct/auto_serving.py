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
    with open(path, "rb") as f:
        for line in f:
            try:
                parsed, value = fast_loads(line)  # orjson where it provably agrees with json.loads
                yield as_api_record(value if parsed else json.loads(line))
            except (ValueError, RecursionError):
                continue  # the job names every bad line; the choice only reads good ones


def choose_for_file(path: str | os.PathLike, tok: Tokenizer, format_name: str = "kimi-k2.5",
                    per_group: int = 64) -> list[dict[str, Any]]:
    """The choice per (provider, dataset) of the JSONL file ``path`` (:func:`choose_profiles`' entries)."""
    return choose_profiles(_records(path), tok, format_name, per_group, reconstruct_counter(tok, format_name))


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
