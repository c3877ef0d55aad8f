"""Serving profiles as data files: every ``*.toml`` under ``kimi_eagle/chat/profiles/``, one per server version.

A file (read with :mod:`tomllib`)::

    [header]                      # what the file describes: required, strings
    server = "vLLM"
    version = "main snapshot, Dec 2026 (transcribed)"
    source = "vLLM entrypoints/chat_utils.py _postprocess_messages, ..."   # what it was read from
    notes = "..."                 # optional

    [aliases]                     # optional: alias = "profile name" (CLI --serving accepts both)
    vllm = "vllm-legacy"

    [[profiles]]                  # one entry per profile (variants of the version: several entries)
    name = "vllm-legacy"
    base = "moonshot"             # optional: start from that profile's fields (in any file)
    candidate = 30                # optional: --serving auto tries it; prompt-count ties go to the lowest
    history_arguments = "reserialise"   # then the ServingProfile fields that differ from the base
                                        # (or from the dataclass defaults without a base)

A profile's ``server`` and ``version`` fields are its file's header values (not set in an entry). A field
absent from an entry keeps the base's value (or the default: ``tool_part_join`` absent is ``None``); ``name``,
``base`` and ``candidate`` are not inherited. Any mistake (TOML syntax, an unknown key, a value of the wrong
type or outside :data:`~kimi_eagle.chat.serving_profile.CHOICES`, a duplicate name or alias, an unknown base, a
base cycle, an alias to no profile or shadowing one, two candidates of one rank) raises ValueError with one
line ``serving profile file X.toml: ...``.

>>> profiles, aliases = load_profiles()
>>> aliases["vllm"], profiles["vllm-legacy"].split_on
('vllm-0.33', 'text')
"""
from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from kimi_eagle.chat.serving_profile import CHOICES, ServingProfile, field_type

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
FILE_KEYS = ("header", "aliases", "profiles")
HEADER_KEYS = {"server": True, "version": True, "source": True, "notes": False}  # key -> required
ENTRY_KEYS = ("name", "base", "candidate")
HEADER_FIELDS = ("server", "version")  # profile fields that come from the header
FIELDS = tuple(f.name for f in fields(ServingProfile) if f.name not in ("name", *HEADER_FIELDS))
RESERVED = ("auto",)  # --serving auto is not a profile
NAME = re.compile(r"[a-z0-9][a-z0-9._-]*\Z")
TOML_TYPES = {bool: "a boolean", str: "a string", int: "an integer", float: "a float", list: "an array", dict: "a table"}


@dataclass(frozen=True)
class ProfileSet:
    """The profiles of a folder: ``profiles`` (name -> profile: the candidates first, by rank, then the rest in
    file order), ``aliases`` (alias -> name) and ``candidates`` (the names ``--serving auto`` tries, by rank)."""

    profiles: dict[str, ServingProfile]
    aliases: dict[str, str]
    candidates: tuple[str, ...]


@dataclass(frozen=True)
class _Entry:
    file: str
    name: str
    base: str | None
    candidate: int | None
    values: dict[str, Any]  # the fields the entry sets, its header's server and version included


def _error(file: str, message: str) -> ValueError:
    return ValueError(f"serving profile file {file}: {message}")


def _toml_type(value: Any) -> str:
    return next((n for t, n in TOML_TYPES.items() if type(value) is t), f"a {type(value).__name__}")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise _error(path.name, f"not TOML: {' '.join(str(e).split())}") from None
    unknown = [k for k in data if k not in FILE_KEYS]
    if unknown:
        raise _error(path.name, f"unknown key {unknown[0]!r}; known: {', '.join(FILE_KEYS)}")
    return data


