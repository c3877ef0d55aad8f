"""The Llama-style EAGLE-3 drafter (one decoder layer over the target's fused hidden states).

Shapes: target hidden ``Ht``, drafter hidden ``H`` (= Ht for Llama-style drafters), target vocab ``V``,
draft vocab ``Vd``.

* ``fc``: Linear(3·Ht → H, no bias) fuses the three auxiliary target layers;
* ``midlayer``: attention over ``cat(input_layernorm(embed(x)), hidden_norm(h))`` (2H wide) with ``h``
  as the residual, then ``post_attention_layernorm`` and a SwiGLU MLP;
* ``norm`` then ``lm_head`` (H → Vd); ``d2t`` maps draft ids to target ids;
* ``embed_tokens`` is the target's embedding, copied in and frozen.

Alignment (the one convention everything else follows): at unroll step ``k`` position ``t`` takes
the token ``x[t+1+k]`` and predicts ``x[t+2+k]``; step 0's hidden input is ``fc(aux[t])``, step
``k > 0`` takes the drafter's own output hidden from step ``k-1`` at the same position, with rope
position ``t + k``. A step-``k`` query attends to step-0 keys at positions ``<= t`` and to the keys
of steps ``1..k`` at its own position — exactly what chain drafting sees at inference.

Parameter names match the SGLang/vLLM EAGLE-3 checkpoints (``midlayer.self_attn.q_proj.weight`` …).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn

from kimi_eagle.eagle3.drafter_base import (
    MLP,
    NATIVE_PREFIX,
    Drafter,
    DrafterConfig,
    GroupedQueryAttention,
    KeyBlock,
    PrefixCache,
    RMSNorm,
    check_weight_shapes,
    load_state,
    load_weights,
    read_config_json,
    shift_left,
    target_tensor,
)
from kimi_eagle.eagle3.layers import layer_ids_from_engine


@dataclass
class Eagle3Config(DrafterConfig):
    """EAGLE-3's config: the shared fields; three fused aux layers and one decoder layer over ``2H`` inputs."""

    KIND: ClassVar[str] = "drafter"
    MAX_WEIGHTS: ClassVar[int] = 4_000_000_000  # a Kimi-K2-sized EAGLE-3 drafter (hidden 7168, vocab 163,840) is ~2.2e9

    def weight_count(self) -> int:
        h = self.hidden_size
        return (self.vocab_size * h + 3 * self.target_hidden_size * h + self.attention_weights(2 * h)
                + 3 * h * self.intermediate_size + self.draft_vocab_size * h)

    @classmethod
    def from_engine_config(cls, raw: dict) -> "Eagle3Config":
        """The config of an exported ``LlamaForCausalLMEagle3`` checkpoint (its ``config.json``).

        The kit's own exports keep the block-output layer ids in their ``kimi_eagle`` block; a foreign
        export's engine ids are read with :func:`~kimi_eagle.eagle3.layers.layer_ids_from_engine`.
        """
        meta = raw.get("kimi_eagle") or {}
        ids = meta.get("aux_layer_ids_block_output")
        if ids is None:
            ids = layer_ids_from_engine(raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
        return cls(
            hidden_size=raw["hidden_size"], intermediate_size=raw["intermediate_size"],
            num_attention_heads=raw["num_attention_heads"], num_key_value_heads=raw["num_key_value_heads"],
            head_dim=raw.get("head_dim") or raw["hidden_size"] // raw["num_attention_heads"],
            rms_norm_eps=raw["rms_norm_eps"], rope_theta=raw.get("rope_theta", 10000.0), vocab_size=raw["vocab_size"],
            draft_vocab_size=raw["draft_vocab_size"],
            target_hidden_size=raw.get("target_hidden_size", raw["hidden_size"]),
            max_position_embeddings=raw["max_position_embeddings"], aux_layer_ids=list(ids),
            target_num_layers=meta.get("target_num_layers", max(ids) + 1),
            bos_token_id=raw.get("bos_token_id"), eos_token_id=raw.get("eos_token_id"),
        )


class Attention(GroupedQueryAttention):
    """EAGLE-3's attention over ``cat(embed, hidden)`` (2H wide): step-0 keys causally, later steps' keys diagonally."""

    def __init__(self, cfg: Eagle3Config):
        super().__init__(cfg, 2 * cfg.hidden_size)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, past: list[tuple[torch.Tensor, torch.Tensor]],
                q_cols: torch.Tensor | None, prefix: tuple[torch.Tensor, torch.Tensor] | None = None):
        """``x`` [B,S,2H]; ``past[0]`` (if any) holds step-0 keys/values over N columns, masked causally by
        ``q_cols`` (the column of each query); ``past[1:]`` are aligned with the queries (one key each).
        ``prefix`` (step 0 only, no ``past``): cached step-0 keys/values of the M positions before these
        queries, which then sit at columns ``M..M+S-1``. Returns the keys/values of ``x`` alone."""
        s = x.shape[1]
        q = self.queries(x, positions)
        k, v = self.keys_values(x, positions)
        diag: list[tuple[torch.Tensor, torch.Tensor]] = []
        if past:
            (k0, v0), diag = past[0], [*past[1:], (k, v)]
        elif prefix is not None:
            m = prefix[0].shape[2]
            k0, v0, q_cols = torch.cat([prefix[0], k], dim=2), torch.cat([prefix[1], v], dim=2), torch.arange(m, m + s)
        else:
            k0, v0, q_cols = k, v, torch.arange(s)
        blocks = [KeyBlock(k0, v0, torch.arange(k0.shape[2])[None, :] <= q_cols[:, None])]
        if diag:  # [B,kv,S,j,d]: step j's key at the query's own position
            blocks.append(KeyBlock(torch.stack([dk for dk, _ in diag], dim=-2), torch.stack([dv for _, dv in diag], dim=-2),
                                   diagonal=True))
        return self.attend(q, blocks), (k, v)


