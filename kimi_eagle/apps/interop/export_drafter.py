"""``kimi-eagle export DRAFT --engine sglang|vllm|speculators -o OUT``: a drafter as an engine-loadable EAGLE-3 checkpoint.

``speculators`` writes a speculators ``Eagle3DraftModel`` checkpoint instead
(:mod:`kimi_eagle.apps.interop.speculators`); the rest of this docstring is the SGLang/vLLM layout.

Writes ``config.json`` (``architectures: ["LlamaForCausalLMEagle3"]``, a one-layer Llama config plus
``draft_vocab_size``, ``target_hidden_size`` and ``eagle_config.eagle_aux_hidden_state_layer_ids`` in
the engine's own layer convention) and ``model.safetensors`` with ``midlayer.*``, ``fc.weight``,
``norm.weight``, ``lm_head.weight``, ``d2t`` and ``t2d`` — no embeddings (engines share the target's).
A ``kimi_eagle`` block in the config keeps the 0-based block-output ids so the export reloads exactly.
"""
from __future__ import annotations

from pathlib import Path

import torch

from kimi_eagle.eagle3.layers import CONVENTION, ENGINES, engine_layer_ids
from kimi_eagle.eagle3.model import Eagle3Config, load_drafter
from kimi_eagle.io import atomic_path, write_json

EXPORT_ENGINES = (*ENGINES, "speculators")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
TORCH_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def engine_config(cfg: Eagle3Config, engine: str, dtype: torch.dtype) -> dict:
    """The ``config.json`` of ``cfg`` exported for ``engine`` (read back by ``Eagle3Config.from_engine_config``)."""
    ids = engine_layer_ids(cfg.aux_layer_ids, engine)
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None,
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_id,
        "torch_dtype": TORCH_DTYPE_NAMES[dtype],
        "use_cache": True,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True},
        "kimi_eagle": {
            "engine": engine, "aux_layer_ids_block_output": list(cfg.aux_layer_ids),
            "layer_id_convention": CONVENTION, "target_num_layers": cfg.target_num_layers,
        },
    }


def export_drafter(draft: str | Path, engine: str, out: str | Path, dtype: str = "fp32", verifier: str | None = None) -> Path:
    """Write the engine checkpoint of the drafter at ``draft`` into ``out``; returns ``out``."""
    from safetensors.torch import save_file

    if engine not in EXPORT_ENGINES:
        raise ValueError(f"unknown engine {engine!r}: choose from {', '.join(EXPORT_ENGINES)}")
    torch_dtype = DTYPES[dtype]
    if engine == "speculators":
        from kimi_eagle.apps.interop.speculators import export_speculators

        return export_speculators(draft, out, torch_dtype, verifier=verifier)
    model = load_drafter(draft)
    out = Path(out)
    state = {}
    for name, tensor in model.state_dict().items():
        if name == "embed_tokens.weight":
            continue
        state[name] = tensor.to(torch_dtype).contiguous() if tensor.is_floating_point() else tensor.contiguous()
    config = engine_config(model.config, engine, torch_dtype)
    with atomic_path(out / "model.safetensors") as tmp:
        save_file(state, str(tmp), metadata={"format": "pt"})
    write_json(out / "config.json", config)
    return out
