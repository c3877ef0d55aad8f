"""DFlash defaults in one place: the block size, the target layer set and the mask token.

Read by the kit's DFlash drafter (:mod:`kimi_eagle.eagle3.dflash`), by ``extract --layout speculators`` and by
``export-data --to speculators`` so that the CPU drafter and the hand-off to speculators' ``dflash`` / ``dspark``
agree. Facts, with their sources (no code copied):

* **block size 8** — ``DFlashSpeculatorConfig.block_size`` defaults to 8 in speculators 0.9.0 and the public
  Kimi-K2.5 DFlash numbers (acceptance length 5.3 GSM8K / 3.7 MT-Bench) are at block 8 (speculators' *train CLI*
  defaults ``dflash`` to 16, ``dspark``/``dflash2`` to 8). A block is the anchor (the last committed token) plus
  ``block_size - 1`` mask tokens, so at most ``block_size - 1`` drafts and ``block_size`` tokens per round
  (``sample_from_anchor = False``, speculators' default for ``dflash``).
* **5 target layers** — z-lab's DFlash conditions on one target layer per draft layer and speculators' CLI builds
  5 draft layers for ``dflash``/``dspark``/``dflash2``; z-lab's rule (``build_target_layer_ids`` in z-lab/dflash
  ``model/utils.py``, mirrored by SGLang's ``dflash_utils``) spreads ``n`` ids evenly over block outputs
  ``1 .. L-3`` (``round(1 + i (L - 4) / (n - 1))``) and reads ``hidden_states[i + 1]`` — the kit's 0-based
  block-output convention (:mod:`kimi_eagle.eagle3.layers`). For Kimi's 61 layers: ``1, 15, 30, 44, 58``.
  speculators' ``aux_hidden_state_layer_ids`` count capture-before ids (``i + 1``: Kimi ``2, 16, 31, 45, 59``);
  its own default when none are given is EAGLE-3's three ``[2, L//2, L-3]``.
* **mask token** — speculators resolves ``mask_token_id`` as: the tokenizer's mask token, else an added
  ``<|MASK|>`` when the embedding has unused rows, else pad, eos, unk. Kimi's tokenizer has no mask token and
  no unused row (163,840 ids, the reserved ones included), so it is ``[PAD]`` = 163839; stories260K has no pad,
  so its eos (2). The kit's drafter keeps the target's embeddings frozen, so the mask's embedding is that token's.
"""
from __future__ import annotations

from pathlib import Path

BLOCK_SIZE = 8
NUM_TARGET_LAYERS = 5
KIMI_MASK_TOKEN_ID = 163839  # [PAD] in Kimi's tokenizer_config.json (no mask token, no unused rows)
MASK_FALLBACK = ("mask_token_id", "pad_token_id", "eos_token_id", "unk_token_id")  # speculators' order


def dflash_layer_ids(n_layers: int, count: int = NUM_TARGET_LAYERS) -> tuple[int, ...]:
    """DFlash's target layers as 0-based block outputs: z-lab's even spread over ``1 .. L-3`` (Kimi's 61 layers ->
    ``(1, 15, 30, 44, 58)``); a target too small for ``count`` distinct ids there gets ``min(count, L)`` ids spread
    evenly over all its blocks (stories260K's 5 layers -> ``(0, 1, 2, 3, 4)``)."""
    if n_layers < 1 or count < 1:
        raise ValueError(f"DFlash needs a target with layers and at least one target layer ({n_layers=}, {count=})")
    if count == 1:
        return (n_layers // 2,)
    ids = tuple(int(round(1 + i * (n_layers - 4) / (count - 1))) for i in range(count))
    if len(set(ids)) == count and ids[0] >= 0:
        return ids
    n = min(count, n_layers)
    if n == 1:
        return (n_layers - 1,)
    return tuple(sorted({int(round(i * (n_layers - 1) / (n - 1))) for i in range(n)}))


class MaskTokenInvalid(ValueError):
    """A target's config.json sets a mask/pad/eos/unk id that is not a token id: refused, never skipped past."""


def mask_token_id(target_dir: str | Path) -> int:
    """The mask token of a target, in its own id space (rows for a row-mapped tiny-kimi): Kimi's ``[PAD]`` for a
    Kimi-ID target, else the first of :data:`MASK_FALLBACK` its ``config.json`` sets (ValueError when none)."""
    import json

    from kimi_eagle.eagle3.row_space import target_id_map

    id_map = target_id_map(target_dir)
    if id_map is not None:
        if KIMI_MASK_TOKEN_ID not in id_map:
            raise ValueError(f"{target_dir}: the row map has no row for Kimi's [PAD] ({KIMI_MASK_TOKEN_ID}), the mask token")
        return id_map.to_rows([KIMI_MASK_TOKEN_ID])[0]
    try:  # a page of numbers (model.read_config_json is not imported: model imports layers, which imports this)
        config = json.loads((Path(target_dir) / "config.json").read_bytes()[: 1 << 20])
    except (OSError, ValueError) as e:
        raise ValueError(f"{target_dir}: cannot read the target's config.json ({e})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{target_dir}: config.json is not a JSON object")
    vocab = config.get("vocab_size")
    for key in MASK_FALLBACK:
        value = config.get(key)
        value = value[0] if isinstance(value, list) and value else value
        if value is None:
            continue
        if type(value) is not int:  # "2", 2.0, true: refused, never skipped for the next key (unk 0 in its place)
            raise MaskTokenInvalid(f"{target_dir}: config.json {key} is {str(value)[:40]!r}, not an integer token id; "
                                   f"DFlash's mask token is the first of {', '.join(MASK_FALLBACK)} the config sets: "
                                   "fix the config")
        if type(vocab) is int and 0 <= value < vocab:
            return value
    raise ValueError(f"{target_dir}: config.json names no mask, pad, eos or unk token to use as DFlash's mask token")
