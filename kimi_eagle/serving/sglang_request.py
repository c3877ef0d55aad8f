"""The request side of SGLang 0.5: which chat requests it refuses (HTTP 400), and what it hands the template.

SGLang reads a request into typed models before anything else; a request that does not fit them is refused. The
rules below are those models' (SGLang 0.5.23, ``entrypoints/openai/protocol.py`` and ``serving_chat.py``), written
from their observable behaviour and checked against the server's recorded answers
(``tests/data/servers/sglang-0.5.requests.jsonl.gz``):

* a message is a *user* message (``role`` exactly ``user``, ``content`` a string or a list of parts) or a *generic*
  one (``role`` one of :data:`GENERIC_ROLES`, any case; ``content`` a string, parts or null; ``name``,
  ``tool_call_id``, ``reasoning_content`` strings or null; ``tool_calls`` a list of calls whose ``type`` is
  ``function`` when given and whose ``function`` is an object with a string-or-null ``name`` and string, object or
  null ``arguments``); a thinking part outside an assistant message is refused;
* a content part is one of the known part types (:data:`PART_FIELDS`);
* a tool has an object ``function`` with a string ``name``; ``tool_choice`` naming a tool needs that tool, and
  ``required`` needs tools; a tool's ``parameters`` must be a JSON Schema (2020-12) once SGLang has rewritten
  database-style type names (:data:`TYPE_ALIASES`) — the rewritten schema is also what the template declares;
* an empty conversation is refused.

What it then hands the template (:func:`served_request`): each message as its model dumps it (a user message keeps
``role`` and ``content`` only; a generic one gains every field of its model, null where absent, which
``drop_none_keys`` later removes), each tool as its model dumps it (``defer_loading: null`` beside ``type`` and
``function``; a function's absent ``description`` and ``parameters`` as null after the keys it was given).
"""
from __future__ import annotations

import copy
from typing import Any

from kimi_eagle.serving.refusal import Refusal

GENERIC_ROLES = ("system", "assistant", "tool", "function", "developer", "latest_reminder", "root")
# part type -> (required string fields, the nested object and its required string fields)
PART_FIELDS: dict[str, tuple[tuple[str, ...], str | None, tuple[str, ...]]] = {
    "text": (("text",), None, ()),
    "image_url": ((), "image_url", ("url",)),
    "video_url": ((), "video_url", ("url",)),
    "audio_url": ((), "audio_url", ("url",)),
    "input_audio": ((), "input_audio", ("data",)),
    "tool_reference": (("name",), None, ()),
}
THINKING_PARTS = ("thinking", "reasoning")
STANDARD_TYPES = ("null", "boolean", "object", "array", "number", "string", "integer")
TYPE_ALIASES = {  # SGLang's rewrite of database/ORM type names before it checks and renders a tool schema
    "str": "string", "text": "string", "varchar": "string", "char": "string", "enum": "string", "uuid": "string",
    "date": "string", "datetime": "string", "time": "string", "timestamp": "string", "binary": "string",
    "blob": "string", "bytea": "string", "bytes": "string", "varbinary": "string", "bool": "boolean",
    "bigint": "integer", "smallint": "integer", "tinyint": "integer", "double": "number", "decimal": "number",
    "real": "number", "numeric": "number", "arr": "array", "tuple": "array", "set": "array", "map": "object"}
TYPE_PREFIXES = ((("int", "uint", "long", "short", "unsigned"), "integer"), (("num", "float"), "number"),
                 (("list",), "array"), (("dict",), "object"))
PREFIX_BOUNDARY = frozenset("0123456789[<( \t")
NESTED_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
NESTED_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
NESTED_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
              "unevaluatedItems", "unevaluatedProperties")


