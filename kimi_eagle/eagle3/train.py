"""``kimi-eagle train``: train an EAGLE-3 drafter on extracted hidden states, with training-time test.

Loss: for each unroll step ``k`` (default 7 steps, weight ``0.8**k``), position ``t`` predicts token
``x[t+2+k]`` (see :mod:`kimi_eagle.eagle3.model`). Its soft target is the target model's distribution at
that point — ``softmax(target.lm_head(final[t+1+k]))`` restricted to the draft vocabulary and
renormalised, which equals a softmax over the target's logits of the draft tokens only, so only those
``Vd`` rows of the frozen ``lm_head`` are ever multiplied. A position is supervised when
``loss_mask[t+2+k] == 1`` — the mask is indexed by the token being predicted, so the first completion
token counts and prompt tokens never do. Each step's cross-entropy is summed over supervised
positions and divided by their number.

``online=True`` (``--online``) reads training rows instead of shards and computes the target's hidden
states inside each step (:mod:`kimi_eagle.eagle3.online`): nothing is stored, the loss is the same.

Runs single-process or under ``torchrun`` (DDP; gloo on CPU). Checkpoints hold the drafter, optimizer,
scheduler, RNG states, the data position, the settings and a fingerprint of the data; a run continues exactly
where a checkpoint stopped only when its settings and data equal the requested ones (:func:`choose_start`):
otherwise it starts fresh in a new run folder (``OUT.run2``, ...) or, with ``resume=True``, is refused.
Every summary says how it started: ``"start": "fresh"`` or ``"resumed from step N"``.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import random
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from kimi_eagle.eagle3 import draft_vocab, recipes
from kimi_eagle.eagle3.drafter_base import read_config_json, target_config, target_tensor
from kimi_eagle.eagle3.losses import expected_tau
from kimi_eagle.eagle3.readers import check_hidden_finite, open_hidden_states
from kimi_eagle.eagle3.row_space import id_space, target_id_map
from kimi_eagle.io import JsonlAppender, atomic_path, read_jsonl, write_json, write_jsonl


@dataclass
class TrainConfig:
    data: str  # hidden-state directory (kimi-eagle extract); with online=True, the rows extract would read
    target: str  # HF target directory (config, embeddings, lm_head)
    out: str
    steps: int = 200
    ttt_steps: int = 7
    step_weight: float = 0.8
    batch_size: int = 8  # rows per process per optimizer step
    lr: float | None = None  # None: the drafter's recipe (kimi_eagle.eagle3.recipes: EAGLE-3 3e-3, DFlash kit 1e-2)
    warmup: float = 0.05  # fraction of steps
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    draft_vocab_size: int = 256
    seed: int = 0
    save_every: int = 50
    log_every: int = 10
    resume: bool | None = None  # None: resume when the checkpoint's settings and data equal these, else start fresh in
    # a new run folder (see choose_start); True: resume or refuse (ResumeRefused); False: start fresh in ``out``
    stop_after: int | None = None  # stop (with a checkpoint) after this many steps in total: simulates an interruption
    progress: bool = True
    online: bool = False  # compute the target's hidden states in each step instead of reading shards
    layer_ids: list[int] | None = None  # online only: aux block-output ids (default: EAGLE-3's)
    drafter: str = "eagle3"  # "eagle3" (chain, training-time test) or "dflash" (block drafter, kimi_eagle.eagle3.dflash)
    block_size: int | None = None  # dflash only: anchor + mask tokens per block (None: the recipe's)
    draft_layers: int | None = None  # dflash only: decoder layers of the drafter (None: the recipe's)
    dflash_recipe: str = "kit"  # dflash only: kit | speculators | zlab (kimi_eagle.eagle3.recipes)
    dflash_weighting: str | None = None  # dflash only: power | exp | dpace (None: the recipe's)
    dflash_gamma: float | None = None  # dflash only: γ of exp(-(j-1)/γ) (None: the recipe's, 4)
    max_anchors: int | None = None  # dflash only: sampled anchors per step (None: the recipe's; 0: every anchor)


# ------------------------------------------------------------------------------------------
# data


def collate(rows: Sequence[dict]) -> dict[str, torch.Tensor]:
    """Right-pad rows to the longest: ids 0, mask 0, hidden states 0."""
    n = max(r["input_ids"].shape[0] for r in rows)
    out = {}
    for name in ("input_ids", "loss_mask", "aux", "final"):
        parts = []
        for r in rows:
            x = r[name]
            pad = torch.zeros((n - x.shape[0],) + tuple(x.shape[1:]), dtype=x.dtype)
            parts.append(torch.cat([x, pad]))
        out[name] = torch.stack(parts)
    out["aux"], out["final"] = out["aux"].float(), out["final"].float()
    return out


def batch_indices(n_rows: int, batch_size: int, world: int, rank: int, step: int, seed: int) -> list[int]:
    """The rows rank ``rank`` trains on at global ``step``: epoch-wise seeded permutations, each global
    batch of ``batch_size * world`` rows split round-robin between ranks (the data position is ``step``)."""
    per_step = batch_size * world
    per_epoch = max(1, n_rows // per_step)
    epoch, index = divmod(step, per_epoch)
    perm = torch.randperm(n_rows, generator=torch.Generator().manual_seed(seed * 100_003 + epoch)).tolist()
    chunk = [perm[(index * per_step + j) % n_rows] for j in range(per_step)]
    return chunk[rank::world]


# ------------------------------------------------------------------------------------------
# checkpoints


def _rng_state() -> dict:
    """RNG states in types ``torch.load(weights_only=True)`` reads (numpy's key array as a tensor, no pickled objects)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "numpy": (name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached))}


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))


