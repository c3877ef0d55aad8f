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


def token_ids(values: Any, what: str = "input_ids", n_vocab: int | None = None) -> list[int]:
    """``values`` as a list of token IDs: integers (not bools, not floats such as 5.9), >= 0 and, with ``n_vocab``,
    below it. Raises ValueError naming the first bad one and its position; nothing is coerced."""
    if not isinstance(values, (list, tuple)) and not hasattr(values, "tolist"):
        raise ValueError(f"{what} must be a list of token IDs, got {type(values).__name__}")
    out = list(values.tolist() if hasattr(values, "tolist") else values)
    for i, v in enumerate(out):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{what}[{i}] = {v!r} is {type(v).__name__}, not an integer token ID"[:200])
        if v < 0 or (n_vocab is not None and v >= n_vocab):
            bound = f"[0, {n_vocab})" if n_vocab is not None else ">= 0"
            raise ValueError(f"{what}[{i}] = {v} is outside the vocabulary {bound}"[:200])
    return out


def check_prompts(prompts: Sequence[tuple[str, list[int]]], n_vocab: int) -> None:
    """Every prompt's IDs are token IDs of a model with ``n_vocab`` rows (ValueError naming the prompt)."""
    for pid, ids in prompts:
        try:
            token_ids(ids, "prompt_ids", n_vocab)
        except ValueError as e:
            raise ValueError(f"prompt {pid!r}: {e}") from None
        if not ids:
            raise ValueError(f"prompt {pid!r}: no prompt IDs")


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
        ids = token_ids(obj["input_ids"], "input_ids")
        mask = list(obj["loss_mask"]) if obj.get("loss_mask") is not None else [1] * len(ids)
        bad = next((i for i, m in enumerate(mask) if isinstance(m, bool) or m not in (0, 1)), None)
        if bad is not None:
            raise ValueError(f"loss_mask[{bad}] = {mask[bad]!r} is not 0 or 1"[:200])
    else:
        completion = obj.get("completion_ids", obj.get("output_ids"))
        if completion is None:
            raise ValueError("row has no input_ids, completion_ids or output_ids")
        prompt = token_ids(obj.get("prompt_ids") or [], "prompt_ids")
        completion = token_ids(completion, "completion_ids" if "completion_ids" in obj else "output_ids")
        ids, mask = prompt + completion, [0] * len(prompt) + [1] * len(completion)
    if len(ids) != len(mask):
        raise ValueError(f"input_ids ({len(ids)}) and loss_mask ({len(mask)}) differ in length")
    if len(ids) < 2:
        raise ValueError("row has fewer than 2 tokens")
    if not any(mask):
        raise ValueError("row has no supervised tokens")
    return Row(rid, ids, [int(m) for m in mask])


LITERAL_MARKER_REASON = "flag literal_marker: marker text that may have been special tokens (keep_literal_marker keeps it)"
DROPPED_BY_SERVER_REASON = ("flag dropped_by_server: the server dropped a cut tool call, so the IDs after the "
                            "last known byte are unknown")
ANSWER_EMPTY_REASON = ("flag answer_empty: the server returned none of the answer, so the model's completion IDs "
                       "are unknown")


def load_rows(path: str | Path, keep_literal_marker: bool = False,
              target: str | Path | None = None) -> tuple[list[Row], list[dict]]:
    """Rows from ``.parquet`` (reconstructed rows) or ``.jsonl``; returns ``(rows, skipped)`` where every
    unusable record is in ``skipped`` as ``{index, id, reason}``. Rows flagged ``literal_marker`` (text
    that spells ``</think>``, ``<|im_end|>`` …, which the model may have emitted as special tokens) are
    skipped unless ``keep_literal_marker``; rows flagged ``dropped_by_server`` (a cut tool call the server
    dropped: the model's IDs after the last known byte are unknown) and ``answer_empty`` (the server returned
    none of the answer) are always skipped. ``target``: when that model directory has a ``kimi_ids.json``
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
            flags = list(obj.get("flags") or ()) if isinstance(obj, dict) else []
            if not keep_literal_marker and "literal_marker" in flags:
                raise ValueError(LITERAL_MARKER_REASON)
            if "dropped_by_server" in flags:
                raise ValueError(DROPPED_BY_SERVER_REASON)
            if "answer_empty" in flags:
                raise ValueError(ANSWER_EMPTY_REASON)
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

    from kimi_eagle.eagle3.drafter_base import target_config

    target_config(path)  # a wrong-typed size is named by file and field before transformers reads it (issue 48)
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
    """Runs the target's base model once per batch and returns ``(aux [B,T,nH], final [B,T,H])`` for ``n`` layer
    ids (EAGLE-3's 3, DFlash's 5: :mod:`kimi_eagle.eagle3.dflash_config`).

    Forward hooks record only the requested block outputs; the LM head is never run.
    """

    def __init__(self, model, layer_ids: Sequence[int]):
        self.model = model
        self.base = model.model
        self.layer_ids = check_layer_ids(layer_ids, len(self.base.layers), count=None)  # EAGLE-3: 3, DFlash: 5
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
