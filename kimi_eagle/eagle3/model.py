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

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from kimi_eagle.eagle3.draft_vocab import DraftVocab
from kimi_eagle.eagle3.layers import layer_ids_from_engine
from kimi_eagle.io import atomic_path, write_json

NATIVE_FORMAT = "kimi-eagle-drafter/1"


@dataclass
class Eagle3Config:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int  # target vocabulary
    draft_vocab_size: int
    target_hidden_size: int
    max_position_embeddings: int
    aux_layer_ids: list[int]  # 0-based block-output indices of the target
    target_num_layers: int
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_target(cls, target_config, draft_vocab_size: int, aux_layer_ids: Sequence[int]) -> "Eagle3Config":
        c = target_config
        rope = getattr(c, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", getattr(c, "rope_theta", 10000.0))
        heads = c.num_attention_heads
        return cls(
            hidden_size=c.hidden_size, intermediate_size=c.intermediate_size, num_attention_heads=heads,
            num_key_value_heads=getattr(c, "num_key_value_heads", heads) or heads,
            head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads, rms_norm_eps=float(c.rms_norm_eps),
            rope_theta=float(theta), vocab_size=c.vocab_size, draft_vocab_size=draft_vocab_size,
            target_hidden_size=c.hidden_size, max_position_embeddings=c.max_position_embeddings,
            aux_layer_ids=[int(i) for i in aux_layer_ids], target_num_layers=c.num_hidden_layers,
            bos_token_id=getattr(c, "bos_token_id", None), eos_token_id=_first(getattr(c, "eos_token_id", None)),
        )

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


def _first(x):
    return x[0] if isinstance(x, (list, tuple)) else x


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.n_heads, self.n_kv, self.head_dim, self.theta = cfg.num_attention_heads, cfg.num_key_value_heads, d, cfg.rope_theta
        self.q_proj = nn.Linear(2 * h, self.n_heads * d, bias=False)
        self.k_proj = nn.Linear(2 * h, self.n_kv * d, bias=False)
        self.v_proj = nn.Linear(2 * h, self.n_kv * d, bias=False)
        self.o_proj = nn.Linear(self.n_heads * d, h, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, past: list[tuple[torch.Tensor, torch.Tensor]],
                q_cols: torch.Tensor | None, prefix: tuple[torch.Tensor, torch.Tensor] | None = None):
        """``x`` [B,S,2H]; ``past[0]`` (if any) holds step-0 keys/values over N columns, masked causally by
        ``q_cols`` (the column of each query); ``past[1:]`` are aligned with the queries (one key each).
        ``prefix`` (step 0 only, no ``past``): cached step-0 keys/values of the M positions before these
        queries, which then sit at columns ``M..M+S-1``. Returns the keys/values of ``x`` alone."""
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.n_kv, self.head_dim).transpose(1, 2)
        cos, sin = rope_cos_sin(positions, self.head_dim, self.theta)
        if cos.dim() == 2:
            cos, sin = cos[None, None], sin[None, None]
        else:
            cos, sin = cos[:, None], sin[:, None]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        rep, d = self.n_heads // self.n_kv, self.head_dim
        if past:
            k0, v0 = past[0]
            diag_k = [pk for pk, _ in past[1:]] + [k]
            diag_v = [pv for _, pv in past[1:]] + [v]
        elif prefix is not None:
            m = prefix[0].shape[2]
            k0, v0 = torch.cat([prefix[0], k], dim=2), torch.cat([prefix[1], v], dim=2)
            diag_k, diag_v, q_cols = [], [], torch.arange(m, m + s)
        else:
            k0, v0, diag_k, diag_v, q_cols = k, v, [], [], torch.arange(s)
        n = k0.shape[2]
        # grouped-query attention without copying keys: query heads [kv, rep] share kv head `kv`
        qg = (q * (1.0 / math.sqrt(d))).view(b, self.n_kv, rep, s, d)
        scores = (qg @ k0.unsqueeze(2).transpose(-1, -2)).float()  # [B,kv,rep,S,N]
        scores = scores.masked_fill(torch.arange(n)[None, :] > q_cols[:, None], float("-inf"))
        if diag_k:
            dk = torch.stack(diag_k, dim=-2).unsqueeze(2)  # [B,kv,1,S,j,d]
            scores = torch.cat([scores, (qg.unsqueeze(-2) * dk).sum(-1).float()], dim=-1)  # + [B,kv,rep,S,j]
        probs = torch.softmax(scores, dim=-1).to(q.dtype)
        out = probs[..., :n] @ v0.unsqueeze(2)  # [B,kv,rep,S,d]
        if diag_v:
            dv = torch.stack(diag_v, dim=-2).unsqueeze(2)  # [B,kv,1,S,j,d]
            out = out + (probs[..., n:].unsqueeze(-1) * dv).sum(-2)
        out = out.reshape(b, self.n_heads, s, d).transpose(1, 2).reshape(b, s, self.n_heads * d)
        return self.o_proj(out), (k, v)


