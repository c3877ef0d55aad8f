"""Run configs for the trainers, written next to exported data, with the layer ids in each convention.

* ``specforge.yaml``: SpecForge's online run (``data.prompts_path`` = the exported pre-tokenized rows,
  ``model.aux_hidden_state_layer_ids`` in SGLang's convention, ``model.vocab_mapping_path``,
  ``model.draft_model_config`` = ``draft_config.json``); its disaggregated Mooncake deployment is what
  SpecForge 0.2.0 requires for online training. ``specforge_offline.yaml``: the same run reading hidden
  states from ``data.hidden_states_path``. Both pass ``specforge.config.Config`` and ``specforge train
  --plan`` in tests/test_trainer_clis.py, and SpecForge builds its draft model from them.
* ``draft_config.json``: the drafter SpecForge trains, as a ``LlamaForCausalLMEagle3`` config (the kit's
  drafter for this target: :func:`~kimi_eagle.apps.interop.export_drafter.engine_config`), so SpecForge
  does not generate its own with a 32,000-token draft vocabulary.
* ``speculators.sh``: the speculators command lines (hidden-state capture from vLLM over the exported
  Arrow rows, then ``speculators train``) with capture-before ids and :data:`RECIPE`'s flags, which select
  the layer the kit's drafter implements (so ``kimi-eagle evaluate`` reads the result).
* ``speculators_dflash.sh`` / ``speculators_dspark.sh``: the same two steps for speculators' block drafters
  (:data:`BLOCK_RECIPES`): hidden states of DFlash's layer set (:mod:`kimi_eagle.eagle3.dflash_config`) into
  ``hidden_states_dflash``, then ``speculators train --speculator-type dflash|dspark`` with those ids, the kit's
  block size and the target's ``--mask-token-id``.
* ``layer_ids.json``: the convention table (:func:`kimi_eagle.eagle3.layers.convention_table`), DFlash's under
  ``dflash`` (with its ``mask_token_id`` and ``block_size``).

The emitted values are facts of the trainers' 0.2.0 / 0.9.0 releases. Every value a user must set (a
directory every node sees, server URLs, Mooncake endpoints, the vLLM endpoint) is marked ``FILL`` in
the file and listed in its header (docs/scale.md lists the same).
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch
import yaml

from kimi_eagle.eagle3.dflash_config import BLOCK_SIZE, KIMI_MASK_TOKEN_ID, MaskTokenInvalid, mask_token_id
from kimi_eagle.eagle3.layers import convention_table, drafter_layer_ids, speculators_layer_ids, trainer_layer_ids
from kimi_eagle.io import write_json, write_text

KIMI_K25 = {"n_layers": 61, "hidden_size": 7168, "vocab_size": 163840}
FILL = "FILL"
# what a user fills in specforge.yaml (key path, what it is); the offline YAML needs none
SPECFORGE_FILL = (
    ("deployment.disaggregated.control_dir", "a directory every node sees"),
    ("deployment.disaggregated.server_urls", "SpecForge's patched SGLang capture servers"),
    ("deployment.disaggregated.mooncake_metadata_server", "or export MOONCAKE_METADATA_SERVER (the variable wins)"),
    ("deployment.disaggregated.mooncake_master_server_addr", "or export MOONCAKE_MASTER_SERVER_ADDR (the variable wins)"),
)
SPECULATORS_FILL = (("ENDPOINT", "the vLLM server capturing hidden states (default http://localhost:8000/v1)"),)
DRAFT_CONFIG_FILE = "draft_config.json"


@dataclass(frozen=True)
class SpeculatorsRecipe:
    """The speculators drafter of the runbook (``speculators.sh``) and of bench/peer_trainer.py: the kit's
    layer (SGLang/vLLM ``LlamaForCausalLMEagle3``: no extra norms, full attention) and the kit's TTT
    settings. speculators' own defaults (three norms on, a 2,048-token sliding window, 3 TTT steps) train a
    different network, which ``load_drafter`` refuses."""

    ttt_steps: int = 7
    ttt_step_loss_decay: float = 0.8
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    norm_output: bool = False
    full_attention: bool = True  # --full-attention-indices 0: the one layer attends over the whole row

    def flags(self) -> list[str]:
        """``speculators train`` flags selecting this drafter."""
        out = []
        for name in ("norm_before_residual", "norm_before_fc", "norm_output"):
            flag = name.replace("_", "-")
            out.append(f"--{flag}" if getattr(self, name) else f"--no-{flag}")
        if self.full_attention:
            out += ["--full-attention-indices", "0"]
        return out + ["--ttt-steps", str(self.ttt_steps), "--ttt-step-loss-decay", str(self.ttt_step_loss_decay)]


RECIPE = SpeculatorsRecipe()


@dataclass(frozen=True)
class BlockRecipe:
    """A speculators block drafter of the runbook (``speculators_{type}.sh``) and of bench/peer_trainer.py: DFlash's
    layer set and the kit's block size (:mod:`kimi_eagle.eagle3.dflash_config`), the target's mask token; the rest is
    speculators' own default for the type (5 Qwen3 draft layers; ``dflash``: cross-entropy with D-PACE weights;
    ``dspark``: DFlash plus its Markov and confidence heads, sampling from the anchor)."""

    speculator_type: str  # speculators' --speculator-type
    block_size: int = BLOCK_SIZE  # speculators' CLI default is 16 for dflash, 8 for dspark: pinned to the kit's

    def flags(self, mask: int | None) -> list[str]:
        """``speculators train`` flags selecting this drafter (``--mask-token-id`` when the target's is known)."""
        return ["--block-size", str(self.block_size)] + (["--mask-token-id", str(mask)] if mask is not None else [])


BLOCK_RECIPES = {name: BlockRecipe(name) for name in ("dflash", "dspark")}
BLOCK_HIDDEN_DIR = "hidden_states_dflash"  # dflash and dspark read the same layer set


@dataclass(frozen=True)
class SpeculatorsRun:
    """What one emitted speculators script varies: the drafter type, the kit's block-output layer ids, the flags
    selecting the drafter, where its hidden states and checkpoints go, and what the flags select (a comment)."""

    speculator_type: str
    layer_ids: list[int]
    flags: list[str]
    hidden_dir: str
    save_path: str
    note: str


def eagle3_run(n_layers: int, layer_ids: list[int] | None = None, recipe: SpeculatorsRecipe = RECIPE) -> SpeculatorsRun:
    """The EAGLE-3 script's run (``speculators.sh``)."""
    ids = list(drafter_layer_ids("eagle3", n_layers, layer_ids))
    return SpeculatorsRun("eagle3", ids, recipe.flags(), "hidden_states", "./output/kimi-eagle3-speculators",
                          "The layer flags select the kit's drafter (no extra norms, full attention), which kimi-eagle evaluate reads:")


def block_run(n_layers: int, recipe: BlockRecipe, mask: int | None) -> SpeculatorsRun:
    """A block drafter's run (``speculators_dflash.sh``, ``speculators_dspark.sh``)."""
    ids = list(drafter_layer_ids("dflash", n_layers))
    note = (f"{recipe.speculator_type}: DFlash's {len(ids)} target layers, block {recipe.block_size}, mask token "
            f"{mask if mask is not None else 'from the verifier tokenizer (speculators resolves it)'}:")
    return SpeculatorsRun(recipe.speculator_type, ids, recipe.flags(mask), BLOCK_HIDDEN_DIR,
                          f"./output/kimi-{recipe.speculator_type}-speculators", note)


def target_mask_token(target: str, vocab_size: int) -> int | None:
    """The mask token the block drafters train with: the target's (:func:`kimi_eagle.eagle3.dflash_config.mask_token_id`),
    Kimi's when only Kimi's vocabulary size is known, else None (speculators then resolves it from the verifier)."""
    if (Path(target) / "config.json").is_file():
        try:
            return mask_token_id(target)
        except MaskTokenInvalid:  # a set id that is not one (eos_token_id "2"): never another token in its place
            raise
        except ValueError:  # a config naming no mask/pad/eos/unk: the EAGLE-3 export must not fail for it
            return None
    return KIMI_MASK_TOKEN_ID if vocab_size == KIMI_K25["vocab_size"] else None


def dflash_table(n_layers: int, mask: int | None) -> dict:
    """DFlash's layer ids in the kit's and speculators' conventions, with the mask token and block size."""
    ids = drafter_layer_ids("dflash", n_layers)
    return {"kimi_block_output": list(ids), "vllm_speculators": trainer_layer_ids(ids, n_layers, "vllm", None),
            "speculators_file_layers": speculators_layer_ids(ids, n_layers, None), "mask_token_id": mask,
            "block_size": BLOCK_SIZE}


def draft_model_config(target_config: dict | None, *, n_layers: int, hidden_size: int, vocab_size: int,
                       draft_vocab_size: int, layer_ids: list[int] | None = None) -> dict:
    """The ``LlamaForCausalLMEagle3`` config of the drafter for SpecForge (``model.draft_model_config``).

    With the target's ``config.json`` (``target_config``): the kit's drafter for it (its layer shape).
    Without: the facts the export knows (sizes, vocabularies, layer ids); SpecForge fills the layer's
    shape with Llama's defaults, so pass ``--target`` for a drafter shaped like the target."""
    from kimi_eagle.apps.interop.export_drafter import engine_config
    from kimi_eagle.eagle3.model import Eagle3Config

    ids = convention_table(n_layers, layer_ids)["kimi_block_output"]
    needed = ("intermediate_size", "num_attention_heads", "rms_norm_eps", "max_position_embeddings")
    if target_config and all(k in target_config for k in needed):
        c = SimpleNamespace(**{**target_config, "num_hidden_layers": n_layers, "hidden_size": hidden_size,
                               "vocab_size": vocab_size})
        return engine_config(Eagle3Config.from_target(c, draft_vocab_size, ids), "sglang", torch.bfloat16)
    from kimi_eagle.eagle3.layers import engine_layer_ids

    return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
            "hidden_size": hidden_size, "vocab_size": vocab_size, "draft_vocab_size": draft_vocab_size,
            "target_hidden_size": hidden_size, "tie_word_embeddings": False,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": engine_layer_ids(ids, "sglang"),
                             "use_aux_hidden_state": True},
            "kimi_eagle": {"aux_layer_ids_block_output": ids, "target_num_layers": n_layers}}


