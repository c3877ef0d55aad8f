"""The peer trainer on CPU: speculators' own ``Eagle3DraftModel`` and its own loss, driven by a minimal loop
with the kit's optimizer settings (``bench/peer_trainer.py``, ``tests/test_peer_trainer.py``).

speculators' ``Trainer`` needs a GPU (``torch.cuda``, NCCL, flex attention); everything below it runs on CPU
with ``eager`` or ``sdpa`` attention (flex attention has no CPU backward); ``sdpa`` is the faster one on CPU and
gives the same losses. The drafter is :data:`~kimi_eagle.apps.interop.configs.RECIPE`'s, the one the runbook's
``speculators.sh`` trains (the kit's layer: no extra norms, full attention). What is speculators' here: the model class (built by its ``from_training_args``, its
own weight initialisation, its ``load_vocab_mappings`` / ``load_verifier_weights``: embeddings and
``lm_head`` from the target, both frozen), its data path (``ArrowDataset`` over the export-data rows and
their ``hs_{row}.safetensors``, its ``shift_batch`` preprocessing and ``CollateFn`` packing a batch into one
sequence with document ids; ``pack=False`` runs the rows of a step one by one and averages their gradients), its TTT forward and its loss (``kl_div``, eager implementation,
``ttt_step_loss_decay``). What is the kit's (so that only the trainer differs): the rows of every step
(:func:`~kimi_eagle.eagle3.train.batch_indices` with the same seed), AdamW (betas 0.9/0.95, no weight
decay), the warmup + cosine schedule, gradient clipping, hidden states in float32.

The block drafters (``dflash``, ``dspark``; :data:`~kimi_eagle.apps.interop.configs.BLOCK_RECIPES`, the drafters
``speculators_dflash.sh``/``speculators_dspark.sh`` train) are built the same way (:func:`build_block_model`, the
loss settings speculators' own ``TrainConfig`` resolves for the type) and stepped by :func:`block_step` over the
same packed rows with DFlash's hidden states (``hidden_states_dflash``, no shift: speculators' preprocess table has
none for them). Their CPU cost is set by ``max_anchors`` (anchor blocks per step, padded to it: speculators'
default 512 × block 8 = 4,096 query tokens whatever the rows hold); the fastest CPU setting is ``sdpa`` with
``max_anchors`` = the step's valid anchors (:func:`valid_anchors`).

speculators is imported inside the functions only: the kit runs without it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from kimi_eagle.apps.interop.configs import BLOCK_HIDDEN_DIR, BLOCK_RECIPES, RECIPE, SpeculatorsRecipe
from kimi_eagle.eagle3.layers import trainer_layer_ids
from kimi_eagle.eagle3.train import lr_schedule


@dataclass
class PeerConfig:
    """Settings of one peer run; defaults equal :class:`~kimi_eagle.eagle3.train.TrainConfig`'s."""

    export_dir: str  # `kimi-eagle export-data --to speculators` directory, hidden states in export_dir/hidden_states
    target: str
    out: str
    steps: int = 200
    ttt_steps: int = RECIPE.ttt_steps
    step_weight: float = RECIPE.ttt_step_loss_decay  # speculators' ttt_step_loss_decay
    batch_size: int = 8
    lr: float = 3e-3
    warmup: float = 0.05
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    draft_vocab_size: int = 256
    seed: int = 0
    recipe: SpeculatorsRecipe = RECIPE  # the drafter's layer flags, as speculators.sh passes them
    attn_impl: str = "sdpa"  # speculators' --draft-attn-impl on CPU: "sdpa" (fastest) or "eager"
    pack: bool = True  # speculators' CollateFn packs a step's rows into one sequence; False: one row at a time


def _require_speculators():
    try:
        import speculators  # noqa: F401
    except ImportError as e:  # pragma: no cover - the interop extra is installed by make
        raise RuntimeError("the peer trainer needs speculators (pip install --no-deps -r requirements-interop.txt)") from e


def build_model(cfg: PeerConfig, aux_layer_ids: Sequence[int]):
    """speculators' ``Eagle3DraftModel`` for the target, built by its own ``from_training_args`` with the
    export's ``d2t``/``t2d`` (``d2t-N.npy``/``t2d-N.npy``), weights initialised under
    ``torch.manual_seed(cfg.seed)``, layer flags from ``cfg.recipe``, attention ``cfg.attn_impl``."""
    _require_speculators()
    import numpy as np
    from speculators.models.eagle3 import Eagle3DraftModel
    from speculators.train.cli import create_transformer_layer_config
    from transformers import AutoConfig

    export = Path(cfg.export_dir)
    d2t = torch.from_numpy(np.load(export / f"d2t-{cfg.draft_vocab_size}.npy")).to(torch.long)
    t2d = torch.from_numpy(np.load(export / f"t2d-{cfg.draft_vocab_size}.npy")).to(torch.bool)
    n_layers = AutoConfig.from_pretrained(cfg.target).num_hidden_layers
    # speculators' CLI path: one llama layer shaped from the verifier; --full-attention-indices 0 as the recipe
    # passes it (speculators' default is a 2048-token sliding window, not what SGLang/vLLM's layer does)
    recipe = cfg.recipe
    layer_config = create_transformer_layer_config(str(cfg.target), num_layers=1, draft_arch="llama", hidden_act=None,
                                                   sliding_window=2048,
                                                   full_attention_indices=[0] if recipe.full_attention else None)
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        model = Eagle3DraftModel.from_training_args(
            layer_config, t2d=t2d, d2t=d2t, verifier_name_or_path=str(cfg.target), draft_vocab_size=cfg.draft_vocab_size,
            target_layer_ids=trainer_layer_ids(aux_layer_ids, n_layers, "speculators"), draft_attn_impl=cfg.attn_impl,
            norm_before_residual=recipe.norm_before_residual, norm_before_fc=recipe.norm_before_fc,
            norm_output=recipe.norm_output, ttt_steps=cfg.ttt_steps)
    return model.float()


