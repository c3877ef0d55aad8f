"""The API message SGLang 0.5 returns for a raw Kimi completion (engine IDs), as its code does it.

Written from SGLang 0.5.23's observable behaviour (``--reasoning-parser kimi_k2 --tool-call-parser kimi_k2``),
read off its answers to the seeded corpus in ``tests/data/servers`` (``tools/server_vectors/collect_sglang.py``
runs SGLang's own serving code on it). :func:`sglang_answer` has the shape of
:func:`~kimi_eagle.serving.vllm_answer.served_answer` and returns the same
:class:`~kimi_eagle.serving.vllm_answer.ServedAnswer`.

**Decode** (``DetokenizerManager`` with Kimi's slow tokenizer): a raw tiktoken decode of the IDs (invalid
UTF-8 replaced), no space put around added tokens whatever ``spaces_between_special_tokens`` says; the
tokenizer's 16 special IDs (``<|im_end|>``, ``[EOS]``, ``<|im_user|>``...; not ``<think>`` nor the tool markers)
removed unless tools are declared (``skip_special_tokens`` is turned off then); the stop token left out.
Text is released per scheduler output as the new text of a decode window that starts at the last committed
offset; a window ending in U+FFFD is not committed (only its text up to the last space is released).

**Reasoning** (kimi_k2 reasoning parser, reasoning forced by K2.5's template): leading ``<think>`` removed;
reasoning ends at the first ``</think>`` or, with none, right before ``<|tool_calls_section_begin|>`` (the
opener stays in the text); without either, everything is reasoning. Whitespace is kept; an empty reasoning is
``null``. A ``<think>`` inside the reasoning stays (non-streamed). Streamed, the parser sees one chunk at a
time: the first ``<think>`` anywhere is removed (and reopens the reasoning), and an opener ends the reasoning
unless a ``</think>`` after it came in the same chunk (the kit releases one token per chunk, SGLang's
default ``stream_interval``).

**Tool calls** (kimi_k2 detector), read only when tools are declared and ``tool_choice`` is not ``none``:

- non-streamed: when the text holds ``<|tool_calls_section_begin|>``, every
  ``<|tool_call_begin|> ID <|tool_call_argument_begin|> {...} <|tool_call_end|>`` anywhere in it is a call
  (the arguments a brace-delimited span, the shortest that is followed by the end marker; whitespace around
  id and arguments dropped); content is the text before the opener (``""`` when empty, never ``null``);
  calls whose id does not resolve are skipped, a cut call is dropped (no end marker); a section that yields
  no call still leaves only the text before it;
- the id resolves as ``functions.NAME:N`` / ``NAME:N`` (name ``[\\w.-]+``) or as a bare counter ``N`` whose
  name is inferred: the only declared tool, or the tool whose parameter names best match the argument keys;
- ids are renumbered ``functions.NAME:{history tool calls + position among the returned calls}``; ``stop``
  becomes ``tool_calls`` when a call is returned;
- streamed (the incremental detector): content is the text with the five tool markers deleted, text
  between and after calls included; a call is returned once its header resolves, with its arguments as
  written (any text, cut ones too, whitespace kept); a header that cannot resolve is skipped up to its end
  marker, one followed by another ``<|tool_call_begin|>`` is discarded; a trailing fragment that may start a
  marker is held (and lost at the end); the last call gets ``{}``'s missing characters when its arguments are
  empty or just ``{`` (SGLang completes it against ``{}``).

Without tools the text is returned as decoded, markers and all (minus the removed special IDs).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Sequence

from kimi_eagle.serving.parser_engine import ARG, CALL, CALL_END, SECTION, SECTION_END, THINK, THINK_END
from kimi_eagle.serving.vllm_answer import ServedAnswer, prompt_tail
from kimi_eagle.tokenize.tokenizer import Tokenizer

DECODE_OFFSET = 5  # prompt IDs the first decode window starts with (SGLang's initial incremental offset)
NONSTREAM_INTERVAL = 50  # tokens per scheduler output when not streaming (SGLANG_FORCE_STREAM_INTERVAL)
STREAM_INTERVAL = 1  # tokens per scheduler output when streaming (SGLang's default stream_interval)
STRIPPED_MARKERS = (SECTION, SECTION_END, CALL, CALL_END, ARG)  # deleted from streamed content, in this order
HELD_PREFIXES = (SECTION, CALL)  # a trailing fragment of one of these is held by the streamed detector

_CALL = re.compile(re.escape(CALL) + r"\s*(?P<id>[^\s<|]+)\s*" + re.escape(ARG) + r"\s*(?P<args>\{.*?\})\s*"
                   + re.escape(CALL_END), re.S)
_NAMED_ID = re.compile(r"(?:functions\.)?(?P<name>[\w.\-]+):(?P<index>\d+)")
_COUNTER_ID = re.compile(r"\d+")


@dataclass(frozen=True)
class SglangOptions:
    """The request context SGLang's answer depends on.

    ``tools``: the request's tools (``None``: unknown; calls are parsed, bare counters resolve to nothing);
    ``tool_choice``: ``None``/``"auto"`` (calls parsed when tools are declared) or ``"none"``;
    ``history_tool_calls``: the tool calls of the request's assistant messages (the renumbering offset);
    ``chunk_ends``: the token counts at which the scheduler handed output to the detokenizer (``None``:
    every :data:`STREAM_INTERVAL` tokens when streaming, every :data:`NONSTREAM_INTERVAL` otherwise).
    """

    streaming: bool = False
    thinking: bool = True
    finish_reason: str = "stop"
    prompt_tail: tuple[int, ...] = (163606,)
    tools: tuple | None = ()
    tool_choice: str | None = None
    history_tool_calls: int = 0
    stop_ids: frozenset[int] = frozenset({163585, 163586})
    chunk_ends: tuple[int, ...] | None = None

    @property
    def parses_calls(self) -> bool:
        return (self.tools is None or bool(self.tools)) and self.tool_choice != "none"


def sglang_answer(ids: Sequence[int], tok: Tokenizer, opts: SglangOptions) -> ServedAnswer:
    """What SGLang 0.5 (the ``sglang-0.5*`` profiles) returns for the engine's output ``ids``."""
    ids = [int(i) for i in ids]
    stopped = opts.finish_reason == "stop" and bool(ids) and ids[-1] in opts.stop_ids
    deltas = released_text(ids, tok, skip_special=not opts.parses_calls, ends=_chunk_ends(len(ids), opts),
                           prompt_tail=opts.prompt_tail, trim_stop=stopped)
    tools = list(opts.tools or ())
    written = sum(1 for i in ids if i == tok.special_id_by_text.get(CALL))
    if opts.streaming:
        reasoning, content, calls = _streamed(deltas, tools, opts)
    else:
        reasoning, content, calls = _whole("".join(deltas), tools, opts)
    api_calls = [{"id": f"functions.{name}:{opts.history_tool_calls + k}", "type": "function",
                  "function": {"name": name, "arguments": args}} for k, name, args in calls]
    finish = "tool_calls" if api_calls and opts.finish_reason == "stop" else opts.finish_reason
    return ServedAnswer(reasoning=reasoning or None, content=content, tool_calls=api_calls, finish_reason=finish,
                        calls_written=written, text="".join(deltas))


