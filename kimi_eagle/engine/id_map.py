"""The map between a small model's output rows and the Kimi token IDs they stand for.

A tiny model over Kimi IDs (kimi_eagle.apps.tiny_kimi) has one embedding/logit row per Kimi ID it
knows, not 163,840. ``IdMap`` is that explicit correspondence, saved beside the weights as
``kimi_ids.json`` (``{"kind", "n_rows", "kimi_ids": [row 0's Kimi ID, row 1's, ...]}``): the engine
turns prompt Kimi IDs into rows before the model sees them and sampled rows back into Kimi IDs, so
everything outside the model (engine records, responses, diffs) speaks real Kimi IDs.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Sequence

from kimi_eagle.io import write_json

ID_MAP_FILE = "kimi_ids.json"
ID_MAP_KIND = "kimi-eagle model-row <-> Kimi-ID map"
MANIFEST_FILE = "manifest.json"  # a tiny-kimi directory's manifest (kimi_eagle.apps.tiny_kimi)
MANIFEST_KIND = "kimi-eagle tiny-kimi"


class IdMapError(ValueError):
    """An ID the map does not hold, or a map file that is not a valid map."""


class IdMap:
    """Row ``r`` of the model is Kimi ID ``kimi_ids[r]``; the IDs are distinct and sorted ascending."""

    def __init__(self, kimi_ids: Iterable[int]) -> None:
        ids = [int(i) for i in kimi_ids]
        if not ids:
            raise IdMapError("an ID map needs at least one ID")
        if any(b <= a for a, b in zip(ids, ids[1:])):
            raise IdMapError("the Kimi IDs of an ID map must be distinct and ascending")
        if ids[0] < 0:
            raise IdMapError(f"negative Kimi ID {ids[0]}")
        self.kimi_ids: list[int] = ids
        self.row_by_kimi_id: dict[int, int] = {k: r for r, k in enumerate(ids)}

    def __len__(self) -> int:
        return len(self.kimi_ids)

    def __contains__(self, kimi_id: object) -> bool:
        return kimi_id in self.row_by_kimi_id

    def to_rows(self, kimi_ids: Sequence[int]) -> list[int]:
        """Model rows of ``kimi_ids``; an ID the model has no row for raises ``IdMapError`` naming it."""
        rows = []
        for i in kimi_ids:
            row = self.row_by_kimi_id.get(i)
            if row is None:
                raise IdMapError(f"Kimi ID {i} is outside this model's vocabulary of {len(self)} IDs")
            rows.append(row)
        return rows

    def to_kimi(self, rows: Sequence[int]) -> list[int]:
        """Kimi IDs of model ``rows`` (each in ``range(len(self))``)."""
        n = len(self.kimi_ids)
        out = []
        for r in rows:
            if not 0 <= r < n:
                raise IdMapError(f"row {r} is outside the map's {n} rows")
            out.append(self.kimi_ids[r])
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"kind": ID_MAP_KIND, "n_rows": len(self), "kimi_ids": self.kimi_ids}

    def save(self, model_dir: str | Path) -> Path:
        """Write ``model_dir/kimi_ids.json`` atomically."""
        return write_json(Path(model_dir) / ID_MAP_FILE, self.to_dict(), indent=None)

    @classmethod
    def load(cls, model_dir: str | Path) -> "IdMap":
        """Read ``model_dir/kimi_ids.json``; a file that is not a map raises ``IdMapError``."""
        path = Path(model_dir) / ID_MAP_FILE
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as e:
            raise IdMapError(f"{path}: not JSON ({e})") from None
        if not isinstance(data, dict) or data.get("kind") != ID_MAP_KIND or not isinstance(data.get("kimi_ids"), list):
            raise IdMapError(f"{path}: not a kimi-eagle ID map")
        ids = data["kimi_ids"]
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids) or data.get("n_rows") != len(ids):
            raise IdMapError(f"{path}: kimi_ids must be {data.get('n_rows')} integers")
        return cls(ids)

    @staticmethod
    def present(model_dir: str | Path) -> bool:
        return (Path(model_dir) / ID_MAP_FILE).is_file()
