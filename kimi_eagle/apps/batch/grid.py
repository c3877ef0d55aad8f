"""Parameter grids for ``kimi-eagle batch``: load, expand into named runs, validate against a notebook.

A grid file (YAML)::

    notebook: ../02_bpe_diff_inspection.ipynb   # optional; relative to the grid file
    fixed: {simulate: true, sample_size: 20}    # parameters of every run
    sweep: {dataset: [glaive, sharegpt]}        # the cartesian product of these lists
    runs:                                       # and/or explicit runs, each merged over `fixed`
      - {dataset: glaive, sample_size: 5}
      - {_name: tiny, dataset: sharegpt, sample_size: 2}   # `_name` overrides the derived run name

Every run gets a readable, stable name from the parameters that distinguish it (its swept values, or
the keys of its explicit entry), e.g. ``dataset=glaive``. Validation happens before anything runs:
unknown names, wrong types, ``output_dir`` (the batch sets it) and secret-looking names or values are a
:class:`GridError` naming the run and the parameter.
"""
from __future__ import annotations

import ast
import difflib
import hashlib
import itertools
import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# name parts that mark a secret: api_key, hf_token, client_secret, password ... (but not tokenizer, max_tokens)
SECRET_PARTS = {"key", "apikey", "token", "secret", "password", "passwd", "pwd", "credential", "credentials", "auth"}
SECRET_VALUE = re.compile(r"^(sk-[A-Za-z0-9_-]{16,}|Bearer\s+\S{16,}|hf_[A-Za-z0-9]{20,}|gh[pous]_[A-Za-z0-9]{20,})$")
RESERVED = {"output_dir"}
GRID_KEYS = {"notebook", "fixed", "sweep", "runs"}
MAX_NAME = 80
# the batch's own entries in RUN_DIR: a run directory of one of these names would overwrite or shadow them
BATCH_FILES = {"batch.json", "batch.lock", "summary.parquet", "summary.html", "charts"}
NAME_MAX = 255  # bytes in one path component (Linux, macOS, Windows)
MAX_GRID_BYTES = 1 << 20  # a grid file is a page of parameters, not data
MAX_NODES = 100_000  # values in the whole grid once every alias is expanded (billion laughs stops here)
MAX_DEPTH = 32  # nesting of lists and mappings inside one value
MAX_RUNS = 10_000  # runs a grid may expand into (a sweep's product is counted before it is built)
JSON_SAFE = "str, int, float, bool, null, and lists and mappings of those"


class GridError(ValueError):
    """A grid that cannot run: bad structure, an unknown or mistyped parameter, a secret."""


@dataclass(frozen=True)
class Run:
    """One planned run: its directory name and the complete parameters passed to papermill."""

    name: str
    params: dict[str, Any] = field(hash=False)


@dataclass(frozen=True)
class Grid:
    runs: list[Run]
    notebook: Path | None = None  # the grid's own `notebook:` entry, resolved against the grid file


def load_grid(path: str | Path) -> Grid:
    """Read a grid file and expand it into named runs (no validation against a notebook yet)."""
    from kimi_eagle.apps.batch.grid_yaml import load_yaml

    path = Path(path)
    spec = load_yaml(path, max_bytes=MAX_GRID_BYTES, max_nodes=MAX_NODES, error=GridError) or {}
    grid = expand(spec, source=str(path))
    notebook = spec.get("notebook")
    if notebook is not None and not isinstance(notebook, str):
        raise GridError(f"{path}: notebook must be a path (a string), got {type(notebook).__name__}")
    return Grid(grid.runs, (path.parent / notebook).resolve() if notebook else None)


