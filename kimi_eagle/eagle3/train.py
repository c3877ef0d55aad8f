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
scheduler, RNG states and the data position; ``--resume`` continues exactly where a run stopped.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from kimi_eagle.eagle3 import draft_vocab
from kimi_eagle.eagle3.layouts import open_hidden_states
from kimi_eagle.eagle3.model import Eagle3Drafter, shift_left, target_tensor
from kimi_eagle.eagle3.row_space import id_space, target_id_map
from kimi_eagle.io import JsonlAppender, atomic_path, read_jsonl, write_figure, write_json, write_jsonl

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@dataclass
class TrainConfig:
    data: str  # hidden-state directory (kimi-eagle extract); with online=True, the rows extract would read
    target: str  # HF target directory (config, embeddings, lm_head)
    out: str
    steps: int = 200
    ttt_steps: int = 7
    step_weight: float = 0.8
    batch_size: int = 8  # rows per process per optimizer step
    lr: float = 3e-3
    warmup: float = 0.05  # fraction of steps
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    draft_vocab_size: int = 256
    seed: int = 0
    save_every: int = 50
    log_every: int = 10
    resume: bool = False
    stop_after: int | None = None  # stop (with a checkpoint) after this many steps in total: simulates an interruption
    progress: bool = True
    online: bool = False  # compute the target's hidden states in each step instead of reading shards
    layer_ids: list[int] | None = None  # online only: aux block-output ids (default: EAGLE-3's)


# ------------------------------------------------------------------------------------------
# loss


class TTTLoss(nn.Module):
    """The drafter plus its training objective, so that one ``forward`` is one DDP step."""

    def __init__(self, drafter: Eagle3Drafter, target_head: torch.Tensor, steps: int, step_weight: float):
        super().__init__()
        self.drafter = drafter
        self.register_buffer("target_head", target_head, persistent=False)  # [Vd, H] rows of the target lm_head
        self.steps, self.step_weight = steps, step_weight

    def forward(self, aux, input_ids, loss_mask, final):
        """Returns ``(loss, stats)``; ``stats[k] = (weighted CE sum, correct, supervised)`` of step k."""
        logits_per_step = self.drafter.unroll(aux, input_ids, self.steps)
        loss = aux.new_zeros((), dtype=torch.float)
        stats = []
        for k, logits in enumerate(logits_per_step):
            with torch.no_grad():
                p = soft_targets(shift_left(final, 1 + k).float(), self.target_head)
            mask = supervised_mask(loss_mask, k)
            ce = -(p * F.log_softmax(logits.float(), dim=-1)).sum(-1)
            n = mask.sum()
            step_loss = (ce * mask).sum() / n.clamp(min=1)
            loss = loss + self.step_weight**k * step_loss
            correct = ((logits.argmax(-1) == p.argmax(-1)).float() * mask).sum()
            stats.append(torch.stack([(ce * mask).sum().detach(), correct, n]))
        return loss, torch.stack(stats)


def soft_targets(final: torch.Tensor, target_head_rows: torch.Tensor) -> torch.Tensor:
    """The target's next-token distribution restricted to the draft vocabulary and renormalised."""
    return torch.softmax(final @ target_head_rows.float().T, dim=-1)


def supervised_mask(loss_mask: torch.Tensor, step: int) -> torch.Tensor:
    """Float mask [B,T] of the positions supervised at unroll ``step``: ``loss_mask[t + 2 + step]``."""
    return shift_left(loss_mask, 2 + step).float()


def expected_tau(acc: Sequence[float]) -> float:
    """Acceptance length if step ``k`` is accepted with probability ``acc[k]`` given all earlier ones were:
    ``1 + sum_k prod_{j<=k} acc[j]``."""
    tau, run = 1.0, 1.0
    for a in acc:
        run *= a
        tau += run
    return tau


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


