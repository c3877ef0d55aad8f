"""YAML for grids: plain data only, of a bounded size once every alias is expanded.

``yaml.safe_load`` already refuses ``!!python/*`` objects, but it still builds ``bytes`` (``!!binary``), ``set``
(``!!set``), dates (``2024-01-01``) and ordered pairs, and it expands aliases without limit: nine nested
anchors of ten aliases each (billion laughs) are 10**9 values to every later walk, and an anchor that refers to
itself is a structure with no end. :func:`load_yaml` refuses all of these with the line they are on.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

# tags that build something other than plain data (explicit or, for dates, implied by the value's spelling)
REFUSED_TAGS = {
    "tag:yaml.org,2002:binary": "bytes",
    "tag:yaml.org,2002:set": "a set",
    "tag:yaml.org,2002:omap": "ordered pairs",
    "tag:yaml.org,2002:pairs": "pairs",
    "tag:yaml.org,2002:timestamp": "a date (quote it to pass it as text)",
}


class _Refused(yaml.YAMLError):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class PlainDataLoader(yaml.SafeLoader):
    """``SafeLoader`` without the tags of :data:`REFUSED_TAGS` and without any tag it does not know."""

    def construct_undefined(self, node: yaml.Node) -> Any:
        raise _Refused(f"line {node.start_mark.line + 1}: the tag {node.tag!r} is not allowed (plain data only)")


def _refuse(what: str):
    def construct(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
        raise _Refused(f"line {node.start_mark.line + 1}: !!{node.tag.rsplit(':', 1)[-1]} is {what}, "
                       "which a grid does not take (plain data only)")
    return construct


for _tag, _what in REFUSED_TAGS.items():
    PlainDataLoader.add_constructor(_tag, _refuse(_what))
PlainDataLoader.add_constructor(None, PlainDataLoader.construct_undefined)


def expanded_size(root: yaml.Node, limit: int) -> int:
    """How many nodes ``root`` stands for once every alias is expanded (an aliased node counts every time it is
    used); raises ``_Refused`` past ``limit`` or for a node that contains itself."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        children = _children(node)
        if done:
            open_nodes.discard(key)
            sizes[key] = 1 + sum(sizes[id(c)] for c in children)
            if sizes[key] > limit:
                raise _Refused(f"the grid expands (aliases included) into more than {limit} values")
            continue
        if key in sizes:
            continue
        if key in open_nodes:
            raise _Refused(f"line {node.start_mark.line + 1}: an alias refers to the value that contains it "
                           "(a recursive alias)")
        open_nodes.add(key)
        stack.append((node, True))
        for child in children:
            if id(child) in open_nodes:
                raise _Refused(f"line {child.start_mark.line + 1}: an alias refers to the value that contains it "
                               "(a recursive alias)")
            if id(child) not in sizes:
                stack.append((child, False))
    return sizes[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def load_yaml(path: Path, max_bytes: int, max_nodes: int, error: type[Exception]) -> Any:
    """The plain data in the YAML file ``path``, or ``error`` with a one-line reason naming the file."""
    try:
        size = path.stat().st_size
    except OSError as e:
        raise error(f"{path}: cannot read the grid: {e.strerror or e}") from None
    if size > max_bytes:
        raise error(f"{path}: the grid is {size} bytes; at most {max_bytes}")
    try:
        loader = PlainDataLoader(path.read_bytes())
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            expanded_size(node, max_nodes)
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except _Refused as e:
        raise error(f"{path}: {e.message}") from None
    except yaml.YAMLError as e:
        raise error(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None
    except RecursionError:
        raise error(f"{path}: the grid is nested too deeply") from None
    except ValueError as e:  # e.g. an integer literal of more digits than Python converts
        raise error(f"{path}: a value cannot be read: {str(e).split(';')[0]}") from None
