"""Serving one model at several numerical precisions, so one set of weights can play several "providers".

API providers serve the same weights at different precisions (bf16, FP8, INT8/INT4 weight quantization);
``kimi-eagle serve --precision`` reproduces that on a CPU so ``kimi-eagle audit`` can measure what it does
to greedy completions. A precision is one of:

- ``float32``, ``bfloat16``, ``float16``: the whole model cast to that dtype (logits are compared in float32).
- ``int8``: weight-only int8 quantization of every ``nn.Linear`` (the LM head included, embeddings not):
  per output channel, ``scale = max|w_row| / 127``, ``q = round(w / scale)`` clamped to [-127, 127] in int8,
  and the layer computes with ``q · scale`` in float32 (what weight-only int8 kernels compute, up to the
  order of accumulation). Activations stay float32.
"""
from __future__ import annotations

from typing import Any

PRECISIONS = ("float32", "bfloat16", "float16", "int8")
INT8_MAX = 127


def quantize_int8_per_channel(weight: Any) -> tuple[Any, Any]:
    """``weight`` [out, in] -> ``(q int8 [out, in], scale float32 [out, 1])`` with ``weight ≈ q · scale``
    (absmax per output row; an all-zero row gets scale 1)."""
    import torch

    w = weight.detach().float()
    amax = w.abs().amax(dim=1, keepdim=True)
    scale = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax))
    q = torch.round(w / scale).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


def quantize_linear_weights_int8(model: Any) -> int:
    """Replace every ``nn.Linear`` weight of ``model`` by its int8 per-channel round trip (in place; a weight
    tied to an embedding is untied, so embeddings keep full precision). Returns the number of layers changed."""
    import torch

    n = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            q, scale = quantize_int8_per_channel(module.weight)
            module.weight = torch.nn.Parameter(q.float() * scale, requires_grad=False)
            n += 1
    return n


def apply_precision(model: Any, precision: str) -> Any:
    """``model`` (loaded in float32) converted to ``precision`` (one of ``PRECISIONS``); returns it."""
    import torch

    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; expected one of {PRECISIONS}")
    if precision == "int8":
        quantize_linear_weights_int8(model)
    elif precision != "float32":
        model.to(getattr(torch, precision))
    return model


def parse_provider_table(spec: str) -> dict[str, str]:
    """``"fp32=float32,bf16=bfloat16,int8=int8"`` -> ``{provider name: precision}`` (order kept)."""
    table: dict[str, str] = {}
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        name, sep, precision = item.partition("=")
        name, precision = name.strip(), precision.strip()
        if not sep or not name or precision not in PRECISIONS:
            raise ValueError(f"--providers entry {item!r}: expected NAME=PRECISION with PRECISION in {PRECISIONS}")
        if name.lower() in {n.lower() for n in table}:
            raise ValueError(f"--providers: provider {name!r} is named twice")
        table[name] = precision
    if not table:
        raise ValueError("--providers is empty")
    return table
