"""The inverse of reconstruction: a raw Kimi completion (engine IDs or text) -> the API message, as written.

``parse_written`` reads what K2.5 / K2 wrote after the generation prompt and returns what a Kimi
parser in SGLang or vLLM hands back: reasoning, content, tool calls with their ids and argument
strings, and the finish reason. The rules follow those servers' Kimi-K2 reasoning and tool parsers:

- reasoning ends at ``</think>`` or, without one, at ``<|tool_calls_section_begin|>`` (K2.5 may go
  from reasoning, or from the prompt's ``<think>``, straight into tool calls); without either it is
  all reasoning (cut off);
- content is the text before the tool section; empty reasoning or content is ``None``;
- a call is ``<|tool_call_begin|>ID<|tool_call_argument_begin|>ARGS<|tool_call_end|>``; the name
  comes from the id (``functions.NAME:N`` or ``NAME:N``); an id of another shape cannot be parsed
  (both servers skip such a call: flag ``tool_id_unparsed``);
- an unterminated last call keeps the arguments it has (as newer vLLM and SGLang's streaming do):
  flag ``truncated_in_tool_call``;
- the id returned is the one the model wrote (vLLM), or with ``tool_ids="sglang"`` SGLang's
  ``functions.NAME:{history_tool_calls + N}``.

From **IDs**, only special tokens are markers: marker text written as ordinary tokens stays text
(flag ``literal_marker``) — servers, which parse decoded text, would split there. From **text**,
marker spellings are markers. ``strip=True`` strips whitespace as the servers' regexes do (around
ids and arguments; reasoning before an implicit tool section is right-stripped); the default keeps
the bytes, so that reconstructing a well-formed parsed message gives back the same bytes.

``answer_conventions`` compares an API answer with the engine's own output for the diff report:
the style of each tool-call id, whether the ids are the model's, whether ``</think>`` preceded the
tools, whether whitespace was stripped.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from kimi_eagle.chat.completion import CompletionOptions, tool_id_style
from kimi_eagle.tokenize.tokenizer import Tokenizer

THINK, THINK_END = "<think>", "</think>"
SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, ARG_BEGIN, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
IM_END = "<|im_end|>"
MARKERS = (THINK, THINK_END, SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARG_BEGIN, CALL_END, IM_END)
_MARKER_RE = re.compile("|".join(re.escape(m) for m in sorted(MARKERS, key=len, reverse=True)))
_ID_NAME = re.compile(r"(?:functions\.)?(?P<name>[\w.\-]+):(?P<index>\d+)")

# where the completion starts, per format: reasoning first, or a leading <think> to skip, or content
PARSE_FORMATS = {"kimi-k2.5": "reasoning", "kimi-k2-thinking": "think_begin", "kimi-k2.5-nothink": "content",
                 "kimi-k2-instruct": "content"}
TOOL_ID_OUTPUTS = ("model", "sglang")


@dataclass
class ParsedCompletion:
    """A Kimi completion as the API message a server returns for it.

    ``think_end``: whether ``</think>`` was written (``None`` when the format has no reasoning or the
    output was cut inside reasoning); ``n_tokens``: how many IDs were parsed (``None`` for text);
    ``flags``: what the parse noticed (docs/reconstruct.md, "The inverse parser").
    """

    reasoning: str | None
    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str = "stop"
    think_end: bool | None = None
    n_tokens: int | None = None
    flags: list[str] = field(default_factory=list)

    def message(self) -> dict[str, Any]:
        """The OpenAI/OpenRouter assistant message."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content, "reasoning": self.reasoning}
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return msg

    def response(self) -> dict[str, Any]:
        """A ``chat.completion`` response holding the message (usage counts the parsed IDs)."""
        out: dict[str, Any] = {"object": "chat.completion",
                               "choices": [{"index": 0, "finish_reason": self.finish_reason, "message": self.message()}]}
        if self.n_tokens is not None:
            out["usage"] = {"completion_tokens": self.n_tokens}
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"message": self.message(), "finish_reason": self.finish_reason, "think_end": self.think_end,
                "n_tokens": self.n_tokens, "flags": list(self.flags)}


# --------------------------------------------------------------------------------------------
# Units: text runs and markers


