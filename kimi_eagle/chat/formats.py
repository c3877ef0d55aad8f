"""Chat formats: render a prompt natively (byte-identical to the official template) and build completions.

A :class:`Format` turns ``messages[:j]`` (+ tools) into prompt pieces ending in the generation
prompt, and an API :class:`~kimi_eagle.chat.completion.Turn` into completion segments. The Kimi
renderers are written in Python from the templates in ``assets/kimi/templates/``; the templates
themselves are only the oracle in the tests. ``hf-template`` plugs in a HF tokenizer's own jinja
chat template (e.g. Qwen3); ``plain`` is for base models such as stories260K.

Formats: ``kimi-k2.5`` (thinking on: the generation prompt ends in ``<think>``),
``kimi-k2.5-nothink`` (thinking off: ``<think></think>``), ``kimi-k2-thinking``, ``kimi-k2-instruct``,
``hf-template``, ``plain``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from kimi_eagle.chat.completion import (
    CONTENT,
    SPECIAL,
    TEXT,
    CompletionOptions,
    Piece,
    Segment,
    Turn,
    choose_tool_id,
    content,
    history_tool_ids,
    kimi_completion,
    special,
    tojson,
)
from kimi_eagle.records import RecordError
from kimi_eagle.tokenize.tokenizer import Tokenizer

Message = dict[str, Any]
KIMI_DEFAULT_SYSTEM = "You are Kimi, an AI assistant created by Moonshot AI."


class Format(Protocol):
    """A chat format: prompt pieces for ``messages`` and completion segments for a turn."""

    name: str
    continuation: bool  # encode the completion as a continuation (no SentencePiece dummy prefix)

    def prompt_pieces(self, messages: Sequence[Message], tools: list | None = None) -> list[Piece]: ...

    def completion_segments(self, turn: Turn, messages: Sequence[Message],
                            options: CompletionOptions) -> tuple[list[Segment], list[str]]: ...


def render(pieces: Sequence[Piece]) -> str:
    """The prompt string the template would render."""
    return "".join(t for t, _ in pieces)


def count_tool_calls(messages: Sequence[Message]) -> int:
    """Tool calls already made by assistant messages (the ``idx`` of ``functions.{name}:{idx}`` continues from here)."""
    return sum(len(m.get("tool_calls") or []) for m in messages if m.get("role") == "assistant")


# --------------------------------------------------------------------------------------------
# Kimi pieces shared by the three templates


def _j(value: Any) -> str:
    """What ``{{ value }}`` prints in jinja: ``str()``, with None as ``"None"``."""
    return value if isinstance(value, str) else str(value)


def _opener(role: str) -> str:
    return "<|im_user|>" if role == "user" else "<|im_assistant|>" if role == "assistant" else "<|im_system|>"


_HEADERS = {role: ((_opener(role), SPECIAL), (role, TEXT), ("<|im_middle|>", SPECIAL))
            for role in ("system", "user", "assistant", "tool")}
_IM_END: Piece = ("<|im_end|>", SPECIAL)
_EMPTY_THINK = (("<think>", SPECIAL), ("</think>", SPECIAL))


def _role_header(m: Message) -> tuple[Piece, ...]:
    role = m["role"]
    name = m.get("name")
    if not name and role in _HEADERS:
        return _HEADERS[role]
    return ((_opener(role), SPECIAL), (_j(name or role), TEXT), ("<|im_middle|>", SPECIAL))


_MEDIA_K25 = [("<|media_begin|>", SPECIAL), ("image", TEXT), ("<|media_content|>", SPECIAL),
              ("<|media_pad|>", SPECIAL), ("<|media_end|>", SPECIAL), ("\n", TEXT)]
_MEDIA_K2 = [("<|media_start|>", SPECIAL), ("image", TEXT), ("<|media_content|>", SPECIAL),
             ("<|media_pad|>", SPECIAL), ("<|media_end|>", SPECIAL), ("\n", TEXT)]


def _content_k25(m: Message) -> list[Piece]:
    c = m.get("content")
    if isinstance(c, str):
        return [(c, CONTENT)] if c else []
    out: list[Piece] = []
    for part in c or ():
        kind = part.get("type")
        if kind in ("image", "image_url"):
            out += _MEDIA_K25
        elif kind in ("video", "video_url"):
            out += [("<|kimi_k25_video_placeholder|>", SPECIAL), ("\n", TEXT)]
        elif "text" in part:  # jinja prints a present None as "None", a missing key as ""
            out.append((_j(part["text"]), CONTENT))
    return out


def _content_k2(m: Message) -> list[Piece]:
    c = m.get("content")
    if isinstance(c, str):
        return [(c, CONTENT)] if c else []
    out: list[Piece] = []
    for part in c or ():
        if part.get("type") == "image" or "image" in part or "image_url" in part:
            out += _MEDIA_K2
        elif "text" in part:  # jinja prints a present None as "None", a missing key as ""
            out.append((_j(part["text"]), CONTENT))
    return out


def _args(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else tojson(arguments)


def _tool_calls(calls: list[dict], ids: Sequence[str]) -> list[Piece]:
    out: list[Piece] = [("<|tool_calls_section_begin|>", SPECIAL)]
    for call, tool_id in zip(calls, ids):
        out += [("<|tool_call_begin|>", SPECIAL), (tool_id, CONTENT), ("<|tool_call_argument_begin|>", SPECIAL),
                (_args(call["function"].get("arguments")), CONTENT), ("<|tool_call_end|>", SPECIAL)]
    out.append(("<|tool_calls_section_end|>", SPECIAL))
    return out


def _tool_return(tool_call_id: str, body: list[Piece]) -> list[Piece]:
    return [(f"## Return of {tool_call_id}\n", TEXT), *body]


# --------------------------------------------------------------------------------------------
# K2.5


@dataclass
class KimiK25:
    """Kimi-K2.5 (``kimi-k2.5.jinja``). History reasoning is dropped up to the last assistant
    message without tool calls unless ``preserve_thinking``; tools are compact JSON unless a
    TypeScript declaration (``tools_ts``) is given."""

    thinking: bool = True
    preserve_thinking: bool = False
    tools_ts: Callable[[list], str | None] | None = None  # None from it: the JSON declaration (Moonshot's fallback)
    name: str = "kimi-k2.5"
    continuation: bool = False

    def prompt_pieces(self, messages: Sequence[Message], tools: list | None = None) -> list[Piece]:
        last = -1
        if not self.preserve_thinking:
            for idx in range(len(messages) - 1, -1, -1):
                if messages[idx]["role"] == "assistant" and not messages[idx].get("tool_calls"):
                    last = idx
                    break
        out: list[Piece] = []
        if tools:
            decl = self.tools_ts(tools) if self.tools_ts else ""
            out += [("<|im_system|>", SPECIAL), ("tool_declare", TEXT), ("<|im_middle|>", SPECIAL),
                    (decl or tojson(tools, separators=(",", ":")), CONTENT), ("<|im_end|>", SPECIAL)]
        for i, m in enumerate(messages):
            out += _role_header(m)
            role = m["role"]
            if role == "assistant":
                if i <= last or not self.thinking:
                    out += _EMPTY_THINK
                else:
                    rc = m.get("reasoning_content", "")
                    out += [("<think>", SPECIAL), (_j(rc), CONTENT), ("</think>", SPECIAL)]
                out += _content_k25(m)
                if m.get("tool_calls"):
                    out += _tool_calls(m["tool_calls"], [_j(c.get("id", "")) for c in m["tool_calls"]])
            elif role == "tool":
                out += _tool_return(_j(m.get("tool_call_id", "")), _content_k25(m))
            elif m.get("content") is not None:
                out += _content_k25(m)
            out.append(_IM_END)
        out += [("<|im_assistant|>", SPECIAL), ("assistant", TEXT), ("<|im_middle|>", SPECIAL), ("<think>", SPECIAL)]
        if not self.thinking:
            out.append(("</think>", SPECIAL))
        return out

    def completion_segments(self, turn: Turn, messages: Sequence[Message],
                            options: CompletionOptions) -> tuple[list[Segment], list[str]]:
        return kimi_completion(turn, count_tool_calls(messages), options, thinking=self.thinking,
                               history_ids=history_tool_ids(messages) if turn.tool_calls else ())


# --------------------------------------------------------------------------------------------
# K2-Thinking and K2-Instruct: ids come from a counter, tool results from a queue


class _ToolIds:
    """The templates' ``tool_call_counter`` and ``tool_response_queue``; with ``request_ids`` a revision of the
    templates that writes the request's own ``id`` and ``tool_call_id`` where they are given."""

    def __init__(self, request_ids: bool = False) -> None:
        self.counter = 0
        self.queue: list[str] = []
        self.request_ids = request_ids

    def calls(self, calls: list[dict]) -> list[str]:
        ids = []
        for call in calls:
            own = call.get("id") if self.request_ids else None
            ids.append(_j(own) if own else f"functions.{_j(call['function']['name'])}:{self.counter}")
            self.counter += 1
        self.queue += ids
        return ids

    def response(self, m: Message) -> str:
        if self.request_ids and m.get("tool_call_id"):
            if self.queue:
                self.queue.pop(0)
            return _j(m["tool_call_id"])
        if self.queue:
            return self.queue.pop(0)
        return f"functions.{_j(m.get('name', 'unknown'))}:{self.counter}"


