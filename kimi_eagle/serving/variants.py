"""The declared space of server-side transformations that per-provider calibration searches (issue 34).

A provider's server may render a request differently from the official template and count the answer
differently from the kit's reconstruction. Each way it may do so is one **dimension** of :data:`SPACE`, a
small tuple of values whose first value is the default (what the kit does without calibration). A
:class:`Variant` picks one value per dimension; the *simplest* variant is the one with the fewest
non-default values. Every value is implemented here as a plain function on the request (messages, tools),
on the rendered prompt pieces, or on counts:

``profile``
    the serving profile (:mod:`kimi_eagle.serving.request`) whose prompt side (``preprocess_request``,
    ``marker_text``, ``sort_tools``) renders the request and whose answer side reconstructs the completion.
``template``
    which chat template the server renders with: ``format`` (the record's format, from the assets' templates)
    or ``k2-0905`` (Kimi-K2-Instruct-0905's own ``chat_template.jinja``, :mod:`kimi_eagle.chat.k2_0905`: a
    ``# Tools`` heading in the declaration turn, history ids as sent; K2-Instruct records only).
``tools``
    how the tool declaration is written inside ``<|im_system|>tool_declare<|im_middle|>...<|im_end|>``
    (``json-lines``: one spaced JSON object per tool, a line each, no brackets; Fireworks):
    ``template`` (what the format and profile do: JSON with spaces for K2-Instruct and K2-Thinking, the
    profile's ``tool_declaration`` for K2.5, the 0905 heading and JSON under ``template = k2-0905``), ``json`` (``tojson``: ``", "`` and ``": "``), ``json-compact``
    (``","`` and ``":"``, the K2.5 template's default), ``ts`` (Moonshot's TypeScript declaration,
    :mod:`kimi_eagle.chat.tool_decl`, for every Kimi format), ``k2-0905`` (the 0905 template's ``# Tools``
    heading and JSON, with any template) or ``k2-0905-compact`` (that heading over compact JSON; DeepInfra).
``schema``
    what the server's request model does to the tool schemas before the template sees them: ``as-sent``,
    ``no-strict`` (``function.strict`` dropped), ``vllm`` / ``vllm-no-strict`` (vLLM's pydantic
    round trip ``tool.model_dump()``: ``type``, then ``function`` {``name``, ``description``, ``parameters``, then
    extra keys such as ``strict``, kept or dropped}), ``sglang`` (SGLang's ``tool.function.model_dump()``: the
    function object alone, keys ``description``, ``name``, ``parameters``, ``strict``) or ``sorted`` (every
    object's keys sorted, as Moonshot's ``deep_sort_dict``).
``json_escape``
    how the JSON of a JSON declaration is escaped: ``none`` (transformers' ``tojson``: nothing, non-ASCII kept) or
    ``html`` (Jinja's builtin ``tojson``, ``htmlsafe_json_dumps``: ``<``, ``>``, ``&``, ``'`` written ``\\u003c``,
    ``\\u003e``, ``\\u0026``, ``\\u0027``; a server rendering the template with a Jinja whose ``tojson`` is HTML-safe:
    Jinja2's also sorts keys, ``schema = sorted``, MiniJinja's keeps them; Groq on real tools, whose descriptions
    are full of ``<tags>``: +868 tokens on the agent's 11 tools, nothing on the toy tools) or ``go`` (Go's
    ``encoding/json``: ``<``, ``>``, ``&``, U+2028 and U+2029 escaped, ``'`` kept; Moonshot AI's and Novita's K2-0905
    servers until 2025-11-11 declared the agent's tools as compact JSON so, ``strict`` dropped: all 9 tool sets of
    that time to the token).
``system``
    the system turn when the request has none: ``template`` (as the format does: K2-Instruct and
    K2-Thinking insert ``You are Kimi, an AI assistant created by Moonshot AI.``, K2.5 inserts nothing),
    ``default`` (the server inserts that K2 default system message itself) or ``none`` (no system turn).
``system_text``
    ``as-sent`` or ``stripped``: each system message's text whitespace-stripped by the server before the template
    sees it (Moonshot AI's and Novita's K2-0905 servers since 2025-11-13: the agent's system prompt ends in five
    newlines, one token).
``history_ids``
    the ids of earlier tool calls and of the tool results answering them: ``as-sent`` (what the request holds;
    the assets' K2-Instruct and K2-Thinking templates number them ``functions.NAME:IDX`` themselves),
    ``counter`` (rewritten to ``functions.NAME:IDX`` in order, results following their calls),
    ``calls-counter`` (the calls rewritten so, the results keeping the request's ``tool_call_id``; SiliconFlow) or
    ``verbatim`` (the K2-Instruct and K2-Thinking templates revised to read the request's ``tool_call['id']`` and
    ``tool_call_id`` instead of numbering their own: Parasail and AtlasCloud on the agent's histories, whose turns
    were answered by several providers, so that an earlier answer's ``bash:2`` from Moonshot AI is billed as
    ``bash:2``, two tokens under ``functions.bash:2`` in the call and two in its result).
``history_args``
    earlier tool calls' argument strings: ``as-sent``, ``spaced`` (``json.loads`` then ``json.dumps``: ``", "``
    and ``": "``), ``compact`` (``","`` and ``":"``) or ``spaced-float`` (spaced, every integer written as a float,
    ``{"a": 2.0}``: numbers kept as doubles on the way, as Groq's since 2025-10); arguments that are not JSON stay
    as sent.
``history_content``
    earlier tool results and the content beside earlier tool calls: ``as-sent`` or ``openai-repr`` (vLLM's
    "openai" content format turns a string content into ``[{"type": "text", "text": c}]``, and a template that
    prints ``message['content']`` raw prints that list's Python repr: tool results, and a non-empty assistant
    content beside tool calls; Together, WandB; Together's own answer once returned such a repr as its text).
``history_reasoning``
    earlier assistant turns' reasoning: ``as-sent`` (``reasoning_content``/``reasoning`` as the request holds
    them) or ``details`` (OpenRouter's ``reasoning_details`` texts joined become the ``reasoning_content`` of a
    turn without one; AtlasCloud's K2.5).
``role_newline``
    ``none``, ``system-tool`` (a ``"\n"`` after ``<|im_middle|>`` of the request's system and tool turns: a
    revision of the 0905 template whose role header ends in ``{% endif %}`` rather than ``{%- endif -%}``; Together,
    SiliconFlow, Chutes) or ``system`` (after the system turn's only: BaseTen, whose every prompt the kit rendered
    one token short with the plain 0905 template, first and history turns alike, where ``system-tool`` leaves its
    history requests one token over per tool result); ``template = k2-0905`` only.
``tool_result``
    ``template`` or ``id-line``: tool results written ``{tool_call_id}\n{content}``, consecutive results
    separated by a ``"\n"`` (``template = k2-0905`` only; Fireworks).
``prompt_offset`` / ``completion_offset``
    constant differences of the billed counts (a BOS token, a generation prompt counted or not; the
    end-of-turn token counted or not).
``tool_turn_offset``
    a difference of the billed prompt of requests with tools only (the declaration turn framed differently).
``history_call_offset``
    a difference of the billed prompt per earlier tool call in the request (a separator the server's template
    writes around each call or result that none of the templates above writes).
``tool_call_offset``
    a constant difference of the billed completion of answers with tool calls only.
``answer_args``
    the answer's tool-call arguments as the provider returned them (``as-answered``) or as the model wrote them
    when the provider re-serialised them compactly (``spaced``: counted as ``json.dumps`` with ``", "``/``": "``).
``call_header``
    how the answer's tool-call ids are counted where the server returned them without the ``functions.`` prefix
    (``NAME:IDX``): ``as-returned`` (the id's own tokens) or ``functions-split`` (the name counted with the split it
    has after ``functions.`` in ``functions.NAME:IDX``: ``bash`` is ``.b`` + ``ash`` there, one token more than
    ``bash`` alone; ``glob`` is ``.glob``, none more). Moonshot AI's and Novita's K2-0905 on the agent traces: every
    ``bash`` and ``ls`` call billed one token over the returned id, every ``glob``, ``view``, ``edit``, ``fetch`` and
    ``download`` call exact (82 of 82 answers with calls).
``reasoning``
    ``counted`` (reasoning tokens are part of the billed completion) or ``excluded`` (billed without the
    reasoning and its ``<think>``/``</think>``).
``tool_answer``
    how an answer with tool calls is billed: ``tokens`` (as every other answer) or ``chars-estimate`` (the content
    estimated as ``round(characters / 4)``, half up, plus the tokens of the last call's arguments as returned;
    no offset applies: DeepInfra's K2-0905 bills its tool-call answers so, and no count of tokens can, since two
    answers with 12-token contents and the same call are billed 25 and 26: their contents have 61 and 65
    characters).
``answer_text``
    what the server did to the answer's text before returning it (applied before the profile's answer side, for
    profiles whose ``answer_rules`` are ``legacy``): ``as-served`` (nothing the profile does not know) or
    ``spaced-unstripped`` (a detokenizer that puts a space around each of Kimi's markers and strips nothing: the
    reasoning's last space, the content's first space and, before tool calls, all of the content's trailing
    whitespace are the server's; Avian's K2.5 streams).

The calibration itself (which variant explains which provider) is :mod:`kimi_eagle.serving.calibration`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Sequence

from kimi_eagle.chat.completion import CONTENT, SPECIAL, TEXT, Piece, Turn, tojson
from kimi_eagle.chat.formats import KIMI_DEFAULT_SYSTEM, Format, Message, get_format
from kimi_eagle.chat.k2_0905 import TOOLS_HEADING, KimiK2Instruct0905, declaration_0905
from kimi_eagle.chat.tool_decl import typescript_or_none
from kimi_eagle.serving.profiles import ServingProfile
from kimi_eagle.serving.request import deep_sort, preprocess_request

# dimension -> its values, the default first (knowledge as data: add a value here and a function below)
SPACE: dict[str, tuple[Any, ...]] = {
    "profile": ("template", "moonshot", "vllm-0.33", "sglang-0.5"),
    "template": ("format", "k2-0905"),
    "tools": ("template", "json", "json-compact", "ts", "k2-0905", "json-lines", "k2-0905-compact"),
    "schema": ("as-sent", "no-strict", "vllm", "vllm-no-strict", "sglang", "sorted"),
    "json_escape": ("none", "html", "go"),
    "system": ("template", "default", "none"),
    "system_text": ("as-sent", "stripped"),
    "history_ids": ("as-sent", "counter", "calls-counter", "verbatim"),
    "history_args": ("as-sent", "spaced", "compact", "spaced-float"),
    "history_content": ("as-sent", "openai-repr"),
    "history_reasoning": ("as-sent", "details"),
    "role_newline": ("none", "system-tool", "system"),
    "tool_result": ("template", "id-line"),
    "prompt_offset": (0, -1, 1, -2, 2),
    "history_call_offset": (0, 1, -1),
    "tool_turn_offset": (0, -1, 1),
    "completion_offset": (0, -1, 1),
    "tool_call_offset": (0, 1, -1),
    "answer_args": ("as-answered", "spaced"),
    "call_header": ("as-returned", "functions-split"),
    "reasoning": ("counted", "excluded"),
    "tool_answer": ("tokens", "chars-estimate"),
    "answer_text": ("as-served", "spaced-unstripped"),
}
REST_DIMENSIONS = ("template", "system", "system_text", "history_ids", "history_args", "history_content", "history_reasoning",
                   "role_newline", "tool_result")  # the prompt without its tool turn
PROMPT_DIMENSIONS = (*REST_DIMENSIONS, "tools", "schema", "json_escape", "prompt_offset", "history_call_offset", "tool_turn_offset")
NEWLINE_ROLES = {"system-tool": ("system", "tool"), "system": ("system",)}  # role_newline -> the turns it changes
TEMPLATE_0905_ONLY = ("role_newline", "tool_result")  # revisions of the 0905 template: with template = k2-0905 only
COUNT_DIMENSIONS = ("completion_offset", "tool_call_offset", "answer_args", "call_header", "reasoning", "tool_answer")
COMPLETION_DIMENSIONS = (*COUNT_DIMENSIONS, "answer_text")  # answer_text changes the IDs, the others only counts
REASONING_KINDS = frozenset({"reasoning", "think_begin", "think_end"})
OFFSET_DIMENSIONS = ("prompt_offset", "history_call_offset", "tool_turn_offset", "completion_offset", "tool_call_offset")
# The constant offsets a named mechanism produces (a token the server adds or leaves out, a count convention). Any
# other offset value is a bare constant: searched, but costlier than a mechanism, and an entry resting on one is
# ``thin`` at best (kimi_eagle.serving.calibration.STATUS_RULE).
MECHANISMS: dict[tuple[str, int], str] = {
    ("completion_offset", -1): "eot-not-billed: the end-of-turn token <|im_end|> is generated but not billed",
}


@dataclass(frozen=True)
class Variant:
    """One value per dimension of :data:`SPACE` (the defaults unless given)."""

    profile: str = "template"
    template: str = "format"
    tools: str = "template"
    schema: str = "as-sent"
    json_escape: str = "none"
    system: str = "template"
    system_text: str = "as-sent"
    history_ids: str = "as-sent"
    history_args: str = "as-sent"
    history_content: str = "as-sent"
    history_reasoning: str = "as-sent"
    role_newline: str = "none"
    tool_result: str = "template"
    prompt_offset: int = 0
    history_call_offset: int = 0
    tool_turn_offset: int = 0
    completion_offset: int = 0
    tool_call_offset: int = 0
    answer_args: str = "as-answered"
    call_header: str = "as-returned"
    reasoning: str = "counted"
    tool_answer: str = "tokens"
    answer_text: str = "as-served"

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or value not in SPACE[f.name]:
                allowed = ", ".join(map(str, SPACE[f.name]))
                raise ValueError(f"{f.name} {getattr(self, f.name)!r} is not one of {allowed}")
        for name in TEMPLATE_0905_ONLY:
            if getattr(self, name) != SPACE[name][0] and self.template != "k2-0905":
                raise ValueError(f"{name} {getattr(self, name)!r} is a revision of the 0905 template: "
                                 "it needs template = k2-0905")

    def conventions(self) -> dict[str, Any]:
        """The non-default values other than the profile (what a provider does beyond its serving profile)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name != "profile" and getattr(self, f.name) != SPACE[f.name][0]}

    def cost(self) -> tuple[int, tuple[int, ...]]:
        """Simplicity order: fewest non-default values (an offset no mechanism produces counts twice: a named
        mechanism beats a bare constant), then the earliest values of each dimension."""
        positions = tuple(SPACE[f.name].index(getattr(self, f.name)) for f in fields(self))
        return sum(p > 0 for p in positions) + len(self.unnamed_offsets()), positions

    def unnamed_offsets(self) -> list[str]:
        """The constant offsets of this variant that no named mechanism produces (``name=value``)."""
        return [f"{name}={getattr(self, name)}" for name in OFFSET_DIMENSIONS
                if getattr(self, name) != 0 and (name, getattr(self, name)) not in MECHANISMS]

    def mechanisms(self) -> dict[str, str]:
        """``name=value`` -> the mechanism producing it, for every non-default offset that has one."""
        return {f"{name}={getattr(self, name)}": MECHANISMS[(name, getattr(self, name))] for name in OFFSET_DIMENSIONS
                if getattr(self, name) != 0 and (name, getattr(self, name)) in MECHANISMS}

    def prompt_count_offset(self, request: dict) -> int:
        """What this variant adds to a prompt's count (count conventions, not tokens): ``prompt_offset``,
        ``history_call_offset`` per earlier tool call in the request's messages, ``tool_turn_offset`` when it declares
        tools."""
        return (self.prompt_offset + self.history_call_offset * history_calls(request.get("messages"))
                + (self.tool_turn_offset if request.get("tools") else 0))

    def describe(self) -> str:
        extra = ", ".join(f"{k}={v}" for k, v in self.conventions().items())
        return self.profile + (f" + {extra}" if extra else "")


