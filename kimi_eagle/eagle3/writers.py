"""One writer per hidden-state layout (kit shards, speculators ``hs_{row}.safetensors``, SpecForge
``data_{idx}.ckpt``) for the one extraction loop, :func:`kimi_eagle.eagle3.extract.extract`.

The loop owns the forward pass, the long-row policy, resume checks and progress; a writer owns its
layout's settings, manifest, which work is still to do, and the bytes of its files. The file formats are
described in :mod:`kimi_eagle.eagle3.layouts`.
"""
from __future__ import annotations

import hashlib
import io
import re
import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Protocol, Sequence

import torch

from kimi_eagle.assets import sha256_file
from kimi_eagle.eagle3.hidden import Row, bytes_per_token
from kimi_eagle.eagle3.layers import CONVENTION, speculators_layer_ids, trainer_layer_ids
from kimi_eagle.eagle3.layouts import (
    KIT_FORMAT,
    LAYOUT_FORMAT,
    MANIFEST,
    ROW_IDS,
    SCALES_KEY,
    STORE_DTYPES,
    kit_shard_name,
    specforge_path,
    speculators_path,
)
from kimi_eagle.eagle3.quant import fp8_bytes_per_token, quantize_fp8, quantize_hidden
from kimi_eagle.eagle3.row_space import ROW_SPACE
from kimi_eagle.io import write_bytes, write_json, write_jsonl


class WriterOptions(Protocol):
    """The extraction options a writer reads (:class:`kimi_eagle.eagle3.extract.ExtractOptions` has them)."""

    @property
    def shard_rows(self) -> int: ...  # rows per kit shard, or per work chunk of a trainer layout

    @property
    def skipped(self) -> Sequence[dict]: ...  # the input's unusable records, carried into the manifest

    @property
    def rows_source(self) -> str | Path | None: ...

    @property
    def keep_literal_marker(self) -> bool: ...


@dataclass(frozen=True)
class TargetFacts:
    """What the loop settles about the target and the rows before anything is written."""

    target: str
    dtype: str
    layer_ids: tuple[int, ...]
    n_layers: int
    hidden_size: int
    vocab_size: int
    target_sha256: str
    data_sha256: str
    max_len: int  # the long-row limit: rows with more tokens are skipped
    row_space: bool  # input ids are the target's rows (a ``kimi_ids.json`` map), not Kimi IDs


@dataclass(frozen=True)
class WorkUnit:
    """Rows forwarded together and then written: a kit shard, or a chunk of a trainer layout's rows."""

    key: int  # kit: the shard number; trainer layouts: the chunk number
    start: int  # kit: the first input row the shard covers
    stop: int  # kit: one past the last input row it covers
    positions: list[int]  # the input rows to forward, in order (long rows left out)


@dataclass(frozen=True)
class RowStates:
    """One row's captured states: ``aux`` [T, 3H], ``final`` [T, H] (post-norm) and, when the writer asks
    for it, ``pre_norm`` [T, H] (the last block's output before the final norm)."""

    aux: torch.Tensor
    final: torch.Tensor
    pre_norm: torch.Tensor | None = None


# ------------------------------------------------------------------------------------------
# payloads


