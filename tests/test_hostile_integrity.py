"""Hostile input for integrity, NaN and locks (issue 37): every planted case is refused by name in one line (exit 2,
no traceback), redone, or given a row with its status and reason; nothing is trusted without its recorded hash.

Classes planted (each parametrized case is one kind; ``KINDS`` counts them for docs/results.md):
corrupt safetensors headers and shards in ``train``; edited shards and manifests (train and ``extract --resume``);
NaN/Inf hidden states and a NaN loss; edited ``reconstruct --resume`` shards; locks on ``train``, ``extract``,
``export-data``, ``diff`` and ``report`` outputs; rows of ``reconstruct_batch`` that are not one line; logprob
entries whose text contradicts their bytes; records without ``completion_ids``; ``evaluate`` past the context.
The hidden states, target and tokenizer are real (stories260K, the Kimi tokenizer).
"""
from __future__ import annotations

import hashlib
import json
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file, save_file

from kimi_eagle.apps.cli import main
from kimi_eagle.assets import kimi_dir, stories_dir
from kimi_eagle.eagle3.extract import extract
from kimi_eagle.eagle3.hidden import Row
from kimi_eagle.eagle3.readers import CorruptFile, HiddenStates, check_safetensors
from kimi_eagle.reconstruct.job import output_lock

TARGET = str(stories_dir())
TRAIN = ["--steps", "2", "--ttt-steps", "2", "--batch-size", "2", "--draft-vocab-size", "64", "--no-progress"]
ROWS = [Row(f"r{i}", [1, 50 + i, 60, 70, 80, 90, 100, 110, 120, 130], [0, 0, 0, 1, 1, 1, 1, 1, 1, 1]) for i in range(4)]
SHARD = "shard-00000.safetensors"


@pytest.fixture(scope="module")
def hs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hs") / "hs"
    extract(TARGET, ROWS, out, dtype="bf16", shard_rows=2)
    return out


def run_cli(argv, capsys) -> tuple[int, str]:
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    return rc, err.splitlines()[-1] if err else ""


def copy_hs(hs: Path, tmp_path: Path) -> Path:
    d = tmp_path / "hs"
    shutil.copytree(hs, d)
    return d


def rehash(d: Path) -> None:
    """Record the shards' current bytes in the manifest: a planted file that also fools the hash check."""
    m = json.loads((d / "manifest.json").read_text())
    for s in m["shards"]:
        data = (d / s["file"]).read_bytes()
        s["sha256"], s["bytes"] = hashlib.sha256(data).hexdigest(), len(data)
    (d / "manifest.json").write_text(json.dumps(m))


def split(path: Path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8 + n:]


def join(path: Path, header: dict, body: bytes) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + body)


def edit_header(fn):
    def plant(path: Path) -> None:
        header, body = split(path)
        fn(header)
        join(path, header, body)
    return plant


def _swap(h: dict, a: str, b: str) -> None:
    h[a]["data_offsets"], h[b]["data_offsets"] = h[b]["data_offsets"], h[a]["data_offsets"]


def _overlap(h: dict) -> None:
    h["final"]["data_offsets"] = [h["aux"]["data_offsets"][0], h["aux"]["data_offsets"][0]
                                  + h["final"]["data_offsets"][1] - h["final"]["data_offsets"][0]]