def specforge_config(*, target: str, data_dir: str, n_layers: int, max_length: int, offline: bool = False,
                     layer_ids: list[int] | None = None) -> dict:
    """SpecForge 0.2.0 run config (a plain dict; ``specforge.config.Config(**cfg)`` accepts it)."""
    table = convention_table(n_layers, layer_ids)
    data_dir = data_dir.rstrip("/")
    model = {"target_model_path": target, "draft_model_config": f"{data_dir}/{DRAFT_CONFIG_FILE}",
             "aux_hidden_state_layer_ids": table["sglang_specforge"],
             "vocab_mapping_path": f"{data_dir}/vocab_mapping.pt", "torch_dtype": "bfloat16",
             "trust_remote_code": True}
    training = {"strategy": "eagle3", "ttt_length": RECIPE.ttt_steps, "batch_size": 1, "learning_rate": 1e-4}
    if offline:
        return {"run_id": "kimi-eagle3-offline", "output_dir": "./output/kimi-eagle3", "model": model,
                "data": {"hidden_states_path": f"{data_dir}/hidden_states", "max_length": max_length},
                "training": training}
    return {
        "run_id": "kimi-eagle3-online", "output_dir": "./output/kimi-eagle3", "model": model,
        "data": {"prompts_path": f"{data_dir}/prompts.jsonl", "max_length": max_length},
        "training": {**training, "role": "auto"},
        "deployment": {"mode": "disaggregated", "disaggregated": {
            "control_dir": f"/{FILL}/shared/kimi-eagle3/control", "backend": "mooncake",
            "server_urls": [f"http://{FILL}-capture-host:30000"],
            "mooncake_metadata_server": None, "mooncake_master_server_addr": None,
        }},
    }


