"""export-data's row checks and writers: the batch checks and Arrow-native writers give today's bytes on the
bundled data, the two check paths agree, and nothing is coerced (a float, bool, string or infinite ID is
``malformed`` by name; masks are 0/1 integers; ``--max-length`` >= 1)."""
from __future__ import annotations

import json
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from kimi_eagle.apps.cli import main as cli_main
from kimi_eagle.apps.interop import export_data as ed
from kimi_eagle.apps.interop.export_rows import ExportStats, RowRules, check_batch, to_training_row
from kimi_eagle.assets import kimi_dir
from kimi_eagle.eagle3 import draft_vocab as dv
from kimi_eagle.io import write_jsonl
from kimi_eagle.reconstruct.convert import convert_file
from kimi_eagle.reconstruct.job import JobOptions, reconstruct_file
from kimi_eagle.tokenize.tokenizer import load_tokenizer

SCHEMA = pa.schema([("id", pa.string()), ("status", pa.string()), ("error", pa.string()),
                    ("prompt_ids", pa.list_(pa.int32())), ("completion_ids", pa.list_(pa.int32())),
                    ("flags", pa.list_(pa.string()))])


@pytest.fixture(scope="module")
def bundled(tmp_path_factory):
    """The bundled ShareGPT and glaive conversations reconstructed (the kit's parquet), plus one row of each
    kind export-data drops, shuffled among them."""
    d = tmp_path_factory.mktemp("export")
    src = d / "in.jsonl"
    for name in ("sharegpt", "glaive"):
        convert_file(name, None, d / f"{name}.jsonl", limit=80)
    src.write_bytes((d / "sharegpt.jsonl").read_bytes() + (d / "glaive.jsonl").read_bytes())
    reconstruct_file(src, d / "rows.parquet", kimi_dir(), "kimi-k2.5", JobOptions(progress=False))
    rows = pq.read_table(d / "rows.parquet").select(SCHEMA.names).cast(SCHEMA).to_pylist()
    bad = [{"id": "err", "status": "error", "error": "x", "prompt_ids": [], "completion_ids": [], "flags": []},
           {"id": "empty", "status": "ok", "error": None, "prompt_ids": [1], "completion_ids": [], "flags": []},
           {"id": "oov", "status": "ok", "error": None, "prompt_ids": [1], "completion_ids": [5, 10**9], "flags": []},
           {"id": "neg", "status": "ok", "error": None, "prompt_ids": [-1], "completion_ids": [5], "flags": []},
           {"id": "flagged", "status": "ok", "error": None, "prompt_ids": [1], "completion_ids": [2],
            "flags": ["x", "literal_marker"]},
           {"id": None, "status": None, "error": None, "prompt_ids": None, "completion_ids": None, "flags": None},
           {"id": "ok-null-prompt", "status": "ok", "error": None, "prompt_ids": None, "completion_ids": [7], "flags": None},
           {"id": "long", "status": "ok", "error": None, "prompt_ids": [3] * 5000, "completion_ids": [4], "flags": []},
           {"id": "cut", "status": "ok", "error": None, "prompt_ids": [3] * 4000, "completion_ids": [4] * 200, "flags": []}]
    mixed = rows + bad
    random.Random(0).shuffle(mixed)
    path = d / "mixed.parquet"
    pq.write_table(pa.Table.from_pylist(mixed, schema=SCHEMA), path, row_group_size=64)
    return path


def reference_export(source, to, out, *, vocab_size, max_length, drop_flags, draft_vocab_size):
    """Today's export (before the batch checks): every record through the per-record rules, rows as Python
    lists, ``write_jsonl`` of dicts, ``pyarrow.array`` of nested lists, per-row ``torch.bincount``."""
    rows, stats = [], ExportStats()
    for index, obj, _ in ed.iter_records(source):
        stats.rows_in += 1
        row, reason, detail, truncated = to_training_row(index, obj, vocab_size=vocab_size, max_length=max_length,
                                                         drop_flags=drop_flags)
        if row is None:
            stats.drop(index, None if obj.get("id") is None else str(obj["id"]), reason, detail)
            continue
        rows.append(row)
        stats.rows_written += 1
        stats.rows_truncated += truncated
    out.mkdir(parents=True)
    counts = dv.supervised_counts(((r.input_ids, r.loss_mask) for r in rows), vocab_size)
    vocab = dv.build(counts, min(draft_vocab_size, vocab_size))
    line = lambda r: {"id": r.id, "input_ids": r.input_ids, "loss_mask": r.loss_mask}  # noqa: E731
    if to in ("tokens", "specforge"):
        write_jsonl(out / ("rows.jsonl" if to == "tokens" else "prompts.jsonl"), (line(r) for r in rows))
        if to == "specforge":
            ed.write_specforge_vocab(out, vocab)
    else:
        import datasets

        table = pa.table({"input_ids": pa.array([r.input_ids for r in rows], type=pa.list_(pa.int64())),
                          "loss_mask": pa.array([r.loss_mask for r in rows], type=pa.list_(pa.int64())),
                          "seq_len": pa.array([len(r.input_ids) for r in rows], type=pa.int64())})
        datasets.Dataset(table).with_format("torch").save_to_disk(str(out))
        write_jsonl(out / "row_ids.jsonl", ({"row": k, "id": r.id, "index": r.index} for k, r in enumerate(rows)))
        ed.write_speculators_vocab(out, vocab)
    return stats, vocab