def variant_from(profile: str, conventions: dict[str, Any]) -> Variant:
    """The :class:`Variant` of a profile name and its conventions (ValueError naming an unknown key or value)."""
    unknown = set(conventions) - {f.name for f in fields(Variant)} - {"profile"}
    if unknown:
        raise ValueError(f"unknown convention(s): {', '.join(sorted(unknown))}")
    return replace(Variant(profile=profile), **conventions)


# --------------------------------------------------------------------------------------------
# schema: the tools as the server's request model hands them on


def _function(tool: Any) -> dict | None:
    return tool["function"] if isinstance(tool, dict) and isinstance(tool.get("function"), dict) else None


def _vllm_tool(tool: Any, strict: bool) -> Any:
    """vLLM's ``ChatCompletionToolsParam.model_dump()``: ``type``, then ``function`` {``name``, ``description``,
    ``parameters`` (``None`` when absent), then the extra keys it allows, ``strict`` among them}."""
    fn = _function(tool)
    if fn is None:
        return tool
    head = {"name": fn.get("name"), "description": fn.get("description"), "parameters": fn.get("parameters")}
    extra = {k: v for k, v in fn.items() if k not in head and (strict or k != "strict")}
    return {"type": tool.get("type", "function"), "function": {**head, **extra}}


def _sglang_function(tool: Any) -> Any:
    """SGLang's ``[tool.function.model_dump() for tool in request.tools]``: the function alone, in the model's
    field order ``description``, ``name``, ``parameters``, ``strict`` (False when absent)."""
    fn = _function(tool)
    if fn is None:
        return tool
    return {"description": fn.get("description"), "name": fn.get("name"), "parameters": fn.get("parameters"),
            "strict": fn.get("strict", False)}


