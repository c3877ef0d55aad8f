"""A DFlash block drafter beside EAGLE-3: one pass drafts a whole block from the target's fused hidden states.

Shapes as in :mod:`kimi_eagle.eagle3.model` (target hidden ``Ht``, drafter hidden ``H``, draft vocab ``Vd``), plus
the block size ``S`` (:data:`~kimi_eagle.eagle3.dflash_config.BLOCK_SIZE`) and ``n`` target layers
(:func:`~kimi_eagle.eagle3.dflash_config.dflash_layer_ids`, 5 by default).

* **context**: ``c_t = hidden_norm(fc(aux[t]))`` — ``fc``: Linear(n·Ht → H) fuses the target layers at every
  committed position ``t``; each draft layer projects ``c`` to its own keys/values (``k_norm``, rope at ``t``).
* **block**: anchored at position ``a`` it holds the anchor token ``x[a]`` (known: the target's own last token) and
  ``S - 1`` mask tokens (:func:`~kimi_eagle.eagle3.dflash_config.mask_token_id`), at rope positions ``a .. a+S-1``,
  embedded with the target's frozen embeddings. Block queries attend to the context keys at positions ``< a`` and,
  bidirectionally, to the keys of their own block (speculators' DFlash mask for full-attention layers).
* **layers**: ``num_draft_layers`` Qwen3-style decoder layers (``q_norm``/``k_norm``, SwiGLU), then ``norm`` and
  ``lm_head`` (H → Vd); slot ``j >= 1`` of the block predicts ``x[a + j]`` (slot 0, the anchor, is not trained:
  speculators' ``sample_from_anchor = False``). ``d2t``/``t2d`` are the draft vocabulary's maps, as for EAGLE-3.

Training (:class:`DFlashLoss`) uses every anchor whose block holds a supervised token, the soft targets of
``train.soft_targets`` at the token each slot predicts, weighted ``step_weight ** (j - 1)``
per slot, and returns the same per-slot ``(CE sum, correct, supervised)`` statistics the :class:`Trainer` logs.
Drafting (:meth:`DFlashDrafter.propose`) fills ``k <= S - 1`` slots at once; the context keys/values of the
committed prefix are kept between rounds (:class:`ContextCache`). Verification is the kit's
(:func:`~kimi_eagle.eagle3.speculative.speculative_generate`): the target checks the whole block in one pass.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from kimi_eagle.eagle3.dflash_config import BLOCK_SIZE
from kimi_eagle.eagle3.draft_vocab import DraftVocab
from kimi_eagle.eagle3.model import MLP, Eagle3Config, RMSNorm, apply_rope, rope_cos_sin, seeded_from_target
from kimi_eagle.io import atomic_path, write_json

DFLASH_FORMAT = "kimi-eagle-dflash/1"


@dataclass
class DFlashConfig(Eagle3Config):
    """:class:`~kimi_eagle.eagle3.model.Eagle3Config` plus the block: ``block_size`` (anchor + masks),
    ``mask_token_id`` (target id space) and ``num_draft_layers``; ``aux_layer_ids`` may hold any number of ids."""

    block_size: int = BLOCK_SIZE
    mask_token_id: int = 0
    num_draft_layers: int = 1


class BlockAttention(nn.Module):
    """Block queries over the context keys before their anchor and (bidirectionally) their own block's keys."""

    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.n_heads, self.n_kv, self.head_dim, self.theta = cfg.num_attention_heads, cfg.num_key_value_heads, d, cfg.rope_theta
        self.q_proj = nn.Linear(h, self.n_heads * d, bias=False)
        self.k_proj = nn.Linear(h, self.n_kv * d, bias=False)
        self.v_proj = nn.Linear(h, self.n_kv * d, bias=False)
        self.o_proj = nn.Linear(self.n_heads * d, h, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def _kv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (normed, roped) and values of ``x`` [..., H] at ``positions``: each [..., kv, d] moved to dim -3."""
        shape = x.shape[:-1] + (self.n_kv, self.head_dim)
        k, v = self.k_norm(self.k_proj(x).view(shape)), self.v_proj(x).view(shape)
        cos, sin = rope_cos_sin(positions, self.head_dim, self.theta)
        k = apply_rope(k, cos[..., None, :], sin[..., None, :])
        return k.movedim(-2, 1), v.movedim(-2, 1)

    def context_kv(self, ctx: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The context's keys/values ``[B, kv, T, d]`` (they depend only on ``ctx[t]`` and ``t``: cacheable)."""
        return self._kv(ctx, positions)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, ctx_kv: tuple[torch.Tensor, torch.Tensor],
                allowed: torch.Tensor) -> torch.Tensor:
        """``x`` [B,A,S,H] blocks at rope ``positions`` [A,S]; ``allowed`` [A,T]: context position ``t`` is seen
        by block ``a``. Returns [B,A,S,H]."""
        b, a, s, _ = x.shape
        rep, d = self.n_heads // self.n_kv, self.head_dim
        q = self.q_norm(self.q_proj(x).view(b, a, s, self.n_heads, d))
        cos, sin = rope_cos_sin(positions, d, self.theta)
        q = apply_rope(q, cos[..., None, :], sin[..., None, :]).movedim(-2, 1)  # [B,nh,A,S,d]
        kb, vb = self._kv(x, positions)  # [B,kv,A,S,d]
        kc, vc = ctx_kv  # [B,kv,T,d]
        t = kc.shape[2]
        qg = (q * (1.0 / math.sqrt(d))).reshape(b, self.n_kv, rep, a, s, d)
        ctx_scores = (qg.reshape(b, self.n_kv, rep, a * s, d) @ kc.unsqueeze(2).transpose(-1, -2)).view(b, self.n_kv, rep, a, s, t)
        ctx_scores = ctx_scores.float().masked_fill(~allowed[:, None, :], float("-inf"))
        block_scores = (qg @ kb.unsqueeze(2).transpose(-1, -2)).float()  # [B,kv,rep,A,S,S]
        probs = torch.softmax(torch.cat([ctx_scores, block_scores], dim=-1), dim=-1).to(q.dtype)
        out = probs[..., :t] @ vc[:, :, None, None] + probs[..., t:] @ vb.unsqueeze(2)  # [B,kv,rep,A,S,d]
        out = out.reshape(b, self.n_heads, a, s, d).movedim(1, -2).reshape(b, a, s, self.n_heads * d)
        return self.o_proj(out)


