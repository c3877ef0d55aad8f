"""What every kit drafter shares: the config core, the layers, grouped-query attention, the prefix cache, the draft
vocabulary maps, the proposal distribution, and the native checkpoint (save, checks, load).

The drafters themselves (:mod:`kimi_eagle.eagle3.model`: EAGLE-3's chain; :mod:`kimi_eagle.eagle3.dflash`: the DFlash
block) hold only what makes them that drafter: which inputs their layers see, which keys a query attends to, how a
round is drafted, and their config's own fields and weight count. Each names its checkpoint format as a class
attribute (:attr:`Drafter.FORMAT`); :func:`kimi_eagle.eagle3.drafters.load_any_drafter` reads any of them.

Shapes: target hidden ``Ht``, drafter hidden ``H``, target vocab ``V``, draft vocab ``Vd``, head dim ``d``.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from kimi_eagle.eagle3.draft_vocab import DraftVocab
from kimi_eagle.io import atomic_path, write_json

NATIVE_PREFIX = "kimi-eagle-"  # every native drafter format starts so (the classes' FORMAT attributes)
MAX_CONFIG_BYTES = 1 << 20  # a config.json is a page of numbers
SIZE_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
               "vocab_size", "draft_vocab_size", "target_hidden_size", "max_position_embeddings", "target_num_layers")


# ------------------------------------------------------------------------------------------
# config


@dataclass
class DrafterConfig:
    """The fields every drafter has (a drafter's config adds its own); checked by :meth:`checked` before anything
    is allocated."""

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

    KIND: ClassVar[str] = "drafter"  # how messages name it
    MAX_WEIGHTS: ClassVar[int] = 4_000_000_000

    @classmethod
    def from_target(cls, target_config, draft_vocab_size: int, aux_layer_ids: Sequence[int], **own) -> "DrafterConfig":
        """A config sized like ``target_config`` (an HF config or anything with its attributes); ``own``: the
        drafter's own fields (e.g. DFlash's block)."""
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
            bos_token_id=getattr(c, "bos_token_id", None), eos_token_id=_first(getattr(c, "eos_token_id", None)), **own,
        )

    def weight_count(self) -> int:
        """Weights of the network this config describes (each drafter counts its own)."""
        raise NotImplementedError

    def check_own(self, where: str) -> None:
        """The drafter's own fields (none here); ValueError naming ``where``."""

    def attention_weights(self, in_features: int) -> int:
        """q/k/v/o projection weights of one attention layer whose queries and keys read ``in_features``."""
        q = self.num_attention_heads * self.head_dim
        return in_features * (q + 2 * self.num_key_value_heads * self.head_dim) + q * self.hidden_size

    @classmethod
    def checked(cls, values: dict, where: str) -> "DrafterConfig":
        """A config from ``values`` (a ``config.json``'s ``config``): known keys, positive integer sizes, the
        drafter's own checks and at most :attr:`MAX_WEIGHTS` weights; ValueError naming ``where`` otherwise."""
        try:
            cfg = cls(**values)
        except TypeError as e:
            raise ValueError(f"{where}: not a {cls.KIND} config ({e})") from None
        for name in SIZE_FIELDS:
            v = getattr(cfg, name)
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
                raise ValueError(f"{where}: {name} must be a positive integer, got {v!r}"[:200])
        if not isinstance(cfg.aux_layer_ids, list) or not cfg.aux_layer_ids:
            raise ValueError(f"{where}: aux_layer_ids must be a non-empty list of target block ids")
        cfg.check_own(where)
        weights = cfg.weight_count()
        if weights > cls.MAX_WEIGHTS:
            raise ValueError(f"{where}: the config describes a {cls.KIND} of {weights:.3g} weights (hidden_size "
                             f"{cfg.hidden_size}, intermediate_size {cfg.intermediate_size}); at most {cls.MAX_WEIGHTS:.0e}")
        cfg.aux_layer_ids = [int(i) for i in cfg.aux_layer_ids]
        return cfg


def _first(x):
    return x[0] if isinstance(x, (list, tuple)) else x


# ------------------------------------------------------------------------------------------
# layers


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


