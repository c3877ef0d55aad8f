"""Per-tokenizer caches for tables derived from a tokenizer (byte tables, special-token sets)."""
from __future__ import annotations

import functools
import weakref
from typing import Callable, TypeVar

T = TypeVar("T")


def per_tokenizer(build: Callable[[object], T]) -> Callable[[object], T]:
    """Cache ``build(tok)`` while ``tok`` lives.

    The last tokenizer's value is returned without a dictionary lookup (the hot path calls this once
    per record); tokenizers that cannot be weakly referenced are simply not cached.
    """
    cache: "weakref.WeakKeyDictionary[object, T]" = weakref.WeakKeyDictionary()
    last: list = [None, None]  # (weak reference to the last tokenizer, its value)

    @functools.wraps(build)
    def cached(tok):
        ref, value = last
        if ref is not None and ref() is tok:
            return value
        try:
            value = cache[tok]
        except (KeyError, TypeError):
            value = build(tok)
            try:
                cache[tok] = value
            except TypeError:
                return value
        last[:] = weakref.ref(tok), value
        return value

    return cached