def load_checkpoint(path: str | Path) -> dict:
    """A checkpoint :meth:`Trainer.save_checkpoint` wrote, read with ``weights_only``: a planted file
    cannot run code; it is refused with a ValueError naming the reason."""
    try:
        state = torch.load(path, weights_only=True)
    except pickle.UnpicklingError as e:
        raise ValueError(f"{path}: refused to load the checkpoint (only tensors and plain data are "
                         f"accepted): {str(e).splitlines()[0]}") from None
    except (RuntimeError, EOFError, ValueError, OSError) as e:  # truncated, empty, not a torch file
        first = (str(e).splitlines() or [type(e).__name__])[0].split(". ")[0][:200]
        raise ValueError(f"{path}: not a readable checkpoint (truncated or not written by kimi-eagle train): "
                         f"{first}") from None
    missing = sorted(CHECKPOINT_KEYS - set(state)) if isinstance(state, dict) else None
    if missing is None or missing:
        found = f"missing {', '.join(missing)}" if missing else f"a {type(state).__name__}"
        raise ValueError(f"{path}: not a kimi-eagle training checkpoint ({found}); delete it or train with --fresh")
    return state


CHECKPOINT_KEYS = frozenset({"model", "optimizer", "scheduler", "step", "rng", "config"})


def param_digest(module: nn.Module) -> str:
    """SHA-256 over a module's state dict (names and bytes, sorted by name)."""
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


# ------------------------------------------------------------------------------------------
# where a run starts: resume only what was trained with the same settings on the same data

RUN_ONLY_SETTINGS = ("out", "resume", "stop_after", "progress", "save_every", "log_every")  # change no weight


class ResumeRefused(ValueError):
    """``resume=True`` and the checkpoint was trained with other settings or data."""


@dataclass
class StartDecision:
    out: Path  # the run folder this run writes
    checkpoint: Path | None  # resume from it (None: fresh)
    note: str  # why, in words ("" when resuming in ``cfg.out`` or starting fresh where nothing was)


