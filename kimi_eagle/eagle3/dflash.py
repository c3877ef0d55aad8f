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

Training: :class:`~kimi_eagle.eagle3.losses.DFlashLoss` (every loss lives in :mod:`kimi_eagle.eagle3.losses`; the
recipes that set it, :mod:`kimi_eagle.eagle3.recipes`). What is shared with EAGLE-3 (config core, layers,
grouped-query attention, prefix cache, vocabulary maps, proposals, checkpoints) is
:mod:`kimi_eagle.eagle3.drafter_base`.
Drafting (:meth:`DFlashDrafter.propose`) fills ``k <= S - 1`` slots at once; the context keys/values of the
committed prefix are kept between rounds (:class:`ContextCache`). Verification is the kit's
(:func:`~kimi_eagle.eagle3.speculative.speculative_generate`): the target checks the whole block in one pass.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Sequence

import torch
from torch import nn

from kimi_eagle.eagle3.dflash_config import BLOCK_SIZE
from kimi_eagle.eagle3.draft_vocab import DraftVocab
from kimi_eagle.eagle3.drafter_base import (
    MLP,
    Drafter,
    DrafterConfig,
    GroupedQueryAttention,
    KeyBlock,
    PrefixCache,
    RMSNorm,
)


@dataclass
class DFlashConfig(DrafterConfig):
    """The shared fields plus the block: ``block_size`` (anchor + masks), ``mask_token_id`` (target id space) and
    ``num_draft_layers``; ``aux_layer_ids`` may hold any number of target layers (5 by default)."""

    block_size: int = BLOCK_SIZE
    mask_token_id: int = 0
    num_draft_layers: int = 1

    KIND: ClassVar[str] = "DFlash drafter"
    MAX_WEIGHTS: ClassVar[int] = 8_000_000_000

    def weight_count(self) -> int:
        h = self.hidden_size
        per_layer = self.attention_weights(h) + 3 * h * self.intermediate_size
        return (self.vocab_size * h + len(self.aux_layer_ids) * self.target_hidden_size * h
                + self.num_draft_layers * per_layer + self.draft_vocab_size * h)

    def check_own(self, where: str) -> None:
        for name, low in (("block_size", 2), ("mask_token_id", 0), ("num_draft_layers", 1)):
            v = getattr(self, name)
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= low):
                raise ValueError(f"{where}: {name} must be an integer >= {low}, got {v!r}"[:200])
        if self.mask_token_id >= self.vocab_size:
            raise ValueError(f"{where}: the mask token {self.mask_token_id} is not below vocab_size {self.vocab_size}")


@dataclass(frozen=True)
class BlockSpec:
    """What a DFlash drafter adds to the shared config: the block size, the mask token and the number of draft layers."""

    block_size: int = BLOCK_SIZE
    mask_token_id: int = 0
    num_draft_layers: int = 1


class BlockAttention(GroupedQueryAttention):
    """Qwen3-style attention (``q_norm``/``k_norm``): block queries over the context keys before their anchor and
    (bidirectionally) their own block's keys."""

    def __init__(self, cfg: DFlashConfig):
        super().__init__(cfg, cfg.hidden_size, qk_norm=True)

    def context_kv(self, ctx: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The context's keys/values ``[B, kv, T, d]`` (they depend only on ``ctx[t]`` and ``t``: cacheable)."""
        return self.keys_values(ctx, positions)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, ctx_kv: tuple[torch.Tensor, torch.Tensor],
                allowed: torch.Tensor) -> torch.Tensor:
        """``x`` [B,A,S,H] blocks at rope ``positions`` [A,S]; ``allowed`` [A,T]: context position ``t`` is seen
        by block ``a``. Returns [B,A,S,H]."""
        q = self.queries(x, positions)  # [B,nh,A,S,d]
        kb, vb = self.keys_values(x, positions)  # [B,kv,A,S,d]
        kc, vc = ctx_kv  # [B,kv,T,d]
        return self.attend(q, [KeyBlock(kc, vc, allowed[:, None, :]), KeyBlock(kb, vb)])


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


class ContextCache(PrefixCache):
    """Each draft layer's context keys/values of a committed prefix (:class:`~kimi_eagle.eagle3.drafter_base.PrefixCache`):
    a key at ``t`` depends on ``aux[t]`` alone, so ``aux`` is the only input compared."""

    def reusable(self, aux: torch.Tensor) -> int:
        return self.reusable_prefix(aux)

    def store(self, aux: torch.Tensor, new_kv: list[tuple[torch.Tensor, torch.Tensor]], m: int) -> list:
        """Keep ``m`` cached positions plus ``new_kv`` (positions ``m..n-1``); returns every layer's full keys/values."""
        return self.store_prefix((aux,), new_kv, m)


class DFlashDrafter(Drafter):
    FORMAT: ClassVar[str] = "kimi-eagle-dflash/1"
    CONFIG: ClassVar[type[DrafterConfig]] = DFlashConfig

    def __init__(self, cfg: DFlashConfig):
        super().__init__(cfg)
        self.fc = nn.Linear(len(cfg.aux_layer_ids) * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(BlockLayer(cfg) for _ in range(cfg.num_draft_layers))
        self._add_head(cfg)

    @classmethod
    def from_target_weights(cls, target_config, embed: torch.Tensor, lm_head: torch.Tensor, vocab: DraftVocab,
                            aux_layer_ids: Sequence[int], block: BlockSpec = BlockSpec(), seed: int = 0) -> "DFlashDrafter":
        """:meth:`~kimi_eagle.eagle3.drafter_base.Drafter.from_target_weights` with the block ``block``."""
        return super().from_target_weights(target_config, embed, lm_head, vocab, aux_layer_ids, seed,
                                           block_size=block.block_size, mask_token_id=block.mask_token_id,
                                           num_draft_layers=block.num_draft_layers)

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
            q = self.proposal(logits[j], temperature)
            drafts.append(int(torch.argmax(q)) if temperature <= 0 else int(torch.multinomial(q, 1, generator=generator)))
            dists.append(q)
        return drafts, dists


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
