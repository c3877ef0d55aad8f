"""``--serving auto``: pick each provider's serving profile from the evidence the provider itself gives.

For every (provider, dataset) group, the prompts of its records with a billed prompt count (every one up to
``per_group``, 512 by default; beyond that a uniform sample of ``per_group``, stated in each choice's line:
:func:`sample_groups`) are rendered under each candidate profile (its preprocessing and tool declaration) and counted; the profile whose count equals
the billed ``usage.prompt_tokens`` on the most records wins (TypeScript and JSON tool declarations differ
by many tokens, re-serialised history arguments by a few). Ties (profiles that render a group's prompts
alike) go first to the completion counts against ``usage.completion_tokens`` (on the records whose
completion differs between candidates, when the counter gives them; :func:`completion_agrees`), then to the answers'
conventions: the first tied SGLang profile (``id_rule = "sglang"``) when every returned tool-call id is SGLang's
``functions.NAME:{history calls + position}`` and at least one is, else the first tied profile in :data:`CANDIDATES`
order.

:data:`CANDIDATES` (:data:`kimi_eagle.serving.request.CANDIDATES`) are canonical profile names, from the profile
files' ``candidate`` ranks (today ``template``, ``moonshot``, ``vllm-legacy``, ``sglang-legacy``): the choices, the
evidence keys and the ``serving`` column name them, never an alias.

A group without usable evidence gets ``template`` (today's rendering, byte for byte; :func:`no_evidence`
says why): no billed prompt count, a chat format the profiles do not change (not ``kimi-*``), no
request with tools or tool history while every candidate's prompt (and completion) counts agree, or no
candidate's prompt count equal to any billed one (the provider counts with another tokenizer or format, so its
completion counts tell nothing either).
"""
from __future__ import annotations

import hashlib
import heapq
import os
from typing import Any, Callable, Iterable

from kimi_eagle.chat.by_model import AUTO, format_name_for, pick_format, record_format
from kimi_eagle.chat.encoder import PieceEncoder
from kimi_eagle.chat.messages import normalise_messages
from kimi_eagle.records import RecordError, count_field
from kimi_eagle.serving.periods import scope
from kimi_eagle.serving.profiles import CANDIDATES, PROFILES, ServingProfile
from kimi_eagle.serving.provider_table import entry_applies, record_entry, unexplained_sides
from kimi_eagle.serving.request import history_call_count, preprocess_request, served_prompt_pieces
from kimi_eagle.serving.variants import template_format
from kimi_eagle.tokenize.tokenizer import Tokenizer


def billed_count(record: dict, name: str) -> int | None:
    """``response.usage[name]`` when it is a count."""
    response = record.get("response")
    usage = response.get("usage") if isinstance(response, dict) else None
    return count_field(usage.get(name)) if isinstance(usage, dict) else None


def _group(record: dict) -> tuple[str | None, str | None]:
    response = record.get("response")
    provider = response.get("provider") if isinstance(response, dict) else None
    dataset = record.get("dataset")
    return (provider if isinstance(provider, str) else None, dataset if isinstance(dataset, str) else None)