@dataclass
class KimiK2Thinking:
    """Kimi-K2-Thinking (``kimi-k2-thinking.jinja``): default system prompt, ``tojson`` tools,
    history before the *first* assistant message without tool calls rendered with empty
    ``<think></think>`` (the template's scan has no ``break``)."""

    name: str = "kimi-k2-thinking"
    continuation: bool = False
    request_ids: bool = False  # history ids as the request gives them (a revision of the template; calibration)

    def prompt_pieces(self, messages: Sequence[Message], tools: list | None = None) -> list[Piece]:
        last = -1
        for idx in range(len(messages) - 1, -1, -1):
            if messages[idx]["role"] == "assistant" and not messages[idx].get("tool_calls"):
                last = idx
        out: list[Piece] = []
        if tools:
            out += [("<|im_system|>", SPECIAL), ("tool_declare", TEXT), ("<|im_middle|>", SPECIAL),
                    (tojson(tools), CONTENT), ("<|im_end|>", SPECIAL)]
        if not messages or messages[0]["role"] != "system":
            out += [("<|im_system|>", SPECIAL), ("system", TEXT), ("<|im_middle|>", SPECIAL),
                    (KIMI_DEFAULT_SYSTEM, TEXT), ("<|im_end|>", SPECIAL)]
        ids = _ToolIds(self.request_ids)
        for i, m in enumerate(messages):
            out += _role_header(m)
            role = m["role"]
            if role == "assistant":
                if i <= last:
                    out += [("<think>", SPECIAL), ("</think>", SPECIAL)]
                else:
                    out += [("<think>", SPECIAL), (_j(m.get("reasoning_content", "")), CONTENT), ("</think>", SPECIAL)]
                out += _content_k2(m)
                if m.get("tool_calls"):
                    out += _tool_calls(m["tool_calls"], ids.calls(m["tool_calls"]))
            elif role == "tool":
                out += _tool_return(ids.response(m), _content_k2(m))
            elif m.get("content") is not None:
                out += _content_k2(m)
            out.append(("<|im_end|>", SPECIAL))
        out += [("<|im_assistant|>", SPECIAL), ("assistant", TEXT), ("<|im_middle|>", SPECIAL)]
        return out

    def completion_segments(self, turn: Turn, messages: Sequence[Message],
                            options: CompletionOptions) -> tuple[list[Segment], list[str]]:
        return kimi_completion(turn, count_tool_calls(messages), options, thinking=True, think_begin=True,
                               history_ids=history_tool_ids(messages) if turn.tool_calls else ())