def speculators_payload(token_ids: Sequence[int], aux: torch.Tensor, last_pre_norm: torch.Tensor, dtype: str) -> bytes:
    """One ``hs_{row}.safetensors``: ``token_ids`` int64 [T], ``hidden_states`` [T, n + 1, H] (the ``n`` aux layers
    — EAGLE-3's 3, DFlash's set — then the last block's pre-norm output) in ``dtype``; ``fp8``: float8_e4m3fn plus
    ``hidden_states_scales`` fp32 [T, 1, 1] (absmax over the token's layers, :func:`kimi_eagle.eagle3.quant.quantize_fp8`:
    the values and scales of hs-connectors' ``quantize_tensor_to_fp8``, except that an all-zero token gets scale 1,
    not 1e-12)."""
    from safetensors.torch import save

    t, h = last_pre_norm.shape
    n = aux.shape[-1] // h + 1
    stacked = torch.cat([aux.float().reshape(t, n - 1, h), last_pre_norm.float().reshape(t, 1, h)], dim=1)
    tensors = {"token_ids": torch.tensor(list(token_ids), dtype=torch.int64)}
    if dtype == "fp8":
        values, scales = quantize_fp8(stacked.reshape(t, n * h), n * h)
        tensors.update(hidden_states=values.reshape(t, n, h).contiguous(), **{SCALES_KEY: scales.reshape(t, 1, 1).contiguous()})
    else:
        tensors["hidden_states"] = stacked.to(STORE_DTYPES[dtype]).contiguous()
    return save(tensors)


def specforge_payload(token_ids: Sequence[int], loss_mask: Sequence[int], aux: torch.Tensor, final: torch.Tensor,
                      dtype: str) -> bytes:
    """One ``data_{idx}.ckpt`` (``torch.save``): ``input_ids``, ``loss_mask`` int64 [T], ``hidden_state``
    [1, T, H] (post-norm), ``aux_hidden_state`` [1, T, 3H], in ``dtype`` (bf16, fp16 or fp32)."""
    if dtype == "fp8":
        raise ValueError("SpecForge's offline loader reads bf16/fp16 hidden states; fp8 is speculators' variant only")
    store = STORE_DTYPES[dtype]
    record = {"input_ids": torch.tensor(list(token_ids), dtype=torch.int64),
              "loss_mask": torch.tensor(list(loss_mask), dtype=torch.int64),
              "hidden_state": final.to(store).clone().unsqueeze(0),  # clone: never save a view's whole batch storage
              "aux_hidden_state": aux.to(store).clone().unsqueeze(0)}
    buf = io.BytesIO()
    torch.save(record, buf)
    return buf.getvalue()


def kit_shard_tensors(rows: Sequence[Row], positions: Sequence[int], states: dict[int, RowStates],
                      facts: TargetFacts, store: torch.dtype) -> dict[str, torch.Tensor]:
    """The tensors of one kit shard holding the rows at ``positions`` (their states already in ``store``;
    fp8 is quantized here, per token and layer)."""
    lengths = torch.tensor([len(rows[i].input_ids) for i in positions], dtype=torch.long)
    width = facts.hidden_size
    tensors = {
        "input_ids": torch.tensor([t for i in positions for t in rows[i].input_ids], dtype=torch.long),
        "loss_mask": torch.tensor([m for i in positions for m in rows[i].loss_mask], dtype=torch.uint8),
        "aux": torch.cat([states[i].aux for i in positions]) if positions else torch.empty(0, 3 * width, dtype=store),
        "final": torch.cat([states[i].final for i in positions]) if positions else torch.empty(0, width, dtype=store),
        "offsets": torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),
        "row_index": torch.tensor(list(positions), dtype=torch.long),
    }
    if facts.dtype == "fp8":
        tensors.update(quantize_hidden(tensors["aux"], tensors["final"], width))
    return tensors


# ------------------------------------------------------------------------------------------
# writers