class MidLayer(nn.Module):
    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, embeds, hidden, positions, past, q_cols, prefix=None):
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        attn, kv = self.self_attn(x, positions, past, q_cols, prefix)
        h = hidden + attn
        h = h + self.mlp(self.post_attention_layernorm(h))
        return h, kv


class Eagle3Drafter(Drafter):
    FORMAT: ClassVar[str] = "kimi-eagle-drafter/1"
    CONFIG: ClassVar[type[DrafterConfig]] = Eagle3Config

    def __init__(self, cfg: Eagle3Config):
        super().__init__(cfg)
        self.fc = nn.Linear(3 * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.midlayer = MidLayer(cfg)
        self._add_head(cfg)

    @classmethod
    def from_target(cls, target, vocab, aux_layer_ids, seed: int = 0) -> "Eagle3Drafter":
        """A fresh drafter for ``target`` (an HF causal LM); see :meth:`~Drafter.from_target_weights`."""
        return cls.from_target_weights(target.config, target.get_input_embeddings().weight,
                                       target.get_output_embeddings().weight, vocab, aux_layer_ids, seed)

    # -- forward ---------------------------------------------------------------------------
    def step(self, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
             past: list[tuple[torch.Tensor, torch.Tensor]] = (), q_cols: torch.Tensor | None = None,
             prefix: tuple[torch.Tensor, torch.Tensor] | None = None):
        """One unroll step: ``hidden`` [B,S,H] (``fc(aux)`` at step 0), ``tokens`` [B,S] target ids;
        ``prefix``: cached step-0 keys/values of the positions before these (step 0 only).
        Returns ``(out_hidden [B,S,H], logits [B,S,Vd], (k, v))`` (``k``, ``v`` of these positions only)."""
        h, kv = self.midlayer(self.embed_tokens(tokens), hidden, positions, list(past), q_cols, prefix)
        return h, self.lm_head(self.norm(h)), kv

    def unroll(self, aux: torch.Tensor, input_ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Training-time test: logits of every step, each [B,T,Vd]; ``logits[k][:, t]`` predicts
        ``input_ids[:, t + 2 + k]`` (positions past the end see token 0 and must be masked)."""
        _, t = input_ids.shape
        positions = torch.arange(t)
        hidden = self.fc(aux)
        past: list[tuple[torch.Tensor, torch.Tensor]] = []
        out = []
        for k in range(steps):
            tokens = shift_left(input_ids, 1 + k)
            hidden, logits, kv = self.step(hidden, tokens, positions + k, past, positions if past else None)
            past.append(kv)
            out.append(logits)
        return out

    @torch.no_grad()
    def propose(self, aux: torch.Tensor, next_tokens: torch.Tensor, k: int, temperature: float = 0.0,
                generator: torch.Generator | None = None,
                cache: "DraftCache | None" = None) -> tuple[list[int], list[torch.Tensor]]:
        """Draft a chain of ``k`` target token ids after a committed sequence ``x[0..n]``.

        ``aux`` [n, 3Ht] are the target's features at positions ``0..n-1`` and ``next_tokens`` [n] are
        ``x[1..n]``. Returns the draft ids and, per draft, the proposal distribution over the target
        vocabulary (one-hot at temperature 0). With a ``cache`` (:class:`DraftCache`), step 0 runs only
        over the positions whose inputs differ from the cached ones (the newly committed positions, when
        called round after round on a growing sequence) and the cache then holds all ``n``.
        """
        n = next_tokens.shape[0]
        m = cache.reusable(aux, next_tokens) if cache is not None else 0
        hidden, logits, kv0 = self.step(self.fc(aux[None, m:]), next_tokens[None, m:], torch.arange(m, n),
                                        prefix=cache.keys_values(m) if m else None)
        if cache is not None:
            kv0 = cache.store(aux, next_tokens, kv0, m)
        hidden, logits = hidden[:, -1:], logits[:, -1]
        past = [kv0]
        drafts, dists = [], []
        last_col = torch.tensor([n - 1])
        for j in range(k):
            q = self.proposal(logits[0], temperature)
            tok = int(torch.argmax(q)) if temperature <= 0 else int(torch.multinomial(q, 1, generator=generator))
            drafts.append(tok)
            dists.append(q)
            if j == k - 1:
                break
            hidden, logits, kv = self.step(hidden, torch.tensor([[tok]]), torch.tensor([n - 1 + j + 1]), past, last_col)
            logits = logits[:, -1]
            past.append(kv)
        return drafts, dists


class DraftCache(PrefixCache):
    """The drafter's step-0 keys/values of a committed prefix, for :meth:`Eagle3Drafter.propose`.

    Step 0 is causal, so its keys/values at position ``t`` depend only on ``aux[0..t]`` and ``next_tokens[0..t]``:
    both inputs are compared (:class:`~kimi_eagle.eagle3.drafter_base.PrefixCache`), and at least the last position
    is always recomputed (its output hidden state starts the chain).
    """

    KEEP_LAST: ClassVar[bool] = True

    @property
    def k(self) -> torch.Tensor | None:  # [1, kv, m, d]
        return self.kv[0][0] if self.kv else None

    @property
    def v(self) -> torch.Tensor | None:
        return self.kv[0][1] if self.kv else None

    def reusable(self, aux: torch.Tensor, next_tokens: torch.Tensor) -> int:
        """How many leading positions of ``(aux, next_tokens)`` the cache holds unchanged (< ``len(next_tokens)``)."""
        return self.reusable_prefix(aux, next_tokens)

    def keys_values(self, m: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.prefix_kv(m)[0]

    def store(self, aux: torch.Tensor, next_tokens: torch.Tensor, new_kv: tuple[torch.Tensor, torch.Tensor],
              m: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keep the first ``m`` cached positions plus ``new_kv`` (positions ``m..n-1``); returns all ``n``."""
        return self.store_prefix((aux, next_tokens), [new_kv], m)[0]


def drafter_config(values: dict, where: str) -> Eagle3Config:
    """An :class:`Eagle3Config` from ``values`` (:meth:`~kimi_eagle.eagle3.drafter_base.DrafterConfig.checked`)."""
    return Eagle3Config.checked(values, where)


def load_drafter(path: str | Path, target_dir: str | Path | None = None) -> Eagle3Drafter:
    """Load a native EAGLE-3 drafter, an exported SGLang/vLLM one, or a speculators EAGLE-3 checkpoint
    (:mod:`.speculators_checkpoint`); embeddings a checkpoint lacks come from ``target_dir``. Another kit drafter
    (DFlash) is refused by its format: :func:`kimi_eagle.eagle3.drafters.load_any_drafter` reads every kind."""
    path = Path(path)
    where = str(path / "config.json")
    raw = read_config_json(path / "config.json", "drafter config")
    fmt = raw.get("format")
    if fmt == Eagle3Drafter.FORMAT:
        return Eagle3Drafter.load_native(path, raw)
    if isinstance(fmt, str) and fmt.startswith(NATIVE_PREFIX):
        raise ValueError(f"{path}: a kit drafter of format {fmt}, not an EAGLE-3 one (read it with "
                         "kimi_eagle.eagle3.drafters.load_any_drafter)")
    if raw.get("speculators_model_type") == "eagle3":  # trained or saved by speculators (Eagle3DraftModel)
        from kimi_eagle.eagle3.speculators_checkpoint import kit_drafter_parts

        config, state = kit_drafter_parts(path, target_dir)
        return _with_target_embeddings(Eagle3Drafter(drafter_config(config, where)), state, path, target_dir)
    if "LlamaForCausalLMEagle3" not in (raw.get("architectures") or []):
        raise ValueError(f"{path}: neither a kimi-eagle drafter nor an exported LlamaForCausalLMEagle3")
    try:
        config = asdict(Eagle3Config.from_engine_config(raw))
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        raise ValueError(f"{where}: not an EAGLE-3 config ({type(e).__name__}: {e})") from None
    cfg = drafter_config(config, where)
    check_weight_shapes(Eagle3Drafter, cfg, path / "model.safetensors", optional=("embed_tokens.weight",))
    return _with_target_embeddings(Eagle3Drafter(cfg), load_weights(path / "model.safetensors"), path, target_dir)


def _with_target_embeddings(model: Eagle3Drafter, state: dict, path: Path, target_dir) -> Eagle3Drafter:
    """``model`` with ``state``, the embeddings read from ``target_dir`` when the checkpoint carries none."""
    if "embed_tokens.weight" not in state:
        if target_dir is None:
            raise ValueError(f"{path}: this checkpoint carries no embeddings (engines share the target's); pass the "
                             "target directory")
        state["embed_tokens.weight"] = target_tensor(target_dir, "embed_tokens.weight")
    load_state(model, state, str(path))
    return model