class PeerData:
    """speculators' ``ArrowDataset`` over the export (file ``hs_i`` = Arrow row ``i`` of ``hidden_dir``) and its
    packing collate, with the preprocessing speculators' train CLI gives ``kind`` (EAGLE-3: ``shift_batch``)."""

    def __init__(self, export_dir: str | Path, hidden_size: int, kind: str = "eagle3", hidden_dir: str = "hidden_states",
                 num_target_layers: int = 3):
        _require_speculators()
        from hs_connectors import FileTransfer
        from speculators.models.eagle3.data import shift_batch
        from speculators.train.data import ArrowDataset

        self.dataset = ArrowDataset(max_len=1 << 30, datapath=str(export_dir), on_missing="raise",
                                    transfer=FileTransfer(Path(export_dir) / hidden_dir), hidden_states_dtype=torch.float32)
        self.hidden_size, self.num_target_layers = hidden_size, num_target_layers
        self.preprocess = {"eagle3": shift_batch}.get(kind)  # speculators' cli.preprocess_fns: none for block drafters

    def __len__(self) -> int:
        return len(self.dataset)

    def batch(self, rows: Sequence[int]) -> dict:
        """The packed batch of ``rows`` (the preprocessing per row, ``CollateFn`` with room for all of them)."""
        from speculators.train.data import CollateFn

        items = [self.dataset[i] for i in rows]
        total = sum(int(it["input_ids"].shape[0]) - (self.preprocess is not None) for it in items)  # a shift drops one
        batch = CollateFn(max_len=total, hidden_size=self.hidden_size, num_target_layers=self.num_target_layers,
                          dtype=torch.float32, preprocess=self.preprocess)(items)
        batch.pop("error_records", None)
        return batch


def peer_step(model, data: PeerData, rows: Sequence[int], cfg: PeerConfig, loss_config) -> tuple[float, float, int]:
    """Forward and backward of one step's ``rows``: packed into one sequence (speculators' way), or with
    ``cfg.pack`` off one row at a time, each row's loss divided by the row count. Returns ``(step 0's KL,
    step 0's top-1 agreement, real tokens)`` (speculators' own per-step metrics)."""
    groups = [list(rows)] if cfg.pack else [[r] for r in rows]
    loss0, hits, total, tokens = 0.0, 0.0, 0.0, 0
    for group in groups:
        batch = data.batch(group)
        tokens += int((batch["document_ids"] != -1).sum())
        _drafts, loss, metrics = model(**batch, ttt_steps=cfg.ttt_steps, ttt_step_loss_decay=cfg.step_weight,
                                       loss_config=loss_config)
        (loss / len(groups)).backward()
        loss0 += float(metrics["loss_0_sum"]) / len(groups)
        hits += float(metrics["full_acc_0_sum"])
        total += float(metrics["full_acc_0_total"])
    return loss0, hits / max(1.0, total), tokens


def train_peer(cfg: PeerConfig, aux_layer_ids: Sequence[int], batches: Sequence[Sequence[int]]) -> dict:
    """Train speculators' drafter on ``batches`` (Arrow row indices per step, ``cfg.steps`` of them) and save it
    with its own ``save_pretrained`` into ``cfg.out/drafter``. Returns ``{losses, acc0, seconds, tokens,
    train_tokens_per_s, drafter}`` (``losses``: step 0's KL per step; ``acc0``: step 0's top-1 agreement per step;
    tokens: real, unpadded tokens fed to the model; seconds: the loop only)."""
    from speculators.losses import resolve_loss_config

    model = build_model(cfg, aux_layer_ids)
    data = PeerData(cfg.export_dir, model.hidden_size)
    loss_config = resolve_loss_config("kl_div", "eager")  # the fused kernels need Triton (a GPU)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_schedule(cfg.steps, cfg.warmup))
    model.train()
    losses, tokens, acc0 = [], 0, []
    start = time.perf_counter()
    for rows in batches[: cfg.steps]:
        optimizer.zero_grad(set_to_none=True)
        loss0, acc, n = peer_step(model, data, rows, cfg, loss_config)
        torch.nn.utils.clip_grad_norm_(trainable, cfg.grad_clip)
        optimizer.step()
        scheduler.step()
        losses.append(loss0)
        acc0.append(acc)
        tokens += n
    seconds = time.perf_counter() - start
    out = Path(cfg.out) / "drafter"
    model.save_pretrained(str(out))
    return {"losses": losses, "acc0": acc0, "seconds": seconds, "tokens": tokens,
            "train_tokens_per_s": tokens / seconds if seconds else None, "drafter": str(out)}


