"""Kimi-K2.5's TypeScript-style tool declaration (the ``tools_ts_str`` the K2.5 template accepts).

Moonshot's K2.5 tokenizer passes the template a TypeScript rendering of the OpenAI tools instead of
JSON. The layout, as publicly described in Moonshot's ``tool_declaration_ts.py``::

    # Tools

    ## functions
    namespace functions {
    // description line
    type get_weather = (_: {
      // The city
      city: string,
      // Default: "C"
      unit?: "C" | "F"
    }) => any;
    }

Object fields: required first, then optional (``?``), each group sorted by name, separated by
``,\\n``, indented two spaces per level. Above a field: its description as ``// `` lines, then its
constraints (``// maxLength: 5, minLength: 1``, sorted by key), then ``// Default: ...``.
``integer`` prints as ``number``; ``enum`` as a union of literals; ``anyOf`` and type lists as
unions; ``$ref`` to ``#/$defs/X`` as ``X`` with ``interface X {...}`` declared before the function.
This module is an independent implementation of that description.

Where Moonshot's conversion fails (a schema with none of ``type``, ``enum``, ``anyOf``, ``$ref`` that is not ``{}``,
an enum value of another type than the declared one, a type list of three or more or of two without ``null``
around an enum, an unknown type in a type list, a ``$ref`` that is neither ``#`` nor a known ``#/$defs/NAME``,
``additionalProperties`` of another kind than a boolean or a schema, ``properties`` that is no mapping, a tool
that is no object), its tokenizer catches the failure and the template declares the tools as JSON instead:
:func:`typescript_or_none` returns ``None`` there, and the formats fall back the same way (flag
``tool_declaration_json_fallback`` on the reconstructed row).

>>> typescript_or_none([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
...     "properties": {"paths": {"type": "array", "items": {"description": "a path"}}}}}}]) is None
True
"""
from __future__ import annotations

import json
from contextvars import ContextVar
from typing import Any

INDENT = "  "
CONSTRAINTS = {"string": ("maxLength", "minLength", "pattern"), "number": ("maximum", "minimum"),
               "integer": ("maximum", "minimum"), "array": ("maxItems", "minItems")}
_DEFS: ContextVar[set[str]] = ContextVar("defs", default=set())  # the $defs names of the function being declared
_SELF_REF: ContextVar[list[bool]] = ContextVar("self_ref", default=[False])  # a "#" reference met in its parameters
UNION_NAMES = {"string": "string", "number": "number", "integer": "number", "boolean": "boolean", "null": "null",
               "object": "{}", "array": "Array<any>"}


def _comment(text: str, indent: str) -> str:
    """``// `` per line; empty lines stay empty."""
    return "\n".join(f"{indent}// {line}" if line else "" for line in text.split("\n"))


ENUM_TYPES = {"string": (str,), "number": (int, float), "integer": (int,), "boolean": (bool,)}


def _check_enum(schema: dict) -> None:
    """Moonshot's enum check: the values must have the declared type (a type list: one type, or one and ``null``)."""
    if "type" not in schema:
        return
    t = schema["type"]
    if isinstance(t, list):
        if len(t) == 1:
            t = t[0]
        elif len(t) == 2 and "null" in t:
            t = t[0] if t[0] != "null" else t[1]
        else:
            raise ValueError(f"enum type {t} is not supported")
    allowed = ENUM_TYPES.get(t) if isinstance(t, str) else None
    for value in schema["enum"]:
        if value is not None and allowed is not None and not isinstance(value, allowed):
            raise ValueError(f"enum value {value!r} is not a {t}")


def _kind(schema: Any) -> str:
    if isinstance(schema, bool) or schema == {}:
        return "scalar"
    if not isinstance(schema, dict):
        raise ValueError(f"unsupported JSON schema: {schema!r}")
    if "$ref" in schema:
        return "ref"
    if "anyOf" in schema:
        return "anyOf"
    if "enum" in schema:
        _check_enum(schema)
        return "enum"
    t = schema.get("type")
    if isinstance(t, list):
        return "union"
    if t in ("object", "array"):
        return t
    if t is None:
        raise ValueError(f"unsupported JSON schema: {schema!r}")
    return "scalar"


def _doc(schema: Any, indent: str) -> str:
    """The comment lines above a field or array item: description, then constraints."""
    if isinstance(schema, bool):
        return ""
    lines = []
    if schema.get("description"):
        lines.append(_comment(schema["description"], indent))
    kind = _kind(schema)
    allowed = CONSTRAINTS.get(schema.get("type"), ()) if kind in ("scalar", "array") else ()
    found = sorted((k, schema[k]) for k in allowed if k in schema)
    if found:
        lines.append(indent + "// " + ", ".join(f"{k}: {v}" for k, v in found))
    return "".join(line + "\n" for line in lines)