def _sglang_ids(record: dict) -> bool | None:
    """Are the answer's tool-call ids SGLang's renumbered ones? ``None`` without tool calls."""
    try:
        message = record["response"]["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        first = history_call_count(record["request"]["messages"])
    except (KeyError, IndexError, TypeError, AttributeError):
        return None
    names = [(c.get("function") or {}).get("name") for c in calls if isinstance(c, dict)]
    if not names:
        return None
    return [c.get("id") for c in calls] == [f"functions.{n}:{first + k}" for k, n in enumerate(names)]


def prompt_counts(record: dict, encoders: dict[str, tuple[Any, PieceEncoder]]) -> dict[str, int | None]:
    """The record's prompt token count under each candidate (``None`` where its server refuses it)."""
    request = record.get("request") if isinstance(record, dict) else None
    out: dict[str, int | None] = {}
    for name, (fmt, enc) in encoders.items():
        fmt = pick_format(fmt, record)[0]  # --format auto: the record's model's format
        try:
            messages = normalise_messages(request.get("messages"))
            messages, tools = preprocess_request(messages, request.get("tools"), PROFILES[name])
            pieces = served_prompt_pieces(fmt.prompt_pieces(messages, tools), PROFILES[name], enc.tok.special_id_by_text)
            out[name] = len(enc.encode(pieces))
        except (RecordError, AttributeError, KeyError, TypeError, ValueError):
            out[name] = None
    return out


def _counts_differ(counts: dict[str, Any]) -> bool:
    return len({c for c in counts.values() if c is not None}) > 1


def _tool_relevant(record: dict) -> bool:
    """Does the request declare tools or hold tool history (what the profiles' prompt sides change)?"""
    request = record.get("request") if isinstance(record.get("request"), dict) else {}
    messages = request.get("messages") if isinstance(request.get("messages"), list) else []
    return bool(request.get("tools")) or any(isinstance(m, dict) and (m.get("role") == "tool" or m.get("tool_calls"))
                                             for m in messages)


def _best(names: list[str], matched: dict[str, int]) -> list[str]:
    top = max(matched.get(n, 0) for n in names)
    return [n for n in names if matched.get(n, 0) == top]


def _pick(g: dict[str, Any]) -> str:
    """The group's profile: no usable evidence -> ``template``; else the most prompt matches, ties broken by
    completion matches, then by the answers' conventions (:func:`answer_consistent`), then by SGLang's ids (the
    first tied profile that renumbers ids, :func:`renumbers_ids`), then by :data:`CANDIDATES` order."""
    if no_evidence(g):
        return "template"
    tied = _best(list(CANDIDATES), g["prompt_matched"])
    if g["completion_compared"]:
        tied = _best(tied, g["completion_matched"])
    if g.get("answer_compared"):
        tied = _best(tied, g["answer_matched"])
    renumbering = [n for n in tied if renumbers_ids(PROFILES[n])]
    if renumbering and g["sglang_votes"] and all(g["sglang_votes"]):
        return renumbering[0]
    return tied[0]


def renumbers_ids(profile: ServingProfile) -> bool:
    """Does the profile's server replace tool-call ids by ``functions.NAME:{history calls + position}`` (SGLang)?"""
    return profile.id_rule == "sglang" or profile.answer_rules.startswith("sglang")


def _new_group() -> dict[str, Any]:
    return {"compared": 0, "prompt_matched": dict.fromkeys(CANDIDATES, 0), "completion_compared": 0,
            "completion_matched": dict.fromkeys(CANDIDATES, 0), "answer_compared": 0,
            "answer_matched": dict.fromkeys(CANDIDATES, 0), "sglang_votes": [], "tool_relevant": False,
            "prompts_differ": False}


def _add_evidence(g: dict[str, Any], record: dict, counts: dict[str, Any], billed: int) -> None:
    """One record's counts (``{name: (prompt, completion, dropped) | None}``) against its billed counts."""
    g["compared"] += 1
    g["tool_relevant"] = g["tool_relevant"] or _tool_relevant(record)
    prompts = {n: c[0] if c else None for n, c in counts.items()}
    completions = {n: c[1:] if c and c[1] is not None else None for n, c in counts.items()}
    g["prompts_differ"] = g["prompts_differ"] or _counts_differ(prompts)
    for name, c in prompts.items():
        g["prompt_matched"][name] += c == billed
    billed_completion = billed_count(record, "completion_tokens")
    if billed_completion is not None and _counts_differ(completions):  # secondary evidence: only where handling differs
        g["completion_compared"] += 1
        for name, c in completions.items():
            g["completion_matched"][name] += c is not None and completion_agrees(c[0], c[1], billed_completion)
    votes = {name: answer_consistent(record, PROFILES[name]) for name in CANDIDATES}
    if len({v for v in votes.values() if v is not None}) > 1:  # evidence only where the candidates' answers differ
        g["answer_compared"] += 1
        for name, v in votes.items():
            g["answer_matched"][name] += bool(v)
    vote = _sglang_ids(record)
    if vote is not None:
        g["sglang_votes"].append(vote)


def _message(record: dict) -> dict | None:
    try:
        choice = record["response"]["choices"][0]
        return {**choice["message"], "finish_reason": choice.get("finish_reason")}
    except (KeyError, IndexError, TypeError):
        return None


def answer_consistent(record: dict, profile: ServingProfile) -> bool | None:
    """Could ``profile``'s server have written this answer? ``None`` when the answer says nothing either way.

    Read from the answer alone: a leading space in reasoning (or in content after reasoning) is the
    detokenizer's ``spaces_between_special_tokens`` (servers with it on always start them with one; without
    it, or with the jinja alone, a model rarely does); a length cut that still returns a tool call is vLLM
    0.33's (older vLLM and SGLang drop the cut call and report ``tool_calls``); a ``chatcmpl-tool-<random>`` id
    is vLLM 0.33's for a header it could not read.
    """
    msg = _message(record)
    if not isinstance(msg, dict):
        return None
    first = next((t for t in (msg.get("reasoning") or msg.get("reasoning_content"), msg.get("content"))
                  if isinstance(t, str) and t), None)
    verdicts = []
    if first is not None:
        verdicts.append(first.startswith(" ") == profile.spaces_between_special_tokens)
    if msg.get("finish_reason") == "length" and msg.get("tool_calls"):
        verdicts.append(profile.answer_rules == "vllm-0.33" or profile.unterminated_call == "keep")
    ids = [c.get("id") for c in msg.get("tool_calls") or [] if isinstance(c, dict)]
    if any(isinstance(i, str) and i.startswith(VLLM_RANDOM_ID) for i in ids):
        verdicts.append(profile.answer_rules == "vllm-0.33")  # made up by vLLM 0.33 for a header it could not read
    return all(verdicts) if verdicts else None


VLLM_RANDOM_ID = "chatcmpl-tool-"


def completion_agrees(count: int, dropped: bool, billed: int) -> bool:
    """A candidate's completion agrees with the billed count: equal, or shorter where that profile says its server
    dropped what it could not parse (``dropped_by_server``: the billed tokens past the known prefix)."""
    return count == billed or (dropped and count < billed)


def prompt_only_counter(tok: Tokenizer, format_name: str) -> Callable[[dict], dict[str, Any]]:
    """``record -> {name: (prompt count, None, False) | None}``: the prompt under each candidate (no completion
    evidence)."""
    encoders = {name: (record_format(format_name, tok, PROFILES[name].tool_declaration), PieceEncoder(tok))
                for name in CANDIDATES}

    def count(record: dict) -> dict[str, Any]:
        return {n: None if c is None else (c, None, False) for n, c in prompt_counts(record, encoders).items()}
    return count


def _sample_key(record: dict, position: int) -> str:
    """The record's rank in the uniform sample: sha256 of its id (of its position without one)."""
    rid = record.get("id")
    text = rid if isinstance(rid, str) else f"#{position}"
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def sample_groups(records: Iterable[Any], per_group: int) -> dict[tuple, tuple[int, list[dict]]]:
    """``{(provider, dataset): (records seen, sample)}``: per group a uniform sample of at most ``per_group``
    records with a billed prompt count, the ``per_group`` smallest sha256 ranks of their ids (bottom-k: every record
    equally likely, the same sample on every run, memory bounded by ``per_group`` per group), in input order."""
    kept: dict[tuple, list] = {}
    seen: dict[tuple, int] = {}
    for position, record in enumerate(records):
        if not isinstance(record, dict):
            continue
        group = _group(record)
        heap = kept.setdefault(group, [])
        if billed_count(record, "prompt_tokens") is None:
            continue
        seen[group] = seen.get(group, 0) + 1
        item = (_negated(_sample_key(record, position)), position, record)
        if len(heap) < per_group:
            heapq.heappush(heap, item)
        elif item[:2] > heap[0][:2]:
            heapq.heapreplace(heap, item)
    return {g: (seen.get(g, 0), [r for _, _, r in sorted(heap, key=lambda x: x[1])]) for g, heap in kept.items()}


def _negated(hex_key: str) -> str:
    """A key whose order is the reverse of ``hex_key``'s (heapq is a min-heap; bottom-k keeps the largest out)."""
    return hex_key.translate(_REVERSE_HEX)


_REVERSE_HEX = str.maketrans("0123456789abcdef", "fedcba9876543210")


def choose_profiles(records: Iterable[Any], tok: Tokenizer, format_name: str = "kimi-k2.5",
                    per_group: int = 512, counter: Callable[[dict], dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """One entry per (provider, dataset): ``provider``, ``dataset``, ``profile``, ``compared`` (records with a
    billed prompt count that rendered), ``prompt_matched`` and ``completion_matched`` (per candidate; the
    completion only on the ``completion_compared`` records whose counts differ between candidates),
    ``sglang_ids``, ``answers_with_tool_calls``, ``tool_relevant``, ``prompts_differ``, ``billed_records`` and
    ``sampled`` (the group's records with a billed prompt count, and how many of them are the evidence: every one,
    or a uniform sample of ``per_group``, :func:`sample_groups`).

    ``counter``: ``record -> {name: (prompt count, completion count, dropped_by_server) | None}`` (default: prompts only,
    :func:`prompt_only_counter`; kimi_eagle.reconstruct.prepass counts completions too). A format the
    profiles do not change (not a ``kimi-*`` format) gives every group ``template`` without counting."""
    applies = format_name.startswith("kimi-") or format_name == AUTO  # auto picks a Kimi format per record
    counter = counter or (prompt_only_counter(tok, format_name) if applies else None)
    out = []
    for (provider, dataset), (seen, sample) in sample_groups(records, per_group).items():
        g = _new_group()
        for record in sample if applies else []:
            counts = counter(record)
            if not all(c is None for c in counts.values()):
                _add_evidence(g, record, counts, billed_count(record, "prompt_tokens"))
        votes = g.pop("sglang_votes")
        choice = {"provider": provider, "dataset": dataset, "profile": _pick({**g, "sglang_votes": votes}),
                  **g, "sglang_ids": sum(votes), "answers_with_tool_calls": len(votes),
                  "billed_records": seen, "sampled": len(sample)}
        out.append({**choice, "no_evidence": no_evidence(choice, applies)})
    return out


def no_evidence(choice: dict[str, Any], applies: bool = True) -> str | None:
    """Why a group has no usable evidence (its profile is then ``template``), or None when it has some."""
    if not applies:
        return "the chat format is not one the profiles change"
    if not choice["compared"]:
        return "no billed prompt_tokens to compare"
    if not (choice["tool_relevant"] or choice["prompts_differ"] or choice["completion_compared"]):
        return "no tools or tool history, and every profile renders the prompts and completions alike"
    if not any(choice["prompt_matched"].values()):  # then the completion counts are not evidence either
        return f"no profile's prompt count equals a billed one (0/{choice['compared']}: another tokenizer or format?)"
    return None


def describe(choice: dict[str, Any]) -> str:
    """One line: ``provider P (dataset D): vllm-legacy profile, prompt counts matched 412/415`` (and the completion
    counts when they were compared)."""
    where = f"provider {choice['provider'] or '(none)'}" + (f" (dataset {choice['dataset']})" if choice["dataset"] else "")
    if choice.get("no_evidence"):
        return f"{where}: template profile ({choice['no_evidence']})"
    name = choice["profile"]
    line = f"{where}: {name} profile, prompt counts matched {choice['prompt_matched'][name]}/{choice['compared']}"
    if choice.get("completion_compared"):
        line += f", completion counts matched {choice['completion_matched'][name]}/{choice['completion_compared']}"
    if choice.get("answer_compared"):
        line += f", answers consistent {choice['answer_matched'][name]}/{choice['answer_compared']}"
    if choice.get("sampled", 0) < choice.get("billed_records", 0):
        line += f" (evidence: a uniform sample of {choice['sampled']:,} of {choice['billed_records']:,} billed records)"
    return line


# --------------------------------------------------------------------------------------------
# The provider table's entries met in a file


def table_entries(records: Any, table: str | os.PathLike | None, format_name: str, met: dict) -> Any:
    """``records`` without those the provider ``table`` renders (an explained entry whose template applies to
    ``format_name``), tallying every entry met into ``met`` (:func:`table_use`'s entries) on the way: one pass."""

    for record in records:
        response = record.get("response") if isinstance(record, dict) and table is not None else None
        provider = response.get("provider") if isinstance(response, dict) else None
        if not isinstance(provider, str):
            yield record
            continue
        entry = record_entry(record, table)
        key = (entry.provider, entry.model, entry.period, entry.deployment) if entry is not None else provider
        if key not in met:
            met[key] = _entry_use(entry, provider, format_name, template_format)
        met[key]["records"] += 1
        if not met[key]["applied"]:
            yield record


def _entry_use(entry: Any, provider: str, format_name: str, template_format: Any) -> dict[str, Any]:
    if entry is None:
        return {"provider": provider, "model": "", "period": "", "status": "none", "variant": None, "records": 0,
                "applied": False, "figures": {}, "residuals": {}}
    applies = (entry_applies(entry)
               and template_format(entry.variant.template, format_name_for(format_name, entry.model)) is not None)
    return {"provider": entry.provider, "model": entry.model, "period": scope(entry.period, entry.deployment),
            "status": entry.status,
            "variant": entry.variant.describe(), "records": 0, "applied": applies, "table_records": entry.records,
            "unexplained_sides": unexplained_sides(entry),
            "figures": {k: list(v) for k, v in entry.figures.items()}, "residuals": dict(entry.residuals)}


def entry_uses(met: dict) -> list[dict[str, Any]]:
    return sorted(met.values(), key=lambda u: (u["status"] != "unexplained", u["provider"], u["model"], u["period"]))