HEADERS = {  # the planted shard -> words of its one-line refusal
    "length_prefix_huge": (lambda p: p.write_bytes(b"\xff" * 8 + p.read_bytes()[8:]), "header length"),
    "length_prefix_past_eof": (lambda p: p.write_bytes(struct.pack("<Q", p.stat().st_size) + p.read_bytes()[8:]),
                               "past the end"),
    "shorter_than_a_prefix": (lambda p: p.write_bytes(b"\x01\x02"), "no 8-byte header length"),
    "header_not_json": (lambda p: p.write_bytes(struct.pack("<Q", 6) + b"{nope}" + b"\0" * 64), "not JSON"),
    "header_a_list": (lambda p: p.write_bytes(struct.pack("<Q", 2) + b"[]"), "not a JSON object"),
    "unknown_dtype": (edit_header(lambda h: h["aux"].update(dtype="Q9")), "unknown dtype"),
    "shape_bigger_than_its_bytes": (edit_header(lambda h: h["aux"].update(shape=[999, 3])), "needs"),
    "shape_not_sizes": (edit_header(lambda h: h["aux"].update(shape=[-1, 3])), "not a list of sizes"),
    "offsets_overlap": (edit_header(_overlap), "overlapping"),
    "offsets_past_the_data": (edit_header(lambda h: h["offsets"].update(data_offsets=[10 ** 9, 10 ** 9 + 40])),
                              "run past"),
    "offsets_not_a_pair": (edit_header(lambda h: h["aux"].update(data_offsets=[0])), "not [start, end]"),
    "offsets_swapped_between_dtypes": (edit_header(lambda h: _swap(h, "input_ids", "loss_mask")), "needs"),
    "truncated_shard": (lambda p: p.write_bytes(p.read_bytes()[:-100]), "run past"),
    "trailing_bytes": (lambda p: p.write_bytes(p.read_bytes() + b"\0" * 16), "cover"),
}


@pytest.mark.parametrize("case", sorted(HEADERS))
def test_train_refuses_a_corrupt_safetensors_shard_in_one_line(hs, tmp_path, case, capsys):
    d = copy_hs(hs, tmp_path)
    plant, words = HEADERS[case]
    plant(d / SHARD)
    rehash(d)  # the hash agrees: the header check alone must catch it
    with pytest.raises(CorruptFile, match=words):
        check_safetensors(d / SHARD)
    rc, last = run_cli(["train", d, "--target", TARGET, "-o", tmp_path / "run", *TRAIN], capsys)
    assert rc == 2 and SHARD in last and words in last, last
    assert not (tmp_path / "run" / "drafter").exists()


def _tensors(d: Path) -> dict:
    return load_file(str(d / SHARD))


def _resave(d: Path, tensors: dict) -> None:
    save_file(tensors, str(d / SHARD), metadata={"format": "kimi-eagle-hidden/1"})


def _valid_but(fn):
    def plant(d: Path) -> None:
        t = _tensors(d)
        fn(t)
        _resave(d, t)
        rehash(d)
    return plant


def _manifest(fn):
    def plant(d: Path) -> None:
        m = json.loads((d / "manifest.json").read_text())
        fn(m)
        (d / "manifest.json").write_text(json.dumps(m))
    return plant


def _older_kit(d: Path) -> None:
    """The shards as an older kit wrote them: without the ``layer_ids`` tensor."""
    for p in d.glob("shard-*.safetensors"):
        t = load_file(str(p))
        t.pop("layer_ids")
        save_file(t, str(p), metadata={"format": "kimi-eagle-hidden/1"})
    rehash(d)


SHARDS = {  # valid safetensors or an edited manifest that still cannot be the extraction -> words of the refusal
    "shard_edited_same_size": (lambda d: (d / SHARD).write_bytes((d / SHARD).read_bytes()[:-2] + b"\x7f\x7f"),
                               "differ from the sha256"),
    "aux_in_another_dtype": (_valid_but(lambda t: t.update(aux=t["aux"].float())), "tensor 'aux'"),
    "final_missing": (_valid_but(lambda t: t.pop("final")), "tensor 'final' is missing"),
    "offsets_going_back": (_valid_but(lambda t: t.update(offsets=torch.tensor([0, 25, 20]))), "row offsets"),
    "shard_file_missing": (lambda d: (d / SHARD).unlink(), "missing"),
    "manifest_not_json": (lambda d: (d / "manifest.json").write_text('{"format": "kimi-eagle-hidden/1", '), "not JSON"),
    "manifest_path_outside": (_manifest(lambda m: m["shards"][0].update(file="../../etc/passwd")),
                              "shard-NNNNN.safetensors"),
    "manifest_layer_ids_edited": (_manifest(lambda m: m.update(layer_ids=[0, 1, 2])), "edited manifest"),
    "manifest_layer_ids_past_the_target_old_shards": (  # shards of an older kit: no layer ids in their metadata
        lambda d: (_older_kit(d), _manifest(lambda m: m.update(layer_ids=[1, 2, 40]))(d)), "block indices"),
    "manifest_layer_ids_not_ints": (_manifest(lambda m: m.update(layer_ids=["1", 2, 3])), "not block indices"),
    "manifest_hidden_size_edited": (_manifest(lambda m: m.update(hidden_size=32)), "hidden_size"),
    "manifest_dtype_unknown": (_manifest(lambda m: m.update(dtype="int4")), "dtype"),
}