class BlockLayer(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = BlockAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, positions, ctx_kv, allowed):
        x = x + self.self_attn(self.input_layernorm(x), positions, ctx_kv, allowed)
        return x + self.mlp(self.post_attention_layernorm(x))


class ContextCache:
    """Each draft layer's context keys/values of a committed prefix, reused for the longest prefix whose ``aux``
    rows equal (bitwise) the cached ones; a key at ``t`` depends on ``aux[t]`` alone, so nothing else is checked."""

    def __init__(self) -> None:
        self.aux: torch.Tensor | None = None  # [m, n·Ht]
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] = []  # per layer, each [1, kv, m, d]

    def __len__(self) -> int:
        return 0 if self.aux is None else int(self.aux.shape[0])

    def reusable(self, aux: torch.Tensor) -> int:
        m = min(len(self), aux.shape[0])
        if m == 0:
            return 0
        same = (self.aux[:m] == aux[:m]).all(-1)
        return m if bool(same.all()) else int(same.long().cumprod(0).sum())

    def store(self, aux: torch.Tensor, new_kv: list[tuple[torch.Tensor, torch.Tensor]], m: int) -> list:
        """Keep ``m`` cached positions plus ``new_kv`` (positions ``m..n-1``); returns every layer's full keys/values."""
        if m:
            new_kv = [(torch.cat([k0[:, :, :m], k], 2), torch.cat([v0[:, :, :m], v], 2)) for (k0, v0), (k, v) in zip(self.kv, new_kv)]
        self.aux, self.kv = aux.detach().clone(), new_kv
        return new_kv


