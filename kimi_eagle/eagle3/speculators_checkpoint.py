"""A speculators 0.9.0 EAGLE-3 checkpoint as the kit's drafter (the inverse of :mod:`.speculators`).

``load_drafter`` (:mod:`kimi_eagle.eagle3.model`) calls :func:`kit_drafter_parts` when a ``config.json``
says ``speculators_model_type: "eagle3"``, so ``kimi-eagle evaluate --draft DIR`` takes a drafter trained by
speculators (``Eagle3DraftModel.save_pretrained``) or exported by ``kimi-eagle export --engine speculators``
as it is, with no conversion by hand.

What is read (facts of speculators 0.9.0's ``Eagle3SpeculatorConfig`` / ``Eagle3DraftModel``):

* ``transformer_layer_config``: the drafter's Llama layer (hidden size, heads, ``head_dim``, ``rms_norm_eps``,
  ``rope_parameters.rope_theta``, positions, the target vocabulary size);
* ``draft_vocab_size``, ``target_hidden_size`` (``null`` = the drafter's hidden size);
* ``eagle_aux_hidden_state_layer_ids``: vLLM's capture-before ids, block output ``j - 1`` (a ``kimi_eagle``
  block, written by the kit's export, wins);
* weights: ``layers.0.*`` -> ``midlayer.*``; ``fc``, ``norm``, ``lm_head``, ``embed_tokens``, ``d2t``, ``t2d``
  as named; ``verifier_norm`` / ``verifier_lm_head`` (training-only copies of the target's) dropped.

Only the architecture the kit's drafter implements is accepted: one decoder layer and
``norm_before_residual``, ``norm_before_fc``, ``fc_norm``, ``norm_output`` all false (SGLang's and vLLM's
``LlamaForCausalLMEagle3``). speculators' own *training* defaults set ``norm_before_residual``,
``norm_before_fc`` and ``norm_output`` (and a 2,048-token sliding window); such a checkpoint is refused with the
flags named, never loaded into a different network. The runbook's ``speculators.sh`` therefore passes flags that
select this layer (``kimi_eagle.apps.interop.configs.RECIPE``: ``--no-norm-before-residual --no-norm-before-fc
--no-norm-output --full-attention-indices 0``), and the drafter it trains loads here as it is (docs/scale.md,
"One drafter configuration"). This module does not import the kit's model (``load_drafter`` imports it).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from kimi_eagle.eagle3.layers import layer_ids_from_engine

UNSUPPORTED_FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
DROPPED_KEYS = ("verifier_norm.weight", "verifier_lm_head.weight")


def is_speculators_eagle3(raw: dict) -> bool:
    """Whether a ``config.json`` is a speculators EAGLE-3 checkpoint's."""
    return raw.get("speculators_model_type") == "eagle3"