def specforge_yaml(cfg: dict) -> str:
    """The YAML text of a SpecForge config: a header listing what to fill, each such line marked ``# FILL``."""
    online = "deployment" in cfg
    head = [f"# SpecForge 0.2.0 {'online' if online else 'offline'} run over kimi-eagle export-data rows",
            "# (specforge train --config THIS.yaml; check it first with --plan, which runs on CPU)."]
    if online:
        head.append(f"# {FILL} before running (each line is marked {FILL} below):")
        head += [f"#   {key}: {what}" for key, what in SPECFORGE_FILL]
    else:
        head.append("# Nothing to fill: data.hidden_states_path is where kimi-eagle extract --layout specforge writes.")
    leaves = {key.rsplit(".", 1)[1] for key, _ in SPECFORGE_FILL} if online else set()
    body = []
    for line in yaml.safe_dump(cfg, sort_keys=False).splitlines():
        key = line.strip().split(":", 1)[0]
        body.append(f"{line}  # {FILL}" if key in leaves else line)
    return "\n".join(head + body) + "\n"


def speculators_commands(*, target: str, data_dir: str, n_layers: int, max_length: int, draft_vocab_size: int,
                         layer_ids: list[int] | None = None, recipe: SpeculatorsRecipe = RECIPE,
                         run: SpeculatorsRun | None = None) -> str:
    """A shell script of speculators 0.9.0 command lines over the exported Arrow rows: capture, then train the
    drafter of ``run`` (default: EAGLE-3 with ``recipe``'s flags, :func:`eagle3_run`)."""
    run = run or eagle3_run(n_layers, layer_ids, recipe)
    q = shlex.quote
    aux = " ".join(str(i) for i in trainer_layer_ids(run.layer_ids, n_layers, "vllm", None))
    capture = ",".join(str(i) for i in speculators_layer_ids(run.layer_ids, n_layers, None))
    hidden = f"$DATA/{run.hidden_dir}"
    return "\n".join([
        "#!/bin/sh",
        f"# speculators 0.9.0 {run.speculator_type} over kimi-eagle export-data rows (exact IDs; prepare-data is not needed:",
        "# the export already is its Arrow dataset with token_freq.pt and d2t/t2d).",
        f"# layer ids: kit block outputs {run.layer_ids} = vLLM capture-before [{aux.replace(' ', ', ')}];",
        f"# hidden-state files hold layers {capture} (the last is the final layer before the norm).",
        f"# {FILL} before running: " + "; ".join(f"{k}: {what}" for k, what in SPECULATORS_FILL),
        "set -e",
        f"DATA={q(data_dir)}",
        f"TARGET={q(target)}",
        f"ENDPOINT=${{ENDPOINT:-http://localhost:8000/v1}}  # {FILL}",
        "# 1. vLLM serving the target with hidden-state capture of layers " + capture + " at $ENDPOINT.",
        f"# 2. hidden states, one hs_{{row}}.safetensors per row, into {hidden}:",
        "speculators generate-offline-data --model \"$TARGET\" --endpoint \"$ENDPOINT\" \\",
        f"  --preprocessed-data \"$DATA\" --output \"{hidden}\" --validate-outputs",
        "# 3. train (or skip step 2 and let training fetch hidden states on demand with --on-missing generate).",
        f"#    {run.note}",
        f"speculators train --speculator-type {run.speculator_type} --verifier-name-or-path \"$TARGET\" \\",
        f"  --data-path \"$DATA\" --target-layer-ids {aux} --draft-vocab-size {draft_vocab_size} \\",
        f"  --d2t-path \"$DATA/d2t-{draft_vocab_size}.npy\" --t2d-path \"$DATA/t2d-{draft_vocab_size}.npy\" \\",
        f"  {' '.join(run.flags)} \\",
        f"  --hidden-states-path \"{hidden}\" --on-missing skip --total-seq-len {max_length} \\",
        f"  --save-path {run.save_path}",
        "",
    ])


