"""Serving profiles: what a serving stack does around the chat template, on both sides of the model.

OpenRouter's Kimi providers run vLLM or SGLang, which preprocess a request before the jinja template
and parse the raw completion after it with their own Kimi parsers. A :class:`ServingProfile` names
each of those conventions, so that reconstruction renders what the provider's server fed the model and
:func:`~kimi_eagle.chat.parse.parse_completion` answers what that server would answer.

Profiles (:data:`PROFILES`; the sources each was read from are in docs/reconstruct.md):

- ``template``: the jinja alone (the kit's behaviour before profiles): JSON tool declaration, history
  arguments verbatim, ``None`` printed as ``None``, marker IDs split the completion;
- ``moonshot``: Moonshot's ``tokenization_kimi.py`` ``apply_chat_template`` (what vLLM and SGLang call when
  they load the K2.5 tokenizer): tools deep-sorted and declared in TypeScript (``tools_ts_str``),
  ``None``-valued keys dropped (transformers); the completion is parsed as by ``template``;
- ``vllm``: ``moonshot``'s prompt path plus vLLM's ``_postprocess_messages`` (history arguments
  ``json.loads``-ed, so the template's ``tojson`` writes them back; empty ones become ``{}``, invalid JSON
  fails the request, other JSON values are kept) and its Kimi-K2 reasoning and tool parsers (decoded text split on marker *text*, a
  tool section makes ``finish_reason`` ``tool_calls`` whatever the stop, an unterminated call is dropped,
  the name is the id's last dotted part, whitespace around ids and arguments stripped);
- ``sglang``: ``moonshot``'s prompt path plus SGLang's ``normalize_assistant_tool_call_arguments``
  (invalid or non-object arguments fail the request) and its tool message part joining (a space), and its
  Kimi-K2 detector (arguments must be one-line ``{...}``, a tool section turns ``stop`` into
  ``tool_calls``, ids renumbered ``functions.NAME:{history calls + position}``, reasoning stripped).

:func:`preprocess_request` applies a profile's prompt side to request messages and tools.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from typing import Any

from kimi_eagle.records import RecordError


@dataclass(frozen=True)
class ServingProfile:
    """One serving stack's conventions around the template (each field overridable: :func:`get_profile`).

    Prompt side: ``tool_declaration`` (``json`` | ``ts``); ``sort_tools`` (deep-sort every mapping of the
    tools by key first); ``history_arguments`` (``verbatim`` | ``reserialise``: parse each history call's
    argument string so the template writes it with ``tojson``); ``empty_arguments`` and
    ``invalid_arguments`` / ``nonobject_arguments`` (what re-serialising does with an empty string, with
    one that is not JSON, and with JSON that is not an object: ``verbatim``, ``empty_object`` (``{}``),
    ``parsed`` (the parsed value) or ``reject`` (the server answers HTTP 400: the record is an error)); ``drop_none_keys`` (message keys
    whose value is ``None`` are removed before rendering); ``tool_part_join`` (``None``: the template
    concatenates a tool message's text parts; a string: the server joins them with it first).

    Completion side: ``split_on`` (``ids``: only marker special tokens split; ``text``: the decoded text is
    split on marker spellings, as servers do); ``finish_on_section`` (``never``: ``tool_calls`` only when a
    call parsed; ``on_stop``: a tool section turns ``stop`` into ``tool_calls``; ``always``: a tool section
    makes it ``tool_calls`` whatever the stop); ``unterminated_call`` (``keep`` its arguments | ``drop``
    it); ``name_rule`` (``after_prefix``: the id minus ``functions.`` and ``:N``; ``last_dot``: the last
    dotted part); ``id_chars`` (``any`` | ``word_dot``: ids of ``[\\w.]`` only parse); ``args_object``
    (arguments must be a ``{...}`` on one line to parse); ``id_rule`` (``model``: the id written |
    ``sglang``: ``functions.NAME:{history + position}``); ``strip`` (whitespace around ids and arguments);
    ``strip_reasoning`` (reasoning and content stripped as SGLang's reasoning parser does).

    Reconstruction: ``omit_think_end_before_tools`` and ``tool_ids`` (the
    :class:`~kimi_eagle.chat.completion.CompletionOptions` of the same names).
    """

    name: str
    tool_declaration: str = "json"
    sort_tools: bool = False
    history_arguments: str = "verbatim"
    empty_arguments: str = "verbatim"
    invalid_arguments: str = "verbatim"
    nonobject_arguments: str = "verbatim"
    drop_none_keys: bool = False
    tool_part_join: str | None = None
    split_on: str = "ids"
    finish_on_section: str = "never"
    unterminated_call: str = "keep"
    name_rule: str = "after_prefix"
    id_chars: str = "any"
    args_object: bool = False
    id_rule: str = "model"
    strip: bool = False
    strip_reasoning: bool = False
    omit_think_end_before_tools: bool = False
    tool_ids: str = "auto"

    def __post_init__(self) -> None:
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"serving profile {self.name}: {name}={getattr(self, name)!r}; "
                                 f"known: {', '.join(map(str, allowed))}")

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


CHOICES: dict[str, tuple] = {
    "tool_declaration": ("json", "ts"), "history_arguments": ("verbatim", "reserialise"),
    "empty_arguments": ("verbatim", "empty_object", "reject"),
    "invalid_arguments": ("verbatim", "empty_object", "reject"),
    "nonobject_arguments": ("verbatim", "parsed", "empty_object", "reject"),
    "split_on": ("ids", "text"), "finish_on_section": ("never", "on_stop", "always"),
    "unterminated_call": ("keep", "drop"), "name_rule": ("after_prefix", "last_dot"), "id_chars": ("any", "word_dot"),
    "id_rule": ("model", "sglang"), "tool_ids": ("auto", "normalise", "keep"),
}

_MOONSHOT = dict(tool_declaration="ts", sort_tools=True, drop_none_keys=True)
PROFILES: dict[str, ServingProfile] = {
    "template": ServingProfile("template"),
    "moonshot": ServingProfile("moonshot", **_MOONSHOT),
    "vllm": ServingProfile("vllm", **_MOONSHOT, history_arguments="reserialise", empty_arguments="empty_object",
                           invalid_arguments="reject", nonobject_arguments="parsed", split_on="text", finish_on_section="always",
                           unterminated_call="drop", name_rule="last_dot", strip=True),
    "sglang": ServingProfile("sglang", **_MOONSHOT, history_arguments="reserialise", empty_arguments="reject",
                             invalid_arguments="reject", nonobject_arguments="reject", tool_part_join=" ", split_on="text",
                             finish_on_section="on_stop", unterminated_call="drop", id_chars="word_dot",
                             args_object=True, id_rule="sglang", strip=True, strip_reasoning=True),
}
SERVING_CHOICES = tuple(PROFILES)


def get_profile(name: str | ServingProfile, **overrides: Any) -> ServingProfile:
    """The profile called ``name`` with ``overrides`` (fields set to ``None`` are left as the profile has them)."""
    base = name if isinstance(name, ServingProfile) else PROFILES.get(name)
    if base is None:
        raise ValueError(f"unknown serving profile {name!r}; known: {', '.join(PROFILES)}")
    unknown = set(overrides) - {f.name for f in fields(ServingProfile)}
    if unknown:
        raise ValueError(f"unknown serving profile field(s): {', '.join(sorted(unknown))}")
    changes = {k: v for k, v in overrides.items() if v is not None}
    return replace(base, **changes) if changes else base


# --------------------------------------------------------------------------------------------
# Prompt side


def deep_sort(value: Any) -> Any:
    """Every mapping of ``value`` with its keys sorted, recursively (lists keep their order)."""
    if isinstance(value, dict):
        return {k: deep_sort(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [deep_sort(v) for v in value]
    return value


def _reserialised(arguments: Any, profile: ServingProfile, where: str) -> Any:
    """A history call's arguments after the server's ``json.loads`` (the template then writes ``tojson``)."""
    if not arguments:  # None or "": vLLM sets {}, SGLang's loads of "" fails (None is left alone)
        rule = profile.empty_arguments if arguments == "" or profile.empty_arguments == "empty_object" else "verbatim"
        value: Any = {}
    elif not isinstance(arguments, str):
        return arguments
    else:
        try:
            value = json.loads(arguments)
            rule = "parsed" if isinstance(value, dict) else profile.nonobject_arguments
        except ValueError:
            rule = profile.invalid_arguments
    if rule == "reject":
        raise RecordError(f"{where}: the {profile.name} server refuses these arguments ({arguments!r:.40})")
    if rule == "verbatim":
        return arguments
    return {} if rule == "empty_object" else value


def _history_calls(m: dict, profile: ServingProfile, i: int) -> dict:
    calls = []
    for j, call in enumerate(m["tool_calls"]):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict):
            calls.append(call)
            continue
        args = _reserialised(fn.get("arguments"), profile, f"request.messages[{i}].tool_calls[{j}].function.arguments")
        calls.append({**call, "function": {**fn, "arguments": args}})
    return {**m, "tool_calls": calls}


def _joined_tool_text(m: dict, joiner: str) -> dict:
    c = m.get("content")
    if not isinstance(c, list) or not all(isinstance(p, str) or isinstance(p, dict) and p.get("type") == "text"
                                          for p in c):
        return m
    return {**m, "content": joiner.join(p if isinstance(p, str) else _text(p.get("text", "")) for p in c)}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


def preprocess_request(messages: list[dict], tools: list | None,
                       profile: ServingProfile) -> tuple[list[dict], list | None]:
    """``(messages, tools)`` as ``profile``'s server hands them to the template (inputs are not mutated).

    ``messages`` are the normalised request messages (:func:`~kimi_eagle.chat.messages.normalise_messages`);
    RecordError when the server would refuse the request (``reject`` rules).
    """
    if profile.sort_tools and tools:
        tools = deep_sort(tools)
    out = []
    for i, m in enumerate(messages):
        if profile.drop_none_keys:
            m = {k: v for k, v in m.items() if v is not None}
        if profile.history_arguments == "reserialise" and m.get("role") == "assistant" and isinstance(
                m.get("tool_calls"), list):
            m = _history_calls(m, profile, i)
        if profile.tool_part_join is not None and m.get("role") == "tool":
            m = _joined_tool_text(m, profile.tool_part_join)
        out.append(m)
    return out, tools


def history_call_count(messages: list[dict]) -> int:
    """Tool calls in the request's assistant messages (SGLang's ``history_tool_calls_cnt``)."""
    return sum(len(m.get("tool_calls") or []) for m in messages
               if isinstance(m, dict) and m.get("role") == "assistant" and isinstance(m.get("tool_calls"), list))