def _no_strict(tool: Any) -> Any:
    fn = _function(tool)
    return tool if fn is None else {**tool, "function": {k: v for k, v in fn.items() if k != "strict"}}


SCHEMAS: dict[str, Callable[[list], list]] = {
    "as-sent": lambda tools: tools,
    "no-strict": lambda tools: [_no_strict(t) for t in tools],
    "vllm": lambda tools: [_vllm_tool(t, True) for t in tools],
    "vllm-no-strict": lambda tools: [_vllm_tool(t, False) for t in tools],
    "sglang": lambda tools: [_sglang_function(t) for t in tools],
    "sorted": deep_sort,
}


# --------------------------------------------------------------------------------------------
# tools: the declaration text; system: the system turn


HTML_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "'": "\\u0027"}
# Go's encoding/json (json.Marshal, SetEscapeHTML left on): <, >, & and the line/paragraph separators, never '
GO_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
ESCAPES = {"html": HTML_ESCAPES, "go": GO_ESCAPES}


def html_escaped(text: str) -> str:
    """``text`` (JSON) as Jinja's own ``tojson`` filter writes it (``htmlsafe_json_dumps``: ``<``, ``>``, ``&`` and
    ``'`` as ``\\u003c``, ``\\u003e``, ``\\u0026``, ``\\u0027``), the ``json_escape = html`` value: a server rendering the
    template with plain Jinja instead of transformers' ``tojson`` (which escapes nothing)."""
    return text.translate(str.maketrans(HTML_ESCAPES))


