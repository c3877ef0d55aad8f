"""``reconstruct_batch`` inside Ray Data on a local Ray (2 CPUs): the rows equal ``kimi-eagle reconstruct``'s
on the same file, error rows included; ``read_json`` is shown refusing that file (why the kit reads raw lines).

The JSONL is read as whole files (``read_binary_files``) and cut into numbered raw lines by the kit's own
splitter (:func:`kimi_eagle.reconstruct.batch.file_lines`), so line numbers and undecodable bytes reach the batch
function as the CLI sees them. Skipped when Ray is not installed (``pip install -e '.[scale]'``)."""
from __future__ import annotations

import json
import shutil
import sys
import tempfile

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from kimi_eagle.apps.cli import main
from kimi_eagle.assets import kimi_dir
from kimi_eagle.reconstruct.batch import BatchOptions, file_lines, reconstruct_batch
from kimi_eagle.reconstruct.convert import convert_file
from kimi_eagle.reconstruct.job import mark_duplicates

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.scale, pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.*")]  # Ray's own DataContext


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """The JSONL path and its count of good records: bundled conversations (one with a CRLF ending) with bad
    lines among them: not JSON, invalid UTF-8, two values on a line, a blank line, a duplicate id, a record
    without choices (six error rows)."""
    d = tmp_path_factory.mktemp("ray")
    lines = []
    for name in ("sharegpt", "glaive"):
        convert_file(name, None, d / f"{name}.jsonl", limit=12)
        lines += (d / f"{name}.jsonl").read_bytes().splitlines()
    good = len(lines)
    lines[4] += b"\r"
    lines[7:7] = [b"{not json", b'{"id": "utf8", "x": "\xff"}', b'{"id": "a"} {"id": "b"}', b"", lines[2],
                  json.dumps({"id": "no-choices", "request": {"messages": []}, "response": {}}).encode()]
    path = d / "in.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path, good


@pytest.fixture(scope="module")
def cli_rows(records, tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "out.parquet"
    code = main(["reconstruct", str(records[0]), "-o", str(out), "--tokenizer", str(kimi_dir()), "--no-progress"])
    assert code in (0, 1)  # 1: some records are errors (on purpose)
    return pq.read_table(out)


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray of 2 CPUs and a 150 MB object store, bound to 127.0.0.1, no dashboard, no usage stats; its
    session files in a short temporary folder (Ray's socket paths must stay under ~107 characters)."""
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(num_cpus=2, object_store_memory=150 * 2**20, include_dashboard=False, _temp_dir=temp,
                 _node_ip_address="127.0.0.1", log_to_driver=False)
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test module
        ray.data.DataContext.get_current().enable_progress_bars = False
        try:
            yield ray
        finally:
            ray.shutdown()
            shutil.rmtree(temp, ignore_errors=True)


def test_ray_map_batches_gives_the_cli_rows(local_ray, records, cli_rows, tmp_path):
    lines = local_ray.data.read_binary_files(str(records[0])).map_batches(file_lines, batch_format="pyarrow")
    rows = lines.repartition(4).map_batches(reconstruct_batch, fn_kwargs={"options": BatchOptions(str(kimi_dir()))},
                             batch_format="pyarrow", batch_size=8)
    rows.write_parquet(str(tmp_path / "rows"))
    got = pq.read_table(tmp_path / "rows")
    got = got.take(pc.sort_indices(got, [("line", "ascending")]))  # stable: values of one line keep their order
    got = mark_duplicates(got, {})  # duplicates are a property of the whole file
    assert got.schema == cli_rows.schema
    assert got.to_pylist() == cli_rows.to_pylist()
    statuses = cli_rows.column("status").to_pylist()
    assert statuses.count("error") == 6 and statuses.count("ok") == records[1]


def test_read_json_refuses_the_file_the_cli_reports_on(local_ray, records):
    """One non-JSON line fails the whole ``read_json`` read, where the CLI gives that line an error row."""
    with pytest.raises(Exception, match="JSONDecodeError|JSON"):
        local_ray.data.read_json(str(records[0])).take_all()