def _string(file: str, where: str, key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise _error(file, f"{where}: {key} = {_shown(value)} is {_toml_type(value)}, expected a string")
    return value


def _name(file: str, what: str, value: Any) -> str:
    if value is None:
        raise _error(file, f"{what} has no name")
    name = _string(file, what, "name", value)
    if not NAME.match(name):
        raise _error(file, f"{what} {name!r}: names are lowercase letters, digits, '.', '-', '_'")
    if name in RESERVED:
        raise _error(file, f"{what} {name!r} is reserved (--serving {name})")
    return name


def _header(file: str, data: dict[str, Any]) -> dict[str, str]:
    header = data.get("header")
    if not isinstance(header, dict):
        raise _error(file, "no [header] table (server, version, source, notes)")
    unknown = [k for k in header if k not in HEADER_KEYS]
    if unknown:
        raise _error(file, f"[header]: unknown key {unknown[0]!r}; known: {', '.join(HEADER_KEYS)}")
    missing = [k for k, required in HEADER_KEYS.items() if required and k not in header]
    if missing:
        raise _error(file, f"[header]: no {missing[0]}")
    return {k: _string(file, "[header]", k, v) for k, v in header.items()}


def _field_value(file: str, where: str, key: str, value: Any) -> Any:
    """``value`` for the profile field ``key``, checked: the field's type, and one of its choices when it has some."""
    want = field_type(key)
    if type(value) is not want:
        raise _error(file, f"{where}: {key} = {_shown(value)} is {_toml_type(value)}, expected {TOML_TYPES[want]}")
    allowed = CHOICES.get(key)
    if allowed is not None and value not in allowed:
        raise _error(file, f"{where}: {key} = {_shown(value)}; known: {', '.join(allowed)}")
    return value


def _candidate(file: str, where: str, value: Any) -> int | None:
    if value is not None and (type(value) is not int or value < 0):
        raise _error(file, f"{where}: candidate = {_shown(value)} is {_toml_type(value)}, expected a rank "
                           "(an integer >= 0)")
    return value


def _entry(file: str, header: dict[str, str], raw: Any, k: int) -> _Entry:
    """The ``k``-th ``[[profiles]]`` entry of ``file``, every key checked."""
    if not isinstance(raw, dict):
        raise _error(file, f"profiles[{k}] is {_toml_type(raw)}, expected a table ([[profiles]])")
    name = _name(file, f"profiles[{k}]", raw.get("name"))
    where = f"profile {name}"
    unknown = [key for key in raw if key not in ENTRY_KEYS and key not in FIELDS]
    if unknown:
        hint = " (set in [header])" if unknown[0] in HEADER_FIELDS else ""
        raise _error(file, f"{where}: unknown key {unknown[0]!r}{hint}")
    base = raw.get("base")
    values = {key: _field_value(file, where, key, v) for key, v in raw.items() if key in FIELDS}
    return _Entry(file, name, None if base is None else _string(file, where, "base", base),
                  _candidate(file, where, raw.get("candidate")), {**values, **{f: header[f] for f in HEADER_FIELDS}})


def _file_entries(file: str, data: dict[str, Any]) -> list[_Entry]:
    header = _header(file, data)
    raw = data.get("profiles", [])
    if not isinstance(raw, list):
        raise _error(file, f"profiles is {_toml_type(raw)}, expected an array of tables ([[profiles]])")
    return [_entry(file, header, r, k) for k, r in enumerate(raw)]


def _file_aliases(file: str, data: dict[str, Any]) -> dict[str, str]:
    raw = data.get("aliases", {})
    if not isinstance(raw, dict):
        raise _error(file, f"aliases is {_toml_type(raw)}, expected a table ([aliases])")
    return {_name(file, "alias", alias): _string(file, f"alias {alias}", "target", target)
            for alias, target in raw.items()}


def _add_entry(entries: dict[str, _Entry], entry: _Entry) -> None:
    first = entries.get(entry.name)
    if first is not None:
        where = "this file" if first.file == entry.file else first.file
        raise _error(entry.file, f"profile {entry.name} is defined twice (also in {where})")
    entries[entry.name] = entry


def _add_alias(aliases: dict[str, tuple[str, str]], file: str, alias: str, target: str) -> None:
    if alias in aliases:
        raise _error(file, f"alias {alias} is defined twice (also in {aliases[alias][1]})")
    aliases[alias] = (target, file)


def _resolved(name: str, entries: dict[str, _Entry], done: dict[str, dict[str, Any]],
              chain: tuple[str, ...] = ()) -> dict[str, Any]:
    """The fields of profile ``name``: its base's (resolved first), then its own."""
    if name in done:
        return done[name]
    entry = entries[name]
    if name in chain:
        raise _error(entry.file, f"profile {name}: base cycle {' -> '.join((*chain, name))}")
    inherited: dict[str, Any] = {}
    if entry.base is not None:
        if entry.base not in entries:
            raise _error(entry.file, f"profile {name}: unknown base {entry.base!r} (a base names a profile, "
                                     "not an alias)")
        inherited = _resolved(entry.base, entries, done, (*chain, name))
    done[name] = {**inherited, **entry.values}
    return done[name]


def _build(entry: _Entry, values: dict[str, Any]) -> ServingProfile:
    try:
        return ServingProfile(entry.name, **values)
    except (TypeError, ValueError) as e:
        raise _error(entry.file, str(e)) from None


def _checked_aliases(aliases: dict[str, tuple[str, str]], entries: dict[str, _Entry]) -> dict[str, str]:
    for alias, (target, file) in aliases.items():
        if alias in entries:
            raise _error(file, f"alias {alias} is also a profile name (in {entries[alias].file})")
        if target not in entries:
            raise _error(file, f"alias {alias} points to {target!r}, which is no profile")
    return {alias: target for alias, (target, _) in aliases.items()}


def _check_stream_profiles(profiles: dict[str, ServingProfile], entries: dict[str, _Entry]) -> None:
    """A ``stream_profile`` names a streaming profile (not an alias, not itself)."""
    for name, p in profiles.items():
        target = profiles.get(p.stream_profile) if p.stream_profile else None
        if p.stream_profile and (target is None or not target.streaming or target is p):
            raise _error(entries[name].file, f"profile {name}: stream_profile {p.stream_profile!r} is no streaming "
                                             "profile")


def _candidates(entries: dict[str, _Entry]) -> tuple[str, ...]:
    ranked: dict[int, str] = {}
    for e in entries.values():
        if e.candidate is not None and e.candidate in ranked:
            raise _error(e.file, f"profile {e.name}: candidate = {e.candidate} is also {ranked[e.candidate]}'s rank")
        if e.candidate is not None:
            ranked[e.candidate] = e.name
    return tuple(ranked[k] for k in sorted(ranked))


def read_profiles(folder: str | Path | None = None) -> ProfileSet:
    """Every profile, alias and candidate of the ``*.toml`` files of ``folder`` (default: the package's
    ``profiles/``), read in sorted order and checked (ValueError: one line naming the file)."""
    folder = PROFILE_DIR if folder is None else Path(folder)
    paths = sorted(folder.glob("*.toml"))
    if not paths:
        raise ValueError(f"serving profile folder {folder}: no *.toml files")
    entries: dict[str, _Entry] = {}
    aliases: dict[str, tuple[str, str]] = {}
    for path in paths:
        data = _read_toml(path)
        for entry in _file_entries(path.name, data):
            _add_entry(entries, entry)
        for alias, target in _file_aliases(path.name, data).items():
            _add_alias(aliases, path.name, alias, target)
    done: dict[str, dict[str, Any]] = {}
    profiles = {name: _build(e, _resolved(name, entries, done)) for name, e in entries.items()}
    _check_stream_profiles(profiles, entries)
    candidates = _candidates(entries)
    order = [*candidates, *(n for n in profiles if n not in candidates)]
    return ProfileSet({n: profiles[n] for n in order}, _checked_aliases(aliases, entries), candidates)


def load_profiles(folder: str | Path | None = None) -> tuple[dict[str, ServingProfile], dict[str, str]]:
    """``(profiles, aliases)`` of ``folder`` (:func:`read_profiles`): name -> profile, alias -> name."""
    loaded = read_profiles(folder)
    return loaded.profiles, loaded.aliases