class MLP(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def shift_left(x: torch.Tensor, n: int, fill: float | int = 0) -> torch.Tensor:
    """``y[:, t] = x[:, t + n]`` with ``fill`` past the end (dim 1)."""
    if n == 0:
        return x
    pad_shape = list(x.shape)
    pad_shape[1] = min(n, x.shape[1])
    return torch.cat([x[:, n:], torch.full(pad_shape, fill, dtype=x.dtype)], dim=1)


# ------------------------------------------------------------------------------------------
# grouped-query attention


@dataclass
class KeyBlock:
    """Keys and values a query attends to: ``k``/``v`` ``[B, kv, *K, N, d]`` with ``*K`` empty (shared by every query)
    or the query's leading dims; ``allowed`` (broadcastable to the scores ``[..., N]``, True = seen) or None (all);
    ``diagonal``: ``k``/``v`` are ``[B, kv, *Q, j, d]``, ``j`` keys per query (EAGLE-3's later TTT steps)."""

    k: torch.Tensor
    v: torch.Tensor
    allowed: torch.Tensor | None = None
    diagonal: bool = False


class GroupedQueryAttention(nn.Module):
    """q/k/v/o projections (names as the engines'), optional per-head ``q_norm``/``k_norm`` (Qwen3-style), rope, and
    one masked softmax over any list of :class:`KeyBlock`; query heads ``[kv, rep]`` share kv head ``kv`` without
    copying keys. A drafter's attention says only which keys each query sees."""

    def __init__(self, cfg: DrafterConfig, in_features: int, qk_norm: bool = False):
        super().__init__()
        d = cfg.head_dim
        self.n_heads, self.n_kv, self.head_dim, self.theta = cfg.num_attention_heads, cfg.num_key_value_heads, d, cfg.rope_theta
        self.q_proj = nn.Linear(in_features, self.n_heads * d, bias=False)
        self.k_proj = nn.Linear(in_features, self.n_kv * d, bias=False)
        self.v_proj = nn.Linear(in_features, self.n_kv * d, bias=False)
        self.o_proj = nn.Linear(self.n_heads * d, cfg.hidden_size, bias=False)
        if qk_norm:
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def _heads(self, proj: nn.Linear, x: torch.Tensor, n: int, norm: RMSNorm | None,
               positions: torch.Tensor | None) -> torch.Tensor:
        """``x`` [B, *Q, in] -> [B, n, *Q, d]: projected, normed, roped at ``positions`` (shape ``*Q`` or [B, *Q])."""
        y = proj(x).view(*x.shape[:-1], n, self.head_dim)
        if norm is not None:
            y = norm(y)
        if positions is not None:
            cos, sin = rope_cos_sin(positions, self.head_dim, self.theta)
            y = apply_rope(y, cos[..., None, :], sin[..., None, :])
        return y.movedim(-2, 1)

    def queries(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self._heads(self.q_proj, x, self.n_heads, self.q_norm, positions)

    def keys_values(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (normed, roped) and values of ``x`` [B, *Q, in], each [B, kv, *Q, d]."""
        return (self._heads(self.k_proj, x, self.n_kv, self.k_norm, positions),
                self._heads(self.v_proj, x, self.n_kv, None, None))

    def attend(self, q: torch.Tensor, blocks: Sequence[KeyBlock]) -> torch.Tensor:
        """``q`` [B, nh, *Q, d] over ``blocks`` (one softmax across them all); returns ``o_proj`` of the heads, [B, *Q, H]."""
        b, lead = q.shape[0], tuple(q.shape[2:-1])
        rep, d = self.n_heads // self.n_kv, self.head_dim
        qg = (q * (1.0 / math.sqrt(d))).view(b, self.n_kv, rep, *lead, d)
        scores = [_block_scores(qg, blk) for blk in blocks]
        probs = torch.softmax(torch.cat(scores, dim=-1), dim=-1).to(q.dtype)
        out = None
        for p, blk in zip(probs.split([s.shape[-1] for s in scores], dim=-1), blocks):
            part = _block_values(p, blk)
            out = part if out is None else out + part
        out = out.reshape(b, self.n_heads, *lead, d).movedim(1, -2).reshape(b, *lead, self.n_heads * d)
        return self.o_proj(out)


def _block_scores(qg: torch.Tensor, blk: KeyBlock) -> torch.Tensor:
    """Scores [B, kv, rep, *Q, N] (float, -inf where not allowed) of grouped queries ``qg`` [B, kv, rep, *Q, d]."""
    if blk.diagonal:
        scores = (qg.unsqueeze(-2) * blk.k.unsqueeze(2)).sum(-1)
    elif blk.k.dim() == 4 and qg.dim() > 5:  # keys shared by every query: one matmul over the flattened queries
        scores = (qg.flatten(3, -2) @ blk.k.unsqueeze(2).transpose(-1, -2)).view(*qg.shape[:-1], blk.k.shape[2])
    else:
        scores = qg @ blk.k.unsqueeze(2).transpose(-1, -2)
    scores = scores.float()
    return scores if blk.allowed is None else scores.masked_fill(~blk.allowed, float("-inf"))


def _block_values(p: torch.Tensor, blk: KeyBlock) -> torch.Tensor:
    """``p`` [B, kv, rep, *Q, N] times the block's values -> [B, kv, rep, *Q, d]."""
    if blk.diagonal:
        return (p.unsqueeze(-1) * blk.v.unsqueeze(2)).sum(-2)
    if blk.v.dim() == 4 and p.dim() > 5:
        return (p.flatten(3, -2) @ blk.v.unsqueeze(2)).view(*p.shape[:-1], blk.v.shape[-1])
    return p @ blk.v.unsqueeze(2)


# ------------------------------------------------------------------------------------------
# the committed prefix's keys/values between drafting rounds


class PrefixCache:
    """Per-layer keys/values of a committed prefix, reused for the longest prefix whose inputs equal (bitwise) the
    cached ones; everything after it is dropped (a new prompt, or a rolled-back sequence). Drafts are never cached —
    only committed positions are — so a rejection needs no crop. ``KEEP_LAST``: at least the last position is always
    recomputed (EAGLE-3: its output hidden state starts the chain)."""

    KEEP_LAST: ClassVar[bool] = False

    def __init__(self) -> None:
        self.inputs: tuple[torch.Tensor, ...] = ()  # the inputs the keys were computed from, each [m, ...]
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] = []  # per layer, each [1, kv, m, d]

    def __len__(self) -> int:
        return int(self.inputs[0].shape[0]) if self.inputs else 0

    def reusable_prefix(self, *inputs: torch.Tensor) -> int:
        """How many leading positions of ``inputs`` the cache holds unchanged."""
        n = inputs[0].shape[0]
        m = min(len(self), n - 1 if self.KEEP_LAST else n)
        if m <= 0:
            return 0
        same = torch.ones(m, dtype=torch.bool)
        for cached, new in zip(self.inputs, inputs):
            eq = cached[:m] == new[:m]
            same &= eq.flatten(1).all(-1) if eq.dim() > 1 else eq
        return m if bool(same.all()) else int(same.long().cumprod(0).sum())

    def prefix_kv(self, m: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(k[:, :, :m], v[:, :, :m]) for k, v in self.kv]

    def store_prefix(self, inputs: tuple[torch.Tensor, ...], new_kv: list[tuple[torch.Tensor, torch.Tensor]],
                     m: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Keep ``m`` cached positions plus ``new_kv`` (positions ``m..n-1``); returns every layer's full keys/values."""
        if m:
            new_kv = [(torch.cat([k0[:, :, :m], k], 2), torch.cat([v0[:, :, :m], v], 2))
                      for (k0, v0), (k, v) in zip(self.kv, new_kv)]
        self.inputs, self.kv = tuple(x.detach().clone() for x in inputs), new_kv
        return new_kv


# ------------------------------------------------------------------------------------------
# the drafter base: vocabulary maps, proposals, native checkpoints


class Drafter(nn.Module):
    """A drafter over the target's frozen embeddings with a draft-vocabulary ``lm_head`` and its ``d2t``/``t2d`` maps.

    Subclasses set :attr:`FORMAT` (the native checkpoint's ``format``) and :attr:`CONFIG` (their config class), build
    ``embed_tokens`` first (:meth:`__init__`) and the head last (:meth:`_add_head`) — construction order fixes the
    seeded initial weights."""

    FORMAT: ClassVar[str]
    CONFIG: ClassVar[type[DrafterConfig]]

    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)

    def _add_head(self, cfg: DrafterConfig) -> None:
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))

    @classmethod
    def from_target_weights(cls, target_config, embed: torch.Tensor, lm_head: torch.Tensor, vocab: DraftVocab,
                            aux_layer_ids: Sequence[int], seed: int = 0, **own) -> "Drafter":
        """A fresh drafter sized like ``target_config``: embeddings copied and frozen, ``lm_head`` initialised from the
        target's rows of the draft vocabulary, its ``d2t``/``t2d``; every other weight drawn from a generator seeded
        with ``seed``. ``own``: the config's own fields."""
        cfg = cls.CONFIG.from_target(target_config, vocab.size, aux_layer_ids, **own)
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = cls(cfg)
        with torch.no_grad():
            model.embed_tokens.weight.copy_(embed)
            model.lm_head.weight.copy_(lm_head[vocab.draft_to_target])
            model.d2t.copy_(vocab.d2t)
            model.t2d.copy_(vocab.t2d)
        return model

    @property
    def draft_to_target(self) -> torch.Tensor:
        """Target id of each draft id (``draft_id + d2t[draft_id]``)."""
        return torch.arange(self.config.draft_vocab_size) + self.d2t

    def proposal(self, draft_logits: torch.Tensor, temperature: float) -> torch.Tensor:
        """The proposal distribution over the target vocabulary of one draft position: one-hot at the argmax at
        temperature 0, else the tempered softmax placed on the draft vocabulary's target ids."""
        q = torch.zeros(self.config.vocab_size)
        if temperature <= 0:
            q[self.draft_to_target[int(torch.argmax(draft_logits))]] = 1.0
        else:
            q[self.draft_to_target] = torch.softmax(draft_logits.float() / temperature, dim=-1)
        return q

    def save(self, out: str | Path, extra: dict | None = None) -> Path:
        """The native format: ``config.json`` (``format``: :attr:`FORMAT`, the config, ``extra``) + ``model.safetensors``
        (every weight, embeddings included)."""
        from safetensors.torch import save_file

        out = Path(out)
        state = {k: v.detach().contiguous() for k, v in self.state_dict().items()}
        with atomic_path(out / "model.safetensors") as tmp:
            save_file(state, str(tmp), metadata={"format": self.FORMAT})
        write_json(out / "config.json", {"format": self.FORMAT, "config": asdict(self.config), **(extra or {})}, indent=1)
        return out

    @classmethod
    def load_native(cls, path: str | Path, raw: dict) -> "Drafter":
        """A drafter :meth:`save` wrote (``raw``: its ``config.json``), its shapes checked against the file's header
        before anything is allocated; ValueError naming what is wrong."""
        path = Path(path)
        where = str(path / "config.json")
        if not isinstance(raw.get("config"), dict):
            raise ValueError(f"{where}: `config` must be a JSON object")
        cfg = cls.CONFIG.checked(raw["config"], where)
        check_weight_shapes(cls, cfg, path / "model.safetensors")
        model = cls(cfg)
        load_state(model, load_weights(path / "model.safetensors"), str(path))
        return model


