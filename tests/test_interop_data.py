"""`kimi-eagle export-data`: exact-ID rows that SpecForge's and speculators' own loaders accept bit-identically."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from kimi_eagle.apps.cli import main as cli_main
from kimi_eagle.apps.interop.export_data import export_data
from kimi_eagle.assets import stories_dir

VOCAB = 512  # stories260K


@pytest.fixture(scope="module")
def rows_parquet(tmp_path_factory, stories):
    """Reconstructed rows in the kit's parquet shape: 3 good rows and one of each kind of bad row."""
    enc = lambda text: stories.encode(text)  # noqa: E731
    rows = [
        {"id": "good-0", "status": "ok", "prompt_ids": enc("Once upon a time"), "completion_ids": enc(" there was a cat."), "flags": []},
        {"id": "good-1", "status": "ok", "prompt_ids": enc("Lily had a red ball."), "completion_ids": enc(" She liked to play."), "flags": []},
        {"id": "err", "status": "error", "error": "no choices", "prompt_ids": [], "completion_ids": [], "flags": []},
        {"id": "empty", "status": "ok", "prompt_ids": enc("Hello"), "completion_ids": [], "flags": []},
        {"id": "oov", "status": "ok", "prompt_ids": enc("Hi"), "completion_ids": [5, VOCAB + 7], "flags": []},
        {"id": "flagged", "status": "ok", "prompt_ids": enc("Tom"), "completion_ids": enc(" ran."), "flags": ["literal_marker"]},
        {"id": "long-prompt", "status": "ok", "prompt_ids": enc("word " * 40), "completion_ids": enc(" end."), "flags": []},
        {"id": "long-completion", "status": "ok", "prompt_ids": enc("A dog"), "completion_ids": enc(" ran and ran" * 10), "flags": []},
    ]
    schema = pa.schema([("id", pa.string()), ("status", pa.string()), ("error", pa.string()),
                        ("prompt_ids", pa.list_(pa.int32())), ("completion_ids", pa.list_(pa.int32())),
                        ("flags", pa.list_(pa.string()))])
    path = tmp_path_factory.mktemp("rows") / "rows.parquet"
    pq.write_table(pa.Table.from_pylist([{"error": None, **r} for r in rows], schema=schema), path)
    return path, rows


MAX_LEN = 24


def expected(rows):
    """The rows export-data must write: prompt + completion, mask over the completion, cut at MAX_LEN."""
    out = {}
    for r in rows:
        if r["id"] in ("err", "empty", "oov", "flagged", "long-prompt"):
            continue
        ids = (r["prompt_ids"] + r["completion_ids"])[:MAX_LEN]
        mask = ([0] * len(r["prompt_ids"]) + [1] * len(r["completion_ids"]))[:MAX_LEN]
        out[r["id"]] = (ids, mask)
    return out


def export(rows_parquet, tmp_path, to):
    path, _ = rows_parquet
    return export_data(path, to, tmp_path / to, vocab_size=VOCAB, max_length=MAX_LEN, drop_flags=["literal_marker"],
                       draft_vocab_size=64, target=str(stories_dir()), n_layers=5, hidden_size=64)


def test_manifest_accounts_for_every_record_with_a_reason(rows_parquet, tmp_path):
    m = export(rows_parquet, tmp_path, "tokens")
    assert m["rows_in"] == 8 and m["rows_written"] == 3 and m["rows_dropped"] == 5
    assert m["dropped_by_reason"] == {"empty_completion": 1, "flag:literal_marker": 1, "id_out_of_vocab": 1,
                                      "no_supervised_tokens": 1, "status_error": 1}
    assert {d["id"] for d in m["dropped"]} == {"err", "empty", "oov", "flagged", "long-prompt"}
    assert m["rows_truncated"] == 1  # long-completion, cut but kept
    assert len(m["source_sha256"]) == 64
    on_disk = json.loads((tmp_path / "tokens" / "manifest.json").read_text())
    assert on_disk["dropped_by_reason"] == m["dropped_by_reason"]


def test_tokens_rows_are_bit_identical_to_the_input(rows_parquet, tmp_path):
    export(rows_parquet, tmp_path, "tokens")
    lines = [json.loads(s) for s in (tmp_path / "tokens" / "rows.jsonl").read_text().splitlines()]
    assert {r["id"]: (r["input_ids"], r["loss_mask"]) for r in lines} == expected(rows_parquet[1])


