"""Amazon Bedrock's Converse API (``bedrock-converse``) read as an OpenAI chat-completion log ``{"request", "response"}``.

:func:`converse_log` maps a recorded Converse request and answer onto the shape ``convert --from openai`` reads
(:func:`kimi_eagle.reconstruct.log_shapes.api_record_from_log`), block by block:

- request: ``system`` text blocks -> a ``system`` message; a ``user`` message's ``text`` blocks -> a user message,
  its ``toolResult`` blocks -> ``tool`` messages (``tool_call_id`` = ``toolUseId``; ``text`` blocks joined, ``json``
  blocks as JSON) placed before the user's text; an ``assistant`` message's ``text`` -> ``content``,
  ``reasoningContent.reasoningText.text`` -> ``reasoning_content``, ``toolUse`` -> ``tool_calls``;
  ``toolConfig.tools[].toolSpec`` -> ``tools`` (``inputSchema.json`` as ``parameters``);
- answer: ``output.message`` as above, ``stopReason`` ``end_turn``/``stop_sequence`` -> ``stop``, ``tool_use`` ->
  ``tool_calls``, ``max_tokens`` -> ``length``; ``usage.inputTokens``/``outputTokens``/``totalTokens`` ->
  ``prompt_tokens``/``completion_tokens``/``total_tokens``.

What cannot be read back exactly: Bedrock returns a tool call's arguments parsed (``input`` is an object), so they
are re-serialised with ``json.dumps`` (``", "`` and ``": "``, non-ASCII kept) -- the model's own spelling of the
arguments is not in the answer. Several text blocks in one message become OpenAI text parts (the templates
concatenate them). Any other block (images, documents, guard content, cache points), another stop reason or a
malformed field is a :class:`BedrockError` naming it.
"""
from __future__ import annotations

import json
from typing import Any

STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "tool_use": "tool_calls", "max_tokens": "length"}
USAGE_FIELDS = {"inputTokens": "prompt_tokens", "outputTokens": "completion_tokens", "totalTokens": "total_tokens"}


class BedrockError(ValueError):
    """A Converse request or answer that cannot be read as a chat completion; the message names the field."""


