"""Readers of target hidden states in every layout (:mod:`kimi_eagle.eagle3.layouts`), for ``train`` and
``evaluate``.

:class:`HiddenStates` reads the kit's shards through memory-mapped safetensors (fp8 shards dequantized on
read). :class:`SpeculatorsHiddenStates` and :class:`SpecForgeHiddenStates` read the trainers' files, with or
without the manifest this kit writes (a dump made by vLLM or SGLang: then the layer ids come from the
export's ``layer_ids.json`` or the trainer's defaults for the target), and yield what :class:`HiddenStates`
yields — ``input_ids`` int64, ``loss_mask`` uint8, ``aux`` ``[T, 3H]``, ``final`` ``[T, H]`` (post-norm; for
speculators the target's final RMSNorm is applied on read, in float32) — skipping, with the reason counted
in ``manifest["read_skipped_by_reason"]``, every file that is missing, unreadable, malformed, or whose token
ids disagree with its row. :func:`open_hidden_states` picks the reader (:func:`detect_layout`).
"""
from __future__ import annotations

import gzip
import io
import json
import os
import pickle
import re
from collections import Counter
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from kimi_eagle.assets import sha256_file
from kimi_eagle.eagle3.drafter_base import target_config
from kimi_eagle.eagle3.hidden import Row, load_rows
from kimi_eagle.eagle3.layers import check_layer_ids, default_layer_ids
from kimi_eagle.eagle3.layouts import (
    LAYOUT_FORMAT,
    MANIFEST,
    SCALES_KEY,
    SPECFORGE_NAME,
    SPECULATORS_NAME,
    arrow_rows,
    is_arrow_dir,
    load_layout_rows,
    row_names,
    speculators_path,
)
from kimi_eagle.eagle3.quant import dequantize_fp8


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The target's final RMSNorm in float32, with the operations of HF's ``LlamaRMSNorm`` (bit-identical
    to the target's own norm on float32 inputs)."""
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight.float() * x


# ------------------------------------------------------------------------------------------
# safetensors headers, checked before a file is opened


SAFETENSORS_DTYPES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2,
                      "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
SAFETENSORS_MAX_HEADER = 100 << 20  # the safetensors library's own limit on the JSON header


class CorruptFile(ValueError):
    """A hidden-state file whose bytes cannot be what its format or its manifest says (the message names it)."""


def _tensor_span(name: str, info: Any, data_size: int) -> tuple[int, int, str]:
    """``(start, end, name)`` of one header entry; ValueError saying what is wrong with it."""
    label = repr(name[:60])
    if not isinstance(info, dict):
        raise ValueError(f"tensor {label}: its entry is not an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in SAFETENSORS_DTYPES:
        raise ValueError(f"tensor {label}: unknown dtype {str(dtype)[:20]!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ValueError(f"tensor {label}: shape {str(shape)[:60]} is not a list of sizes")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets) or not 0 <= offsets[0] <= offsets[1]):
        raise ValueError(f"tensor {label}: data_offsets {str(offsets)[:60]} are not [start, end]")
    if offsets[1] > data_size:
        raise ValueError(f"tensor {label}: data_offsets {offsets} run past the {data_size} data bytes (truncated?)")
    n = SAFETENSORS_DTYPES[dtype]
    for d in shape:
        n *= d
    if n != offsets[1] - offsets[0]:
        raise ValueError(f"tensor {label}: shape {shape} of {dtype} needs {n} bytes, its offsets hold {offsets[1] - offsets[0]}")
    return offsets[0], offsets[1], label


def check_safetensors(path: str | Path) -> dict:
    """The header of the safetensors file ``path``, checked before any tensor is read: a length prefix inside
    the file and under :data:`SAFETENSORS_MAX_HEADER`, a JSON object, known dtypes, shapes whose bytes equal
    their offsets, and offsets that tile the data section exactly (no overlap, no gap, nothing past the end:
    a truncated file fails here). :class:`CorruptFile` (a ValueError) naming the file and what is wrong."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        n = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
        raw = f.read(n) if 0 <= n <= min(SAFETENSORS_MAX_HEADER, size - 8) else b""
    try:
        if n < 0:
            raise ValueError(f"{size} bytes: no 8-byte header length")
        if n > SAFETENSORS_MAX_HEADER or n > size - 8:
            raise ValueError(f"header length {n} is past the end of the {size}-byte file or the {SAFETENSORS_MAX_HEADER}-byte limit")
        try:
            header = json.loads(raw)
        except ValueError:
            raise ValueError("the header is not JSON") from None
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
        spans = sorted(_tensor_span(k, v, size - 8 - n) for k, v in header.items() if k != "__metadata__")
        end = 0
        for start, stop, label in spans:
            if start != end:
                raise ValueError(f"tensor {label}: data_offsets start at {start}, not at {end} "
                                 f"({'overlapping another tensor' if start < end else 'a gap before it'})")
            end = stop
        if end != size - 8 - n:
            raise ValueError(f"the tensors cover {end} of the {size - 8 - n} data bytes")
    except ValueError as e:
        raise CorruptFile(f"{path}: not a valid safetensors file: {e}") from None
    return header


def check_finite(tensor: torch.Tensor, where: str) -> None:
    """ValueError naming ``where`` when ``tensor`` holds NaN or ±Inf (hidden states a drafter must not train on)."""
    if tensor.is_floating_point() and not bool(torch.isfinite(tensor.float() if tensor.element_size() == 1 else tensor).all()):
        values = tensor.float()
        n_nan, n_inf = int(torch.isnan(values).sum()), int(torch.isinf(values).sum())
        raise ValueError(f"{where} holds {n_nan} NaN and {n_inf} Inf values; refusing to train on them "
                         "(extract the rows again)")


# ------------------------------------------------------------------------------------------
# the kit's shards


KIT_DTYPES = {"bf16": "BF16", "fp16": "F16", "fp32": "F32", "fp8": "F8_E4M3"}  # manifest dtype -> safetensors dtype
KIT_SHARD = re.compile(r"^shard-\d{5}\.safetensors$")


def check_kit_manifest(manifest: Any, where: Path) -> dict:
    """A kit manifest's fields :class:`HiddenStates` relies on (layer ids, sizes, dtype, shard entries with plain
    file names, sizes and hashes); :class:`CorruptFile` naming the field otherwise."""
    def bad(why: str) -> CorruptFile:
        return CorruptFile(f"{where}: {why}; extract the hidden states again")

    if not isinstance(manifest, dict):
        raise bad("not a JSON object")
    ids, h = manifest.get("layer_ids"), manifest.get("hidden_size")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise bad(f"layer_ids {str(ids)[:60]} are not block indices")
    if not isinstance(h, int) or isinstance(h, bool) or h < 1:
        raise bad(f"hidden_size {str(h)[:30]} is not a positive integer")
    if manifest.get("dtype") not in KIT_DTYPES:
        raise bad(f"dtype {str(manifest.get('dtype'))[:20]!r} is not one of {', '.join(KIT_DTYPES)}")
    shards = manifest.get("shards")
    if not isinstance(shards, list):
        raise bad("shards is not a list")
    for s in shards:
        if (not isinstance(s, dict) or not isinstance(s.get("file"), str) or not KIT_SHARD.match(s["file"])
                or not isinstance(s.get("ids"), list) or not isinstance(s.get("sha256"), str)
                or not isinstance(s.get("bytes"), int)):
            raise bad(f"shard entry {str(s)[:80]} lacks a shard-NNNNN.safetensors file, ids, sha256 or bytes")
    return manifest


def check_kit_shard(path: Path, entry: dict, manifest: dict, verify: bool = True) -> None:
    """Shard ``path`` is the one ``entry`` of ``manifest`` recorded: its size and (``verify``) sha256, a valid
    safetensors header (:func:`check_safetensors`) with the kit's tensors in the manifest's dtype and hidden size,
    one offset per row, and an I64 ``layer_ids`` tensor of the manifest's length when it has one. :class:`CorruptFile`."""
    if not path.is_file():
        raise CorruptFile(f"{path}: missing (listed in {MANIFEST}); extract the hidden states again")
    header = check_safetensors(path)
    if path.stat().st_size != entry["bytes"] or (verify and sha256_file(path) != entry["sha256"]):
        raise CorruptFile(f"{path}: its bytes differ from the sha256 {MANIFEST} recorded (a changed or truncated shard); "
                          "extract again (`extract --resume` redoes it)")
    h, dtype = manifest["hidden_size"], KIT_DTYPES[manifest["dtype"]]
    t = (header.get("input_ids") or {}).get("shape", [None])[0]
    n_aux = len(manifest.get("layer_ids") or (0, 1, 2))  # EAGLE-3: 3 target layers, DFlash: 5 (dflash_config)
    want = {"input_ids": ("I64", [t]), "loss_mask": ("U8", [t]), "aux": (dtype, [t, n_aux * h]), "final": (dtype, [t, h]),
            "offsets": ("I64", [len(entry["ids"]) + 1])}
    if manifest["dtype"] == "fp8":
        want.update(aux_scale=("F32", [t, n_aux]), final_scale=("F32", [t, 1]))
    for name, (dt, shape) in want.items():
        got = header.get(name)
        if not isinstance(got, dict) or got.get("dtype") != dt or got.get("shape") != shape:
            raise CorruptFile(f"{path}: tensor {name!r} is {_described(got)}, expected {dt} {shape} "
                              f"(hidden_size {h}, {len(entry['ids'])} rows in {MANIFEST})")
    if "layer_ids" in header and header["layer_ids"] != {**header["layer_ids"], "dtype": "I64", "shape": [n_aux]}:
        raise CorruptFile(f"{path}: tensor 'layer_ids' is {_described(header['layer_ids'])}, expected I64 [{n_aux}]")


def check_shard_layer_ids(f: Any, path: Path, manifest: dict) -> None:
    """The layer ids a shard was extracted with (its ``layer_ids`` tensor; shards of older kits have none) are the
    manifest's: an edited manifest never puts other block ids into a drafter's config (:class:`CorruptFile`)."""
    if "layer_ids" in f.keys() and f.get_tensor("layer_ids").tolist() != list(manifest["layer_ids"]):
        raise CorruptFile(f"{path.parent / MANIFEST}: layer_ids {manifest['layer_ids']} differ from the "
                          f"{f.get_tensor('layer_ids').tolist()} {path.name} was extracted with (an edited manifest); "
                          "restore it or extract again")


def _described(info: Any) -> str:
    return f"{info.get('dtype')} {info.get('shape')}" if isinstance(info, dict) else "missing"


def check_offsets(offsets: list, n_tokens: int, path: Path) -> None:
    """A shard's row offsets run from 0 to its token count without going back (:class:`CorruptFile` otherwise)."""
    if not offsets or offsets[0] != 0 or offsets[-1] != n_tokens or any(b < a for a, b in zip(offsets, offsets[1:])):
        raise CorruptFile(f"{path}: row offsets {str(offsets)[:60]} do not run from 0 to its {n_tokens} tokens")


class HiddenStates:
    """Memory-mapped reader of an extraction directory: ``len(hs)`` rows, ``hs[i]`` -> dict of tensors.

    Opening checks the manifest and every shard before any tensor is read (:func:`check_kit_manifest`,
    :func:`check_kit_shard`; ``verify``: also each shard's sha256 against the manifest's)."""

    def __init__(self, path: str | Path, verify: bool = True):
        from safetensors import safe_open

        self.path = Path(path)
        try:
            manifest = json.loads((self.path / MANIFEST).read_text(encoding="utf-8"))
        except ValueError as e:
            raise CorruptFile(f"{self.path / MANIFEST}: not JSON ({str(e).splitlines()[0][:80]})") from None
        self.manifest = check_kit_manifest(manifest, self.path / MANIFEST)
        self.layer_ids = tuple(self.manifest["layer_ids"])
        self.hidden_size = int(self.manifest["hidden_size"])
        for s in self.manifest["shards"]:
            check_kit_shard(self.path / s["file"], s, self.manifest, verify)
        self._files = [safe_open(str(self.path / s["file"]), framework="pt") for s in self.manifest["shards"]]
        self._index: list[tuple[int, int, int]] = []  # (file, start, end) per row
        self.row_ids: list[str] = []
        for k, (f, s) in enumerate(zip(self._files, self.manifest["shards"])):
            offsets = f.get_tensor("offsets").tolist()
            check_offsets(offsets, int(f.get_slice("input_ids").get_shape()[0]), self.path / s["file"])
            check_shard_layer_ids(f, self.path / s["file"], self.manifest)
            self._index.extend((k, a, b) for a, b in zip(offsets[:-1], offsets[1:]))
            self.row_ids.extend(str(i) for i in s["ids"])

    def file_of(self, i: int) -> str:
        """The file row ``i`` is read from."""
        return self.manifest["shards"][self._index[i][0]]["file"]

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
# any layout


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
        if not fmt and (d / MANIFEST).is_file() and any(KIT_SHARD.match(f.name) for f in d.iterdir()):
            return "kimi", d  # kit shards beside an unreadable manifest: HiddenStates names what is wrong with it
        if fmt == LAYOUT_FORMAT:
            return _own_manifest(d)["layout"], d
        if str(fmt).startswith("kimi-eagle-hidden/"):
            return "kimi", d
        if any(SPECULATORS_NAME.match(f.name) for f in d.iterdir()):
            return "speculators", d
    for d in (p / "hidden_states", p):
        for _root, _dirs, files in os.walk(d):
            if any(SPECFORGE_NAME.match(f) for f in files):
                return "specforge", d
    raise ValueError(f"{p}: no kit shards, hs_*.safetensors (speculators) or data_*.ckpt (SpecForge) found")


def open_hidden_states(path: str | Path, target: str | Path | None = None, rows: Sequence[Row] | None = None):
    """A reader of any layout with :class:`HiddenStates`' interface (``len``,
    ``[i]``, ``layer_ids``, ``hidden_size``, ``row_ids``, ``manifest["vocab_size"]``, ``lengths()``).

    ``target`` (the HF target directory) is needed for foreign layouts: its final norm (speculators),
    vocabulary size and default layer ids. ``rows``: the rows the files must match (default: the rows
    the layout names — its manifest's ``rows_source``, or the export directory it sits in)."""
    layout, hidden_dir = detect_layout(path)
    if layout == "kimi":
        data = HiddenStates(hidden_dir)
        if target is not None:
            check_target_fits(data.manifest, hidden_dir / MANIFEST, target)
        return data
    if target is None:
        raise ValueError(f"{path}: reading the {layout} layout needs the target directory")
    cls = SpeculatorsHiddenStates if layout == "speculators" else SpecForgeHiddenStates
    return cls(hidden_dir, target, rows=rows)


def check_target_fits(manifest: dict, where: Path, target: str | Path) -> None:
    """The manifest's layer ids, layer count and hidden size fit ``target`` (ValueError naming the field):
    an edited or foreign manifest never puts block ids the target lacks into a drafter's config."""
    cfg = _target_config(target)
    n_layers, hidden = int(cfg["num_hidden_layers"]), int(cfg["hidden_size"])
    for key, want in (("n_layers", n_layers), ("hidden_size", hidden)):
        if key in manifest and manifest[key] != want:
            raise CorruptFile(f"{where}: {key} {manifest[key]} differs from the target's {want} ({target})")
    vocab = manifest.get("vocab_size", 1)
    if type(vocab) is not int or vocab < 1:
        raise CorruptFile(f"{where}: vocab_size {str(vocab)[:40]!r} is not a whole number from 1; extract the hidden "
                          "states again")
    try:
        check_layer_ids(manifest["layer_ids"], n_layers, count=None)  # EAGLE-3's 3 or DFlash's set (dflash_config)
    except ValueError as e:
        raise CorruptFile(f"{where}: {e} (the target has {n_layers} blocks)") from None


def check_hidden_finite(data: Any) -> None:
    """Every row's ``aux`` and ``final`` of a hidden-state reader are finite; ValueError naming the file, the
    row and the tensor of the first NaN/Inf (read row by row: one row in memory at a time)."""
    for i in range(len(data)):
        row = data[i]
        for name in ("aux", "final"):
            where = f"{data.path / data.file_of(i)}: row {data.row_ids[i]!r}, tensor {name!r},"
            check_finite(row[name], where)


def _own_manifest(hidden_dir: Path, any_format: bool = False) -> dict:
    """The ``manifest.json`` in ``hidden_dir`` if it is a layout manifest written here (any kit format with
    ``any_format``); else ``{}`` (an export-data manifest, a foreign dump, unreadable JSON)."""
    try:
        m = json.loads((hidden_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(m, dict):
        return {}
    return m if m.get("format") == LAYOUT_FORMAT or any_format else {}


def _target_config(target: str | Path) -> dict:
    return target_config(target)  # its sizes checked: a wrong-typed field is named, never a TypeError


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
        long_rows = (self.own_manifest or {}).get("long_rows") or {}
        self.long_rows = {int(r["row"]): r["reason"] for r in long_rows.get("rows", [])}  # left out by the policy
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

    def file_of(self, i: int) -> str:
        """The file row ``i`` is read from, relative to the directory."""
        return str(self._path_at(i).relative_to(self.path))

    def _path_at(self, i: int) -> Path:  # pragma: no cover - subclasses
        raise NotImplementedError

    def _finish(self, names: dict[int, str]) -> None:
        self.row_ids = [names.get(k, str(k)) for k in self._keys]
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


class SpeculatorsHiddenStates(_LayoutReader):
    """``hs_{row}.safetensors`` files paired with the export's Arrow rows (``token_ids`` must equal the row's
    ``input_ids``, as speculators' ``ArrowDataset`` requires); ``final`` = the target's final norm of the
    stored last layer."""

    layout = "speculators"

    def __init__(self, hidden_dir: str | Path, target: str | Path, rows: Sequence[Row] | None = None):
        from safetensors import safe_open

        from kimi_eagle.eagle3.drafter_base import target_tensor

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
            if k in self.long_rows:
                self._skip(k, path.name, f"long row: {self.long_rows[k]}")
                continue
            if not path.is_file():
                self._skip(k, path.name, "missing: no hidden-state file for this row")
                continue
            try:
                check_safetensors(path)
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
            layers = len(self.layer_ids) + 1  # the aux layers (EAGLE-3's 3, DFlash's set), then the last block
            if shape != (len(row.input_ids), layers, self.hidden_size):
                self._skip(k, path.name, f"malformed: hidden_states shape {list(shape)}, expected "
                                         f"[{len(row.input_ids)}, {layers}, {self.hidden_size}]")
                continue
            self._keys.append(k)
            self._lengths.append(len(row.input_ids))
        self._finish(row_names(self.path, export_dir) or {k: r.id for k, r in enumerate(self.rows)})

    def _path_at(self, i: int) -> Path:
        return speculators_path(self.path, self._keys[i])

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
                "aux": hs[:, :-1].reshape(hs.shape[0], -1), "final": rms_norm(hs[:, -1], self._norm_weight, self._eps)}

    def token_rows(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(input_ids, loss_mask)`` of every kept row, without reading hidden states."""
        return ((torch.tensor(self.rows[k].input_ids), torch.tensor(self.rows[k].loss_mask, dtype=torch.uint8))
                for k in self._keys)


GZIP_MAX_RATIO = 32  # hidden states compress by well under 2x; a gzip bomb by 1000x
GZIP_MIN_LIMIT = 64 << 20  # bytes any .gz may expand to, whatever its ratio


class DecompressedTooLarge(ValueError):
    """A ``.gz`` file that expands past its limit (a gzip bomb, or not hidden states)."""


def read_gzip_bounded(path: Path, limit: int | None = None) -> bytes:
    """The decompressed bytes of ``path``, read in chunks and refused past ``limit`` (default: the larger of
    :data:`GZIP_MIN_LIMIT` and :data:`GZIP_MAX_RATIO` times the compressed size) before more is allocated."""
    limit = limit if limit is not None else max(GZIP_MIN_LIMIT, GZIP_MAX_RATIO * path.stat().st_size)
    out = io.BytesIO()
    with gzip.open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            if out.tell() + len(chunk) > limit:
                raise DecompressedTooLarge(f"{path.name}: decompresses to more than {limit} bytes "
                                           f"({path.stat().st_size} compressed); refused as a gzip bomb")
            out.write(chunk)
    out.seek(0)
    return out.getvalue()


def load_specforge_file(path: str | Path) -> dict[str, Any]:
    """A SpecForge ``.ckpt`` (or ``.ckpt.gz``, bounded by :func:`read_gzip_bounded`) with
    ``torch.load(weights_only=True)``: tensors and plain data only; anything else raises ``pickle.UnpicklingError``."""
    path = Path(path)
    if path.name.endswith(".gz"):
        return torch.load(io.BytesIO(read_gzip_bounded(path)), weights_only=True)
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
        files = self._named_files()
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
            except DecompressedTooLarge as e:
                self._skip(idx, path.name, f"refused: {e}")
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
        names = row_names(self.path, export_dir)
        if not names and self.rows is not None:
            names = {k: r.id for k, r in enumerate(self.rows)}
        self._finish(names)
        self.manifest["rows_checked"] = self.rows is not None

    def _path_at(self, i: int) -> Path:
        return self._files[i]

    def _named_files(self) -> dict[int, Path]:
        """``{idx: path}`` of every ``data_{idx}.ckpt`` below the directory; other ``.ckpt`` names and
        duplicate indexes are skipped with the reason."""
        files: dict[int, Path] = {}
        for root, _dirs, names in os.walk(self.path):
            for name in sorted(names):
                if not (name.endswith(".ckpt") or name.endswith(".ckpt.gz")):
                    continue
                m = SPECFORGE_NAME.match(name)
                if not m:
                    self._skip(None, name, "unrecognised name: expected data_{idx}.ckpt")
                elif int(m.group(1)) in files:
                    self._skip(int(m.group(1)), name, f"duplicate index: {files[int(m.group(1))]} kept")
                else:
                    files[int(m.group(1))] = Path(root) / name
        return files

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