class MLP(nn.Module):
    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


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


class Eagle3Drafter(nn.Module):
    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        self.fc = nn.Linear(3 * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.midlayer = MidLayer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def from_target(cls, target, vocab: DraftVocab, aux_layer_ids: Sequence[int], seed: int = 0) -> "Eagle3Drafter":
        """A fresh drafter for ``target`` (an HF causal LM); see :meth:`from_target_weights`."""
        return cls.from_target_weights(target.config, target.get_input_embeddings().weight,
                                       target.get_output_embeddings().weight, vocab, aux_layer_ids, seed)

    @classmethod
    def from_target_weights(cls, target_config, embed: torch.Tensor, lm_head: torch.Tensor, vocab: DraftVocab,
                            aux_layer_ids: Sequence[int], seed: int = 0) -> "Eagle3Drafter":
        """Embeddings copied and frozen, ``lm_head`` initialised from the target's rows of the draft
        vocabulary, every other weight drawn from a generator seeded with ``seed``."""
        return seeded_from_target(cls, Eagle3Config.from_target(target_config, vocab.size, aux_layer_ids),
                                  embed, lm_head, vocab, seed)

    @property
    def draft_to_target(self) -> torch.Tensor:
        return torch.arange(self.config.draft_vocab_size) + self.d2t

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
            q = self._proposal(logits[0], temperature)
            tok = int(torch.argmax(q)) if temperature <= 0 else int(torch.multinomial(q, 1, generator=generator))
            drafts.append(tok)
            dists.append(q)
            if j == k - 1:
                break
            hidden, logits, kv = self.step(hidden, torch.tensor([[tok]]), torch.tensor([n - 1 + j + 1]), past, last_col)
            logits = logits[:, -1]
            past.append(kv)
        return drafts, dists

    def _proposal(self, draft_logits: torch.Tensor, temperature: float) -> torch.Tensor:
        q = torch.zeros(self.config.vocab_size)
        if temperature <= 0:
            q[self.draft_to_target[int(torch.argmax(draft_logits))]] = 1.0
        else:
            q[self.draft_to_target] = torch.softmax(draft_logits.float() / temperature, dim=-1)
        return q

    # -- persistence -----------------------------------------------------------------------
    def save(self, out: str | Path, extra: dict | None = None) -> Path:
        """The native format: ``config.json`` + ``model.safetensors`` (all weights, embeddings included)."""
        from safetensors.torch import save_file

        out = Path(out)
        state = {k: v.detach().contiguous() for k, v in self.state_dict().items()}
        with atomic_path(out / "model.safetensors") as tmp:
            save_file(state, str(tmp), metadata={"format": NATIVE_FORMAT})
        write_json(out / "config.json", {"format": NATIVE_FORMAT, "config": asdict(self.config), **(extra or {})}, indent=1)
        return out


def seeded_from_target(cls: type, cfg: Eagle3Config, embed: torch.Tensor, lm_head: torch.Tensor, vocab: DraftVocab,
                       seed: int) -> nn.Module:
    """A drafter ``cls(cfg)`` (EAGLE-3 or DFlash) with the target's embeddings, ``lm_head`` from the target's rows of the
    draft vocabulary and its ``d2t``/``t2d``; every other weight drawn from a generator seeded with ``seed``."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = cls(cfg)
    with torch.no_grad():
        model.embed_tokens.weight.copy_(embed)
        model.lm_head.weight.copy_(lm_head[vocab.draft_to_target])
        model.d2t.copy_(vocab.d2t)
        model.t2d.copy_(vocab.t2d)
    return model


class DraftCache:
    """The drafter's step-0 keys/values of a committed prefix, for :meth:`Eagle3Drafter.propose`.

    Step 0 is causal, so its keys/values at position ``t`` depend only on ``aux[0..t]`` and
    ``next_tokens[0..t]``: they are reused for the longest prefix whose inputs equal (bitwise) the cached
    ones, and everything after it is dropped (a new prompt, or a sequence that was rolled back). Drafts are
    never cached — only committed positions are — so a rejection needs no crop here. At least the last
    position is always recomputed (its output hidden state starts the chain).
    """

    def __init__(self) -> None:
        self.aux: torch.Tensor | None = None  # [m, 3Ht] the inputs the keys were computed from
        self.tokens: torch.Tensor | None = None  # [m]
        self.k: torch.Tensor | None = None  # [1, kv, m, d]
        self.v: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.tokens is None else int(self.tokens.shape[0])

    def reusable(self, aux: torch.Tensor, next_tokens: torch.Tensor) -> int:
        """How many leading positions of ``(aux, next_tokens)`` the cache holds unchanged (< ``len(next_tokens)``)."""
        m = min(len(self), next_tokens.shape[0] - 1)
        if m <= 0:
            return 0
        same = (self.tokens[:m] == next_tokens[:m]) & (self.aux[:m] == aux[:m]).all(-1)
        return m if bool(same.all()) else int(same.long().cumprod(0).sum())

    def keys_values(self, m: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[:, :, :m], self.v[:, :, :m]

    def store(self, aux: torch.Tensor, next_tokens: torch.Tensor, new_kv: tuple[torch.Tensor, torch.Tensor],
              m: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keep the first ``m`` cached positions plus ``new_kv`` (positions ``m..n-1``); returns all ``n``."""
        k, v = new_kv
        if m:
            k, v = torch.cat([self.k[:, :, :m], k], dim=2), torch.cat([self.v[:, :, :m], v], dim=2)
        self.aux, self.tokens, self.k, self.v = aux.detach().clone(), next_tokens.clone(), k, v
        return k, v


def shift_left(x: torch.Tensor, n: int, fill: float | int = 0) -> torch.Tensor:
    """``y[:, t] = x[:, t + n]`` with ``fill`` past the end (dim 1)."""
    if n == 0:
        return x
    pad_shape = list(x.shape)
    pad_shape[1] = min(n, x.shape[1])
    return torch.cat([x[:, n:], torch.full(pad_shape, fill, dtype=x.dtype)], dim=1)


MAX_CONFIG_BYTES = 1 << 20  # a config.json is a page of numbers
MAX_DRAFTER_WEIGHTS = 4_000_000_000  # a Kimi-K2-sized EAGLE-3 drafter (hidden 7168, vocab 163,840) is ~2.2e9


def read_config_json(path: str | Path, what: str = "config") -> dict:
    """``path`` (a ``config.json``) as a JSON object, or a ValueError naming the file and what it should be."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ValueError(f"{path}: {size} bytes; a {what} is at most {MAX_CONFIG_BYTES} bytes")
        raw = json.loads(path.read_bytes())
    except OSError as e:
        raise ValueError(f"{path}: cannot read the {what}: {e.strerror or e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: the {what} is not JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: the {what} must be a JSON object, got {type(raw).__name__}")
    return raw


def drafter_config(values: dict, where: str) -> Eagle3Config:
    """An :class:`Eagle3Config` from ``values``: known keys, positive integer sizes, and a network of at most
    :data:`MAX_DRAFTER_WEIGHTS` weights, checked before anything is allocated."""
    try:
        cfg = Eagle3Config(**values)
    except TypeError as e:
        raise ValueError(f"{where}: not a drafter config ({e})") from None
    sizes = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
             "vocab_size", "draft_vocab_size", "target_hidden_size", "max_position_embeddings", "target_num_layers")
    for name in sizes:
        v = getattr(cfg, name)
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
            raise ValueError(f"{where}: {name} must be a positive integer, got {v!r}"[:200])
    h, heads = cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim
    weights = (cfg.vocab_size * h + 3 * cfg.target_hidden_size * h + 2 * h * heads
               + 2 * 2 * h * cfg.num_key_value_heads * cfg.head_dim + heads * h + 3 * h * cfg.intermediate_size
               + cfg.draft_vocab_size * h)
    if weights > MAX_DRAFTER_WEIGHTS:
        raise ValueError(f"{where}: the config describes a drafter of {weights:.3g} weights (hidden_size {h}, "
                         f"intermediate_size {cfg.intermediate_size}); at most {MAX_DRAFTER_WEIGHTS:.0e}")
    return cfg


def check_weight_shapes(cfg: Eagle3Config, path: str | Path, optional: tuple[str, ...] = ()) -> None:
    """The tensors the config describes (built on the ``meta`` device: nothing allocated) against the shapes in
    the header of the safetensors file ``path``; a ValueError names the first that differs. ``optional``: names
    the file may lack (embeddings an export leaves to the target)."""
    from safetensors import SafetensorError, safe_open

    with torch.device("meta"):
        expected = {name: tuple(t.shape) for name, t in Eagle3Drafter(cfg).state_dict().items()}
    try:
        with safe_open(str(path), framework="pt") as f:
            stored = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{path}: not a readable safetensors file ({e})") from None
    for name, shape in expected.items():
        if name not in stored and name in optional:
            continue
        if stored.get(name) != shape:
            got = "missing" if name not in stored else f"{list(stored[name])}"
            raise ValueError(f"{path}: {name} is {got} but the config (hidden_size {cfg.hidden_size}) needs "
                             f"{list(shape)}")


def load_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, or a ValueError naming it (a pickle renamed ``.safetensors`` is refused:
    safetensors reads a header and raw bytes, never code)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{path}: not a readable safetensors file ({e})") from None


def _load_state(model: nn.Module, state: dict, where: str) -> None:
    try:
        model.load_state_dict(state)
    except RuntimeError as e:  # missing, unexpected or wrongly shaped tensors
        raise ValueError(f"{where}: the weights do not fit the config: {' '.join(str(e).split())[:300]}") from None


def load_drafter(path: str | Path, target_dir: str | Path | None = None) -> Eagle3Drafter:
    """Load a native EAGLE-3 drafter (a DFlash one: :func:`kimi_eagle.eagle3.dflash.load_any_drafter`), an exported SGLang/vLLM one, or a speculators EAGLE-3 checkpoint
    (:mod:`.speculators_checkpoint`); embeddings a checkpoint lacks come from ``target_dir``."""
    path = Path(path)
    where = str(path / "config.json")
    raw = read_config_json(path / "config.json", "drafter config")
    if raw.get("format") == "kimi-eagle-dflash/1":  # kimi_eagle.eagle3.dflash imports this module, not the reverse
        raise ValueError(f"{path}: a DFlash block drafter, not an EAGLE-3 one (read it with kimi_eagle.eagle3.dflash.load_any_drafter)")
    if raw.get("format") == NATIVE_FORMAT:
        if not isinstance(raw.get("config"), dict):
            raise ValueError(f"{where}: `config` must be a JSON object")
        cfg = drafter_config(raw["config"], where)
        check_weight_shapes(cfg, path / "model.safetensors")
        model = Eagle3Drafter(cfg)
        _load_state(model, load_weights(path / "model.safetensors"), str(path))
        return model
    if raw.get("speculators_model_type") == "eagle3":  # trained or saved by speculators (Eagle3DraftModel)
        from kimi_eagle.eagle3.speculators_checkpoint import kit_drafter_parts

        config, state = kit_drafter_parts(path, target_dir)
        model = Eagle3Drafter(drafter_config(config, where))
        if "embed_tokens.weight" not in state:
            if target_dir is None:
                raise ValueError(f"{path}: this speculators checkpoint carries no embeddings; pass the target directory")
            state["embed_tokens.weight"] = target_tensor(target_dir, "embed_tokens.weight")
        _load_state(model, state, str(path))
        return model
    if "LlamaForCausalLMEagle3" not in (raw.get("architectures") or []):
        raise ValueError(f"{path}: neither a kimi-eagle drafter nor an exported LlamaForCausalLMEagle3")
    try:
        config = asdict(Eagle3Config.from_engine_config(raw))
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        raise ValueError(f"{where}: not an EAGLE-3 config ({type(e).__name__}: {e})") from None
    cfg = drafter_config(config, where)
    check_weight_shapes(cfg, path / "model.safetensors", optional=("embed_tokens.weight",))
    model = Eagle3Drafter(cfg)
    state = load_weights(path / "model.safetensors")
    if "embed_tokens.weight" not in state:
        if target_dir is None:
            raise ValueError(f"{path}: exported drafters carry no embeddings; pass the target directory")
        state["embed_tokens.weight"] = target_tensor(target_dir, "embed_tokens.weight")
    _load_state(model, state, str(path))
    return model


def target_tensor(target_dir: str | Path, suffix: str) -> torch.Tensor:
    """A weight of the target read straight from its safetensors (e.g. ``lm_head.weight``), without
    loading the model; ``lm_head.weight`` falls back to the embeddings for tied models."""
    from safetensors import safe_open

    for f in sorted(Path(target_dir).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():
                if name == suffix or name.endswith("." + suffix):
                    return st.get_tensor(name)
    if suffix == "lm_head.weight":
        return target_tensor(target_dir, "embed_tokens.weight")
    raise ValueError(f"{target_dir}: no {suffix} in the target's safetensors")
