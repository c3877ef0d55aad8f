"""Serving profiles: what one is (:class:`ServingProfile`, its fields and the values each may take, :data:`CHOICES`),
and the data files: every ``*.toml`` in this folder (``kimi_eagle/serving/profiles/``), one per server
version, read and checked once at import into :data:`PROFILES` (name -> profile), :data:`ALIASES` (alias -> name:
``vllm`` and ``sglang`` stand for the newest recorded version of each server) and :data:`CANDIDATES` (the profiles
``--serving auto`` tries, ``candidate`` in the files); :func:`get_profile` resolves a name or alias.

**Adding a server version** is one place: a new ``<server>-<major>.<minor>.toml`` here (``base`` the previous
version, only the fields whose behaviour changed, the alias moved to it), and its recorded vectors
``tests/data/servers/<server>-<major>.<minor>.*.jsonl.gz`` (``make server-vectors``). The tests that enumerate
versions read this folder; no Python changes unless the server's behaviour is new (a new field value).

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
type or outside :data:`~kimi_eagle.serving.profiles.CHOICES`, a duplicate name or alias, an unknown base, a
base cycle, an alias to no profile or shadowing one, two candidates of one rank) raises ValueError with one
line ``serving profile file X.toml: ...`` of at most :data:`MAX_MESSAGE` characters (a long key, name or value is
shown shortened). A UTF-8 byte-order mark at the start of a file (what some Windows editors write) is read past.

>>> profiles, aliases = load_profiles()
>>> aliases["vllm"], profiles["vllm-legacy"].split_on
('vllm-0.34', 'text')
"""
from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

# --------------------------------------------------------------------------------------------
# What a profile is


@dataclass(frozen=True)
class ServingProfile:
    """One serving stack's conventions around the template (each field overridable:
    :func:`kimi_eagle.serving.request.get_profile`).

    Prompt side: ``tool_declaration`` (``json`` | ``ts``); ``sort_tools`` (deep-sort every mapping of the
    tools by key first); ``history_arguments`` (``verbatim`` | ``reserialise``: parse each history call's
    argument string so the template writes it with ``tojson``); ``empty_arguments`` and
    ``invalid_arguments`` / ``nonobject_arguments`` (what re-serialising does with an empty string, with
    one that is not JSON, and with JSON that is not an object: ``verbatim``, ``empty_object`` (``{}``),
    ``parsed`` (the parsed value) or ``reject`` (the server answers HTTP 400: the record is an error)); ``drop_none_keys`` (message keys
    whose value is ``None`` are removed before rendering); ``tool_part_join`` (``None``: the template
    concatenates a tool message's text parts; a string: the server joins them with it first);
    ``part_join_roles`` (whose text parts ``tool_part_join`` joins: ``tool`` messages only | ``all``
    messages); ``empty_parts`` (``keep`` | ``drop``: text parts whose text is empty, ``None`` or missing are
    left out before joining); ``marker_text`` (``text``: special-token spellings inside request text stay
    ordinary tokens, the kit's reading | ``special``: the server tokenizes the rendered prompt whole, so each
    spelling there becomes its special token: :func:`kimi_eagle.serving.request.served_prompt_pieces`).

    Completion side: ``split_on`` (``ids``: only marker special tokens split; ``text``: the decoded text is
    split on marker spellings, as servers do); ``finish_on_section`` (``never``: ``tool_calls`` only when a
    call parsed; ``on_stop``: a tool section turns ``stop`` into ``tool_calls``; ``always``: a tool section
    makes it ``tool_calls`` whatever the stop); ``unterminated_call`` (``keep`` its arguments | ``drop``
    it); ``name_rule`` (``after_prefix``: the id minus ``functions.`` and ``:N``; ``last_dot``: the last
    dotted part); ``id_chars`` (``any`` | ``word_dot``: ids of ``[\\w.]`` only parse); ``args_object``
    (arguments must be a ``{...}`` on one line to parse); ``id_rule`` (``model``: the id written |
    ``sglang``: ``functions.NAME:{history + position}``); ``strip`` (whitespace around ids and arguments);
    ``strip_reasoning`` (reasoning and content stripped as SGLang's reasoning parser does);
    ``spaces_between_special_tokens`` (the server's detokenizer setting; carried, not read yet).

    Reconstruction: ``omit_think_end_before_tools`` and ``tool_ids`` (the
    :class:`~kimi_eagle.chat.completion.CompletionOptions` of the same names).

    Metadata (no parsing code reads it): ``server`` and ``version`` (from the profile file's header) and
    ``streaming`` (the profile describes the server's streaming path).

    ``answer_rules``: ``legacy`` (the completion-side fields above, as first transcribed) or the name of a
    server version whose answers :mod:`kimi_eagle.serving.vllm_answer` reproduces from its recorded vectors
    (``vllm-0.33``: decode with ``spaces_between_special_tokens``, the parser engine in text mode, or in ID
    mode when ``streaming``); the fields from ``split_on`` to ``strip_reasoning`` are then not read.
    ``request_rules``: ``none`` (every request the template accepts is rendered) or the server version whose
    request checks and message handling :func:`kimi_eagle.serving.request.serve_request` applies first (a request
    that server refuses is an error row naming its reason: :mod:`kimi_eagle.serving.sglang_request`,
    :mod:`kimi_eagle.serving.vllm_request`).
    ``tool_id_type``: the id vLLM makes up for a call whose header has no ``:N`` (``random``:
    ``chatcmpl-tool-<random>``, what it gives other model types; ``kimi_k2``: ``functions.HEADER:N``, N counting the
    made-up ids from 0, what it gives Kimi model types such as K2.5's ``kimi_k25``).
    ``stream_profile``: the profile of the same server's streaming path (a streamed record, one whose converted
    record has a ``stream`` entry, is reconstructed with it).
    """

    name: str
    tool_declaration: str = "json"
    sort_tools: bool = False
    history_arguments: str = "verbatim"
    empty_arguments: str = "verbatim"
    invalid_arguments: str = "verbatim"
    nonobject_arguments: str = "verbatim"
    drop_none_keys: bool = False
    tool_part_join: str | None = None
    part_join_roles: str = "tool"
    empty_parts: str = "keep"
    marker_text: str = "text"
    split_on: str = "ids"
    finish_on_section: str = "never"
    unterminated_call: str = "keep"
    name_rule: str = "after_prefix"
    id_chars: str = "any"
    args_object: bool = False
    id_rule: str = "model"
    strip: bool = False
    strip_reasoning: bool = False
    omit_think_end_before_tools: bool = False
    tool_ids: str = "auto"
    spaces_between_special_tokens: bool = False
    answer_rules: str = "legacy"
    request_rules: str = "none"
    tool_id_type: str = "random"
    stream_profile: str = ""
    server: str = ""
    version: str = ""
    streaming: bool = False

    def __post_init__(self) -> None:
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"serving profile {self.name}: {name}={getattr(self, name)!r}; "
                                 f"known: {', '.join(map(str, allowed))}")

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