def _chunk_ends(n: int, opts: SglangOptions) -> list[int]:
    if opts.chunk_ends is not None:
        return [e for e in opts.chunk_ends if 0 < e <= n] or [n]
    step = STREAM_INTERVAL if opts.streaming else NONSTREAM_INTERVAL
    return list(range(step, n, step)) + [n]


# --------------------------------------------------------------------------------------------
# The detokenizer


def _decode(ids: Sequence[int], tok: Tokenizer, skipped: frozenset[int]) -> str:
    return b"".join(tok.token_bytes(i) for i in ids if i not in skipped).decode("utf-8", "replace")


def _printable(text: str) -> str:
    """What of an uncommitted window is released: all after a newline or a CJK character, else up to the last space."""
    if text.endswith("\n"):
        return text
    if text and _cjk(text[-1]):
        return text
    if len(text) > 1 and _cjk(text[-2]):
        return text[:-1]
    return text[:text.rfind(" ") + 1]


def _cjk(ch: str) -> bool:
    cp = ord(ch)
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2B73F
            or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF
            or 0x2F800 <= cp <= 0x2FA1F)


def released_text(ids: Sequence[int], tok: Tokenizer, skip_special: bool, ends: Sequence[int],
                  prompt_tail: Sequence[int] = (), trim_stop: bool = False) -> list[str]:
    """The text SGLang's detokenizer releases per scheduler output (``ends``: the output's token counts).

    Each output decodes the window from the last committed offset to the newest ID and releases what it adds
    to the window's committed part; a window whose text ends in U+FFFD (a cut character) is not committed,
    and only its printable part is released (the rest follows later). The last output (``trim_stop``: without
    the stop token) releases everything not yet released.
    """
    skipped = tok.skipped_special_ids if skip_special else frozenset()
    window = [int(i) for i in prompt_tail][-DECODE_OFFSET:]
    surr, read = 0, len(window)
    committed, sent = "", 0
    out: list[str] = []
    start = 0
    for k, end in enumerate(ends):
        window.extend(ids[start:end])
        start = end
        last = k == len(ends) - 1
        read_ids = window[surr:-1] if last and trim_stop else window[surr:]
        base = _decode(window[surr:read], tok, skipped)
        new = _decode(read_ids, tok, skipped)[len(base):]
        if last:
            out.append((committed + new)[sent:])
            break
        pending = sent - len(committed)
        if new and not new.endswith("\ufffd"):
            committed += new
            surr, read = read, len(window)
            sent = len(committed)
            out.append(new[pending:])
        else:
            shown = _printable(new)
            sent = len(committed) + len(shown)
            out.append(shown[pending:])
    return out