def _opt_str(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _part_ok(part: Any) -> bool:
    if not isinstance(part, dict):
        return False
    kind = part.get("type")
    if kind in THINKING_PARTS:
        thinking, text = part.get("thinking"), part.get("text")
        return _opt_str(thinking) and _opt_str(text) and (thinking is None) != (text is None)
    if kind not in PART_FIELDS:
        return False
    own, nested, nested_fields = PART_FIELDS[kind]
    if not all(isinstance(part.get(k), str) for k in own):
        return False
    return nested is None or isinstance(part.get(nested), dict) and all(
        isinstance(part[nested].get(k), str) for k in nested_fields)


def _content_ok(content: Any, nullable: bool) -> bool:
    if content is None:
        return nullable
    return isinstance(content, str) or isinstance(content, list) and all(_part_ok(p) for p in content)


def _has_thinking(content: Any) -> bool:
    return isinstance(content, list) and any(isinstance(p, dict) and p.get("type") in THINKING_PARTS for p in content)


def _call_problem(call: Any) -> str | None:
    if not isinstance(call, dict):
        return "a history tool call is not an object"
    if not _opt_str(call.get("id")):
        return "a history tool call's id is not a string"
    if "type" in call and call["type"] != "function":
        return "a history tool call's type is not 'function'"
    fn = call.get("function")
    if not isinstance(fn, dict):
        return "a history tool call has no function object"
    if not _opt_str(fn.get("name")):
        return "a history tool call's name is not a string"
    if not (fn.get("arguments") is None or isinstance(fn["arguments"], (str, dict))):
        return "a history tool call's arguments are neither a string nor an object"
    return None


def _generic_problem(m: dict) -> str | None:
    role = m.get("role")
    if not isinstance(role, str) or role.lower() not in GENERIC_ROLES:
        return f"role {role!r} is none of user, {', '.join(GENERIC_ROLES)}"
    if not _content_ok(m.get("content"), nullable=True):
        return "content is neither a string, a list of known parts nor null"
    for key in ("name", "tool_call_id", "reasoning_content"):
        if not _opt_str(m.get(key)):
            return f"{key} is not a string"
    calls = m.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            return "tool_calls is not a list"
        problem = next((p for p in map(_call_problem, calls) if p), None)
        if problem:
            return problem
    if role.lower() != "assistant" and _has_thinking(m.get("content")):
        return "thinking content parts are only valid in assistant messages"
    return None


def message_problem(m: Any) -> str | None:
    """Why SGLang refuses message ``m`` (None: it is read as a user or a generic message)."""
    if not isinstance(m, dict):
        return "a message is not an object"
    if m.get("role") == "user":
        if not _content_ok(m.get("content"), nullable=False):
            return "a user message's content is neither a string nor a list of known parts"
        return "thinking content parts are only valid in assistant messages" if _has_thinking(m["content"]) else None
    return _generic_problem(m)


def _single_type(raw: Any) -> Any:
    if not isinstance(raw, str) or raw in STANDARD_TYPES:
        return raw
    base = raw.split("(", 1)[0].strip().lower()
    if base in STANDARD_TYPES:
        return base
    if base in TYPE_ALIASES:
        return TYPE_ALIASES[base]
    for prefixes, target in TYPE_PREFIXES:
        if any(base == p or len(base) > len(p) and base.startswith(p) and base[len(p)] in PREFIX_BOUNDARY
               for p in prefixes):
            return target
    return raw


def normalise_types(schema: Any) -> None:
    """SGLang's rewrite of database-style ``type`` names in a tool schema, in place, without recursion."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        t = node.get("type")
        if isinstance(t, str):
            node["type"] = _single_type(t)
        elif isinstance(t, list):
            node["type"] = list(dict.fromkeys(_single_type(x) for x in t))  # order kept, repeats dropped
        stack += [v for k in NESTED_MAPS if isinstance(node.get(k), dict) for v in node[k].values()]
        stack += [v for k in NESTED_LISTS if isinstance(node.get(k), list) for v in node[k]]
        stack += [node[k] for k in NESTED_ONE if k in node]


def _tool_problem(tool: Any) -> str | None:
    if not isinstance(tool, dict) or not isinstance(tool.get("type", "function"), str):
        return "a tool is not an object with a string type"
    fn = tool.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        return "a tool has no function object with a string name"
    if not _opt_str(fn.get("description")):
        return "a tool's description is not a string"
    return None


def _schema_problem(i: int, parameters: Any) -> str | None:
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        normalise_types(parameters)
        Draft202012Validator.check_schema(parameters)
    except SchemaError as e:
        return f"tool {i}'s parameters are not a JSON Schema (2020-12); details: {' '.join(str(e.message).split())[:120]}"
    except RecursionError:
        return f"tool {i}'s parameters are nested too deeply"
    return None


def _choice_problem(choice: Any, tools: list) -> str | None:
    names = [t["function"]["name"] for t in tools]
    if isinstance(choice, str):
        if choice not in ("auto", "required", "none"):
            return f"tool_choice {choice!r} is none of auto, required, none"
        return "tool_choice required without tools" if choice == "required" and not tools else None
    if not isinstance(choice, dict) or not isinstance(choice.get("function"), dict):
        return "tool_choice is neither a string nor a function choice"
    if not tools:
        return "tool_choice names a tool but there are no tools"
    name = choice["function"].get("name")
    return None if name in names else f"tool_choice names {name!r}, which is not among the tools"


def check(request: dict) -> dict:
    """``request`` as SGLang reads it (tool schemas rewritten: :func:`normalise_types`), or :class:`Refusal`."""
    messages, tools = request.get("messages"), request.get("tools")
    if not isinstance(messages, list):
        raise Refusal("messages is not a list")
    problem = next((f"message {i}: {p}" for i, p in enumerate(map(message_problem, messages)) if p), None)
    if problem is None and tools is not None and not isinstance(tools, list):
        problem = "tools is not a list"
    tools = tools or []
    problem = problem or next((p for p in map(_tool_problem, tools) if p), None)
    if problem:
        raise Refusal(problem)
    request = {**request, "tools": copy.deepcopy(tools) if tools else request.get("tools")}
    problem = _choice_problem(request.get("tool_choice", "auto"), tools)
    for i, tool in enumerate(request["tools"] or []):
        parameters = tool["function"].get("parameters")
        problem = problem or (_schema_problem(i, parameters) if parameters is not None else None)
    if problem is None and not messages:
        problem = "an empty conversation"
    if problem:
        raise Refusal(problem)
    return request


def _dumped_message(m: dict) -> dict:
    if m.get("role") == "user":
        return {"role": "user", "content": m["content"]}
    out = {"role": m["role"].lower(), "content": m.get("content"), "tool_call_id": m.get("tool_call_id"),
           "name": m.get("name"), "reasoning_content": m.get("reasoning_content")}
    if m.get("tool_calls") is not None:
        out["tool_calls"] = [{"id": c.get("id"), "index": c.get("index"), "type": "function",
                              "function": {"name": c["function"].get("name"),
                                           "arguments": c["function"].get("arguments")}} for c in m["tool_calls"]]
    return out  # every other key (``reasoning`` among them) is no field of SGLang's model: dropped


def _dumped_tool(tool: dict) -> dict:
    fn = dict(tool["function"])
    for key in ("description", "parameters"):
        fn.setdefault(key, None)
    for key in ("strict", "defer_loading"):
        if fn.get(key) is None:
            fn.pop(key, None)
    return {"type": tool.get("type", "function"), "function": fn, "defer_loading": tool.get("defer_loading")}


def _template_kwargs(request: dict) -> dict:
    kwargs = request.get("chat_template_kwargs")
    return {k: kwargs[k] for k in ("thinking", "preserve_thinking") if k in kwargs} if isinstance(kwargs, dict) else {}


def _final_assistant(messages: list[dict], continued: bool) -> tuple[list[dict], str | None]:
    """A final assistant message with text content: its text continued after the generation prompt
    (``continue_final_message``) or turned into a user message with that text (otherwise)."""
    if not messages or messages[-1].get("role") != "assistant" or not isinstance(messages[-1].get("content"), str):
        return messages, None
    if continued:
        return messages[:-1], messages[-1]["content"]
    return messages[:-1] + [{"role": "user", "content": messages[-1]["content"]}], None


def served_request(request: dict) -> dict:
    """A checked request (:func:`check`) as SGLang hands it on: messages and tools as its models dump them (null
    content as ``""``), a final assistant message continued or turned into a user message, no tools under
    ``tool_choice: none`` and only the chosen one under a function choice; the template settings and the continued
    text under ``_served`` (:func:`kimi_eagle.serving.request.prompt_pieces`). An empty conversation is refused."""
    messages = [_dumped_message(m) for m in request["messages"]]
    messages = [{**m, "content": "" if m.get("content") is None else m["content"]} for m in messages]
    messages, prefix = _final_assistant(messages, request.get("continue_final_message") is True)
    if not messages:
        raise Refusal("an empty conversation (nothing left before the continued message)")
    tools, choice = request.get("tools"), request.get("tool_choice", "auto")
    if tools and isinstance(choice, dict):
        tools = [t for t in tools if t["function"]["name"] == choice["function"].get("name")]
    served = {**_template_kwargs(request), "assistant_prefix": prefix, "no_tools": choice == "none"}
    return {**request, "messages": messages, "tools": [_dumped_tool(t) for t in tools] if tools else None,
            "_served": served}
