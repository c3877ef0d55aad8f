"""The file job's fast paths (issue #28) against their references: the record scan, the one-read shard, the
UTF-8 shortcut of ``parse_line``, the overlapped scan and the written manifest, and the scaling model's arithmetic."""
from __future__ import annotations

import importlib.util
import io
import json
from pathlib import Path

import orjson
import pytest
import xxhash

from kimi_eagle.assets import kimi_dir
from kimi_eagle.io import UTF8_BOM, fast_loads, iter_raw_lines, parse_line
from kimi_eagle.reconstruct import job as J

REC = b'{"id": "r"}'
TRICKY = {  # inputs whose line ends, blank lines and byte-order marks the scan must cut as iter_raw_lines does
    "lf": REC + b"\n" + REC + b"\n",
    "crlf": REC + b"\r\n\r\n" + REC + b"\r\n",
    "cr": REC + b"\r" + REC + b"\r\r",
    "mixed": REC + b"\n" + REC + b"\r\n" + REC + b"\r" + REC,
    "bom line": UTF8_BOM + b"\n" + REC + b"\n",
    "bom record": UTF8_BOM + REC + b"\n" + REC,
    "blank lines": b"\n \n\t\n" + REC + b"\n\x0b\n" + b"[1]\n  " + REC + b"\n\n",
    "not objects": b"x\n[1]\n\"s\"\n" + UTF8_BOM + b"\n" + REC,
    "no end": REC,
    "only blanks": b"\n\r\n  \r",
}


def reference_starts(data: bytes) -> list[tuple[int, int]]:
    """What the scan must find: ``(offset, line number)`` of every non-blank line, via ``iter_raw_lines``."""
    return [(offset, lineno) for lineno, (offset, raw) in enumerate(iter_raw_lines(io.BytesIO(data)), 1)
            if raw.strip() and not (lineno == 1 and raw == UTF8_BOM)]


@pytest.mark.parametrize("name", TRICKY)
def test_record_scan_cuts_lines_as_iter_raw_lines_at_every_chunk_size(name):
    data = TRICKY[name] * 3
    want = reference_starts(data)
    for chunk in (1, 2, 3, 5, 7, 64, 1 << 20):  # a CR or CRLF falls on every chunk boundary at some size
        assert list(J.record_starts(io.BytesIO(data), chunk)) == want, chunk


def test_record_scan_agrees_with_iter_raw_lines_on_random_line_mixes():
    """The numpy scan of LF-only chunks and the line-by-line scan of CR chunks, on 300 seeded random files of
    records, blank and whitespace lines, lone byte-order marks and unended last lines, at chunk sizes that cut
    every line somewhere."""
    import random

    rng = random.Random(28)
    lines, ends = [REC, b"", b" ", b"\t", b"x", UTF8_BOM, b"[1]", b"{", UTF8_BOM + REC], [b"\n", b"\r\n", b"\r"]
    for trial in range(300):
        eol = (lambda: b"\n") if trial % 2 else (lambda: rng.choice(ends))
        data = b"".join(rng.choice(lines) + eol() for _ in range(rng.randrange(40))) + rng.choice([b"", REC, b" "])
        for chunk in (1, 2, 3, 7, 64, 1 << 20):
            assert list(J.record_starts(io.BytesIO(data), chunk)) == reference_starts(data), (data, chunk)


