"""Fault injection for the local server: the failures a real API shows, on demand and reproducibly.

All off by default. Each request draws at most one fault (seeded ``random.Random``):

- ``429``: a burst of ``burst_429`` consecutive 429 replies, each with ``Retry-After: retry_after``;
- ``500`` / ``503``: one server error;
- ``truncate``: a 200 whose JSON body is cut in half (the HTTP message itself is complete);
- ``drop``: the connection closes mid-body (headers promise more bytes than are sent);
- ``stream_cut``: a streamed answer (``stream: true``) stops halfway through its chunks and the connection
  drops, without ``finish_reason`` or ``data: [DONE]`` (a non-streaming request gets a ``drop``). ``truncate`` and
  ``drop`` cut a stream the same way, since a stream has no single JSON body to cut.

Independently, ``rate_slow`` delays a reply by ``slow_seconds`` before anything is sent.
Truncated, dropped and cut replies are generated but never delivered, so the server logs no engine
record for them.
"""
from __future__ import annotations

import random
import threading
from dataclasses import asdict, dataclass, fields
from typing import Any

KINDS = ("429", "500", "503", "truncate", "drop", "stream_cut")


@dataclass
class FaultConfig:
    rate_429: float = 0.0  # probability that a request starts a burst of 429s
    burst_429: int = 1
    retry_after: float = 1.0  # seconds, sent as Retry-After
    rate_500: float = 0.0
    rate_503: float = 0.0
    rate_truncate: float = 0.0
    rate_drop: float = 0.0
    rate_stream_cut: float = 0.0
    rate_slow: float = 0.0
    slow_seconds: float = 5.0
    seed: int | None = None

    def validate(self) -> None:
        for name in (*(f"rate_{k}" for k in KINDS), "rate_slow"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be a probability in [0, 1]")
        if sum(getattr(self, f"rate_{k}") for k in KINDS) > 1:
            raise ValueError(f"the fault rates ({', '.join(KINDS)}) must sum to at most 1")
        if self.burst_429 < 1 or self.retry_after < 0 or self.slow_seconds < 0:
            raise ValueError("burst_429 must be >= 1; retry_after and slow_seconds >= 0")

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> "FaultConfig":
        names = {f.name for f in fields(cls)}
        unknown = set(obj) - names
        if unknown:
            raise ValueError(f"unknown fault settings {sorted(unknown)}; known: {sorted(names)}")
        config = cls(**obj)
        config.validate()
        return config

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def enabled(self) -> bool:
        return any(getattr(self, f"rate_{k}") > 0 for k in (*KINDS, "slow"))


@dataclass(frozen=True)
class Fault:
    kind: str | None  # one of KINDS, or None for a normal reply
    slow: bool = False


class FaultInjector:
    """Draws the fault of each request; thread-safe; counts what it injected."""

    def __init__(self, config: FaultConfig | None = None) -> None:
        self._lock = threading.Lock()
        self.configure(config or FaultConfig())

    def configure(self, config: FaultConfig) -> None:
        config.validate()
        with self._lock:
            self.config = config
            self._rng = random.Random(config.seed)
            self._burst_left = 0
            self.counts = {k: 0 for k in (*KINDS, "slow", "none")}

    def draw(self) -> Fault:
        with self._lock:
            c, rng = self.config, self._rng
            slow = c.rate_slow > 0 and rng.random() < c.rate_slow
            kind = None
            if self._burst_left > 0:
                self._burst_left -= 1
                kind = "429"
            else:
                u, edge = rng.random(), 0.0
                for k in KINDS:
                    edge += getattr(c, f"rate_{k}")
                    if u < edge:
                        kind = k
                        break
                if kind == "429":
                    self._burst_left = c.burst_429 - 1
            self.counts[kind or "none"] += 1
            self.counts["slow"] += slow
            return Fault(kind, slow)
