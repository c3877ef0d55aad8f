"""EAGLE-3 on tiny-kimi: Kimi-ID data, a drafter trained and evaluated in the model's own row space."""
import json

import pytest
import torch

from kimi_eagle.apps.batch.notebooks import NOTEBOOK_DIR, execute, notebook_runs
from kimi_eagle.apps.tiny_kimi import TinyKimiSpec, build_tiny_kimi, kimi_prompt_lines
from kimi_eagle.eagle3.evaluate import EvaluateOptions, evaluate_drafter, load_prompts
from kimi_eagle.eagle3.extract import extract
from kimi_eagle.eagle3.hidden import load_rows, load_target
from kimi_eagle.eagle3.online import OnlineHiddenStates
from kimi_eagle.eagle3.readers import HiddenStates
from kimi_eagle.eagle3.row_space import ROW_SPACE, skipped_by_reason, target_id_map
from kimi_eagle.eagle3.speculative import generate_target_only
from kimi_eagle.eagle3.train import TrainConfig, train_drafter
from kimi_eagle.engine.local import Engine, SamplingParams, engine_record
from kimi_eagle.io import write_jsonl

# the small network of tests/test_tiny_kimi.py, three layers so EAGLE-3's low/mid/high aux layers exist
SPEC = TinyKimiSpec(steps=2, seed=0, sharegpt_conversations=2, hidden_size=32, intermediate_size=64, num_layers=3,
                    num_heads=2, seq_len=64, batch_size=2, max_positions=1024)
N_TRAIN, N_EVAL = 4, 2


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny_kimi_eagle3") / "model"
    build_tiny_kimi(out, SPEC)
    return out


@pytest.fixture(scope="module")
def engine(model_dir):
    return Engine.from_dir(model_dir)


@pytest.fixture(scope="module")
def prompt_lines(engine):
    return kimi_prompt_lines(N_TRAIN + N_EVAL, engine.tok, max_prompt_tokens=256)


@pytest.fixture(scope="module")
def engine_file(engine, prompt_lines, tmp_path_factory):
    """Engine records (Kimi IDs) of the first N_TRAIN glaive prompts, sampled by tiny-kimi in K2.5."""
    records = []
    for line in prompt_lines[:N_TRAIN]:
        gen = engine.generate(engine.prompt_ids(line["messages"], line.get("tools")),
                              SamplingParams(1.0, 1.0, line["seed"], 16))
        records.append(engine_record(line["id"], gen, engine.name, engine.chat_format))
    path = tmp_path_factory.mktemp("rows") / "engine.jsonl"
    write_jsonl(path, records)
    return path, records


def test_rows_read_for_a_tiny_kimi_target_are_its_rows_and_unmapped_ids_are_skipped_by_name(model_dir, engine_file,
                                                                                           tmp_path):
    path, records = engine_file
    id_map = target_id_map(model_dir)
    rows, skipped = load_rows(path, target=model_dir)
    assert skipped == [] and [r.id for r in rows] == [e["id"] for e in records]
    for row, rec in zip(rows, records):
        assert id_map.to_kimi(row.input_ids) == rec["prompt_ids"] + rec["output_ids"]
        assert max(row.input_ids) < len(id_map) < max(rec["prompt_ids"])  # Kimi IDs run to 163,5xx; rows do not
    assert [r.input_ids for r in load_rows(path)[0]] == [e["prompt_ids"] + e["output_ids"] for e in records]
    online = OnlineHiddenStates(model_dir, path)  # `kimi-eagle train --online` reads the same rows
    assert [r.input_ids for r in online.rows] == [r.input_ids for r in rows] and online.manifest["vocab_size"] == len(id_map)
    missing = next(i for i in range(200_000) if i not in id_map)
    bad = tmp_path / "bad.jsonl"
    write_jsonl(bad, [records[0], {**records[1], "output_ids": [missing]}])
    kept, skipped = load_rows(bad, target=model_dir)
    assert [r.id for r in kept] == [records[0]["id"]]
    assert skipped[0]["id"] == records[1]["id"] and f"no model row: Kimi ID {missing}" in skipped[0]["reason"]
    assert skipped_by_reason(skipped + [{"index": 9, "id": "e", "reason": "status 'error': x"}]) == {
        "no model row": 1, "status 'error': x": 1}