# --------------------------------------------------------------------------------------------
# Non-streamed: the whole text at once


def split_reasoning(text: str, thinking: bool = True) -> tuple[str, str]:
    """``(reasoning, rest)`` of the whole text (the kimi_k2 reasoning parser, non-streamed)."""
    if not thinking and THINK not in text:
        return "", text
    while text.startswith(THINK):
        text = text[len(THINK):]
    if THINK_END in text:
        reasoning, rest = text.split(THINK_END, 1)
        return reasoning, rest
    at = text.find(SECTION)
    return (text[:at], text[at:]) if at != -1 else (text, "")


def _whole(text: str, tools: list, opts: SglangOptions) -> tuple[str, str, list[tuple[int, str, str]]]:
    reasoning, rest = split_reasoning(text, opts.thinking)
    if not opts.parses_calls or SECTION not in rest:
        return reasoning, rest, []
    calls: list[tuple[int, str, str]] = []
    try:
        for m in _CALL.finditer(rest):
            name = _resolve(m.group("id"), tools, m.group("args"))
            if name is not None:
                calls.append((len(calls), name, m.group("args")))
    except Exception:  # SGLang's detector fails as a whole: the text comes back unparsed
        return reasoning, rest, []
    return reasoning, rest[:rest.find(SECTION)], calls


def _resolve(tool_id: str, tools: list, args: str) -> str | None:
    """The function name of a call header (``None``: the call is skipped); raises where SGLang's detector does."""
    if tool_id:
        named = _NAMED_ID.fullmatch(tool_id)
        if named:
            return named.group("name")
        if not _COUNTER_ID.fullmatch(tool_id):
            return None
    return infer_tool_name(tools, args)


def infer_tool_name(tools: list, args: str) -> str | None:
    """The tool a bare-counter call means: the only one declared, or the best match of its parameter names to
    the argument keys (overlap minus extra keys; first best wins; tools without parameters never)."""
    if not tools:
        return None
    if len(tools) == 1:
        return _tool_name(tools[0])
    if not args:
        return None
    try:
        keys = set(json.loads(args).keys())  # a non-object raises AttributeError: SGLang's detector fails
    except (json.JSONDecodeError, TypeError):
        return None
    best, best_score = None, -1
    for tool in tools:
        props = set(_properties(_parameters(tool)))
        if not props:
            continue
        score = len(keys & props) - len(keys - props)
        if score > best_score:
            best, best_score = _tool_name(tool), score
    return best


def _function(tool: Any) -> dict:
    fn = tool.get("function") if isinstance(tool, dict) else None
    return fn if isinstance(fn, dict) else {}


def _tool_name(tool: Any) -> str | None:
    return _function(tool).get("name")


def _parameters(tool: Any) -> Any:
    return _function(tool).get("parameters") or {}


def _properties(schema: Any) -> dict:
    """A schema's top-level properties, or those of its anyOf/oneOf/allOf branches when it declares none."""
    if not isinstance(schema, dict):
        return {}
    if isinstance(schema.get("properties"), dict):
        return schema["properties"]
    merged: dict = {}
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list):
            for branch in schema[key]:
                for name, value in _properties(branch).items():
                    merged.setdefault(name, value)
    return merged


# --------------------------------------------------------------------------------------------
# Streamed: the incremental parsers, chunk by chunk


