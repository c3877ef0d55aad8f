"""Where a reconstruction's API records came from, as a data kind that travels inside the reconstruction (#46).

A reconstruction holds token IDs, billed counts and the provider of each record, never the model that answered nor
the address the answers were collected from; ``billing`` on tiny-kimi's collected answers (reconstructed with
Kimi's tokenizer) therefore called them real data. :func:`api_source` reads what the API records say of their
source (the first :data:`LOOK` records): the model each names (``response.model``, else ``request.model``), the
``base_url`` ``kimi-eagle collect`` stores with each record, and the provider of ``kimi-eagle serve``'s answers.
``reconstruct`` writes it into the parquet's schema metadata (:data:`SOURCE_KEY`, JSON; :func:`source_metadata`), so
it goes wherever the file goes, and ``billing`` reads it back (:func:`reconstruction_source`).

Kinds, first match wins: ``toy`` when a record names a toy model (stories260K, tiny-kimi:
:func:`kimi_eagle.data_kinds.model_kind`); ``stand-in: <model> served locally`` when a record was collected from a
server on this machine (:func:`kimi_eagle.data_kinds.provider_kind`) or served by ``kimi-eagle serve`` (its
provider :data:`LOCAL_PROVIDER`); else ``real``.

>>> kind_of_records([{"request": {"model": "tiny-kimi-3fa2"}, "base_url": "http://127.0.0.1:8000/v1"}])["data"]
'toy'
>>> kind_of_records([{"request": {"model": "m"}, "base_url": "http://127.0.0.1:8000/v1"}])["data"]
'stand-in: m served locally'
>>> kind_of_records([{"request": {"model": "moonshotai/kimi-k2.5"}, "base_url": "https://openrouter.ai/api/v1"}])["data"]
'real'
"""
from __future__ import annotations

import json
from itertools import islice
from pathlib import Path
from typing import Any, Iterable

from kimi_eagle.data_kinds import REAL, TOY, meta_kind, model_kind, provider_kind, stand_in

SOURCE_KEY = b"kimi_eagle.source"
LOOK = 1000  # records read for the source (as kimi_eagle.diff.inputs.engine_model reads engine records)
LOCAL_PROVIDER = "kimi-eagle-local"  # the provider kimi_eagle.apps.api.server stamps its answers with by default


def _record_fields(obj: Any) -> tuple[str | None, str | None, str | None]:
    """``(model, base_url, provider)`` an API record names (None for each it does not)."""
    if not isinstance(obj, dict):
        return None, None, None
    response = obj.get("response") if isinstance(obj.get("response"), dict) else {}
    request = obj.get("request") if isinstance(obj.get("request"), dict) else {}
    model = next((m for m in (response.get("model"), request.get("model"), obj.get("model"))
                  if isinstance(m, str) and m), None)
    base_url = obj.get("base_url") if isinstance(obj.get("base_url"), str) else None
    provider = response.get("provider") if isinstance(response.get("provider"), str) else None
    return model, base_url, provider


def kind_of_records(records: Iterable[Any]) -> dict[str, str]:
    """``{"data", "data_from", "model"?, "base_url"?}``: the data kind of API ``records`` and why (module doc)."""
    first_model, local = None, None
    for obj in records:
        model, base_url, provider = _record_fields(obj)
        first_model = first_model or model
        if model and model_kind(model) == TOY:
            return {"data": TOY, "data_from": f"its API records name the toy model {model!r}", "model": model}
        if local is None and base_url and provider_kind(base_url, "") != REAL:
            local = {"data": provider_kind(base_url, model or ""), "base_url": base_url,
                     "data_from": f"its API records were collected from {base_url}, a server on this machine"}
        elif local is None and provider == LOCAL_PROVIDER:
            local = {"data": stand_in(f"{model or 'a local model'} served locally"),
                     "data_from": f"its API records were served by `kimi-eagle serve` (provider {provider!r})"}
    if local is not None:
        return {**local, **({"model": first_model} if first_model else {})}
    return {"data": REAL, "data_from": "its API records name no toy model and no server on this machine",
            **({"model": first_model} if first_model else {})}


def api_source(path: str | Path, look: int = LOOK) -> dict[str, str]:
    """:func:`kind_of_records` of the first ``look`` records of the JSONL ``path`` (lines that are not JSON skipped)."""
    from kimi_eagle.io import read_jsonl

    return kind_of_records(line.obj for line in islice(read_jsonl(path), look) if not line.error)


def source_metadata(source: dict[str, str]) -> dict[bytes, bytes]:
    """The parquet schema metadata that carries ``source`` (:func:`api_source`)."""
    return {SOURCE_KEY: json.dumps(source, sort_keys=True).encode("utf-8")}


def reconstruction_source(path: str | Path) -> dict[str, str] | None:
    """The source a reconstruction's metadata records (its ``data`` a kind of the vocabulary), or None: a
    reconstruction written before #46 or by another tool, or a file that is not parquet."""
    import pyarrow.parquet as pq

    try:
        raw = (pq.read_schema(path).metadata or {}).get(SOURCE_KEY)
        source = json.loads(raw) if raw else None
    except (OSError, ValueError):
        return None
    return source if isinstance(source, dict) and meta_kind(source) else None