def declaration(tools: list, how: str, fmt_name: str, profile_declaration: str, template: str = "format",
                escape: str = "none") -> str:
    """The text between ``tool_declare<|im_middle|>`` and ``<|im_end|>`` (``how``: a ``tools`` value, ``escape``: a
    ``json_escape`` value, applied to JSON declarations only)."""
    text = _declaration(tools, how, fmt_name, profile_declaration, template)
    if escape == "none" or text.startswith("# Tools"):
        return text
    return text.translate(str.maketrans(ESCAPES[escape]))


def _declaration(tools: list, how: str, fmt_name: str, profile_declaration: str, template: str) -> str:
    if how == "k2-0905" or how == "template" and template == "k2-0905":
        return declaration_0905(tools)
    if how == "k2-0905-compact":
        return TOOLS_HEADING + tojson(tools, separators=(",", ":"))
    if how == "template":
        if fmt_name.startswith("kimi-k2.5"):
            how = "ts" if profile_declaration == "ts" else "json-compact"
        else:
            how = "json"
    if how == "ts":
        return typescript_or_none(tools) or tojson(tools, separators=(",", ":"))
    if how == "json-lines":
        return "\n".join(tojson(tool) for tool in tools)
    return tojson(tools, separators=(",", ":") if how == "json-compact" else None)