# ------------------------------------------------------------------------------------------
# speculators' block drafters (dflash, dspark)


@dataclass
class BlockPeerConfig:
    """speculators' block drafter of ``speculators_{kind}.sh`` on CPU: its defaults for the type (5 Qwen3 draft layers,
    sliding window 2,048 = full attention on these rows), the runbook's block size and mask token."""

    export_dir: str  # the export, hidden states in export_dir/hidden_states_dflash
    target: str
    kind: str = "dflash"
    draft_vocab_size: int = 256
    seed: int = 0
    attn_impl: str = "sdpa"  # "sdpa" (fastest on CPU) or "eager"; flex attention has no CPU backward
    max_anchors: int | None = None  # None: the step's valid anchors (speculators' default: 512, padded to it)


def block_train_settings(cfg: BlockPeerConfig) -> dict:
    """speculators' own resolved run for the type (``TrainConfig``: loss, per-position weights, draft layers), with
    the eager loss (the fused one needs Triton)."""
    from speculators.train.config import TrainConfig

    flat = TrainConfig.resolve(["--speculator-type", cfg.kind, "--verifier-name-or-path", cfg.target,
                                "--data-path", cfg.export_dir]).flatten()
    return {**flat, "loss_implementation": "eager"}


def build_block_model(cfg: BlockPeerConfig, aux_layer_ids: Sequence[int], mask_token_id: int):
    """speculators' ``dflash``/``dspark`` drafter built by its own ``from_training_args`` (the CLI's path), with the
    export's ``d2t``/``t2d``, DFlash's layer set (capture-before ids), the recipe's block size and ``mask_token_id``."""
    _require_speculators()
    import numpy as np
    from speculators import SpeculatorModel
    from speculators.train.cli import create_transformer_layer_config
    from transformers import AutoConfig

    flat = block_train_settings(cfg)
    export = Path(cfg.export_dir)
    d2t = torch.from_numpy(np.load(export / f"d2t-{cfg.draft_vocab_size}.npy")).to(torch.long)
    t2d = torch.from_numpy(np.load(export / f"t2d-{cfg.draft_vocab_size}.npy")).to(torch.bool)
    n_layers = AutoConfig.from_pretrained(cfg.target).num_hidden_layers
    layer_config = create_transformer_layer_config(
        str(cfg.target), num_layers=flat["num_layers"], draft_arch=flat["draft_arch"],
        hidden_act=flat["draft_hidden_act"], sliding_window=flat["sliding_window"],
        full_attention_indices=flat["full_attention_indices"])
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        model = SpeculatorModel.registry[cfg.kind].from_training_args(
            layer_config, t2d=t2d, d2t=d2t, verifier_name_or_path=str(cfg.target), draft_vocab_size=cfg.draft_vocab_size,
            target_layer_ids=trainer_layer_ids(aux_layer_ids, n_layers, "speculators", None), draft_attn_impl=cfg.attn_impl,
            block_size=BLOCK_RECIPES[cfg.kind].block_size, mask_token_id=mask_token_id)
    return model.float()


def block_data(cfg: BlockPeerConfig, model) -> PeerData:
    """The export's rows with DFlash's hidden states, as speculators' loader reads them for ``cfg.kind``."""
    return PeerData(cfg.export_dir, model.config.transformer_layer_config.hidden_size, cfg.kind, BLOCK_HIDDEN_DIR,
                    len(model.target_layer_ids))


def valid_anchors(batch: dict, block_size: int) -> int:
    """The anchors speculators' ``select_anchors`` can pick in a packed batch (supervised, not in the last block)."""
    mask = batch["loss_mask"].bool().clone()
    mask[:, -block_size:] = False
    return int(mask.sum())


def block_step(model, data: PeerData, rows: Sequence[int], cfg: BlockPeerConfig, settings: dict) -> tuple[float, int, int]:
    """Forward and backward of one step of ``rows`` packed into one sequence; returns ``(loss, real tokens,
    anchors)``. ``cfg.max_anchors`` None: the step's valid anchors (nothing padded)."""
    batch = data.batch(rows)
    anchors = cfg.max_anchors or max(1, valid_anchors(batch, model.block_size))
    kwargs, _ = type(model).get_trainer_kwargs(**{**settings, "max_anchors": anchors})
    _drafts, loss, _metrics = model(**batch, **kwargs)
    loss.backward()
    return float(loss.detach()), int((batch["document_ids"] != -1).sum()), anchors
