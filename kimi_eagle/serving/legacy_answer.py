"""A Kimi completion parsed the way vLLM's or SGLang's Kimi-K2 parsers parse it (non-streaming paths).

Servers decode the IDs to text (markers spelled out, ``<|im_end|>`` removed: it is the stop) and split
that text on marker *spellings*: a ``</think>`` the model wrote as ordinary tokens ends reasoning just as
the special token does. Then the reasoning parser splits reasoning from content, and the tool parser
takes the calls out of the content. The rules are the :class:`~kimi_eagle.serving.request.ServingProfile`
fields (``split_on="text"`` profiles); docs/reconstruct.md has the table and the source files.

:func:`parse_served_text` returns the fields of a
:class:`~kimi_eagle.chat.parse.ParsedCompletion`; ``parse_completion`` calls it for such profiles.
"""
from __future__ import annotations

import re
from typing import Any

from kimi_eagle.serving.profiles import ServingProfile

THINK, THINK_END = "<think>", "</think>"
SECTION_BEGIN = "<|tool_calls_section_begin|>"
CALL_BEGIN, ARG_BEGIN, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"

_B, _A, _E = (re.escape(m) for m in (CALL_BEGIN, ARG_BEGIN, CALL_END))
# vLLM: any id without '<' that ends in ':N'; arguments up to the first <|tool_call_end|> (no call inside)
_VLLM_CALL = re.compile(rf"{_B}\s*(?P<id>[^<]+:\d+)\s*{_A}\s*(?P<args>(?:(?!{_B}).)*?)\s*{_E}", re.S)
# SGLang: an id of word characters and dots ending in ':N'; arguments one '{...}' on one line
_SGLANG_CALL = re.compile(rf"{_B}\s*(?P<id>[\w.]+:\d+)\s*{_A}\s*(?P<args>\{{.*?\}})\s*{_E}")
_SGLANG_ID = re.compile(r"(?:functions\.)?(?P<name>[\w.]+):(?P<index>\d+)")


def _reasoning_vllm(text: str) -> tuple[str, str | None, bool | None]:
    """vLLM's Kimi-K2 reasoning split: ``(reasoning, content, think_end)``."""
    start = len(THINK) if text.startswith(THINK) else 0
    end = text.find(THINK_END)
    if end >= 0:
        return text[start:end], text[end + len(THINK_END):] or None, True
    section = text.find(SECTION_BEGIN)
    if section >= 0:
        return text[start:section], text[section:] or None, False
    return text[start:], None, None


def _reasoning_sglang(text: str) -> tuple[str, str | None, bool | None]:
    """SGLang's reasoning detector (reasoning forced on): every ``<think>`` removed, the rest stripped."""
    text = text.replace(THINK, "").strip()
    if THINK_END in text:
        reasoning, content = text.split(THINK_END, 1)
        return reasoning, content.strip() or None, True
    section = text.find(SECTION_BEGIN)
    if section >= 0:
        return text[:section].strip(), text[section:], False
    return text, None, None


def _calls(content: str, profile: ServingProfile, history_calls: int,
           renamed: list[str]) -> list[dict[str, Any]]:
    """The calls the server returns from ``content``; ids it replaced are appended to ``renamed``."""
    calls: list[dict[str, Any]] = []
    pattern = _SGLANG_CALL if profile.args_object else _VLLM_CALL
    for m in pattern.finditer(content):
        tool_id, args = m.group("id"), m.group("args")
        whole = m.group(0)
        if whole[len(CALL_BEGIN):whole.index(ARG_BEGIN)] != tool_id or whole[
                whole.index(ARG_BEGIN) + len(ARG_BEGIN):-len(CALL_END)] != args:
            renamed.append("")  # whitespace around the id or the arguments: stripped by the server's regex
        if profile.id_chars == "word_dot":
            idm = _SGLANG_ID.fullmatch(tool_id)
            if idm is None:
                continue
            name = idm.group("name")
        else:
            name = tool_id.split(":")[0].split(".")[-1]
        if profile.id_rule == "sglang":
            renumbered = f"functions.{name}:{history_calls + len(calls)}"
            if renumbered != tool_id:
                renamed.append(tool_id)  # a non-empty entry: an id replaced
            tool_id = renumbered
        calls.append({"id": tool_id, "type": "function", "function": {"name": name, "arguments": args}})
    return calls


def parse_served_text(text: str, profile: ServingProfile, start: str, history_calls: int = 0) -> dict[str, Any]:
    """``text`` (the decoded completion without ``<|im_end|>``) as ``profile``'s server returns it.

    ``start``: where the format's completion begins (``reasoning``, ``think_begin`` or ``content``).
    Returns ``reasoning``, ``content``, ``tool_calls``, ``think_end``, ``section`` (a tool section was
    seen: what ``finish_on_section`` reads), ``dropped`` (calls written, in full or in part, that the
    server did not return), ``renamed`` (returned calls whose id is not the one written) and ``stripped``
    (whitespace the server's parsers removed).
    """
    stripped = False
    if start == "content":
        reasoning, content, think_end = None, text or None, None
    elif profile.strip_reasoning:
        reasoning, content, think_end = _reasoning_sglang(text)
        stripped = len(reasoning or "") + len(content or "") + (len(THINK_END) if think_end else 0) < len(
            text.replace(THINK, ""))
    else:
        reasoning, content, think_end = _reasoning_vllm(text)
    calls: list[dict[str, Any]] = []
    section = content is not None and SECTION_BEGIN in content
    written = 0
    renamed: list[str] = []
    if section:
        calls = _calls(content, profile, history_calls, renamed)
        written = content.count(CALL_BEGIN)
        content = content[:content.find(SECTION_BEGIN)] or None
    return {"reasoning": reasoning or None, "content": content, "tool_calls": calls, "think_end": think_end,
            "section": section, "dropped": max(0, written - len(calls)),
            "renamed": sum(1 for r in renamed if r), "stripped": "" in renamed or stripped}