def _partial_tail(text: str, token: str) -> int:
    """The length of the longest end of ``text`` that is a proper prefix of ``token``."""
    for n in range(min(len(text), len(token) - 1), 0, -1):
        if token.startswith(text[-n:]):
            return n
    return 0


class _StreamReasoning:
    """The kimi_k2 reasoning parser fed chunk by chunk: ``feed`` -> ``(reasoning, rest)``."""

    def __init__(self, thinking: bool) -> None:
        self.buf, self.inside, self.think_removed = "", thinking, False

    def feed(self, chunk: str) -> tuple[str, str]:
        text = self.buf = self.buf + chunk
        if any(t != text and t.startswith(text) for t in (THINK, THINK_END, SECTION)):
            return "", ""  # all of it may still become a marker
        if not self.think_removed and THINK in text:  # the first <think>, wherever it is
            text = self.buf = text.replace(THINK, "", 1)
            self.think_removed, self.inside = True, True
        if not self.inside:
            self.buf = ""
            return "", text
        end = text.find(THINK_END)  # the first </think>, even after a section opener
        if end != -1:
            self.buf, self.inside = "", False
            return text[:end], text[end + len(THINK_END):]
        opener = text.find(SECTION)  # no </think>: a section opener ends the reasoning and stays in the text
        if opener != -1:
            self.buf, self.inside = "", False
            return text[:opener], text[opener:]
        markers = (THINK_END, SECTION) if self.think_removed else (THINK_END, SECTION, THINK)
        held = max(_partial_tail(text, m) for m in markers)
        self.buf = text[len(text) - held:]
        return text[:len(text) - held], ""

    def finish(self) -> tuple[str, str]:
        text, self.buf = self.buf, ""
        if not self.inside:
            return "", text
        return text[len(THINK):] if text.startswith(THINK) else text, ""


class _StreamCalls:
    """The kimi_k2 detector fed chunk by chunk: ``feed`` -> ``(content, [(index, name or None, args)])``."""

    def __init__(self, tools: list) -> None:
        self.tools = tools
        self.buf = ""
        self.name: str | None = None  # the call in flight
        self.sent = ""  # its arguments released so far
        self.index = -1
        self.args: list[str] = []  # released arguments per call index

    def _drop_call(self) -> None:
        self.name, self.sent = None, ""

    def feed(self, chunk: str) -> tuple[str, list[tuple[int, str | None, str]]]:
        self.buf += chunk
        if self.name is None and SECTION not in self.buf and CALL not in self.buf:
            return self._release(self.buf), []
        content: list[str] = []
        calls: list[tuple[int, str | None, str]] = []
        try:
            self._scan(content, calls)
        except Exception:  # SGLang's detector drops its buffer on any error
            self.buf = ""
            self._drop_call()
        return "".join(content), calls

    def _release(self, text: str) -> str:
        """``text`` less a held trailing fragment that may start a marker, with the tool markers deleted."""
        held = ""
        for n in range(min(len(text), max(map(len, HELD_PREFIXES)) - 1), 1, -1):
            if any(m.startswith(text[-n:]) for m in HELD_PREFIXES):
                text, held = text[:-n], text[-n:]
                break
        self.buf = held
        for marker in STRIPPED_MARKERS:
            text = text.replace(marker, "")
        return text

    def _scan(self, content: list[str], calls: list[tuple[int, str | None, str]]) -> None:
        while True:
            begin = self.buf.find(CALL)
            if begin == -1:
                text = self._release(self.buf)
                if text:
                    content.append(text)
                return
            if begin > 0:
                content.append(self._strip(self.buf[:begin]))
                self.buf = self.buf[begin:]
            buf = self.buf
            arg = buf.find(ARG)
            again = buf.find(CALL, len(CALL))
            if again != -1 and (arg == -1 or again < arg):  # a header cut by another call: discarded
                self.buf = buf[again:]
                self._drop_call()
                continue
            if arg == -1:
                return  # the header is not complete yet
            start, end = arg + len(ARG), buf.find(CALL_END)
            fresh = False
            if self.name is None:
                name = _stream_resolve(buf[len(CALL):arg].strip(), self.tools,
                                       buf[start:end] if end != -1 else buf[start:])
                if name is None:
                    if end == -1:
                        return  # wait for the end marker before giving up
                    self.buf = buf[end + len(CALL_END):]
                    self._drop_call()
                    continue
                self.name, fresh = name, True
                self.index = max(self.index, 0)
                while len(self.args) <= self.index:
                    self.args.append("")
            args = buf[start:end] if end != -1 else buf[start:]
            new = args[len(self.sent):]
            if new or fresh:
                calls.append((self.index, self.name if fresh else None, new))
                self.sent += new
                self.args[self.index] += new
            if end == -1:
                return
            self.buf = buf[end + len(CALL_END):]
            self.index += 1
            self._drop_call()

    @staticmethod
    def _strip(text: str) -> str:
        for marker in STRIPPED_MARKERS:
            text = text.replace(marker, "")
        return text

    def completion(self) -> tuple[int, str] | None:
        """What SGLang appends to the last call at the end: the rest of ``{}`` when its arguments are a prefix of it."""
        if not self.args:
            return None
        last = len(self.args) - 1  # the highest call index whose header resolved
        got = self.args[last]
        rest = "{}"[len(got):] if "{}".startswith(got) else ""
        return (last, rest) if rest else None


