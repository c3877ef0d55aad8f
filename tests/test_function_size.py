"""Library functions fit on a screen: at most 60 lines each (kimi_eagle/ outside kimi_eagle/apps/)."""
from __future__ import annotations

import ast
from pathlib import Path

from kimi_eagle.assets import REPO_ROOT

LIBRARY = REPO_ROOT / "kimi_eagle"
APPS = LIBRARY / "apps"
MAX_LINES = 60

# "relative/path.py:name" of functions allowed over the limit while they are being split (none today). An entry
# leaves this set when its function fits; the test below fails for an entry that already fits, so it cannot go stale.
PENDING: set[str] = set()


def long_functions(root: Path, exclude: Path | None = None, max_lines: int = MAX_LINES) -> dict[str, int]:
    """``{"relative/path.py:name": lines}`` of every function (methods and nested ones too) under ``root``
    whose span from ``def`` to its last line is over ``max_lines``; files under ``exclude`` are skipped."""
    found: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        if exclude is not None and path.is_relative_to(exclude):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > max_lines:
                    found[f"{path.relative_to(root).as_posix()}:{node.name}"] = lines
    return found


def test_no_library_function_is_over_60_lines():
    over = {name: n for name, n in long_functions(LIBRARY, APPS).items() if name not in PENDING}
    assert not over, "library functions over 60 lines (split them): " + ", ".join(f"{k} ({v})" for k, v in over.items())


def test_every_pending_function_is_still_too_long():
    fits = PENDING - set(long_functions(LIBRARY, APPS))
    assert not fits, f"these now fit in {MAX_LINES} lines; remove them from PENDING: {sorted(fits)}"


def test_a_planted_61_line_function_is_reported_and_a_60_line_one_is_not(tmp_path):
    body = "".join(f"    x{k} = {k}\n" for k in range(59))
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "planted.py").write_text(f"def fits():\n{body}\n\n\ndef too_long():\n{body}    return x0\n")
    (tmp_path / "apps").mkdir()
    (tmp_path / "apps" / "app.py").write_text(f"def app_code():\n{body}    return x0\n")
    assert long_functions(tmp_path, tmp_path / "apps") == {"pkg/planted.py:too_long": 61}
    assert "apps/app.py:app_code" in long_functions(tmp_path)
