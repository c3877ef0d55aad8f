"""The request side of vLLM 0.33 and 0.34: which chat requests they refuse (HTTP 400), and what they hand the template.

vLLM reads a request into OpenAI's typed messages (or its own catch-all message) before anything else; a request
that fits none is refused. The rules below are its observable behaviour (vLLM 0.34.0, ``vllm launch render``),
checked against its recorded answers (``tests/data/servers/vllm-0.34.requests.jsonl.gz``; 0.33's,
``vllm-0.33.requests.jsonl.gz``, are the same but for an empty ``tools`` array, which 0.33 refuses first):

* a message fits one of OpenAI's messages (:func:`_openai_ok`: ``content`` required but for assistant messages, a
  string or text parts; ``name`` a string; a tool message's ``tool_call_id`` a string) or vLLM's catch-all (any
  ``role``; ``content``, when given, a string or a list of parts or strings, never null; ``name`` a string;
  ``tool_call_id`` a string or null); in both, history tool calls need a string ``id``, ``type: "function"`` and a
  ``function`` with string ``name`` and ``arguments``;
* every tool is ``type: "function"`` with a ``function`` whose ``name`` is a string; ``tool_choice`` other than
  ``none`` needs tools (an empty ``tools`` list is no tools: ``auto``/``required`` then fall back to ``none``) and a
  named choice must name one of them; ``continue_final_message`` and ``add_generation_prompt`` are not both true;
* a request that brings its own ``chat_template`` is refused (the server does not trust request templates);
* content parts of a type vLLM does not know are refused, and so is media: the kit cannot load images, audio or
  video, and vLLM refuses what it cannot load (the row says so).

What it then hands the template (:func:`served_request`): ``developer`` messages as ``system`` ones (the K2.5
template has no developer role) with every system message merged into the first, joined by a blank line; text parts
of any message joined with newlines; ``add_generation_prompt``, ``continue_final_message`` and the template
settings (``chat_template_kwargs``) under ``_served``.
"""
from __future__ import annotations

from typing import Any

from kimi_eagle.serving.refusal import LONE_SURROGATE, Refusal

KNOWN_PARTS = ("audio_embeds", "audio_url", "image_embeds", "image_pil", "image_url", "input_audio", "input_image",
               "input_text", "output_text", "prompt_embeds", "refusal", "text", "thinking", "tool_reference",
               "video_embeds", "video_url")
MEDIA_PARTS = ("audio_embeds", "audio_url", "image_embeds", "image_pil", "image_url", "input_audio", "input_image",
               "video_embeds", "video_url", "prompt_embeds")
OPENAI_ROLES = ("developer", "system", "user", "assistant", "tool", "function")
TEXT_FIELDS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal", "thinking": "thinking"}


def _call_ok(call: Any) -> bool:
    if not isinstance(call, dict) or not isinstance(call.get("id"), str):
        return False
    if call.get("type") == "custom":
        custom = call.get("custom")
        return isinstance(custom, dict) and isinstance(custom.get("input"), str) and isinstance(custom.get("name"), str)
    fn = call.get("function")
    return call.get("type") == "function" and isinstance(fn, dict) and isinstance(fn.get("name"), str) and \
        isinstance(fn.get("arguments"), str)


def _text_parts(content: Any, kinds: tuple[str, ...]) -> bool:
    return isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") in kinds and isinstance(p.get("text" if p.get("type") == "text"
                                                                             else p.get("type")), str)
        for p in content)


def _openai_ok(m: dict) -> bool:
    """Whether ``m`` is one of OpenAI's typed messages."""
    role, content = m.get("role"), m.get("content")
    if role not in OPENAI_ROLES or role != "tool" and "name" in m and not isinstance(m["name"], str):
        return False  # a tool message has no name field (one given is ignored)
    if role == "function":
        return "content" in m and (content is None or isinstance(content, str)) and isinstance(m.get("name"), str)
    if role == "assistant":
        calls = m.get("tool_calls", [])
        return (content is None or isinstance(content, str) or _text_parts(content, ("text", "refusal"))) and \
            isinstance(calls, list) and all(map(_call_ok, calls))
    if not (isinstance(content, str) or _text_parts(content, ("text",)) or role == "user" and isinstance(content, list)):
        return False
    return role != "tool" or isinstance(m.get("tool_call_id"), str)


