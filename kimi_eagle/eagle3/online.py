"""Online hidden states: the frozen target runs beside the drafter and nothing is stored.

:class:`OnlineHiddenStates` reads training rows (the inputs of ``kimi-eagle extract``: reconstructed
``.parquet``, engine records or ``{input_ids, loss_mask}`` JSONL) and computes the target's auxiliary and
final hidden states when a batch is asked for — the same tensors :class:`~kimi_eagle.eagle3.hidden.HiddenStates`
returns from shards, in float32 and without the storage rounding. ``kimi-eagle train --online`` uses it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, Sequence

import torch

from kimi_eagle.eagle3.hidden import Extractor, Row, batches_by_length, load_rows, load_target, pad_batch
from kimi_eagle.eagle3.layers import check_layer_ids, default_layer_ids


class OnlineHiddenStates:
    """Rows of ``data`` with the target's ``aux`` [T,3H] and ``final`` [T,H] computed on demand.

    The interface of :class:`~kimi_eagle.eagle3.hidden.HiddenStates` (``len``, ``[i]``, ``layer_ids``,
    ``manifest["vocab_size"]``, ``row_ids``) plus :meth:`batch` (one padded target forward for several
    rows) and :meth:`token_rows` (ids and masks without running the target).
    """

    def __init__(self, target: str | Path, data: str | Path | Sequence[Row], layer_ids: Sequence[int] | None = None,
                 max_tokens: int = 4096, model=None):
        self.model = model if model is not None else load_target(target)
        n_layers = self.model.config.num_hidden_layers
        self.layer_ids = tuple(check_layer_ids(layer_ids, n_layers) if layer_ids is not None else default_layer_ids(n_layers))
        if isinstance(data, (str, Path)):
            self.rows, skipped = load_rows(data, target=target)  # a row-mapped target's rows (row_space)
        else:
            self.rows, skipped = list(data), []
        max_len = int(getattr(self.model.config, "max_position_embeddings", 1 << 30))
        self.rows = [Row(r.id, r.input_ids[:max_len], r.loss_mask[:max_len]) for r in self.rows]
        self.row_ids = [r.id for r in self.rows]
        self.max_tokens = max_tokens
        self.manifest = {"source": "online", "target": str(target), "layer_ids": list(self.layer_ids),
                         "hidden_size": self.model.config.hidden_size, "vocab_size": self.model.config.vocab_size,
                         "n_rows": len(self.rows), "skipped": skipped}
        self._extractor = Extractor(self.model, self.layer_ids)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.batch([i])[0]

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return (self[i] for i in range(len(self)))

    def lengths(self) -> list[int]:
        return [len(r.input_ids) for r in self.rows]

    def token_rows(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(input_ids, loss_mask)`` of every row, without running the target (draft-vocabulary counts)."""
        return ((torch.tensor(r.input_ids), torch.tensor(r.loss_mask, dtype=torch.uint8)) for r in self.rows)

    def batch(self, indices: Sequence[int]) -> list[dict[str, torch.Tensor]]:
        """The rows ``indices`` in order, their hidden states from right-padded target forwards of at most
        ``max_tokens`` tokens each (causal attention keeps every real position exact)."""
        rows = [self.rows[i] for i in indices]
        out: list[dict[str, torch.Tensor]] = [None] * len(rows)  # type: ignore[list-item]
        for group in batches_by_length([len(r.input_ids) for r in rows], self.max_tokens):
            input_ids, attn = pad_batch([rows[j].input_ids for j in group])
            aux, final = self._extractor(input_ids, attn)
            for b, j in enumerate(group):
                n = len(rows[j].input_ids)
                out[j] = {"input_ids": input_ids[b, :n].clone(), "loss_mask": torch.tensor(rows[j].loss_mask, dtype=torch.uint8),
                          "aux": aux[b, :n].clone(), "final": final[b, :n].clone()}
        return out

    def close(self) -> None:
        self._extractor.close()