def _units_from_ids(ids: Sequence[int], tok: Tokenizer, flags: list[str]) -> list[tuple[str, bool]]:
    """``(text, is_marker)`` runs of IDs: Kimi marker specials are markers, everything else text."""
    marker_ids = {tok.special_id_by_text[m]: m for m in MARKERS if m in tok.special_id_by_text}
    units: list[tuple[str, bool]] = []
    buf: list[bytes] = []

    def flush() -> None:
        if buf:
            raw = b"".join(buf)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = raw.decode("utf-8", "replace")  # e.g. a cut inside a character: U+FFFD, named by a flag
                if "invalid_utf8" not in flags:
                    flags.append("invalid_utf8")
            units.append((text, False))
            buf.clear()

    for i in ids:
        i = int(i)
        marker = marker_ids.get(i)
        if marker is not None:
            flush()
            units.append((marker, True))
            continue
        if tok.is_special(i) and "other_special" not in flags:
            flags.append("other_special")
        buf.append(tok.token_bytes(i))
    flush()
    if any(not is_marker and _MARKER_RE.search(text) for text, is_marker in units):
        flags.append("literal_marker")
    return units


def _units_from_text(text: str) -> list[tuple[str, bool]]:
    units: list[tuple[str, bool]] = []
    pos = 0
    for m in _MARKER_RE.finditer(text):
        if m.start() > pos:
            units.append((text[pos:m.start()], False))
        units.append((m.group(), True))
        pos = m.end()
    if pos < len(text):
        units.append((text[pos:], False))
    return units


# --------------------------------------------------------------------------------------------
# The parser


@dataclass(frozen=True)
class ParseOptions:
    """How :func:`parse_completion` reads a completion.

    ``format_name``: the chat format (:data:`PARSE_FORMATS`). ``finish_reason``: overrides the one read
    from the output (``stop``/``tool_calls`` when it ends with ``<|im_end|>``, else ``length``; servers
    strip ``<|im_end|>`` from text, so pass it for text). ``strip``: strip whitespace as the servers'
    regexes do. ``tool_ids``: ``model`` (the id the model wrote) or ``sglang``
    (``functions.NAME:{history_tool_calls + N}``). ``serving``: the serving profile whose server's
    answer to return (:func:`kimi_eagle.serving.answer.parse_completion`; ``template``, the default, is the parse as written;
    ``vllm``/``sglang`` split the decoded text on marker spellings as those servers do, and ``strip`` and
    ``tool_ids`` then come from the profile).
    """

    format_name: str = "kimi-k2.5"
    finish_reason: str | None = None
    strip: bool = False
    tool_ids: str = "model"
    history_tool_calls: int = 0
    serving: Any = "template"  # a profile name or a ServingProfile (read by kimi_eagle.serving.answer)
    tools: tuple | list | None = None


def _cut_at_im_end(units: list[tuple[str, bool]], flags: list[str]) -> tuple[list[tuple[str, bool]], bool]:
    """The units before ``<|im_end|>`` and whether it was written (what follows it is flagged, not parsed)."""
    for k, (text, is_marker) in enumerate(units):
        if is_marker and text == IM_END:
            if k + 1 < len(units):
                flags.append("text_after_im_end")  # generation stops at <|im_end|>: what follows is not the turn
            return units[:k], True
    return units, False


def _read_text(units: list[tuple[str, bool]], start: str, flags: list[str]) -> tuple[list[str], list[str], bool | None, str, int]:
    """Reasoning and content up to the tool section: ``(reasoning, content, think_end, state, pos)``, where
    ``state`` is ``tools`` when a tool section begins at ``units[pos]`` and ``start`` the state to begin in."""
    pos = 0
    if start == "think_begin":
        if units and units[0] == (THINK, True):
            pos, start = 1, "reasoning"
        else:
            start = "content"
    reasoning: list[str] = []
    content: list[str] = []
    think_end: bool | None = None
    state = start
    while pos < len(units) and state in ("reasoning", "content"):
        text, is_marker = units[pos]
        pos += 1
        if not is_marker:
            (reasoning if state == "reasoning" else content).append(text)
        elif state == "reasoning" and text == THINK_END:
            think_end, state = True, "content"
        elif text == SECTION_BEGIN:
            if state == "reasoning":
                think_end = False
                flags.append("no_think_end")
            state = "tools"
        else:  # a marker with no role here: servers leave its text in place
            (reasoning if state == "reasoning" else content).append(text)
            flags.append(f"stray_marker:{text}")
    return reasoning, content, think_end if start != "content" else None, state, pos


@dataclass(frozen=True)
class WrittenRules:
    """What an older server transcription changes in the parse as written: ``strip`` whitespace as its regexes do,
    ``drop_unterminated`` a cut last call, ``renumber`` ids as SGLang's ``functions.NAME:{history + N}``, and when a
    tool section makes the finish ``tool_calls`` (``finish_on_section``: ``never``, ``on_stop``, ``always``)."""

    strip: bool = False
    drop_unterminated: bool = False
    renumber: bool = False
    finish_on_section: str = "never"