CHOICES: dict[str, tuple] = {
    "tool_declaration": ("json", "ts"), "history_arguments": ("verbatim", "reserialise"),
    "empty_arguments": ("verbatim", "empty_object", "reject"),
    "invalid_arguments": ("verbatim", "empty_object", "reject"),
    "nonobject_arguments": ("verbatim", "parsed", "empty_object", "reject"),
    "part_join_roles": ("tool", "all"), "empty_parts": ("keep", "drop"), "marker_text": ("text", "special"),
    "split_on": ("ids", "text"), "finish_on_section": ("never", "on_stop", "always"),
    "unterminated_call": ("keep", "drop"), "name_rule": ("after_prefix", "last_dot"), "id_chars": ("any", "word_dot"),
    "id_rule": ("model", "sglang"), "tool_ids": ("auto", "normalise", "keep"),
    "answer_rules": ("legacy", "vllm-0.33", "sglang-0.5"),
    "request_rules": ("none", "vllm-0.33", "vllm-0.34", "sglang-0.5"),
    "tool_id_type": ("random", "kimi_k2"),
}


def field_type(name: str) -> type:
    """The type a profile field's value must have: its default's (``tool_part_join``, default ``None``: ``str``)."""
    default = next(f.default for f in fields(ServingProfile) if f.name == name)
    return str if default is None else type(default)


# --------------------------------------------------------------------------------------------
# The files

PROFILE_DIR = Path(__file__).resolve().parent
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


MAX_MESSAGE = 300  # an error names the file, the key and the value shortened: one line, never the whole value


def _bounded(text: str) -> str:
    """``text`` of at most :data:`MAX_MESSAGE` characters: its start (the file, the key) and its end (what is known)."""
    return text if len(text) <= MAX_MESSAGE else f"{text[:200]} ... {text[-(MAX_MESSAGE - 205):]}"


def _error(file: str, message: str) -> ValueError:
    return ValueError(_bounded(f"serving profile file {_label(file)}: {message}"))


def _toml_type(value: Any) -> str:
    return next((n for t, n in TOML_TYPES.items() if type(value) is t), f"a {type(value).__name__}")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _label(name: str) -> str:
    """A name (a profile's, a file's) as an error shows it: at most 60 characters."""
    return name if len(name) <= 60 else name[:57] + "..."