def _catch_all_ok(m: dict) -> bool:
    """Whether ``m`` is vLLM's catch-all message (any role)."""
    if not isinstance(m.get("role"), str):
        return False
    if "content" in m and not (isinstance(m["content"], str) or isinstance(m["content"], list)):
        return False
    if "name" in m and not isinstance(m["name"], str):
        return False
    if m.get("tool_call_id") is not None and not isinstance(m["tool_call_id"], str):
        return False
    calls = m.get("tool_calls")
    return calls is None or isinstance(calls, list) and all(map(_call_ok, calls))


def message_problem(m: Any) -> str | None:
    """Why vLLM refuses message ``m`` (None: it fits one of its message types)."""
    if not isinstance(m, dict):
        return "a message is not an object"
    if _openai_ok(m) or _catch_all_ok(m):
        return None
    if m.get("content", "") is None:
        return f"content is null (role {m.get('role')!r})"
    calls = m.get("tool_calls")
    if isinstance(calls, list) and not all(map(_call_ok, calls)):
        return "a history tool call lacks a string id, type 'function' or string name and arguments"
    return "the message fits none of its message types (role, content, name or tool_call_id of the wrong type)"


def _part_problem(part: Any) -> str | None:
    if isinstance(part, str):
        return None
    kind = part.get("type") if isinstance(part, dict) else None
    if kind is None and isinstance(part, dict):
        kind = next((k for k in ("image_url", "image_pil", "image_embeds", "audio_url", "input_audio",
                                 "audio_embeds", "video_url") if k in part), None)
    if kind not in KNOWN_PARTS:
        return f"unsupported content part type {kind!r}"
    if kind in MEDIA_PARTS:
        return f"{kind} part: media the kit cannot load (vLLM renders what it can load, refuses the rest)"
    return None


# the part types of OpenAI's message of each role: a list of only these is read as that message, lazily, and a
# text (refusal) part without its text then fails the request; with any other part it is vLLM's catch-all message
OPENAI_PARTS = {"system": ("text",), "tool": ("text",), "assistant": ("text", "refusal"),  # developer: recorded rendered
                "user": ("text", "image_url", "input_audio", "file")}


def _typed_parts_problem(m: dict) -> str | None:
    parts, kinds = m.get("content"), OPENAI_PARTS.get(m.get("role"))
    if not kinds or not isinstance(parts, list) or not parts:
        return None
    if not all(isinstance(p, dict) and p.get("type") in kinds for p in parts):
        return None
    lacking = next((p["type"] for p in parts if p["type"] in TEXT_FIELDS and
                    not isinstance(p.get(TEXT_FIELDS[p["type"]]), str)), None)
    return f"a {lacking} part without its {TEXT_FIELDS[lacking]} (role {m['role']!r})" if lacking else None


def _tools_problem(request: dict) -> str | None:
    tools = request.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list):
        return "tools is not a list"
    for tool in tools:
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            return "a tool's type is not 'function'"
        fn = tool.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            return "a tool has no function object with a string name"
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            return "a tool's parameters are not an object"
    return None


def _choice_problem(request: dict) -> str | None:
    tools, choice = request.get("tools"), request.get("tool_choice")
    if tools == [] and not isinstance(choice, dict):
        tools, choice = None, "none" if choice in ("auto", "required") else choice
    if "tool_choice" not in request or choice == "none" or choice is None:
        return None
    if tools is None:
        return "tool_choice without tools"
    if choice not in ("auto", "required") and not isinstance(choice, dict):
        return f"tool_choice {choice!r} is none of none, auto, required or a named tool"
    if isinstance(choice, dict):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name or not any(t["function"]["name"] == name for t in tools):
            return f"tool_choice names {name!r}, which is not among the tools"
    return None


