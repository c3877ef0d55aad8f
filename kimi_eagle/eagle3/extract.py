"""The one hidden-state extraction loop, for every layout (kit shards, speculators, SpecForge).

The target runs once per length-bucketed batch (:func:`~kimi_eagle.eagle3.hidden.batches_by_length`), its
forward hooks capture the three auxiliary block outputs (:class:`~kimi_eagle.eagle3.hidden.Extractor`; the
speculators layout also takes the last block's output before the final norm), and the layout's writer
(:mod:`kimi_eagle.eagle3.writers`) turns the rows into files. A run resumes where an earlier one with the
same settings stopped, and refuses a directory holding different ones.

Long rows, one policy for every layout: a row with more tokens than ``max_len`` (default: the target's
``max_position_embeddings``) is **skipped**, never cut, and the manifest says so under ``long_rows``:
``{"policy": "skip", "max_len": N, "n": k, "rows": [{"row", "id", "n_tokens", "reason"}, ...]}``. Skipping
keeps every written row equal to its input row: a cut row would be different training data (its
completion ends mid-sequence), and the trainer layouts could not hold one anyway (speculators and
SpecForge files must carry their exported row's exact token ids).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from kimi_eagle.eagle3.hidden import Extractor, Row, batches_by_length, load_target, pad_batch, target_hash
from kimi_eagle.eagle3.layers import drafter_layer_ids
from kimi_eagle.eagle3.layouts import LAYOUTS, MANIFEST, STORE_DTYPES
from kimi_eagle.eagle3.row_space import target_id_map
from kimi_eagle.eagle3.writers import WRITERS, KitWriter, RowStates, TargetFacts, TrainerLayoutWriter, WorkUnit

LONG_ROW_POLICY = "skip"


@dataclass(frozen=True)
class ExtractOptions:
    """How :func:`extract` runs. ``shard_rows``: rows per kit shard, or per work chunk in the trainer
    layouts; ``max_tokens``: padded tokens per forward batch; ``max_len``: the long-row limit (None: the
    target's positions); ``skipped``: the input's unusable records, carried into the manifest;
    ``rows_source`` and ``keep_literal_marker``: where the rows came from (trainer layouts' manifest, so
    their readers can find the rows again)."""

    layout: str = "kimi"
    layer_ids: Sequence[int] | None = None
    drafter: str = "eagle3"  # whose layer set (default and count): :data:`~kimi_eagle.eagle3.layers.DRAFTER_LAYERS`
    dtype: str = "bf16"
    shard_rows: int = 256
    max_tokens: int = 4096
    max_len: int | None = None
    skipped: Sequence[dict] = ()
    rows_source: str | Path | None = None
    keep_literal_marker: bool = False
    progress: bool = False

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout {self.layout!r}: expected one of {', '.join(LAYOUTS)}")
        if self.dtype not in STORE_DTYPES:
            raise ValueError(f"dtype {self.dtype!r}: expected one of {', '.join(STORE_DTYPES)}")
        if self.layout == "specforge" and self.dtype == "fp8":
            raise ValueError("--dtype fp8 is speculators' FP8 variant; SpecForge's offline files are bf16/fp16")


Writer = KitWriter | TrainerLayoutWriter


def make_writer(out: Path, facts: TargetFacts, options: ExtractOptions) -> Writer:
    """The writer of ``options.layout``."""
    return WRITERS[options.layout](out, facts, options)


def long_rows(rows: Sequence[Row], max_len: int) -> dict:
    """The long-row policy as every manifest states it: the rows over ``max_len`` tokens, skipped, with why."""
    over = [{"row": k, "id": r.id, "n_tokens": len(r.input_ids),
             "reason": f"longer than the {max_len}-token limit ({len(r.input_ids)} tokens)"}
            for k, r in enumerate(rows) if len(r.input_ids) > max_len]
    return {"policy": LONG_ROW_POLICY, "max_len": max_len, "n": len(over), "rows": over}


def target_facts(target: str | Path, model: Any, rows: Sequence[Row], options: ExtractOptions) -> TargetFacts:
    """Layer ids, sizes, hashes and the long-row limit; raises ValueError when a row has an input ID
    outside the target's embedding rows."""
    cfg = model.config
    vocab_size = int(cfg.vocab_size)
    id_map = target_id_map(target)
    outside = next((r for r in rows if r.input_ids and not 0 <= min(r.input_ids) <= max(r.input_ids) < vocab_size), None)
    if outside is not None:
        hint = " (it maps Kimi IDs to rows: read the rows with load_rows(..., target=TARGET))" if id_map else ""
        raise ValueError(f"row {outside.id}: an input ID is outside the target's {vocab_size} rows{hint}")
    n_layers = cfg.num_hidden_layers
    ids = drafter_layer_ids(options.drafter, n_layers, options.layer_ids)
    data_hash = hashlib.sha256(json.dumps([[r.id, r.input_ids, r.loss_mask] for r in rows]).encode()).hexdigest()
    return TargetFacts(
        target=str(target), dtype=options.dtype, layer_ids=tuple(ids), n_layers=n_layers,
        hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size, target_sha256=target_hash(target),
        data_sha256=data_hash, max_len=options.max_len or int(getattr(cfg, "max_position_embeddings", 1 << 30)),
        row_space=id_map is not None)


def resumable_manifest(out: Path, settings: dict) -> dict | None:
    """The manifest of an earlier run in ``out`` (None when there is none); ValueError when its settings
    differ from ``settings`` (``target``, a path, may differ)."""
    path = out / MANIFEST
    if not path.exists():
        return None
    try:
        previous = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ValueError(f"{path}: not JSON ({str(e).splitlines()[0][:80]}); use a new directory") from None
    shards = previous.get("shards", []) if isinstance(previous, dict) else None
    if not isinstance(shards, list) or not all(isinstance(s, dict) for s in shards):
        raise ValueError(f"{path}: not a manifest this kit wrote (no list of shard entries); use a new directory")
    changed = [k for k, v in settings.items() if k != "target" and previous.get(k) != v]
    if changed:
        raise ValueError(f"{out} holds hidden states with different {', '.join(changed)}; use a new directory")
    return previous


class LastBlockOutput:
    """A forward hook keeping the last decoder block's output (before the final norm) of the latest forward."""

    def __init__(self, model: Any):
        self.output: torch.Tensor | None = None
        self._handle = model.model.layers[-1].register_forward_hook(self._hook)

    def _hook(self, _module, _inputs, output) -> None:
        self.output = output[0] if isinstance(output, tuple) else output

    def close(self) -> None:
        """Remove the hook."""
        self._handle.remove()


def row_states(extractor: Extractor, last_block: LastBlockOutput | None, rows: Sequence[Row], positions: list[int],
               max_tokens: int, dtype: torch.dtype) -> Iterator[tuple[int, RowStates]]:
    """``(position, states)`` of each row at ``positions``, batch by batch (one cast to ``dtype`` per batch)."""
    for batch in batches_by_length([len(rows[k].input_ids) for k in positions], max_tokens):
        ks = [positions[j] for j in batch]
        input_ids, attn = pad_batch([rows[k].input_ids for k in ks])
        aux, final = (t.to(dtype) for t in extractor(input_ids, attn))
        pre = None
        if last_block is not None and last_block.output is not None:
            pre, last_block.output = last_block.output.to(dtype), None
        for b, k in enumerate(ks):
            n = len(rows[k].input_ids)
            yield k, RowStates(aux[b, :n], final[b, :n], None if pre is None else pre[b, :n])


def run_units(model: Any, rows: Sequence[Row], units: list[WorkUnit], writer: Writer, options: ExtractOptions) -> None:
    """Forward and write every unit; the hooks are removed whatever happens."""
    extractor = Extractor(model, writer.facts.layer_ids)
    last_block = LastBlockOutput(model) if writer.needs_pre_norm else None
    shown: Any = units
    if options.progress:
        from tqdm.auto import tqdm

        desc, unit = writer.progress_label
        shown = tqdm(units, desc=desc, unit=unit)
    try:
        for work in shown:
            writer.write(work, rows, row_states(extractor, last_block, rows, work.positions, options.max_tokens,
                                                writer.batch_dtype))
    finally:
        extractor.close()
        if last_block is not None:
            last_block.close()


def extract(target: str | Path, rows: Sequence[Row], out: str | Path, options: ExtractOptions | None = None, *,
            model: Any = None, **option_fields: Any) -> dict:
    """Extract the hidden states of ``rows`` into ``out`` in ``options.layout``; resumes an earlier run with
    the same settings. ``model``: the loaded target (default: loaded from ``target``); ``option_fields``
    override fields of ``options`` (``extract(t, rows, out, dtype="fp8")``). Returns the manifest, with
    ``reused_rows``: the rows an earlier run had already extracted (not part of the written manifest)."""
    options = replace(options or ExtractOptions(), **option_fields)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model = model if model is not None else load_target(target)
    facts = target_facts(target, model, rows, options)
    writer = make_writer(out, facts, options)
    settings = writer.settings()
    policy = long_rows(rows, facts.max_len)
    writer.open(settings, rows, policy, resumable_manifest(out, settings))
    too_long = {r["row"] for r in policy["rows"]}
    pending = writer.pending(rows, too_long)
    run_units(model, rows, pending, writer, options)
    computed = sum(len(unit.positions) for unit in pending)
    return {**writer.finish(rows, too_long), "reused_rows": len(rows) - len(too_long) - computed}