def data_fingerprint(data, vocab: draft_vocab.DraftVocab) -> str:
    """SHA-256 over what training reads of ``data``: row count and lengths, layer ids, vocabulary size, the
    shards' recorded sha256 (kit layout) or the token rows (other layouts, online), and the draft vocabulary."""
    h = hashlib.sha256()
    h.update(json.dumps({"rows": len(data), "lengths": list(data.lengths()), "layer_ids": list(data.layer_ids),
                         "vocab_size": data.manifest.get("vocab_size"),
                         "shards": [s.get("sha256") for s in data.manifest.get("shards", [])],
                         "draft_vocab": vocab.draft_to_target.tolist()}).encode())
    if hasattr(data, "token_rows"):
        for ids, mask in data.token_rows():
            h.update(ids.to(torch.int64).numpy().tobytes() + b"|" + mask.to(torch.int64).numpy().tobytes())
    return h.hexdigest()


def _same_path(a, b) -> bool:
    return a == b or (isinstance(a, str) and isinstance(b, str) and os.path.abspath(a) == os.path.abspath(b))


def checkpoint_differences(state: dict, cfg: TrainConfig, fingerprint: str,
                           layer_ids: Sequence[int] | None = None) -> list[str]:
    """``"name saved → requested"`` for each training setting (not :data:`RUN_ONLY_SETTINGS`) that differs
    between a checkpoint and ``cfg``, plus ``"the data changed"`` when its fingerprint differs; [] = same run.
    With the data's ``layer_ids``, a checkpoint trained on another layer set names both sets first (issue 48)."""
    saved, now = state.get("config") or {}, asdict(cfg)
    diffs = layer_set_difference(state, cfg.target, layer_ids) if layer_ids is not None else []
    for key in sorted(set(saved) | set(now)):
        a, b = saved.get(key, "unset"), now.get(key, "unset")
        added_later = key not in saved and key in TrainConfig.__dataclass_fields__ and b == TrainConfig.__dataclass_fields__[key].default
        if key not in RUN_ONLY_SETTINGS and not added_later and not _same_path(a, b):  # a newer setting at its default: same run
            diffs.append(f"{key} {a!r} → {b!r}")
    if state.get("data_fingerprint") != fingerprint:
        diffs.append("the data changed" if state.get("data_fingerprint") else "the checkpoint records no data fingerprint")
    return diffs


def layer_set_difference(state: dict, target: str, layer_ids: Sequence[int]) -> list[str]:
    """``["target layers SAVED → NOW"]`` (each set named when it is a drafter's default for ``target``) when the
    checkpoint ``state`` was trained on other target layers than ``layer_ids``, else []. A checkpoint that does not
    record its layer set (written before issue 48) is read by the width of its ``fc`` input."""
    now = [int(i) for i in layer_ids]
    saved: list[int] | str | None = state.get("layer_ids")
    if saved is None:
        fc = (state.get("model") or {}).get("fc.weight")
        hidden = _target_hidden_size(target)
        if not isinstance(fc, torch.Tensor) or fc.dim() != 2 or not hidden or fc.shape[1] % hidden:
            return []
        if fc.shape[1] // hidden == len(now):
            return []
        saved = f"{fc.shape[1] // hidden} layers"
    if saved == now:
        return []
    return [f"target layers {saved}{layer_set_name(saved, target)} → {now}{layer_set_name(now, target)}"]


def _target_hidden_size(target: str) -> int | None:
    try:
        config = read_config_json(Path(target) / "config.json", "target config")
    except ValueError:
        return None
    hidden = (config.get("text_config") or config).get("hidden_size")
    return hidden if type(hidden) is int and hidden > 0 else None


def layer_set_name(layer_ids, target: str, but: str | None = None) -> str:
    """`` (the DRAFTER layer set)`` when ``layer_ids`` is the default set of a drafter (other than ``but``) for
    ``target`` (its ``num_hidden_layers``), else ""."""
    from kimi_eagle.eagle3.layers import DRAFTER_LAYERS

    if not isinstance(layer_ids, list):
        return ""
    try:
        config = read_config_json(Path(target) / "config.json", "target config")
    except ValueError:
        return ""
    n_layers = (config.get("text_config") or config).get("num_hidden_layers")
    if type(n_layers) is not int or n_layers < 1:
        return ""
    return next((f" (the {d} layer set)" for d, (f, _) in DRAFTER_LAYERS.items()
                 if d != but and list(f(n_layers)) == layer_ids), "")


