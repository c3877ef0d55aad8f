"""Token IDs in the target model's own row space.

A target directory with a ``kimi_ids.json`` row map (tiny-kimi, :mod:`kimi_eagle.apps.tiny_kimi`) has one
embedding/logit row per Kimi ID it knows, not one per ID of the 163,840-ID vocabulary. The data the kit
collects — engine records, reconstructed rows, prompts — always holds real Kimi IDs; the target, the drafter
and everything between them (hidden-state shards, the draft vocabulary, speculative decoding) work in rows.
The map is applied once, at the boundary where rows and prompts are read (``load_rows(..., target=)``,
``evaluate.load_prompts``); a target without a map is used as it is (its IDs are its rows).
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Iterable, Sequence

from kimi_eagle.engine.id_map import ID_MAP_FILE, IdMap, IdMapError

ROW_SPACE = f"model rows ({ID_MAP_FILE}: row r is Kimi ID kimi_ids[r])"
TOKEN_SPACE = "token IDs"
NO_MODEL_ROW = "no model row"  # the reason a row or prompt with an ID outside the target's map is refused


def target_id_map(target: str | Path | None) -> IdMap | None:
    """The row map of ``target`` (``kimi_ids.json`` beside its weights), or None when it has none.
    A map file that is not a valid map raises :class:`~kimi_eagle.engine.id_map.IdMapError`."""
    if target is None or not IdMap.present(target):
        return None
    return IdMap.load(target)


def model_ids(ids: Sequence[int], id_map: IdMap | None) -> list[int]:
    """``ids`` (token IDs) as the target's inputs: their rows under ``id_map``, or themselves without one.
    An ID the map does not hold raises :class:`~kimi_eagle.engine.id_map.IdMapError` (a ValueError) naming it,
    its message starting with ``NO_MODEL_ROW``."""
    if id_map is None:
        return [int(i) for i in ids]
    try:
        return id_map.to_rows(ids)
    except IdMapError as e:
        raise IdMapError(f"{NO_MODEL_ROW}: {e}") from None


def id_space(id_map: IdMap | None) -> str:
    """What the IDs of an extraction, a drafter's vocabulary or an evaluation are: model rows or token IDs."""
    return ROW_SPACE if id_map is not None else TOKEN_SPACE


def skipped_by_reason(skipped: Iterable[dict]) -> dict[str, int]:
    """Skipped rows (``load_rows``'s ``{index, id, reason}``) counted by reason, every ``NO_MODEL_ROW`` one as one
    reason (for tiny-kimi, a canonical re-encoding of sampled text can merge its bytes into a Kimi token that never
    occurred in the model's training data, so the reconstructed row has an ID the model has no row for)."""
    return dict(Counter(NO_MODEL_ROW if str(s.get("reason", "")).startswith(NO_MODEL_ROW) else str(s.get("reason"))
                        for s in skipped))
