"""Today's server Kimi-K2 parsers, written from their observable behaviour (vLLM 0.33's parser engine).

A server reads the decoded completion (:mod:`kimi_eagle.serving.detokenizer`) with a small state machine:

    REASONING --</think>--> CONTENT --<|tool_calls_section_begin|>--> PREAMBLE --<|tool_call_begin|>--> NAME
    NAME --<|tool_call_argument_begin|>--> ARGS --<|tool_call_end|>--> BETWEEN --<|tool_call_begin|>--> NAME

(REASONING also goes straight to PREAMBLE on a section opener; ``<think>`` in REASONING and ``</think>`` in
CONTENT are dropped; ``<|tool_calls_section_end|>`` returns to PREAMBLE, where text is dropped.) A marker
with no transition in the current state is text of that state (``<|tool_call_end|>`` written in reasoning
stays in the reasoning); the tokenizer's other special tokens (``<|im_end|>``, ``<|im_user|>``, ...) are
dropped wherever they appear.

**Text mode** (non-streaming answers) finds markers by their spelling in the decoded text, so marker text
the model wrote as ordinary tokens splits there too; **ID mode** (streamed answers) finds them by token
ID only, and marker spellings written as ordinary tokens stay text. :func:`run_machine` returns the
reasoning, content and raw calls (header and argument text); :mod:`kimi_eagle.serving.vllm_answer` turns
them into the API message each server version returns.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence

THINK, THINK_END = "<think>", "</think>"
SECTION, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL, ARG, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
TERMINALS = (THINK, THINK_END, SECTION, SECTION_END, CALL, ARG, CALL_END)
MARKER_TEXTS = TERMINALS
DROP = "drop"  # a special token the parser knows nothing of: removed

# (state, marker) -> next state; "call" starts a new call
TRANSITIONS: dict[tuple[str, str], str] = {
    ("reasoning", THINK): "reasoning", ("reasoning", THINK_END): "content", ("content", THINK_END): "content",
    ("reasoning", SECTION): "preamble", ("content", SECTION): "preamble",
    ("preamble", CALL): "name", ("between", CALL): "name", ("name", ARG): "args",
    ("args", CALL_END): "between", ("args", SECTION_END): "preamble",
    ("args", THINK_END): "args",  # vLLM 0.34 deletes </think> written inside a call's arguments (issue 43)
    ("preamble", SECTION_END): "preamble", ("between", SECTION_END): "preamble",
}
TEXT_OF_STATE = {"reasoning": "reasoning", "content": "content", "name": "name", "args": "args"}


@dataclass
class RawCall:
    """A call as the machine saw it: the header text (the id) and the argument text, both raw."""

    header: str = ""
    args: str = ""
    ended: bool = False  # its <|tool_call_end|> (or the section's end) was read


@dataclass
class MachineResult:
    reasoning: str = ""
    content: str = ""
    calls: list[RawCall] = field(default_factory=list)
    reasoning_ended: bool = False  # </think> or a section opener ended the reasoning
    final_state: str = "reasoning"


Unit = tuple[str, str | None]  # (text, marker or DROP or None)


def lex_text(text: str, drops: Sequence[str]) -> list[Unit]:
    """Text mode: every marker spelling (and every spelling of a dropped special) is a unit of its own."""
    spellings = sorted(set(TERMINALS) | set(drops), key=len, reverse=True)
    pattern = re.compile("|".join(re.escape(s) for s in spellings))
    units: list[Unit] = []
    pos = 0
    for m in pattern.finditer(text):
        if m.start() > pos:
            units.append((text[pos:m.start()], None))
        units.append((m.group(), m.group() if m.group() in TERMINALS else DROP))
        pos = m.end()
    if pos < len(text):
        units.append((text[pos:], None))
    return units


def lex_ids(pieces: Sequence[str], ids: Sequence[int], marker_ids: dict[int, str],
            drop_ids: frozenset[int]) -> list[Unit]:
    """ID mode: a marker is its token ID; every other ID's released text (``pieces``) is text."""
    units: list[Unit] = []
    for text, i in zip(pieces, ids):
        kind = marker_ids.get(i) or (DROP if i in drop_ids else None)
        if kind is None:
            if text:
                units.append((text, None))
            continue
        spelling = kind if kind != DROP else text.lstrip(" ")
        head = text[:len(text) - len(spelling)] if text.endswith(spelling) else ""
        if head:  # the space the detokenizer put before the marker belongs to the text around it
            units.append((head, None))
        units.append((spelling, kind))
    return units


def run_machine(units: Sequence[Unit], thinking: bool = True) -> MachineResult:
    """Feed ``units`` through the Kimi-K2 state machine (``thinking``: the prompt left ``<think>`` open)."""
    out = MachineResult(final_state="reasoning" if thinking else "content")
    state = out.final_state
    for text, marker in units:
        if marker == DROP:
            continue
        nxt = TRANSITIONS.get((state, marker)) if marker is not None else None
        if nxt is None or (not thinking and marker in (THINK, THINK_END)):
            _append(out, state, text)
            continue
        if state == "reasoning" and nxt != "reasoning":
            out.reasoning_ended = True
        if state == "args" and nxt != "args":
            out.calls[-1].ended = True
        if nxt == "name":
            out.calls.append(RawCall())
        state = nxt
    out.final_state = state
    return out


def _append(out: MachineResult, state: str, text: str) -> None:
    where = TEXT_OF_STATE.get(state)
    if where == "reasoning":
        out.reasoning += text
    elif where == "content":
        out.content += text
    elif where == "name":
        out.calls[-1].header += text
    elif where == "args":
        out.calls[-1].args += text
