"""The provider table: per (provider, model, period), the server-side variant that explains its billed counts.

A TOML data file a user can read and edit (``kimi_eagle/data/providers.toml``, shipped calibrated on the recorded
exchanges of ``assets/data/real_api``; ``kimi-eagle providers --recorded --write-table PATH`` regenerates it).
Each ``[[provider]]`` entry::

    provider = "BaseTen"                      # response.provider as the log has it
    model = "moonshotai/kimi-k2-0905"         # response.model
    period = "all"                            # or "2025-09", "2025-10..2026-03": months of the answers' `created`
    deployment = "any"                        # optional: "none" or a family such as "fpv0" (response.system_fingerprint)
    status = "explained"                      # or "thin" (explained in sample on too little evidence: applied, rows
                                              # flagged provider_table_thin) or "unexplained" (`calibrated_profile`
                                              # then gives nothing)
    profile = "template"                      # a serving profile (kimi_eagle.serving.request)
    conventions = { template = "k2-0905", schema = "vllm", prompt_offset = 1 }  # kimi_eagle.serving.variants
    records = 23
    prompt = [23, 23]                         # in sample: equal, compared
    completion = [23, 23]
    held_out_prompt = [4, 4]                  # learned on one half, scored on the other
    held_out_completion = [4, 4]
    prompt_residual = "-"                     # billed - reconstructed under the variant: median (range)
    completion_residual = "-"

:func:`load_table` checks every entry: an unknown key, a missing one, a value of the wrong type, an unknown
profile or convention is a :class:`TableError` of one line naming the file and the entry (values shortened). A UTF-8
byte-order mark at the start of the file (what some Windows editors write) is read past.
:func:`calibrated_profile` is what ``--serving auto`` asks.
"""
from __future__ import annotations

import json
import os
import stat
import tomllib
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

from kimi_eagle.redact import REDACTED  # the marker every writer of the kit uses
from kimi_eagle.serving.periods import FAMILY, day_of, deployment_of, in_period, period_end
from kimi_eagle.serving.profiles import PROFILES
from kimi_eagle.serving.variants import Variant, variant_from

EXPLAINED = 0.9  # a side is explained when at least this share of its compared records is equal
TABLE_PATH = Path(__file__).resolve().parent.parent / "data" / "providers.toml"
STATUSES = ("explained", "thin", "unexplained")
MAX_BYTES = 4 << 20  # a table file larger than this is refused before it is read
MAX_COUNT = 10**9  # records and pair counts are non-negative integers up to this
PAIRS = ("prompt", "completion", "held_out_prompt", "held_out_completion")
KEYS: dict[str, type | tuple[type, ...]] = {
    "provider": str, "model": str, "period": str, "status": str, "profile": str, "conventions": dict,
    "records": int, **{k: list for k in PAIRS}, "prompt_residual": str, "completion_residual": str, "deployment": str}
OPTIONAL = {"deployment": "any"}  # keys an entry may leave out, with their value then


MAX_MESSAGE = 500  # a TableError's length: the file (its path), the entry, the key and what is known, values shortened


class TableError(ValueError):
    """A provider table that cannot be used; the message is one line naming the file and the entry, of at most
    :data:`MAX_MESSAGE` characters (its start and its end kept when a long path or value would make it longer)."""

    def __init__(self, message: str) -> None:
        if len(message) > MAX_MESSAGE:
            message = f"{message[:300]} ... {message[-(MAX_MESSAGE - 305):]}"
        super().__init__(message)


@dataclass(frozen=True)
class Entry:
    provider: str
    model: str
    period: str
    status: str
    variant: Variant
    records: int
    figures: dict[str, tuple[int, int]]
    residuals: dict[str, str]
    deployment: str = "any"


def _month_ok(p: str) -> bool:
    """A real month ``YYYY-MM`` (1900-2999, 01-12) or day ``YYYY-MM-DD``."""
    if len(p) == 10:
        try:
            datetime.strptime(p, "%Y-%m-%d")
        except ValueError:
            return False
        return _month_ok(p[:7])
    return (len(p) == 7 and p[4] == "-" and p[:4].isdigit() and p[5:].isdigit() and 1900 <= int(p[:4]) <= 2999
            and 1 <= int(p[5:]) <= 12)


