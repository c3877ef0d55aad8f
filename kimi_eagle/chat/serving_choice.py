"""``--serving auto``: pick each provider's serving profile from the evidence the provider itself gives.

For every (provider, dataset) group, the prompts of up to ``per_group`` records are rendered under each
candidate profile (its preprocessing and tool declaration) and counted; the profile whose count equals
the billed ``usage.prompt_tokens`` on the most records wins (TypeScript and JSON tool declarations differ
by many tokens, re-serialised history arguments by a few). Ties (profiles that render a group's prompts
alike) go to the answers' conventions: ``sglang`` when every returned tool-call id is SGLang's
``functions.NAME:{history calls + position}`` and at least one is, else the first tied profile in
:data:`CANDIDATES` order. A group with no billed prompt count gets ``template`` (evidence: none).
"""
from __future__ import annotations

from typing import Any, Iterable

from kimi_eagle.chat.encoder import PieceEncoder
from kimi_eagle.chat.formats import get_format
from kimi_eagle.chat.messages import normalise_messages
from kimi_eagle.chat.serving import PROFILES, history_call_count, preprocess_request
from kimi_eagle.records import RecordError, count_field
from kimi_eagle.tokenize.tokenizer import Tokenizer

CANDIDATES = ("template", "moonshot", "vllm", "sglang")


def _billed_prompt(record: dict) -> int | None:
    response = record.get("response")
    usage = response.get("usage") if isinstance(response, dict) else None
    return count_field(usage.get("prompt_tokens")) if isinstance(usage, dict) else None


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
        try:
            messages = normalise_messages(request.get("messages"))
            messages, tools = preprocess_request(messages, request.get("tools"), PROFILES[name])
            out[name] = len(enc.encode(fmt.prompt_pieces(messages, tools)))
        except (RecordError, AttributeError, KeyError, TypeError, ValueError):
            out[name] = None
    return out


def _pick(evidence: dict[str, int], sglang_votes: list[bool]) -> str:
    best = max(evidence.values())
    tied = [name for name in CANDIDATES if evidence.get(name) == best]
    if "sglang" in tied and sglang_votes and all(sglang_votes):
        return "sglang"
    return tied[0]


def choose_profiles(records: Iterable[Any], tok: Tokenizer, format_name: str = "kimi-k2.5",
                    per_group: int = 64) -> list[dict[str, Any]]:
    """One entry per (provider, dataset): ``provider``, ``dataset``, ``profile``, ``compared`` (records
    with a billed prompt count that rendered), ``prompt_matched`` (per candidate) and ``sglang_ids``."""
    encoders = {name: (get_format(format_name, tok, PROFILES[name].tool_declaration), PieceEncoder(tok))
                for name in CANDIDATES}
    groups: dict[tuple, dict[str, Any]] = {}
    for record in records:
        if not isinstance(record, dict):
            continue
        g = groups.setdefault(_group(record), {"compared": 0, "prompt_matched": dict.fromkeys(CANDIDATES, 0),
                                               "sglang_votes": []})
        billed = _billed_prompt(record)
        if billed is None or g["compared"] >= per_group:
            continue
        counts = prompt_counts(record, encoders)
        if all(c is None for c in counts.values()):
            continue
        g["compared"] += 1
        for name, c in counts.items():
            g["prompt_matched"][name] += c == billed
        vote = _sglang_ids(record)
        if vote is not None:
            g["sglang_votes"].append(vote)
    out = []
    for (provider, dataset), g in groups.items():
        profile = _pick(g["prompt_matched"], g["sglang_votes"]) if g["compared"] else "template"
        out.append({"provider": provider, "dataset": dataset, "profile": profile, "compared": g["compared"],
                    "prompt_matched": g["prompt_matched"], "sglang_ids": sum(g["sglang_votes"]),
                    "answers_with_tool_calls": len(g["sglang_votes"])})
    return out


def describe(choice: dict[str, Any]) -> str:
    """One line: ``provider P (dataset D): vllm profile, prompt counts matched 412/415``."""
    where = f"provider {choice['provider'] or '(none)'}" + (f" (dataset {choice['dataset']})" if choice["dataset"] else "")
    if not choice["compared"]:
        return f"{where}: template profile (no billed prompt_tokens to compare)"
    matched = choice["prompt_matched"][choice["profile"]]
    return f"{where}: {choice['profile']} profile, prompt counts matched {matched}/{choice['compared']}"