@pytest.mark.parametrize("case", sorted(SHARDS))
def test_train_refuses_a_changed_shard_or_manifest_by_name(hs, tmp_path, case, capsys):
    d = copy_hs(hs, tmp_path)
    plant, words = SHARDS[case]
    plant(d)
    rc, last = run_cli(["train", d, "--target", TARGET, "-o", tmp_path / "run", *TRAIN], capsys)
    assert rc == 2 and words in last, last
    assert not (tmp_path / "run" / "drafter").exists()


def test_the_shard_remembers_the_layer_ids_it_was_extracted_with(hs):
    assert load_file(str(hs / SHARD))["layer_ids"].tolist() == HiddenStates(hs).manifest["layer_ids"] == [1, 2, 3]


# ---- NaN / Inf ----

def _poison(name: str, value: float):
    def plant(d: Path) -> None:
        t = _tensors(d)
        t[name][12, 5] = value  # row r1 (tokens 10..19 of shard 0)
        _resave(d, t)
        rehash(d)
    return plant


NONFINITE = {"nan_in_aux": ("aux", float("nan"), "1 NaN"), "inf_in_final": ("final", float("inf"), "1 Inf"),
             "minus_inf_in_aux": ("aux", float("-inf"), "1 Inf")}


@pytest.mark.parametrize("case", sorted(NONFINITE))
def test_train_refuses_nonfinite_hidden_states_naming_file_row_and_tensor(hs, tmp_path, case, capsys):
    d = copy_hs(hs, tmp_path)
    name, value, count = NONFINITE[case]
    _poison(name, value)(d)
    rc, last = run_cli(["train", d, "--target", TARGET, "-o", tmp_path / "run", *TRAIN], capsys)
    assert rc == 2 and SHARD in last and "row 'r1'" in last and f"tensor {name!r}" in last and count in last, last
    assert not (tmp_path / "run").exists()  # refused before the run folder is made


def test_a_nan_loss_stops_the_run_and_saves_no_drafter(hs, tmp_path, capsys):
    """A target whose LM head holds one Inf: every soft target is NaN, so the first loss is; the run stops there."""
    target = tmp_path / "target"
    shutil.copytree(TARGET, target)
    weights = load_file(str(target / "model.safetensors"))
    weights["lm_head.weight"][70, 3] = float("inf")
    save_file(weights, str(target / "model.safetensors"), metadata={"format": "pt"})
    rc, last = run_cli(["train", hs, "--target", target, "-o", tmp_path / "run", *TRAIN], capsys)
    assert rc == 2 and "step 1: the loss is nan" in last and "no drafter saved" in last, last
    assert not (tmp_path / "run" / "drafter").exists() and not (tmp_path / "run" / "train_metrics.json").exists()


# ---- extract --resume ----

def _first_manifest(d: Path) -> dict:
    return json.loads((d / "manifest.json").read_text())


RESUMES = {
    "truncated_finished_shard": lambda d: (d / SHARD).write_bytes((d / SHARD).read_bytes()[:-64]),
    "edited_finished_shard_same_size": lambda d: (d / SHARD).write_bytes((d / SHARD).read_bytes()[:-2] + b"\0\0"),
    "emptied_finished_shard": lambda d: (d / SHARD).write_bytes(b""),
}