def expand(spec: dict[str, Any], source: str = "grid") -> Grid:
    """Expand ``{fixed, sweep, runs}`` into runs: the sweep's cartesian product, then the explicit runs."""
    if not isinstance(spec, dict):
        raise GridError(f"{source}: a grid is a mapping with keys {sorted(GRID_KEYS)}")
    unknown = set(spec) - GRID_KEYS
    if unknown:
        raise GridError(f"{source}: unknown grid keys {sorted(unknown)} (allowed: {sorted(GRID_KEYS)})")
    fixed = _mapping(spec.get("fixed"), f"{source}: fixed")
    sweep = _mapping(spec.get("sweep"), f"{source}: sweep")
    explicit = spec.get("runs") or []
    if not isinstance(explicit, list):
        raise GridError(f"{source}: runs must be a list of mappings")
    for key, values in sweep.items():
        if not isinstance(values, list) or not values:
            raise GridError(f"{source}: sweep.{key} must be a non-empty list of values")
    _check_params(fixed, f"{source}: fixed")
    _check_params(sweep, f"{source}: sweep")
    planned = math.prod(len(v) for v in sweep.values()) if (sweep or not explicit) else 0
    if planned + len(explicit) > MAX_RUNS:
        raise GridError(f"{source}: the grid expands into {planned + len(explicit)} runs; at most {MAX_RUNS}")

    runs: list[Run] = []
    if sweep or not explicit:
        keys = list(sweep)
        for combo in itertools.product(*(sweep[k] for k in keys)):
            own = dict(zip(keys, combo))
            runs.append(Run(run_name(own), {**fixed, **own}))
    for i, entry in enumerate(explicit):
        entry = dict(_mapping(entry, f"{source}: runs[{i}]"))
        _check_params(entry, f"{source}: runs[{i}]")
        name = entry.pop("_name", None)
        runs.append(Run(_explicit_name(name, f"{source}: runs[{i}]") if name is not None else run_name(entry),
                        {**fixed, **entry}))

    counts = Counter(r.name for r in runs)  # derived names that collide (paths with one basename) get a digest
    runs = [Run(f"{r.name}-{_digest(r.params)}", r.params) if counts[r.name] > 1 else r for r in runs]
    seen: dict[str, int] = {}
    for i, run in enumerate(runs):
        folded = run.name.lower()  # `A` and `a` are one directory on case-insensitive filesystems
        if folded in seen:
            raise GridError(f"{source}: runs {seen[folded]} and {i} are the same run {run.name!r}; "
                            "give explicit runs distinct parameters or a `_name`")
        seen[folded] = i
    return Grid(runs)


def _explicit_name(name: Any, where: str) -> str:
    """A run's own ``_name``: a string that makes a directory of its own in RUN_DIR, or a :class:`GridError`."""
    if not isinstance(name, str):
        raise GridError(f"{where}: _name must be a string, got {type(name).__name__}")
    safe = _safe(name)
    if len(safe) > MAX_NAME:
        raise GridError(f"{where}: _name is {len(safe)} characters; at most {MAX_NAME} (a directory name)")
    if safe.lower() in BATCH_FILES:
        raise GridError(f"{where}: _name {name!r} is one of the batch's own files in RUN_DIR "
                        f"({', '.join(sorted(BATCH_FILES))}); choose another name")
    return safe


def check_run_name(name: Any) -> None:
    """A run's directory name: one path component of at most 255 bytes that is none of the batch's own files."""
    if not isinstance(name, str) or _safe(name) != name:
        raise GridError(f"run name {name!r} is not a plain directory name (letters, digits, ._,=+-)")
    if len(name.encode()) > NAME_MAX:
        raise GridError(f"run name {name[:40]!r}... is {len(name.encode())} bytes; a file name has at most {NAME_MAX}")
    if name.lower() in BATCH_FILES:
        raise GridError(f"run name {name!r} is one of the batch's own files in RUN_DIR; choose another name")