def _target_num_layers(raw: dict, aux_ids: list[int], target_dir: str | Path | None) -> int:
    meta = raw.get("kimi_eagle") or {}
    if "target_num_layers" in meta:
        return int(meta["target_num_layers"])
    verifier = ((raw.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
    for d in (target_dir, verifier):
        if d and (Path(d) / "config.json").is_file():
            cfg = json.loads((Path(d) / "config.json").read_text())
            return int(cfg.get("text_config", cfg)["num_hidden_layers"])
    return max(aux_ids) + 1


def kit_config(raw: dict, target_dir: str | Path | None = None) -> dict:
    """Keyword arguments of :class:`~kimi_eagle.eagle3.model.Eagle3Config` for a speculators ``config.json``.

    Raises ``ValueError`` for an architecture the kit's drafter does not implement (see the module doc)."""
    if not is_speculators_eagle3(raw):
        raise ValueError("not a speculators EAGLE-3 config (speculators_model_type must be 'eagle3')")
    on = [f for f in UNSUPPORTED_FLAGS if raw.get(f)]
    if on:
        raise ValueError(f"speculators drafter with {', '.join(f'{f}=true' for f in on)}: the kit's drafter implements "
                         "the SGLang/vLLM LlamaForCausalLMEagle3 layer (all four flags false); train the peer with them "
                         "off to evaluate it here")
    layer = raw["transformer_layer_config"]
    if int(layer.get("num_hidden_layers", 1)) != 1:
        raise ValueError(f"speculators drafter with {layer['num_hidden_layers']} decoder layers: the kit's drafter has one")
    window = layer.get("sliding_window")
    if "sliding_attention" in (layer.get("layer_types") or []) and window and window < int(layer["max_position_embeddings"]):
        raise ValueError(f"speculators drafter with a {window}-token sliding window shorter than its "
                         f"{layer['max_position_embeddings']} positions: the kit's drafter attends over the whole row")
    meta = raw.get("kimi_eagle") or {}
    ids = meta.get("aux_layer_ids_block_output") or layer_ids_from_engine(raw["eagle_aux_hidden_state_layer_ids"])
    rope = layer.get("rope_parameters") or {}
    heads = int(layer["num_attention_heads"])
    eos = layer.get("eos_token_id")
    return {
        "hidden_size": int(layer["hidden_size"]), "intermediate_size": int(layer["intermediate_size"]),
        "num_attention_heads": heads, "num_key_value_heads": int(layer.get("num_key_value_heads") or heads),
        "head_dim": int(layer.get("head_dim") or layer["hidden_size"] // heads),
        "rms_norm_eps": float(layer["rms_norm_eps"]), "rope_theta": float(rope.get("rope_theta", layer.get("rope_theta", 10000.0))),
        "vocab_size": int(layer["vocab_size"]), "draft_vocab_size": int(raw["draft_vocab_size"]),
        "target_hidden_size": int(raw.get("target_hidden_size") or layer["hidden_size"]),
        "max_position_embeddings": int(layer["max_position_embeddings"]), "aux_layer_ids": [int(i) for i in ids],
        "target_num_layers": _target_num_layers(raw, [int(i) for i in ids], target_dir),
        "bos_token_id": layer.get("bos_token_id"), "eos_token_id": eos[0] if isinstance(eos, (list, tuple)) else eos,
    }


def kit_state(state: dict[str, torch.Tensor], config: dict) -> dict[str, torch.Tensor]:
    """speculators' weights under the kit's names (``layers.0.*`` -> ``midlayer.*``), training-only verifier
    copies dropped; a full-vocabulary drafter (no ``d2t``/``t2d``) gets the identity mapping. Floating
    weights become float32 (the kit's drafter computes in float32). ``embed_tokens.weight`` is left out when the
    checkpoint has none (the caller takes the target's)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if name in DROPPED_KEYS:
            continue
        if not (name.startswith("layers.0.") or name in ("fc.weight", "norm.weight", "lm_head.weight",
                                                          "embed_tokens.weight", "d2t", "t2d")):
            raise ValueError(f"speculators checkpoint holds {name!r}, which the kit's drafter has no place for")
        kit_name = "midlayer." + name[len("layers.0."):] if name.startswith("layers.0.") else name
        out[kit_name] = t.float() if t.is_floating_point() else t
    if "d2t" not in out:
        if config["draft_vocab_size"] != config["vocab_size"]:
            raise ValueError("speculators checkpoint with a draft vocabulary but no d2t/t2d")
        out["d2t"] = torch.zeros(config["draft_vocab_size"], dtype=torch.long)
        out["t2d"] = torch.ones(config["vocab_size"], dtype=torch.bool)
    return out


def kit_drafter_parts(path: str | Path, target_dir: str | Path | None = None) -> tuple[dict, dict[str, torch.Tensor]]:
    """``(Eagle3Config kwargs, state dict)`` of the speculators checkpoint in ``path`` (``config.json`` +
    ``model.safetensors``, or sharded ``model-*.safetensors``)."""
    from safetensors.torch import load_file

    path = Path(path)
    raw = json.loads((path / "config.json").read_text())
    config = kit_config(raw, target_dir)
    files = sorted(path.glob("model*.safetensors"))
    if not files:
        raise ValueError(f"{path}: no model*.safetensors")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return config, kit_state(state, config)
