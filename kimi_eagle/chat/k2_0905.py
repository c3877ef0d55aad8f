"""Kimi-K2-Instruct-0905's own chat template (``kimi-k2-instruct-0905``), as its Hugging Face repository shipped it.

The 0905 checkpoint's ``chat_template.jinja`` (moonshotai/Kimi-K2-Instruct-0905) differs from the
``kimi-k2-instruct.jinja`` in the assets (:class:`~kimi_eagle.chat.formats.KimiK2Instruct`) in three ways
that change token counts, each read off the template's text:

* the tool declaration turn is ``<|im_system|>tool_declare<|im_middle|>`` + ``"\\n  # Tools\\n  "`` + the tools
  as ``tojson`` (spaced JSON) + ``<|im_end|>``: the template's indentation and a ``# Tools`` heading are literal
  text inside the turn (:data:`TOOLS_HEADING`);
* history tool calls keep the request's own ids (``tool_call['id']``) instead of ``functions.NAME:IDX`` from a
  counter, and a tool result is ``## Return of {tool_call_id}\\n    {content}`` (the id the request gives, then
  the template's four-space indentation before the content);
* the default system turn has no newline after it.

Billed prompt counts of four OpenRouter providers of K2-0905 (BaseTen, SiliconFlow, Together, Chutes: see
docs/providers.md) match this declaration exactly and no other one in :mod:`kimi_eagle.serving.variants`.
This is an independent implementation of that template's output, checked against those counts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from kimi_eagle.chat.completion import CONTENT, SPECIAL, TEXT, Piece, tojson
from kimi_eagle.chat.formats import KIMI_DEFAULT_SYSTEM, KimiK2Instruct, Message, _content_k2, _j, _opener

TOOLS_HEADING = "\n  # Tools\n  "

def declaration_0905(tools: list) -> str:
    """The text of the 0905 template's tool declaration turn."""
    return TOOLS_HEADING + tojson(tools)


def _calls(m: Message) -> list[Piece]:
    out: list[Piece] = [("<|tool_calls_section_begin|>", SPECIAL)]
    for call in m["tool_calls"]:
        args = call["function"].get("arguments")
        out += [("<|tool_call_begin|>", SPECIAL), (_j(call.get("id")), CONTENT),
                ("<|tool_call_argument_begin|>", SPECIAL), (args if isinstance(args, str) else tojson(args), CONTENT),
                ("<|tool_call_end|>", SPECIAL)]
    return out + [("<|tool_calls_section_end|>", SPECIAL)]


@dataclass
class KimiK2Instruct0905(KimiK2Instruct):
    """The 0905 template's prompt (see the module); completions as :class:`KimiK2Instruct`.

    Two revisions seen in providers' billed counts (docs/providers.md), off by default:
    ``role_newline``: a ``"\n"`` after ``<|im_middle|>`` of the request's turns whose role is in ``newline_roles``
    (system and tool: a revision whose role header ends in ``{% endif %}`` rather than ``{%- endif -%}``; Together,
    SiliconFlow; system alone: BaseTen);
    ``id_line``: a tool result written ``{tool_call_id}\n{content}`` and consecutive results separated by a
    ``"\n"`` (Fireworks)."""

    name: str = "kimi-k2-instruct-0905"
    role_newline: bool = False
    newline_roles: tuple[str, ...] = ("system", "tool")
    id_line: bool = False

    def prompt_pieces(self, messages: Sequence[Message], tools: list | None = None) -> list[Piece]:
        out: list[Piece] = []
        if tools:
            out += [("<|im_system|>", SPECIAL), ("tool_declare", TEXT), ("<|im_middle|>", SPECIAL),
                    (declaration_0905(tools), CONTENT), ("<|im_end|>", SPECIAL)]
        for i, m in enumerate(messages):
            if i == 0 and m["role"] != "system":
                out += [("<|im_system|>", SPECIAL), ("system", TEXT), ("<|im_middle|>", SPECIAL),
                        (KIMI_DEFAULT_SYSTEM, TEXT), ("<|im_end|>", SPECIAL)]
            if self.id_line and m["role"] == "tool" and i and messages[i - 1]["role"] == "tool":
                out.append(("\n", TEXT))
            out += [(_opener(m["role"]), SPECIAL), (_j(m.get("name") or m["role"]), TEXT), ("<|im_middle|>", SPECIAL)]
            if self.role_newline and m["role"] in self.newline_roles:
                out.append(("\n", TEXT))
            out += self._body(m)
            out.append(("<|im_end|>", SPECIAL))
        return out + [("<|im_assistant|>", SPECIAL), ("assistant", TEXT), ("<|im_middle|>", SPECIAL)]

    def _body(self, m: Message) -> list[Piece]:
        if m["role"] == "assistant" and m.get("tool_calls"):
            return _content_k2(m) + _calls(m)
        if m["role"] == "tool":
            header = "{}\n" if self.id_line else "## Return of {}\n    "
            return [(header.format(_j(m.get("tool_call_id"))), TEXT), *_content_k2(m)]
        return _content_k2(m) if m.get("content") is not None else []