def check_value(value: Any, where: str, depth: int = 0) -> None:
    """A grid value must be plain data (``JSON_SAFE``): papermill writes it into the notebook as Python source,
    so anything else (bytes, sets, dates, objects) could turn into code or change on the way."""
    if depth > MAX_DEPTH:
        raise GridError(f"{where} is nested more than {MAX_DEPTH} levels deep")
    if value is None or isinstance(value, (bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise GridError(f"{where} = {value!r} is not a finite number (grid values are JSON: {JSON_SAFE})")
        return
    if isinstance(value, str):
        if any(0xD800 <= ord(c) <= 0xDFFF for c in value):
            raise GridError(f"{where} holds a lone surrogate (not valid Unicode text)")
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            check_value(item, f"{where}[{i}]", depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise GridError(f"{where} has the key {key!r} ({type(key).__name__}); keys are strings")
            check_value(key, f"{where} key {key[:40]!r}", depth + 1)
            check_value(item, f"{where}.{key[:40]}", depth + 1)
        return
    raise GridError(f"{where} is {type(value).__name__}; grid values are plain data: {JSON_SAFE}")


def _check_params(params: dict[str, Any], where: str) -> None:
    for name, value in params.items():
        check_value(name, f"{where}: parameter name")
        check_value(value, f"{where}: parameter {name[:60]!r}")


def run_name(own: dict[str, Any]) -> str:
    """A readable, stable directory name from a run's distinguishing parameters: ``a=1__b=x``."""
    if not own:
        return "default"
    name = "__".join(f"{_safe(k)}={_safe(_short(v))}" for k, v in own.items())
    if len(name) > MAX_NAME:
        name = f"{name[:MAX_NAME - 9]}-{_digest(own)}"
    return name


def _digest(params: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:8]


def validate(runs: list[Run], declared: dict[str, dict[str, Any]], notebook: str = "notebook") -> None:
    """Check every run's parameters against the notebook's ``parameters`` cell (``papermill.inspect_notebook``).

    Raises :class:`GridError` on the first problem, naming the run and the parameter.
    """
    if not runs:
        raise GridError("the grid has no runs")
    for run in runs:
        check_run_name(run.name)
        for name, value in run.params.items():
            where = f"run {run.name!r}: parameter {name!r}"
            if not isinstance(name, str):
                raise GridError(f"run {run.name!r}: parameter name {name!r} is {type(name).__name__}, not a string")
            check_value(value, where)
            if is_secret_name(name):
                raise GridError(f"{where} looks like a secret; secrets are never grid parameters — "
                                "the notebook reads them from the environment")
            if _secret_values(value):
                raise GridError(f"{where} has a value that looks like an API key or token; "
                                "secrets are never grid parameters")
            if name in RESERVED:
                raise GridError(f"{where} is set by the batch itself (each run gets RUN_DIR/<run>/)")
            if name not in declared:
                close = difflib.get_close_matches(name, list(declared), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise GridError(f"{where} is not in {notebook}'s parameters cell "
                                f"(declared: {', '.join(declared)}){hint}")
            expected = expected_type(declared[name])
            if expected is not None and not _fits(value, expected):
                raise GridError(f"{where} = {value!r} is {type(value).__name__}, but the notebook's default "
                                f"{declared[name].get('default')} is {expected.__name__}")


def is_secret_name(name: str) -> bool:
    """``api_key``, ``hfToken``, ``client_secret``, ``password`` are secrets; ``tokenizer``, ``max_tokens`` are not."""
    parts = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()
    return any(p in SECRET_PARTS for p in re.split(r"[^a-z0-9]+", parts) if p)


def expected_type(info: dict[str, Any]) -> type | None:
    """The type a parameter must have: its annotation if papermill saw one, else its default's type.

    ``None`` (any type) when the default is ``None`` or not a literal.
    """
    annotated = str(info.get("inferred_type_name") or "None")
    if annotated not in ("None", ""):
        if "None" in annotated or "Optional" in annotated or "Any" in annotated:
            return None
        base = annotated.split("[", 1)[0].strip().lower()
        return {"int": int, "float": float, "str": str, "bool": bool, "list": list, "dict": dict,
                "tuple": list}.get(base)
    try:
        default = ast.literal_eval(str(info.get("default")))
    except (ValueError, SyntaxError):
        return None
    if default is None:
        return None
    return list if isinstance(default, tuple) else type(default)


def _fits(value: Any, expected: type) -> bool:
    if expected is bool:
        return isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, expected)


def _secret_values(value: Any) -> bool:
    if isinstance(value, str):
        return bool(SECRET_VALUE.match(value.strip()))
    if isinstance(value, dict):
        return any(is_secret_name(str(k)) or _secret_values(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_secret_values(v) for v in value)
    return False


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise GridError(f"{where} must be a mapping of parameter names to values")
    for key in value:
        if not isinstance(key, str):
            raise GridError(f"{where}: parameter name {key!r} is {type(key).__name__}; names are strings")
    return dict(value)


def _short(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(_short(v) for v in value)
    if isinstance(value, dict):
        return ",".join(f"{k}-{_short(v)}" for k, v in value.items())
    if isinstance(value, str) and "/" in value:  # a path: its last component is the readable part
        return Path(value).name or value
    return str(value).lower() if isinstance(value, bool) else str(value)


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._,=+-]+", "_", text).strip("._") or "_"
