"""Tokenizer charts for review: token byte lengths, and where the special tokens sit in the ID space."""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from ..io import atomic_path
from .tokenizer import Tokenizer


def token_length_histogram(tok: Tokenizer, path: str | Path) -> Path:
    """Histogram of the byte length of every ordinary token (and how many are partial UTF-8), as a PNG at ``path``."""
    special_ids = tok.special_ids
    ordinary = [raw for i, raw in enumerate(tok.token_table) if i not in special_ids]
    lengths = [len(raw) for raw in ordinary]
    partial = sum(1 for raw in ordinary if not _is_utf8(raw))
    fig, ax = plt.subplots(figsize=(8, 4))
    bins = range(1, min(max(lengths), 40) + 2)
    counts, edges, bars = ax.hist([min(n, 40) for n in lengths], bins=bins, color="#1976d2", edgecolor="white")
    ax.bar_label(bars, labels=[f"{int(c):,}" if c else "" for c in counts], fontsize=6, rotation=90, padding=2)
    ax.margins(y=0.15)
    ax.set(title=f"{tok.name}: token length in bytes ({len(lengths):,} ordinary tokens, {partial:,} partial UTF-8)",
           xlabel="bytes per token (40 = 40 or more)", ylabel="tokens")
    fig.tight_layout()
    return _write_png(fig, path)


def special_id_map(tok: Tokenizer, path: str | Path) -> Path:
    """Where the special tokens sit in the ID space (named ones labelled, HF ``special`` flag coloured), as a PNG."""
    named = [s for s in tok.special_tokens if not s.text.startswith("<|reserved_token_")]
    reserved = [s for s in tok.special_tokens if s.text.startswith("<|reserved_token_")]
    lo = min(s.id for s in tok.special_tokens) - 8 if tok.special_tokens else 0
    hi = max(s.id for s in tok.special_tokens) + 2 if tok.special_tokens else tok.n_vocab
    fig, ax = plt.subplots(figsize=(10, max(3, 0.22 * len(named) + 1)))
    ax.scatter([s.id for s in reserved], [0] * len(reserved), marker="|", color="#bdbdbd", label=f"reserved ({len(reserved)})")
    for k, s in enumerate(named, 1):
        color = "#d32f2f" if s.hf_special else "#388e3c"
        ax.scatter([s.id], [k], color=color, s=14)
        ax.annotate(f"{s.id} {s.text}", (s.id, k), fontsize=7, xytext=(4, -3), textcoords="offset points")
    ax.axvline(getattr(tok, "n_ranks", lo), color="#555", linestyle="--", linewidth=0.8, label="first special slot")
    ax.scatter([], [], color="#d32f2f", label="HF special=True")
    ax.scatter([], [], color="#388e3c", label="HF special=False (kept by skip_special_tokens)")
    ax.set(title=f"{tok.name}: special tokens in the ID space", xlabel="token id", ylabel="named special (index)", xlim=(lo, hi + (hi - lo) * 0.25))
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return _write_png(fig, path)


def _write_png(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` to ``path`` as a PNG (atomically) and close it."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
    return Path(path)


def _is_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False