def with_system_text(messages: Sequence[Message], how: str) -> list[Message]:
    """``messages`` with each system message's text content whitespace-stripped when ``how`` is ``stripped`` (the
    ``system_text`` value: Moonshot's and Novita's servers since 2025-11-13 bill the crush agent's system prompt,
    which ends in five newlines, one token short of the template's rendering, and exactly with it stripped)."""
    if how == "as-sent":
        return list(messages)
    return [{**m, "content": m["content"].strip()} if m.get("role") == "system" and isinstance(m.get("content"), str)
            else m for m in messages]


def with_system(messages: Sequence[Message], how: str) -> list[Message]:
    """``messages`` with the K2 default system message first when ``how`` is ``default`` and there is none."""
    messages = list(messages)
    if how == "default" and (not messages or messages[0].get("role") != "system"):
        return [{"role": "system", "content": KIMI_DEFAULT_SYSTEM}, *messages]
    return messages


def without_template_system(pieces: list[Piece]) -> list[Piece]:
    """``pieces`` without the default system turn a K2 template inserted (and K2-Instruct's newline after it)."""
    for i in range(len(pieces) - 3):
        if pieces[i] == ("<|im_system|>", SPECIAL) and pieces[i + 1][0] == "system" and \
                pieces[i + 3][0] == KIMI_DEFAULT_SYSTEM:
            end = i + 5
            if end < len(pieces) and pieces[end] == ("\n", pieces[end][1]):
                end += 1
            return pieces[:i] + pieces[end:]
    return pieces


