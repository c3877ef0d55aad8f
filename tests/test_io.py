"""Atomic writes: the target holds the old or the new content, and a failed write leaves no debris."""
import pytest

from kimi_eagle.io import atomic_path, write_bytes, write_text


def test_write_text_replaces_the_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "a.json"
    target.write_text("old")
    write_text(target, "new ✓")
    assert target.read_text(encoding="utf-8") == "new ✓"
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_write_bytes_creates_the_file(tmp_path):
    assert write_bytes(tmp_path / "b.bin", b"\x00\xff").read_bytes() == b"\x00\xff"


def test_a_failing_block_keeps_the_old_file_and_removes_the_temporary(tmp_path):
    target = tmp_path / "c.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed mid-write")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["c.txt"]


def test_write_jsonl_writes_one_object_a_line_and_read_jsonl_reads_them_back(tmp_path):
    from kimi_eagle.io import read_jsonl, write_jsonl

    rows = [{"id": "a", "text": "日本 ✓"}, {"id": "b", "n": [1, 2]}]
    path = write_jsonl(tmp_path / "sub" / "rows.jsonl", rows)
    assert path.read_text(encoding="utf-8").count("\n") == 2
    assert [(line.lineno, line.obj, line.error) for line in read_jsonl(path)] == [(1, rows[0], None), (2, rows[1], None)]


def test_read_jsonl_reports_a_torn_line_instead_of_dropping_it(tmp_path):
    from kimi_eagle.io import read_jsonl

    path = tmp_path / "torn.jsonl"
    path.write_bytes(b'{"id": 1}\n\n{"id": 2, "te')
    lines = list(read_jsonl(path))
    assert [line.lineno for line in lines] == [1, 3]
    assert lines[0].obj == {"id": 1} and lines[1].obj is None and "line 3: not JSON" in lines[1].error


def test_the_appender_writes_complete_lines_from_many_threads_and_transforms_them(tmp_path):
    import threading

    from kimi_eagle.io import JsonlAppender, read_jsonl

    path = tmp_path / "log.jsonl"
    with JsonlAppender(path, transform=lambda s: s.replace("sk-secret", "[REDACTED]"), fsync_every=0.0) as log:
        def worker(k):
            for i in range(200):
                log.append({"k": k, "i": i, "key": "sk-secret", "pad": "x" * 500})
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    lines = list(read_jsonl(path))
    assert len(lines) == 800 and all(line.error is None for line in lines)
    assert {line.obj["key"] for line in lines} == {"[REDACTED]"}
    assert sorted((line.obj["k"], line.obj["i"]) for line in lines) == [(k, i) for k in range(4) for i in range(200)]


def test_the_appender_appends_to_what_is_there(tmp_path):
    from kimi_eagle.io import JsonlAppender

    path = tmp_path / "log.jsonl"
    path.write_text('{"old": true}\n')
    log = JsonlAppender(path)
    log.append({"new": True})
    log.close()
    log.close()  # closing twice is harmless
    assert path.read_text().splitlines() == ['{"old": true}', '{"new": true}']


def test_write_json_and_write_lines_are_atomic_and_create_parents(tmp_path):
    import json

    from kimi_eagle.io import write_json, write_lines

    target = tmp_path / "a" / "b" / "m.json"
    write_json(target, {"when": tmp_path})  # a Path is written with str()
    assert json.loads(target.read_text()) == {"when": str(tmp_path)}
    write_lines(tmp_path / "raw.jsonl", [b"1\n", b"2\n"], fsync=True)
    assert (tmp_path / "raw.jsonl").read_bytes() == b"1\n2\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "raw.jsonl"]


def test_write_figure_saves_in_the_format_of_the_suffix_and_leaves_no_temporary(tmp_path):
    from matplotlib.figure import Figure

    from kimi_eagle.io import write_figure

    fig = Figure()
    fig.subplots().plot([0, 1], [1, 0])
    png = write_figure(fig, tmp_path / "c.png")
    svg = write_figure(fig, tmp_path / "c.svg")
    assert png.read_bytes().startswith(b"\x89PNG") and b"<svg" in svg.read_bytes()[:400]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.png", "c.svg"]


def test_lines_end_at_lf_crlf_or_cr_even_across_read_chunks():
    import io

    from kimi_eagle.io import iter_raw_lines

    data = b'{"a": 1}\r\n{"b": 2}\r{"c": 3}\n\n{"d": 4}\r'
    expected = [(0, b'{"a": 1}'), (10, b'{"b": 2}'), (19, b'{"c": 3}'), (28, b""), (29, b'{"d": 4}')]
    for chunk_size in (1, 2, 3, 7, 1 << 20):  # a CRLF split between two reads is still one line end
        assert list(iter_raw_lines(io.BytesIO(data), chunk_size=chunk_size)) == expected


def test_parse_line_names_what_is_wrong_and_never_raises():
    from kimi_eagle.io import parse_line

    assert parse_line(b'{"id": "a"}', 1)[0].obj == {"id": "a"}
    deep = parse_line(b'{"id": "d", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}", 2)
    assert [(line.obj, line.error) for line in deep] == [(None, "line 2: nested more than 100 levels deep")]
    two = parse_line(b'{"id": 1}  {"id": 2}', 3)
    assert [(line.obj, line.partial) for line in two] == [(None, {"id": 1}), (None, {"id": 2})]
    assert all("value" in line.error for line in two)
    assert "invalid UTF-8 at byte 8" in parse_line(b'{"id": "\xc3("}', 4)[0].error
