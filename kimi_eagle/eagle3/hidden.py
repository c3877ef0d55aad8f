"""Target hidden states for EAGLE-3 training: 3 auxiliary block outputs plus the final hidden state.

Layer ids are **0-based block-output indices**: id ``i`` is the output of decoder block ``i`` (the
residual stream after block ``i``; HF ``output_hidden_states[i + 1]``). ``final`` is the last block's
output after the final norm, so ``target.lm_head(final)`` are the target's logits. Engines count
differently; :mod:`kimi_eagle.eagle3.layers` holds the conventions and the defaults.

Storage: a directory of safetensors shards plus ``manifest.json``. Each shard holds, for its rows
concatenated along tokens: ``input_ids`` int64 [T], ``loss_mask`` uint8 [T], ``aux`` [T, 3H],
``final`` [T, H] (bf16 or fp16; or fp8 — float8_e4m3fn plus ``aux_scale`` [T, 3] and ``final_scale``
[T, 1], one fp32 absmax scale per token and layer, see :mod:`kimi_eagle.eagle3.quant`), ``offsets`` int64 [rows + 1] and ``row_index`` int64 [rows]
(the row's position in the input). Shards are written atomically and the manifest after every
shard, so an interrupted extraction resumes where it stopped. :class:`HiddenStates` reads rows
through memory-mapped safetensors (fp8 shards are dequantized on read).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import torch

from kimi_eagle.assets import sha256_file
from kimi_eagle.eagle3.layers import CONVENTION, check_layer_ids, default_layer_ids
from kimi_eagle.eagle3.quant import FP8_DTYPE, dequantize_fp8, fp8_bytes_per_token, quantize_hidden
from kimi_eagle.eagle3.row_space import ID_MAP_FILE, ROW_SPACE, model_ids, target_id_map
from kimi_eagle.io import read_jsonl, write_bytes, write_json

MANIFEST = "manifest.json"
FORMAT = "kimi-eagle-hidden/1"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp8": FP8_DTYPE}


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
# extraction


def load_target(path: str | Path, dtype: torch.dtype = torch.float32):
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


def _write_manifest(out: Path, manifest: dict) -> None:
    write_json(out / MANIFEST, manifest, indent=1)


def extract(target: str | Path, rows: Sequence[Row], out: str | Path, *, layer_ids: Sequence[int] | None = None,
            dtype: str = "bf16", shard_rows: int = 256, max_tokens: int = 4096, max_len: int | None = None,
            skipped: Sequence[dict] = (), model=None, progress: bool = False) -> dict:
    """Extract hidden states of ``rows`` into ``out``; resumes from an existing manifest. Returns the manifest."""
    from safetensors.torch import save

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model = model if model is not None else load_target(target)
    vocab_size = int(model.config.vocab_size)
    id_map = target_id_map(target)
    outside = next((r for r in rows if r.input_ids and not 0 <= min(r.input_ids) <= max(r.input_ids) < vocab_size), None)
    if outside is not None:
        hint = " (it maps Kimi IDs to rows: read the rows with load_rows(..., target=TARGET))" if id_map else ""
        raise ValueError(f"row {outside.id}: an input ID is outside the target's {vocab_size} rows{hint}")
    n_layers = model.config.num_hidden_layers
    ids = check_layer_ids(layer_ids, n_layers) if layer_ids is not None else default_layer_ids(n_layers)
    max_len = max_len or int(getattr(model.config, "max_position_embeddings", 1 << 30))
    data_hash = hashlib.sha256(json.dumps([[r.id, r.input_ids, r.loss_mask] for r in rows]).encode()).hexdigest()
    settings = {
        "format": FORMAT, "dtype": dtype, "layer_ids": list(ids), "layer_id_convention": CONVENTION,
        "n_layers": n_layers, "hidden_size": model.config.hidden_size, "vocab_size": model.config.vocab_size,
        "target": str(target), "target_sha256": target_hash(target), "data_sha256": data_hash,
        "shard_rows": shard_rows, "max_len": max_len,
    }
    if id_map is not None:  # input_ids are the target's rows, not Kimi IDs
        settings["token_ids"] = ROW_SPACE
    manifest_path = out / MANIFEST
    if manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
        changed = [k for k, v in settings.items() if k != "target" and manifest.get(k) != v]
        if changed:
            raise ValueError(f"{out} holds an extraction with different {', '.join(changed)}; use a new directory")
    else:
        manifest = {**settings, "n_rows": len(rows), "skipped": list(skipped), "shards": []}
    done = {s["file"] for s in manifest["shards"] if (out / s["file"]).exists()}
    manifest["shards"] = [s for s in manifest["shards"] if s["file"] in done]
    extractor = Extractor(model, ids)
    torch_dtype = torch.float32 if dtype == "fp8" else DTYPES[dtype]  # fp8: quantized per shard below
    n_shards = (len(rows) + shard_rows - 1) // shard_rows
    shard_iter: Iterable[int] = range(n_shards)
    if progress:
        from tqdm.auto import tqdm

        shard_iter = tqdm(shard_iter, desc="extract", unit="shard")
    for k in shard_iter:
        name = f"shard-{k:05d}.safetensors"
        if name in done:
            continue
        start = k * shard_rows
        chunk = rows[start : start + shard_rows]
        seqs = [r.input_ids[:max_len] for r in chunk]
        aux_rows: list[torch.Tensor] = [None] * len(chunk)  # type: ignore[list-item]
        final_rows: list[torch.Tensor] = [None] * len(chunk)  # type: ignore[list-item]
        for batch in batches_by_length([len(s) for s in seqs], max_tokens):
            input_ids, attn = pad_batch([seqs[i] for i in batch])
            aux, final = (t.to(torch_dtype) for t in extractor(input_ids, attn))  # one cast per batch
            for b, i in enumerate(batch):
                aux_rows[i] = aux[b, : len(seqs[i])]
                final_rows[i] = final[b, : len(seqs[i])]
        lengths = torch.tensor([len(s) for s in seqs])
        tensors = {
            "input_ids": torch.tensor([t for s in seqs for t in s], dtype=torch.long),
            "loss_mask": torch.tensor([m for r, s in zip(chunk, seqs) for m in r.loss_mask[: len(s)]], dtype=torch.uint8),
            "aux": torch.cat(aux_rows), "final": torch.cat(final_rows),
            "offsets": torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),
            "row_index": torch.arange(start, start + len(chunk), dtype=torch.long),
        }
        if dtype == "fp8":
            tensors.update(quantize_hidden(tensors["aux"], tensors["final"], model.config.hidden_size))
        data = save(tensors, metadata={"format": FORMAT})
        write_bytes(out / name, data)
        manifest["shards"].append({
            "file": name, "rows": [start, start + len(chunk)], "n_tokens": int(lengths.sum()),
            "ids": [r.id for r in chunk], "truncated": sum(len(r.input_ids) > max_len for r in chunk),
            "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data),
        })
        manifest["shards"].sort(key=lambda s: s["file"])
        _summarise(manifest)
        _write_manifest(out, manifest)
    _summarise(manifest)
    _write_manifest(out, manifest)
    return manifest


def _summarise(manifest: dict) -> None:
    n_tokens = sum(s["n_tokens"] for s in manifest["shards"])
    n_bytes = sum(s["bytes"] for s in manifest["shards"])
    manifest["n_tokens"] = n_tokens
    manifest["bytes"] = n_bytes
    manifest["bytes_per_token"] = round(n_bytes / n_tokens, 2) if n_tokens else None
    h = manifest["hidden_size"]
    payload = fp8_bytes_per_token(h) if manifest["dtype"] == "fp8" else bytes_per_token(h, DTYPES[manifest["dtype"]].itemsize)
    manifest["payload_bytes_per_token"] = payload
    manifest["payload_vs_bf16"] = round(payload / bytes_per_token(h), 4)
    manifest["truncated_rows"] = sum(s["truncated"] for s in manifest["shards"])
    manifest["complete"] = sum(s["rows"][1] - s["rows"][0] for s in manifest["shards"]) == manifest["n_rows"]


def bytes_per_token(hidden_size: int, dtype_bytes: int = 2) -> int:
    """Payload per token: aux (3H) + final (H) values, an int64 id and a uint8 mask."""
    return 4 * hidden_size * dtype_bytes + 8 + 1


# ------------------------------------------------------------------------------------------
# reading


class HiddenStates:
    """Memory-mapped reader of an extraction directory: ``len(hs)`` rows, ``hs[i]`` -> dict of tensors."""

    def __init__(self, path: str | Path):
        from safetensors import safe_open

        self.path = Path(path)
        self.manifest = json.loads((self.path / MANIFEST).read_text())
        self.layer_ids = tuple(self.manifest["layer_ids"])
        self.hidden_size = int(self.manifest["hidden_size"])
        self._files = [safe_open(str(self.path / s["file"]), framework="pt") for s in self.manifest["shards"]]
        self._index: list[tuple[int, int, int]] = []  # (file, start, end) per row
        self.row_ids: list[str] = []
        for k, (f, s) in enumerate(zip(self._files, self.manifest["shards"])):
            offsets = f.get_tensor("offsets").tolist()
            self._index.extend((k, a, b) for a, b in zip(offsets[:-1], offsets[1:]))
            self.row_ids.extend(s["ids"])

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        f, a, b = self._index[i]
        file = self._files[f]
        row = {name: file.get_slice(name)[a:b] for name in ("input_ids", "loss_mask", "aux", "final")}
        if self.manifest["dtype"] == "fp8":
            row["aux"] = dequantize_fp8(row["aux"], file.get_slice("aux_scale")[a:b])
            row["final"] = dequantize_fp8(row["final"], file.get_slice("final_scale")[a:b])
        return row

    def lengths(self) -> list[int]:
        return [b - a for _, a, b in self._index]

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return (self[i] for i in range(len(self)))

    def verify(self) -> list[str]:
        """Files whose sha256 differs from the manifest (empty when all are intact)."""
        return [s["file"] for s in self.manifest["shards"] if sha256_file(self.path / s["file"]) != s["sha256"]]

# ------------------------------------------------------------------------------------------
# command line
