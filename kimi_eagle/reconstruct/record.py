"""One API record -> one reconstructed row: parsing the API fields, rendering, encoding once.

``reconstruct_record`` turns one API record (``{"id", "request": {"messages", "tools"?}, "response"}``)
into a :class:`ReconstructedRow`: the rendered prompt's IDs, the completion's IDs encoded once as a
whole string, typed segments with byte and token spans, and flags. Bad input raises ``RecordError``.
``reconstruct_line`` does the same for one raw JSONL line and never raises: bad input becomes an
error row (``error_row``) naming the reason — one row per record on the line (a line holding several
JSON values gives one error row per value). Text the tokenizer cannot encode faithfully (a lone
surrogate anywhere in the rendered prompt or completion) is an error, never a silent U+FFFD.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from kimi_eagle.chat.by_model import pick_format
from kimi_eagle.chat.completion import (
    CONVENTION_FLAGS,
    SPAN_FIELDS,
    CompletionOptions,
    ToolCall,
    Turn,
    dropped_prefix,
    resolve_truncation,
)
from kimi_eagle.chat.encoder import PieceEncoder
from kimi_eagle.chat.formats import Format
from kimi_eagle.chat.messages import check_text, normalise_messages
from kimi_eagle.io import fast_loads, loads_exact, parse_line
from kimi_eagle.reconstruct.log_shapes import as_api_record
from kimi_eagle.reconstruct.logprobs import prefer_logprob_ids
from kimi_eagle.reconstruct.reasoning import reasoning_details_flags
from kimi_eagle.reconstruct.usage import usage_details, usage_shape_problem
from kimi_eagle.records import RecordError, check_id, count_field, printable_id, storable_text, synthetic_id
from kimi_eagle.redact import KEY_FLAG
from kimi_eagle.serving.profiles import PROFILES, ServingProfile, get_profile
from kimi_eagle.serving.provider_table import (
    entry_applies,
    entry_flags,
    record_entry,
)
from kimi_eagle.serving.request import prompt_pieces, serve_request, served_prompt_pieces
from kimi_eagle.serving.unserve import unserve_turn
from kimi_eagle.serving.variants import (
    COUNT_DIMENSIONS,
    Variant,
    served_text_turn,
    template_format,
    variant_prompt_pieces,
)
from kimi_eagle.tokenize.tokenizer import Tokenizer

FINISH_REASONS = ("stop", "tool_calls", "length")
# marker text encoded as ordinary tokens, in the completion or in the prompt (see ``reconstruct_record``)
LITERAL_MARKER_FLAGS = ("literal_marker", "prompt_literal_marker")


def convention_flags(tool_ids: str = "auto") -> list[str]:
    """Every flag a reconstructed row can carry for a completion convention under tool-id policy ``tool_ids``:
    :data:`~kimi_eagle.chat.completion.CONVENTION_FLAGS`, then :data:`LITERAL_MARKER_FLAGS`."""
    return [flag.format(policy=tool_ids) for flag in CONVENTION_FLAGS] + list(LITERAL_MARKER_FLAGS)


@dataclass(frozen=True)
class ReconstructOptions(CompletionOptions):
    """Completion options (see :class:`~kimi_eagle.chat.completion.CompletionOptions`) and the serving
    profile whose prompt preprocessing runs before the template (:mod:`kimi_eagle.serving.request`; its
    tool declaration is the format's, set where the format is made)."""

    serving: ServingProfile = PROFILES["template"]
    # ``--serving auto``: JSON ``[[provider, dataset, profile fields], ...]`` (text, so that a resumed job's
    # manifest compares equal after its JSON round trip)
    serving_by_group: str | None = None
    # ``--serving auto``: the provider table (kimi_eagle/serving/provider_table.py, a path) whose explained entry
    # for a record's provider, model and month decides its profile and conventions before any group choice
    provider_table: str | None = None
    # what the server did to the answer's text (chat/server_variants.py ``answer_text``; the table's variant sets it)
    answer_text: str = "as-served"

    def for_record(self, provider: Any, dataset: Any) -> "ReconstructOptions":
        """The options of a record of ``provider`` in ``dataset``: its group's profile when one was chosen (a provider
        or dataset that is not a string is none, as the choice grouped it: kimi_eagle.serving.auto)."""
        group = tuple(v if isinstance(v, str) else None for v in (provider, dataset))
        profile = _group_profiles(self.serving_by_group).get(group)
        if profile is None:
            return self
        return replace(serving_options(profile, self.tool_id_policy == "keep"), provider_table=self.provider_table)


def serving_groups(profiles: dict[tuple[Any, Any], ServingProfile]) -> str:
    """The ``serving_by_group`` text of ``{(provider, dataset): profile}``."""
    rows = sorted(([p, d, profile.to_dict()] for (p, d), profile in profiles.items()), key=lambda r: (str(r[0]), str(r[1])))
    return json.dumps(rows, sort_keys=True)


@lru_cache(maxsize=8)
def _group_profiles(text: str | None) -> dict[tuple[Any, Any], ServingProfile]:
    return {(p, d): ServingProfile(**fields) for p, d, fields in json.loads(text)} if text else {}


def serving_options(profile: ServingProfile, keep_tool_ids: bool = False) -> ReconstructOptions:
    """The reconstruction options of ``profile`` (its completion-side fields)."""
    return ReconstructOptions(omit_think_end_before_tools=profile.omit_think_end_before_tools,
                              tool_ids="keep" if keep_tool_ids else profile.tool_ids,
                              unterminated_call=profile.unterminated_call, serving=profile)


@dataclass
class ReconstructedRow:
    """One row of the reconstruction (schema in docs/CONTRACTS.md)."""

    id: str
    dataset: str | None
    status: str
    error: str | None
    format: str
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    n_prompt_tokens: int = 0
    n_completion_tokens: int = 0
    segments: list[dict[str, Any]] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    billed_completion_tokens: int | None = None
    billed_reasoning_tokens: int | None = None
    provider: str | None = None
    usage_error: str | None = None  # why a billed count is null: usage missing, or a count that is not an integer
    ids_source: str | None = None  # "logprobs" (the answer's logprob tokens) or "text" (encoded from the text)
    billed_cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    cost: float | None = None  # usage.cost
    serving: str | None = None  # the serving profile the row was reconstructed with (kimi_eagle.serving.request)
    serving_variant: str | None = None  # the provider table's variant the prompt was rendered with (None: none)
    count_conventions: list[str] = field(default_factory=list)  # the table's completion count conventions (billing)
    billed_prompt_tokens: int | None = None  # usage.prompt_tokens
    prompt_count_offset: int | None = None  # the table variant's prompt count offsets (None: no variant rendered it)

    def to_dict(self) -> dict[str, Any]:
        """The row as a dict (shallow: the ID lists are shared, not copied)."""
        return dict(self.__dict__)

    @property
    def loss_mask(self) -> list[int]:
        return [0] * self.n_prompt_tokens + [1] * self.n_completion_tokens


# --------------------------------------------------------------------------------------------
# Parsing an API record



def _known(segments: list, seg_flags: list[str], ids: list[int], spans: list, marker: bool,
           context: tuple) -> tuple[list, list[str], list[int], list, bool]:
    """:func:`~kimi_eagle.chat.completion.dropped_prefix` applied, re-encoded when it cut the segments."""
    response, finish_reason, enc, fmt = context
    known, seg_flags = dropped_prefix(segments, seg_flags, len(ids), _billed(response), finish_reason)
    if len(known) == len(segments):
        return segments, seg_flags, ids, spans, marker
    return (known, seg_flags, *enc.encode_segments_marked(known, continuation=fmt.continuation))


def _billed(response: dict) -> int | None:
    """``usage.completion_tokens`` when it is a count."""
    usage = response.get("usage")
    return _opt_int(usage.get("completion_tokens")) if isinstance(usage, dict) else None


def _opt_int(value: Any) -> int | None:
    """A billed count: a non-negative integer that fits int64, else None (negative or huge counts are not billing)."""
    return count_field(value)


def _shown(value: Any) -> str:
    """A value for a message, never huge (a 4,000-digit integer is named by its length)."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}…({len(text)} characters)"


def usage_problem(response: dict) -> str | None:
    """Why a billed count is null: no ``usage``, no ``completion_tokens``, a count that is not an integer, or usage
    details that are not objects (``completion_tokens_details`` given as a list: its reasoning count is unread)."""
    usage = response.get("usage")
    if not isinstance(usage, dict):
        return "no usage in the response" if usage is None else f"usage is a {type(usage).__name__}, not an object"
    shape = usage_shape_problem(usage)
    details = usage.get("completion_tokens_details")
    counts = {"usage.completion_tokens": usage.get("completion_tokens"),
              "usage.completion_tokens_details.reasoning_tokens": details.get("reasoning_tokens") if isinstance(details, dict) else None}
    problems = [f"{name} is {_shown(value)}, not a count (an integer 0 <= n < 2**63)" for name, value in counts.items()
                if value is not None and _opt_int(value) is None]
    if "completion_tokens" not in usage:
        problems.insert(0, "usage.completion_tokens is missing")
    return "; ".join([shape] * bool(shape) + problems) or None


def _reasoning(message: dict) -> str | None:
    """``reasoning``, else the text of ``reasoning_details``, else ``reasoning_content``."""
    r = message.get("reasoning")
    if isinstance(r, str) and r:
        return r
    details = message.get("reasoning_details")
    if isinstance(details, list):
        texts = [d["text"] for d in details if isinstance(d, dict) and isinstance(d.get("text"), str)]
        if texts:
            return "".join(texts)
    rc = message.get("reasoning_content")
    if isinstance(rc, str) and rc:
        return rc
    return None


def parse_turn(response: Any) -> Turn:
    """The generated message of an OpenRouter chat.completion response."""
    if not isinstance(response, dict):
        raise RecordError("response is not a JSON object")
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices:
        raise RecordError("response has no choices")
    choice = choices[0]
    if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
        raise RecordError("response.choices[0] has no message")
    msg = choice["message"]
    finish = choice.get("finish_reason")
    if finish not in FINISH_REASONS:
        raise RecordError(f"unknown finish_reason {finish!r} (expected one of {', '.join(FINISH_REASONS)})")
    reasoning = _reasoning(msg)
    text = msg.get("content")
    if text is not None and not isinstance(text, str):
        raise RecordError(f"message content is a {type(text).__name__}, not a string")
    calls = []
    raw_calls = msg.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise RecordError(f"message tool_calls is a {type(raw_calls).__name__}, not a list")
    for k, call in enumerate(raw_calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise RecordError(f"tool_calls[{k}] has no function name")
        args = fn.get("arguments", "")
        if isinstance(args, str):
            check_text(args, f"tool_calls[{k}] arguments")
        cid = call.get("id")
        calls.append(ToolCall(cid if isinstance(cid, str) else None, fn["name"], args))
    if reasoning:
        check_text(reasoning, "reasoning")
    if text:
        check_text(text, "content")
    return Turn(reasoning, text, calls, finish)


KIMI_TOOL_ID = re.compile(r"functions\.(.+):\d+")  # the Kimi tool-call id: functions.NAME:INDEX


def answer_flags(response: dict, turn: Turn) -> list[str]:
    """What reconstruction cannot keep, said: ``answer_empty`` when the message has no reasoning, content or tool
    calls (the server returned none of what the model generated: the completion is its end of turn alone, and a
    billed count above that is the text it dropped), ``choices_dropped:K`` when an ``n > 1`` answer has K choices after
    ``choices[0]`` (only the first is reconstructed), ``tool_name_mismatch`` when a call's Kimi id names another
    function than its ``name``."""
    flags = [] if turn.reasoning or turn.content or turn.tool_calls else ["answer_empty"]
    if len(response["choices"]) > 1:
        flags.append(f"choices_dropped:{len(response['choices']) - 1}")
    for call in turn.tool_calls:
        m = KIMI_TOOL_ID.fullmatch(call.id or "")
        if m and m.group(1) != call.name and "tool_name_mismatch" not in flags:
            flags.append("tool_name_mismatch")
    return flags



# --------------------------------------------------------------------------------------------
# One record


def _checked_id(record: Any) -> str:
    """The id of an API record; RecordError for a record that is not an object, a converter error, or a bad id."""
    if not isinstance(record, dict):
        raise RecordError("record is not a JSON object")
    if record.get("error"):
        raise RecordError(f"converter: {record['error']}")
    rid = record.get("id")
    if not isinstance(rid, str) or not rid:
        raise RecordError("record has no string id")
    return check_id(rid, "record id")


def _prompt_pieces(request: dict, messages: list[dict], fmt: Format, tok: Tokenizer, serving: ServingProfile | None,
                   variant: Variant | None) -> list:
    """The prompt pieces: the format's, or the provider table's ``variant`` under ``serving``."""
    try:
        if variant is not None:
            return variant_prompt_pieces(messages, request.get("tools"), fmt.name, variant, serving, tok) or []
        return prompt_pieces(fmt, messages, request.get("tools"), request)  # as the server renders it
    except RecordError:
        raise
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise RecordError(f"cannot render the prompt: {type(e).__name__}: {e}") from None


def _encode_prompt(request: dict, messages: list[dict], fmt: Format, enc: PieceEncoder,
                   serving: ServingProfile | None = None, variant: Variant | None = None) -> tuple[list[int], bool]:
    """The prompt's IDs and whether marker text was encoded as ordinary tokens; RecordError if it cannot be
    rendered or holds text that is not valid Unicode. ``serving``: marker spellings in the text become special
    tokens where that profile's server tokenizes the rendered string whole (``marker_text = "special"``);
    ``variant``: the provider table's rendering (its count offsets are not tokens)."""
    prompt_pieces = _prompt_pieces(request, messages, fmt, enc.tok, serving, variant)
    check_encodable((t for t, _ in prompt_pieces), request, "request", "the prompt")
    if serving is not None and serving.marker_text != "text":
        prompt_pieces = served_prompt_pieces(prompt_pieces, serving, enc.tok.special_id_by_text)
    return enc.encode_marked(prompt_pieces)


def _table_entry(record: dict, options: CompletionOptions, fmt: Format) -> Any:
    """The provider table's entry for ``record`` when the options name a table, the entry explains at least one
    side (:func:`~kimi_eagle.serving.provider_table.entry_applies`) and its template applies to ``fmt`` (None
    otherwise: the group's choice decides)."""
    path = getattr(options, "provider_table", None)
    entry = record_entry(record, path) if path else None
    if entry is None or not entry_applies(entry) or template_format(entry.variant.template, fmt.name) is None:
        return None
    return entry


def _count_conventions(entry: Any) -> list[str]:
    """The completion count conventions of the table ``entry`` that rendered a row, every one of
    :data:`~kimi_eagle.serving.variants.COUNT_DIMENSIONS` as ``name=value`` (``completion_offset=-1``); ``[]``
    without one. Billing trusts them in place of its votes where the entry explains its completions (at least 90 %
    equal), and only where they predict the row's count exactly where it does not (the row is then flagged
    ``provider_table_completion_unexplained``)."""
    if entry is None:
        return []
    return [f"{k}={getattr(entry.variant, k)}" for k in COUNT_DIMENSIONS]


def _table_flags(entry: Any) -> list[str]:
    """``provider_table_<side>_unexplained`` for each side the table entry that rendered the row does not explain,
    ``provider_table_thin`` for an entry explained on thin evidence (:func:`~kimi_eagle.serving.provider_table.entry_flags`)."""
    return entry_flags(entry)


def _served(record: dict, messages: list[dict], tools: list | None, options: CompletionOptions, fmt: Format,
            group: tuple[Any, Any]) -> tuple[dict, list[dict], CompletionOptions, Format, Any]:
    """The request as the serving profile hands it to the template (unchanged for ``template``), the options and
    format of the record's group (``--serving auto``: its profile and tool declaration), and the provider table's
    entry when it explains a side for the record (its variant and profile then replace the group's)."""
    request = record["request"]
    entry = _table_entry(record, options, fmt)
    if entry is not None:
        profile = get_profile(entry.variant.profile)
        table_options = replace(serving_options(profile, options.tool_id_policy == "keep"),
                                provider_table=options.provider_table, answer_text=entry.variant.answer_text)
        return request, messages, table_options, _declaring(fmt, profile.tool_declaration), entry
    if getattr(options, "serving_by_group", None):
        options = options.for_record(*group)
        fmt = _declaring(fmt, options.serving.tool_declaration)
    serving = getattr(options, "serving", None)
    if serving is None or serving == PROFILES["template"]:
        return request, messages, options, fmt, None
    request, messages, served_tools = serve_request(request, serving)  # its refusals first (request_rules)
    request = {**request, "tools": served_tools} if served_tools is not None or "tools" in request else request
    return request, messages, options, fmt, None


def _unserved(record: dict, options: CompletionOptions, turn: Turn, fmt: Format) -> tuple[CompletionOptions, Turn, list[str]]:
    """The answer as the model wrote it (chat/unserve.py: what the profile's server added taken away, flags for
    what it lost), under the profile's streaming variant when the record is a streamed answer."""
    if record.get("stream") is not None:
        options = _streamed(options)
    turn, text_flags = served_text_turn(turn, getattr(options, "answer_text", "as-served"))
    turn, flags = unserve_turn(turn, getattr(options, "serving", PROFILES["template"]),
                               thinking=getattr(fmt, "thinking", True))
    return options, turn, text_flags + flags


def _streamed(options: CompletionOptions) -> CompletionOptions:
    """``options`` with the serving profile's ``stream_profile`` (its server's streaming path), if it names one."""
    serving = getattr(options, "serving", None)
    if serving is None or not serving.stream_profile:
        return options
    return replace(options, serving=get_profile(serving.stream_profile))


def _declaring(fmt: Format, tool_declaration: str) -> Format:
    """``fmt`` with the tool declaration ``tool_declaration`` (formats without one are returned as they are)."""
    if not hasattr(fmt, "tools_ts"):
        return fmt
    from kimi_eagle.chat.tool_decl import typescript_or_none

    wanted = typescript_or_none if tool_declaration == "ts" else None
    return fmt if fmt.tools_ts is wanted else replace(fmt, tools_ts=wanted)


def _prompt_flags(marker: bool, fmt: Format, request: dict) -> list[str]:
    """``prompt_literal_marker`` (marker text in the request kept as text), ``tool_declaration_json_fallback``
    (``fmt`` declares TypeScript tools, but Moonshot's conversion fails on them: JSON was declared) and
    ``lone_surrogate_replaced`` (the server read a lone surrogate in a message as U+FFFD)."""
    from kimi_eagle.chat.tool_decl import typescript_or_none

    tools, served = request.get("tools"), request.get("_served") if isinstance(request.get("_served"), dict) else {}
    fallback = bool(tools) and getattr(fmt, "tools_ts", None) is typescript_or_none and typescript_or_none(tools) is None
    return (["prompt_literal_marker"] * bool(marker) + ["tool_declaration_json_fallback"] * fallback
            + ["lone_surrogate_replaced"] * bool(served.get("surrogates_replaced")))


def reconstruct_record(record: Any, tok: Tokenizer, fmt: Format, options: CompletionOptions = ReconstructOptions(),
                       encoder: PieceEncoder | None = None) -> ReconstructedRow:
    """Reconstruct one API record; raises RecordError with a clear message for bad input.

    ``encoder``: a :class:`PieceEncoder` of ``tok`` shared by the calls of a loop (its run cache makes
    a conversation's later prompts cheap); without one, a fresh encoder is built for this record.
    """
    record = as_api_record(record)  # a logged completion in another accepted shape (reconstruct/log_shapes)
    rid = _checked_id(record)
    dataset, provider = record.get("dataset"), response_field(record.get("response"), "provider")
    for name, value in (("dataset", dataset), ("response.provider", provider)):
        if isinstance(value, str) and not storable_text(value):
            raise RecordError(f"{name} is not valid Unicode (lone surrogate)")
    request, response = record.get("request"), record.get("response")
    if not isinstance(request, dict):
        raise RecordError("record has no request object")
    messages = normalise_messages(request.get("messages"))
    tools = request.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise RecordError("request.tools is not a list")
    turn = parse_turn(response)
    fmt, format_flags = pick_format(fmt, record)  # --format auto: the record's own model's format
    request, messages, options, fmt, entry = _served(record, messages, tools, options, fmt, (provider, dataset))
    variant = entry.variant if entry is not None else None
    options, turn, unserved = _unserved(record, options, turn, fmt)
    enc = _encoder(encoder, tok)
    flags = (reasoning_details_flags(response["choices"][0]["message"]) + answer_flags(response, turn) + unserved
             + _table_flags(entry) + format_flags)
    prompt_ids, prompt_marker = _encode_prompt(request, messages, fmt, enc, getattr(options, "serving", None), variant)
    flags += _prompt_flags(prompt_marker, fmt, request)
    segments, seg_flags = fmt.completion_segments(turn, messages, options)
    check_encodable((s.text for s in segments), response, "response", "the completion")
    completion_ids, spans, marker = enc.encode_segments_marked(segments, continuation=fmt.continuation)
    if "truncated_in_tool_call" in seg_flags:  # closed or not after the last arguments: the billed count decides
        billed = response.get("usage", {}).get("completion_tokens") if isinstance(response.get("usage"), dict) else None
        segments, seg_flags = resolve_truncation(segments, seg_flags, len(completion_ids), _opt_int(billed))
        completion_ids, spans, marker = enc.encode_segments_marked(segments, continuation=fmt.continuation)
    if options.unterminated_call == "drop":  # the server dropped what it could not parse: keep what is known
        segments, seg_flags, completion_ids, spans, marker = _known(segments, seg_flags, completion_ids, spans, marker,
                                                                    (response, turn.finish_reason, enc, fmt))
    if marker:
        flags.append("literal_marker")
    # exact IDs from the answer's logprobs when it has them (kimi_eagle.reconstruct.logprobs):
    completion_ids, spans, ids_source, logprob_flags = prefer_logprob_ids(response, tok, completion_ids, spans)
    flags = seg_flags + flags + logprob_flags
    if "args_not_json" not in flags and any(not strict_json(call.arguments) for call in turn.tool_calls):
        flags.append("args_not_json")  # NaN / Infinity, which Python's json accepts and JSON does not
    if record.get("key_redacted"):
        flags.append(KEY_FLAG)  # the API key was in response.provider or .model: replaced by a marker
    return ReconstructedRow(
        id=rid, dataset=dataset if isinstance(dataset, str) else None, status="ok", error=None, format=fmt.name,
        prompt_ids=prompt_ids, completion_ids=completion_ids, n_prompt_tokens=len(prompt_ids),
        n_completion_tokens=len(completion_ids),
        segments=[dict(zip(SPAN_FIELDS, s)) for s in spans], flags=flags, finish_reason=turn.finish_reason,
        **_billed_counts(response), **usage_details(response), ids_source=ids_source,
        provider=provider if isinstance(provider, str) else None, usage_error=usage_problem(response),
        serving=getattr(options, "serving", PROFILES["template"]).name,
        serving_variant=variant.describe() if variant is not None else None,
        count_conventions=_count_conventions(entry), prompt_count_offset=prompt_count_offset(variant, record["request"]))


def _encoder(encoder: PieceEncoder | None, tok: Tokenizer) -> PieceEncoder:
    """``encoder``, or a fresh one of ``tok``; ValueError when ``encoder`` belongs to another tokenizer."""
    enc = encoder if encoder is not None else PieceEncoder(tok)
    if enc.tok is not tok:
        raise ValueError("the encoder belongs to another tokenizer")
    return enc


def _billed_counts(response: dict) -> dict[str, int | None]:
    """``usage.completion_tokens``, ``usage.completion_tokens_details.reasoning_tokens`` and ``usage.prompt_tokens``
    as counts (None if not: a bool, a negative, a float or a string is never coerced)."""
    usage = response.get("usage") if isinstance(response.get("usage"), dict) else {}
    details = usage.get("completion_tokens_details") if isinstance(usage.get("completion_tokens_details"), dict) else {}
    return {"billed_completion_tokens": _opt_int(usage.get("completion_tokens")),
            "billed_reasoning_tokens": _opt_int(details.get("reasoning_tokens")),
            "billed_prompt_tokens": _opt_int(usage.get("prompt_tokens"))}


def prompt_count_offset(variant: Variant | None, request: dict) -> int | None:
    """What the provider table's ``variant`` that rendered a prompt adds to its count (count conventions, not tokens
    in ``prompt_ids``; the sum :meth:`~kimi_eagle.serving.calibration.VariantCounts.prompt` adds): ``prompt_offset``,
    ``history_call_offset`` per earlier tool call in ``request``'s messages, ``tool_turn_offset`` when it declares
    tools. None when no table variant rendered the prompt."""
    return None if variant is None else variant.prompt_count_offset(request)


def error_row(rid: str, error: str, fmt_name: str, record: Any = None) -> ReconstructedRow:
    """The row of a record that could not be reconstructed: its id, dataset and the reason (always storable)."""
    dataset = record.get("dataset") if isinstance(record, dict) else None
    dataset = dataset if isinstance(dataset, str) and storable_text(dataset) else None
    return ReconstructedRow(id=rid, dataset=dataset, status="error", error=printable_id(error), format=fmt_name)


def record_id(record: Any, lineno: int, value: int | None = None) -> str:
    """The record's id, or the synthetic ``<line N>`` when it has no usable one (see
    :func:`~kimi_eagle.records.synthetic_id`: real ids of that form are refused, so they never collide)."""
    rid = record.get("id") if isinstance(record, dict) else None
    try:
        return check_id(rid) if isinstance(rid, str) else synthetic_id(lineno, value)
    except RecordError:
        return synthetic_id(lineno, value)


def reconstruct_line(raw: bytes, lineno: int, tok: Tokenizer, fmt: Format, options: CompletionOptions,
                     encoder: PieceEncoder | None = None) -> list[dict[str, Any]]:
    """One physical JSONL line -> its row dicts (never raises for bad input), each with its ``line`` number.

    One row, unless the line holds several JSON values: then one error row per value.
    """
    ok, obj = fast_loads(raw)  # the common case, decided as parse_line decides it (without its Line)
    if ok:
        return [_row(obj, lineno, (tok, fmt, options, encoder))]
    lines = parse_line(raw, lineno)
    rows = []
    for k, line in enumerate(lines, 1):
        if line.error:
            row = error_row(record_id(line.partial, lineno, k if len(lines) > 1 else None), line.error, fmt.name,
                            line.partial).to_dict()
            row["line"] = lineno
        else:
            row = _row(line.obj, lineno, (tok, fmt, options, encoder))
        rows.append(row)
    return rows


def _row(record: Any, lineno: int, how: tuple[Tokenizer, Format, CompletionOptions, PieceEncoder | None]) -> dict[str, Any]:
    """The row dict of a parsed record at line ``lineno``: reconstructed, or its error row naming why."""
    tok, fmt, options, encoder = how
    try:
        row = reconstruct_record(record, tok, fmt, options, encoder)
    except RecordError as e:
        row = error_row(record_id(record, lineno), str(e), fmt.name, record)
    except Exception as e:  # a record the checks did not foresee must not stop the run
        row = error_row(record_id(record, lineno), f"unexpected {type(e).__name__}: {e}", fmt.name, record)
    d = row.to_dict()
    d["line"] = lineno
    return d


# --------------------------------------------------------------------------------------------
# Checks


def response_field(response: Any, name: str) -> Any:
    return response.get(name) if isinstance(response, dict) else None


def strict_json(arguments: Any) -> bool:
    """Whether tool-call arguments are (or serialise to) standard JSON: ``NaN``/``Infinity`` are not."""
    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    try:
        if isinstance(arguments, str):
            loads_exact(arguments, parse_constant=refuse)
        else:
            json.dumps(arguments, allow_nan=False)
    except (ValueError, TypeError, RecursionError):
        return False
    return True


def surrogate_path(value: Any, root: str) -> str | None:
    """The path (``request.tools[0].function.description``) of the first string or key in ``value`` that
    holds a lone surrogate, or None; walked without recursion."""
    stack = [(value, root)]
    while stack:
        v, path = stack.pop()
        if isinstance(v, str):
            if not storable_text(v):
                return path
        elif isinstance(v, dict):
            for key, child in reversed(list(v.items())):
                if isinstance(key, str) and not storable_text(key):
                    return f"{path} (a key)"
                stack.append((child, f"{path}.{key}"))
        elif isinstance(v, list):
            stack.extend((child, f"{path}[{k}]") for k, child in reversed(list(enumerate(v))))
    return None


def check_encodable(texts: Any, source: Any, root: str, what: str) -> None:
    """Raise RecordError if any of ``texts`` (what will be encoded) holds a lone surrogate, naming where in
    ``source`` it came from: the tokenizer would otherwise encode it as U+FFFD without a word."""
    for text in texts:
        if not storable_text(text):
            where = surrogate_path(source, root)
            raise RecordError(f"{what} holds text that is not valid Unicode (a lone surrogate"
                              f"{' in ' + printable_id(where) if where else ''}); it cannot be encoded faithfully")


def rebuild_under(record: Any, profile: ServingProfile, answer_text: str, fmt: Format, encoder: PieceEncoder) -> ReconstructedRow:
    """``record`` reconstructed under ``profile`` with the ``answer_text`` convention: the count calibration compares
    with the billed one (:data:`kimi_eagle.serving.calibration.Rebuild`)."""
    options = replace(serving_options(profile), answer_text=answer_text)
    return reconstruct_record(record, encoder.tok, fmt, options, encoder)