def test_extracting_kimi_ids_without_the_row_map_is_refused(model_dir, engine_file, tmp_path):
    rows, _ = load_rows(engine_file[0])  # Kimi IDs: the target has no rows for most of them
    with pytest.raises(ValueError, match="outside the target's .* rows .*load_rows"):
        extract(model_dir, rows, tmp_path / "hidden")


def test_evaluate_prompts_render_k25_and_map_kimi_ids_to_rows(model_dir, engine, prompt_lines, tmp_path):
    lines = prompt_lines[N_TRAIN:]
    want = [engine.id_map.to_rows(engine.prompt_ids(p["messages"], p.get("tools"))) for p in lines]
    path = tmp_path / "prompts.jsonl"
    write_jsonl(path, [{"id": p["id"], "messages": p["messages"], "tools": p.get("tools")} for p in lines]
                + [{"id": "ids", "prompt_ids": engine.id_map.to_kimi(want[0])}])
    assert load_prompts(path, model_dir) == [*zip([p["id"] for p in lines], want), ("ids", want[0])]
    write_jsonl(path, [{"id": "x", "prompt_ids": [next(i for i in range(200_000) if i not in engine.id_map)]}])
    with pytest.raises(ValueError, match="line 1: no model row: Kimi ID"):
        load_prompts(path, model_dir)


def test_extract_train_evaluate_in_row_space_keeps_greedy_identical_to_the_target(model_dir, engine, engine_file,
                                                                                  prompt_lines, tmp_path):
    torch.set_num_threads(1)
    target = load_target(model_dir)
    rows, skipped = load_rows(engine_file[0], target=model_dir)
    manifest = extract(model_dir, rows, tmp_path / "hidden", skipped=skipped, model=target)
    assert manifest["complete"] and manifest["token_ids"] == ROW_SPACE and manifest["vocab_size"] == len(engine.id_map)
    assert HiddenStates(tmp_path / "hidden")[0]["input_ids"].tolist() == rows[0].input_ids
    summary = train_drafter(TrainConfig(data=str(tmp_path / "hidden"), target=str(model_dir), out=str(tmp_path / "train"),
                                        steps=3, ttt_steps=2, batch_size=2, draft_vocab_size=32, log_every=1,
                                        save_every=3, progress=False))
    assert summary["finished"] and summary["token_ids"] == ROW_SPACE
    saved = json.loads((tmp_path / "train" / "drafter" / "config.json").read_text())
    assert saved["token_ids"] == ROW_SPACE and saved["draft_vocab"]["target_vocab_size"] == len(engine.id_map)
    prompts = [(p["id"], engine.id_map.to_rows(engine.prompt_ids(p["messages"], p.get("tools"))))
               for p in prompt_lines[N_TRAIN:]]
    report = evaluate_drafter(model_dir, tmp_path / "train" / "drafter", prompts,
                              EvaluateOptions(k=3, max_new_tokens=8, temperatures=(0.0,)), model=target)
    assert report["token_ids"] == ROW_SPACE
    for method in ("eagle3", "ngram"):
        greedy = report["methods"][method]["greedy"]
        assert greedy["identical_to_target_greedy"] == f"{N_EVAL}/{N_EVAL}" and greedy["tau"] >= 1.0
    # the target-only greedy the report compared against is the engine's own greedy, mapped to rows
    line = prompt_lines[N_TRAIN]
    engine_greedy = engine.generate(engine.prompt_ids(line["messages"], line.get("tools")), SamplingParams(0, 1.0, 0, 8))
    eos_row = target.config.eos_token_id
    assert engine.id_map.to_kimi(generate_target_only(target, prompts[0][1], 8, 0.0, eos_row)) == engine_greedy.output_ids