def without_fingerprint(state: bytes) -> bytes:
    """``state.json``'s bytes with the ``_fingerprint`` value blanked (every other byte kept)."""
    obj = json.loads(state)
    assert isinstance(obj["_fingerprint"], str) and len(obj["_fingerprint"]) == 16
    return state.replace(obj["_fingerprint"].encode(), b"FINGERPRINT")


@pytest.mark.parametrize("to", ed.TARGETS)
def test_batch_checks_and_arrow_writers_give_todays_bytes(bundled, tmp_path, to):
    kw = dict(vocab_size=load_tokenizer(kimi_dir()).n_vocab, max_length=4096, drop_flags=["literal_marker"],
              draft_vocab_size=512)
    m = ed.export_data(bundled, to, tmp_path / "new", **kw)
    stats, vocab = reference_export(bundled, to, tmp_path / "ref", **kw)
    ref_files = sorted(p.name for p in (tmp_path / "ref").iterdir())
    assert ref_files == sorted(set(m["files"]) - {"manifest.json"}) or set(ref_files) <= set(m["files"])
    for name in ref_files:
        new, ref = (tmp_path / "new" / name).read_bytes(), (tmp_path / "ref" / name).read_bytes()
        if name == "state.json":  # the one field that differs: a content hash instead of datasets' pickle hash
            new, ref = without_fingerprint(new), without_fingerprint(ref)
        assert new == ref, name
    assert m["dropped"] == stats.dropped and m["rows_written"] == stats.rows_written > 100
    assert m["rows_truncated"] == stats.rows_truncated > 0 and m["draft_vocab"] == vocab.report()
    assert m["dropped_by_reason"] == stats.dropped_by_reason()
    assert set(m["dropped_by_reason"]) == {"empty_completion", "flag:literal_marker", "id_out_of_vocab",
                                           "no_supervised_tokens", "status_error"}


def random_batch(rng, n):
    def ids():
        return None if rng.random() < 0.05 else [rng.choice([-1, 0, 3, 99, 100, 2**31 - 1]) if rng.random() < 0.1
                                                 else rng.randrange(100) for _ in range(rng.randrange(0, 12))]
    rows = [{"id": None if rng.random() < 0.05 else f"r{k}",
             "status": rng.choice(["ok"] * 8 + ["error", None]), "error": rng.choice([None, "e"]),
             "prompt_ids": ids(), "completion_ids": ids(),
             "flags": rng.choice([[], ["a"], ["a", "drop"], None, ["drop", None]])} for k in range(n)]
    return pa.RecordBatch.from_pylist(rows, schema=SCHEMA)


@pytest.mark.parametrize("seed", range(6))
def test_batch_checks_agree_with_the_per_record_rules(seed):
    rng = random.Random(seed)
    batch = random_batch(rng, 300)
    rules = RowRules(vocab_size=100, max_length=rng.choice([None, 1, 5, 8]), drop_flags=("drop",))
    stats = ExportStats()
    rows = check_batch(batch, 10, rules, stats)
    expected, dropped = [], []
    for k, obj in enumerate(batch.to_pylist()):
        row, reason, detail, _ = to_training_row(10 + k, obj, vocab_size=100, max_length=rules.max_length,
                                                 drop_flags=rules.drop_flags)
        if row is None:
            dropped.append({"index": 10 + k, "id": obj["id"], "reason": reason, "detail": detail})
        else:
            expected.append(row)
    assert [rows.row(k) for k in range(len(rows))] == expected and stats.dropped == dropped
    assert stats.rows_in == 300 and stats.rows_written == len(expected)
    assert stats.supervised_tokens == sum(sum(r.loss_mask) for r in expected)


