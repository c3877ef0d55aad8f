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
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# name parts that mark a secret: api_key, hf_token, client_secret, password ... (but not tokenizer, max_tokens)
SECRET_PARTS = {"key", "apikey", "token", "secret", "password", "passwd", "pwd", "credential", "credentials", "auth"}
SECRET_VALUE = re.compile(r"^(sk-[A-Za-z0-9_-]{16,}|Bearer\s+\S{16,}|hf_[A-Za-z0-9]{20,}|gh[pous]_[A-Za-z0-9]{20,})$")
RESERVED = {"output_dir"}
GRID_KEYS = {"notebook", "fixed", "sweep", "runs"}
MAX_NAME = 80


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
    path = Path(path)
    try:
        spec = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise GridError(f"{path}: not valid YAML: {e}") from None
    grid = expand(spec, source=str(path))
    notebook = spec.get("notebook")
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

    runs: list[Run] = []
    if sweep or not explicit:
        keys = list(sweep)
        for combo in itertools.product(*(sweep[k] for k in keys)):
            own = dict(zip(keys, combo))
            runs.append(Run(run_name(own), {**fixed, **own}))
    for i, entry in enumerate(explicit):
        entry = dict(_mapping(entry, f"{source}: runs[{i}]"))
        name = entry.pop("_name", None)
        runs.append(Run(_safe(str(name)) if name is not None else run_name(entry), {**fixed, **entry}))

    counts = Counter(r.name for r in runs)  # derived names that collide (paths with one basename) get a digest
    runs = [Run(f"{r.name}-{_digest(r.params)}", r.params) if counts[r.name] > 1 else r for r in runs]
    seen: dict[str, int] = {}
    for i, run in enumerate(runs):
        if run.name in seen:
            raise GridError(f"{source}: runs {seen[run.name]} and {i} are the same run {run.name!r}; "
                            "give explicit runs distinct parameters or a `_name`")
        seen[run.name] = i
    return Grid(runs)


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
        for name, value in run.params.items():
            where = f"run {run.name!r}: parameter {name!r}"
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
    return {str(k): v for k, v in value.items()}


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
