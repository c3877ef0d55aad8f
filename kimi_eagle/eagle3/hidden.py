"""Target hidden states for EAGLE-3 training: the rows they are taken from, the target, and the forward
pass that captures 3 auxiliary block outputs plus the final hidden state.

Layer ids are **0-based block-output indices**: id ``i`` is the output of decoder block ``i`` (the
residual stream after block ``i``; HF ``output_hidden_states[i + 1]``). ``final`` is the last block's
output after the final norm, so ``target.lm_head(final)`` are the target's logits. Engines count
differently; :mod:`kimi_eagle.eagle3.layers` holds the conventions and the defaults.

The extraction loop is :func:`kimi_eagle.eagle3.extract.extract`; the on-disk layouts are
:mod:`kimi_eagle.eagle3.layouts`, their readers :mod:`kimi_eagle.eagle3.readers`.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from kimi_eagle.assets import sha256_file
from kimi_eagle.eagle3.layers import check_layer_ids
from kimi_eagle.eagle3.row_space import ID_MAP_FILE, model_ids, target_id_map
from kimi_eagle.io import read_jsonl

# ------------------------------------------------------------------------------------------
# input rows


@dataclass
class Row:
    """One training sequence: token ids and a loss mask (1 = a completion token to be predicted)."""

    id: str
    input_ids: list[int]
    loss_mask: list[int]


def row_from_obj(obj: Any, index: int) -> Row:
    """A row from ``{input_ids, loss_mask}``, a reconstructed row (``prompt_ids``, ``completion_ids``,
    ``status``) or an engine record (``prompt_ids``, ``output_ids``). Raises ValueError with a reason."""
    if not isinstance(obj, dict):
        raise ValueError("row is not an object")
    rid = str(obj.get("id", index))
    if obj.get("error") and "status" not in obj:  # an engine record that failed
        raise ValueError(f"error: {obj['error']}")
    if obj.get("status", "ok") != "ok":
        raise ValueError(f"status {obj.get('status')!r}: {obj.get('error')}")
    if "input_ids" in obj:
        ids, mask = list(obj["input_ids"]), list(obj.get("loss_mask") or [1] * len(obj["input_ids"]))
    else:
        completion = obj.get("completion_ids", obj.get("output_ids"))
        if completion is None:
            raise ValueError("row has no input_ids, completion_ids or output_ids")
        prompt = list(obj.get("prompt_ids") or [])
        ids, mask = prompt + list(completion), [0] * len(prompt) + [1] * len(completion)
    if len(ids) != len(mask):
        raise ValueError(f"input_ids ({len(ids)}) and loss_mask ({len(mask)}) differ in length")
    if len(ids) < 2:
        raise ValueError("row has fewer than 2 tokens")
    if not any(mask):
        raise ValueError("row has no supervised tokens")
    return Row(rid, [int(i) for i in ids], [1 if m else 0 for m in mask])


LITERAL_MARKER_REASON = "flag literal_marker: marker text that may have been special tokens (keep_literal_marker keeps it)"


def load_rows(path: str | Path, keep_literal_marker: bool = False,
              target: str | Path | None = None) -> tuple[list[Row], list[dict]]:
    """Rows from ``.parquet`` (reconstructed rows) or ``.jsonl``; returns ``(rows, skipped)`` where every
    unusable record is in ``skipped`` as ``{index, id, reason}``. Rows flagged ``literal_marker`` (text
    that spells ``</think>``, ``<|im_end|>`` …, which the model may have emitted as special tokens) are
    skipped unless ``keep_literal_marker``. ``target``: when that model directory has a ``kimi_ids.json``
    row map (tiny-kimi), the rows' Kimi IDs become its rows (:mod:`kimi_eagle.eagle3.row_space`); a row
    with an ID the model has no row for is skipped naming it."""
    id_map = target_id_map(target)
    path = Path(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        objs: Iterable[tuple[Any, str | None]] = ((o, None) for o in pq.read_table(path).to_pylist())
    else:
        objs = ((line.obj, line.error) for line in read_jsonl(path))
    rows, skipped = [], []
    for index, (obj, error) in enumerate(objs):
        try:
            if error:
                raise ValueError(error)
            if not keep_literal_marker and isinstance(obj, dict) and "literal_marker" in list(obj.get("flags") or ()):
                raise ValueError(LITERAL_MARKER_REASON)
            row = row_from_obj(obj, index)
            rows.append(row if id_map is None else Row(row.id, model_ids(row.input_ids, id_map), row.loss_mask))
        except (ValueError, TypeError) as e:
            rid = obj.get("id") if isinstance(obj, dict) else None
            skipped.append({"index": index, "id": None if rid is None else str(rid), "reason": str(e)})
    return rows, skipped


# ------------------------------------------------------------------------------------------
# the target and its forward pass


def load_target(path: str | Path, dtype: torch.dtype = torch.float32):
    """The HF causal LM in ``path``, in ``dtype``, in eval mode."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    model.eval()
    return model


def target_hash(path: str | Path) -> str:
    """sha256 over the target's config, weight and row-map (``kimi_ids.json``, when present) files (names and contents)."""
    path = Path(path)
    h = hashlib.sha256()
    for f in sorted(p for p in path.iterdir() if p.name in ("config.json", ID_MAP_FILE) or p.suffix == ".safetensors"):
        h.update(f"{f.name}:{sha256_file(f)}\n".encode())
    return h.hexdigest()


class Extractor:
    """Runs the target's base model once per batch and returns ``(aux [B,T,3H], final [B,T,H])``.

    Forward hooks record only the three requested block outputs; the LM head is never run.
    """

    def __init__(self, model, layer_ids: Sequence[int]):
        self.model = model
        self.base = model.model
        self.layer_ids = check_layer_ids(layer_ids, len(self.base.layers))
        self._captured: dict[int, torch.Tensor] = {}
        self._handles = [self.base.layers[i].register_forward_hook(self._hook(i)) for i in self.layer_ids]

    def close(self) -> None:
        """Remove the hooks."""
        for h in self._handles:
            h.remove()

    def _hook(self, i: int):
        def hook(_module, _inputs, output):
            self._captured[i] = output[0] if isinstance(output, tuple) else output

        return hook

    @torch.inference_mode()
    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, cache=None):
        """``cache``: an HF ``Cache`` the forward extends (positions continue after its length); None = no cache."""
        self._captured.clear()
        final = self.base(input_ids=input_ids, attention_mask=attention_mask, cache=cache,
                          use_cache=cache is not None).last_hidden_state
        aux = torch.cat([self._captured[i] for i in self.layer_ids], dim=-1)
        self._captured.clear()
        return aux, final


def pad_batch(seqs: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``(input_ids, attention_mask)``; causal attention keeps real positions exact."""
    n = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), n, dtype=torch.long)
    mask = torch.zeros(len(seqs), n, dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.tensor(s)
        mask[b, : len(s)] = 1
    return ids, mask


def batches_by_length(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Group indexes (sorted by length) so each padded batch holds at most ``max_tokens`` tokens."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    for i in order:
        if batches and lengths[i] * (len(batches[-1]) + 1) <= max_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def bytes_per_token(hidden_size: int, dtype_bytes: int = 2) -> int:
    """Payload per token: aux (3H) + final (H) values, an int64 id and a uint8 mask."""
    return 4 * hidden_size * dtype_bytes + 8 + 1