def save_checkpoint(path: Path, drafter, optimizer, scheduler, step: int, cfg: TrainConfig, vocab_report: dict) -> None:
    """Everything a resumed run needs (weights, optimizer, scheduler, RNG states, step), written atomically."""
    state = {
        "model": drafter.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
        "step": step, "rng": _rng_state(), "config": asdict(cfg), "draft_vocab": vocab_report,
    }
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def param_digest(module: nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


# ------------------------------------------------------------------------------------------
# training


def _lr_lambda(steps: int, warmup: float):
    w = max(1, int(steps * warmup))

    def f(step: int) -> float:
        if step < w:
            return (step + 1) / w
        progress = (step - w) / max(1, steps - w)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return f


def train_drafter(cfg: TrainConfig) -> dict:
    """Train (or resume) and return the summary; rank 0 writes ``out/drafter``, logs, plot and metrics.

    Files in ``cfg.out``: ``train_log.jsonl`` (one line per ``log_every`` steps, see :func:`read_history`),
    ``checkpoint/last.pt``, ``train_curves.png``, ``train_metrics.json`` (the summary), ``drafter/``
    once every step is done, and ``ddp_rank<r>.json`` per process under DDP.
    """
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    distributed = world > 1
    owns_group = distributed and not dist.is_initialized()  # torchrun started us: the group is ours to end
    if owns_group:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    out = Path(cfg.out)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)

    if cfg.online:
        from kimi_eagle.eagle3.online import OnlineHiddenStates

        data = OnlineHiddenStates(cfg.target, cfg.data, cfg.layer_ids)
        token_rows = data.token_rows()
    else:
        data = open_hidden_states(cfg.data, cfg.target)  # kit shards, speculators or SpecForge files
        token_rows = data.token_rows() if hasattr(data, "token_rows") else ((r["input_ids"], r["loss_mask"]) for r in data)
    counts = draft_vocab.supervised_counts(token_rows, data.manifest["vocab_size"])
    vocab = draft_vocab.build(counts, min(cfg.draft_vocab_size, int(counts.numel())))
    target_config = SimpleNamespace(**json.loads((Path(cfg.target) / "config.json").read_text()))  # no transformers import
    lm_head = target_tensor(cfg.target, "lm_head.weight")
    drafter = Eagle3Drafter.from_target_weights(target_config, target_tensor(cfg.target, "embed_tokens.weight"),
                                                lm_head, vocab, data.layer_ids, seed=cfg.seed)
    module = TTTLoss(drafter, lm_head[vocab.draft_to_target].float(), cfg.ttt_steps, cfg.step_weight)
    trainable = [p for p in drafter.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(cfg.steps, cfg.warmup))
    ckpt_path = out / "checkpoint" / "last.pt"
    step = 0
    if cfg.resume and ckpt_path.exists():
        try:  # weights_only: a planted last.pt cannot run code; it is refused with the reason
            state = torch.load(ckpt_path, weights_only=True)
        except pickle.UnpicklingError as e:
            raise ValueError(f"{ckpt_path}: refused to load the checkpoint (only tensors and plain data are "
                             f"accepted): {str(e).splitlines()[0]}") from None
        drafter.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        _set_rng_state(state["rng"])
        step = int(state["step"])
    wrapped = module
    if distributed:
        from torch.nn.parallel import DistributedDataParallel

        wrapped = DistributedDataParallel(module, broadcast_buffers=False)

    log_path = out / "train_log.jsonl"
    log = None
    if rank == 0:
        history = [h for h in read_history(log_path) if h["step"] <= step] if step else []
        write_jsonl(log_path, history)  # a resumed run drops what was logged after its checkpoint
        log = JsonlAppender(log_path)
    end = cfg.steps if cfg.stop_after is None else min(cfg.steps, cfg.stop_after)
    bar = None
    if rank == 0 and cfg.progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.steps, initial=step, desc="train", unit="step")
    window = torch.zeros(cfg.ttt_steps, 3)
    seen: list[int] = []
    start = time.perf_counter()
    tokens = 0
    try:
        while step < end:
            idx = batch_indices(len(data), cfg.batch_size, world, rank, step, cfg.seed)
            seen.extend(idx)
            batch = collate(data.batch(idx) if cfg.online else [data[i] for i in idx])
            tokens += int(batch["input_ids"].numel())
            loss, stats = wrapped(batch["aux"], batch["input_ids"], batch["loss_mask"], batch["final"])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable, cfg.grad_clip)
            optimizer.step()
            scheduler.step()
            step += 1
            if distributed:
                dist.all_reduce(stats)
            window += stats
            if step % cfg.log_every == 0 or step == end:
                entry = _log_entry(step, window, scheduler.get_last_lr()[0])
                window.zero_()
                if log is not None:
                    log.append(entry)
                    if bar is not None:
                        bar.set_postfix(loss=f"{entry['loss']:.3f}", acc0=f"{entry['acc'][0]:.2f}", tau=f"{entry['expected_tau']:.2f}")
            if bar is not None:
                bar.update(1)
            if rank == 0 and (step % cfg.save_every == 0 or step == end):
                save_checkpoint(ckpt_path, drafter, optimizer, scheduler, step, cfg, vocab.report())
    finally:
        if bar is not None:
            bar.close()
        if log is not None:
            log.close()
    seconds = time.perf_counter() - start
    token_ids = id_space(target_id_map(cfg.target))  # a row-mapped target (tiny-kimi): the draft vocabulary is its rows
    summary = {"step": step, "finished": step >= cfg.steps, "world_size": world, "online": cfg.online,
               "token_ids": token_ids, "draft_vocab": vocab.report(),
               "layer_ids": list(data.layer_ids), "data_skipped": data.manifest.get("read_skipped_by_reason", {}),
               "train_tokens_per_s": round(tokens * world / seconds, 1) if seconds else None}
    if distributed:
        write_json(out / f"ddp_rank{rank}.json", {"rank": rank, "world_size": world, "rows": seen,
                                                   "params_sha256": param_digest(drafter)}, indent=None)
    if rank == 0:
        history = read_history(log_path)
        if history:
            summary.update(final=history[-1])
            _close(plot_history(history, out / "train_curves.png"))
        if step >= cfg.steps:
            drafter.save(out / "drafter", extra={"draft_vocab": vocab.report(), "training": asdict(cfg), "token_ids": token_ids})
        write_json(out / "train_metrics.json", summary, indent=1)
    if distributed:
        dist.barrier()
    if owns_group:  # without this, gloo's threads may still run at exit and abort the process
        dist.destroy_process_group()
    return summary


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