def extends(state: dict, cfg: TrainConfig, fingerprint: str) -> bool:
    """``cfg`` asks for more steps of the checkpoint's run: the same settings and data but ``steps`` beyond the
    checkpoint's step (``train --steps N`` on a finished run continues it to N)."""
    saved_steps = (state.get("config") or {}).get("steps")
    return (isinstance(saved_steps, int) and cfg.steps > int(state["step"])
            and not checkpoint_differences(state, replace(cfg, steps=saved_steps), fingerprint))


def extension_note(state: dict, cfg: TrainConfig) -> str:
    """What a continued run says: from which step of how long a run, to how many steps."""
    return (f"continuing a {state['config']['steps']}-step run from step {int(state['step'])} to {cfg.steps} steps "
            f"(the learning-rate schedule from here is that of a {cfg.steps}-step run)")


def run_folders(out: Path) -> Iterator[Path]:
    """``out``, then ``out.run2``, ``out.run3``, ... (the folders a changed configuration moves on to)."""
    yield out
    for k in range(2, 10_000):
        yield out.parent / f"{out.name}.run{k}"


def choose_start(cfg: TrainConfig, fingerprint: str, layer_ids: Sequence[int] | None = None) -> StartDecision:
    """Where and how a run starts. ``resume=False``: fresh in ``out``. Otherwise the first of
    :func:`run_folders` whose checkpoint has these settings and data is resumed, or the first without a
    checkpoint starts fresh; with ``resume=True`` a checkpoint in ``out`` that differs raises
    :class:`ResumeRefused` naming the differences (both layer sets first when the data's ``layer_ids`` differ)."""
    out = Path(cfg.out)
    if cfg.resume is False:
        return StartDecision(out, None, "")
    moved = []
    for folder in run_folders(out):
        checkpoint = folder / "checkpoint" / "last.pt"
        if not checkpoint.exists():
            return StartDecision(folder, None, "; ".join(moved))
        state = load_checkpoint(checkpoint)
        diffs = checkpoint_differences(state, cfg, fingerprint, layer_ids)
        if not diffs:
            return StartDecision(folder, checkpoint, "; ".join(moved))
        if extends(state, cfg, fingerprint):
            return StartDecision(folder, checkpoint, "; ".join([*moved, extension_note(state, cfg)]))
        if cfg.resume:
            raise ResumeRefused(f"cannot resume {folder}: its checkpoint was trained with other settings "
                                f"({', '.join(diffs)}); leave out --resume (resume=None) to start fresh in a new run folder, "
                                f"or give another output folder")
        moved.append(f"{folder} holds a run with other settings ({', '.join(diffs)})")
    raise ResumeRefused(f"{out}: no free run folder")


# ------------------------------------------------------------------------------------------
# training


def lr_schedule(steps: int, warmup: float) -> Callable[[int], float]:
    """The learning-rate factor of each optimizer step (for ``LambdaLR``): a linear warmup to 1 over the
    first ``max(1, int(steps * warmup))`` steps, then a cosine down to 0.1 at ``steps`` (and 0.1 after)."""
    w = max(1, int(steps * warmup))

    def factor(step: int) -> float:
        if step < w:
            return (step + 1) / w
        progress = (step - w) / max(1, steps - w)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return factor


class NonFiniteLoss(ValueError):
    """A training step whose loss is NaN or Inf: the run stops there (no checkpoint of that step, no drafter)."""