def _object(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise BedrockError(f"{where} is not an object")
    return value


def _blocks(message: Any, where: str) -> list[tuple[str, Any]]:
    """``(kind, value)`` of every content block of a Converse message (a block holds exactly one kind)."""
    content = _object(message, where).get("content")
    if not isinstance(content, list):
        raise BedrockError(f"{where}.content is not a list of blocks")
    out = []
    for k, block in enumerate(content):
        if not isinstance(block, dict) or len(block) != 1:
            raise BedrockError(f"{where}.content[{k}] is not a block with one kind")
        ((kind, value),) = block.items()
        out.append((kind, value))
    return out


def _text(parts: list[str]) -> Any:
    """One string for one text block, OpenAI text parts for several, None for none."""
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else [{"type": "text", "text": t} for t in parts]


def _tool_call(use: Any, where: str) -> dict:
    use = _object(use, where)
    if not isinstance(use.get("name"), str) or not isinstance(use.get("toolUseId"), str):
        raise BedrockError(f"{where} has no name or toolUseId")
    return {"id": use["toolUseId"], "type": "function",
            "function": {"name": use["name"], "arguments": json.dumps(use.get("input", {}), ensure_ascii=False)}}


def _tool_result(result: Any, where: str) -> dict:
    result = _object(result, where)
    texts = []
    for k, (kind, value) in enumerate(_blocks(result, where)):
        if kind == "text" and isinstance(value, str):
            texts.append(value)
        elif kind == "json":
            texts.append(json.dumps(value, ensure_ascii=False))
        else:
            raise BedrockError(f"{where}.content[{k}]: a {kind!r} tool result cannot be read as text")
    return {"role": "tool", "tool_call_id": result.get("toolUseId"), "content": "".join(texts)}


def _reasoning(value: Any, where: str) -> str:
    text = _object(_object(value, where).get("reasoningText"), f"{where}.reasoningText").get("text")
    if not isinstance(text, str):
        raise BedrockError(f"{where}.reasoningText has no text (redacted reasoning cannot be read)")
    return text


def _assistant(message: Any, where: str) -> dict:
    texts, reasoning, calls = [], [], []
    for k, (kind, value) in enumerate(_blocks(message, where)):
        here = f"{where}.content[{k}]"
        if kind == "text" and isinstance(value, str):
            texts.append(value)
        elif kind == "reasoningContent":
            reasoning.append(_reasoning(value, f"{here}.reasoningContent"))
        elif kind == "toolUse":
            calls.append(_tool_call(value, f"{here}.toolUse"))
        else:
            raise BedrockError(f"{here}: a {kind!r} block cannot be read as a chat message")
    out: dict[str, Any] = {"role": "assistant", "content": _text(texts)}
    if reasoning:
        out["reasoning_content"] = "".join(reasoning)
    if calls:
        out["tool_calls"] = calls
    return out


def _user(message: Any, where: str) -> list[dict]:
    texts, tools = [], []
    for k, (kind, value) in enumerate(_blocks(message, where)):
        if kind == "text" and isinstance(value, str):
            texts.append(value)
        elif kind == "toolResult":
            tools.append(_tool_result(value, f"{where}.content[{k}].toolResult"))
        else:
            raise BedrockError(f"{where}.content[{k}]: a {kind!r} block cannot be read as a chat message")
    return tools + ([{"role": "user", "content": _text(texts)}] if texts else [])


def _tool(tool: Any, where: str) -> dict:
    spec = _object(_object(tool, where).get("toolSpec"), f"{where}.toolSpec")
    function = {"name": spec.get("name")}
    if "description" in spec:
        function["description"] = spec["description"]
    function["parameters"] = _object(spec.get("inputSchema"), f"{where}.toolSpec.inputSchema").get("json", {})
    return {"type": "function", "function": function}


def converse_request(request: Any, model: str | None = None) -> dict:
    """The OpenAI chat request of a Converse request (see the module docstring)."""
    request = _object(request, "request")
    messages: list[dict] = []
    system = [b.get("text") for b in request.get("system") or [] if isinstance(b, dict)]
    if any(not isinstance(t, str) for t in system):
        raise BedrockError("request.system holds a block that is not text")
    if system:
        messages.append({"role": "system", "content": _text(system)})
    for i, m in enumerate(request.get("messages") or []):
        role = _object(m, f"request.messages[{i}]").get("role")
        if role not in ("user", "assistant"):
            raise BedrockError(f"request.messages[{i}] has role {role!r}, not user or assistant")
        where = f"request.messages[{i}]"
        messages += [_assistant(m, where)] if role == "assistant" else _user(m, where)
    out: dict[str, Any] = {"model": model, "messages": messages} if model else {"messages": messages}
    tools = (request.get("toolConfig") or {}).get("tools") or []
    if tools:
        out["tools"] = [_tool(t, f"request.toolConfig.tools[{k}]") for k, t in enumerate(tools)]
    return out


def converse_response(response: Any, model: str | None = None) -> dict:
    """The OpenAI ``chat.completion`` of a Converse answer (see the module docstring)."""
    response = _object(response, "response")
    stop = response.get("stopReason")
    if stop not in STOP_REASONS:
        raise BedrockError(f"stopReason {stop!r} has no chat-completion finish_reason "
                           f"(known: {', '.join(STOP_REASONS)})")
    message = _assistant(_object(response.get("output"), "response.output").get("message"), "response.output.message")
    usage = response.get("usage") if isinstance(response.get("usage"), dict) else {}
    out: dict[str, Any] = {"object": "chat.completion", "model": model,
                           "choices": [{"index": 0, "finish_reason": STOP_REASONS[stop], "message": message}]}
    if usage:
        out["usage"] = {name: usage[key] for key, name in USAGE_FIELDS.items() if key in usage}
    return out


def converse_log(request: Any, response: Any, model: str | None = None) -> dict:
    """``{"request", "response"}`` in the OpenAI shape of one Converse exchange; :class:`BedrockError` when a
    part of it has no chat-completion equivalent."""
    return {"request": converse_request(request, model), "response": converse_response(response, model)}