class KitWriter:
    """The kit's shards: shard ``k`` holds input rows ``[k·shard_rows, (k+1)·shard_rows)`` less the long rows;
    a shard is written atomically and the manifest after every shard, so a run resumes by shard."""

    layout = "kimi"
    needs_pre_norm = False
    progress_label = ("extract", "shard")

    def __init__(self, out: Path, facts: TargetFacts, options: WriterOptions):
        self.out, self.facts, self.shard_rows, self.skipped = out, facts, options.shard_rows, list(options.skipped)
        self.batch_dtype = torch.float32 if facts.dtype == "fp8" else STORE_DTYPES[facts.dtype]  # fp8: quantized per shard
        self.manifest: dict = {}

    def settings(self) -> dict:
        """The keys a resumed run must agree with (all but ``target``)."""
        f = self.facts
        settings = {
            "format": KIT_FORMAT, "dtype": f.dtype, "layer_ids": list(f.layer_ids), "layer_id_convention": CONVENTION,
            "n_layers": f.n_layers, "hidden_size": f.hidden_size, "vocab_size": f.vocab_size,
            "target": f.target, "target_sha256": f.target_sha256, "data_sha256": f.data_sha256,
            "shard_rows": self.shard_rows, "max_len": f.max_len,
        }
        if f.row_space:  # input_ids are the target's rows, not Kimi IDs
            settings["token_ids"] = ROW_SPACE
        return settings

    def open(self, settings: dict, rows: Sequence[Row], long_rows: dict, previous: dict | None) -> None:
        """Start from ``previous`` (the manifest of an earlier run, its missing shards dropped) or afresh."""
        self.manifest = previous if previous is not None else {
            **settings, "n_rows": len(rows), "skipped": list(self.skipped), "shards": []}
        self.manifest["long_rows"] = long_rows
        self.manifest["shards"] = [s for s in self.manifest["shards"] if self._intact(s)]

    def _intact(self, entry: dict) -> bool:
        """A finished shard of an earlier run is kept only when its bytes are the ones its manifest entry recorded
        (size and sha256); a changed, truncated or missing one is redone, named in the manifest's ``redone``."""
        name = entry.get("file")
        if not isinstance(name, str) or not re.fullmatch(r"shard-\d{5}\.safetensors", name):
            return False  # not a name this writer gives: never a path to remove
        path = self.out / name
        if not path.is_file():
            return False
        if path.stat().st_size == entry.get("bytes") and sha256_file(path) == entry.get("sha256"):
            return True
        self.manifest.setdefault("redone", []).append(
            {"file": path.name, "reason": "its bytes differ from the sha256 the manifest recorded; extracted again"})
        warnings.warn(f"{path}: changed since it was written (sha256 differs); extracting it again", stacklevel=2)
        path.unlink()
        return False

    def pending(self, rows: Sequence[Row], too_long: set[int]) -> list[WorkUnit]:
        """The shards not written yet."""
        done = {s["file"] for s in self.manifest["shards"]}
        n, size = len(rows), self.shard_rows
        return [WorkUnit(k, k * size, min(n, (k + 1) * size), [i for i in range(k * size, min(n, (k + 1) * size))
                                                              if i not in too_long])
                for k in range((n + size - 1) // size) if kit_shard_name(k) not in done]

    def write(self, unit: WorkUnit, rows: Sequence[Row], states: Iterable[tuple[int, RowStates]]) -> None:
        """Write shard ``unit.key`` and the manifest that lists it."""
        from safetensors.torch import save

        tensors = kit_shard_tensors(rows, unit.positions, dict(states), self.facts, self.batch_dtype)
        tensors["layer_ids"] = torch.tensor(list(self.facts.layer_ids), dtype=torch.long)  # checked against the manifest on read
        data = save(tensors, metadata={"format": KIT_FORMAT})  # one metadata key: a shard's bytes are deterministic
        name = kit_shard_name(unit.key)
        write_bytes(self.out / name, data)
        self.manifest["shards"].append({
            "file": name, "rows": [unit.start, unit.stop], "n_tokens": int(tensors["offsets"][-1]),
            "ids": [rows[i].id for i in unit.positions], "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data),
        })
        self.manifest["shards"].sort(key=lambda s: s["file"])
        self.finish(rows, set())

    def finish(self, rows: Sequence[Row], too_long: set[int]) -> dict:
        """Summarise the shards into the manifest, write it and return it."""
        m = self.manifest
        n_tokens = sum(s["n_tokens"] for s in m["shards"])
        n_bytes = sum(s["bytes"] for s in m["shards"])
        m["n_tokens"], m["bytes"] = n_tokens, n_bytes
        m["bytes_per_token"] = round(n_bytes / n_tokens, 2) if n_tokens else None
        h = m["hidden_size"]
        payload = fp8_bytes_per_token(h) if m["dtype"] == "fp8" else bytes_per_token(h, STORE_DTYPES[m["dtype"]].itemsize)
        m["payload_bytes_per_token"] = payload
        m["payload_vs_bf16"] = round(payload / bytes_per_token(h), 4)
        m["complete"] = sum(s["rows"][1] - s["rows"][0] for s in m["shards"]) == m["n_rows"]
        write_json(self.out / MANIFEST, m, indent=1)
        return m


class TrainerLayoutWriter(ABC):
    """One file per row, named by the row's position, plus ``row_ids.jsonl`` and a layout manifest; a run
    resumes by file (a row whose file exists is not recomputed). Subclasses name the files and their bytes."""

    layout = ""
    needs_pre_norm = False

    def __init__(self, out: Path, facts: TargetFacts, options: WriterOptions):
        self.out, self.facts, self.chunk_rows, self.skipped = out, facts, options.shard_rows, list(options.skipped)
        self.rows_source = str(Path(options.rows_source).resolve()) if options.rows_source else None
        self.keep_literal_marker = options.keep_literal_marker
        self.progress_label = (f"extract ({self.layout})", "chunk")
        self.manifest: dict = {}

    @property
    @abstractmethod
    def batch_dtype(self) -> torch.dtype:
        """The dtype the loop casts each forward batch to before handing rows to :meth:`payload`."""

    @abstractmethod
    def file_of(self, row: int) -> Path:
        """The file of input row ``row``."""

    @abstractmethod
    def payload(self, row: Row, states: RowStates) -> bytes:
        """The bytes of ``row``'s file."""

    @abstractmethod
    def trainer_layer_ids(self) -> list[int]:
        """The kit's layer ids in the trainer's own convention."""

    def settings(self) -> dict:
        """The keys a resumed run must agree with."""
        f = self.facts
        return {
            "format": LAYOUT_FORMAT, "layout": self.layout, "dtype": f.dtype, "layer_ids": list(f.layer_ids),
            "layer_id_convention": CONVENTION, "trainer_layer_ids": self.trainer_layer_ids(),
            "n_layers": f.n_layers, "hidden_size": f.hidden_size, "vocab_size": f.vocab_size,
            "target_sha256": f.target_sha256, "data_sha256": f.data_sha256, "max_len": f.max_len,
        }

    def open(self, settings: dict, rows: Sequence[Row], long_rows: dict, previous: dict | None) -> None:
        """Write ``row_ids.jsonl`` (the rows that get a file) and the manifest of this run."""
        too_long = {r["row"] for r in long_rows["rows"]}
        self.manifest = {**settings, "target": self.facts.target, "rows_source": self.rows_source,
                         "keep_literal_marker": self.keep_literal_marker, "n_rows": len(rows),
                         "skipped": list(self.skipped), "long_rows": long_rows, "complete": False}
        write_jsonl(self.out / ROW_IDS, ({"row": k, "id": r.id, "n_tokens": len(r.input_ids),
                                          "file": str(self.file_of(k).relative_to(self.out))}
                                         for k, r in enumerate(rows) if k not in too_long))
        write_json(self.out / MANIFEST, self.manifest, indent=1)

    def pending(self, rows: Sequence[Row], too_long: set[int]) -> list[WorkUnit]:
        """Chunks of the rows whose file does not exist yet."""
        todo = [k for k in range(len(rows)) if k not in too_long and not self._usable(self.file_of(k))]
        return [WorkUnit(i // self.chunk_rows, 0, 0, todo[i : i + self.chunk_rows])
                for i in range(0, len(todo), self.chunk_rows)]

    def _usable(self, path: Path) -> bool:
        """An earlier run's file is kept when it reads as its layout (:meth:`check_file`); a torn or changed one is
        removed, named in the manifest's ``redone``, and extracted again."""
        if not path.exists():
            return False
        try:
            self.check_file(path)
            return True
        except Exception as e:  # noqa: BLE001 - whatever makes a file unreadable, it is redone
            reason = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
            self.manifest.setdefault("redone", []).append({"file": path.name, "reason": reason})
            warnings.warn(f"{path}: unreadable ({reason}); extracting it again", stacklevel=2)
            path.unlink()
            return False

    @abstractmethod
    def check_file(self, path: Path) -> None:
        """Raise when the file at ``path`` does not read as this layout's file."""

    def write(self, unit: WorkUnit, rows: Sequence[Row], states: Iterable[tuple[int, RowStates]]) -> None:
        """Write each row's file as soon as its batch is done."""
        for k, row_states in states:
            path = self.file_of(k)
            path.parent.mkdir(parents=True, exist_ok=True)
            write_bytes(path, self.payload(rows[k], row_states))

    def finish(self, rows: Sequence[Row], too_long: set[int]) -> dict:
        """Count the files written into the manifest, write it and return it."""
        written = [k for k in range(len(rows)) if k not in too_long and self.file_of(k).exists()]
        n_tokens = sum(len(rows[k].input_ids) for k in written)
        n_bytes = sum(self.file_of(k).stat().st_size for k in written)
        self.manifest.update(rows_written=len(written), n_tokens=n_tokens, bytes=n_bytes,
                             bytes_per_token=round(n_bytes / n_tokens, 2) if n_tokens else None,
                             complete=len(written) + len(too_long) == len(rows))
        write_json(self.out / MANIFEST, self.manifest, indent=1)
        return self.manifest


class SpeculatorsWriter(TrainerLayoutWriter):
    """``hs_{row}.safetensors``: the aux layers and the last block's output before the final norm."""

    layout = "speculators"
    needs_pre_norm = True

    @property
    def batch_dtype(self) -> torch.dtype:
        return torch.float32  # stacked and cast (or quantized) per row in :func:`speculators_payload`

    def file_of(self, row: int) -> Path:
        return speculators_path(self.out, row)

    def payload(self, row: Row, states: RowStates) -> bytes:
        assert states.pre_norm is not None  # needs_pre_norm: the loop captures it
        return speculators_payload(row.input_ids, states.aux, states.pre_norm, self.facts.dtype)

    def trainer_layer_ids(self) -> list[int]:
        return speculators_layer_ids(self.facts.layer_ids, self.facts.n_layers, count=None)

    def check_file(self, path: Path) -> None:
        from kimi_eagle.eagle3.readers import check_safetensors

        check_safetensors(path)


class SpecForgeWriter(TrainerLayoutWriter):
    """``rows_{g}-{g+2000}/data_{idx}.ckpt``: tokens, loss mask, aux layers and the post-norm final state."""

    layout = "specforge"

    @property
    def batch_dtype(self) -> torch.dtype:
        return STORE_DTYPES[self.facts.dtype]

    def file_of(self, row: int) -> Path:
        return specforge_path(self.out, row)

    def payload(self, row: Row, states: RowStates) -> bytes:
        return specforge_payload(row.input_ids, row.loss_mask, states.aux, states.final, self.facts.dtype)

    def trainer_layer_ids(self) -> list[int]:
        return trainer_layer_ids(self.facts.layer_ids, self.facts.n_layers, "specforge")

    def check_file(self, path: Path) -> None:
        from kimi_eagle.eagle3.readers import load_specforge_file

        data = load_specforge_file(path)
        if not isinstance(data, dict) or not all(isinstance(data.get(k), torch.Tensor) for k in
                                                 ("input_ids", "loss_mask", "hidden_state", "aux_hidden_state")):
            raise ValueError("not a SpecForge record of tensors")


WRITERS: dict[str, type[KitWriter] | type[TrainerLayoutWriter]] = {
    "kimi": KitWriter, "speculators": SpeculatorsWriter, "specforge": SpecForgeWriter}
