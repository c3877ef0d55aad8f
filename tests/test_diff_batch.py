"""``diff_batch``: Arrow batches of reconstructed rows joined with engine records -> the records rows
``kimi-eagle diff`` writes, also from ``datasets.Dataset.map(batched=True, num_proc=2)``."""
from __future__ import annotations

import json
from functools import partial

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kimi_eagle.apps.cli import main
from kimi_eagle.assets import kimi_dir
from kimi_eagle.diff.batch import DiffBatchOptions, diff_batch
from kimi_eagle.diff.run import RECORD_SCHEMA
from kimi_eagle.diff.simulate import load_source_records, simulate_samples, write_samples
from kimi_eagle.reconstruct.job import JobOptions, reconstruct_file


@pytest.fixture(scope="module")
def inputs(kimi, tmp_path_factory):
    """A labelled simulated benchmark (every effect, bundled glaive records), reconstructed, with an engine file
    that also lacks one id, holds an engine-only record, one with an ID outside the vocabulary and one empty."""
    d = tmp_path_factory.mktemp("diff-batch")
    paths = write_samples(simulate_samples(load_source_records(["glaive"]), kimi, per_effect=2, seed=5), d)
    reconstruct_file(paths["api"], d / "recon.parquet", kimi_dir(), "kimi-k2.5", JobOptions(progress=False))
    engine = [json.loads(line) for line in paths["engine"].read_text().splitlines()]
    engine = engine[1:]  # the first id has no engine record: missing_engine
    engine[2]["output_ids"] = engine[2]["output_ids"][:3] + [kimi.n_vocab + 5]
    engine[4]["output_ids"] = []
    engine.append({"id": "engine-only", "output_ids": [1, 2, 3], "finish_reason": "stop"})
    (d / "engine.jsonl").write_text("".join(json.dumps(e) + "\n" for e in engine))
    return d, paths["labels"], engine


@pytest.fixture(scope="module")
def cli_records(inputs):
    d, labels, _ = inputs
    assert main(["diff", "--engine", str(d / "engine.jsonl"), "--reconstructed", str(d / "recon.parquet"),
                 "-o", str(d / "diff"), "--labels", str(labels)]) in (0, 1)
    return pq.read_table(d / "diff" / "records.parquet")


def joined(inputs) -> pa.Table:
    """The reconstructed rows left-joined with the engine records by id (engine columns, line numbers and the
    expected label), then the engine-only records with a null status."""
    d, labels, engine = inputs
    recon = pq.read_table(d / "recon.parquet").to_pylist()
    expected = dict(zip(*pq.read_table(labels).select(["id", "expected"]).to_pydict().values()))
    by_id = {e["id"]: (k + 1, e) for k, e in enumerate(engine)}
    rows = []
    for r in recon + [{"id": e["id"], "status": None} for e in engine if e["id"] not in {x["id"] for x in recon}]:
        line, e = by_id.get(r["id"], (None, {}))
        rows.append({**r, "engine_output_ids": e.get("output_ids"), "engine_prompt_ids": e.get("prompt_ids"),
                     "engine_finish_reason": e.get("finish_reason"), "engine_line": line,
                     "expected": expected.get(r["id"])})
    return pa.Table.from_pylist(rows)


def test_datasets_map_with_two_processes_gives_the_cli_records(inputs, cli_records, tmp_path):
    import datasets

    ds = datasets.Dataset(joined(inputs))
    fn = partial(diff_batch, options=DiffBatchOptions(str(kimi_dir())))
    out = ds.with_format("arrow").map(fn, batched=True, batch_size=7, num_proc=2, remove_columns=ds.column_names,
                                      cache_file_name=str(tmp_path / "map.arrow"))
    got = out.data.table.cast(RECORD_SCHEMA).to_pylist()
    assert got == cli_records.to_pylist()
    statuses = {r["status"] for r in got}
    assert statuses == {"ok", "error", "missing_engine", "missing_api"}
    assert {r["label"] for r in got if r["status"] == "ok"} >= {"exact", "bpe_split", "special_token"}
    assert sum(r["expected"] is not None for r in got) > 10


def test_a_record_batch_and_a_table_give_the_same_rows(inputs, cli_records):
    table = joined(inputs)
    options = DiffBatchOptions(str(kimi_dir()))
    whole = diff_batch(table, options)
    assert whole.schema == RECORD_SCHEMA and whole.to_pylist() == cli_records.to_pylist()
    pieces = [diff_batch(b, options) for b in table.to_batches(max_chunksize=5)]
    assert sorted(pa.concat_tables(pieces).to_pylist(), key=str) == sorted(whole.to_pylist(), key=str)


def test_default_engine_lines_and_a_missing_column(kimi):
    t = pa.table({"id": ["a", "b"], "status": [None, None],
                  "engine_output_ids": pa.array([[kimi.n_vocab], [1, None]], pa.list_(pa.int64()))})
    first, second = diff_batch(t, DiffBatchOptions(str(kimi_dir()))).to_pylist()
    assert first["status"] == "error" and "outside the vocabulary" in first["error"] and first["engine_line"] == 1
    assert second["status"] == "error" and second["error"].startswith("engine line 2: ") and second["engine_line"] == 2
    with pytest.raises(ValueError, match="'engine_output_ids'"):
        diff_batch(pa.table({"id": ["a"]}), DiffBatchOptions(str(kimi_dir())))