@dataclass
class KimiK2Instruct:
    """Kimi-K2-Instruct (``kimi-k2-instruct.jinja``): no reasoning; the default system prompt is
    followed by a newline (a quirk of the template's whitespace)."""

    name: str = "kimi-k2-instruct"
    continuation: bool = False
    request_ids: bool = False  # history ids as the request gives them (a revision of the template; calibration)

    def prompt_pieces(self, messages: Sequence[Message], tools: list | None = None) -> list[Piece]:
        out: list[Piece] = []
        if tools:
            out += [("<|im_system|>", SPECIAL), ("tool_declare", TEXT), ("<|im_middle|>", SPECIAL),
                    (tojson(tools), CONTENT), ("<|im_end|>", SPECIAL)]
        ids = _ToolIds(self.request_ids)
        for i, m in enumerate(messages):
            if i == 0 and messages[0]["role"] != "system":
                out += [("<|im_system|>", SPECIAL), ("system", TEXT), ("<|im_middle|>", SPECIAL),
                        (KIMI_DEFAULT_SYSTEM, TEXT), ("<|im_end|>", SPECIAL), ("\n", TEXT)]
            out += _role_header(m)
            role = m["role"]
            if role == "assistant" and m.get("tool_calls"):
                out += _content_k2(m)
                out += _tool_calls(m["tool_calls"], ids.calls(m["tool_calls"]))
            elif role == "tool":
                out += _tool_return(ids.response(m), _content_k2(m))
            elif m.get("content") is not None:
                out += _content_k2(m)
            out.append(("<|im_end|>", SPECIAL))
        out += [("<|im_assistant|>", SPECIAL), ("assistant", TEXT), ("<|im_middle|>", SPECIAL)]
        return out

    def completion_segments(self, turn: Turn, messages: Sequence[Message],
                            options: CompletionOptions) -> tuple[list[Segment], list[str]]:
        return kimi_completion(turn, count_tool_calls(messages), options, thinking=False,
                               history_ids=history_tool_ids(messages) if turn.tool_calls else ())