@pytest.mark.parametrize("name", TRICKY)
def test_a_shard_read_in_one_call_equals_the_streamed_read(name, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(TRICKY[name] * 5)
    for size in (1, 2, 3, 100):
        n, starts, _ = J._shard_starts(src, size)
        assert n == len(reference_starts(src.read_bytes()))
        ends = [o for o, _ in starts[1:]] + [src.stat().st_size]
        for (offset, lineno), end in zip(starts, ends):
            assert J._read_shard(src, offset, lineno, size, end) == J._read_shard(src, offset, lineno, size)


def test_every_value_orjson_takes_is_strict_utf8():
    """``parse_line`` skips the UTF-8 decode when orjson takes the bytes: orjson must refuse all that the decode does
    (every 1-3 byte sequence and every 4-byte lead, inside a JSON string)."""
    seqs = [bytes([a]) for a in range(0x80, 0x100)] + [bytes([a, b]) for a in range(0xC0, 0x100) for b in range(0x80, 0xC0)]
    seqs += [bytes([a, b, c]) for a in range(0xE0, 0xF0) for b in range(0x80, 0xC0) for c in (0x80, 0xBF)]
    seqs += [bytes([a, b, 0x80, 0x80]) for a in range(0xF0, 0x100) for b in range(0x80, 0xC0)]
    for s in seqs:
        data = b'{"id": "' + s + b'"}'
        try:
            s.decode("utf-8")
            valid = True
        except UnicodeDecodeError:
            valid = False
        assert fast_loads(data)[0] <= valid, s  # taken by orjson => valid UTF-8
        if not valid:
            (line,) = parse_line(data, 3)
            assert line.error.startswith("line 3: invalid UTF-8 at byte 8"), (s, line.error)


def test_parse_line_values_equal_json_loads():
    raw = json.dumps({"id": "é", "n": [1, 2.5, None, True], "big": 2**70, "s": "\u2028"}).encode()
    (line,) = parse_line(raw, 1)
    assert line.error is None and line.obj == json.loads(raw) and type(line.obj["big"]) is int
    assert type(orjson.loads(raw)["big"]) is float  # why fast_loads leaves such a line to json.loads


def _records(n: int, dup_every: int = 0) -> bytes:
    lines = []
    for k in range(n):
        rid = f"r{k // 2}" if dup_every and k % dup_every == 0 else f"r{k}"
        lines.append(json.dumps({"id": rid, "request": {"messages": [{"role": "user", "content": f"hi {k}"}]},
                                 "response": {"choices": [{"message": {"role": "assistant", "content": f"yo {k}"},
                                                           "finish_reason": "stop"}]}}).encode())
    return b"\n".join(lines) + b"\n{oops\n"


@pytest.mark.parametrize("workers", [1, 2])
def test_fresh_run_writes_the_manifest_the_resume_checks(tmp_path, workers, monkeypatch):
    """The scan runs beside the work: the manifest of a fresh run (written once the scan ends) is the one a
    resumed run compares, byte for byte as ``write_json`` writes it."""
    src, out = tmp_path / "in.jsonl", tmp_path / "out.parquet"
    src.write_bytes(_records(40, dup_every=7))
    seen = {}
    real_rmtree = J.shutil.rmtree

    def keep(path, *a, **k):
        seen["manifest"] = (Path(path) / "manifest.json").read_text()
        return real_rmtree(path, *a, **k)

    monkeypatch.setattr(J.shutil, "rmtree", keep)
    job = J.JobOptions(workers=workers, shard_size=3, progress=False)
    counts = J.reconstruct_file(src, out, kimi_dir(), "kimi-k2.5", job)
    _, _, sha = J._shard_starts(src, 3)
    assert json.loads(seen["manifest"]) == J._manifest(src, sha, str(kimi_dir()), "kimi-k2.5", job)
    assert json.loads(seen["manifest"])["xxh3_128"] == xxhash.xxh3_128(src.read_bytes()).hexdigest()
    assert seen["manifest"] == json.dumps(json.loads(seen["manifest"]), indent=1, ensure_ascii=False)
    duplicates = sum(1 for e in counts.errors if "duplicate id" in e)
    assert sum(counts.values()) == 41 and duplicates > 0 and counts["error"] == 1 + duplicates


def test_an_input_without_records_leaves_no_shard_folder(tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.parquet"
    src.write_bytes(UTF8_BOM + b"\n  \r\n\t")
    with pytest.raises(J.NothingToProcess):
        J.reconstruct_file(src, out, kimi_dir(), "kimi-k2.5", J.JobOptions(progress=False))
    assert not out.with_name(out.name + ".parts").exists() and not out.exists()


def _bench():
    spec = importlib.util.spec_from_file_location("bench_reconstruct", Path(__file__).parent.parent / "bench" / "reconstruct.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_scaling_model_takes_the_slowest_lane():
    model = _bench().model_seconds
    per = {"worker": 1e-4, "parent": 1e-6, "writer": 1e-5, "scan": 5e-6}
    fixed = {"start": 0.5, "pool": 0.03, "per_worker": 0.01, "tail": 0.001}
    # 16 workers on 16 cores: the parquet writer (10 s) beats the workers (6.25 s) and the shared CPU (7.25 s)
    assert model(per, fixed, 1_000_000, 16, 16) == pytest.approx(0.5 + 0.03 + 0.16 + 10 + 0.001)
    # 1 worker on 2 cores: the worker lane, no parent merge, no pool
    assert model(per, fixed, 1_000_000, 1, 2) == pytest.approx(0.5 + 100 + 0.001)
    # 2 workers on 2 cores: the shared CPU, (100 + 1 + 10 + 5) us a record on 2 cores
    assert model(per, fixed, 1_000_000, 2, 2) == pytest.approx(0.5 + 0.03 + 0.02 + 58 + 0.001)
    # 64 workers in 8 outputs on 64 cores: each writer has 125,000 records (1.25 s); the shared CPU (1.8125 s) decides
    assert model(per, fixed, 1_000_000, 64, 64, 8) == pytest.approx(0.5 + 0.03 + 0.08 + 1.8125 + 0.001)


def test_a_run_raises_the_collector_threshold_and_restores_it(tmp_path, monkeypatch):
    import gc

    seen = []
    real = J._reconstruct_locked

    def spy(*args, **kwargs):
        seen.append(gc.get_threshold())
        return real(*args, **kwargs)

    monkeypatch.setattr(J, "_reconstruct_locked", spy)
    before = gc.get_threshold()
    src, empty = tmp_path / "in.jsonl", tmp_path / "empty.jsonl"
    src.write_bytes(_records(5))
    empty.write_bytes(b"\n")
    J.reconstruct_file(src, tmp_path / "a.parquet", kimi_dir(), "kimi-k2.5", J.JobOptions(progress=False))
    with pytest.raises(J.NothingToProcess):  # restored when the run fails too
        J.reconstruct_file(empty, tmp_path / "b.parquet", kimi_dir(), "kimi-k2.5", J.JobOptions(progress=False))
    assert [t[0] for t in seen] == [max(before[0], 20_000)] * 2 and gc.get_threshold() == before


def test_a_second_run_with_workers_reuses_the_kept_pool_and_writes_the_same_rows(tmp_path, kimi):
    """Start-up amortised: a run with workers keeps its pool for the next run with the same tokenizer object and
    settings; a failed run terminates its pool, another tokenizer gets a new one, and ``close_worker_pools``
    ends it. Every run's rows equal the one-worker run's."""
    src = tmp_path / "in.jsonl"
    src.write_bytes(_records(40, dup_every=7))
    job = J.JobOptions(workers=2, shard_size=3, progress=False)
    want = (J.reconstruct_file(src, tmp_path / "one.parquet", kimi_dir(), "kimi-k2.5",
                               J.JobOptions(shard_size=3, progress=False), tokenizer=kimi), (tmp_path / "one.parquet").read_bytes())
    J.close_worker_pools()
    pools = []
    for k in range(2):
        out = tmp_path / f"two-{k}.parquet"
        counts = J.reconstruct_file(src, out, kimi_dir(), "kimi-k2.5", job, tokenizer=kimi)
        assert (counts, out.read_bytes()) == want
        pools.append(J._POOL["kept"][2])
    assert pools[0] is pools[1]
    parts = tmp_path / "bad.parquet.parts"
    parts.mkdir()
    (parts / "manifest.json").write_text("{}")
    with pytest.raises(ValueError, match="cannot resume"):
        J.reconstruct_file(src, tmp_path / "bad.parquet", kimi_dir(), "kimi-k2.5",
                           J.JobOptions(workers=2, shard_size=3, progress=False, resume=True), tokenizer=kimi)
    assert "kept" not in J._POOL and pools[0]._state != "RUN"  # the failed run's pool was terminated
    J.reconstruct_file(src, tmp_path / "three.parquet", kimi_dir(), "kimi-k2.5", job, tokenizer=kimi)
    J.reconstruct_file(src, tmp_path / "four.parquet", kimi_dir(), "kimi-k2.5", job)  # its own tokenizer: a new pool
    assert J._POOL["kept"][2] is not pools[0] and (tmp_path / "four.parquet").read_bytes() == want[1]
    kept = J._POOL["kept"][2]
    J.close_worker_pools()
    assert "kept" not in J._POOL and kept._state != "RUN"


def test_a_workers_first_shard_of_a_run_starts_a_fresh_encoder(tmp_path, kimi):
    src = tmp_path / "in.jsonl"
    src.write_bytes(_records(6))
    J._init_worker(str(kimi_dir()), "kimi-k2.5", "json", J.JobOptions().completion, kimi)
    try:
        shard = (0, str(src), 0, 1, 3, None)
        J._run_shard((shard, str(tmp_path), "run-a"))
        first = J._W["encoder"]
        J._run_shard(((1, *shard[1:]), str(tmp_path), "run-a"))
        assert J._W["encoder"] is first  # the same run: its cache goes on
        J._run_shard(((2, *shard[1:]), str(tmp_path), "run-b"))
        assert J._W["encoder"] is not first and (tmp_path / J.shard_name(2)).is_file()
    finally:
        J._W.clear()


def test_a_tokenizer_without_weak_references_runs_with_workers_and_keeps_no_pool(tmp_path, kimi):
    class Slotted:  # a tokenizer wrapper with __slots__ and no __weakref__
        __slots__ = ("inner",)

        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

    src = tmp_path / "in.jsonl"
    src.write_bytes(_records(9))
    J.close_worker_pools()
    counts = J.reconstruct_file(src, tmp_path / "o.parquet", kimi_dir(), "kimi-k2.5",
                                J.JobOptions(workers=2, shard_size=3, progress=False), tokenizer=Slotted(kimi))
    assert counts == {"ok": 9, "error": 1} and "kept" not in J._POOL
