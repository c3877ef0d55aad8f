"""The Kimi assistant turn as typed segments: the pieces a completion is rendered from.

A rendered text is a list of *pieces* ``(text, kind)``: ``SPECIAL`` pieces are exactly one
special-token spelling written by the template; ``TEXT`` pieces are template literals; ``CONTENT``
pieces are user/model text (never turned into special tokens, flagged when they spell one).
A *segment* is a typed run of pieces (``reasoning``, ``think_end``, ``content`` ...); a *span* is a
segment's place in the encoded completion (see :mod:`kimi_eagle.reconstruct.encoder`).

``kimi_completion`` renders an API :class:`Turn` (reasoning, content, tool calls, finish reason) as
the segments the K2.5 / K2 templates write after the generation prompt, with tool ids normalised
to the model's own ``functions.{name}:{idx}``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, NamedTuple

TEXT, SPECIAL, CONTENT = 0, 1, 2
Piece = tuple[str, int]

# Segment kinds (docs/CONTRACTS.md). ``think_begin`` is the K2-Thinking completion's leading ``<think>``.
SEGMENT_KINDS = (
    "think_begin", "reasoning", "think_end", "content", "tool_section_begin", "tool_call_begin", "tool_id",
    "tool_arg_begin", "tool_args", "tool_call_end", "tool_section_end", "im_end",
)


class Segment(NamedTuple):
    kind: str
    pieces: tuple[Piece, ...]

    @property
    def text(self) -> str:
        return "".join(t for t, _ in self.pieces)


def special(kind: str, text: str) -> Segment:
    return Segment(kind, ((text, SPECIAL),))


def content(kind: str, text: str) -> Segment:
    return Segment(kind, ((text, CONTENT),))


SPAN_FIELDS = ("kind", "byte_start", "byte_end", "tok_start", "tok_end")


class Span(NamedTuple):
    """A segment's place in the completion: bytes of the completion string, indexes into its IDs."""

    kind: str
    byte_start: int
    byte_end: int
    tok_start: int
    tok_end: int

    def to_dict(self) -> dict[str, Any]:
        return self._asdict()


@dataclass
class ToolCall:
    id: str | None
    name: str
    arguments: Any  # a string is kept verbatim; anything else is serialised like the template's ``tojson``


@dataclass
class Turn:
    """The generated assistant message, as the API returned it."""

    reasoning: str | None
    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str = "stop"


@dataclass(frozen=True)
class CompletionOptions:
    """How API fields become the completion (defaults match the official templates).

    ``omit_think_end_before_tools``: the model may go from reasoning straight into the tool section;
    engines then split reasoning at the tool marker. True omits ``</think>`` when a message has
    reasoning and tool calls but no content.
    ``keep_tool_ids``: write the API's tool-call ids instead of the model's own
    ``functions.{name}:{idx}`` (idx counted over the whole conversation).
    """

    omit_think_end_before_tools: bool = False
    keep_tool_ids: bool = False


def tojson(value: Any, separators: tuple[str, str] | None = None) -> str:
    """The chat templates' ``tojson`` (HF's: no HTML escaping, no key sorting, non-ASCII kept)."""
    return json.dumps(value, ensure_ascii=False, separators=separators)


def arguments_text(arguments: Any) -> tuple[str, bool]:
    """Tool-call arguments as the template writes them, and whether they are valid JSON."""
    if isinstance(arguments, str):
        try:
            json.loads(arguments)
            return arguments, True
        except ValueError:
            return arguments, False
    return tojson(arguments), True


def normalised_tool_id(name: str, index: int) -> str:
    return f"functions.{name}:{index}"


def kimi_completion(turn: Turn, first_call_index: int, options: CompletionOptions, *,
                    thinking: bool, think_begin: bool = False) -> tuple[list[Segment], list[str]]:
    """Kimi's assistant suffix for ``turn`` after the generation prompt, as segments, plus flags.

    ``thinking``: the format has reasoning (K2.5 thinking on, K2-Thinking); ``think_begin``: the
    completion itself opens with ``<think>`` (K2-Thinking, whose generation prompt does not).
    ``first_call_index``: tool calls already in the conversation (for ``functions.{name}:{idx}``).
    """
    flags: list[str] = []
    segs: list[Segment] = []
    truncated = turn.finish_reason == "length"
    if truncated:
        flags.append("truncated")
    if thinking:
        if not turn.reasoning:
            flags.append("no_reasoning")
        if think_begin:
            segs.append(special("think_begin", "<think>"))
        if turn.reasoning:
            segs.append(content("reasoning", turn.reasoning))
        cut_in_reasoning = truncated and not turn.content and not turn.tool_calls
        if cut_in_reasoning:
            return segs, flags
        if options.omit_think_end_before_tools and turn.reasoning and turn.tool_calls and not turn.content:
            flags.append("no_think_end")
        else:
            segs.append(special("think_end", "</think>"))
    elif turn.reasoning:
        flags.append("reasoning_dropped")
    if turn.content:
        segs.append(content("content", turn.content))
    if turn.tool_calls:
        segs.append(special("tool_section_begin", "<|tool_calls_section_begin|>"))
        for k, call in enumerate(turn.tool_calls):
            tool_id = normalised_tool_id(call.name, first_call_index + k)
            if options.keep_tool_ids and call.id:
                tool_id = call.id
            elif call.id is not None and call.id != tool_id and "tool_id_normalised" not in flags:
                flags.append("tool_id_normalised")
            args, is_json = arguments_text(call.arguments)
            if not is_json and "args_not_json" not in flags:
                flags.append("args_not_json")
            segs += [
                special("tool_call_begin", "<|tool_call_begin|>"),
                content("tool_id", tool_id),
                special("tool_arg_begin", "<|tool_call_argument_begin|>"),
                content("tool_args", args),
                special("tool_call_end", "<|tool_call_end|>"),
            ]
        segs.append(special("tool_section_end", "<|tool_calls_section_end|>"))
    if not truncated:
        segs.append(special("im_end", "<|im_end|>"))
    return segs, flags
