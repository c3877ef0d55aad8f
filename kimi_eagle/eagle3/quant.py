"""FP8 (float8_e4m3fn) storage of hidden states with one fp32 scale per token and layer.

The arithmetic is absmax scaling, the convention speculators uses for its FP8 hidden-state files:
for each token and each layer block of ``width`` values, ``scale = max|x| / 448`` (448 is the largest
finite e4m3fn value; an all-zero block gets scale 1), stored values are ``x / scale`` rounded to
e4m3fn, and reading multiplies back: ``x ≈ q.float() * scale``. The relative error of every value is
at most half an e4m3fn step: 2⁻⁴ (6.25 %) of its magnitude for values above ``scale · 2⁻⁶``, and
``scale · 2⁻¹⁰`` absolute below that (e4m3fn's subnormals).

Bytes per token for ``n_layers`` layers of width ``H``: ``n_layers · H`` values + ``4 · n_layers``
scale bytes, against ``2 · n_layers · H`` in bf16 — a ratio of ``1/2 + 2/H`` (0.5003 at Kimi's
H = 7,168; 0.53 at stories260K's H = 64, where the scales are a visible share).
"""
from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448.0


def quantize_fp8(x: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [..., n·width] → ``(values float8_e4m3fn [..., n·width], scales float32 [..., n])``: one
    absmax scale per block of ``width`` consecutive values (a layer's hidden state of one token)."""
    if x.shape[-1] % width:
        raise ValueError(f"last dimension {x.shape[-1]} is not a multiple of the layer width {width}")
    blocks = x.float().reshape(*x.shape[:-1], x.shape[-1] // width, width)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    scales = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    values = (blocks / scales).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return values.reshape(x.shape), scales.squeeze(-1)


def dequantize_fp8(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`quantize_fp8`: float32 ``values · scale`` with each scale applied to its
    block (the block width is ``values.shape[-1] // scales.shape[-1]``)."""
    n = scales.shape[-1]
    blocks = values.float().reshape(*values.shape[:-1], n, values.shape[-1] // n)
    return (blocks * scales.float().unsqueeze(-1)).reshape(values.shape)


def fp8_bytes_per_token(hidden_size: int, n_aux: int = 3) -> int:
    """Stored bytes per token in fp8: aux + final values (1 byte each), one fp32 scale per layer,
    an int64 id and a uint8 mask."""
    n_layers = n_aux + 1
    return n_layers * hidden_size + 4 * n_layers + 8 + 1


def quantize_hidden(aux: torch.Tensor, final: torch.Tensor, hidden_size: int) -> dict[str, torch.Tensor]:
    """A shard's ``aux`` [T, n·H] and ``final`` [T, H] as fp8 tensors plus their scales:
    ``{aux, aux_scale [T, n], final, final_scale [T, 1]}``."""
    aux_q, aux_scale = quantize_fp8(aux, hidden_size)
    final_q, final_scale = quantize_fp8(final, hidden_size)
    return {"aux": aux_q, "aux_scale": aux_scale, "final": final_q, "final_scale": final_scale}