def check(request: dict, version: str = "vllm-0.34") -> dict:
    """``request`` if that vLLM version renders it, else :class:`Refusal` with the reason (``vllm-0.33`` refuses an
    empty ``tools`` array before anything else; 0.34 reads it as no tools)."""
    if version == "vllm-0.33" and request.get("tools") == []:
        raise Refusal("tools is an empty array (omit it or give a tool)")
    messages = request.get("messages")
    if not isinstance(messages, list):
        raise Refusal("messages is not a list")
    problem = next((f"message {i}: {p}" for i, p in enumerate(map(message_problem, messages)) if p), None)
    problem = problem or _tools_problem(request) or _choice_problem(request)
    if problem is None and request.get("continue_final_message") and request.get("add_generation_prompt", True):
        problem = "continue_final_message with add_generation_prompt (its default: true); they are not compatible"
    if problem is None and _has_lone_surrogate(request.get("tools")):
        problem = "a lone surrogate in the tools: the server cannot encode their declaration"
    if problem is None and request.get("chat_template") is not None:
        problem = "a chat template passed with the request (the server does not trust request templates)"
    if problem is None:
        parts = [p for m in messages if isinstance(m.get("content"), list) for p in m["content"]]
        problem = next((p for p in map(_part_problem, parts) if p), None)
        problem = problem or next((p for p in map(_typed_parts_problem, messages) if p), None)
    if problem:
        raise Refusal(problem)
    return request


def _has_lone_surrogate(value: Any) -> bool:
    """Whether a string in ``value`` holds a lone surrogate (valid JSON, not valid Unicode)."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str) and LONE_SURROGATE.search(node):
            return True
        stack.extend(node.values() if isinstance(node, dict) else node if isinstance(node, list) else ())
    return False


def _text(part: Any) -> str | None:
    if isinstance(part, str):
        return part
    return part.get("text") if isinstance(part, dict) and part.get("type") == "text" else None


def _as_text_part(part: Any) -> Any:
    """A string, refusal, thinking, input or output text part as the text part vLLM reads it as."""
    if isinstance(part, str):
        return {"type": "text", "text": part}
    kind = part.get("type") if isinstance(part, dict) else None
    if kind not in TEXT_FIELDS:
        return part
    text = part.get(TEXT_FIELDS[kind])
    return {"type": "text", "text": text if isinstance(text, str) else ""}  # a part without its text adds nothing


def _dumped_tool(tool: dict) -> dict:
    """A tool as vLLM's model dumps it: ``type``, and a function of its known fields only (``description`` and
    ``parameters`` null when absent; ``strict`` and ``defer_loading`` only when set)."""
    fn = tool["function"]
    out_fn = {"name": fn["name"], "description": fn.get("description"), "parameters": fn.get("parameters")}
    out_fn.update({k: fn[k] for k in ("strict", "defer_loading") if fn.get(k) is not None})
    out = {"type": "function", "function": out_fn}
    return {**out, "defer_loading": tool["defer_loading"]} if tool.get("defer_loading") is not None else out


def _system_merged(messages: list[dict]) -> list[dict]:
    """Developer messages as system ones; every system message merged into one first message when one is not first
    or there are several (vLLM, for templates without a developer role)."""
    if not any(m.get("role") == "developer" for m in messages):
        return messages
    messages = [{k: v for k, v in {**m, "role": "system"}.items() if k != "tools"} if m.get("role") == "developer"
                else m for m in messages]
    systems = [i for i, m in enumerate(messages) if m["role"] == "system"]
    if not systems or systems == [0]:
        return messages
    texts = []
    for i in systems:
        c = messages[i].get("content", "")
        c = "\n".join(t for t in map(_text, c) if t) if isinstance(c, list) else c  # parts joined, empty ones dropped
        if c:
            texts.append(c)
    return [{"role": "system", "content": "\n\n".join(texts)}] + [m for m in messages if m["role"] != "system"]


def served_request(request: dict) -> dict:
    """A checked request (:func:`check`) as vLLM hands it on (see the module)."""
    messages = [{**m, "content": [_as_text_part(p) for p in m["content"]]} if isinstance(m.get("content"), list)
                else m for m in request["messages"]]
    messages = [{**m, "tool_call_id": "None"} if m.get("role") == "tool" and "tool_call_id" in m
                and m["tool_call_id"] is None else m for m in messages]  # the template prints a null id as None
    kwargs = request.get("chat_template_kwargs") if isinstance(request.get("chat_template_kwargs"), dict) else {}
    served = {k: kwargs[k] for k in ("thinking", "preserve_thinking") if k in kwargs}
    served.update(add_generation_prompt=request.get("add_generation_prompt", True) is not False,
                  continue_final_message=request.get("continue_final_message") is True,
                  no_tools=request.get("tools") == [])
    tools = request.get("tools")
    tools = [_dumped_tool(t) for t in tools] if isinstance(tools, list) else tools
    return {**request, "messages": _system_merged(messages), "tools": tools, "_served": served}