# --------------------------------------------------------------------------------------------
# Plain (base models)


@dataclass
class Plain:
    """A base model: prompt = BOS + the concatenated message contents; completion = content,
    then EOS when ``finish_reason`` is ``stop``. The completion is encoded as a continuation, so
    its token bytes equal the content's UTF-8 bytes (no SentencePiece dummy-prefix space)."""

    bos: str | None = "<s>"
    eos: str = "</s>"
    name: str = "plain"
    continuation: bool = True

    def prompt_pieces(self, messages: Sequence[Message], tools: list | None = None) -> list[Piece]:
        out: list[Piece] = [(self.bos, SPECIAL)] if self.bos else []
        for m in messages:
            c = m.get("content")
            if isinstance(c, str):
                out.append((c, CONTENT))
            elif c:
                out += [(_j(p["text"]), CONTENT) for p in c if p.get("text") is not None]
        return out

    def completion_segments(self, turn: Turn, messages: Sequence[Message],
                            options: CompletionOptions) -> tuple[list[Segment], list[str]]:
        if turn.tool_calls:
            raise RecordError("the plain format has no tool calls")
        flags = ["reasoning_dropped"] if turn.reasoning else []
        segs = [content("content", turn.content)] if turn.content else []
        if turn.finish_reason == "length":
            flags.append("truncated")
        else:
            segs.append(special("im_end", self.eos))
        return segs, flags


# --------------------------------------------------------------------------------------------
# A HF tokenizer's own jinja chat template

MARK_START, MARK_END = "\ue000", "\ue001"  # private-use markers around special spellings in user/model text


