"""The Kimi assistant turn as typed segments: the pieces a completion is rendered from.

A rendered text is a list of *pieces* ``(text, kind)``: ``SPECIAL`` pieces are exactly one
special-token spelling written by the template; ``TEXT`` pieces are template literals; ``CONTENT``
pieces are user/model text (never turned into special tokens, flagged when they spell one).
A *segment* is a typed run of pieces (``reasoning``, ``think_end``, ``content`` ...); a *span* is a
segment's place in the encoded completion (see :mod:`kimi_eagle.chat.encoder`).

``kimi_completion`` renders an API :class:`Turn` (reasoning, content, tool calls, finish reason) as
the segments the K2.5 / K2 templates write after the generation prompt, with tool-call ids chosen by
the id policy (``auto``: keep what the model could have written, replace server-made ids with the
model's own ``functions.{name}:{idx}``).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Sequence

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


TOOL_ID_POLICIES = ("auto", "normalise", "keep")

# the flags :func:`kimi_completion` (and the record checks after it) write for the server conventions
# (docs/reconstruct.md, "Completion options"); ``{policy}`` is the tool-id policy in force
CONVENTION_FLAGS = ("truncated", "truncated_in_tool_call", "truncation_ambiguous", "no_think_end", "no_reasoning",
                    "tool_ids_{policy}", "tool_id_normalised", "args_not_json")


@dataclass(frozen=True)
class CompletionOptions:
    """How API fields become the completion (defaults match the official templates).

    ``omit_think_end_before_tools``: K2.5 can go from reasoning (or straight from the prompt's
    ``<think>``) into the tool section without ``</think>``; engines then split reasoning at the tool
    marker. True omits ``</think>`` whenever a message has tool calls and no content, reasoning empty
    or not (flag ``no_think_end``). Only engine IDs can tell which a provider's model does.
    ``tool_ids``: ``auto`` (keep an id the model could have written, see :func:`model_could_write`;
    replace a server-made one with ``functions.{name}:{idx}``), ``normalise`` (always
    ``functions.{name}:{idx}``, idx counted over the whole conversation) or ``keep`` (the API's ids).
    ``keep_tool_ids``: the older spelling of ``tool_ids="keep"``. ``unterminated_call``: ``keep`` (a length
    cut inside the tool section kept the last call's partial arguments: the template's reading) or ``drop``
    (the server dropped an unterminated call, as vLLM and SGLang do: every returned call was complete, the
    IDs after the last known byte are unknown, see :func:`dropped_prefix`).
    """

    omit_think_end_before_tools: bool = False
    keep_tool_ids: bool = False
    tool_ids: str = "auto"
    unterminated_call: str = "keep"

    def __post_init__(self) -> None:
        if self.tool_ids not in TOOL_ID_POLICIES:
            raise ValueError(f"unknown tool-id policy {self.tool_ids!r}; known: {', '.join(TOOL_ID_POLICIES)}")
        if self.unterminated_call not in ("keep", "drop"):
            raise ValueError(f"unknown unterminated_call {self.unterminated_call!r}; known: keep, drop")

    @property
    def tool_id_policy(self) -> str:
        """The policy in force (``keep_tool_ids=True`` means ``keep``)."""
        return "keep" if self.keep_tool_ids else self.tool_ids


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


# --------------------------------------------------------------------------------------------
# Tool-call ids: what the model writes, what servers make up

_KIMI_ID = re.compile(r"functions\.([\w.\-]+):(\d+)")
_NAME_INDEX_ID = re.compile(r"([\w.\-]+):(\d+)")
_COUNTER_ID = re.compile(r"\d+")
_ID_PIECE = re.compile(r"[A-Za-z0-9]+|[^A-Za-z0-9]")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")

# the styles :func:`tool_id_style` names (docs/reconstruct.md, "Tool-call ids")
TOOL_ID_STYLES = ("kimi", "name_index", "counter", "chatcmpl_tool", "call_random", "call_counter", "toolu", "uuid",
                  "other")


def tool_id_style(tool_id: str) -> str:
    """The style of a tool-call id: ``kimi`` (``functions.NAME:N``, what K2/K2.5 write), ``name_index``
    (``NAME:N``), ``counter`` (``N``), ``chatcmpl_tool`` (vLLM's made-up ``chatcmpl-tool-<hex>``),
    ``call_random`` (``call_`` + 20 or more random characters, OpenAI style), ``call_counter``
    (``call_N``), ``toolu`` (Anthropic's ``toolu_…``), ``uuid``, or ``other``."""
    if _KIMI_ID.fullmatch(tool_id):
        return "kimi"
    if _NAME_INDEX_ID.fullmatch(tool_id):
        return "name_index"
    if _COUNTER_ID.fullmatch(tool_id):
        return "counter"
    if tool_id.startswith("chatcmpl-tool-"):
        return "chatcmpl_tool"
    if tool_id.startswith("call_"):
        rest = tool_id[5:]
        if rest.isdigit():
            return "call_counter"
        if len(rest) >= 20 and rest.isalnum():
            return "call_random"
    if tool_id.startswith("toolu_"):
        return "toolu"
    if _UUID.fullmatch(tool_id):
        return "uuid"
    return "other"


def id_signature(tool_id: str) -> str:
    """The shape of an id, to compare ids of one style: a leading alphabetic prefix and separators are
    kept, a run of digits becomes ``9`` (counters grow), any other alphanumeric run ``x{length}``.
    ``call_3`` and ``call_12`` share ``call_9``; ``call_Ab3…`` (24) is ``call_x24``; a UUID is
    ``x8-x4-x4-x4-x12`` (its hex runs may be all digits: ``9`` is read as ``x{n}`` there too)."""
    out: list[str] = []
    pieces = _ID_PIECE.findall(tool_id)
    for k, piece in enumerate(pieces):
        if not piece.isalnum():
            out.append(piece)
        elif piece.isalpha() and k + 1 < len(pieces) and not pieces[k + 1].isalnum() and all(
                p.isalpha() or not p.isalnum() for p in pieces[:k]):
            out.append(piece)  # a word prefix: call_, toolu_, chatcmpl-tool-
        elif piece.isdigit() and not (k + 1 < len(pieces) and pieces[k + 1] == "-") and not (k and pieces[k - 1] == "-"):
            out.append("9")
        else:
            out.append(f"x{len(piece)}")
    return "".join(out)


def model_could_write(tool_id: str, history_ids: Sequence[str] = ()) -> bool:
    """Could the model itself have written ``tool_id``? Yes for ``functions.NAME:N``, ``NAME:N``, a
    bare counter, and an id shaped like one already in the conversation's history (the model copies
    the style it sees: a client that rewrote history ids to ``call_3`` or UUIDs gets them back)."""
    if _KIMI_ID.fullmatch(tool_id) or _NAME_INDEX_ID.fullmatch(tool_id) or _COUNTER_ID.fullmatch(tool_id):
        return True
    if not history_ids:
        return False
    sig = id_signature(tool_id)
    return any(id_signature(h) == sig for h in history_ids)


def history_tool_ids(messages: Sequence[dict]) -> list[str]:
    """Every tool-call id the model sees in a conversation: assistant ``tool_calls[].id`` and tool
    messages' ``tool_call_id``."""
    ids: list[str] = []
    for m in messages:
        if m.get("role") == "assistant":
            ids += [c["id"] for c in m.get("tool_calls") or () if isinstance(c, dict) and isinstance(c.get("id"), str)]
        elif m.get("role") == "tool" and isinstance(m.get("tool_call_id"), str):
            ids.append(m["tool_call_id"])
    return ids


def choose_tool_id(call: ToolCall, index: int, policy: str, history_ids: Sequence[str] = ()) -> str:
    """The id written for ``call`` (the ``index``-th tool call of the conversation) under ``policy``."""
    own = normalised_tool_id(call.name, index)
    if not call.id or policy == "normalise":
        return own
    if policy == "keep" or model_could_write(call.id, history_ids):
        return call.id
    return own


# --------------------------------------------------------------------------------------------
# The assistant turn


def kimi_completion(turn: Turn, first_call_index: int, options: CompletionOptions, *,
                    thinking: bool, think_begin: bool = False,
                    history_ids: Sequence[str] = ()) -> tuple[list[Segment], list[str]]:
    """Kimi's assistant suffix for ``turn`` after the generation prompt, as segments, plus flags.

    ``thinking``: the format has reasoning (K2.5 thinking on, K2-Thinking); ``think_begin``: the
    completion itself opens with ``<think>`` (K2-Thinking, whose generation prompt does not).
    ``first_call_index``: tool calls already in the conversation (for ``functions.{name}:{idx}``);
    ``history_ids``: the tool-call ids already in the conversation (for the ``auto`` id policy).

    ``finish_reason == "length"``: the completion ends where the API text ends: no ``<|im_end|>``;
    cut inside reasoning: no ``</think>``; with tool calls: no ``<|tool_call_end|>`` and no
    ``<|tool_calls_section_end|>`` after the last call (flag ``truncated_in_tool_call``); the message
    cannot tell whether the call was closed, so :func:`resolve_truncation` picks the candidate by
    billing. Without billing, complete-JSON arguments are flagged ``truncation_ambiguous`` (incomplete
    ones mean the cut was inside them).
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
        if options.omit_think_end_before_tools and turn.tool_calls and not turn.content:
            flags.append("no_think_end")
        else:
            segs.append(special("think_end", "</think>"))
    elif turn.reasoning:
        flags.append("reasoning_dropped")
    if turn.content:
        segs.append(content("content", turn.content))
    if turn.tool_calls:
        segs += _tool_section(turn, first_call_index, options.tool_id_policy, history_ids, flags,
                              options.unterminated_call == "keep")
    elif turn.finish_reason == "tool_calls" and options.unterminated_call == "drop":
        # a server that drops unparsed calls says tool_calls for a section that returned none: the section
        # began, what followed is unknown
        segs.append(special("tool_section_begin", "<|tool_calls_section_begin|>"))
        flags.append("dropped_by_server")
        return segs, flags
    if not truncated:
        segs.append(special("im_end", "<|im_end|>"))
    return segs, flags


def _tool_section(turn: Turn, first_call_index: int, policy: str, history_ids: Sequence[str],
                  flags: list[str], cut_in_last_call: bool = True) -> list[Segment]:
    """The tool section of ``turn`` (its flags appended to ``flags``); a length cut ends it after the last
    call's arguments (flag ``truncated_in_tool_call``, and ``truncation_ambiguous`` for complete JSON), or,
    without ``cut_in_last_call`` (servers that drop an unterminated call), after the last call's end."""
    truncated = turn.finish_reason == "length"
    flags.append(f"tool_ids_{policy}")
    segs = [special("tool_section_begin", "<|tool_calls_section_begin|>")]
    last = len(turn.tool_calls) - 1
    for k, call in enumerate(turn.tool_calls):
        tool_id = choose_tool_id(call, first_call_index + k, policy, history_ids)
        if call.id is not None and call.id != tool_id and "tool_id_normalised" not in flags:
            flags.append("tool_id_normalised")
        args, is_json = arguments_text(call.arguments)
        if not is_json and "args_not_json" not in flags:
            flags.append("args_not_json")
        segs += [
            special("tool_call_begin", "<|tool_call_begin|>"),
            content("tool_id", tool_id),
            special("tool_arg_begin", "<|tool_call_argument_begin|>"),
            content("tool_args", args),
        ]
        if truncated and k == last and cut_in_last_call:
            flags.append("truncated_in_tool_call")
            if is_json:
                flags.append("truncation_ambiguous")
            return segs
        segs.append(special("tool_call_end", "<|tool_call_end|>"))
    if truncated and not cut_in_last_call:
        return segs
    segs.append(special("tool_section_end", "<|tool_calls_section_end|>"))
    return segs


def dropped_prefix(segments: list[Segment], flags: list[str], n_tokens: int, billed_tokens: int | None,
                   finish_reason: str) -> tuple[list[Segment], list[str]]:
    """What is known of a completion whose server may have dropped an unterminated call (``drop`` rule).

    A server that drops calls returns every *complete* one; when billing says the model wrote more tokens
    than the message holds (``billed_tokens != n_tokens``) for a ``length`` cut or a ``tool_calls`` finish,
    the IDs after the last call's end are unknown: the segments end there (no ``<|tool_calls_section_end|>``,
    no ``<|im_end|>``: nothing the model may not have written) and the row is flagged ``dropped_by_server``.
    """
    if "dropped_by_server" in flags:
        return segments, flags
    if finish_reason not in ("length", "tool_calls") or billed_tokens is None or billed_tokens == n_tokens:
        return segments, flags
    if not any(s.kind == "tool_section_begin" for s in segments) and finish_reason != "length":
        return segments, flags
    kept = list(segments)
    while kept and kept[-1].kind in ("im_end", "tool_section_end"):
        kept.pop()
    return kept, [*flags, "dropped_by_server"]


# what may follow a length cut right after the last call's complete arguments, one token each
_CLOSERS = (special("tool_call_end", "<|tool_call_end|>"), special("tool_section_end", "<|tool_calls_section_end|>"))


def resolve_truncation(segments: list[Segment], flags: list[str], n_tokens: int,
                       billed_tokens: int | None) -> tuple[list[Segment], list[str]]:
    """Pick the candidate of a cut in the tool section by the billed completion tokens.

    ``segments`` (flagged ``truncated_in_tool_call``) end with the last call's arguments
    (``n_tokens`` IDs). The model may have been cut there, after ``<|tool_call_end|>``, or after
    ``<|tool_calls_section_end|>``: each closer is one special token, so the candidate whose length
    equals ``billed_tokens`` is chosen, ``truncation_ambiguous`` dropped and ``truncation_resolved_by_billing``
    added (so a billing check can tell that the count agrees by construction). Billing that matches none:
    unchanged, flagged ``truncation_ambiguous``; billing absent: unchanged (ambiguous only if the
    arguments were complete JSON, as :func:`kimi_completion` flagged).
    """
    if "truncated_in_tool_call" not in flags or billed_tokens is None:
        return segments, flags
    extra = billed_tokens - n_tokens
    if not 0 <= extra <= len(_CLOSERS):
        return segments, flags if "truncation_ambiguous" in flags else [*flags, "truncation_ambiguous"]
    return segments + list(_CLOSERS[:extra]), [*(f for f in flags if f != "truncation_ambiguous"),
                                               "truncation_resolved_by_billing"]
