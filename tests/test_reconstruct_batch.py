"""``reconstruct_batch``: Arrow batches of raw JSONL lines -> the rows ``kimi-eagle reconstruct`` writes,
also from ``datasets.Dataset.map(batched=True, num_proc=2)``."""
from __future__ import annotations

import json
import subprocess
import sys
from functools import partial

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kimi_eagle.assets import kimi_dir
from kimi_eagle.reconstruct.batch import BatchOptions, batch_lines, reconstruct_batch
from kimi_eagle.reconstruct.convert import convert_file
from kimi_eagle.reconstruct.job import mark_duplicates


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """Bundled conversations (ShareGPT, glaive) with bad lines among them: not JSON, two values on a line,
    a blank line, a duplicate id, a record without choices."""
    d = tmp_path_factory.mktemp("batch")
    lines = []
    for name in ("sharegpt", "glaive"):
        convert_file(name, None, d / f"{name}.jsonl", limit=60)
        lines += (d / f"{name}.jsonl").read_bytes().splitlines()
    dup = lines[3]
    lines[10:10] = [b"{not json", b'{"id": "a"} {"id": "b"}', b"   ", dup,
                    json.dumps({"id": "no-choices", "request": {"messages": []}, "response": {}}).encode()]
    path = d / "in.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


@pytest.fixture(scope="module")
def cli_rows(records, tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "out.parquet"
    done = subprocess.run([sys.executable, "-m", "kimi_eagle", "reconstruct", str(records), "-o", str(out),
                           "--tokenizer", str(kimi_dir()), "--no-progress"], capture_output=True, text=True)
    assert done.returncode in (0, 1), done.stderr  # 1: some records are errors (on purpose)
    return pq.read_table(out)


def text_table(path) -> pa.Table:
    lines = path.read_text(encoding="utf-8").split("\n")[:-1]
    return pa.table({"text": lines, "line": list(range(1, len(lines) + 1))})


def test_datasets_map_with_two_processes_gives_the_cli_rows(records, cli_rows, tmp_path):
    import datasets

    ds = datasets.Dataset(text_table(records))
    fn = partial(reconstruct_batch, options=BatchOptions(str(kimi_dir())))
    out = ds.with_format("arrow").map(fn, batched=True, batch_size=32, num_proc=2, remove_columns=ds.column_names,
                                      cache_file_name=str(tmp_path / "map.arrow"))
    got = mark_duplicates(out.data.table.cast(cli_rows.schema), {})  # duplicates are a property of the whole file
    assert got.to_pylist() == cli_rows.to_pylist()
    statuses = cli_rows.column("status").to_pylist()
    assert statuses.count("error") == 5 and len(statuses) == sum(1 for b in records.read_bytes().splitlines() if b.strip()) + 1


def test_a_record_batch_and_a_table_give_the_same_rows(records, cli_rows):
    table = text_table(records)
    options = BatchOptions(str(kimi_dir()))
    pieces = [reconstruct_batch(b, options) for b in table.to_batches(max_chunksize=50)]
    whole = reconstruct_batch(table, options)
    assert pa.concat_tables(pieces).equals(whole)
    assert mark_duplicates(whole, {}).to_pylist() == cli_rows.to_pylist()


def test_binary_lines_default_numbers_and_a_missing_column():
    t = pa.table({"text": pa.array([b"\xef\xbb\xbf{\"id\": 1}", b"", b"x"], pa.binary())})
    assert batch_lines(t) == [(1, b'{"id": 1}'), (3, b"x")]
    with pytest.raises(ValueError, match="no 'text' column"):
        reconstruct_batch(pa.table({"line": [1]}), BatchOptions(str(kimi_dir())))