def stop_on_nonfinite(loss: torch.Tensor, step: int, world: int = 1) -> None:
    """Raise :class:`NonFiniteLoss` when ``loss`` (on any rank) is NaN or Inf, before it reaches the weights."""
    finite = torch.isfinite(loss.detach()).to(torch.float32).reshape(1)
    if world > 1:
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)  # every rank stops together
    if not bool(finite.item()):
        raise NonFiniteLoss(f"step {step}: the loss is {float(loss.detach())} (NaN/Inf); training stopped "
                            "before the step was applied, no drafter saved")


def open_training_data(cfg: TrainConfig):
    """The rows ``cfg`` trains on: stored hidden states of any layout (kit shards, speculators or SpecForge
    files), or with ``cfg.online`` an :class:`~kimi_eagle.eagle3.online.OnlineHiddenStates` over rows."""
    if cfg.online:
        from kimi_eagle.eagle3.online import OnlineHiddenStates

        return OnlineHiddenStates(cfg.target, cfg.data, cfg.layer_ids)
    data = open_hidden_states(cfg.data, cfg.target)
    check_layer_set(cfg, data.layer_ids)  # issue 48: another drafter's layer set is refused by name, not by a shape
    check_hidden_finite(data)  # issue 37: NaN/Inf hidden states are refused by file, row and tensor before step 1
    return data


def check_layer_set(cfg: TrainConfig, layer_ids: Sequence[int]) -> None:
    """ValueError naming both layer sets when ``cfg.drafter`` cannot read hidden states of ``layer_ids`` (EAGLE-3
    reads exactly 3 target layers: a DFlash extraction holds 5)."""
    from kimi_eagle.eagle3.layers import DRAFTER_LAYERS

    default, count = DRAFTER_LAYERS[cfg.drafter]
    ids = [int(i) for i in layer_ids]
    if count is None or len(ids) == count:
        return
    config = read_config_json(Path(cfg.target) / "config.json", "target config")
    n_layers = (config.get("text_config") or config).get("num_hidden_layers")
    of = layer_set_name(ids, cfg.target, but=cfg.drafter)
    want = f" ({list(default(n_layers))} for this target)" if isinstance(n_layers, int) else ""
    raise ValueError(f"{cfg.data}: its hidden states hold target layers {ids}{of}; the {cfg.drafter} drafter reads "
                     f"{count} layers{want}: extract them with `kimi-eagle extract --drafter {cfg.drafter}`, or train "
                     f"the drafter this data was extracted for (--drafter)")


def draft_vocabulary(data, size: int) -> draft_vocab.DraftVocab:
    """The ``size`` (at most the vocabulary) most supervised tokens of ``data``'s rows."""
    token_rows = data.token_rows() if hasattr(data, "token_rows") else ((r["input_ids"], r["loss_mask"]) for r in data)
    counts = draft_vocab.supervised_counts(token_rows, data.manifest["vocab_size"])
    return draft_vocab.build(counts, min(size, int(counts.numel())))


