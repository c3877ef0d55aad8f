"""Hidden states in the trainers' layouts, both ways: ``kimi-eagle extract --layout speculators|specforge``
writes them, :func:`open_hidden_states` reads any of the three layouts for ``train`` and ``evaluate``.

Layouts (facts of speculators 0.9.0 / hs-connectors 0.9.0 and SpecForge 0.2.0, checked against their code
in ``tests/test_interop_layouts.py``):

* ``kimi``: the kit's shards (:mod:`kimi_eagle.eagle3.hidden`).
* ``speculators``: one ``hs_{row}.safetensors`` per Arrow row of a ``kimi-eagle export-data --to
  speculators`` directory (``hs_{row}`` must be that dataset's row ``row``: speculators' ``ArrowDataset``
  reads file ``i`` for row ``i``), holding ``token_ids`` int64 ``[T]`` and ``hidden_states`` ``[T, 4, H]``:
  the three aux layers, then the last block's output **before** the final norm (vLLM's capture-before ids
  ``[aux + 1..., n_layers]``; speculators' model applies the verifier's norm itself). bf16/fp16, or the FP8
  variant of hs-connectors' ``FP8HiddenStatesConnector``: float8_e4m3fn ``hidden_states`` plus fp32
  ``hidden_states_scales`` ``[T, 1, 1]``, one absmax scale per token over all four layers. Loss masks
  are not in the files: they are the Arrow rows' ``loss_mask``.
* ``specforge``: one ``torch.save`` dict per row, ``rows_{g}-{g+2000}/data_{idx}.ckpt`` (``g`` = ``idx``
  rounded down to a multiple of 2000), with ``input_ids`` and ``loss_mask`` int64 ``[T]``,
  ``hidden_state`` ``[1, T, H]`` (the last layer **after** the final norm: SpecForge's target head is the
  bare ``lm_head``) and ``aux_hidden_state`` ``[1, T, 3H]``. Read here with ``torch.load(...,
  weights_only=True)`` only; rows are matched by the ``idx`` in the file name, never by position
  (SpecForge sorts paths as strings: ``data_10`` before ``data_2``).

Both trainer layouts get a ``manifest.json`` (format ``kimi-eagle-hidden-layout/1``; the trainers'
loaders only look at ``hs_*.safetensors`` / ``*.ckpt`` files) and ``row_ids.jsonl`` (``row``, ``id``,
``n_tokens``, ``file``). Reading also works without them (a dump made by vLLM or SGLang): then the layer
ids come from the export's ``layer_ids.json`` or the trainer's defaults for the target.

Readers yield what :class:`~kimi_eagle.eagle3.hidden.HiddenStates` yields — ``input_ids`` int64,
``loss_mask`` uint8, ``aux`` ``[T, 3H]``, ``final`` ``[T, H]`` (post-norm; for speculators the target's
final RMSNorm is applied on read, in float32) — and skip, with the reason counted in
``manifest["read_skipped_by_reason"]``, every file that is missing, unreadable, malformed, or whose
token ids disagree with its row.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import pickle
import re
from collections import Counter
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from kimi_eagle.eagle3.hidden import (
    Extractor,
    HiddenStates,
    Row,
    batches_by_length,
    load_rows,
    load_target,
    pad_batch,
    target_hash,
)
from kimi_eagle.eagle3.layers import (
    CONVENTION,
    check_layer_ids,
    default_layer_ids,
    speculators_layer_ids,
    trainer_layer_ids,
)
from kimi_eagle.eagle3.quant import FP8_DTYPE, dequantize_fp8, quantize_fp8
from kimi_eagle.io import read_jsonl, write_bytes, write_json, write_jsonl

LAYOUTS = ("kimi", "speculators", "specforge")
FORMAT = "kimi-eagle-hidden-layout/1"
MANIFEST = "manifest.json"
ROW_IDS = "row_ids.jsonl"
SCALES_KEY = "hidden_states_scales"  # hs-connectors' name for the FP8 scales
SPECFORGE_GROUP = 2000
STORE_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp8": FP8_DTYPE}
_SPECFORGE_NAME = re.compile(r"^data_(\d+)\.ckpt(\.gz)?$")
_SPECULATORS_NAME = re.compile(r"^hs_(\d+)\.safetensors$")


def speculators_path(hidden_dir: str | Path, row: int) -> Path:
    """``hidden_dir/hs_{row}.safetensors`` (hs-connectors' ``FileTransfer`` name)."""
    return Path(hidden_dir) / f"hs_{row}.safetensors"


def specforge_path(hidden_dir: str | Path, idx: int) -> Path:
    """``hidden_dir/rows_{g}-{g+2000}/data_{idx}.ckpt`` (SpecForge's ``prepare_hidden_states`` name)."""
    g = idx // SPECFORGE_GROUP * SPECFORGE_GROUP
    return Path(hidden_dir) / f"rows_{g}-{g + SPECFORGE_GROUP}" / f"data_{idx}.ckpt"


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The target's final RMSNorm in float32, with the operations of HF's ``LlamaRMSNorm`` (bit-identical
    to the target's own norm on float32 inputs)."""
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight.float() * x


# ------------------------------------------------------------------------------------------
# payloads


def speculators_payload(token_ids: Sequence[int], aux: torch.Tensor, last_pre_norm: torch.Tensor, dtype: str) -> bytes:
    """One ``hs_{row}.safetensors``: ``token_ids`` int64 [T], ``hidden_states`` [T, 4, H] (aux layers, then the
    last block's pre-norm output) in ``dtype``; ``fp8``: float8_e4m3fn plus ``hidden_states_scales`` fp32
    [T, 1, 1] (absmax over the token's four layers, :func:`kimi_eagle.eagle3.quant.quantize_fp8`: the values and
    scales of hs-connectors' ``quantize_tensor_to_fp8``, except that an all-zero token gets scale 1, not 1e-12)."""
    from safetensors.torch import save

    t, h = last_pre_norm.shape
    stacked = torch.cat([aux.float().reshape(t, 3, h), last_pre_norm.float().reshape(t, 1, h)], dim=1)
    tensors = {"token_ids": torch.tensor(list(token_ids), dtype=torch.int64)}
    if dtype == "fp8":
        values, scales = quantize_fp8(stacked.reshape(t, 4 * h), 4 * h)
        tensors.update(hidden_states=values.reshape(t, 4, h).contiguous(), **{SCALES_KEY: scales.reshape(t, 1, 1).contiguous()})
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


# ------------------------------------------------------------------------------------------
# rows


def is_arrow_dir(path: str | Path) -> bool:
    """A ``datasets.save_to_disk`` directory (``state.json`` and ``dataset_info.json``)."""
    p = Path(path)
    return p.is_dir() and (p / "state.json").is_file() and (p / "dataset_info.json").is_file()


def arrow_rows(path: str | Path) -> list[Row]:
    """The rows of an export-data Arrow dataset in dataset order (ids from its ``row_ids.jsonl``)."""
    import datasets

    ds = datasets.load_from_disk(str(path)).with_format(None)
    names = {}
    if (Path(path) / ROW_IDS).is_file():
        names = {int(line.obj["row"]): str(line.obj["id"]) for line in read_jsonl(Path(path) / ROW_IDS) if line.error is None}
    return [Row(names.get(k, str(k)), [int(i) for i in ids], [int(m) for m in mask])
            for k, (ids, mask) in enumerate(zip(ds["input_ids"], ds["loss_mask"]))]


def load_layout_rows(path: str | Path, keep_literal_marker: bool = False) -> tuple[list[Row], list[dict]]:
    """Rows as :func:`~kimi_eagle.eagle3.hidden.load_rows` reads them, plus export-data directories: an Arrow
    dataset (speculators) in its row order, or a directory holding ``prompts.jsonl`` (SpecForge) or
    ``rows.jsonl`` (tokens)."""
    p = Path(path)
    if is_arrow_dir(p):
        return arrow_rows(p), []
    if p.is_dir():
        for name in ("prompts.jsonl", "rows.jsonl"):
            if (p / name).is_file():
                return load_rows(p / name, keep_literal_marker=keep_literal_marker)
        raise ValueError(f"{p}: not an export-data directory (no Arrow dataset, prompts.jsonl or rows.jsonl)")
    return load_rows(p, keep_literal_marker=keep_literal_marker)


# ------------------------------------------------------------------------------------------
# writing


def extract_layout(target: str | Path, rows: Sequence[Row], out: str | Path, layout: str, *,
                   layer_ids: Sequence[int] | None = None, dtype: str = "bf16", max_tokens: int = 4096,
                   chunk_rows: int = 256, skipped: Sequence[dict] = (), rows_source: str | Path | None = None,
                   keep_literal_marker: bool = False, model=None, progress: bool = False) -> dict:
    """Write the hidden states of ``rows`` into ``out`` in ``layout`` (``speculators`` or ``specforge``), one
    file per row named by the row's position; resumes (a row whose file exists is not recomputed).

    Rows longer than the target's positions are skipped with their reason (a cut row would no longer
    equal its exported row, and the trainers drop such files). Returns the manifest.
    """
    if layout not in ("speculators", "specforge"):
        raise ValueError(f"extract_layout writes speculators or specforge, not {layout!r}")
    if layout == "specforge" and dtype == "fp8":
        raise ValueError("--dtype fp8 is speculators' FP8 variant; SpecForge's offline files are bf16/fp16")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model = model if model is not None else load_target(target)
    cfg = model.config
    n_layers = cfg.num_hidden_layers
    ids = check_layer_ids(layer_ids, n_layers) if layer_ids is not None else default_layer_ids(n_layers)
    max_len = int(getattr(cfg, "max_position_embeddings", 1 << 30))
    file_of = speculators_path if layout == "speculators" else specforge_path
    settings = {
        "format": FORMAT, "layout": layout, "dtype": dtype, "layer_ids": list(ids), "layer_id_convention": CONVENTION,
        "trainer_layer_ids": (speculators_layer_ids(ids, n_layers) if layout == "speculators"
                              else trainer_layer_ids(ids, n_layers, "specforge")),
        "n_layers": n_layers, "hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size,
        "target_sha256": target_hash(target),
        "data_sha256": hashlib.sha256(json.dumps([[r.id, r.input_ids, r.loss_mask] for r in rows]).encode()).hexdigest(),
        "max_len": max_len,
    }
    manifest_path = out / MANIFEST
    if manifest_path.exists():
        old = json.loads(manifest_path.read_text())
        changed = [k for k, v in settings.items() if old.get(k) != v]
        if changed:
            raise ValueError(f"{out} holds hidden states with different {', '.join(changed)}; use a new directory")
    too_long = [{"row": k, "id": r.id, "reason": f"longer than the target's {max_len} positions ({len(r.input_ids)} tokens)"}
                for k, r in enumerate(rows) if len(r.input_ids) > max_len]
    skip_rows = {s["row"] for s in too_long}
    manifest = {**settings, "target": str(target), "rows_source": str(Path(rows_source).resolve()) if rows_source else None,
                "keep_literal_marker": keep_literal_marker,
                "n_rows": len(rows), "skipped": list(skipped), "row_skipped": too_long, "complete": False}
    write_jsonl(out / ROW_IDS, ({"row": k, "id": r.id, "n_tokens": len(r.input_ids),
                                 "file": str(file_of(out, k).relative_to(out))}
                                for k, r in enumerate(rows) if k not in skip_rows))
    write_json(manifest_path, manifest, indent=1)
    todo = [k for k in range(len(rows)) if k not in skip_rows and not file_of(out, k).exists()]
    extractor = Extractor(model, ids)
    captured: dict[str, torch.Tensor] = {}

    def last_hook(_module, _inputs, output):  # the last block's output, before the final norm
        captured["pre_norm"] = output[0] if isinstance(output, tuple) else output

    handle = model.model.layers[-1].register_forward_hook(last_hook)
    chunks: Any = [todo[i : i + chunk_rows] for i in range(0, len(todo), chunk_rows)]
    if progress:
        from tqdm.auto import tqdm

        chunks = tqdm(chunks, desc=f"extract ({layout})", unit="chunk")
    try:
        for chunk in chunks:
            for batch in batches_by_length([len(rows[k].input_ids) for k in chunk], max_tokens):
                ks = [chunk[j] for j in batch]
                input_ids, attn = pad_batch([rows[k].input_ids for k in ks])
                aux, final = extractor(input_ids, attn)
                pre = captured.pop("pre_norm")
                for b, k in enumerate(ks):
                    r, n = rows[k], len(rows[k].input_ids)
                    if layout == "speculators":
                        data = speculators_payload(r.input_ids, aux[b, :n], pre[b, :n], dtype)
                    else:
                        data = specforge_payload(r.input_ids, r.loss_mask, aux[b, :n], final[b, :n], dtype)
                    path = file_of(out, k)
                    path.parent.mkdir(parents=True, exist_ok=True)
                    write_bytes(path, data)
    finally:
        handle.remove()
        extractor.close()
    written = [k for k in range(len(rows)) if k not in skip_rows and file_of(out, k).exists()]
    n_tokens = sum(len(rows[k].input_ids) for k in written)
    n_bytes = sum(file_of(out, k).stat().st_size for k in written)
    manifest.update(rows_written=len(written), n_tokens=n_tokens, bytes=n_bytes,
                    bytes_per_token=round(n_bytes / n_tokens, 2) if n_tokens else None,
                    complete=len(written) + len(too_long) == len(rows))
    write_json(manifest_path, manifest, indent=1)
    return manifest


# ------------------------------------------------------------------------------------------
# reading


def detect_layout(path: str | Path) -> tuple[str, Path]:
    """``(layout, hidden_dir)`` of a hidden-state directory: a kit extraction, a trainer layout written here
    (its manifest says which), a speculators dump (``hs_*.safetensors`` in it or in its ``hidden_states/``)
    or a SpecForge dump (``data_*.ckpt`` anywhere below it)."""
    p = Path(path)
    if not p.is_dir():
        raise ValueError(f"{p}: not a directory of hidden states")
    for d in (p, p / "hidden_states"):  # an export-data directory holds its hidden states in hidden_states/
        if not d.is_dir():
            continue
        fmt = _own_manifest(d, any_format=True).get("format", "")
        if fmt == FORMAT:
            return _own_manifest(d)["layout"], d
        if str(fmt).startswith("kimi-eagle-hidden/"):
            return "kimi", d
        if any(_SPECULATORS_NAME.match(f.name) for f in d.iterdir()):
            return "speculators", d
    for d in (p / "hidden_states", p):
        for _root, _dirs, files in os.walk(d):
            if any(_SPECFORGE_NAME.match(f) for f in files):
                return "specforge", d
    raise ValueError(f"{p}: no kit shards, hs_*.safetensors (speculators) or data_*.ckpt (SpecForge) found")


def open_hidden_states(path: str | Path, target: str | Path | None = None, rows: Sequence[Row] | None = None):
    """A reader of any layout with :class:`~kimi_eagle.eagle3.hidden.HiddenStates`' interface (``len``,
    ``[i]``, ``layer_ids``, ``hidden_size``, ``row_ids``, ``manifest["vocab_size"]``, ``lengths()``).

    ``target`` (the HF target directory) is needed for foreign layouts: its final norm (speculators),
    vocabulary size and default layer ids. ``rows``: the rows the files must match (default: the rows
    the layout names — its manifest's ``rows_source``, or the export directory it sits in)."""
    layout, hidden_dir = detect_layout(path)
    if layout == "kimi":
        return HiddenStates(hidden_dir)
    if target is None:
        raise ValueError(f"{path}: reading the {layout} layout needs the target directory")
    cls = SpeculatorsHiddenStates if layout == "speculators" else SpecForgeHiddenStates
    return cls(hidden_dir, target, rows=rows)


def _own_manifest(hidden_dir: Path, any_format: bool = False) -> dict:
    """The ``manifest.json`` in ``hidden_dir`` if it is a layout manifest written here (any kit format with
    ``any_format``); else ``{}`` (an export-data manifest, a foreign dump, unreadable JSON)."""
    try:
        m = json.loads((hidden_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(m, dict):
        return {}
    return m if m.get("format") == FORMAT or any_format else {}


def _target_config(target: str | Path) -> dict:
    cfg = json.loads((Path(target) / "config.json").read_text())
    return cfg.get("text_config", cfg)


class _LayoutReader:
    """Shared bookkeeping of the trainer-layout readers: rows kept, rows skipped with reasons."""

    layout = ""

    def __init__(self, hidden_dir: Path, target: str | Path):
        self.path = Path(hidden_dir)
        self.target = str(target)
        self.own_manifest = _own_manifest(self.path) or None
        cfg = _target_config(target)
        self.n_layers = int(cfg["num_hidden_layers"])
        self.vocab_size = int(cfg["vocab_size"])
        self.skipped: list[dict] = []
        self._keys: list[int] = []  # row / idx of every kept file, in row order
        self.row_ids: list[str] = []
        self._lengths: list[int] = []

    def _skip(self, key: int | None, name: str, reason: str) -> None:
        self.skipped.append({"row": key, "file": name, "reason": reason})

    def _layer_ids(self, export_dir: Path | None) -> tuple[int, int, int]:
        """The kit manifest's ids; else the export's ``layer_ids.json``; else the trainer's defaults, which are the
        kit's (speculators' ``[2, n//2, n-3]`` and SpecForge's ``[1, n//2-1, n-4]`` both name blocks
        ``1, n//2-1, n-4``; :func:`~kimi_eagle.eagle3.layers.default_layer_ids` also covers tiny targets)."""
        if self.own_manifest is not None:
            return tuple(self.own_manifest["layer_ids"])  # type: ignore[return-value]
        if export_dir is not None and (export_dir / "layer_ids.json").is_file():
            table = json.loads((export_dir / "layer_ids.json").read_text())
            if int(table.get("n_layers", self.n_layers)) == self.n_layers:
                return check_layer_ids(table["kimi_block_output"], self.n_layers)
        return default_layer_ids(self.n_layers)

    def _finish(self, row_names: dict[int, str]) -> None:
        self.row_ids = [row_names.get(k, str(k)) for k in self._keys]
        by_reason = dict(sorted(Counter(s["reason"].split(":")[0] for s in self.skipped).items()))
        if self.skipped:
            import warnings

            warnings.warn(f"{self.path}: {len(self.skipped)} hidden-state files skipped: {by_reason}", stacklevel=3)
        self.manifest = {"layout": self.layout, "path": str(self.path), "target": self.target,
                         "layer_ids": list(self.layer_ids), "hidden_size": self.hidden_size,
                         "vocab_size": self.vocab_size, "n_rows": len(self._keys), "read_skipped": self.skipped,
                         "read_skipped_by_reason": by_reason,
                         "own_manifest": self.own_manifest is not None}

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return (self[i] for i in range(len(self)))

    def lengths(self) -> list[int]:
        return list(self._lengths)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:  # pragma: no cover - subclasses
        raise NotImplementedError


def _rows_from_source(source: str | None, keep_literal_marker: bool) -> list[Row] | None:
    if source and Path(source).exists():
        return load_layout_rows(source, keep_literal_marker=keep_literal_marker)[0]
    return None


def _row_names(hidden_dir: Path, export_dir: Path | None) -> dict[int, str]:
    for d in (hidden_dir, export_dir):
        if d is not None and (d / ROW_IDS).is_file():
            return {int(line.obj["row"]): str(line.obj["id"]) for line in read_jsonl(d / ROW_IDS)
                    if line.error is None and isinstance(line.obj, dict)}
    return {}


class SpeculatorsHiddenStates(_LayoutReader):
    """``hs_{row}.safetensors`` files paired with the export's Arrow rows (``token_ids`` must equal the row's
    ``input_ids``, as speculators' ``ArrowDataset`` requires); ``final`` = the target's final norm of the
    stored last layer."""

    layout = "speculators"

    def __init__(self, hidden_dir: str | Path, target: str | Path, rows: Sequence[Row] | None = None):
        from safetensors import safe_open

        from kimi_eagle.eagle3.model import target_tensor

        super().__init__(Path(hidden_dir), target)
        source = (self.own_manifest or {}).get("rows_source")
        export_dir = Path(source) if source and is_arrow_dir(source) else (
            self.path.parent if is_arrow_dir(self.path.parent) else None)
        if rows is None:
            if export_dir is None:
                raise ValueError(f"{self.path}: speculators hidden states need their Arrow rows (the loss masks): "
                                 "put them in the export-data directory's hidden_states/")
            rows = arrow_rows(export_dir)
        self.rows = list(rows)
        self.layer_ids = self._layer_ids(export_dir)
        cfg = _target_config(target)
        self.hidden_size = int(cfg["hidden_size"])
        self._norm_weight = target_tensor(target, "model.norm.weight").float()
        self._eps = float(cfg.get("rms_norm_eps", 1e-6))
        for k, row in enumerate(self.rows):
            path = speculators_path(self.path, k)
            if not path.is_file():
                self._skip(k, path.name, "missing: no hidden-state file for this row")
                continue
            try:
                with safe_open(str(path), framework="pt") as f:
                    keys = set(f.keys())
                    if not {"token_ids", "hidden_states"} <= keys:
                        self._skip(k, path.name, f"malformed: keys {sorted(keys)}")
                        continue
                    token_ids = f.get_tensor("token_ids")
                    shape = tuple(f.get_slice("hidden_states").get_shape())
            except Exception as e:  # noqa: BLE001 - a torn or hostile file is skipped with its reason
                self._skip(k, path.name, f"unreadable: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
                continue
            if token_ids.tolist() != row.input_ids:
                self._skip(k, path.name, "token_ids disagree with the row's input_ids")
                continue
            if shape != (len(row.input_ids), 4, self.hidden_size):
                self._skip(k, path.name, f"malformed: hidden_states shape {list(shape)}, expected "
                                         f"[{len(row.input_ids)}, 4, {self.hidden_size}]")
                continue
            self._keys.append(k)
            self._lengths.append(len(row.input_ids))
        self._finish(_row_names(self.path, export_dir) or {k: r.id for k, r in enumerate(self.rows)})

    def stored(self, i: int) -> dict[str, torch.Tensor]:
        """The file of row ``i`` as stored (FP8 dequantized to float32 with its per-token scales)."""
        from safetensors.torch import load_file

        data = load_file(str(speculators_path(self.path, self._keys[i])))
        if SCALES_KEY in data:
            hs = data["hidden_states"]
            t, n, h = hs.shape
            data["hidden_states"] = dequantize_fp8(hs.reshape(t, n * h), data.pop(SCALES_KEY).reshape(t, 1)).reshape(t, n, h)
        return data

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        data = self.stored(i)
        hs = data["hidden_states"]
        row = self.rows[self._keys[i]]
        return {"input_ids": data["token_ids"].to(torch.int64),
                "loss_mask": torch.tensor(row.loss_mask, dtype=torch.uint8),
                "aux": hs[:, :3].reshape(hs.shape[0], -1), "final": rms_norm(hs[:, 3], self._norm_weight, self._eps)}

    def token_rows(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(input_ids, loss_mask)`` of every kept row, without reading hidden states."""
        return ((torch.tensor(self.rows[k].input_ids), torch.tensor(self.rows[k].loss_mask, dtype=torch.uint8))
                for k in self._keys)


def load_specforge_file(path: str | Path) -> dict[str, Any]:
    """A SpecForge ``.ckpt`` (or ``.ckpt.gz``) with ``torch.load(weights_only=True)``: tensors and plain data
    only; anything else raises ``pickle.UnpicklingError``."""
    path = Path(path)
    if path.name.endswith(".gz"):
        with gzip.open(path, "rb") as f:
            return torch.load(io.BytesIO(f.read()), weights_only=True)
    return torch.load(path, weights_only=True, mmap=True)


class SpecForgeHiddenStates(_LayoutReader):
    """``data_{idx}.ckpt`` files in ``idx`` order (numeric, whatever the directory order), each checked
    for its keys and shapes and, when the rows are known, against row ``idx``'s ``input_ids``."""

    layout = "specforge"
    KEYS = ("input_ids", "loss_mask", "hidden_state", "aux_hidden_state")

    def __init__(self, hidden_dir: str | Path, target: str | Path, rows: Sequence[Row] | None = None):
        super().__init__(Path(hidden_dir), target)
        source = (self.own_manifest or {}).get("rows_source")
        export_dir = self.path.parent if (self.path.parent / "prompts.jsonl").is_file() else None
        if rows is None:
            rows = _rows_from_source(source, bool((self.own_manifest or {}).get("keep_literal_marker"))) or (load_rows(export_dir / "prompts.jsonl")[0] if export_dir else None)
        self.rows = list(rows) if rows is not None else None
        self.layer_ids = self._layer_ids(export_dir)
        self.hidden_size = int(_target_config(target)["hidden_size"])
        files: dict[int, Path] = {}
        for root, _dirs, names in os.walk(self.path):
            for name in sorted(names):
                if not (name.endswith(".ckpt") or name.endswith(".ckpt.gz")):
                    continue
                m = _SPECFORGE_NAME.match(name)
                if not m:
                    self._skip(None, name, "unrecognised name: expected data_{idx}.ckpt")
                elif int(m.group(1)) in files:
                    self._skip(int(m.group(1)), name, f"duplicate index: {files[int(m.group(1))]} kept")
                else:
                    files[int(m.group(1))] = Path(root) / name
        self._files: list[Path] = []
        self._loss_masks: list[torch.Tensor] = []
        self._input_ids: list[torch.Tensor] = []
        h = self.hidden_size
        for idx in sorted(files):
            path = files[idx]
            try:
                data = load_specforge_file(path)
            except pickle.UnpicklingError as e:
                self._skip(idx, path.name, f"refused: not plain tensors ({str(e).splitlines()[0][:120]})")
                continue
            except Exception as e:  # noqa: BLE001 - a torn file is skipped with its reason
                self._skip(idx, path.name, f"unreadable: {str(e).splitlines()[0][:120] if str(e) else type(e).__name__}")
                continue
            if not isinstance(data, dict) or any(not isinstance(data.get(k), torch.Tensor) for k in self.KEYS):
                self._skip(idx, path.name, f"malformed: needs tensors {', '.join(self.KEYS)}")
                continue
            ids, mask = data["input_ids"].reshape(-1), data["loss_mask"].reshape(-1)
            t = ids.numel()
            if (mask.numel() != t or tuple(data["hidden_state"].shape) != (1, t, h)
                    or tuple(data["aux_hidden_state"].shape) != (1, t, 3 * h)):
                self._skip(idx, path.name, "malformed: shapes disagree with [T], [1, T, H], [1, T, 3H]")
                continue
            if self.rows is not None:
                if idx >= len(self.rows):
                    self._skip(idx, path.name, f"no row: index beyond the {len(self.rows)} rows")
                    continue
                if ids.tolist() != self.rows[idx].input_ids:
                    self._skip(idx, path.name, "token_ids disagree with the row's input_ids")
                    continue
            self._keys.append(idx)
            self._files.append(path)
            self._lengths.append(t)
            self._input_ids.append(ids.to(torch.int64).clone())
            self._loss_masks.append((mask != 0).to(torch.uint8).clone())
        names = _row_names(self.path, export_dir)
        if not names and self.rows is not None:
            names = {k: r.id for k, r in enumerate(self.rows)}
        self._finish(names)
        self.manifest["rows_checked"] = self.rows is not None

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        data = load_specforge_file(self._files[i])
        return {"input_ids": self._input_ids[i], "loss_mask": self._loss_masks[i],
                "aux": data["aux_hidden_state"][0], "final": data["hidden_state"][0]}

    def token_rows(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(input_ids, loss_mask)`` of every kept file, without reading hidden states again."""
        return zip(self._input_ids, self._loss_masks)


def prompts_from_hidden(path: str | Path, target: str | Path) -> list[tuple[str, list[int]]]:
    """``[(row id, prompt_ids)]`` of the rows of a hidden-state directory (any layout): each row's ids before
    its first supervised token (for ``kimi-eagle evaluate`` on held-out rows)."""
    data = open_hidden_states(path, target)
    pairs = data.token_rows() if hasattr(data, "token_rows") else ((r["input_ids"], r["loss_mask"]) for r in data)
    out = []
    for rid, (ids, mask) in zip(data.row_ids, pairs):
        first = int(torch.nonzero(mask).flatten()[0]) if bool(mask.any()) else len(ids)
        if first:
            out.append((rid, [int(t) for t in ids[:first]]))
    return out


# ------------------------------------------------------------------------------------------
# command line: ``kimi-eagle extract`` (the kit's flags from :mod:`kimi_eagle.eagle3.hidden`, plus ``--layout``)