def history_calls(messages: Any) -> int:
    """How many tool calls the request's earlier assistant messages hold."""
    return sum(len(m["tool_calls"]) for m in messages or () if isinstance(m, dict) and m.get("role") == "assistant"
               and isinstance(m.get("tool_calls"), list))


def _args(arguments: Any, how: str) -> Any:
    if how == "as-sent" or not isinstance(arguments, str):
        return arguments
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    if how == "spaced-float":
        value = _floats(value)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":") if how == "compact" else None)


def _floats(value: Any) -> Any:
    """``value`` with every JSON integer a float (``2`` -> ``2.0``), at any depth: numbers kept as doubles."""
    if isinstance(value, dict):
        return {k: _floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_floats(v) for v in value]
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


def with_history(messages: Sequence[Message], ids: str, args: str, content: str = "as-sent",
                 reasoning: str = "as-sent") -> list[Message]:
    """``messages`` with earlier tool calls' ids (``history_ids``), arguments (``history_args``), tool results' and
    call turns' content (``history_content``) and assistant reasoning (``history_reasoning``) rewritten."""
    if (ids, args, content, reasoning) == ("as-sent",) * 4:
        return list(messages)
    out, counter, renamed = [], 0, {}
    for m in messages:
        if m.get("role") == "assistant" and isinstance(m.get("tool_calls"), list):
            calls = []
            for call in m["tool_calls"]:
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict):
                    calls.append(call)
                    continue
                call = {**call, "function": {**fn, "arguments": _args(fn.get("arguments"), args)}}
                if ids in ("counter", "calls-counter"):
                    new = f"functions.{fn.get('name')}:{counter}"
                    renamed.setdefault(call.get("id"), []).append(new)
                    call["id"], counter = new, counter + 1
                calls.append(call)
            m = {**m, "tool_calls": calls, **_repr_content(m, content, keep_empty=True)}
        elif m.get("role") == "tool":
            if ids == "counter" and renamed.get(m.get("tool_call_id")):
                m = {**m, "tool_call_id": renamed[m["tool_call_id"]].pop(0)}
            m = {**m, **_repr_content(m, content, keep_empty=False)}
        out.append(_with_reasoning(m, reasoning))
    return out