def completion_units(source: Sequence[int] | str, tok: Tokenizer | None,
                     flags: list[str]) -> tuple[list[tuple[str, bool]], int | None, bool]:
    """``(units before <|im_end|>, number of IDs or None for text, whether <|im_end|> was written)``."""
    if isinstance(source, str):
        units, n_tokens = _units_from_text(source), None
    else:
        if tok is None:
            raise ValueError("parsing IDs needs the tokenizer")
        units, n_tokens = _units_from_ids(list(source), tok, flags), len(source)
    units, ended = _cut_at_im_end(units, flags)
    return units, n_tokens, ended


def check_parse_options(options: ParseOptions) -> None:
    if options.format_name not in PARSE_FORMATS:
        raise ValueError(f"cannot parse format {options.format_name!r}; known: {', '.join(PARSE_FORMATS)}")
    if options.tool_ids not in TOOL_ID_OUTPUTS:
        raise ValueError(f"unknown tool_ids {options.tool_ids!r}; known: {', '.join(TOOL_ID_OUTPUTS)}")


def parse_written(source: Sequence[int] | str, tok: Tokenizer | None = None, options: ParseOptions = ParseOptions(),
                  rules: WrittenRules = WrittenRules()) -> ParsedCompletion:
    """A raw completion (engine IDs, needing ``tok``, or text with markers spelled out) parsed as written: the
    API message the template's own conventions give (``options.serving`` is not read: a server's answer is
    :func:`kimi_eagle.serving.answer.parse_completion`)."""
    check_parse_options(options)
    flags: list[str] = []
    units, n_tokens, ended = completion_units(source, tok, flags)
    reasoning, content, think_end, state, pos = _read_text(units, PARSE_FORMATS[options.format_name], flags)
    if state == "reasoning":  # cut off, or (not well-formed) <|im_end|> with no </think> before it
        flags.append("truncated_in_reasoning" if not ended else "reasoning_not_closed")
    strip = options.strip or rules.strip
    calls = _parse_tool_section(units[pos:], flags, strip) if state == "tools" else []
    reasoning_text = "".join(reasoning)
    if strip and think_end is False:
        reasoning_text = reasoning_text.rstrip()
    if rules.drop_unterminated and "truncated_in_tool_call" in flags and calls:
        calls.pop()
        flags.append("dropped_by_server")
    if options.tool_ids == "sglang" or rules.renumber:
        for call in calls:
            index = int(_ID_NAME.fullmatch(call["id"]).group("index"))
            call["id"] = f"functions.{call['function']['name']}:{options.history_tool_calls + index}"
    finish = options.finish_reason or finish_reason(ended, bool(calls), state == "tools", rules.finish_on_section)
    return ParsedCompletion(reasoning=reasoning_text or None, content="".join(content) or None, tool_calls=calls,
                            finish_reason=finish, think_end=think_end, n_tokens=n_tokens, flags=flags)


def finish_reason(ended: bool, called: bool, section: bool, finish_on_section: str = "never") -> str:
    """The finish reason a server reports: ``stop``/``length`` by the stop, ``tool_calls`` by ``finish_on_section``."""
    natural = "stop" if ended else "length"
    if called and ended or section and (finish_on_section == "always" or finish_on_section == "on_stop" and ended):
        return "tool_calls"
    return natural


def _parse_tool_section(units: list[tuple[str, bool]], flags: list[str], strip: bool) -> list[dict[str, Any]]:
    """Calls of a tool section (``units`` after ``<|tool_calls_section_begin|>``)."""
    calls: list[dict[str, Any]] = []
    k = 0
    while k < len(units):
        text, is_marker = units[k]
        if is_marker and text == SECTION_END:
            if k + 1 < len(units):
                flags.append("text_after_tool_section")  # servers keep only the text before the section
            break
        if not (is_marker and text == CALL_BEGIN):
            flags.append("text_in_tool_section")  # between calls: servers ignore it
            k += 1
            continue
        # <|tool_call_begin|> ID <|tool_call_argument_begin|> ARGS <|tool_call_end|>
        tool_id = units[k + 1][0] if k + 1 < len(units) and not units[k + 1][1] else ""
        j = k + 1 + (1 if tool_id else 0)
        if j >= len(units) or units[j] != (ARG_BEGIN, True):
            if j >= len(units):
                flags.append("truncated_in_tool_id")  # cut before the arguments: no call to return
            else:
                flags.append("malformed_tool_call")
            k = j
            continue
        args = units[j + 1][0] if j + 1 < len(units) and not units[j + 1][1] else ""
        j += 1 + (1 if j + 1 < len(units) and not units[j + 1][1] else 0)
        terminated = j < len(units) and units[j] == (CALL_END, True)
        if not terminated and j < len(units):
            flags.append("malformed_tool_call")
        elif not terminated:
            flags.append("truncated_in_tool_call")
        clean_id = tool_id.strip()  # both servers' regexes allow whitespace around the id
        if clean_id != tool_id or (strip and args.strip() != args):
            flags.append("whitespace_stripped")
        m = _ID_NAME.fullmatch(clean_id)
        if m is None:
            flags.append("tool_id_unparsed")
        else:
            calls.append({"id": clean_id, "type": "function",
                          "function": {"name": m.group("name"), "arguments": args.strip() if strip else args}})
        k = j + (1 if terminated else 0)
    flags[:] = list(dict.fromkeys(flags))
    return calls


