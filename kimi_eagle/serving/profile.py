"""What a serving profile is: :class:`ServingProfile`, its fields and the values each may take (:data:`CHOICES`).

The named profiles are data files under ``kimi_eagle/serving/profiles/`` (read by
:mod:`kimi_eagle.serving.profiles`); :mod:`kimi_eagle.serving.request` holds the loaded set and applies a profile.

>>> ServingProfile("x", split_on="text").split_on
'text'
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class ServingProfile:
    """One serving stack's conventions around the template (each field overridable:
    :func:`kimi_eagle.serving.request.get_profile`).

    Prompt side: ``tool_declaration`` (``json`` | ``ts``); ``sort_tools`` (deep-sort every mapping of the
    tools by key first); ``history_arguments`` (``verbatim`` | ``reserialise``: parse each history call's
    argument string so the template writes it with ``tojson``); ``empty_arguments`` and
    ``invalid_arguments`` / ``nonobject_arguments`` (what re-serialising does with an empty string, with
    one that is not JSON, and with JSON that is not an object: ``verbatim``, ``empty_object`` (``{}``),
    ``parsed`` (the parsed value) or ``reject`` (the server answers HTTP 400: the record is an error)); ``drop_none_keys`` (message keys
    whose value is ``None`` are removed before rendering); ``tool_part_join`` (``None``: the template
    concatenates a tool message's text parts; a string: the server joins them with it first);
    ``part_join_roles`` (whose text parts ``tool_part_join`` joins: ``tool`` messages only | ``all``
    messages); ``empty_parts`` (``keep`` | ``drop``: text parts whose text is empty, ``None`` or missing are
    left out before joining); ``marker_text`` (``text``: special-token spellings inside request text stay
    ordinary tokens, the kit's reading | ``special``: the server tokenizes the rendered prompt whole, so each
    spelling there becomes its special token: :func:`kimi_eagle.serving.request.served_prompt_pieces`).

    Completion side: ``split_on`` (``ids``: only marker special tokens split; ``text``: the decoded text is
    split on marker spellings, as servers do); ``finish_on_section`` (``never``: ``tool_calls`` only when a
    call parsed; ``on_stop``: a tool section turns ``stop`` into ``tool_calls``; ``always``: a tool section
    makes it ``tool_calls`` whatever the stop); ``unterminated_call`` (``keep`` its arguments | ``drop``
    it); ``name_rule`` (``after_prefix``: the id minus ``functions.`` and ``:N``; ``last_dot``: the last
    dotted part); ``id_chars`` (``any`` | ``word_dot``: ids of ``[\\w.]`` only parse); ``args_object``
    (arguments must be a ``{...}`` on one line to parse); ``id_rule`` (``model``: the id written |
    ``sglang``: ``functions.NAME:{history + position}``); ``strip`` (whitespace around ids and arguments);
    ``strip_reasoning`` (reasoning and content stripped as SGLang's reasoning parser does);
    ``spaces_between_special_tokens`` (the server's detokenizer setting; carried, not read yet).

    Reconstruction: ``omit_think_end_before_tools`` and ``tool_ids`` (the
    :class:`~kimi_eagle.chat.completion.CompletionOptions` of the same names).

    Metadata (no parsing code reads it): ``server`` and ``version`` (from the profile file's header) and
    ``streaming`` (the profile describes the server's streaming path).

    ``answer_rules``: ``legacy`` (the completion-side fields above, as first transcribed) or the name of a
    server version whose answers :mod:`kimi_eagle.serving.vllm_answer` reproduces from its recorded vectors
    (``vllm-0.33``: decode with ``spaces_between_special_tokens``, the parser engine in text mode, or in ID
    mode when ``streaming``); the fields from ``split_on`` to ``strip_reasoning`` are then not read.
    ``request_rules``: ``none`` (every request the template accepts is rendered) or the server version whose
    request checks and message handling :func:`kimi_eagle.serving.request.serve_request` applies first (a request
    that server refuses is an error row naming its reason: :mod:`kimi_eagle.serving.sglang_request`,
    :mod:`kimi_eagle.serving.vllm_request`).
    ``tool_id_type``: the id vLLM makes up for a call whose header has no ``:N`` (``random``:
    ``chatcmpl-tool-<random>``, what it gives other model types; ``kimi_k2``: ``functions.HEADER:N``, N counting the
    made-up ids from 0, what it gives Kimi model types such as K2.5's ``kimi_k25``).
    ``stream_profile``: the profile of the same server's streaming path (a streamed record, one whose converted
    record has a ``stream`` entry, is reconstructed with it).
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
    part_join_roles: str = "tool"
    empty_parts: str = "keep"
    marker_text: str = "text"
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
    spaces_between_special_tokens: bool = False
    answer_rules: str = "legacy"
    request_rules: str = "none"
    tool_id_type: str = "random"
    stream_profile: str = ""
    server: str = ""
    version: str = ""
    streaming: bool = False

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
    "part_join_roles": ("tool", "all"), "empty_parts": ("keep", "drop"), "marker_text": ("text", "special"),
    "split_on": ("ids", "text"), "finish_on_section": ("never", "on_stop", "always"),
    "unterminated_call": ("keep", "drop"), "name_rule": ("after_prefix", "last_dot"), "id_chars": ("any", "word_dot"),
    "id_rule": ("model", "sglang"), "tool_ids": ("auto", "normalise", "keep"),
    "answer_rules": ("legacy", "vllm-0.33", "sglang-0.5"),
    "request_rules": ("none", "vllm-0.33", "vllm-0.34", "sglang-0.5"),
    "tool_id_type": ("random", "kimi_k2"),
}


def field_type(name: str) -> type:
    """The type a profile field's value must have: its default's (``tool_part_join``, default ``None``: ``str``)."""
    default = next(f.default for f in fields(ServingProfile) if f.name == name)
    return str if default is None else type(default)
