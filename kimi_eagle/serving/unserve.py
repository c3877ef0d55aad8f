"""From a server's answer back to what the model wrote: undo what the profile's server did to the text.

:mod:`kimi_eagle.serving.vllm_answer` says what a server version returns for engine IDs; this module goes
the other way for reconstruction. What the server added is taken away exactly (the detokenizer's spaces
around Kimi's markers); what it removed cannot be recovered, and the row is flagged where that may have
changed the IDs:

- ``reasoning_end_unknown``: the server right-strips reasoning, so whitespace the model wrote before
  ``</think>`` (or before a cut) is unknown;
- ``before_tools_unknown``: calls and no content: the model may have written ``</think>`` and
  whitespace-only content before the section, or gone straight from reasoning into it;
- ``arguments_whitespace_unknown``: the server strips the arguments (non-streamed), so whitespace around
  them is unknown; ``empty_arguments_ambiguous``: ``{}`` may stand for empty arguments;
- ``content_end_unknown``: content ending in the detokenizer's space with no call returned: a tool
  section the server did not return (or cut right after its opener) may follow;
- ``tool_id_unknown``: the server replaced an id it could not read with a random one: the model's id is lost.

SGLang 0.5 (``answer_rules = "sglang-0.5"``) adds no space and strips neither reasoning nor content, so its
text is kept as it is (``""`` content is none); its parsers remove, and the row is flagged:

- ``tool_id_renumbered``: every id is SGLang's ``functions.NAME:{history calls + position}``; the id the model
  wrote (its own index, ``NAME:N``, a bare counter, whitespace around it) is not in the answer;
- ``arguments_whitespace_unknown`` (non-streamed): whitespace around ids and arguments is dropped;
  ``dropped_by_server`` (non-streamed, length cut with calls): the call the cut was in is dropped;
- ``before_tools_unknown``: calls and no content, as above; ``content_end_unknown``: no call and no content
  (the reasoning may have run into a tool section SGLang dropped), or streamed content beside calls (it also
  holds the text the model wrote between and after its calls, markers deleted);
- ``empty_arguments_ambiguous`` (streamed): ``{}`` as the last call's arguments may be SGLang's completion of
  empty (or ``{``) arguments;
- ``invalid_utf8``: a character cut by the end of the output comes back as U+FFFD.

>>> from kimi_eagle.chat.completion import Turn, ToolCall
>>> from kimi_eagle.serving.profiles import get_profile
>>> turn = Turn(" I look.", " Sure. ", [ToolCall("functions.get:0", "get", '{"q": 1}')], "tool_calls")
>>> back, flags = unserve_turn(turn, get_profile("vllm-0.33"))
>>> back.reasoning, back.content
('I look.', 'Sure.')
"""
from __future__ import annotations

from dataclasses import replace

from kimi_eagle.chat.completion import ToolCall, Turn
from kimi_eagle.serving.profiles import ServingProfile

RANDOM_ID = "chatcmpl-tool-"


def _unspace_lead(text: str | None, spaces: bool) -> str | None:
    """``text`` without the one space the detokenizer put after the marker before it."""
    if text is None or not spaces:
        return text
    return text[1:] if text.startswith(" ") else text


def unserve_turn(turn: Turn, profile: ServingProfile, thinking: bool = True) -> tuple[Turn, list[str]]:
    """``turn`` (the server's answer) as the model wrote it under ``profile``, and the flags of what is unknown.

    Only profiles with server ``answer_rules`` change anything; ``legacy`` ones return ``turn`` as it is.
    ``thinking``: the format has reasoning (its trailing whitespace, or reasoning of whitespace only, is lost).
    """
    if profile.answer_rules == "legacy":
        return turn, []
    if profile.answer_rules == "sglang-0.5":
        return _unserve_sglang(turn, profile.streaming)
    spaces, stream = profile.spaces_between_special_tokens, profile.streaming
    flags = ["reasoning_end_unknown"] if thinking or turn.reasoning is not None else []
    reasoning = _unspace_lead(turn.reasoning, spaces)
    content = _unspace_lead(turn.content, spaces)
    calls = turn.tool_calls
    if content is not None and spaces and content.endswith(" "):
        if calls:
            content = content[:-1]  # the space before <|tool_calls_section_begin|>
        else:
            flags.append("content_end_unknown")  # the model's space, or the one before a section the server dropped
    if calls and content is None:
        flags.append("before_tools_unknown")
    out = [_unserve_call(c, spaces, stream, k == len(calls) - 1 and turn.finish_reason == "length", flags)
           for k, c in enumerate(calls)]
    return replace(turn, reasoning=reasoning or None, content=content or None, tool_calls=out), list(
        dict.fromkeys(flags))


def _unserve_call(call: ToolCall, spaces: bool, stream: bool, cut: bool, flags: list[str]) -> ToolCall:
    args = call.arguments
    if isinstance(call.id, str) and call.id.startswith(RANDOM_ID):
        flags.append("tool_id_unknown")
    if not isinstance(args, str):
        return call
    if stream:
        if spaces:
            args = args[1:] if args.startswith(" ") else args
            args = args[:-1] if not cut and args.endswith(" ") else args
        return replace(call, arguments=args)
    flags.append("arguments_whitespace_unknown")
    if args == "{}":
        flags.append("empty_arguments_ambiguous")
    return call


def _unserve_sglang(turn: Turn, stream: bool) -> tuple[Turn, list[str]]:
    """SGLang 0.5 (:mod:`kimi_eagle.serving.sglang_answer`): its text is the model's (no space added, nothing
    stripped from reasoning or content), its ``""`` content is none; what its parsers removed is flagged."""
    flags: list[str] = []
    calls = turn.tool_calls
    content = turn.content or None
    if any(isinstance(t, str) and "\ufffd" in t for t in [turn.reasoning, turn.content, *(c.arguments for c in calls)]):
        flags.append("invalid_utf8")  # the decode released a cut character as U+FFFD
    if calls:
        flags.append("tool_id_renumbered")  # every id is functions.NAME:{history + position}: the model's is unknown
        if content is None:
            flags.append("before_tools_unknown")
        if not stream:
            flags.append("arguments_whitespace_unknown")  # whitespace around ids and arguments dropped
            if turn.finish_reason == "length":
                flags.append("dropped_by_server")  # the cut came after the last call returned: a cut call is dropped
        elif content is not None:
            flags.append("content_end_unknown")  # streamed content also holds the text between and after calls
        if stream and calls[-1].arguments == "{}":
            flags.append("empty_arguments_ambiguous")  # SGLang completes empty (or "{") last arguments to {}
    elif content is None and turn.reasoning:
        flags.append("content_end_unknown")  # reasoning may have run into a tool section SGLang dropped
    return replace(turn, reasoning=turn.reasoning or None, content=content), flags