@contextmanager
def process_group() -> Iterator[tuple[int, int]]:
    """``(world size, rank)`` of this process. Under ``torchrun`` (``WORLD_SIZE`` > 1) a gloo group is
    started here unless one exists, all ranks meet at a barrier on a normal exit, and a group started
    here is ended (without that, gloo's threads may still run at exit and abort the process)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    owns_group = world > 1 and not dist.is_initialized()
    if owns_group:
        dist.init_process_group("gloo")
    try:
        yield world, (dist.get_rank() if world > 1 else 0)
        if world > 1:
            dist.barrier()
    finally:
        if owns_group:
            dist.destroy_process_group()


class Trainer:
    """One drafter's training run, owning its state: the drafter and its loss, the optimizer, the LR
    schedule (:func:`lr_schedule`), the step (which is also the data position, see
    :func:`batch_indices`), the history log and the checkpoints.

    Construction builds everything from ``cfg`` (the draft vocabulary from the data, the drafter from the
    target's weights) and picks where it starts (:func:`choose_start`): :attr:`out` is the run folder it
    writes (``cfg.out``, or ``cfg.out.runK`` when that holds another run) and :attr:`start` says
    ``"fresh"`` or ``"resumed from step N"``, with :attr:`start_note` saying why.
    :meth:`run` trains up to :attr:`end_step`; :meth:`finish` writes the results and returns the summary.
    ``world``/``rank``: this process under DDP (see :func:`process_group`); rank 0 writes the shared files.
    """

    def __init__(self, cfg: TrainConfig, world: int = 1, rank: int = 0):
        cfg = recipes.resolve(cfg)  # the recipe's defaults for what cfg leaves None (before any checkpoint comparison)
        self.cfg, self.world, self.rank = cfg, world, rank
        target_config(cfg.target)  # issue 48: a wrong-typed size of the target's config.json is named first
        self.mask = self._mask_token()  # a target config with a bad mask/pad/eos id is refused before any data is read
        self.data = open_training_data(cfg)
        self.vocab = draft_vocabulary(self.data, cfg.draft_vocab_size)
        self.fingerprint = data_fingerprint(self.data, self.vocab)
        decision = choose_start(cfg, self.fingerprint, self.data.layer_ids)
        self.out, self.start_note = decision.out, decision.note
        if rank == 0:
            self.out.mkdir(parents=True, exist_ok=True)
        self.checkpoint_path = self.out / "checkpoint" / "last.pt"
        self.log_path = self.out / "train_log.jsonl"
        self.drafter, self.loss = self._build_drafter()
        self.trainable = [p for p in self.drafter.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.trainable, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_schedule(cfg.steps, cfg.warmup))
        self.step = 0
        self.rows_seen: list[int] = []  # every row this rank trained on, in order
        self.tokens = 0  # padded tokens this rank fed to the drafter
        self.seconds = 0.0  # time spent in run()
        if decision.checkpoint is not None:
            self.resume(decision.checkpoint)
        self.start = f"resumed from step {self.step}" if decision.checkpoint is not None else "fresh"
        self.module = self.loss
        if world > 1:
            from torch.nn.parallel import DistributedDataParallel

            self.module = DistributedDataParallel(self.loss, broadcast_buffers=False)

    def _build_drafter(self):
        """The drafter and its loss (:func:`kimi_eagle.eagle3.recipes.build_drafter`)."""
        cfg = self.cfg
        target_config = SimpleNamespace(**read_config_json(Path(cfg.target) / "config.json", "target config"))  # no transformers import
        return recipes.build_drafter(cfg, target_config, target_tensor(cfg.target, "embed_tokens.weight"),
                                     target_tensor(cfg.target, "lm_head.weight"), self.vocab, self.data.layer_ids,
                                     self.mask)

    def _mask_token(self) -> int | None:
        """DFlash's mask token (:func:`kimi_eagle.eagle3.dflash_config.mask_token_id`); None for EAGLE-3."""
        if self.cfg.drafter != "dflash":
            return None
        from kimi_eagle.eagle3.dflash_config import mask_token_id

        return mask_token_id(self.cfg.target)

    @property
    def end_step(self) -> int:
        """Where :meth:`run` stops: ``cfg.steps``, or ``cfg.stop_after`` if that is sooner."""
        return self.cfg.steps if self.cfg.stop_after is None else min(self.cfg.steps, self.cfg.stop_after)

    @property
    def finished(self) -> bool:
        return self.step >= self.cfg.steps

    # -- checkpoints -----------------------------------------------------------------------
    def save_checkpoint(self, path: str | Path | None = None) -> None:
        """Everything a resumed run needs (weights, optimizer, scheduler, RNG states, step, config, draft
        vocabulary), written atomically to ``path`` (default: ``out/checkpoint/last.pt``)."""
        state = {
            "model": self.drafter.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(), "step": self.step, "rng": _rng_state(),
            "config": asdict(self.cfg), "draft_vocab": self.vocab.report(), "data_fingerprint": self.fingerprint,
            "layer_ids": [int(i) for i in self.data.layer_ids],  # named when a run is continued on other data
        }
        with atomic_path(path if path is not None else self.checkpoint_path) as tmp:
            torch.save(state, tmp)

    def resume(self, path: str | Path) -> None:
        """Continue from a checkpoint: weights, optimizer, scheduler, RNG states and step (data position)."""
        state = load_checkpoint(path)
        self.drafter.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        _set_rng_state(state["rng"])
        self.step = int(state["step"])

    # -- the loop --------------------------------------------------------------------------
    def batch_rows(self) -> list[int]:
        """The rows this rank trains on at the current step."""
        return batch_indices(len(self.data), self.cfg.batch_size, self.world, self.rank, self.step, self.cfg.seed)

    def train_step(self) -> torch.Tensor:
        """One optimizer step on :meth:`batch_rows`; returns its per-unroll-step ``(weighted CE sum,
        correct, supervised)`` [ttt_steps, 3], summed over ranks."""
        rows = self.batch_rows()
        self.rows_seen.extend(rows)
        batch = collate(self.data.batch(rows) if self.cfg.online else [self.data[i] for i in rows])
        self.tokens += int(batch["input_ids"].numel())
        loss, stats = self.module(batch["aux"], batch["input_ids"], batch["loss_mask"], batch["final"])
        stop_on_nonfinite(loss, self.step + 1, self.world)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.trainable, self.cfg.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        if self.world > 1:
            dist.all_reduce(stats)
        return stats

    def run(self) -> None:
        """Train from :attr:`step` to :attr:`end_step`. Rank 0 logs every ``log_every`` steps and at the end
        (:func:`read_history` entries, appended to ``train_log.jsonl``; a resumed run first drops what was
        logged after its checkpoint) and checkpoints every ``save_every`` steps and at the end."""
        cfg, end = self.cfg, self.end_step
        if self.rank == 0 and cfg.progress:
            print(f"train: {self.start} in {self.out}" + (f" ({self.start_note})" if self.start_note else ""), file=sys.stderr)
        log = self._open_log() if self.rank == 0 else None
        bar = self._progress_bar() if self.rank == 0 and cfg.progress else None
        window = torch.zeros(self.loss.stat_rows, 3)  # per unroll step (EAGLE-3) or block slot (DFlash)
        start = time.perf_counter()
        try:
            while self.step < end:
                window += self.train_step()
                if self.step % cfg.log_every == 0 or self.step == end:
                    entry = _log_entry(self.step, window, self.scheduler.get_last_lr()[0])
                    window.zero_()
                    if log is not None:
                        log.append(entry)
                    if bar is not None:
                        bar.set_postfix(loss=f"{entry['loss']:.3f}", acc0=f"{entry['acc'][0]:.2f}", tau=f"{entry['expected_tau']:.2f}")
                if bar is not None:
                    bar.update(1)
                if self.rank == 0 and (self.step % cfg.save_every == 0 or self.step == end):
                    self.save_checkpoint()
        finally:
            for resource in (bar, log):
                if resource is not None:
                    resource.close()
        self.seconds += time.perf_counter() - start

    def _open_log(self) -> JsonlAppender:
        history = [h for h in read_history(self.log_path) if h["step"] <= self.step] if self.step else []
        write_jsonl(self.log_path, history)
        return JsonlAppender(self.log_path)

    def _progress_bar(self):
        from tqdm.auto import tqdm

        return tqdm(total=self.cfg.steps, initial=self.step, desc="train", unit="step")

    # -- results ---------------------------------------------------------------------------
    def summary(self) -> dict:
        """``start`` ("fresh" / "resumed from step N"), ``start_note``, ``out`` (the run folder), ``step``,
        ``finished``, ``world_size``, ``online``, ``token_ids``, ``draft_vocab``, ``layer_ids``, ``data_skipped``,
        ``train_tokens_per_s`` (all ranks' tokens over :meth:`run`'s time; None when no step ran) and ``data``: the
        data kind of the target's generations (:func:`kimi_eagle.data_kinds.model_kind`: ``toy`` for stories260K and
        tiny-kimi), which the training chart's tag states."""
        from kimi_eagle.data_kinds import model_kind

        return {"data": model_kind(self.cfg.target), "start": self.start, "start_note": self.start_note, "out": str(self.out), "step": self.step, "finished": self.finished, "world_size": self.world, "online": self.cfg.online,
                "drafter": self.cfg.drafter, "dflash_recipe": self.cfg.dflash_recipe if self.cfg.drafter == "dflash" else None,
                "lr": self.cfg.lr,
                "token_ids": self.token_ids, "draft_vocab": self.vocab.report(),
                "layer_ids": list(self.data.layer_ids), "data_skipped": self.data.manifest.get("read_skipped_by_reason", {}),
                "train_tokens_per_s": round(self.tokens * self.world / self.seconds, 1) if self.tokens and self.seconds else None}

    @property
    def token_ids(self) -> str:
        """The drafter's token-id space: a row-mapped target's (tiny-kimi) draft vocabulary is its rows."""
        return id_space(target_id_map(self.cfg.target))

    def save_drafter(self) -> Path:
        """The drafter in ``out/drafter`` with its draft vocabulary, training config and token-id space."""
        path = self.out / "drafter"
        self.drafter.save(path, extra={"draft_vocab": self.vocab.report(), "training": asdict(self.cfg),
                                       "token_ids": self.token_ids})
        return path

    def finish(self) -> dict:
        """Write the results and return :meth:`summary` (rank 0: plus ``final``, the last log entry). Under
        DDP every rank writes ``ddp_rank<r>.json`` (its rows and parameter digest); rank 0 writes
        ``drafter/`` once every step is done and ``train_metrics.json`` (the summary)."""
        summary = self.summary()
        if self.world > 1:
            write_json(self.out / f"ddp_rank{self.rank}.json", {"rank": self.rank, "world_size": self.world,
                       "rows": self.rows_seen, "params_sha256": param_digest(self.drafter)}, indent=None)
        if self.rank == 0:
            history = read_history(self.log_path)
            if history:
                summary.update(final=history[-1])
            if self.finished:
                self.save_drafter()
            write_json(self.out / "train_metrics.json", summary, indent=1)
        if hasattr(self.data, "close"):
            self.data.close()
        return summary


def train_drafter(cfg: TrainConfig) -> dict:
    """Train (or continue, see :func:`choose_start`) a drafter with a :class:`Trainer` and return its summary.

    Files in the run folder (``summary["out"]``): ``train_log.jsonl`` (one line per ``log_every`` steps, see :func:`read_history`),
    ``checkpoint/last.pt``, ``train_metrics.json`` (the summary), ``drafter/`` once every step is done,
    and ``ddp_rank<r>.json`` per process under DDP (``torchrun``). Charts are drawn by the apps
    (``kimi-eagle train`` draws ``train_curves.png`` from the log).
    """
    with process_group() as (world, rank):
        trainer = Trainer(cfg, world, rank)
        trainer.run()
        return trainer.finish()


def _log_entry(step: int, window: torch.Tensor, lr: float) -> dict:
    ce, correct, n = window.T
    acc = (correct / n.clamp(min=1)).tolist()
    per_step_loss = (ce / n.clamp(min=1)).tolist()
    return {"step": step, "lr": lr, "loss": round(per_step_loss[0], 5), "step_loss": [round(x, 5) for x in per_step_loss],
            "acc": [round(a, 5) for a in acc], "supervised": n.tolist(), "expected_tau": round(expected_tau(acc), 4)}


def read_history(path: str | Path) -> list[dict]:
    """The entries of a ``train_log.jsonl``, in order: ``step``, ``lr``, ``loss`` (step 0), ``step_loss``,
    ``acc`` (per unroll step), ``supervised`` and ``expected_tau``. A torn last line (a killed run) is
    left out; a missing log is empty."""
    if not Path(path).exists():
        return []
    return [line.obj for line in read_jsonl(path) if line.error is None]