def _repr_content(m: Message, how: str, keep_empty: bool) -> dict:
    """``{"content": ...}`` as vLLM's "openai" content format prints raw (``history_content = openai-repr``):
    the Python repr of the parts list; ``{}`` when nothing changes (an empty call turn's content prints nothing)."""
    c = m.get("content")
    if how == "as-sent" or keep_empty and not c:
        return {}
    parts = c if isinstance(c, list) else [{"type": "text", "text": c if isinstance(c, str) else ""}]
    return {"content": repr(parts)}


def _with_reasoning(m: Message, how: str) -> Message:
    """``m`` with its ``reasoning_details`` texts as ``reasoning_content`` (``history_reasoning = details``)."""
    details = m.get("reasoning_details")
    if how == "as-sent" or m.get("role") != "assistant" or m.get("reasoning_content") or not isinstance(details, list):
        return m
    text = "".join(d["text"] for d in details if isinstance(d, dict) and isinstance(d.get("text"), str))
    return {**m, "reasoning_content": text} if text else m


def template_format(template: str, fmt_name: str, tok: Any = None, variant: "Variant | None" = None) -> Format | None:
    """The format a ``template`` value renders ``fmt_name`` records with (None where it does not apply); the 0905
    template with ``variant``'s revisions (``role_newline``, ``tool_result``)."""
    if template == "format":
        fmt = get_format(fmt_name, tok)
        if variant is not None and variant.history_ids == "verbatim":
            if not hasattr(fmt, "request_ids"):
                return None  # the format keeps the request's ids already: verbatim is as-sent there
            fmt = replace(fmt, request_ids=True)
        return fmt
    if fmt_name != "kimi-k2-instruct":
        return None
    newline = "none" if variant is None else variant.role_newline
    return KimiK2Instruct0905(role_newline=newline != "none", newline_roles=NEWLINE_ROLES.get(newline, ()),
                              id_line=variant is not None and variant.tool_result == "id-line")


def tool_block(text: str) -> list[Piece]:
    """The tool declaration turn as prompt pieces."""
    return [("<|im_system|>", SPECIAL), ("tool_declare", TEXT), ("<|im_middle|>", SPECIAL), (text, CONTENT),
            ("<|im_end|>", SPECIAL)]


