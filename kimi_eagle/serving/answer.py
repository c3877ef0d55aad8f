"""A raw Kimi completion -> the API message a server returns for it, under any serving profile.

:func:`parse_completion` reads what K2.5 / K2 wrote after the generation prompt (engine IDs, or text with markers
spelled out) and answers as ``options.serving``'s server does: ``template`` (the default) is the parse as written
(:func:`kimi_eagle.chat.parse.parse_written`); a recorded server version (``answer_rules``) runs its own answer
side (:mod:`kimi_eagle.serving.vllm_answer`, :mod:`kimi_eagle.serving.sglang_answer`); the older transcriptions
split the decoded text on marker spellings (:mod:`kimi_eagle.serving.legacy_answer`) or change the parse as written
(:class:`~kimi_eagle.chat.parse.WrittenRules`). Flags name what the server changed against the IDs as written.

>>> from kimi_eagle.assets import kimi_dir
>>> from kimi_eagle.tokenize.tokenizer import load_tokenizer
>>> tok = load_tokenizer(kimi_dir())
>>> ids = tok.encode("Hmm.</think>Hi.<|im_end|>", allow_special=True)
>>> parse_completion(ids, tok).message()["content"]  # the template's parse: the text as written
'Hi.'
>>> parse_completion(ids, tok, ParseOptions(serving="vllm")).message()["content"]  # vLLM's detokenizer spaces
' Hi.'
"""
from __future__ import annotations

from typing import Sequence

from kimi_eagle.chat.parse import (
    MARKERS,
    PARSE_FORMATS,
    ParsedCompletion,
    ParseOptions,
    WrittenRules,
    check_parse_options,
    completion_units,
    finish_reason,
    parse_written,
)
from kimi_eagle.serving.legacy_answer import parse_served_text
from kimi_eagle.serving.profiles import ServingProfile, get_profile
from kimi_eagle.serving.sglang_answer import parse_sglang
from kimi_eagle.serving.vllm_answer import parse_served
from kimi_eagle.tokenize.tokenizer import Tokenizer

# a profile's answer_rules -> the server version's answer
SERVED_ANSWERS = {"vllm-0.33": parse_served, "sglang-0.5": parse_sglang}


def parse_completion(source: Sequence[int] | str, tok: Tokenizer | None = None,
                     options: ParseOptions = ParseOptions()) -> ParsedCompletion:
    """Parse a raw completion (the IDs or text after the generation prompt) into the API message ``options.serving``'s
    server returns (:class:`~kimi_eagle.chat.parse.ParseOptions`: format, finish reason, whitespace, tool ids)."""
    check_parse_options(options)
    profile = get_profile(options.serving)
    if profile.answer_rules != "legacy":  # a server version read off its recorded answers
        return _parse_served(list(source if not isinstance(source, str) else _text_ids(source, tok)), tok, profile,
                             options)
    if profile.split_on == "text":
        return _parse_as_server(source, tok, profile, options)
    rules = WrittenRules(strip=profile.strip, drop_unterminated=profile.unterminated_call == "drop",
                         renumber=profile.id_rule == "sglang", finish_on_section=profile.finish_on_section)
    return parse_written(source, tok, options, rules)


def _parse_served(ids: list[int], tok: Tokenizer, profile: ServingProfile, options: ParseOptions) -> ParsedCompletion:
    """What ``profile``'s server version answers, with the flags of what it changed against the IDs as written."""
    written = parse_written(ids, tok, ParseOptions(format_name=options.format_name, finish_reason=options.finish_reason))
    serve = SERVED_ANSWERS[profile.answer_rules]
    answer, flags = serve(ids, tok, profile, options, written, PARSE_FORMATS[options.format_name])
    return ParsedCompletion(reasoning=answer.reasoning, content=answer.content, tool_calls=answer.tool_calls,
                            finish_reason=answer.finish_reason, think_end=written.think_end, n_tokens=len(ids),
                            flags=list(dict.fromkeys(flags)))


def _text_ids(text: str, tok: Tokenizer | None) -> list[int]:
    """Raw completion text as IDs: marker spellings as their special tokens, the rest as ordinary text."""
    if tok is None:
        raise ValueError("parsing with a server version's answer rules needs the tokenizer")
    return tok.encode(text, allow_special=set(MARKERS))


def _parse_as_server(source: Sequence[int] | str, tok: Tokenizer | None, profile: ServingProfile,
                     options: ParseOptions) -> ParsedCompletion:
    """The decoded text split on marker spellings by ``profile``'s server parsers."""
    flags: list[str] = []
    units, n_tokens, ended = completion_units(source, tok, flags)
    text = "".join(t for t, _ in units)
    got = parse_served_text(text, profile, PARSE_FORMATS[options.format_name], options.history_tool_calls)
    if got["dropped"]:
        flags.append("dropped_by_server")  # calls the model wrote (in full or cut) that the server did not return
    if got["stripped"]:
        flags.append("whitespace_stripped")  # the server's regexes and strips removed whitespace the model wrote
    if got["renamed"]:
        flags.append("tool_id_renumbered")  # SGLang's functions.NAME:{history + position}, not the id written
    if got["think_end"] is False:
        flags.append("no_think_end")
    elif got["think_end"] is None and PARSE_FORMATS[options.format_name] != "content":
        flags.append("truncated_in_reasoning" if not ended else "reasoning_not_closed")
    finish = options.finish_reason or finish_reason(ended, bool(got["tool_calls"]), got["section"],
                                                    profile.finish_on_section)
    return ParsedCompletion(reasoning=got["reasoning"], content=got["content"], tool_calls=got["tool_calls"],
                            finish_reason=finish, think_end=got["think_end"], n_tokens=n_tokens,
                            flags=list(dict.fromkeys(flags)))