class DFlashDrafter(nn.Module):
    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        self.fc = nn.Linear(len(cfg.aux_layer_ids) * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(BlockLayer(cfg) for _ in range(cfg.num_draft_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))

    @classmethod
    def from_target_weights(cls, target_config, embed: torch.Tensor, lm_head: torch.Tensor, vocab: DraftVocab,
                            aux_layer_ids: Sequence[int], block: "BlockSpec", seed: int = 0) -> "DFlashDrafter":
        """Embeddings copied and frozen, ``lm_head`` from the target's rows of the draft vocabulary, every other
        weight drawn from a generator seeded with ``seed`` (as :meth:`Eagle3Drafter.from_target_weights`)."""
        base = Eagle3Config.from_target(target_config, vocab.size, aux_layer_ids)
        cfg = DFlashConfig(**asdict(base), block_size=block.block_size, mask_token_id=block.mask_token_id,
                           num_draft_layers=block.num_draft_layers)
        return seeded_from_target(cls, cfg, embed, lm_head, vocab, seed)

    @property
    def draft_to_target(self) -> torch.Tensor:
        return torch.arange(self.config.draft_vocab_size) + self.d2t

    # -- forward ---------------------------------------------------------------------------
    def context_kv(self, aux: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's context keys/values of ``aux`` [B,T,n·Ht] at ``positions`` [T]."""
        ctx = self.hidden_norm(self.fc(aux))
        return [layer.self_attn.context_kv(ctx, positions) for layer in self.layers]

    def block_tokens(self, anchor_tokens: torch.Tensor) -> torch.Tensor:
        """[B,A] anchor tokens -> [B,A,S] blocks: the anchor, then ``S - 1`` mask tokens."""
        masks = torch.full(anchor_tokens.shape + (self.config.block_size - 1,), self.config.mask_token_id, dtype=torch.long)
        return torch.cat([anchor_tokens[..., None].long(), masks], dim=-1)

    def block_logits(self, ctx_kv: list, anchor_tokens: torch.Tensor, anchors: torch.Tensor, n_ctx: int) -> torch.Tensor:
        """Draft logits [B,A,S,Vd] of the blocks anchored at positions ``anchors`` [A] (tokens ``anchor_tokens``
        [B,A]) over ``n_ctx`` context positions, block ``a`` seeing those before ``anchors[a]``."""
        positions = anchors[:, None] + torch.arange(self.config.block_size)
        allowed = torch.arange(n_ctx)[None, :] < anchors[:, None]
        x = self.embed_tokens(self.block_tokens(anchor_tokens))
        for layer, kv in zip(self.layers, ctx_kv):
            x = layer(x, positions, kv, allowed)
        return self.lm_head(self.norm(x))

    def forward(self, aux: torch.Tensor, input_ids: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        """Training: logits [B,A,S,Vd] of the blocks anchored at ``anchors`` of the rows ``input_ids`` [B,T]
        (context: ``aux`` [B,T,n·Ht]); slot ``j`` of block ``a`` predicts ``input_ids[:, a + j]``."""
        t = input_ids.shape[1]
        return self.block_logits(self.context_kv(aux, torch.arange(t)), input_ids[:, anchors], anchors, t)

    @torch.no_grad()
    def propose(self, aux: torch.Tensor, anchor: int, k: int, temperature: float = 0.0,
                generator: torch.Generator | None = None,
                cache: ContextCache | None = None) -> tuple[list[int], list[torch.Tensor]]:
        """Draft ``min(k, S - 1)`` target ids after a committed sequence ``x[0..n]`` in one pass: ``aux`` [n, n·Ht]
        are the target's features at ``0..n-1``, ``anchor`` is ``x[n]``. Returns the drafts and, per draft, its
        proposal distribution over the target vocabulary (one-hot at temperature 0; slots are drawn independently).
        With a ``cache`` only the context positions not cached (bitwise-equal ``aux``) are projected."""
        n = aux.shape[0]
        m = cache.reusable(aux) if cache is not None else 0
        kv = self.context_kv(aux[None, m:], torch.arange(m, n))
        if cache is not None:
            kv = cache.store(aux, kv, m)
        logits = self.block_logits(kv, torch.tensor([[anchor]]), torch.tensor([n]), n)[0, 0]
        drafts, dists = [], []
        for j in range(1, 1 + min(k, self.config.block_size - 1)):
            q = _proposal(logits[j], self.draft_to_target, self.config.vocab_size, temperature)
            drafts.append(int(torch.argmax(q)) if temperature <= 0 else int(torch.multinomial(q, 1, generator=generator)))
            dists.append(q)
        return drafts, dists

    # -- persistence -----------------------------------------------------------------------
    def save(self, out: str | Path, extra: dict | None = None) -> Path:
        """``config.json`` (format :data:`DFLASH_FORMAT`) + ``model.safetensors`` (every weight, embeddings included)."""
        from safetensors.torch import save_file

        out = Path(out)
        state = {k: v.detach().contiguous() for k, v in self.state_dict().items()}
        with atomic_path(out / "model.safetensors") as tmp:
            save_file(state, str(tmp), metadata={"format": DFLASH_FORMAT})
        write_json(out / "config.json", {"format": DFLASH_FORMAT, "config": asdict(self.config), **(extra or {})}, indent=1)
        return out


def _proposal(draft_logits: torch.Tensor, draft_to_target: torch.Tensor, vocab_size: int, temperature: float) -> torch.Tensor:
    q = torch.zeros(vocab_size)
    if temperature <= 0:
        q[draft_to_target[int(torch.argmax(draft_logits))]] = 1.0
    else:
        q[draft_to_target] = torch.softmax(draft_logits.float() / temperature, dim=-1)
    return q


@dataclass(frozen=True)
class BlockSpec:
    """What a DFlash drafter adds to an EAGLE-3 one: the block size, the mask token and the number of draft layers."""

    block_size: int = BLOCK_SIZE
    mask_token_id: int = 0
    num_draft_layers: int = 1


# ------------------------------------------------------------------------------------------
# training


def block_anchors(loss_mask: torch.Tensor, block_size: int) -> torch.Tensor:
    """The anchor positions [A] worth training in a batch ``loss_mask`` [B,T]: every ``a`` whose block predicts a
    supervised token (``loss_mask[b, a + j] == 1`` for some row ``b`` and slot ``1 <= j < block_size``)."""
    t = loss_mask.shape[1]
    hit = torch.zeros(t, dtype=torch.bool)
    supervised = loss_mask.bool().any(0)
    for j in range(1, block_size):
        hit[: max(0, t - j)] |= supervised[j:]
    anchors = hit.nonzero().flatten()
    return anchors if anchors.numel() else torch.zeros(1, dtype=torch.long)


class DFlashLoss(nn.Module):
    """The DFlash drafter plus its objective (one ``forward`` is one DDP step), with :class:`TTTLoss`'s interface:
    ``forward(aux, input_ids, loss_mask, final) -> (loss, stats)``, ``stats`` [S-1, 3] per slot ``j = 1..S-1``."""

    def __init__(self, drafter: DFlashDrafter, target_head: torch.Tensor, step_weight: float):
        super().__init__()
        self.drafter = drafter
        self.register_buffer("target_head", target_head, persistent=False)  # [Vd, H] rows of the target lm_head
        self.step_weight = step_weight
        self.stat_rows = drafter.config.block_size - 1

    def forward(self, aux, input_ids, loss_mask, final):
        t, s = input_ids.shape[1], self.drafter.config.block_size
        anchors = block_anchors(loss_mask, s)
        logits = self.drafter(aux, input_ids, anchors)[:, :, 1:].float()  # [B,A,S-1,Vd]: slot j predicts x[a + j]
        predicted = anchors[:, None] + torch.arange(1, s)  # [A,S-1]
        index = predicted.clamp(max=t - 1)
        mask = loss_mask[:, index].float() * (predicted < t)  # [B,A,S-1]
        with torch.no_grad():
            # the target's distribution of x[a + j] over the draft vocabulary (train.soft_targets; train imports this module)
            p = torch.softmax(final[:, index - 1].float() @ self.target_head.float().T, dim=-1)
        ce = -(p * F.log_softmax(logits, dim=-1)).sum(-1)
        n = mask.sum((0, 1))  # [S-1]
        ce_sum = (ce * mask).sum((0, 1))
        weights = self.step_weight ** torch.arange(s - 1, dtype=torch.float)
        loss = (weights * ce_sum / n.clamp(min=1)).sum()
        correct = ((logits.argmax(-1) == p.argmax(-1)).float() * mask).sum((0, 1))
        return loss, torch.stack([ce_sum.detach(), correct, n], dim=1)


def build_dflash(target_config, embed: torch.Tensor, lm_head: torch.Tensor, vocab: DraftVocab,
                 layer_ids: Sequence[int], block: BlockSpec, step_weight: float, seed: int) -> tuple[DFlashDrafter, DFlashLoss]:
    """A fresh DFlash drafter and its loss, for :class:`~kimi_eagle.eagle3.train.Trainer`."""
    if block.block_size < 2 or block.num_draft_layers < 1:
        raise ValueError(f"a DFlash block needs the anchor and at least one mask token (block_size >= 2, got "
                         f"{block.block_size}) and at least one draft layer (got {block.num_draft_layers})")
    drafter = DFlashDrafter.from_target_weights(target_config, embed, lm_head, vocab, layer_ids, block, seed)
    return drafter, DFlashLoss(drafter, lm_head[vocab.draft_to_target].float(), step_weight)


# ------------------------------------------------------------------------------------------
# speculative decoding and loading


@dataclass
class DFlashProposer:
    """The DFlash drafter as a proposer for :func:`~kimi_eagle.eagle3.speculative.speculative_generate`: one block
    per round, anchored at the last committed token. ``cached`` (default): keep the context keys/values between
    rounds (:class:`ContextCache`); ``False`` projects the whole context every round."""

    drafter: DFlashDrafter
    name: str = "dflash"
    cached: bool = True
    cache: ContextCache = field(default_factory=ContextCache, repr=False)

    def propose(self, ids, aux, k, temperature, generator):
        n = len(ids) - 1  # features of positions 0..n-1; the anchor ids[n] is the target's own last token
        return self.drafter.propose(aux[:n].float(), int(ids[-1]), k, temperature, generator,
                                    cache=self.cache if self.cached else None)


MAX_DFLASH_WEIGHTS = 8_000_000_000


def dflash_config(values: dict, where: str) -> DFlashConfig:
    """A :class:`DFlashConfig` from a ``config.json``'s ``config``: known keys, positive integer sizes, a mask token
    in the vocabulary, a block of at least 2, and at most :data:`MAX_DFLASH_WEIGHTS` weights (checked before
    anything is allocated); ValueError otherwise."""
    from kimi_eagle.eagle3.model import drafter_config

    try:
        cfg = DFlashConfig(**values)
    except TypeError as e:
        raise ValueError(f"{where}: not a DFlash drafter config ({e})") from None
    base = {k: v for k, v in asdict(cfg).items() if k not in ("block_size", "mask_token_id", "num_draft_layers")}
    drafter_config({**base, "aux_layer_ids": [0, 1, 2]}, where)  # the shared size checks
    for name in ("block_size", "mask_token_id", "num_draft_layers"):
        v = getattr(cfg, name)
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= (2 if name == "block_size" else 0)):
            raise ValueError(f"{where}: {name} must be an integer >= {2 if name == 'block_size' else 0}, got {v!r}"[:200])
    if cfg.mask_token_id >= cfg.vocab_size or cfg.num_draft_layers < 1 or not cfg.aux_layer_ids:
        raise ValueError(f"{where}: needs a mask token below vocab_size, >= 1 draft layer and >= 1 target layer")
    h = cfg.hidden_size
    per_layer = 2 * h * cfg.num_attention_heads * cfg.head_dim + 2 * h * cfg.num_key_value_heads * cfg.head_dim + 3 * h * cfg.intermediate_size
    weights = cfg.vocab_size * h + len(cfg.aux_layer_ids) * cfg.target_hidden_size * h + cfg.num_draft_layers * per_layer + cfg.draft_vocab_size * h
    if weights > MAX_DFLASH_WEIGHTS:
        raise ValueError(f"{where}: the config describes a drafter of {weights:.3g} weights; at most {MAX_DFLASH_WEIGHTS:.0e}")
    return replace(cfg, aux_layer_ids=[int(i) for i in cfg.aux_layer_ids])


def load_dflash(path: str | Path, raw: dict) -> DFlashDrafter:
    """A drafter :meth:`DFlashDrafter.save` wrote (``raw``: its ``config.json``); ValueError naming what is wrong."""
    from kimi_eagle.eagle3.model import _load_state, load_weights

    path = Path(path)
    where = str(path / "config.json")
    if not isinstance(raw.get("config"), dict):
        raise ValueError(f"{where}: `config` must be a JSON object")
    model = DFlashDrafter(dflash_config(raw["config"], where))
    _load_state(model, load_weights(path / "model.safetensors"), str(path))
    return model


def load_any_drafter(path: str | Path, target_dir: str | Path | None = None):
    """A DFlash drafter (:meth:`DFlashDrafter.save`) or anything :func:`~kimi_eagle.eagle3.model.load_drafter` reads
    (EAGLE-3: native, exported, speculators), by the ``config.json``'s format."""
    from kimi_eagle.eagle3.model import load_drafter, read_config_json

    raw = read_config_json(Path(path) / "config.json", "drafter config")
    return load_dflash(path, raw) if raw.get("format") == DFLASH_FORMAT else load_drafter(path, target_dir)