# ------------------------------------------------------------------------------------------
# files


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


TARGET_SIZES = ("num_hidden_layers", "hidden_size", "vocab_size")  # what every reader of a target's config uses


def target_config(target_dir: str | Path) -> dict:
    """The target's ``config.json`` (its ``text_config`` for a multimodal one) with :data:`TARGET_SIZES` checked:
    each a whole number from 1, else a ValueError naming the file and the field (issue 48: a ``"5"``, ``null`` or
    ``1.5`` was read on as a number, or ended in a TypeError deep in training)."""
    path = Path(target_dir) / "config.json"
    cfg = read_config_json(path, "target config")
    text = cfg.get("text_config", cfg)
    if not isinstance(text, dict):
        raise ValueError(f"{path}: text_config must be a JSON object")
    for key in TARGET_SIZES:
        value = text.get(key)
        if type(value) is not int or value < 1:
            raise ValueError(f"{path}: {key} is {str(value)[:40]!r} ({type(value).__name__}), not a whole number "
                             "from 1; fix the target's config.json")
    return text


def check_weight_shapes(cls: type[Drafter], cfg: DrafterConfig, path: str | Path, optional: tuple[str, ...] = ()) -> None:
    """The tensors ``cls(cfg)`` has (built on the ``meta`` device: nothing allocated) against the shapes in the header
    of the safetensors file ``path``; a ValueError names the first that differs. ``optional``: names the file may lack
    (embeddings an export leaves to the target)."""
    from safetensors import SafetensorError, safe_open

    with torch.device("meta"):
        expected = {name: tuple(t.shape) for name, t in cls(cfg).state_dict().items()}
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


