"""Which records a diff run compares: a simulated benchmark, engine + API records, or API records alone.

``resolve_diff_inputs`` turns the options of a diff run (the parameters of notebook 02) into the files
the reconstruction and the diff read, written under one inputs folder:

- ``simulate``: a labelled benchmark from the bundled conversations (``api.jsonl``, ``engine.jsonl``,
  ``labels.parquet``, see :mod:`kimi_eagle.diff.simulate`);
- ``engine_path`` and ``api_path``: the first ``sample_size`` API records and their engine records
  (a ``kimi-eagle serve`` log is first cut down to the engine record of each stored response);
- ``api_path`` alone: the first ``sample_size`` API records; billing is then the only evidence.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from kimi_eagle.data_kinds import REAL, SIMULATED, TOY, model_kind, settle
from kimi_eagle.diff.run import sample_pair
from kimi_eagle.diff.simulate import (
    DEFAULT_FORMAT,
    DEFAULT_SOURCES,
    Sample,
    load_source_records,
    simulate_samples,
    write_samples,
)
from kimi_eagle.io import read_jsonl, write_jsonl
from kimi_eagle.reconstruct.source import api_source
from kimi_eagle.tokenize.tokenizer import Tokenizer


@dataclass(frozen=True)
class DiffInputOptions:
    """Where a diff run's records come from.

    ``simulate``: build the labelled benchmark from ``sources``; else ``api_path`` (API records) is
    required, with ``engine_path`` (engine records) when engine IDs exist. ``sample_size``: records per
    injected effect when simulating, else the first N API records; ``None`` for all.
    """

    simulate: bool = True
    engine_path: str | Path | None = None
    api_path: str | Path | None = None
    sources: Sequence[str] = DEFAULT_SOURCES
    format_name: str = DEFAULT_FORMAT
    sample_size: int | None = 10
    seed: int = 0


@dataclass
class DiffInputs:
    """The files a diff run reads: ``engine`` and ``labels`` are ``None`` when there are none."""

    api: Path
    engine: Path | None
    labels: Path | None
    data: str  # "simulated" or "real"
    samples: list[Sample] = field(default_factory=list)  # the simulated records (empty for real data)


def delivered_engine_records(engine_log: str | Path, responses: str | Path) -> list[dict[str, Any]]:
    """The engine record of each stored response, in the order of ``responses`` (exactly one per ``ok`` record).

    A retried or resumed request can leave several engine records with the same id (a reply
    sampled after the client had timed out, or stored by a collector that was then killed); the
    one that belongs to a stored response is the one whose ``response_id`` is that response's ``id``.
    """
    by_response = {line.obj.get("response_id"): line.obj for line in read_jsonl(engine_log) if isinstance(line.obj, dict)}
    out = []
    for line in read_jsonl(responses):
        rec = line.obj
        if isinstance(rec, dict) and rec.get("status") == "ok":
            engine = by_response.get((rec.get("response") or {}).get("id"))
            if engine is not None:
                out.append(engine)
    return out


def is_serve_log(engine_path: str | Path) -> bool:
    """Whether ``engine_path`` is a ``kimi-eagle serve`` log (its records name the ``response_id`` they answered)."""
    return any(isinstance(ln.obj, dict) and "response_id" in ln.obj for ln in read_jsonl(engine_path))


def first_api_records(api_path: str | Path, n: int | None, out_path: Path) -> Path:
    """The first ``n`` non-blank lines of ``api_path`` (all for ``None`` or 0), byte for byte, in ``out_path``."""
    lines = [ln for ln in Path(api_path).read_bytes().splitlines(keepends=True) if ln.strip()]
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_bytes(b"".join(lines[:n] if n else lines))
    return out_path


def resolve_diff_inputs(options: DiffInputOptions, tok: Tokenizer, inputs_dir: str | Path) -> DiffInputs:
    """The API, engine and label files of a diff run, written under ``inputs_dir``.

    ValueError when neither ``simulate`` nor ``api_path`` is set, or ``engine_path`` comes without ``api_path``.
    """
    inputs_dir = Path(inputs_dir)
    if options.simulate:
        records = load_source_records(options.sources)
        samples = simulate_samples(records, tok, options.format_name, per_effect=options.sample_size, seed=options.seed)
        paths = write_samples(samples, inputs_dir)
        return DiffInputs(paths["api"], paths["engine"], paths["labels"], "simulated", samples)
    if not options.api_path:
        raise ValueError("set api_path (the API records the engine records belong to)" if options.engine_path
                         else "set api_path (API records), or simulate=True")
    if options.engine_path:
        engine_path = options.engine_path
        if is_serve_log(engine_path):  # keep the engine record of each stored response (retries leave others)
            delivered = delivered_engine_records(engine_path, options.api_path)
            engine_path = write_jsonl(inputs_dir / "engine_delivered.jsonl", delivered)
        api, engine = sample_pair(options.api_path, engine_path, options.sample_size, inputs_dir)
        return DiffInputs(api, engine, None, "real")
    return DiffInputs(first_api_records(options.api_path, options.sample_size, inputs_dir / "api.jsonl"), None, None, "real")


def engine_model(path: str | Path | None, look: int = 1000) -> str | None:
    """The model the engine records name (their ``model`` field, as ``kimi-eagle generate``, ``serve`` and tiny-kimi
    write it; the first of the first ``look`` records naming one), or None."""
    from itertools import islice

    for line in islice(read_jsonl(path), look) if path else ():
        model = line.obj.get("model") if not line.error and isinstance(line.obj, dict) else None
        if isinstance(model, str) and model:
            return model
    return None


def inputs_data_kind(inputs: DiffInputs, tokenizer_dir: str | Path, stated: str | None = None
                     ) -> tuple[str, str | None]:
    """``(kind, note)``: the data kind of a diff run's inputs (notebook 02), from their provenance: ``simulated`` for
    the labelled benchmark, ``toy`` when the tokenizer, the engine records' model or the model the API records name
    is a toy model's (stories260K, tiny-kimi), else ``real``. ``stated`` (the notebook's ``data_kind``) overrides it
    only towards caution (:func:`kimi_eagle.data_kinds.settle`: ValueError for ``real`` on simulated or toy inputs;
    ``note`` says what a more cautious one overrode)."""
    model = engine_model(inputs.engine)
    if inputs.data == SIMULATED:
        kind, why = SIMULATED, "a benchmark simulated from the bundled conversations"
    elif model_kind(str(tokenizer_dir)) == TOY:
        kind, why = TOY, f"the tokenizer {tokenizer_dir} is a toy model's"
    elif model and model_kind(model) == TOY:
        kind, why = TOY, f"the engine records name the toy model {model!r}"
    elif (source := api_source(inputs.api))["data"] == TOY:  # a toy model's answers, e.g. tiny-kimi's, billing-only
        kind, why = TOY, source["data_from"]
    else:
        kind, why = REAL, "no simulated benchmark and no toy tokenizer or engine model"
    return settle(stated, kind, why, option="data_kind")
