"""Run configs for the trainers, written next to exported data, with the layer ids in each convention.

* ``specforge.yaml``: SpecForge's online run (``data.prompts_path`` = the exported pre-tokenized rows,
  ``model.aux_hidden_state_layer_ids`` in SGLang's convention, ``model.vocab_mapping_path``); its
  disaggregated Mooncake deployment is what SpecForge 0.2.0 requires for online training.
  ``specforge_offline.yaml``: the same run reading hidden states from ``data.hidden_states_path``.
  Both are validated by ``specforge.config.Config`` in the tests.
* ``speculators.sh``: the speculators command lines (hidden-state capture from vLLM over the exported
  Arrow rows, then ``speculators train``) with capture-before ids.
* ``layer_ids.json``: the convention table (:func:`kimi_eagle.eagle3.layers.convention_table`).

The emitted values are facts of the trainers' 0.2.0 / 0.9.0 releases; hosts, ports and GPU counts
are placeholders to edit (they are marked ``EDIT``).
"""
from __future__ import annotations

import shlex
from pathlib import Path

import yaml

from kimi_eagle.eagle3.layers import convention_table
from kimi_eagle.io import write_json, write_text

KIMI_K25 = {"n_layers": 61, "hidden_size": 7168, "vocab_size": 163840}


def specforge_config(*, target: str, data_dir: str, n_layers: int, max_length: int, offline: bool = False,
                     layer_ids: list[int] | None = None) -> dict:
    """SpecForge 0.2.0 run config (a plain dict; ``specforge.config.Config(**cfg)`` accepts it)."""
    table = convention_table(n_layers, layer_ids)
    data_dir = data_dir.rstrip("/")
    model = {"target_model_path": target, "aux_hidden_state_layer_ids": table["sglang_specforge"],
             "vocab_mapping_path": f"{data_dir}/vocab_mapping.pt", "torch_dtype": "bfloat16",
             "trust_remote_code": True}
    if offline:
        return {
            "run_id": "kimi-eagle3-offline", "output_dir": "./output/kimi-eagle3",
            "model": model,
            "data": {"hidden_states_path": f"{data_dir}/hidden_states", "max_length": max_length},
            "training": {"strategy": "eagle3", "ttt_length": 7, "batch_size": 1, "learning_rate": 1e-4},
        }
    return {
        "run_id": "kimi-eagle3-online", "output_dir": "./output/kimi-eagle3",
        "model": model,
        "data": {"prompts_path": f"{data_dir}/prompts.jsonl", "max_length": max_length},
        "training": {"strategy": "eagle3", "ttt_length": 7, "batch_size": 1, "learning_rate": 1e-4, "role": "auto"},
        "deployment": {"mode": "disaggregated", "disaggregated": {
            "control_dir": "./output/kimi-eagle3/control",  # EDIT: a directory every node sees
            "backend": "mooncake",
            "server_urls": ["http://CAPTURE_HOST:30000"],  # EDIT: SpecForge's patched SGLang capture servers
        }},
    }


def speculators_commands(*, target: str, data_dir: str, n_layers: int, max_length: int, draft_vocab_size: int,
                         layer_ids: list[int] | None = None) -> str:
    """A shell script of speculators 0.9.0 command lines over the exported Arrow rows."""
    table = convention_table(n_layers, layer_ids)
    q = shlex.quote
    aux = " ".join(str(i) for i in table["vllm_speculators"])
    capture = ",".join(str(i) for i in table["speculators_file_layers"])
    return "\n".join([
        "#!/bin/sh",
        "# speculators 0.9.0 over kimi-eagle export-data rows (exact IDs; prepare-data is not needed:",
        "# the export already is its Arrow dataset with token_freq.pt and d2t/t2d).",
        f"# layer ids: kit block outputs {table['kimi_block_output']} = vLLM capture-before {table['vllm_speculators']};",
        f"# hidden-state files hold layers {capture} (the last is the final layer before the norm).",
        "set -e",
        f"DATA={q(data_dir)}",
        f"TARGET={q(target)}",
        "# 1. vLLM serving the target with hidden-state capture of layers " + capture + " (EDIT: GPUs, port).",
        "# 2. hidden states, one hs_{row}.safetensors per row, into $DATA/hidden_states:",
        "speculators generate-offline-data --model \"$TARGET\" --endpoint http://localhost:8000/v1 \\",
        "  --preprocessed-data \"$DATA\" --output \"$DATA/hidden_states\" --validate-outputs true",
        "# 3. train (or skip step 2 and let training fetch hidden states on demand with --on-missing generate):",
        "speculators train --speculator-type eagle3 --verifier-name-or-path \"$TARGET\" \\",
        f"  --data-path \"$DATA\" --target-layer-ids {aux} --draft-vocab-size {draft_vocab_size} \\",
        f"  --d2t-path \"$DATA/d2t-{draft_vocab_size}.npy\" --t2d-path \"$DATA/t2d-{draft_vocab_size}.npy\" \\",
        f"  --hidden-states-path \"$DATA/hidden_states\" --on-missing skip --total-seq-len {max_length} \\",
        "  --save-path ./output/kimi-eagle3-speculators",
        "",
    ])


def write_configs(out: Path, to: str, *, target: str, n_layers: int, hidden_size: int, vocab_size: int,
                  draft_vocab_size: int, max_length: int) -> list[Path]:
    """Write the configs for the export target ``to`` into ``out``; returns the paths written."""
    table = convention_table(n_layers)
    written = [write_json(out / "layer_ids.json", {"n_layers": n_layers, "hidden_size": hidden_size,
                                                    "vocab_size": vocab_size, **table})]
    if to == "specforge":
        for offline, name in ((False, "specforge.yaml"), (True, "specforge_offline.yaml")):
            cfg = specforge_config(target=target, data_dir=str(out), n_layers=n_layers, max_length=max_length,
                                   offline=offline)
            written.append(write_text(out / name, yaml.safe_dump(cfg, sort_keys=False)))
    elif to == "speculators":
        written.append(write_text(out / "speculators.sh", speculators_commands(
            target=target, data_dir=str(out), n_layers=n_layers, max_length=max_length,
            draft_vocab_size=draft_vocab_size)))
    return written