def test_notebook_03_runs_end_to_end_with_a_tiny_kimi_target(model_dir, tmp_path):
    """Generation served in K2.5, reconstruction in kimi-k2.5, diff, extraction, training and evaluation in rows."""
    notebook = NOTEBOOK_DIR / "03_eagle3_training.ipynb"
    params = dict(next(p for nb, p in notebook_runs("test") if nb.name == notebook.name))
    params.update(target=str(model_dir), n_samples=3, max_tokens=12, steps=2, eval_prompts=2, eval_max_new_tokens=6)
    executed = execute(notebook, tmp_path, params)
    nb = json.loads(executed.read_text())
    assert not [o for c in nb["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["chat_format"] == "kimi-k2.5" and metrics["drafter_token_ids"] == ROW_SPACE
    assert metrics["generation"]["records"] == 3 and metrics["reconstruction"]["status"]
    assert {m["rows"] + m["skipped"] for m in metrics["extraction"].values()} == {3}
    for row in metrics["tau"].values():
        assert row["greedy identical"] == "2/2"
    hidden = json.loads((tmp_path / "hidden_engine" / "manifest.json").read_text())
    assert hidden["token_ids"] == ROW_SPACE and hidden["vocab_size"] == len(target_id_map(model_dir))
    assert (tmp_path / "responses.jsonl").exists() and (tmp_path / "recon.parquet").exists()


def test_a_dflash_drafter_in_row_space_keeps_greedy_identical_and_masks_with_kimis_pad_row(model_dir, engine, engine_file,
                                                                                           prompt_lines, tmp_path):
    """#36: DFlash on tiny-kimi: its layer set (all 3 blocks of this small model), Kimi's [PAD] (163839) as the mask
    token in the model's rows, block-wise verification identical to target-only greedy decoding."""
    from kimi_eagle.eagle3.dflash import DFlashDrafter
    from kimi_eagle.eagle3.dflash_config import KIMI_MASK_TOKEN_ID
    from kimi_eagle.eagle3.drafters import load_any_drafter

    torch.set_num_threads(1)
    target = load_target(model_dir)
    rows, skipped = load_rows(engine_file[0], target=model_dir)
    manifest = extract(model_dir, rows, tmp_path / "hidden", skipped=skipped, model=target, drafter="dflash")
    assert manifest["layer_ids"] == [0, 1, 2]
    train_drafter(TrainConfig(data=str(tmp_path / "hidden"), target=str(model_dir), out=str(tmp_path / "train"), steps=3,
                              batch_size=2, draft_vocab_size=32, progress=False, drafter="dflash", block_size=4))
    drafter = load_any_drafter(tmp_path / "train" / "drafter")
    assert isinstance(drafter, DFlashDrafter)
    assert engine.id_map.to_kimi([drafter.config.mask_token_id]) == [KIMI_MASK_TOKEN_ID]
    prompts = [(p["id"], engine.id_map.to_rows(engine.prompt_ids(p["messages"], p.get("tools"))))
               for p in prompt_lines[N_TRAIN:]]
    report = evaluate_drafter(model_dir, None, prompts, EvaluateOptions(k=3, max_new_tokens=10, temperatures=(0.0, 1.0),
                                                                       ngram=False), model=target, drafter=drafter)
    greedy = report["methods"]["dflash"]["greedy"]
    assert greedy["identical_to_target_greedy"] == f"{N_EVAL}/{N_EVAL}"
    for mode in report["methods"]["dflash"].values():
        assert mode["tau"] == round((mode["accepted"] + mode["rounds"]) / mode["rounds"], 4) and 1.0 <= mode["tau"] <= 4.0
