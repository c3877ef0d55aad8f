"""A kit drafter as a speculators 0.9.0 EAGLE-3 checkpoint (``kimi-eagle export --engine speculators``).

``config.json``: ``speculators_model_type: "eagle3"``, ``architectures: ["Eagle3DraftModel"]``,
``draft_vocab_size``, ``target_hidden_size``, ``eagle_aux_hidden_state_layer_ids`` (vLLM's
capture-before ids, ``i + 1``), ``transformer_layer_config`` (a one-layer Llama config) and
``speculators_config`` (greedy proposal, the verifier's architecture). ``model.safetensors``: the
drafter's weights under speculators' names (``midlayer.*`` -> ``layers.0.*``; ``fc``, ``norm``,
``lm_head``, ``embed_tokens``, ``d2t``, ``t2d`` unchanged). A ``kimi_eagle`` block keeps the kit's
block-output ids. Proven by loading it with speculators' own ``Eagle3DraftModel.from_pretrained``.

A DFlash drafter (:class:`~kimi_eagle.eagle3.dflash.DFlashDrafter`) becomes a speculators ``dflash`` checkpoint
(:func:`speculators_dflash_config`): ``speculators_model_type: "dflash"``, a Qwen3 ``transformer_layer_config`` with
``num_hidden_layers`` = the draft layers, ``block_size``, ``mask_token_id``, ``aux_hidden_state_layer_ids``
(capture-before ids), ``sample_from_anchor: false``; the weights under the same names (speculators' ``DFlashDraftModel``
names its modules as the kit does), without ``embed_tokens`` (speculators reloads it from the verifier). Proven by
``DFlashDraftModel.from_pretrained`` giving the kit's logits (tests/test_dflash_handoff.py).
"""
from __future__ import annotations

from pathlib import Path

import torch

from kimi_eagle.eagle3.dflash import DFlashConfig, DFlashDrafter
from kimi_eagle.eagle3.drafters import load_any_drafter
from kimi_eagle.eagle3.layers import CONVENTION, trainer_layer_ids
from kimi_eagle.eagle3.model import Eagle3Config
from kimi_eagle.io import atomic_path, write_json

SPECULATORS_VERSION = "0.9.0"
TORCH_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def speculators_name(kit_name: str) -> str:
    """speculators' parameter name for a kit drafter parameter."""
    return "layers.0." + kit_name[len("midlayer."):] if kit_name.startswith("midlayer.") else kit_name


def speculators_config(cfg: Eagle3Config, dtype: torch.dtype, verifier: str | None = None,
                       verifier_architecture: str = "LlamaForCausalLM", speculative_tokens: int = 3) -> dict:
    """The ``config.json`` speculators' ``Eagle3SpeculatorConfig`` reads for a drafter with config ``cfg``."""
    return {
        "architectures": ["Eagle3DraftModel"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": trainer_layer_ids(cfg.aux_layer_ids, cfg.target_num_layers, "speculators"),
        "norm_before_residual": False, "norm_before_fc": False, "fc_norm": False, "norm_output": False,
        "embed_requires_grad": False, "tie_word_embeddings": False,
        "torch_dtype": TORCH_DTYPE_NAMES[dtype],
        "transformer_layer_config": {
            "model_type": "llama", "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
            "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
            "head_dim": cfg.head_dim, "num_hidden_layers": 1, "hidden_act": "silu", "rms_norm_eps": cfg.rms_norm_eps,
            "rope_parameters": {"rope_theta": cfg.rope_theta, "rope_type": "default"},
            "max_position_embeddings": cfg.max_position_embeddings, "vocab_size": cfg.vocab_size,
            "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
            "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
        },
        "speculators_config": {
            "algorithm": "eagle3", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens,
                                  "accept_tolerance": 0.0, "verifier_accept_k": 1}],
            "verifier": {"name_or_path": verifier, "architectures": [verifier_architecture]},
        },
        "kimi_eagle": {"aux_layer_ids_block_output": list(cfg.aux_layer_ids), "layer_id_convention": CONVENTION,
                       "target_num_layers": cfg.target_num_layers},
    }


def speculators_dflash_config(cfg: DFlashConfig, dtype: torch.dtype, verifier: str | None = None,
                               verifier_architecture: str = "LlamaForCausalLM") -> dict:
    """The ``config.json`` speculators' ``DFlashSpeculatorConfig`` reads for a kit DFlash drafter with config ``cfg``."""
    return {
        "architectures": ["DFlashSpeculator"],
        "speculators_model_type": "dflash",
        "speculators_version": SPECULATORS_VERSION,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": None if cfg.target_hidden_size == cfg.hidden_size else cfg.target_hidden_size,
        "block_size": cfg.block_size,
        "mask_token_id": cfg.mask_token_id,
        "aux_hidden_state_layer_ids": trainer_layer_ids(cfg.aux_layer_ids, cfg.target_num_layers, "speculators", None),
        "sliding_window_non_causal": False,
        "sample_from_anchor": False,
        "torch_dtype": TORCH_DTYPE_NAMES[dtype],
        "transformer_layer_config": {
            "model_type": "qwen3", "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
            "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
            "head_dim": cfg.head_dim, "num_hidden_layers": cfg.num_draft_layers, "hidden_act": "silu",
            "rms_norm_eps": cfg.rms_norm_eps, "rope_parameters": {"rope_theta": cfg.rope_theta, "rope_type": "default"},
            "max_position_embeddings": cfg.max_position_embeddings, "vocab_size": cfg.vocab_size,
            "attention_bias": False, "tie_word_embeddings": False, "use_sliding_window": False, "sliding_window": None,
            "layer_types": ["full_attention"] * cfg.num_draft_layers,
        },
        "speculators_config": {
            "algorithm": "dflash", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": cfg.block_size - 1,
                                  "accept_tolerance": 0.0, "verifier_accept_k": 1}],
            "verifier": {"name_or_path": verifier, "architectures": [verifier_architecture]},
        },
        "kimi_eagle": {"aux_layer_ids_block_output": list(cfg.aux_layer_ids), "layer_id_convention": CONVENTION,
                       "target_num_layers": cfg.target_num_layers},
    }


def export_speculators(draft: str | Path, out: str | Path, dtype: torch.dtype = torch.float32,
                       verifier: str | None = None) -> Path:
    """Write the speculators checkpoint of the kit drafter at ``draft`` (EAGLE-3 or DFlash) into ``out``; returns ``out``.

    ``verifier`` (the target's path or hub id) goes into ``speculators_config.verifier.name_or_path``;
    speculators then re-reads the target's layer count (and a DFlash drafter's embeddings) from it on load.
    """
    from safetensors.torch import save_file

    if not verifier:
        raise ValueError("a speculators export needs --verifier (the target's path or hub id): speculators "
                         "loads the verifier's embeddings, lm_head and layer count with the drafter")
    model = load_any_drafter(draft)
    out = Path(out)
    if isinstance(model, DFlashDrafter):
        state = {k: v for k, v in model.state_dict().items() if k != "embed_tokens.weight"}
        config = speculators_dflash_config(model.config, dtype, verifier)
    else:
        state = {speculators_name(k): v for k, v in model.state_dict().items()}
        config = speculators_config(model.config, dtype, verifier)
    state = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in state.items()}
    with atomic_path(out / "model.safetensors") as tmp:
        save_file(state, str(tmp), metadata={"format": "pt"})
    write_json(out / "config.json", config)
    return out