def _stream_resolve(tool_id: str, tools: list, args: str) -> str | None:
    if not tool_id:
        return infer_tool_name(tools, args)
    return _resolve(tool_id, tools, args)


def _streamed(deltas: Sequence[str], tools: list, opts: SglangOptions) -> tuple[str, str, list[tuple[int, str, str]]]:
    reasoner = _StreamReasoning(opts.thinking)
    detector = _StreamCalls(tools) if opts.parses_calls else None
    reasoning: list[str] = []
    content: list[str] = []
    slots: dict[int, list[str | None]] = {}  # index -> [name, arguments]
    for k, delta in enumerate(deltas):
        r, rest = reasoner.feed(delta)
        if k == len(deltas) - 1:
            r_end, rest_end = reasoner.finish()
            r, rest = r + r_end, rest + rest_end
        reasoning.append(r)
        if detector is None:
            content.append(rest)
            continue
        text, calls = detector.feed(rest)
        content.append(text)
        for index, name, args in calls:
            slot = slots.setdefault(index, [None, ""])
            slot[0] = name or slot[0]  # a client keeps the latest name (and id) sent for an index
            slot[1] = (slot[1] or "") + args
    if detector is not None and deltas:
        done = detector.completion()
        if done is not None:
            slots.setdefault(done[0], [None, ""])[1] += done[1]
    calls_out = [(k, slots[k][0] or "", slots[k][1] or "") for k in sorted(slots)]
    return "".join(reasoning), "".join(content), calls_out


# --------------------------------------------------------------------------------------------
# As a ParsedCompletion, with flags naming what the server changed


def sglang_flags(answer: ServedAnswer, written: Any) -> list[str]:
    """What SGLang's answer lost or changed against what the model wrote (``written``: the
    :class:`~kimi_eagle.chat.parse.ParsedCompletion` of the IDs as written, ``serving="template"``)."""
    flags: list[str] = []
    calls = answer.tool_calls
    if len(calls) < max(len(written.tool_calls), answer.calls_written):
        flags.append("dropped_by_server")  # a call written (cut, unreadable id, no tools) not returned
    model_ids = [c["id"] for c in written.tool_calls]
    if any(c["id"] not in model_ids[k:k + 1] for k, c in enumerate(calls)):
        flags.append("tool_id_renumbered")  # functions.NAME:{history + position}, not the id written
    model_args = [c["function"]["arguments"] for c in written.tool_calls]
    if any(c["function"]["arguments"] != a for c, a in zip(calls, model_args)):
        flags.append("arguments_rewritten")  # stripped (non-streamed), or {} completed (streamed)
    return flags


def parse_sglang(ids: Sequence[int], tok: Tokenizer, profile: Any, options: Any, written: Any,
                 start: str) -> tuple[ServedAnswer, list[str]]:
    """SGLang 0.5's answer for ``ids`` and the flags of what it changed (the ``sglang-0.5*`` profiles;
    arguments as :func:`~kimi_eagle.serving.vllm_answer.parse_served`'s)."""
    stops = SglangOptions.stop_ids
    finish = options.finish_reason or ("stop" if ids and ids[-1] in stops else "length")
    opts = SglangOptions(streaming=profile.streaming, thinking=start != "content", finish_reason=finish,
                         prompt_tail=prompt_tail(tok, start), history_tool_calls=options.history_tool_calls,
                         tools=tuple(options.tools) if options.tools is not None else None,
                         tool_choice=getattr(options, "tool_choice", None))
    answer = sglang_answer(ids, tok, opts)
    return answer, [f for f in written.flags if f != "whitespace_stripped"] + sglang_flags(answer, written)