def test_specforge_prepare_prompt_tasks_sees_the_exact_ids(rows_parquet, tmp_path):
    from specforge.data.prompt_builder import prepare_prompt_tasks

    export(rows_parquet, tmp_path, "specforge")
    tasks = prepare_prompt_tasks(tmp_path / "specforge" / "prompts.jsonl", None, chat_template=None,
                                 max_length=MAX_LEN, is_preformatted=False, train_only_last_turn=False,
                                 cache_dir=None, cache_key=None, num_proc=None)
    seen = [(t["payload"]["input_ids"], t["payload"]["loss_mask"]) for t in tasks]
    assert seen == list(expected(rows_parquet[1]).values())


def test_specforge_vocab_mapping_loads_into_its_draft_model(rows_parquet, tmp_path):
    from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3
    from transformers import LlamaConfig

    export(rows_parquet, tmp_path, "specforge")
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=4,
                      num_hidden_layers=1, vocab_size=VOCAB, max_position_embeddings=256)
    cfg.draft_vocab_size = 64
    draft = LlamaForCausalLMEagle3(cfg)
    draft.load_vocab_mapping(str(tmp_path / "specforge" / "vocab_mapping.pt"))
    counts = torch.zeros(VOCAB, dtype=torch.long)
    for ids, mask in expected(rows_parquet[1]).values():
        counts += torch.bincount(torch.tensor(ids)[torch.tensor(mask).bool()], minlength=VOCAB)
    chosen = (draft.d2t + torch.arange(64)).tolist()
    assert set(torch.nonzero(counts).flatten().tolist()) <= set(chosen)  # every supervised token is drafted
    assert torch.equal(torch.nonzero(draft.t2d).flatten(), draft.d2t + torch.arange(64))


def test_specforge_run_configs_validate_with_its_config_model(rows_parquet, tmp_path):
    import yaml
    from specforge.config import Config

    export(rows_parquet, tmp_path, "specforge")
    online = Config(**yaml.safe_load((tmp_path / "specforge" / "specforge.yaml").read_text()))
    offline = Config(**yaml.safe_load((tmp_path / "specforge" / "specforge_offline.yaml").read_text()))
    assert (online.mode, offline.mode) == ("online", "offline")
    assert online.model.aux_hidden_state_layer_ids == [1, 2, 3]  # stories260K's 5 layers, SGLang ids
    assert online.data.prompts_path.endswith("prompts.jsonl")


def test_speculators_builder_and_arrow_rows_match_the_export(rows_parquet, tmp_path, stories):
    """speculators' own dataset builder passes the exported rows through unchanged, and our Arrow
    dataset (loaded with its load_from_disk) holds exactly those rows."""
    import datasets
    from speculators.data_generation.preprocessing import build_speculator_training_dataset

    export(rows_parquet, tmp_path, "tokens")
    raw = datasets.load_dataset("json", data_files=str(tmp_path / "tokens" / "rows.jsonl"), split="train")
    built = build_speculator_training_dataset(raw, processor=None, max_length=MAX_LEN, num_proc=1)
    export(rows_parquet, tmp_path, "speculators")
    ours = datasets.load_from_disk(str(tmp_path / "speculators")).with_format("torch")
    assert len(built) == len(ours) == 3
    for a, b in zip(built, ours):
        assert torch.equal(a["input_ids"], b["input_ids"]) and a["input_ids"].dtype == b["input_ids"].dtype
        assert torch.equal(a["loss_mask"], b["loss_mask"]) and int(a["seq_len"]) == int(b["seq_len"])
    want = list(expected(rows_parquet[1]).values())
    assert [(r["input_ids"].tolist(), r["loss_mask"].tolist()) for r in ours] == want


def test_speculators_vocab_files_equal_its_own_mapping_from_the_token_freq(rows_parquet, tmp_path):
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    export(rows_parquet, tmp_path, "speculators")
    out = tmp_path / "speculators"
    freq = torch.load(out / "token_freq.pt", weights_only=True)
    d2t, t2d = build_vocab_mappings_from_distribution(freq, draft_vocab_size=64, target_vocab_size=VOCAB)
    assert np.array_equal(np.load(out / "d2t-64.npy"), d2t.numpy())
    assert np.array_equal(np.load(out / "t2d-64.npy"), t2d.numpy())


def test_cli_export_data_reads_the_target_config(rows_parquet, tmp_path, capsys):
    path, _ = rows_parquet
    rc = cli_main(["export-data", str(path), "--to", "tokens", "-o", str(tmp_path / "cli"), "--target",
                   str(stories_dir()), "--max-length", str(MAX_LEN), "--drop-flag", "literal_marker",
                   "--draft-vocab-size", "64"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["rows_written"] == 3 and summary["rows_dropped"] == 5
    assert "layer_ids.json" in summary["files"]
    table = json.loads((tmp_path / "cli" / "layer_ids.json").read_text())
    assert table["speculators_file_layers"] == [2, 3, 4, 5]
