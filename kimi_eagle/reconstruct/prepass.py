"""The ``--serving auto`` pre-pass of the reconstruct job: each (provider, dataset) group's serving profile for a file.

The choice itself is :mod:`kimi_eagle.serving.auto` (from the provider table and each group's evidence); this module
gives it what only reconstruction has: the file's records read as API records and a counter that reconstructs a
record under each candidate profile, then turns the choices into the job's :class:`ReconstructOptions`.

:func:`choose_for_file` reads the JSONL input once (bad lines skipped: the job names them) and runs
:func:`~kimi_eagle.serving.auto.choose_profiles` with a counter that reconstructs a record under each
candidate profile, so both the prompt count (against ``usage.prompt_tokens``) and the completion count
under each candidate's completion handling (against ``usage.completion_tokens``) are evidence.
:func:`auto_options` turns the choices into the job's reconstruction options and tool declaration.
"""
from __future__ import annotations

import json
import os
from dataclasses import replace
from typing import Any, Callable

from kimi_eagle import io as kit_io
from kimi_eagle.chat.by_model import record_format
from kimi_eagle.chat.encoder import PieceEncoder
from kimi_eagle.io import LongLine, fast_loads, iter_raw_lines
from kimi_eagle.reconstruct.log_shapes import as_api_record
from kimi_eagle.reconstruct.record import ReconstructOptions, reconstruct_record, serving_groups, serving_options
from kimi_eagle.records import RecordError
from kimi_eagle.serving.auto import CANDIDATES, choose_profiles, entry_uses, table_entries
from kimi_eagle.serving.evidence import describe_use
from kimi_eagle.serving.profiles import PROFILES, get_profile
from kimi_eagle.tokenize.tokenizer import Tokenizer


def reconstruct_counter(tok: Tokenizer, format_name: str) -> Callable[[dict], dict[str, Any]]:
    """``record -> {name: (prompt count, completion count, dropped_by_server) | None}``: the record reconstructed under each
    candidate profile (``None`` where that profile's server refuses it or the record is bad)."""
    formats = {name: record_format(format_name, tok, PROFILES[name].tool_declaration) for name in CANDIDATES}
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
    """The file's good records (bad lines skipped: the job names them), cut into lines as the job cuts them; a line
    over :data:`~kimi_eagle.io.MAX_LINE_BYTES` is skipped unread (the job refuses it by its size)."""
    with open(path, "rb") as f:
        for _, line in iter_raw_lines(f, max_line_bytes=kit_io.MAX_LINE_BYTES):
            if isinstance(line, LongLine) or not line.strip():
                continue
            try:
                parsed, value = fast_loads(line)  # orjson where it provably agrees with json.loads
                yield as_api_record(value if parsed else json.loads(line))
            except (ValueError, RecursionError):
                continue  # the job names every bad line; the choice only reads good ones


def choose_for_file(path: str | os.PathLike, tok: Tokenizer, format_name: str = "kimi-k2.5",
                    per_group: int = 512, table: str | os.PathLike | None = None,
                    met: dict | None = None) -> list[dict[str, Any]]:
    """The choice per (provider, dataset) of the JSONL file ``path`` (:func:`choose_profiles`' entries), on the
    records the provider ``table`` does not render (None: every record); ``met`` receives the table entries met."""
    records = table_entries(_records(path), table, format_name, met if met is not None else {})
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


def table_use(path: str | os.PathLike, table: str | os.PathLike, format_name: str) -> list[dict[str, Any]]:
    """Which provider table entries the records of the JSONL file ``path`` fall under: one dict per entry met
    (``provider``, ``model``, ``period``, ``status``, ``variant``, ``records``, ``applied``: whether
    ``reconstruct`` renders those records with it: explained, and its template applies to ``format_name``;
    ``figures`` and ``residuals`` as calibrated), then one per provider without an entry (``status`` ``none``)."""
    met: dict[Any, dict[str, Any]] = {}
    for _ in table_entries(_records(path), table, format_name, met):
        pass
    return entry_uses(met)


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
    uses = entry_uses(met)
    from kimi_eagle.serving.auto import describe

    # a provider without an entry is listed in the JSON; its line is its group's (no second line saying so)
    lines = [describe_use(u) for u in uses if u["status"] != "none"] + [describe(c) for c in choices]
    if always_write or any(c["profile"] != "template" for c in choices) or any(u["applied"] for u in uses):
        os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
        with open(f"{output}.serving.json", "w", encoding="utf-8") as f:
            json.dump({"rule": "auto", "provider_table": str(table) if table else None, "summary": lines,
                       "table": uses, "groups": choices}, f, indent=1)
    options, tool_declaration = auto_options(choices, overrides, keep_tool_ids)
    return replace(options, provider_table=str(table) if table else None), tool_declaration, lines