def plot_history(history: Sequence[dict], path: str | Path | None = None) -> "Figure":
    """Loss and accuracy of every unroll step over one training run; also written to ``path`` (PNG,
    atomically) when given. Returns the figure."""
    from matplotlib.figure import Figure

    steps = [h["step"] for h in history]
    fig = Figure(figsize=(10, 3.6))
    a1, a2 = fig.subplots(1, 2)
    for k in range(len(history[0]["acc"])):
        a1.plot(steps, [h["step_loss"][k] for h in history], label=f"step {k}", alpha=0.8)
        a2.plot(steps, [h["acc"][k] for h in history], label=f"step {k}", alpha=0.8)
    a1.set(title="soft cross-entropy per unroll step", xlabel="optimizer step", ylabel="loss")
    a2.set(title="top-1 agreement with the target (draft vocab)", xlabel="optimizer step", ylabel="accuracy", ylim=(0, 1))
    a2.legend(fontsize=7)
    fig.tight_layout()
    return _saved(fig, path)


LINE_STYLES = {"-": "solid", "--": "dashed", ":": "dotted", "-.": "dash-dot"}  # one per run, in turn


def plot_histories(runs: Mapping[str, str | Path | Sequence[dict]], path: str | Path | None = None) -> "Figure":
    """Several training runs side by side: step-0 loss per run, and accuracy per unroll step (one colour
    per step, one line style per run, in the order of ``runs``). ``runs`` maps a name to a
    ``train_log.jsonl`` path or its :func:`read_history` entries. Also written to ``path`` (PNG,
    atomically) when given. Returns the figure (not registered with pyplot). The first run is drawn wide and
    translucent, later runs thin and opaque on top, so a dashed line stays visible where runs coincide."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2))
    a_loss, a_acc = fig.subplots(1, 2)
    for i, (name, run) in enumerate(runs.items()):
        history = read_history(run) if isinstance(run, (str, Path)) else list(run)
        style = list(LINE_STYLES)[i % len(LINE_STYLES)]
        look = {"linewidth": 3.0, "alpha": 0.45, "zorder": 2} if i == 0 else {"linewidth": 1.3, "alpha": 1.0, "zorder": 3 + i}
        steps = [h["step"] for h in history]
        a_loss.plot(steps, [h["loss"] for h in history], style, label=name, **look)
        for k in range(len(history[0]["acc"]) if history else 0):
            a_acc.plot(steps, [h["acc"][k] for h in history], style, color=f"C{k}",
                       label=f"TTT step {k}" if i == 0 else None, **look)
    styles = ", ".join(f"{list(LINE_STYLES.values())[i % len(LINE_STYLES)]}: {name}" for i, name in enumerate(runs))
    a_loss.set(title="step-0 soft cross-entropy", xlabel="optimizer step")
    a_acc.set(xlabel="optimizer step", ylim=(0, 1))
    a_acc.set_title(f"agreement with the target\n({styles})", fontsize=10)
    a_loss.legend()
    a_acc.legend(fontsize=7, ncols=2)
    fig.tight_layout()
    return _saved(fig, path)


def _saved(fig: "Figure", path: str | Path | None) -> "Figure":
    if path is not None:
        write_figure(fig, path, dpi=110)
    return fig


def _close(fig: "Figure") -> None:
    """Release a figure made here (it is not registered with pyplot, so nothing else holds it)."""
    fig.clear()


# ------------------------------------------------------------------------------------------
# command line