def variant_prompt_pieces(messages: Sequence[Message], tools: list | None, fmt_name: str, variant: Variant,
                          profile: ServingProfile, tok: Any = None) -> list[Piece] | None:
    """The prompt pieces ``variant`` renders for normalised request ``messages`` and ``tools`` under ``profile``
    (its prompt side; ``marker_text`` is applied when encoding), None where its ``template`` does not apply to
    ``fmt_name``. Count offsets are not pieces: add them to the count. RecordError when the profile's server
    refuses the request."""
    fmt = template_format(variant.template, fmt_name, tok, variant)
    if fmt is None:
        return None
    messages = with_system_text(with_system(messages, variant.system), variant.system_text)
    messages = with_history(messages, variant.history_ids, variant.history_args,
                            variant.history_content, variant.history_reasoning)
    if profile.name != "template":
        messages, _ = preprocess_request(messages, None, profile)
    pieces = fmt.prompt_pieces(messages, None)
    if variant.system == "none":
        pieces = without_template_system(pieces)
    if tools:  # every Kimi template declares the tools first
        shaped = SCHEMAS[variant.schema](tools)
        if profile.sort_tools:
            shaped = deep_sort(shaped)
        text = declaration(shaped, variant.tools, fmt_name, profile.tool_declaration, variant.template,
                           variant.json_escape)
        pieces = tool_block(text) + pieces
    return pieces


def chars_estimate(chars: int, last_arguments: int) -> int:
    """A ``tool_answer = chars-estimate`` count: ``round(chars / 4)`` (half up) of a content of ``chars``
    characters + the last call's argument tokens.

    >>> chars_estimate(len("I'll add and multiply the numbers 2 and 3 for you."), 12)  # 50 characters: 12.5 -> 13
    25
    """
    return (chars + 2) // 4 + last_arguments


def split_extra(tok: Any, calls: Sequence[Any]) -> int:
    """How many more tokens the ``NAME:IDX`` ids of ``calls`` take with each name split as after ``functions.``
    (``call_header = functions-split``); ids returned with the prefix, and calls without a string name, add none:
    with Kimi's tokenizer ``[{"id": "bash:0", "function": {"name": "bash"}}]`` gives 1, ``glob:0`` 0."""
    extra = 0
    for call in calls:
        name = (call.get("function") or {}).get("name") if isinstance(call, dict) else None
        if isinstance(name, str) and name and not str(call.get("id") or "").startswith("functions."):
            extra += name_split_extra(tok, name)
    return extra


def name_split_extra(tok: Any, name: str) -> int:
    """How many more tokens ``name`` takes split as after ``functions.`` than on its own (``.b`` + ``ash``: 1)."""
    return len(tok.encode("functions." + name)) - 1 - len(tok.encode(name))


def spaced_extra(tok: Any, arguments: str, n: int | None = None) -> int:
    """How many more tokens the JSON ``arguments`` (``n`` tokens as written, counted when not given) take written
    by ``json.dumps`` with ``", "`` and ``": "`` (``answer_args = spaced``); 0 when they are not JSON."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return 0
    return len(tok.encode(json.dumps(value, ensure_ascii=False))) - (len(tok.encode(arguments)) if n is None else n)


def served_text_turn(turn: Turn, how: str) -> tuple[Turn, list[str]]:
    """``turn`` without what an ``answer_text`` convention says the server added, and the flags of what that loses
    (``content_end_unknown``: the model's own whitespace before its tool calls, if any, went with the server's)."""
    if how == "as-served":
        return turn, []
    reasoning, content = turn.reasoning, turn.content
    if isinstance(reasoning, str) and reasoning.endswith(" "):
        reasoning = reasoning[:-1]  # the space before </think>
    if isinstance(content, str) and content.startswith(" "):
        content = content[1:]  # the space after </think>
    flags = []
    if isinstance(content, str) and turn.tool_calls and content != content.rstrip():
        content, flags = content.rstrip(), ["content_end_unknown"]  # the spaces around the section's markers
    return replace(turn, reasoning=reasoning or None, content=content or None), flags