# ------------------------------------------------------------------------------------------
# nothing coerced


def one(obj, **kw):
    return to_training_row(0, obj, vocab_size=kw.get("vocab_size", 1000), max_length=kw.get("max_length"))


@pytest.mark.parametrize("obj, detail", [
    ({"prompt_ids": [1], "completion_ids": [1, 5.9, 6.5, 7.99]}, "completion_ids[1] is 5.9 (float), not an integer"),
    ({"prompt_ids": [1], "completion_ids": [5.0]}, "completion_ids[0] is 5.0 (float)"),
    ({"prompt_ids": ["6_0"], "completion_ids": [7]}, "prompt_ids[0] is '6_0' (str)"),
    ({"prompt_ids": [1], "completion_ids": ["７"]}, "completion_ids[0] is '７' (str)"),
    ({"prompt_ids": [True], "completion_ids": [1]}, "prompt_ids[0] is True (bool)"),
    ({"output_ids": [1, float("inf")]}, "output_ids[1] is inf (float)"),
    ({"completion_ids": "123"}, "completion_ids is a str, not a list"),
    ({"input_ids": [1, 2, 3], "loss_mask": [0.5, 0.9, 1]}, "loss_mask[0] is 0.5 (float)"),
    ({"input_ids": [1, 2], "loss_mask": [False, True]}, "loss_mask[0] is False (bool)"),
    ({"input_ids": [1, 2], "loss_mask": [0, 2]}, "loss_mask[1] is 2: loss_mask values must be 0 or 1"),
    ({"input_ids": [1, 2.0], "loss_mask": [0, 1]}, "input_ids[1] is 2.0 (float)"),
])
def test_ids_and_masks_that_are_not_integers_are_malformed_by_name(obj, detail):
    row, reason, got, _ = one(obj)
    assert row is None and reason == "malformed" and detail in got


def test_an_integer_beyond_the_vocabulary_is_out_of_vocab_not_a_crash():
    assert one({"completion_ids": [10**30]})[1:3] == ("id_out_of_vocab", f"id {10**30} outside [0, 1000)")


def test_jsonl_with_infinity_floats_and_bools_drops_those_rows_by_name(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join([
        '{"id": "inf", "input_ids": [1, Infinity], "loss_mask": [0, 1]}',
        '{"id": "big", "input_ids": [1, 1e400], "loss_mask": [0, 1]}',
        '{"id": "float", "prompt_ids": [1], "completion_ids": [1, 5.9, 6.5, 7.99]}',
        '{"id": "bool", "prompt_ids": [1], "output_ids": [true]}',
        '{"id": "good", "prompt_ids": [1], "completion_ids": [2, 3]}']) + "\n")
    m = ed.export_data(src, "tokens", tmp_path / "out", vocab_size=1000, draft_vocab_size=4)
    assert m["rows_written"] == 1 and m["dropped_by_reason"] == {"malformed": 4}
    assert [d["id"] for d in m["dropped"]] == ["inf", "big", "float", "bool"]
    assert "input_ids[1] is inf (float)" in m["dropped"][0]["detail"]
    assert json.loads((tmp_path / "out" / "rows.jsonl").read_text()) == {"id": "good", "input_ids": [1, 2, 3],
                                                                        "loss_mask": [0, 1, 1]}


def test_parquet_with_float_or_bool_id_columns_drops_every_row_as_malformed(tmp_path):
    for name, typ, values in (("f", pa.float64(), [1.0, 5.9]), ("b", pa.bool_(), [True, False])):
        path = tmp_path / f"{name}.parquet"
        pq.write_table(pa.table({"id": ["a"], "status": ["ok"], "prompt_ids": pa.array([[1]], pa.list_(pa.int32())),
                                 "completion_ids": pa.array([values], pa.list_(typ))}), path)
        m = ed.export_data(path, "tokens", tmp_path / name, vocab_size=1000, draft_vocab_size=4)
        assert m["rows_written"] == 0 and m["dropped"][0]["reason"] == "malformed"
        assert f"({type(values[0]).__name__}), not an integer" in m["dropped"][0]["detail"]


