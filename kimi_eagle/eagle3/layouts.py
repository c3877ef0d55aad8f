"""The three on-disk layouts of target hidden states: their facts, file names and the rows they pair with.

:func:`kimi_eagle.eagle3.extract.extract` writes any of them (one writer per layout,
:mod:`kimi_eagle.eagle3.writers`); :func:`kimi_eagle.eagle3.readers.open_hidden_states` reads any of them for
``train`` and ``evaluate``. Facts of speculators 0.9.0 / hs-connectors 0.9.0 and SpecForge 0.2.0, checked
against their code in ``tests/test_interop_layouts.py``:

* ``kimi``: the kit's own safetensors shards ``shard-{k:05d}.safetensors`` plus ``manifest.json`` (format
  ``kimi-eagle-hidden/1``). Each shard holds, for its rows concatenated along tokens: ``input_ids`` int64
  [T], ``loss_mask`` uint8 [T], ``aux`` [T, 3H], ``final`` [T, H] (bf16, fp16 or fp32; or fp8 —
  float8_e4m3fn plus ``aux_scale`` [T, 3] and ``final_scale`` [T, 1], one fp32 absmax scale per token and
  layer, :mod:`kimi_eagle.eagle3.quant`), ``offsets`` int64 [rows + 1], ``row_index`` int64 [rows] (the
  row's position in the input) and ``layer_ids`` int64 [3] (the block ids it was extracted with, checked against
  the manifest on read). Shard ``k`` covers input rows ``[k·shard_rows, (k+1)·shard_rows)``.
* ``speculators``: one ``hs_{row}.safetensors`` per Arrow row of a ``kimi-eagle export-data --to
  speculators`` directory (``hs_{row}`` must be that dataset's row ``row``: speculators' ``ArrowDataset``
  reads file ``i`` for row ``i``), holding ``token_ids`` int64 ``[T]`` and ``hidden_states`` ``[T, n + 1, H]``:
  the ``n`` aux layers (EAGLE-3's three; DFlash's set with ``extract --drafter dflash``, for speculators'
  ``dflash``/``dspark``, conventionally in ``hidden_states_dflash``), then the last block's output **before** the
  final norm (vLLM's capture-before ids ``[aux + 1..., n_layers]``; speculators' model applies the verifier's norm
  itself). bf16/fp16, or the FP8 variant of hs-connectors' ``FP8HiddenStatesConnector``: float8_e4m3fn
  ``hidden_states`` plus fp32 ``hidden_states_scales`` ``[T, 1, 1]``, one absmax scale per token over all its
  layers. Loss masks are not in the files: they are the Arrow rows' ``loss_mask``.
* ``specforge``: one ``torch.save`` dict per row, ``rows_{g}-{g+2000}/data_{idx}.ckpt`` (``g`` = ``idx``
  rounded down to a multiple of 2000), with ``input_ids`` and ``loss_mask`` int64 ``[T]``,
  ``hidden_state`` ``[1, T, H]`` (the last layer **after** the final norm: SpecForge's target head is the
  bare ``lm_head``) and ``aux_hidden_state`` ``[1, T, 3H]``. Read here with ``torch.load(...,
  weights_only=True)`` only; rows are matched by the ``idx`` in the file name, never by position
  (SpecForge sorts paths as strings: ``data_10`` before ``data_2``).

Both trainer layouts get a ``manifest.json`` (format ``kimi-eagle-hidden-layout/1``; the trainers'
loaders only look at ``hs_*.safetensors`` / ``*.ckpt`` files) and ``row_ids.jsonl`` (``row``, ``id``,
``n_tokens``, ``file``). Every manifest states the long-row policy under ``long_rows``
(:func:`kimi_eagle.eagle3.extract.long_rows`).
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

from kimi_eagle.eagle3.hidden import Row, load_rows
from kimi_eagle.eagle3.quant import FP8_DTYPE
from kimi_eagle.io import read_jsonl

LAYOUTS = ("kimi", "speculators", "specforge")
KIT_FORMAT = "kimi-eagle-hidden/1"
LAYOUT_FORMAT = "kimi-eagle-hidden-layout/1"
MANIFEST = "manifest.json"
ROW_IDS = "row_ids.jsonl"
SCALES_KEY = "hidden_states_scales"  # hs-connectors' name for the FP8 scales
SPECFORGE_GROUP = 2000
STORE_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp8": FP8_DTYPE}
SPECFORGE_NAME = re.compile(r"^data_(\d+)\.ckpt(\.gz)?$")
SPECULATORS_NAME = re.compile(r"^hs_(\d+)\.safetensors$")


def kit_shard_name(k: int) -> str:
    """``shard-{k:05d}.safetensors``: the kit's shard ``k``."""
    return f"shard-{k:05d}.safetensors"


def speculators_path(hidden_dir: str | Path, row: int) -> Path:
    """``hidden_dir/hs_{row}.safetensors`` (hs-connectors' ``FileTransfer`` name)."""
    return Path(hidden_dir) / f"hs_{row}.safetensors"


def specforge_path(hidden_dir: str | Path, idx: int) -> Path:
    """``hidden_dir/rows_{g}-{g+2000}/data_{idx}.ckpt`` (SpecForge's ``prepare_hidden_states`` name)."""
    g = idx // SPECFORGE_GROUP * SPECFORGE_GROUP
    return Path(hidden_dir) / f"rows_{g}-{g + SPECFORGE_GROUP}" / f"data_{idx}.ckpt"


# ------------------------------------------------------------------------------------------
# the rows a layout pairs with


def is_arrow_dir(path: str | Path) -> bool:
    """A ``datasets.save_to_disk`` directory (``state.json`` and ``dataset_info.json``)."""
    p = Path(path)
    return p.is_dir() and (p / "state.json").is_file() and (p / "dataset_info.json").is_file()


def row_names(*dirs: Path | None) -> dict[int, str]:
    """``{row: id}`` from the first of ``dirs`` holding a ``row_ids.jsonl`` (``{}`` when none does)."""
    for d in dirs:
        if d is not None and (d / ROW_IDS).is_file():
            return {int(line.obj["row"]): str(line.obj["id"]) for line in read_jsonl(d / ROW_IDS)
                    if line.error is None and isinstance(line.obj, dict)}
    return {}


def arrow_rows(path: str | Path) -> list[Row]:
    """The rows of an export-data Arrow dataset in dataset order (ids from its ``row_ids.jsonl``)."""
    import datasets

    ds = datasets.load_from_disk(str(path)).with_format(None)
    names = row_names(Path(path))
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
