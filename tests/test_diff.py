"""`kimi-eagle diff`: every id of either input gets a row; hunks, billing and bad input."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import build, recon_row, split_token, turn, write_engine

from kimi_eagle.apps.cli import main
from kimi_eagle.diff.run import read_diff


def write_recon(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)


@pytest.fixture(scope="module")
def inputs(kimi, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("diff-inputs")
    ids, segs = build(kimi, turn())
    k = next(i for i, t in enumerate(ids) if kimi.token_bytes(t) == b" weather")
    split = split_token(kimi, ids, k)
    no_think, _ = build(kimi, turn(think_end=False))
    n_reasoning = segs[0]["tok_end"]
    rows = [
        recon_row("exact", ids, segs, billed=len(ids), billed_reasoning=n_reasoning),
        recon_row("split", ids, segs, billed=len(split) + 1, billed_reasoning=n_reasoning + 1),
        recon_row("think", ids, segs, billed=len(no_think)),
        recon_row("recon-only", ids, segs),
        recon_row("recon-failed", [], [], status="error", error="args_not_json: cannot parse"),
        recon_row("bad-ids", ids, segs),
        recon_row("empty", ids, segs),
        recon_row("dup", ids, segs),
    ]
    engine = [
        {"id": "exact", "output_ids": ids, "prompt_ids": [1, 2, 3]},
        {"id": "split", "output_ids": split, "prompt_ids": [1, 2, 4]},
        {"meta_info": {"id": "think", "finish_reason": {"type": "stop"}}, "output_ids": no_think},  # SGLang shape
        {"id": "engine-only", "output_ids": ids},
        "{not json",
        {"id": "bad-ids", "output_ids": [5, kimi.n_vocab + 7]},
        {"id": "empty", "output_ids": []},
        {"id": "dup", "output_ids": ids},
        {"id": "dup", "output_ids": ids},
        {"id": "no-ids"},
    ]
    write_recon(tmp_path / "recon.parquet", rows)
    write_engine(tmp_path / "engine.jsonl", engine)
    pq.write_table(pa.Table.from_pylist([{"id": "split", "expected": "bpe_split"}]), tmp_path / "labels.parquet")
    return tmp_path


@pytest.fixture(scope="module")
def diffed(inputs):
    out = inputs / "diff"
    rc = main(["diff", "--engine", str(inputs / "engine.jsonl"), "--reconstructed", str(inputs / "recon.parquet"),
               "-o", str(out), "--labels", str(inputs / "labels.parquet")])
    assert rc == 0
    return out


def test_diff_writes_one_row_per_record_of_either_input(diffed):
    out = diffed
    result = read_diff(out)
    dups = result.records[result.records["id"] == "dup"]
    assert dups["status"].tolist() == ["ok", "error"] and dups["engine_line"].tolist() == [8, 9]
    assert dups["error"].iloc[1] == "duplicate id 'dup' in the engine input (first valid record at engine line 8)"
    assert dups["verdict"].iloc[0] == "exact" and dups["verdict"].isna().iloc[1]
    recs = result.records.drop(dups.index[1:]).set_index("id")
    assert sorted(recs.index) == sorted(["exact", "split", "think", "recon-only", "recon-failed", "bad-ids", "empty",
                                         "dup", "engine-only", "<engine line 5>", "no-ids"])
    status = recs["status"].to_dict()
    assert status["exact"] == status["split"] == status["think"] == status["dup"] == "ok"
    assert status["recon-only"] == "missing_engine" and status["engine-only"] == "missing_api"
    for rid in ("recon-failed", "bad-ids", "empty", "<engine line 5>", "no-ids"):
        assert status[rid] == "error", rid
    assert "args_not_json" in recs.loc["recon-failed", "error"]
    assert "163847 is outside the vocabulary" in recs.loc["bad-ids", "error"]
    assert "output_ids is empty" in recs.loc["empty", "error"]
    assert "not JSON" in recs.loc["<engine line 5>", "error"]
    assert "no output_ids" in recs.loc["no-ids", "error"]
    assert (recs.loc["exact", "verdict"], recs.loc["split", "verdict"], recs.loc["think", "label"]) == (
        "exact", "bpe_split", "special_token")
    assert recs.loc["exact", "prompt_match"] and not recs.loc["split", "prompt_match"]
    assert recs.loc["think", "engine_finish_reason"] == "stop"

    hunks = result.hunks
    assert set(hunks["id"]) == {"split", "think"}
    split = hunks[hunks["id"] == "split"].iloc[0]
    assert (split["kind"], split["segment"], split["token_delta"]) == ("split", "reasoning", -1)
    assert split["engine_bytes"] == split["recon_bytes"] == b" weather"
    assert len(split["engine_ids"]) == 2 and len(split["recon_ids"]) == 1
    think = hunks[hunks["id"] == "think"].iloc[0]
    assert (think["subclass"], think["segment"], think["recon_bytes"]) == ("special_token", "think_end", b"</think>")
    meta = json.loads((out / "meta.json").read_text())
    assert meta["n_records"] == 12 and meta["status"]["error"] == 6


def test_billing_is_split_into_explained_and_unexplained(diffed):
    recs = read_diff(diffed).records.set_index("id")
    exact, split, think = recs.loc["exact"], recs.loc["split"], recs.loc["think"]
    assert (exact["billing_delta"], exact["billing_explained"], exact["billing_unexplained"]) == (0, 0, 0)
    # billed = engine + 1; the engine's extra split token is explained, the +1 is not
    assert (split["billing_delta"], split["billing_explained"], split["billing_unexplained"]) == (2, 1, 1)
    assert (split["reasoning_delta"], split["reasoning_explained"], split["reasoning_unexplained"]) == (1, 1, 0)
    # the engine lacks </think>: billed one fewer, all explained by the special-token hunk
    assert (think["billing_delta"], think["billing_explained"], think["billing_unexplained"]) == (-1, -1, 0)
    assert recs["billing_delta"].isna()["recon-only"]


def test_corrupt_parquet_is_a_clear_error(inputs, capsys):
    (inputs / "bad.parquet").write_bytes(b"PAR1 this is not parquet")
    rc = main(["diff", "--engine", str(inputs / "engine.jsonl"), "--reconstructed", str(inputs / "bad.parquet"),
               "-o", str(inputs / "d")])
    assert rc == 2
    assert "bad.parquet: not a readable parquet file" in capsys.readouterr().err
    assert not (inputs / "d" / "records.parquet").exists()


def test_parquet_without_the_contract_columns_is_refused(inputs, capsys):
    pq.write_table(pa.Table.from_pylist([{"id": "x", "text": "hi"}]), inputs / "other.parquet")
    rc = main(["diff", "--engine", str(inputs / "engine.jsonl"), "--reconstructed", str(inputs / "other.parquet"),
               "-o", str(inputs / "d")])
    assert rc == 2 and "missing columns" in capsys.readouterr().err


def test_labels_are_joined_as_expected(diffed):
    recs = read_diff(diffed).records.set_index("id")
    assert recs.loc["split", "expected"] == "bpe_split" and recs["expected"].isna().sum() == len(recs) - 1


def test_sampling_keeps_the_first_api_records_and_every_engine_line_they_may_need(tmp_path):
    from kimi_eagle.diff.run import sample_pair

    api, engine = tmp_path / "api.jsonl", tmp_path / "engine.jsonl"
    api.write_text("".join(json.dumps({"id": f"r{k}"}) + "\n" for k in range(5)) + "\n" + '{"id": "r5"}')
    write_engine(engine, [{"id": "r4", "output_ids": [1]}, {"id": "r1", "output_ids": [2]}, "{not json",
                          {"meta_info": {"id": "r0"}, "output_ids": [3]}, {"output_ids": [4]}])
    got_api, got_engine = sample_pair(api, engine, 2, tmp_path / "sample")
    assert [json.loads(ln)["id"] for ln in got_api.read_text().splitlines()] == ["r0", "r1"]
    assert got_engine.read_text().splitlines() == [json.dumps({"id": "r1", "output_ids": [2]}), "{not json",
                                                   json.dumps({"meta_info": {"id": "r0"}, "output_ids": [3]}),
                                                   json.dumps({"output_ids": [4]})]
    everything, _ = sample_pair(api, engine, None, tmp_path / "all")
    assert everything.read_bytes() == api.read_bytes().replace(b"\n\n", b"\n") + b"\n"  # blank dropped, last line ended
    assert sorted(p.name for p in (tmp_path / "sample").iterdir()) == ["api.jsonl", "engine.jsonl"]  # no temp left


def test_diff_inputs_of_api_records_alone_are_the_first_records_byte_for_byte(tmp_path, kimi):
    from kimi_eagle.diff.inputs import DiffInputOptions, resolve_diff_inputs

    api = tmp_path / "api.jsonl"
    api.write_bytes(b'{"id": "a"}\n\n{"id": "b"}\r\n{"id": "c"}\n')
    inputs = resolve_diff_inputs(DiffInputOptions(simulate=False, api_path=api, sample_size=2), kimi, tmp_path / "in")
    assert (inputs.engine, inputs.labels, inputs.data, inputs.samples) == (None, None, "real", [])
    assert inputs.api.read_bytes() == b'{"id": "a"}\n{"id": "b"}\r\n'
    everything = resolve_diff_inputs(DiffInputOptions(simulate=False, api_path=api, sample_size=None), kimi, tmp_path / "all")
    assert everything.api.read_bytes().count(b"\n") == 3


def test_diff_inputs_keep_the_engine_record_of_each_stored_response_of_a_serve_log(tmp_path, kimi):
    from kimi_eagle.diff.inputs import DiffInputOptions, resolve_diff_inputs

    api, log = tmp_path / "responses.jsonl", tmp_path / "engine.jsonl"
    write_engine(api, [{"id": "a", "status": "ok", "response": {"id": "r2"}}])
    write_engine(log, [{"id": "a", "response_id": "r1", "output_ids": [1]}, {"id": "a", "response_id": "r2", "output_ids": [2]}])
    inputs = resolve_diff_inputs(DiffInputOptions(simulate=False, api_path=api, engine_path=log, sample_size=None), kimi,
                                 tmp_path / "in")
    assert [json.loads(ln)["output_ids"] for ln in inputs.engine.read_text().splitlines()] == [[2]]
    assert (tmp_path / "in" / "engine_delivered.jsonl").is_file() and inputs.data == "real" and inputs.labels is None


def test_diff_inputs_need_api_records_unless_simulated(tmp_path, kimi):
    from kimi_eagle.diff.inputs import DiffInputOptions, resolve_diff_inputs

    with pytest.raises(ValueError, match="simulate=True"):
        resolve_diff_inputs(DiffInputOptions(simulate=False), kimi, tmp_path)
    with pytest.raises(ValueError, match="the API records the engine records belong to"):
        resolve_diff_inputs(DiffInputOptions(simulate=False, engine_path=tmp_path / "e.jsonl"), kimi, tmp_path)


def test_simulated_diff_inputs_are_labelled(tmp_path, kimi):
    from kimi_eagle.diff.inputs import DiffInputOptions, resolve_diff_inputs

    inputs = resolve_diff_inputs(DiffInputOptions(sources=["glaive"], sample_size=1), kimi, tmp_path)
    assert inputs.data == "simulated" and inputs.samples and inputs.labels.is_file() and inputs.engine.is_file()