def _period_ok(period: str) -> bool:
    """``all``, ``undated``, a real month ``YYYY-MM`` or day ``YYYY-MM-DD`` (1900-2999), or ``FIRST..LAST`` of
    those with FIRST <= LAST (compared at the shorter precision)."""
    if period in ("all", "undated"):
        return True
    parts = period.split("..")
    n = min(len(p) for p in parts)
    return len(parts) <= 2 and all(_month_ok(p) for p in parts) and parts[0][:n] <= parts[-1][:n]


def _problem(item: Any) -> str | None:
    if not isinstance(item, dict):
        return "is not a table"
    unknown = sorted(set(item) - set(KEYS))
    if unknown:
        shown = ", ".join(k if len(k) <= 40 else k[:37] + "..." for k in unknown[:3])
        return f"unknown key(s) {shown}{', ...' * (len(unknown) > 3)} (known: {', '.join(KEYS)})"
    missing = [k for k in KEYS if k not in item and k not in OPTIONAL]
    if missing:
        return f"missing key(s) {', '.join(missing)}"
    item.update({k: v for k, v in OPTIONAL.items() if k not in item})
    for key, kind in KEYS.items():
        if not isinstance(item[key], kind) or isinstance(item[key], bool):
            return f"`{key}` is not a {kind.__name__}"  # type: ignore[union-attr]
    if not 0 <= item["records"] <= MAX_COUNT:
        return f"`records` {_short(item['records'])} is not an integer from 0 to {MAX_COUNT:,}"
    for key in PAIRS:
        pair = item[key]
        if len(pair) != 2 or not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= MAX_COUNT
                                     for n in pair) or pair[0] > pair[1]:
            return f"`{key}` is not [equal, compared] with 0 <= equal <= compared <= {MAX_COUNT:,}"
    if item["status"] not in STATUSES:
        return f"status {_short(item['status'])} is not one of {', '.join(STATUSES)}"
    if item["profile"] not in PROFILES:
        return f"unknown profile {_short(item['profile'])} (known: {', '.join(PROFILES)})"
    if not _period_ok(item["period"]):
        return f"period {_short(item['period'])} is not all, undated, YYYY-MM[-DD] or YYYY-MM[-DD]..YYYY-MM[-DD]"
    if item["deployment"] not in ("any", "none", "other") and not FAMILY.fullmatch(item["deployment"]):
        return f"deployment {_short(item['deployment'])} is not any, none, other or a fingerprint family such as fpv0"
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _entry(item: dict, where: str) -> Entry:
    try:
        variant = variant_from(item["profile"], item["conventions"])
    except (ValueError, TypeError) as e:
        said = str(e) if len(str(e)) <= 200 else f"{str(e)[:120]} ... {str(e)[-75:]}"  # a huge key or value, shortened
        raise TableError(f"{where}: conventions: {said}") from None
    return Entry(item["provider"], item["model"], item["period"], item["status"], variant, item["records"],
                 {k: tuple(item[k]) for k in PAIRS},  # type: ignore[misc]
                 {k: item[f"{k}_residual"] for k in ("prompt", "completion")}, item["deployment"])