def target_config_of(target: str) -> dict | None:
    """The target's ``config.json`` (its ``text_config`` when nested), or None when ``target`` has none."""
    path = Path(target) / "config.json"
    if not path.is_file():
        return None
    cfg = json.loads(path.read_text())
    return cfg.get("text_config", cfg)


def write_configs(out: Path, to: str, *, target: str, n_layers: int, hidden_size: int, vocab_size: int,
                  draft_vocab_size: int, max_length: int) -> list[Path]:
    """Write the configs for the export target ``to`` into ``out``; returns the paths written."""
    table = convention_table(n_layers)
    mask = target_mask_token(target, vocab_size) if to == "speculators" else None
    written = [write_json(out / "layer_ids.json", {"n_layers": n_layers, "hidden_size": hidden_size,
                                                    "vocab_size": vocab_size, **table,
                                                    "dflash": dflash_table(n_layers, mask)})]
    if to == "specforge":
        written.append(write_json(out / DRAFT_CONFIG_FILE, draft_model_config(
            target_config_of(target), n_layers=n_layers, hidden_size=hidden_size, vocab_size=vocab_size,
            draft_vocab_size=draft_vocab_size), indent=1))
        for offline, name in ((False, "specforge.yaml"), (True, "specforge_offline.yaml")):
            cfg = specforge_config(target=target, data_dir=str(out), n_layers=n_layers, max_length=max_length,
                                   offline=offline)
            written.append(write_text(out / name, specforge_yaml(cfg)))
    elif to == "speculators":
        for name, run in [("speculators.sh", None)] + [(f"speculators_{k}.sh", block_run(n_layers, r, mask))
                                                      for k, r in BLOCK_RECIPES.items()]:
            written.append(write_text(out / name, speculators_commands(
                target=target, data_dir=str(out), n_layers=n_layers, max_length=max_length,
                draft_vocab_size=draft_vocab_size, run=run)))
    return written