@pytest.mark.parametrize("case", sorted(RESUMES))
def test_extract_resume_redoes_a_shard_whose_bytes_changed(hs, tmp_path, case):
    d = copy_hs(hs, tmp_path)
    RESUMES[case](d)
    with pytest.warns(UserWarning, match="extracting it again"):
        m = extract(TARGET, ROWS, d, dtype="bf16", shard_rows=2)
    assert m["redone"] == [{"file": SHARD, "reason": "its bytes differ from the sha256 the manifest recorded; extracted again"}]
    assert (d / SHARD).read_bytes() == (hs / SHARD).read_bytes()  # redone: identical to the first extraction
    assert HiddenStates(d).row_ids == ["r0", "r1", "r2", "r3"]


REFUSED_RESUMES = {
    "manifest_not_json": (lambda d: (d / "manifest.json").write_text("{"), "not JSON"),
    "manifest_shards_not_a_list": (_manifest(lambda m: m.update(shards="all")), "no list of shard entries"),
    "manifest_layer_ids_edited": (_manifest(lambda m: m.update(layer_ids=[0, 1, 2])), "different layer_ids"),
}


@pytest.mark.parametrize("case", sorted(REFUSED_RESUMES))
def test_extract_resume_refuses_an_edited_manifest_by_name(hs, tmp_path, case, capsys):
    d = copy_hs(hs, tmp_path)
    plant, words = REFUSED_RESUMES[case]
    plant(d)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"id": r.id, "input_ids": r.input_ids, "loss_mask": r.loss_mask}) + "\n" for r in ROWS))
    rc, last = run_cli(["extract", rows, "--target", TARGET, "-o", d, "--shard-rows", "2"], capsys)
    assert rc == 2 and words in last, last


@pytest.mark.parametrize("layout", ["speculators", "specforge"])
def test_extract_resume_redoes_a_torn_trainer_layout_file(tmp_path, layout):
    from kimi_eagle.eagle3.layouts import specforge_path, speculators_path

    out = tmp_path / layout
    extract(TARGET, ROWS, out, layout=layout, dtype="bf16")
    path = (speculators_path if layout == "speculators" else specforge_path)(out, 1)
    good = path.read_bytes()
    path.write_bytes(good[: len(good) // 2])
    with pytest.warns(UserWarning, match="extracting it again"):
        m = extract(TARGET, ROWS, out, layout=layout, dtype="bf16")
    assert [r["file"] for r in m["redone"]] == [path.name] and m["rows_written"] == 4
    if layout == "speculators":
        assert path.read_bytes() == good
    else:
        assert torch.equal(torch.load(path, weights_only=True)["aux_hidden_state"],
                           torch.load(__import__("io").BytesIO(good), weights_only=True)["aux_hidden_state"])


# ---- reconstruct --resume ----

@pytest.fixture(scope="module")
def api_records(tmp_path_factory) -> Path:
    from kimi_eagle.reconstruct.convert import convert_file

    d = tmp_path_factory.mktemp("recon")
    convert_file("sharegpt", None, d / "in.jsonl", limit=40)
    return d / "in.jsonl"


def _drop_rows(p: Path) -> None:
    t = pa.ipc.open_file(pa.BufferReader(p.read_bytes())).read_all()
    with pa.OSFile(str(p), "wb") as sink, pa.ipc.new_file(sink, t.schema) as w:
        w.write_table(t.slice(0, t.num_rows - 5))  # a valid Arrow file: 5 records gone


RECON = {"shard_with_5_rows_removed": _drop_rows,
         "truncated_shard": lambda p: p.write_bytes(p.read_bytes()[:-40]),
         "shard_without_its_sum": lambda p: p.with_name(p.name + ".xxh3").unlink()}


@pytest.mark.parametrize("case", sorted(RECON))
def test_reconstruct_resume_redoes_an_edited_shard(api_records, tmp_path, case, capsys):
    from kimi_eagle.reconstruct import job

    tok, size = str(kimi_dir()), 10
    fresh = tmp_path / "fresh.parquet"
    job.reconstruct_file(api_records, fresh, tok, "kimi-k2.5", job.JobOptions(shard_size=size, progress=False))
    table = pq.read_table(fresh)
    out, parts = tmp_path / "out.parquet", tmp_path / "out.parquet.parts"
    parts.mkdir()  # what an interrupted run leaves: its manifest and every finished shard, no output yet
    _, _, digest = job._shard_starts(api_records, size)
    (parts / "manifest.json").write_text(json.dumps(job._manifest(api_records, digest, tok, "kimi-k2.5",
                                                                  job.JobOptions(shard_size=size)), indent=1))
    for k in range((table.num_rows + size - 1) // size):
        job.write_shard(table.slice(k * size, size), parts / job.shard_name(k))
    RECON[case](parts / job.shard_name(1))
    job.reconstruct_file(api_records, out, tok, "kimi-k2.5", job.JobOptions(shard_size=size, resume=True, progress=False))
    assert "shard-000001.arrow is not the shard that was written" in capsys.readouterr().err
    assert pq.read_table(out).to_pylist() == table.to_pylist()  # nothing lost, nothing trusted


# ---- locks ----

def _rows_file(tmp_path: Path) -> Path:
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"id": r.id, "prompt_ids": r.input_ids[:3], "completion_ids": r.input_ids[3:]})
                            + "\n" for r in ROWS))
    return rows


