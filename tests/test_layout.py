"""The package's layout: folders are pipeline stages and imports flow one way, with no cycles.

Every import in every module counts, function-local ones included (a local import is still a
dependency; hiding a cycle inside a function does not remove it).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "kimi_eagle"

# Two layers. The library (top-level core modules and the stage folders) never imports the apps; the apps
# (everything under ``kimi_eagle/apps/`` plus ``kimi_eagle/__main__``) may import any library stage.
# Library stage -> the library stages it may import from (besides itself). Top-level modules are "core".
LIBRARY: dict[str, set[str]] = {
    "core": set(),
    "tokenize": {"core"},
    "chat": {"core", "tokenize"},
    "serving": {"core", "tokenize", "chat"},
    "reconstruct": {"core", "tokenize", "chat", "serving"},
    "diff": {"core", "tokenize", "chat", "serving", "reconstruct"},
    "engine": {"core", "tokenize", "chat", "serving"},
    "eagle3": {"core", "tokenize", "chat", "engine"},
}
APPS = "apps"
ALLOWED: dict[str, set[str]] = {**LIBRARY, APPS: set(LIBRARY)}
CORE_MODULES = {"kimi_eagle", "kimi_eagle.assets", "kimi_eagle.records", "kimi_eagle.io", "kimi_eagle.reuse",
                "kimi_eagle.data_kinds",  # data_kinds: the one data-kind vocabulary (#35)
                "kimi_eagle.redact"}  # redact: the one redaction of the API key, data fields included (#47)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def stage(module: str) -> str:
    """``apps`` for the app layer, else the library stage: the first folder under the package, or ``core``."""
    parts = module.split(".")
    if module == "kimi_eagle.__main__" or parts[1:2] == [APPS]:
        return APPS
    return parts[1] if module not in CORE_MODULES and len(parts) >= 3 else "core"


def is_library(module: str) -> bool:
    return stage(module) != APPS


def package_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """Package modules imported anywhere in ``path`` (absolute and relative, ``from . import x`` resolved)."""
    is_pkg = path.name == "__init__.py"
    here = module.split(".") if is_pkg else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
            submodules = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
            names = submodules or [base]
        else:
            continue
        for name in names:
            while name and name not in known:  # `from pkg import function` -> the module pkg
                name = name.rpartition(".")[0]
            if name and name != module and name.startswith("kimi_eagle"):
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = package_modules()
    known = set(modules)
    return {m: imports_of(m, p, known) - {"kimi_eagle"} for m, p in modules.items()}


def test_every_module_lives_in_a_stage_folder_or_is_core():
    loose = {m for m in package_modules() if len(m.split(".")) == 2 and not (PACKAGE / m.split(".")[1]).is_dir()}
    assert loose <= CORE_MODULES | {"kimi_eagle.__main__"}, loose
    assert set(LIBRARY) - {"core"} | {APPS} == {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}


def test_imports_only_point_down_the_stage_order():
    wrong = [f"{m} ({stage(m)}) imports {i} ({stage(i)})"
             for m, deps in import_graph().items() for i in sorted(deps)
             if stage(i) != stage(m) and stage(i) not in ALLOWED[stage(m)]]
    assert not wrong, "\n".join(wrong)


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_the_checker_sees_relative_local_and_package_imports(tmp_path):
    known = {"kimi_eagle.eagle3.model", "kimi_eagle.eagle3.export", "kimi_eagle.eagle3", "kimi_eagle.io"}
    src = tmp_path / "model.py"
    src.write_text("def f():\n    from .export import x\nfrom ..io import write_text\nfrom . import export\n")
    assert imports_of("kimi_eagle.eagle3.model", src, known) == {"kimi_eagle.eagle3.export", "kimi_eagle.io"}


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import from a library module into an app module."""
    return [f"{m} (library: {stage(m)}) imports the app {i}" for m, deps in sorted(graph.items())
            for i in sorted(deps) if is_library(m) and not is_library(i)]


def test_the_library_never_imports_an_app():
    assert not layer_violations(import_graph()), "\n".join(layer_violations(import_graph()))


def test_the_layer_check_fails_on_a_planted_import_from_the_library_into_an_app(tmp_path):
    """Plant a function-local import of the CLI inside a copy of a library module: the check must see it."""
    modules = package_modules()
    known = set(modules)
    planted = tmp_path / "align.py"
    planted.write_text(modules["kimi_eagle.diff.align"].read_text(encoding="utf-8")
                       + "\n\ndef _planted():\n    from kimi_eagle.apps.cli import main\n    return main\n")
    graph = import_graph()
    graph["kimi_eagle.diff.align"] = imports_of("kimi_eagle.diff.align", planted, known) - {"kimi_eagle"}
    assert [v for v in layer_violations(graph) if v.startswith("kimi_eagle.diff.align ")] == [
        "kimi_eagle.diff.align (library: diff) imports the app kimi_eagle.apps.cli"]
    # and the relative spelling of the same import, from a module one folder down
    planted.write_text("from ..apps import cli\n")
    graph["kimi_eagle.diff.align"] = imports_of("kimi_eagle.diff.align", planted, known) - {"kimi_eagle"}
    assert [v for v in layer_violations(graph) if v.startswith("kimi_eagle.diff.align ")] == [
        "kimi_eagle.diff.align (library: diff) imports the app kimi_eagle.apps.cli"]


def test_engine_and_reconstruct_share_the_chat_format_and_never_import_each_other():
    graph = import_graph()
    crossing = [f"{m} imports {i}" for m, deps in graph.items() for i in deps
                if {stage(m), stage(i)} == {"engine", "reconstruct"}]
    assert not crossing, crossing


SPECIAL_SET_BUILD = re.compile(r"(frozenset\(|set\(|\{|\[)s\.(id|text)\b[^\n]*for s in [\w.]*special_tokens")
PRIVATE_CACHE = re.compile(r"per_tokenizer|WeakKeyDictionary|\[id\(tok\)\]|id\(table\)")


def test_only_the_tokenizer_builds_tables_from_its_special_tokens():
    owner = PACKAGE / "tokenize" / "tokenizer.py"
    builders = [f"{p.relative_to(PACKAGE)}:{n}: {line.strip()}"
                for p in sorted(PACKAGE.rglob("*.py")) if p != owner
                for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
                if SPECIAL_SET_BUILD.search(line) or PRIVATE_CACHE.search(line)]
    assert not builders, "derive these from the tokenizer's tables instead:\n" + "\n".join(builders)


def test_the_table_check_recognises_a_hand_built_special_set():
    assert SPECIAL_SET_BUILD.search("ids = frozenset(s.id for s in tok.special_tokens)")
    assert SPECIAL_SET_BUILD.search("texts = {s.id: s.text for s in self.tok.special_tokens}")
    assert not SPECIAL_SET_BUILD.search("lo = min(s.id for s in tok.special_tokens)")
