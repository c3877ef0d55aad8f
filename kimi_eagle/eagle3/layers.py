"""Which target layers feed the drafter, and how each engine numbers them.

The kit's convention (stored in hidden-state manifests and drafter configs) is the **0-based
block-output index**: id ``i`` is the output of decoder block ``i`` (the residual stream after block
``i``; HF ``output_hidden_states[i + 1]``). Engines count differently: :func:`engine_layer_ids`
converts to an engine's ``eagle_aux_hidden_state_layer_ids`` and :func:`layer_ids_from_engine` reads
a foreign export's ids back (see docs/eagle3.md for the table).
"""
from __future__ import annotations

from typing import Sequence

from kimi_eagle.eagle3.dflash_config import dflash_layer_ids

CONVENTION = "0-based block-output index (HF hidden_states[i + 1])"
ENGINES = ("sglang", "vllm")


def default_layer_ids(n_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's low/mid/high layers as 0-based block outputs.

    ``(1, L//2 - 1, L - 4)`` when strictly increasing (Kimi's 61 layers -> 1, 29, 57); otherwise an
    evenly spread distinct triple over blocks 1..L-2 (1..L-1, then 0..L-1 for very small models).
    Block 0 is avoided when possible because SGLang cannot express it (see :func:`engine_layer_ids`).
    """
    lo, mid, hi = 1, n_layers // 2 - 1, n_layers - 4
    if lo < mid < hi:
        return lo, mid, hi
    for first, last in ((1, n_layers - 2), (1, n_layers - 1), (0, n_layers - 1)):
        if last - first >= 2:
            span = last - first
            ids = (first, first + int(span / 2 + 0.5), last)
            if ids[0] < ids[1] < ids[2]:
                return ids
    raise ValueError(f"a target with {n_layers} layers has no 3 distinct block outputs")


def check_layer_ids(layer_ids: Sequence[int], n_layers: int, count: int | None = 3) -> tuple[int, ...]:
    """``layer_ids`` as a tuple of ``count`` (EAGLE-3: 3; None: any number, e.g. DFlash's 5) distinct block
    indices of an ``n_layers`` target; ValueError otherwise."""
    ids = tuple(int(i) for i in layer_ids)
    want = count if count is not None else max(1, len(ids))
    if len(ids) != want or len(set(ids)) != want or not all(0 <= i < n_layers for i in ids):
        what = f"{count}" if count is not None else "1 or more"
        raise ValueError(f"layer ids must be {what} distinct block indices in [0, {n_layers - 1}], got {list(layer_ids)}")
    return ids


def engine_layer_ids(layer_ids: Sequence[int], engine: str) -> list[int]:
    """``eagle_aux_hidden_state_layer_ids`` for an engine, from 0-based block-output indices.

    * ``vllm`` (and speculators): an id ``j`` captures the residual stream *before* block ``j``,
      i.e. the output of block ``j - 1``: write ``i + 1``.
    * ``sglang``: captures before block ``j`` too, but adds 1 to the configured ids only when the
      first id is 1 (it then reads them as block outputs); otherwise it uses them as they are. So ids
      starting at 1 are written unchanged and others as ``i + 1``; block 0 cannot be expressed.
    """
    ids = [int(i) for i in layer_ids]
    if engine == "vllm":
        return [i + 1 for i in ids]
    if engine == "sglang":
        if ids[0] == 1:
            return ids
        if ids[0] == 0:
            raise ValueError("SGLang cannot express block output 0 (written as 1 it is read as block output 1)")
        return [i + 1 for i in ids]
    raise ValueError(f"unknown engine {engine!r} (sglang or vllm)")


def layer_ids_from_engine(engine_ids: Sequence[int]) -> list[int]:
    """0-based block-output indices of a foreign export's ``eagle_aux_hidden_state_layer_ids``.

    A foreign checkpoint does not say which engine it was written for; it is read in the vLLM /
    speculators "capture before block ``j``" convention, so id ``j`` is block output ``j - 1``
    (the inverse of ``engine_layer_ids(ids, "vllm")``). The kit's own exports carry their block-output
    ids and never need this.
    """
    return [int(j) - 1 for j in engine_ids]


# ------------------------------------------------------------------------------------------
# the trainers' conventions (SpecForge on SGLang, vLLM's speculators)

TRAINERS = ("kimi", "sglang", "specforge", "vllm", "speculators")


def trainer_layer_ids(layer_ids: Sequence[int], n_layers: int, trainer: str, count: int | None = 3) -> list[int]:
    """The aux layer ids a trainer's config takes for the kit's 0-based block outputs ``layer_ids`` (``count`` of
    them: EAGLE-3's 3; None: any number, e.g. DFlash's set, :mod:`kimi_eagle.eagle3.dflash_config`).

    * ``kimi``: the ids themselves (block outputs).
    * ``sglang`` / ``specforge``: SpecForge's ``model.aux_hidden_state_layer_ids`` is passed to SGLang,
      so it follows :func:`engine_layer_ids` ``"sglang"`` (Kimi's 1, 29, 57 are written 1, 29, 57).
    * ``vllm`` / ``speculators``: capture-before-block ids (``i + 1``: Kimi 2, 30, 58). speculators
      stores the last layer too, as id ``n_layers`` (see :func:`speculators_layer_ids`).
    """
    ids = list(check_layer_ids(layer_ids, n_layers, count))
    if trainer == "kimi":
        return ids
    if trainer in ("sglang", "specforge"):
        return engine_layer_ids(ids, "sglang")
    if trainer in ("vllm", "speculators"):
        return engine_layer_ids(ids, "vllm")
    raise ValueError(f"unknown trainer {trainer!r}: choose from {', '.join(TRAINERS)}")


def speculators_layer_ids(layer_ids: Sequence[int], n_layers: int, count: int | None = 3) -> list[int]:
    """The capture-before ids of a speculators hidden-state file: the aux layers, then ``n_layers`` (the last
    block's output before the final norm). Kimi's EAGLE-3 defaults: ``[2, 30, 58, 61]``."""
    return trainer_layer_ids(layer_ids, n_layers, "vllm", count) + [n_layers]


def layer_ids_from_trainer(trainer_ids: Sequence[int], n_layers: int, trainer: str) -> list[int]:
    """0-based block outputs of ids written in ``trainer``'s convention (the inverse of
    :func:`trainer_layer_ids`; a trailing final-layer id ``n_layers`` is dropped)."""
    ids = [int(j) for j in trainer_ids]
    if trainer in ("vllm", "speculators"):
        if len(ids) == 4 and ids[-1] == n_layers:
            ids = ids[:3]
        return list(check_layer_ids([j - 1 for j in ids], n_layers))
    if trainer in ("sglang", "specforge"):
        return list(check_layer_ids(ids if ids[0] == 1 else [j - 1 for j in ids], n_layers))
    if trainer == "kimi":
        return list(check_layer_ids(ids, n_layers))
    raise ValueError(f"unknown trainer {trainer!r}: choose from {', '.join(TRAINERS)}")


def convention_table(n_layers: int, layer_ids: Sequence[int] | None = None,
                     count: int | None = 3) -> dict[str, list[int]]:
    """Every convention's ids for one target (default: EAGLE-3's low/mid/high; ``count=None`` with DFlash's
    set), e.g. for docs and configs."""
    ids = list(layer_ids) if layer_ids is not None else list(default_layer_ids(n_layers))
    return {
        "kimi_block_output": trainer_layer_ids(ids, n_layers, "kimi", count),
        "hf_output_hidden_states_index": [i + 1 for i in ids],
        "sglang_specforge": trainer_layer_ids(ids, n_layers, "sglang", count),
        "vllm_speculators": trainer_layer_ids(ids, n_layers, "vllm", count),
        "speculators_file_layers": speculators_layer_ids(ids, n_layers, count),
    }


# ------------------------------------------------------------------------------------------
# the layer set each drafter reads (its default rule, and how many ids it takes: None = any number)

DRAFTER_LAYERS = {"eagle3": (default_layer_ids, 3), "dflash": (dflash_layer_ids, None)}
DRAFTERS = tuple(DRAFTER_LAYERS)


def drafter_layer_ids(drafter: str, n_layers: int, layer_ids: Sequence[int] | None = None) -> tuple[int, ...]:
    """``layer_ids`` checked for ``drafter`` (EAGLE-3: 3 distinct block outputs; DFlash: any number), or the
    drafter's default set for an ``n_layers`` target (:func:`default_layer_ids`, :func:`dflash_layer_ids`)."""
    if drafter not in DRAFTER_LAYERS:
        raise ValueError(f"unknown drafter {drafter!r}: choose from {', '.join(DRAFTERS)}")
    default, count = DRAFTER_LAYERS[drafter]
    return check_layer_ids(layer_ids, n_layers, count) if layer_ids is not None else tuple(default(n_layers))