@pytest.mark.parametrize("value", ["-3", "0"])
def test_max_length_below_one_is_a_one_line_error(tmp_path, capsys, value):
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "prompt_ids": [1], "completion_ids": [2]}\n')
    try:  # refused by the flag's type (argparse, exit 2) or by export_data (a one-line ValueError, exit 2)
        rc = cli_main(["export-data", str(src), "--to", "tokens", "-o", str(tmp_path / "o"), "--vocab-size", "10",
                       "--max-length", value])
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2 and "--max-length" in err and ("at least 1" in err or ">= 1" in err) and "Traceback" not in err
    assert not (tmp_path / "o" / "rows.jsonl").exists()
    with pytest.raises(ValueError, match="--max-length"):
        ed.export_data(src, "tokens", tmp_path / "o", vocab_size=10, max_length=True)


def test_draft_vocab_counts_equal_the_per_row_bincount(bundled, tmp_path):
    rows, _ = ed.collect_rows(bundled, vocab_size=163840, max_length=4096)
    per_row = dv.supervised_counts(((rows.row(k).input_ids, rows.row(k).loss_mask) for k in range(len(rows))), 163840)
    got = ed.draft_vocab_for(rows, 163840, 64)
    assert torch.equal(got.counts, per_row) and np.array_equal(got.d2t.numpy(), dv.build(per_row, 64).d2t.numpy())


def test_jsonl_writer_gives_json_dumps_bytes_for_any_mask_and_id(tmp_path):
    from kimi_eagle.apps.interop.export_rows import ExportRows, TrainingRow

    rows = [TrainingRow(0, "a\u00e9\"\\", [1, 2, 3], [1, 0, 1]), TrainingRow(1, "b", [7], [1]),
            TrainingRow(2, "c", [4, 5, 6, 7], [0, 0, 1, 1]), TrainingRow(3, "d", [9, 9], [1, 0])]
    for subset in (rows, rows[1:3], rows[3:]):
        ed.write_training_jsonl(tmp_path / "new.jsonl", ExportRows.from_rows(subset), chunk_rows=2)
        write_jsonl(tmp_path / "ref.jsonl", ({"id": r.id, "input_ids": r.input_ids, "loss_mask": r.loss_mask}
                                             for r in subset))
        assert (tmp_path / "new.jsonl").read_bytes() == (tmp_path / "ref.jsonl").read_bytes()


@pytest.mark.parametrize("ids", [["a", "b\u00e9\u2028", "\U0001f600"], ["a", 'q"', "b"], ["t\tab", "n\x7f", "\\"], []])
def test_row_ids_writer_gives_json_dumps_bytes(tmp_path, ids):
    from kimi_eagle.apps.interop.export_rows import ExportRows, TrainingRow

    rows = ExportRows.from_rows([TrainingRow(10 * k + 3, i, [1], [1]) for k, i in enumerate(ids)])
    ed.write_row_ids(tmp_path / "new.jsonl", rows)
    write_jsonl(tmp_path / "ref.jsonl", ({"row": k, "id": i, "index": 10 * k + 3} for k, i in enumerate(ids)))
    assert (tmp_path / "new.jsonl").read_bytes() == (tmp_path / "ref.jsonl").read_bytes()


def test_jsonl_writer_with_empty_rows_and_ids_beyond_the_lookup_table(tmp_path):
    from kimi_eagle.apps.interop.export_rows import ExportRows, TrainingRow

    rows = [TrainingRow(0, "a", [], []), TrainingRow(1, "b", [2**40, 3], [0, 1]), TrainingRow(2, "c", [1], [1]),
            TrainingRow(3, "d", [], [])]
    small = [TrainingRow(0, "a", [], []), TrainingRow(1, "b", [0, 3], [0, 1]), TrainingRow(2, "c", [2**18 - 1], [1]),
             TrainingRow(3, "d", [], []), TrainingRow(4, "e", [5, 6, 7], [1, 0, 1])]  # the lookup path, empty rows too
    for subset in (rows, small, small[1:2]):
        ed.write_training_jsonl(tmp_path / "new.jsonl", ExportRows.from_rows(subset), chunk_rows=3)
        write_jsonl(tmp_path / "ref.jsonl", ({"id": r.id, "input_ids": r.input_ids, "loss_mask": r.loss_mask}
                                             for r in subset))
        assert (tmp_path / "new.jsonl").read_bytes() == (tmp_path / "ref.jsonl").read_bytes()


