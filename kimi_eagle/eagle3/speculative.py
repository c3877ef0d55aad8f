"""Speculative decoding against a real HF target: draft a chain of k tokens, verify, accept, repeat.

Proposers: :class:`EagleProposer` (an EAGLE-3 drafter fed the target's auxiliary hidden states) and
:class:`NgramProposer` (prompt lookup: continue the latest earlier occurrence of the context's last
n-gram). Verification is the standard one: at temperature 0 a draft is accepted while it equals the
target's argmax (so the output equals target-only greedy decoding); above 0, draft ``d`` drawn from
``q`` is accepted with probability ``min(1, p(d)/q(d))`` and a rejection resamples from
``norm(max(p - q, 0))``, which leaves the target's distribution unchanged. Every round also yields the
target's own next token, so the acceptance length is τ = accepted drafts per round + 1.

The drafter side is incremental too: :class:`EagleProposer` keeps the drafter's step-0 keys/values of the
committed prefix between rounds (only committed positions are cached, so rejections need no crop there).

Two verifiers with the same interface: :class:`CachedTarget` (the default in ``evaluate``) keeps an HF
``DynamicCache`` of the committed tokens, feeds only the last committed token plus the drafts each round
and crops the cache back after a rejection; :class:`Target` re-runs the whole sequence each round (the
uncached reference, kept for the benchmark and as a cross-check). Both give the same greedy output.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol, Sequence

import torch

from kimi_eagle.eagle3.hidden import Extractor
from kimi_eagle.eagle3.model import DraftCache


def probs_from_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    if temperature <= 0:
        p = torch.zeros_like(logits, dtype=torch.float)
        p[int(torch.argmax(logits))] = 1.0
        return p
    return torch.softmax(logits.float() / temperature, dim=-1)


def sample(logits: torch.Tensor, temperature: float, generator: torch.Generator | None = None) -> int:
    if temperature <= 0:
        return int(torch.argmax(logits))
    return int(torch.multinomial(torch.softmax(logits.float() / temperature, dim=-1), 1, generator=generator))


@torch.inference_mode()
def generate_target_only(model, prompt_ids: Sequence[int], max_new_tokens: int, temperature: float = 0.0,
             eos_id: int | None = None, generator: torch.Generator | None = None) -> list[int]:
    """Target-only decoding with a KV cache: the reference speculative decoding must reproduce."""
    ids = torch.tensor([list(prompt_ids)])
    past, out = None, []
    for _ in range(max_new_tokens):
        o = model(input_ids=ids if past is None else ids[:, -1:], cache=past, use_cache=True)
        past = o.cache
        tok = sample(o.logits[0, -1], temperature, generator)
        out.append(tok)
        if tok == eos_id:
            break
        ids = torch.cat([ids, torch.tensor([[tok]])], dim=1)
    return out


class Target:
    """The target over a full sequence: ``(logits [T,V], aux [T,3H] or None)``; no cache.

    As a verifier (:meth:`start`, :meth:`extend`, :meth:`keep`, :attr:`aux`) it re-runs the whole
    sequence every round.
    """

    def __init__(self, model, layer_ids: Sequence[int] | None = None):
        self.model = model
        self.extractor = Extractor(model, layer_ids) if layer_ids is not None else None
        self.aux: torch.Tensor | None = None  # features of the committed positions (and maybe more)

    @torch.inference_mode()
    def __call__(self, ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = torch.tensor([list(ids)])
        if self.extractor is None:
            return self.model(input_ids=x, use_cache=False).logits[0], None
        aux, final = self.extractor(x)
        return self.model.lm_head(final)[0], aux[0]

    def start(self, prompt_ids: Sequence[int]) -> torch.Tensor:
        """Prefill: the logits after the prompt [V]."""
        logits, self.aux = self(prompt_ids)
        return logits[-1]

    def extend(self, ids: Sequence[int], drafts: Sequence[int]) -> torch.Tensor:
        """Logits [1 + len(drafts), V] at positions ``len(ids) - 1 ..`` of ``ids + drafts``."""
        logits, self.aux = self(list(ids) + list(drafts))
        return logits[len(ids) - 1:]

    def keep(self, n_valid: int) -> None:
        """The first ``n_valid`` positions of the last sequence are committed (nothing to drop here)."""

    def close(self) -> None:
        if self.extractor is not None:
            self.extractor.close()


class CachedTarget:
    """The target as a KV-cached verifier: the same interface and outputs as :class:`Target`.

    Invariant between rounds: the cache holds the committed tokens except the last one (the target's
    own token, not yet fed), and :attr:`aux` the features of exactly those positions.
    """

    def __init__(self, model, layer_ids: Sequence[int] | None = None):
        self.model = model
        self.extractor = Extractor(model, layer_ids) if layer_ids is not None else None
        self.cache = None
        self.aux: torch.Tensor | None = None

    @torch.inference_mode()
    def _forward(self, ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = torch.tensor([list(ids)])
        if self.extractor is None:
            return self.model(input_ids=x, cache=self.cache, use_cache=True).logits[0], None
        aux, final = self.extractor(x, cache=self.cache)
        return self.model.lm_head(final)[0], aux[0]

    def start(self, prompt_ids: Sequence[int]) -> torch.Tensor:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)
        logits, self.aux = self._forward(prompt_ids)
        return logits[-1]

    def extend(self, ids: Sequence[int], drafts: Sequence[int]) -> torch.Tensor:
        n_cached = self.cache.get_seq_length()
        if n_cached != len(ids) - 1:
            raise RuntimeError(f"cache holds {n_cached} positions, expected {len(ids) - 1}")
        logits, new_aux = self._forward([ids[-1], *drafts])
        if new_aux is not None:
            self.aux = torch.cat([self.aux, new_aux])
        return logits

    def keep(self, n_valid: int) -> None:
        """Drop every cached position from ``n_valid`` on (rejected drafts, and the bonus position)."""
        excess = self.cache.get_seq_length() - n_valid
        if excess > 0:
            self.cache.crop(-excess)  # transformers 5: a negative count of tokens to remove
        if self.aux is not None:
            self.aux = self.aux[:n_valid]

    def close(self) -> None:
        if self.extractor is not None:
            self.extractor.close()


class Proposer(Protocol):
    name: str

    def propose(self, ids: list[int], aux: torch.Tensor | None, k: int, temperature: float,
                generator: torch.Generator | None) -> tuple[list[int], list[torch.Tensor]]: ...


@dataclass
class NgramProposer:
    """Prompt lookup: match the last ``n`` tokens (``max_n`` down to ``min_n``) earlier in the context."""

    vocab_size: int
    max_n: int = 3
    min_n: int = 1
    name: str = "ngram"

    def propose(self, ids, aux, k, temperature, generator):
        n_ids = len(ids)
        for n in range(min(self.max_n, n_ids - 1), self.min_n - 1, -1):
            tail = ids[n_ids - n:]
            for start in range(n_ids - n - 1, -1, -1):  # latest earlier occurrence first
                if ids[start:start + n] == tail:
                    drafts = ids[start + n:start + n + k]
                    return drafts, [self._one_hot(d) for d in drafts]
        return [], []

    def _one_hot(self, token: int) -> torch.Tensor:
        q = torch.zeros(self.vocab_size)
        q[token] = 1.0
        return q


@dataclass
class EagleProposer:
    """The EAGLE-3 drafter as a proposer. ``cached`` (default): keep the drafter's step-0 keys/values of
    the committed prefix between rounds (:class:`~kimi_eagle.eagle3.model.DraftCache`), so each round's
    step 0 runs only over the newly committed positions; ``False`` re-runs it over the whole sequence."""

    drafter: object  # kimi_eagle.eagle3.model.Eagle3Drafter
    name: str = "eagle3"
    cached: bool = True
    cache: DraftCache = field(default_factory=DraftCache, repr=False)

    def propose(self, ids, aux, k, temperature, generator):
        n = len(ids) - 1  # features for positions 0..n-1, next tokens ids[1..n]
        return self.drafter.propose(aux[:n].float(), torch.tensor(ids[1:]), k, temperature, generator,
                                    cache=self.cache if self.cached else None)


@dataclass
class DecodeResult:
    tokens: list[int]
    accepted: list[int] = field(default_factory=list)  # accepted drafts per verification round
    proposed: list[int] = field(default_factory=list)  # drafts offered per round
    seconds: float = 0.0

    @property
    def rounds(self) -> int:
        return len(self.accepted)

    @property
    def tau(self) -> float:
        return (sum(self.accepted) + self.rounds) / self.rounds if self.rounds else float("nan")


def verify(p: torch.Tensor, q: torch.Tensor, draft: int, generator: torch.Generator | None = None) -> tuple[int, bool]:
    """Accept ``draft`` (drawn from ``q``) against the target's ``p``: ``(token, accepted)``.

    Accepted with probability ``min(1, p/q)``; otherwise the token is drawn from ``norm(max(p - q, 0))``,
    so the token is distributed exactly as ``p``. With one-hot ``p`` and ``q`` (greedy) this is
    "accept iff the draft is the target's argmax, else take the argmax".
    """
    pd, qd = float(p[draft]), float(q[draft])
    if pd >= qd or float(torch.rand(1, generator=generator)) < pd / qd:
        return draft, True
    residual = torch.clamp(p - q, min=0)
    residual = residual if float(residual.sum()) > 0 else p  # p == q up to rounding
    return int(torch.multinomial(residual / residual.sum(), 1, generator=generator)), False


@dataclass(frozen=True)
class DecodeOptions:
    """How :func:`speculative_generate` decodes: at most ``max_new_tokens`` new tokens, chains of at most
    ``k`` drafts per round, sampling ``temperature`` (0: greedy), stopping after ``eos_id``."""

    max_new_tokens: int
    k: int = 4
    temperature: float = 0.0
    eos_id: int | None = None


@torch.inference_mode()
def speculative_generate(target: Target | CachedTarget, proposer: Proposer, prompt_ids: Sequence[int],
                         options: DecodeOptions, generator: torch.Generator | None = None) -> DecodeResult:
    """Draft, verify and accept until ``options.max_new_tokens`` tokens or EOS; the tokens are distributed
    exactly as target-only decoding's (identical to it at temperature 0). ``generator`` drives sampling."""
    start = time.perf_counter()
    max_new, temperature, eos_id = options.max_new_tokens, options.temperature, options.eos_id
    ids = list(prompt_ids)
    n_prompt = len(ids)
    ids.append(sample(target.start(ids), temperature, generator))  # prefill: the first token is the target's own
    result = DecodeResult([])
    while len(ids) - n_prompt < max_new and ids[-1] != eos_id:
        budget = max_new - (len(ids) - n_prompt) - 1
        drafts, dists = proposer.propose(ids, target.aux, min(options.k, budget), temperature, generator) if budget > 0 else ([], [])
        n = len(ids)
        logits = target.extend(ids, drafts)  # logits[j] is the target at position n - 1 + j
        accepted = 0
        for j, (d, q) in enumerate(zip(drafts, dists)):
            token, ok = verify(probs_from_logits(logits[j], temperature), q, d, generator)
            ids.append(token)
            if not ok:
                break
            accepted += 1
            if d == eos_id:
                break
        else:
            if not drafts or drafts[-1] != eos_id:
                ids.append(sample(logits[len(drafts)], temperature, generator))
        target.keep(n + accepted)  # the last committed token plus the accepted drafts are valid
        result.accepted.append(accepted)
        result.proposed.append(len(drafts))
    out = ids[n_prompt:]
    if eos_id in out:
        out = out[: out.index(eos_id) + 1]
    result.tokens = out[:max_new]
    result.seconds = time.perf_counter() - start
    return result