def ts_type(schema: Any, indent: str = "") -> str:
    """The TypeScript type of a JSON schema, laid out at ``indent``."""
    if isinstance(schema, bool):
        return "any" if schema else "null"
    kind = _kind(schema)
    if kind == "ref":
        ref = schema["$ref"]
        if ref != "#" and not (ref.startswith("#/$defs/") and ref.rsplit("/", 1)[-1] in _DEFS.get()):
            raise ValueError(f"unresolved reference: {ref!r}")
        if ref == "#":
            _SELF_REF.get()[0] = True
        return "parameters" if ref == "#" else ref.rsplit("/", 1)[-1]
    if kind == "anyOf":
        return " | ".join(ts_type(s, indent) for s in schema["anyOf"])
    if kind == "enum":
        return " | ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in schema["enum"])
    if kind == "union":
        return " | ".join(UNION_NAMES[t] for t in schema["type"])
    if kind == "object":
        return ts_object(schema, indent)
    if kind == "array":
        item = schema.get("items") or {}
        doc = _doc(item, indent + INDENT)
        if doc:
            return f"Array<\n{doc}{indent}{INDENT}{ts_type(item, indent + INDENT)}\n{indent}>"
        return f"Array<{ts_type(item, indent)}>"
    if schema == {}:
        return "any"
    return "number" if schema["type"] == "integer" else str(schema["type"])


def _field(name: str, schema: Any, optional: bool, indent: str) -> str:
    out = _doc(schema, indent)
    default = schema.get("default") if isinstance(schema, dict) else None
    if default is not None:
        shown = repr(default) if isinstance(default, (int, float, bool)) else json.dumps(default, ensure_ascii=False)
        out += f"{indent}// Default: {shown}\n"
    return f"{out}{indent}{name}{'?' if optional else ''}: {ts_type(schema, indent)}"


def ts_object(schema: dict, indent: str = "") -> str:
    """``{ field, ... }`` for an object schema (any ``type``: the top level is always an object)."""
    props = schema.get("properties", {})
    if not isinstance(props, dict):
        raise ValueError(f"properties is no mapping: {props!r}")
    required = set(schema.get("required", [])) if schema else set()
    order = sorted(n for n in props if n in required) + sorted(n for n in props if n not in required)
    fields = [_field(n, props[n], n not in required, indent + INDENT) for n in order]
    extra = schema.get("additionalProperties")
    if extra is not None:
        if not isinstance(extra, (bool, dict)):
            raise ValueError(f"unknown additionalProperties: {extra!r}")
        kind = "any" if extra is True else "never" if extra is False else ts_type(extra, indent + INDENT)
        fields.append(f"{indent}{INDENT}[k: string]: {kind}")
    if not fields:
        return "{}"
    return "{\n" + ",\n".join(fields) + "\n" + indent + "}"


def _all_defs(schema: Any) -> set[str]:
    """The names of every ``$defs`` table anywhere in ``schema`` (what a ``#/$defs/NAME`` may resolve to)."""
    found: set[str] = set()
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("$defs"), dict):
                found |= set(node["$defs"])
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


def function_to_typescript(fn: dict) -> str:
    """One OpenAI function definition as ``type NAME = (_: {...}) => any;`` with its comments."""
    params = fn.get("parameters") or {}
    token = _DEFS.set(_all_defs(params))
    try:
        return _function_to_typescript(fn, params)
    finally:
        _DEFS.reset(token)


def _function_to_typescript(fn: dict, params: dict) -> str:
    defs = params.get("$defs") or {}
    token = _SELF_REF.set([False])
    try:
        body = ts_object(params)  # a "#" reference met on the way (not one in a part never read) makes it an interface
        self_ref = _SELF_REF.get()[0]
    finally:
        _SELF_REF.reset(token)
    parts = ["interface parameters " + body] if self_ref else []
    for name, d in defs.items():
        head = _comment(d["description"], "") + "\n" if d.get("description") else ""
        parts.append(f"{head}interface {name} {ts_type(d)}")
    interfaces = "\n".join(parts)
    signature = "parameters" if self_ref else body
    name = fn.get("name", "function")
    pieces = [interfaces, _comment(fn["description"], "") if fn.get("description") else "",
              f"type {name} = (_: {signature}) => any;"]
    return "\n".join(p for p in pieces if p)


def tools_to_typescript(tools: list) -> str:
    """The whole declaration for OpenAI ``tools`` (non-function tools are skipped)."""
    for t in tools or []:
        if not isinstance(t, dict):
            raise ValueError(f"a tool is no object: {t!r}"[:200])
    functions = [function_to_typescript(t["function"]) for t in tools or []
                 if t.get("type") == "function" and t.get("function")]
    if not functions:
        return ""
    return "# Tools\n\n## functions\nnamespace functions {\n" + "\n".join(functions) + "\n}\n"


def typescript_or_none(tools: list) -> str | None:
    """:func:`tools_to_typescript`, or ``None`` where the conversion fails (Moonshot's tokenizer then lets the
    template declare the tools as JSON: see the module)."""
    try:
        return tools_to_typescript(tools)
    except Exception:  # noqa: BLE001 - any failure falls back, as Moonshot's `except Exception` does
        return None