def api_record(parsed: ParsedCompletion, messages: Sequence[dict], tools: list | None = None,
               rid: str = "parsed") -> dict[str, Any]:
    """The API record a server would have logged for ``parsed`` (input of ``reconstruct_record``)."""
    request: dict[str, Any] = {"messages": list(messages)}
    if tools:
        request["tools"] = tools
    return {"id": rid, "request": request, "response": parsed.response()}


def reconstruction_options(parsed: ParsedCompletion, tool_ids: str = "auto") -> CompletionOptions:
    """The completion options under which reconstructing ``parsed`` gives back its output: ``</think>``
    omitted before tools exactly when the output omitted it."""
    return CompletionOptions(omit_think_end_before_tools=parsed.think_end is False, tool_ids=tool_ids)


# --------------------------------------------------------------------------------------------
# Conventions of an API answer (for the diff report)


def think_end_before_tools(ids: Sequence[int], tok: Tokenizer, format_name: str = "kimi-k2.5") -> bool | None:
    """Did the engine output write ``</think>`` before its tool section? ``None`` without tools or reasoning."""
    parsed = parse_written(ids, tok, ParseOptions(format_name=format_name))
    return parsed.think_end if parsed.tool_calls else None


def answer_conventions(api_message: dict[str, Any], engine: ParsedCompletion) -> dict[str, Any]:
    """Which conventions an API answer follows, judged against the engine's output of the same turn.

    Returns ``tool_id_styles`` (:func:`~kimi_eagle.chat.completion.tool_id_style` of each API id),
    ``tool_ids_as_written`` (the API ids are the ids the model wrote; ``None`` without tool calls),
    ``think_end_before_tools`` (the engine wrote ``</think>`` before its tools; ``None`` without tools),
    ``whitespace_stripped`` (an API text equals the engine's only after stripping whitespace; ``None``
    when no text differs in whitespace only and none matched exactly either).
    """
    api_calls = [c for c in api_message.get("tool_calls") or [] if isinstance(c, dict)]
    api_ids = [c.get("id") for c in api_calls]
    styles = [tool_id_style(i) if isinstance(i, str) else "missing" for i in api_ids]
    as_written = None
    if api_calls and engine.tool_calls:
        as_written = api_ids == [c["id"] for c in engine.tool_calls]
    pairs = [(api_message.get("reasoning") or api_message.get("reasoning_content"), engine.reasoning),
             (api_message.get("content"), engine.content)]
    pairs += [((a.get("function") or {}).get("arguments"), e["function"]["arguments"])
              for a, e in zip(api_calls, engine.tool_calls)]
    stripped = exact = False
    for api_text, engine_text in pairs:
        if not isinstance(api_text, str) or not isinstance(engine_text, str):
            continue
        if api_text == engine_text:
            exact = exact or engine_text != engine_text.strip()
        elif api_text == engine_text.strip() or api_text.strip() == engine_text.strip() and len(api_text) < len(engine_text):
            stripped = True
    return {"tool_id_styles": styles, "tool_ids_as_written": as_written,
            "think_end_before_tools": engine.think_end if engine.tool_calls else None,
            "whitespace_stripped": True if stripped else False if exact else None}


# --------------------------------------------------------------------------------------------
# Command line: kimi-eagle parse-completion


def parse_id_list(text: str) -> list[int]:
    """IDs from text: a JSON list, or integers separated by commas or whitespace."""
    text = text.strip()
    if text.startswith("["):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"--ids: not a JSON list of integers ({e})") from None
    else:
        value = [x for x in re.split(r"[\s,]+", text) if x]
    try:
        return [int(x) for x in value]
    except (TypeError, ValueError):
        raise ValueError("--ids: IDs must be integers separated by commas or spaces, or a JSON list") from None
