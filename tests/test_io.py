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