class HFTemplateFormat:
    """A HF tokenizer's own jinja chat template (e.g. Qwen3), rendered like ``apply_chat_template``.

    Special spellings inside message text are marked before rendering, so only the template's own
    markers become special tokens. The completion is the template's rendering of the assistant
    message after the generation prompt, cut after the stop token (``eos_token``); segments are
    ``reasoning`` (up to ``</think>``), ``think_end``, ``content`` (tool calls included) and ``im_end``.
    """

    continuation = False

    def __init__(self, chat_template: str, specials: Sequence[str], stop: str, name: str = "hf-template",
                 context: dict | None = None) -> None:
        import re

        from kimi_eagle.chat.template_sandbox import bounded_template

        def _raise(message):
            raise RecordError(f"chat template: {message}")

        self.template = bounded_template(chat_template, _raise)  # render() bounded in steps, time and size
        self.name, self.stop, self.context = name, stop, context or {}
        alts = "|".join(re.escape(t) for t in sorted(specials, key=len, reverse=True))
        self._special = re.compile(alts) if alts else None
        self._split = re.compile(f"{MARK_START}(.*?){MARK_END}" + (f"|({alts})" if alts else ""), re.S)

    @classmethod
    def from_tokenizer(cls, tok: Tokenizer) -> "HFTemplateFormat":
        template = getattr(tok, "chat_template", None)
        if not template:
            raise ValueError(f"{tok.name} has no chat template")
        config = getattr(tok, "config", {})
        stop = _special_or_none(tok, "eos_token")
        if not stop:
            raise ValueError(f"{tok.name} has no eos_token to stop on")
        context = {k: _special_or_none(tok, k) for k in ("bos_token", "eos_token") if config.get(k)}
        return cls(template, list(tok.special_id_by_text), stop, context=context)

    def _mark(self, value: Any) -> Any:
        if isinstance(value, str):
            if MARK_START in value or MARK_END in value:
                raise RecordError("text contains the private-use characters U+E000/U+E001")
            return self._special.sub(lambda m: MARK_START + m.group() + MARK_END, value) if self._special else value
        if isinstance(value, dict):
            return {k: self._mark(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._mark(v) for v in value]
        return value

    def _render(self, messages: Sequence[Message], tools: list | None, add_generation_prompt: bool) -> str:
        import jinja2

        try:
            # ``content: null`` (tool-call turns) becomes "", which templates such as Qwen3's can handle
            messages = [m if m.get("content") is not None else {**m, "content": ""} for m in messages]
            return self.template.render(messages=self._mark(messages), tools=self._mark(tools) if tools else None,
                                        add_generation_prompt=add_generation_prompt, **self.context)
        except jinja2.TemplateError as e:
            raise RecordError(f"chat template: {e}") from None

    def _pieces(self, text: str) -> list[Piece]:
        out: list[Piece] = []
        pos = 0
        for m in self._split.finditer(text):
            if m.start() > pos:
                out.append((text[pos:m.start()], TEXT))
            out.append((m.group(1), CONTENT) if m.group(1) is not None else (m.group(), SPECIAL))
            pos = m.end()
        if pos < len(text):
            out.append((text[pos:], TEXT))
        return out

    def prompt_pieces(self, messages: Sequence[Message], tools: list | None = None) -> list[Piece]:
        return self._pieces(self._render(messages, tools, True))

    def completion_segments(self, turn: Turn, messages: Sequence[Message],
                            options: CompletionOptions) -> tuple[list[Segment], list[str]]:
        msg: dict[str, Any] = {"role": "assistant", "content": turn.content or ""}
        if turn.reasoning:
            msg["reasoning_content"] = turn.reasoning
        first = count_tool_calls(messages)
        if turn.tool_calls:
            history = history_tool_ids(messages)
            msg["tool_calls"] = [{"id": choose_tool_id(c, first + k, options.tool_id_policy, history),
                                  "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                 for k, c in enumerate(turn.tool_calls)]
        prompt = self._render(messages, None, True)
        full = self._render([*messages, msg], None, False)
        if not full.startswith(prompt):
            raise RecordError(f"{self.name}: the template's rendering of this turn does not extend its prompt")
        suffix = full[len(prompt):]
        flags: list[str] = []
        end = suffix.rfind(self.stop)
        if end < 0:
            raise RecordError(f"{self.name}: the rendered turn has no stop token {self.stop!r}")
        body = suffix[:end]
        think = body.find("</think>")
        if turn.finish_reason == "length":
            flags.append("truncated")
            if not turn.content and not turn.tool_calls and think >= 0:
                body = body[:think]
                think = -1
        segs: list[Segment] = []
        if think >= 0:
            segs += [Segment("reasoning", tuple(self._pieces(body[:think]))), special("think_end", "</think>")]
            body = body[think + len("</think>"):]
        if body:
            segs.append(Segment("content", tuple(self._pieces(body))))
        if turn.finish_reason != "length":
            segs.append(special("im_end", self.stop))
        return segs, flags


# --------------------------------------------------------------------------------------------
# Registry


def _special_or_none(tok: Tokenizer | None, key: str) -> str | None:
    if tok is None:
        return None
    value = getattr(tok, "config", {}).get(key)
    if isinstance(value, dict):
        value = value.get("content")
    return value


def get_format(name: str, tokenizer: Tokenizer | None = None, tool_declaration: str = "json") -> Format:
    """The chat format called ``name``; ``hf-template`` and ``plain`` read the tokenizer's config.

    ``tool_declaration`` (K2.5 only): ``json`` (the template's default, compact JSON) or ``ts``
    (the TypeScript-style declaration Moonshot's tokenizer passes as ``tools_ts_str``).
    """
    if tool_declaration not in TOOL_DECLARATIONS:
        raise ValueError(f"unknown tool declaration {tool_declaration!r}; known: {', '.join(TOOL_DECLARATIONS)}")
    ts = None
    if tool_declaration == "ts":
        from kimi_eagle.chat.tool_decl import typescript_or_none as ts
    if name == "kimi-k2.5":
        return KimiK25(thinking=True, tools_ts=ts)
    if name == "kimi-k2.5-nothink":
        return KimiK25(thinking=False, tools_ts=ts, name=name)
    if name == "kimi-k2-thinking":
        return KimiK2Thinking()
    if name == "kimi-k2-instruct":
        return KimiK2Instruct()
    if name == "plain":
        bos = _special_or_none(tokenizer, "bos_token") if tokenizer is not None else "<s>"
        eos = _special_or_none(tokenizer, "eos_token") if tokenizer is not None else "</s>"
        return Plain(bos=bos, eos=eos or "</s>")
    if name == "hf-template":
        if tokenizer is None:
            raise ValueError("format 'hf-template' needs a tokenizer with a chat template")
        return HFTemplateFormat.from_tokenizer(tokenizer)
    raise ValueError(f"unknown format {name!r}; known: {', '.join(FORMATS)}")


FORMATS = ("kimi-k2.5", "kimi-k2.5-nothink", "kimi-k2-thinking", "kimi-k2-instruct", "hf-template", "plain")
RECORD_FORMATS = ("auto", *FORMATS)  # what reconstruct accepts: auto picks one per record by its model name
TOOL_DECLARATIONS = ("json", "ts")
