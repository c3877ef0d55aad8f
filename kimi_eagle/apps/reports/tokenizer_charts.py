"""Tokenizer charts for review: token byte lengths, and where the special tokens sit in the ID space.

Each chart is drawn on its own :class:`matplotlib.figure.Figure` (pyplot and its backend are never touched):
``*_figure`` builds it with the report toolkit (:mod:`kimi_eagle.apps.reports.toolkit`), the writer saves it as a
PNG and returns the path (a notebook shows it inline with ``IPython.display.Image``).
"""
from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from kimi_eagle.apps.reports.toolkit import figure, save
from kimi_eagle.tokenize.tokenizer import Tokenizer


def display_name(tok: Tokenizer) -> str:
    """A tokenizer's name for a chart title: ``kimi:kimi`` -> ``kimi tokenizer``, ``hf:stories260K`` ->
    ``stories260K tokenizer``."""
    return f"{tok.name.split(':', 1)[-1]} tokenizer"


def token_length_histogram(tok: Tokenizer, path: str | Path) -> Path:
    """:func:`token_length_figure` written as a PNG at ``path``."""
    return save(token_length_figure(tok), path, dpi=120, tight=False)


def token_length_figure(tok: Tokenizer) -> Figure:
    """Histogram of the byte length of every ordinary token (and how many are partial UTF-8)."""
    special_ids = tok.special_ids
    ordinary = [raw for i, raw in enumerate(tok.token_table) if i not in special_ids]
    lengths = [len(raw) for raw in ordinary]
    partial = sum(1 for raw in ordinary if not _is_utf8(raw))
    fig, ax = figure((8, 4.2))
    bins = range(1, min(max(lengths), 40) + 2)
    counts, edges, bars = ax.hist([min(n, 40) for n in lengths], bins=bins, color="#1976d2", edgecolor="white",
                                  label=f"ordinary tokens ({len(lengths):,})")
    ax.bar_label(bars, labels=[f"{int(c):,}" if c else "" for c in counts], fontsize=6, rotation=90, padding=2)
    ax.margins(y=0.15)
    ax.set_title(f"{display_name(tok)}: token length in bytes\n({len(lengths):,} ordinary tokens, "
                 f"{partial:,} partial UTF-8)", fontsize=10.5)
    ax.set(xlabel="bytes per token (40 = 40 or more)", ylabel="tokens")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def special_id_map(tok: Tokenizer, path: str | Path) -> Path:
    """:func:`special_id_figure` written as a PNG at ``path``."""
    return save(special_id_figure(tok), path, dpi=120, tight=False)


def special_id_figure(tok: Tokenizer) -> Figure:
    """Where the special tokens sit in the ID space (named ones labelled, HF ``special`` flag coloured)."""
    named = [s for s in tok.special_tokens if not s.text.startswith("<|reserved_token_")]
    reserved = [s for s in tok.special_tokens if s.text.startswith("<|reserved_token_")]
    lo = min(s.id for s in tok.special_tokens) - 8 if tok.special_tokens else 0
    hi = max(s.id for s in tok.special_tokens) + 2 if tok.special_tokens else tok.n_vocab
    fig, ax = figure((10, max(3, 0.22 * len(named) + 1)))
    ax.scatter([s.id for s in reserved], [0] * len(reserved), marker="|", color="#bdbdbd", label=f"reserved ({len(reserved)})")
    for k, s in enumerate(named, 1):
        color = "#d32f2f" if s.hf_special else "#388e3c"
        ax.scatter([s.id], [k], color=color, s=14)
        ax.annotate(f"{s.id} {s.text}", (s.id, k), fontsize=7, xytext=(4, -3), textcoords="offset points")
    ax.axvline(getattr(tok, "n_ranks", lo), color="#555", linestyle="--", linewidth=0.8, label="first special slot")
    ax.scatter([], [], color="#d32f2f", label="HF special=True")
    ax.scatter([], [], color="#388e3c", label="HF special=False (kept by skip_special_tokens)")
    ax.set(title=f"{display_name(tok)}: special tokens in the ID space", xlabel="token id", ylabel="named special (index)", xlim=(lo, hi + (hi - lo) * 0.25))
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def _is_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False