def _diff_inputs(tmp_path: Path) -> list:
    sys.path.insert(0, str(Path(__file__).parent))
    from helpers import build, recon_row, turn, write_engine

    from kimi_eagle.tokenize.tokenizer import load_tokenizer

    ids, segs = build(load_tokenizer(kimi_dir()), turn())
    pq.write_table(pa.Table.from_pylist([recon_row("a", ids, segs, billed=len(ids))]), tmp_path / "recon.parquet")
    write_engine(tmp_path / "engine.jsonl", [{"id": "a", "output_ids": ids}])
    return ["diff", "--engine", tmp_path / "engine.jsonl", "--reconstructed", tmp_path / "recon.parquet"]


def _report_inputs(tmp_path: Path) -> list:
    assert main([str(a) for a in _diff_inputs(tmp_path) + ["-o", tmp_path / "d"]]) == 0
    return ["report", tmp_path / "d"]


LOCKED = {
    "train": lambda t, hs: ["train", hs, "--target", TARGET, *TRAIN],
    "extract": lambda t, hs: ["extract", _rows_file(t), "--target", TARGET],
    "export-data": lambda t, hs: ["export-data", _rows_file(t), "--to", "tokens", "--vocab-size", "512"],
    "diff": lambda t, hs: _diff_inputs(t),
    "report": lambda t, hs: _report_inputs(t),
}


@pytest.mark.parametrize("command", sorted(LOCKED))
def test_a_second_run_on_a_locked_output_is_refused_in_one_line(hs, tmp_path, command, capsys):
    argv = LOCKED[command](tmp_path, hs)
    out = tmp_path / "out"
    with output_lock(out):  # the lock another run of any locking command holds
        rc, last = run_cli([*argv, "-o", out], capsys)
    assert rc == 2 and "is being written by another run" in last, last
    assert not out.exists() or not any(out.iterdir())
    rc, _ = run_cli([*argv, "-o", out], capsys)  # released: the same command now runs
    assert rc == 0 and not (tmp_path / ".out.lock").exists()


def test_two_train_processes_in_one_folder_do_not_interleave(hs, tmp_path):
    out = tmp_path / "run"
    # 1,500 steps (about 7 s of training after a 2-3 s start): the second process, which takes as long to start,
    # must find the first one still running (at 150 steps a loaded machine let the first finish first)
    cmd = [sys.executable, "-m", "kimi_eagle", "train", str(hs), "--target", TARGET, "-o", str(out), "--steps", "1500",
           "--ttt-steps", "2", "--batch-size", "2", "--draft-vocab-size", "64", "--no-progress"]
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / ".run.lock").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        second = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    finally:
        _, err = first.communicate(timeout=600)
    assert second.returncode == 2 and "Traceback" not in second.stderr
    assert second.stderr.strip().splitlines()[-1].endswith("wait for it or choose another output")
    assert first.returncode == 0, err
    steps = [json.loads(x)["step"] for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) and steps[-1] == 1500  # one run's log, in order