def _read(path: Path) -> str:
    """The table file's text: a regular file of at most :data:`MAX_BYTES` (a device, a folder or a larger file is
    refused before it is read)."""
    try:
        st = path.stat()
    except OSError as e:
        raise TableError(f"{path}: cannot read: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise TableError(f"{path}: not a regular file")
    if st.st_size > MAX_BYTES:
        raise TableError(f"{path}: {st.st_size:,} bytes, over the {MAX_BYTES:,}-byte limit of a provider table")
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
        if len(data) > MAX_BYTES:
            raise TableError(f"{path}: over the {MAX_BYTES:,}-byte limit of a provider table")
        return data.decode("utf-8").removeprefix("\ufeff")  # a BOM (Windows editors) is no TOML statement
    except OSError as e:
        raise TableError(f"{path}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise TableError(f"{path}: not UTF-8 ({e.reason} at byte {e.start})") from None


def load_table(path: str | os.PathLike | None = None) -> list[Entry]:
    """Every entry of the table (the shipped one without ``path``); :class:`TableError` for a bad file: unreadable,
    not a regular file, over :data:`MAX_BYTES`, not TOML (nesting too deep included), a bad entry, or two entries for
    the same provider, model, period and deployment (the rule: never two answers for one record; refused)."""
    path = Path(path) if path is not None else TABLE_PATH
    text = _read(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise TableError(f"{path}: not TOML: {str(e)[:200]}") from None
    except RecursionError:
        raise TableError(f"{path}: not TOML this kit reads: nested too deeply") from None
    extra = sorted(set(data) - {"provider"})
    if extra:
        raise TableError(f"{path}: unknown top-level key(s) {', '.join(_short(k) for k in extra[:5])} "
                         "(the table is [[provider]] entries)")
    items = data.get("provider", [])
    if not isinstance(items, list):
        raise TableError(f"{path}: `provider` is not an array of tables ([[provider]])")
    out: list[Entry] = []
    seen: dict[tuple, int] = {}
    for i, item in enumerate(items, 1):
        where = f"{path}: provider entry {i}"
        problem = _problem(item)
        if problem:
            raise TableError(f"{where}: {problem}")
        entry = _entry(item, where)
        key = (entry.provider, entry.model, entry.period, entry.deployment)
        if key in seen:
            raise TableError(f"{where}: the same provider, model, period and deployment as entry {seen[key]} "
                             f"({_short(entry.provider)}, {_short(entry.model)}, {entry.period}, {entry.deployment}): "
                             "a record would have two answers; keep one")
        seen[key] = i
        out.append(entry)
    return out


@lru_cache(maxsize=4)
def _shipped(path: str) -> tuple[Entry, ...]:
    return tuple(load_table(path))


def _same_model(a: str, b: str) -> bool:
    return a == b or a.rpartition("/")[2] == b.rpartition("/")[2]


def table_entry(provider: str, model: str, month: str | None = None,
                path: str | os.PathLike | None = None, deployment: str | None = None) -> Entry | None:
    """The entry of ``provider`` serving ``model`` (a ``vendor/`` prefix may differ) in the period holding ``month``
    (``YYYY-MM-DD`` or ``YYYY-MM``), or else its latest period, for ``deployment`` (a fingerprint family: its own entry first, then
    one for ``any``); None when the table has none (explained or not)."""
    entries = [e for e in _shipped(str(path or TABLE_PATH)) if e.provider == provider and _same_model(e.model, model)]
    if month is not None:
        entries = [e for e in entries if in_period(month, e.period)] or entries
    if entries:  # the period first (the month's, else the latest), then the deployment within it
        latest = max(period_end(e.period) for e in entries)
        entries = [e for e in entries if period_end(e.period) == latest]
    if deployment is not None and any(e.deployment != "any" for e in entries):
        entries = [e for e in entries if e.deployment == deployment] or [e for e in entries if e.deployment == "any"]
    return entries[0] if entries else None


def calibrated_profile(provider: str, model: str, month: str | None = None,
                       path: str | os.PathLike | None = None) -> tuple[str, dict[str, Any]] | None:
    """``(serving profile name, conventions)`` the table gives ``provider`` serving ``model`` (:func:`table_entry`);
    None when the table has no entry, or the entry is ``unexplained`` or ``thin`` (never a silent pick; ``--serving
    auto`` renders a thin entry's records, flagged ``provider_table_thin``: :func:`table_entry` gives it).

    >>> calibrated_profile("Parasail", "moonshotai/kimi-k2-0905")
    ('template', {'tools': 'json-compact', 'schema': 'sglang', 'history_ids': 'verbatim', 'history_args': 'spaced'})
    >>> calibrated_profile("DeepInfra", "moonshotai/kimi-k2-0905") is None  # unexplained: nothing is picked
    True
    """
    entry = table_entry(provider, model, month, path)
    if entry is None or entry.status != "explained":
        return None
    return entry.variant.profile, entry.variant.conventions()


def side_explained(entry: Entry, side: str) -> bool:
    """Whether the entry's variant makes at least :data:`EXPLAINED` of its billed ``side`` counts (``prompt`` or
    ``completion``) equal in sample, whatever the other side does."""
    equal, compared = entry.figures[side]
    return compared > 0 and equal >= EXPLAINED * compared


def entry_flags(entry: Entry | None) -> list[str]:
    """The flags of a row the table ``entry`` rendered: ``provider_table_<side>_unexplained`` for each side it does
    not explain, ``provider_table_thin`` when it is explained only on thin evidence."""
    flags = [f"provider_table_{side}_unexplained" for side in unexplained_sides(entry)]
    return flags + (["provider_table_thin"] if entry is not None and entry.status == "thin" else [])


def entry_applies(entry: Entry) -> bool:
    """Whether ``reconstruct --serving auto`` renders the entry's records with its variant: the entry is explained,
    or one side of it is, or its variant made some billed count equal in sample (the best rendering calibration
    found for the period: each side it leaves unexplained is flagged ``provider_table_<side>_unexplained`` on its
    rows). An entry whose variant made no count equal is left to its group's own evidence."""
    return (entry.status == "explained" or any(side_explained(entry, side) for side in ("prompt", "completion"))
            or any(entry.figures[side][0] > 0 for side in ("prompt", "completion")))


def unexplained_sides(entry: Entry | None) -> list[str]:
    """The sides (``prompt``, ``completion``) of an entry that its variant does not explain."""
    return [] if entry is None else [side for side in ("prompt", "completion") if not side_explained(entry, side)
                                     and entry.figures[side][1] > 0]


def record_entry(record: Any, path: str | os.PathLike | None = None) -> Entry | None:
    """The table entry of an API record: its ``response.provider`` and ``response.model``, on the day of its
    ``response.created`` (None without a provider or model, or without an entry)."""
    response = record.get("response") if isinstance(record, dict) else None
    provider = response.get("provider") if isinstance(response, dict) else None
    model = response.get("model") if isinstance(response, dict) else None
    if not isinstance(provider, str) or not isinstance(model, str):
        return None
    day = day_of(record)
    return table_entry(provider, model, None if day == "undated" else day, path, deployment_of(record))


# --------------------------------------------------------------------------------------------
# Writing


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):  # JSON escapes C0 controls; TOML also forbids DEL and wants C1 escaped
        return "".join(c if c.isprintable() or c in "\t" else f"\\u{ord(c):04x}" if ord(c) < 0x10000 else c
                       for c in json.dumps(value, ensure_ascii=False))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }" if value else "{}"
    raise TypeError(f"no TOML for {type(value).__name__}")


def table_items(rows: Iterable[dict]) -> list[dict[str, Any]]:
    """The table entries of :func:`~kimi_eagle.serving.calibration.calibrate` rows."""
    items = []
    for row in rows:
        inside, outside, v = row["in_sample"], row["held_out"], row["variant"]
        items.append({"provider": redact(row["provider"])[0], "model": redact(row["model"])[0], "period": row["period"],
                      **({"deployment": row["deployment"]} if row.get("deployment", "any") != "any" else {}),
                      "status": row["status"], "profile": v.profile, "conventions": v.conventions(),
                      "records": row["records"],
                      "prompt": [inside["prompt"].equal, inside["prompt"].compared],
                      "completion": [inside["completion"].equal, inside["completion"].compared],
                      "held_out_prompt": [outside["prompt"].equal, outside["prompt"].compared],
                      "held_out_completion": [outside["completion"].equal, outside["completion"].compared],
                      "prompt_residual": inside["prompt"].residual(),
                      "completion_residual": inside["completion"].residual()})
    return items


API_KEY_ENV = "OPENROUTER_API_KEY"


def redact(text: str) -> tuple[str, bool]:
    """``text`` with the API key (``$OPENROUTER_API_KEY``, when set and at least 8 characters) replaced by
    :data:`REDACTED`, and whether it held it: a data field (a provider or model name) never carries the key into a
    table or a terminal."""
    key = os.environ.get(API_KEY_ENV) or ""
    if len(key) < 8 or key not in text:
        return text, False
    return text.replace(key, REDACTED), True


def comment_safe(text: str) -> str:
    """``text`` for one TOML comment line: every control character (a newline included) escaped."""
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}" for c in text)


def write_table(rows: Iterable[dict], path: str | os.PathLike, source: str) -> Path:
    """Write the table of ``rows`` to ``path`` (``source``: what it was calibrated on, for the header; control
    characters escaped, so a path holding a newline cannot add a line). What it writes, :func:`load_table` reads."""
    lines = ["# Provider table: the server-side variant that explains each provider's billed counts.",
             f"# Calibrated on {comment_safe(redact(source)[0])} by `kimi-eagle providers` (kimi_eagle/serving/calibration.py);",
             "# format: kimi_eagle/serving/provider_table.py, docs/providers.md. Editable: a wrong entry is",
             "# refused on load with a one-line error.", ""]
    for item in table_items(rows):
        lines.append("[[provider]]")
        lines += [f"{k} = {_toml(v)}" for k, v in item.items()]
        lines.append("")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines), encoding="utf-8")
    _shipped.cache_clear()
    return path