MAX_FILE_BYTES = 1 << 20  # a profile file is a few KB; anything past 1 MiB is not one


def _read_toml(path: Path) -> dict[str, Any]:
    """A profile file's TOML: a regular file (a link followed; a folder, device, dangling link or loop refused) of at
    most :data:`MAX_FILE_BYTES`, read no further than that."""
    try:
        if not path.resolve(strict=True).is_file():
            raise _error(path.name, "not a regular file")
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except (OSError, RuntimeError) as e:  # RuntimeError: a link loop on older Pythons
        raise _error(path.name, f"cannot be read: {e.strerror if isinstance(e, OSError) and e.strerror else e}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise _error(path.name, f"larger than {MAX_FILE_BYTES:,} bytes: not a profile file")
    try:
        data = tomllib.loads(raw.decode("utf-8").removeprefix("\ufeff"))  # a BOM (Windows editors): no statement
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise _error(path.name, f"not TOML: {' '.join(str(e).split())}") from None
    except RecursionError:
        raise _error(path.name, "not TOML: nested too deeply") from None
    unknown = [k for k in data if k not in FILE_KEYS]
    if unknown:
        raise _error(path.name, f"unknown key {_shown(unknown[0])}; known: {', '.join(FILE_KEYS)}")
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
        raise _error(file, f"{what} {_shown(name)}: names are lowercase letters, digits, '.', '-', '_'")
    if name in RESERVED:
        raise _error(file, f"{what} {name!r} is reserved (--serving {name})")
    return name


def _header(file: str, data: dict[str, Any]) -> dict[str, str]:
    header = data.get("header")
    if not isinstance(header, dict):
        raise _error(file, "no [header] table (server, version, source, notes)")
    unknown = [k for k in header if k not in HEADER_KEYS]
    if unknown:
        raise _error(file, f"[header]: unknown key {_shown(unknown[0])}; known: {', '.join(HEADER_KEYS)}")
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
    where = f"profile {_label(name)}"
    unknown = [key for key in raw if key not in ENTRY_KEYS and key not in FIELDS]
    if unknown:
        hint = " (set in [header])" if unknown[0] in HEADER_FIELDS else ""
        raise _error(file, f"{where}: unknown key {_shown(unknown[0])}{hint}")
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
    return {_name(file, "alias", alias): _string(file, f"alias {_label(alias)}", "target", target)
            for alias, target in raw.items()}


def _add_entry(entries: dict[str, _Entry], entry: _Entry) -> None:
    first = entries.get(entry.name)
    if first is not None:
        where = "this file" if first.file == entry.file else first.file
        raise _error(entry.file, f"profile {_label(entry.name)} is defined twice (also in {_label(where)})")
    entries[entry.name] = entry


def _add_alias(aliases: dict[str, tuple[str, str]], file: str, alias: str, target: str) -> None:
    if alias in aliases:
        raise _error(file, f"alias {_label(alias)} is defined twice (also in {_label(aliases[alias][1])})")
    aliases[alias] = (target, file)


def _resolved(name: str, entries: dict[str, _Entry], done: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The fields of profile ``name``: its bases' (the chain walked to its root, no recursion), then its own."""
    chain: list[str] = []
    at: str | None = name
    while at is not None and at not in done:
        entry = entries[at]
        if at in chain:
            cycle = " -> ".join(map(_label, [*chain[chain.index(at):][:6], at]))
            raise _error(entry.file, f"profile {_label(at)}: base cycle {cycle}")
        chain.append(at)
        if entry.base is not None and entry.base not in entries:
            raise _error(entry.file, f"profile {_label(at)}: unknown base {_shown(entry.base)} (a base names a profile, "
                                     "not an alias)")
        at = entry.base
    inherited = done[at] if at is not None else {}
    for link in reversed(chain):
        inherited = done[link] = {**inherited, **entries[link].values}
    return done[name]


def _build(entry: _Entry, values: dict[str, Any]) -> ServingProfile:
    try:
        return ServingProfile(entry.name, **values)
    except (TypeError, ValueError) as e:
        raise _error(entry.file, str(e)) from None


def _checked_aliases(aliases: dict[str, tuple[str, str]], entries: dict[str, _Entry]) -> dict[str, str]:
    for alias, (target, file) in aliases.items():
        if alias in entries:
            raise _error(file, f"alias {_label(alias)} is also a profile name (in {_label(entries[alias].file)})")
        if target not in entries:
            raise _error(file, f"alias {_label(alias)} points to {_shown(target)}, which is no profile")
    return {alias: target for alias, (target, _) in aliases.items()}


def _check_stream_profiles(profiles: dict[str, ServingProfile], entries: dict[str, _Entry]) -> None:
    """A ``stream_profile`` names a streaming profile (not an alias, not itself)."""
    for name, p in profiles.items():
        target = profiles.get(p.stream_profile) if p.stream_profile else None
        if p.stream_profile and (target is None or not target.streaming or target is p):
            raise _error(entries[name].file, f"profile {_label(name)}: stream_profile {_shown(p.stream_profile)} is no streaming "
                                             "profile")


def _candidates(entries: dict[str, _Entry]) -> tuple[str, ...]:
    ranked: dict[int, str] = {}
    for e in entries.values():
        if e.candidate is not None and e.candidate in ranked:
            raise _error(e.file, f"profile {_label(e.name)}: candidate = {e.candidate} is also "
                                 f"{_label(ranked[e.candidate])}'s rank")
        if e.candidate is not None:
            ranked[e.candidate] = e.name
    return tuple(ranked[k] for k in sorted(ranked))


def read_profiles(folder: str | Path | None = None, extra: tuple[Path, ...] = ()) -> ProfileSet:
    """Every profile, alias and candidate of the ``*.toml`` files of ``folder`` (default: the package's
    ``profiles/``), read in sorted order, then of the ``extra`` files, checked together (ValueError: one line
    naming the file)."""
    folder = PROFILE_DIR if folder is None else Path(folder)
    if not folder.is_dir():
        raise ValueError(_bounded(f"serving profile folder {folder}: "
                                  + ("not a folder" if folder.exists() else "no such folder")))
    paths = sorted(folder.glob("*.toml"))
    if not paths:
        raise ValueError(_bounded(f"serving profile folder {folder}: no *.toml files"))
    paths += list(extra)
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


# --------------------------------------------------------------------------------------------
# The shipped profiles, loaded once

_LOADED = read_profiles()
PROFILES: dict[str, ServingProfile] = _LOADED.profiles
ALIASES: dict[str, str] = _LOADED.aliases
CANDIDATES: tuple[str, ...] = _LOADED.candidates
SERVING_CHOICES: tuple[str, ...] = (*PROFILES, *ALIASES)
_USER_FILES: dict[str, str] = {}  # a loaded profile file (resolved path) -> its first profile's name


def canonical_name(name: str) -> str:
    """The profile name ``name`` stands for (an alias resolved); ValueError for an unknown name."""
    resolved = ALIASES.get(name, name)
    if resolved not in PROFILES:
        aliases = ", ".join(f"{a} -> {n}" for a, n in ALIASES.items())
        raise ValueError(f"unknown serving profile {_shown(name)}; known: {', '.join(PROFILES)} (aliases: {aliases})")
    return resolved


def is_profile_file(name: Any) -> bool:
    """Whether ``--serving`` names a profile file (``PATH.toml``) rather than a shipped profile or alias."""
    return isinstance(name, (str, Path)) and str(name).endswith(".toml")


def load_profile_file(path: str | Path) -> ServingProfile:
    """A user's profile file (``--serving PATH.toml``), checked as the shipped ones are and together with them (its
    ``base`` may name a shipped profile; its names may not repeat one), its profiles added to :data:`PROFILES` for
    this process (forked workers inherit them); returns its first profile."""
    path = Path(path)
    key = os.path.realpath(path)  # never raises (a link loop is refused by the read below)
    if key in _USER_FILES:
        return PROFILES[_USER_FILES[key]]
    if path.name in {p.name for p in PROFILE_DIR.glob("*.toml")}:
        raise _error(path.name, "has the name of a shipped profile file; rename it")
    loaded = read_profiles(extra=(path,))
    own = [n for n in loaded.profiles if n not in PROFILES]
    if not own:
        raise _error(path.name, "defines no profile of its own")
    for n in own:
        PROFILES[n] = loaded.profiles[n]
    first = [e.get("name") for e in _read_toml(path).get("profiles", []) if isinstance(e, dict)]
    _USER_FILES[key] = next((n for n in first if n in own), own[0])
    return PROFILES[_USER_FILES[key]]


def get_profile(name: str | ServingProfile, **overrides: Any) -> ServingProfile:
    """The profile called ``name`` (a name, an alias, or a profile file ``PATH.toml``) with ``overrides`` (fields set
    to ``None`` are left as the profile has them)."""
    if is_profile_file(name):
        name = load_profile_file(name)
    base = name if isinstance(name, ServingProfile) else PROFILES[canonical_name(name)]
    unknown = set(overrides) - {f.name for f in fields(ServingProfile)}
    if unknown:
        raise ValueError(f"unknown serving profile field(s): {', '.join(sorted(unknown))}")
    changes = {k: v for k, v in overrides.items() if v is not None}
    return replace(base, **changes) if changes else base