# ---- reconstruct_batch: rows that are not one line ----

GOOD = [json.dumps({"id": rid, "request": {"messages": [{"role": "user", "content": "hi"}]},
                   "response": {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello."},
                                             "finish_reason": "stop"}]}}) for rid in ("before", "after")]
BATCH_ROWS = {  # text column, line column -> the words of row 2's reason (every row gets a row of its own)
    "null_line": ([GOOD[0], '{"id": "x"}', GOOD[1]], pa.array([1, None, 9]), "line 'None' (NoneType)"),
    "negative_line": ([GOOD[0], '{"id": "x"}', GOOD[1]], pa.array([1, -4, 9]), "line '-4' (int)"),
    "zero_line": ([GOOD[0], '{"id": "x"}', GOOD[1]], pa.array([1, 0, 9]), "line '0' (int)"),
    "string_lines": ([GOOD[0], '{"id": "x"}', GOOD[1]], pa.array(["1", "3", "9"]), "line '3' (str)"),
    "float_lines": ([GOOD[0], '{"id": "x"}', GOOD[1]], pa.array([1.0, 2.5, 9.0]), "line '2.5' (float)"),
    "bool_lines": ([GOOD[0], '{"id": "x"}', GOOD[1]], pa.array([False, True, False]), "line 'True' (bool)"),
    "null_text": (pa.array([GOOD[0], None, GOOD[1]]), pa.array([1, 7, 9]), "text is null"),
    "int_text": (pa.array([5, 6, 7]), pa.array([1, 7, 9]), "text is int"),
    "list_text": (pa.array([[1], [2], [3]]), pa.array([1, 7, 9]), "text is list"),
    "two_records_lf": ([GOOD[0], '{"id": "a"}\n{"id": "b"}', GOOD[1]], pa.array([1, 7, 9]), "holds 2 lines"),
    "two_records_lone_cr": ([GOOD[0], '{"id": "a"}\r{"id": "b"}', GOOD[1]], pa.array([1, 7, 9]), "holds 2 lines"),
    "three_records_crlf": ([GOOD[0], '{"id": "a"}\r\n{"id": "b"}\r\n{"id": "c"}', GOOD[1]], pa.array([1, 7, 9]),
                           "holds 3 lines"),
}


@pytest.mark.parametrize("case", sorted(BATCH_ROWS))
def test_reconstruct_batch_gives_a_row_that_is_not_one_line_an_error_row(case):
    from kimi_eagle.reconstruct.batch import BatchOptions, reconstruct_batch

    texts, lines, words = BATCH_ROWS[case]
    rows = reconstruct_batch(pa.table({"text": texts, "line": lines}), BatchOptions(str(kimi_dir()))).to_pylist()
    assert len(rows) == 3 and all(r["status"] == "ok" or r["error"] for r in rows)  # one row each, none dropped
    assert rows[1]["status"] == "error" and words in rows[1]["error"], rows[1]["error"]
    if isinstance(texts, list) and lines.type == pa.int64():  # the rows beside it are untouched
        assert [r["status"] for r in (rows[0], rows[2])] == ["ok", "ok"] and [rows[0]["line"], rows[2]["line"]] == [1, 9]
        assert rows[1]["line"] == (None if lines[1].as_py() is None or lines[1].as_py() < 1 else 7)


def test_reconstruct_batch_keeps_blank_rows_out_as_a_file_does():
    from kimi_eagle.reconstruct.batch import batch_items

    assert batch_items(pa.table({"text": ["", "  ", "x"], "line": [1, 2, 3]})) == [(3, 3, b"x", None)]


# ---- logprobs whose text contradicts their bytes ----