def test_speculators_fingerprint_is_a_content_hash_that_datasets_loads(bundled, tmp_path):
    import datasets

    kw = dict(vocab_size=load_tokenizer(kimi_dir()).n_vocab, draft_vocab_size=512)
    states = []
    for k, flags in enumerate(([], [], ["literal_marker"])):
        ed.export_data(bundled, "speculators", tmp_path / str(k), drop_flags=flags, **kw)
        states.append(json.loads((tmp_path / str(k) / "state.json").read_text())["_fingerprint"])
    assert states[0] == states[1] != states[2]  # the same rows: the same fingerprint; other rows: another
    ds = datasets.load_from_disk(str(tmp_path / "0"))
    assert ds.format["type"] == "torch" and len(ds) == len(ed.collect_rows(bundled, vocab_size=kw["vocab_size"])[0])
    rows, _ = ed.collect_rows(bundled, vocab_size=kw["vocab_size"])
    table = ds.with_format("arrow").data.table
    pieces = pa.Table.from_batches(table.to_batches(max_chunksize=100))  # the hash ignores chunking and slicing
    assert pieces.column("input_ids").num_chunks > 1
    assert ed.arrow_fingerprint(pieces) == ed.arrow_fingerprint(table.combine_chunks())
    assert ds[3]["input_ids"].tolist() == rows.row(3).input_ids
    other = table.set_column(2, "seq_len", pa.array(np.asarray(table.column("seq_len")) + 1))
    assert ed.arrow_fingerprint(other) != ed.arrow_fingerprint(table)


def _checked(batch, indices, rules):
    from kimi_eagle.apps.interop.export_rows import check_rows_batch

    return check_rows_batch(batch, rules, indices[0])


def test_check_rows_batch_in_datasets_map_gives_the_cli_rows_and_drops(bundled, tmp_path):
    from functools import partial

    import datasets

    from kimi_eagle.apps.interop.export_rows import check_schema

    vocab = load_tokenizer(kimi_dir()).n_vocab
    out = tmp_path / "cli"
    assert cli_main(["export-data", str(bundled), "--to", "tokens", "-o", str(out), "--vocab-size", str(vocab),
                     "--max-length", "4096", "--drop-flag", "literal_marker"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    rules = RowRules(vocab, 4096, ("literal_marker",))
    ds = datasets.Dataset(pq.read_table(bundled))
    got = ds.with_format("arrow").map(partial(_checked, rules=rules), with_indices=True, batched=True, batch_size=64,
                                      num_proc=2, remove_columns=ds.column_names,
                                      cache_file_name=str(tmp_path / "map.arrow")).data.table.cast(check_schema())
    assert got.column("index").to_pylist() == list(range(len(ds))) == list(range(manifest["rows_in"]))
    kept = got.filter(pa.compute.equal(got.column("status"), "ok"))
    lines = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert [{"id": r["id"], "input_ids": r["input_ids"], "loss_mask": r["loss_mask"]} for r in kept.to_pylist()] == lines
    dropped = got.filter(pa.compute.equal(got.column("status"), "dropped")).select(["index", "id", "reason", "detail"])
    assert dropped.to_pylist() == manifest["dropped"] and len(manifest["dropped"]) >= 6
    assert pa.compute.sum(got.column("truncated")).as_py() == manifest["rows_truncated"] > 0


def test_check_rows_batch_of_a_table_and_of_odd_shapes():
    from kimi_eagle.apps.interop.export_rows import check_rows_batch

    rules = RowRules(100, 3)
    t = pa.Table.from_batches(pa.table({"input_ids": [[1, 2, 3, 4], [5, 500], [7]],
                                        "loss_mask": [[0, 1, 1, 1], [1, 1], [0]]}).to_batches(max_chunksize=1))
    got = check_rows_batch(t, rules, index0=10).to_pylist()
    assert [(r["index"], r["id"], r["status"], r["reason"], r["truncated"]) for r in got] == [
        (10, "10", "ok", None, True), (11, None, "dropped", "id_out_of_vocab", False),  # a drop's id: the record's
        (12, None, "dropped", "empty_completion", False)]
    assert got[0]["input_ids"] == [1, 2, 3] and got[0]["loss_mask"] == [0, 1, 1] and got[1]["input_ids"] is None
    empty = check_rows_batch(pa.table({"completion_ids": pa.array([], pa.list_(pa.int32()))}), rules)
    assert empty.num_rows == 0 and empty.schema.names[:3] == ["index", "id", "status"]