def load_state(model: nn.Module, state: dict, where: str) -> None:
    """``model.load_state_dict(state)``, a mismatch refused as a ValueError naming ``where``."""
    try:
        model.load_state_dict(state)
    except RuntimeError as e:  # missing, unexpected or wrongly shaped tensors
        raise ValueError(f"{where}: the weights do not fit the config: {' '.join(str(e).split())[:300]}") from None


def target_tensor(target_dir: str | Path, suffix: str) -> torch.Tensor:
    """A weight of the target read straight from its safetensors (e.g. ``lm_head.weight``), without
    loading the model; ``lm_head.weight`` falls back to the embeddings for tied models."""
    from safetensors import SafetensorError, safe_open

    for f in sorted(Path(target_dir).glob("*.safetensors")):
        try:
            with safe_open(str(f), framework="pt") as st:
                for name in st.keys():
                    if name == suffix or name.endswith("." + suffix):
                        return st.get_tensor(name)
        except (SafetensorError, OSError) as e:  # a truncated or foreign file: named, never a traceback
            raise ValueError(f"{f}: not a readable safetensors file of the target ({str(e)[:160]})") from None
    if suffix == "lm_head.weight":
        return target_tensor(target_dir, "embed_tokens.weight")
    raise ValueError(f"{target_dir}: no {suffix} in the target's safetensors")