def _lp_record(entries):
    return {"id": "lp", "request": {"messages": [{"role": "user", "content": "hi"}]},
            "response": {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there"},
                                      "finish_reason": "stop", "logprobs": {"content": entries}}],
                         "usage": {"completion_tokens": 3}}}


def _entries(tok, fmt):
    """Exact logprob entries as serve writes them: one per completion token of the text reconstruction."""
    from kimi_eagle.reconstruct.record import reconstruct_record

    ids = reconstruct_record(_lp_record(None), tok, fmt).completion_ids
    out = []
    for i in list(ids):
        special = tok.special_text_by_id.get(i)
        raw = special.encode() if special else tok.token_bytes(i)
        out.append({"token": special or raw.decode("utf-8", "replace"), "bytes": list(raw), "logprob": -0.1})
    return out


CONFLICTS = {  # how one entry of otherwise exact logprobs is planted
    "im_end_text_over_real_bytes": lambda es: es[-2].update(token="<|im_end|>"),
    "other_text_over_real_bytes": lambda es: es[-3].update(token="Bye"),
    "empty_text_over_real_bytes": lambda es: es[-3].update(token=""),
}


@pytest.mark.parametrize("case", sorted(CONFLICTS))
def test_a_logprob_entry_whose_text_contradicts_its_bytes_is_flagged_not_used(case, kimi):
    from kimi_eagle.chat.formats import get_format
    from kimi_eagle.reconstruct.record import reconstruct_record

    fmt = get_format("kimi-k2.5", kimi)
    exact = reconstruct_record(_lp_record(_entries(kimi, fmt)), kimi, fmt)
    assert exact.ids_source == "logprobs" and "logprobs_conflict" not in exact.flags  # the unplanted entries are used
    planted = _entries(kimi, fmt)
    CONFLICTS[case](planted)
    row = reconstruct_record(_lp_record(planted), kimi, fmt)
    assert row.ids_source == "text" and "logprobs_conflict" in row.flags


def test_a_partial_character_spelled_with_replacement_characters_is_no_conflict():
    from kimi_eagle.reconstruct.logprobs import _text_spells

    raw = "é".encode()[:1]
    assert _text_spells(raw.decode("utf-8", "replace"), raw) and _text_spells("bytes:\\xc3", raw)
    assert not _text_spells("e", raw)


# ---- records without completion_ids ----

@pytest.mark.parametrize("command", ["extract", "export-data"])
def test_records_without_completion_ids_are_refused_by_name(tmp_path, command, capsys):
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "status": "ok", "prompt_ids": [1, 2, 3]}) + "\n" for i in range(3)))
    extra = ["--target", TARGET] if command == "extract" else ["--to", "tokens", "--vocab-size", "512"]
    rc, last = run_cli([command, src, "-o", tmp_path / "out", *extra], capsys)
    assert rc == 2 and "'r0'" in last and ("completion_ids" in last or "malformed" in last), last


# ---- evaluate past the target's context ----

@pytest.mark.parametrize("n_tokens,max_new", [(600, 4), (500, 64)])
def test_evaluate_refuses_a_prompt_past_the_context_before_any_forward(tmp_path, capsys, n_tokens, max_new):
    src = tmp_path / "p.jsonl"
    src.write_text(json.dumps({"id": "long", "prompt_ids": [1] + [60] * (n_tokens - 1)}) + "\n")
    t0 = time.perf_counter()
    rc, last = run_cli(["evaluate", src, "--target", TARGET, "--max-new-tokens", max_new, "--temperatures", "0"], capsys)
    assert rc == 2 and "prompt 'long'" in last and "context of 512 positions" in last, last
    assert time.perf_counter() - t0 < 30


KINDS = (len(HEADERS) + len(SHARDS) + len(NONFINITE) + 1 + len(RESUMES) + len(REFUSED_RESUMES) + 2 + len(RECON)
         + len(LOCKED) + 1 + len(BATCH_ROWS) + len(CONFLICTS) + 2 + 2)
