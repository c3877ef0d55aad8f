"""Engine IDs -> the real server's answer -> reconstruction: the engine's IDs come back, or the row says why.

For every recorded server answer (``tests/data/servers``), the answer is reconstructed with the profile of
its server version, as a record billed ``completion_tokens = len(engine IDs)``. Each row is then one of:

- **equal**: the engine's IDs exactly;
- **count differs**: fewer or more IDs than billed (the billing check names it: ``kimi-eagle billing``);
- **flagged**: same count, other IDs, and a flag naming what the server lost (``reasoning_end_unknown``,
  ``arguments_whitespace_unknown``, ``tool_id_unknown``, ...: chat/unserve.py);
- **refused**: the answer cannot be reconstructed and the row says why (an empty message: nothing to rebuild);
- **silent**: same count, other IDs, no flag. There must be none.

The seeded corpus is adversarial on purpose (unreadable ids, padded arguments, marker text, cuts at every
boundary), so "equal" is low on it; on well-formed completions it is the rule (test below).
"""
from __future__ import annotations

import collections
import re
from pathlib import Path

import pytest
from test_server_answers import (
    MIN_SGLANG_ANSWERS,
    SGLANG_VARIANTS,
    VLLM_VARIANTS,
    load_vectors,
    vllm_variants,
    vllm_versions,
)

from kimi_eagle.chat.formats import get_format
from kimi_eagle.reconstruct.record import reconstruct_record, serving_options
from kimi_eagle.records import RecordError
from kimi_eagle.serving.profiles import get_profile

LOSS_FLAGS = {"reasoning_end_unknown", "before_tools_unknown", "arguments_whitespace_unknown",
              "empty_arguments_ambiguous", "tool_id_unknown", "content_end_unknown", "literal_marker",
              "dropped_by_server", "truncation_ambiguous", "tool_id_renumbered", "invalid_utf8", "answer_empty"}


def api_record(vector: dict, variant: str) -> dict:
    """The vector's server answer as the API record a collector would have logged."""
    answer = vector["answers"][variant]
    m = answer["message"]
    message = {"role": "assistant", "content": m["content"], "reasoning": m["reasoning"]}
    if m["tool_calls"]:
        message["tool_calls"] = [{"id": c["id"], "type": "function",
                                  "function": {"name": c["name"], "arguments": c["arguments"]}} for c in m["tool_calls"]]
    return {"id": vector["case"], "request": vector["request"],
            "response": {"choices": [{"index": 0, "message": message, "finish_reason": answer["finish_reason"]}],
                         "usage": {"completion_tokens": len(vector["completion_ids"])}}}


def outcome(row, engine_ids: list[int]) -> str:
    ids = list(row.completion_ids)
    if ids == engine_ids:
        return "equal"
    if len(ids) != len(engine_ids):
        return "count differs"
    return "flagged" if LOSS_FLAGS & set(row.flags) else "silent"


def roundtrip(name: str, variant: str, profile_name: str, tok, keep=lambda vector: True) -> collections.Counter:
    """Outcome counts of the ``variant`` answers of ``name`` that ``keep`` accepts, reconstructed with the profile."""
    profile = get_profile(profile_name)
    fmt = get_format("kimi-k2.5", tok, tool_declaration=profile.tool_declaration)
    _, vectors = load_vectors(name)
    out: collections.Counter = collections.Counter()
    for v in vectors:
        if v["answers"].get(variant, {}).get("status") != 200 or not keep(v):
            continue
        try:
            row = reconstruct_record(api_record(v, variant), tok, fmt, serving_options(profile))
        except RecordError as e:
            out["refused: " + str(e)] += 1
            continue
        out[outcome(row, v["completion_ids"])] += 1
    return out


@pytest.mark.parametrize("version, variant", [(v, x) for v in vllm_versions() for x in VLLM_VARIANTS])
def test_vllm_answers_reconstruct_to_the_engine_ids_or_say_why(version, variant, kimi):
    got = roundtrip(f"{version}.answers.jsonl.gz", variant, vllm_variants(version)[variant], kimi)
    assert got["silent"] == 0, got
    assert sum(got.values()) >= 2000
    assert not any(k.startswith("refused") for k in got), got  # an empty answer is rebuilt, flagged answer_empty


@pytest.mark.parametrize("variant", list(SGLANG_VARIANTS))
def test_sglang_answers_reconstruct_to_the_engine_ids_or_say_why(variant, kimi):
    got = roundtrip("sglang-0.5.answers.jsonl.gz", variant, SGLANG_VARIANTS[variant], kimi)
    assert got["silent"] == 0, got
    assert sum(got.values()) >= MIN_SGLANG_ANSWERS
    # SGLang's empty turn (only </think>, or a tool section it dropped: no reasoning, "" content, no call) is rebuilt
    assert not any(k.startswith("refused") for k in got), got  # an empty answer is rebuilt, flagged answer_empty


def well_formed(vector: dict, tok) -> bool:
    """An output as K2.5 writes it in practice: ``functions.NAME:N`` ids, JSON-object arguments, no marker text, no
    whitespace at the edges of reasoning, content or arguments, finished by ``<|im_end|>``."""
    from kimi_eagle.serving.answer import parse_completion

    if vector["finish_reason"] != "stop":
        return False
    parsed = parse_completion(vector["completion_ids"], tok)
    texts = [parsed.reasoning or "", parsed.content or ""] + [c["function"]["arguments"] for c in parsed.tool_calls]
    return (not parsed.flags and parsed.reasoning is not None and all(t == t.strip() for t in texts)
            and all(WELL_FORMED_ID.fullmatch(c["id"]) and c["function"]["arguments"].startswith("{")
                    for c in parsed.tool_calls))


WELL_FORMED_ID = re.compile(r"functions\.[\w.\-]+:\d+")


def well_formed_roundtrip(name: str, variant: str, profile_name: str, tok) -> collections.Counter:
    return roundtrip(name, variant, profile_name, tok, keep=lambda vector: well_formed(vector, tok))


@pytest.mark.parametrize("name,variant,profile", [(f"{version}.answers.jsonl.gz", v, p) for version in vllm_versions()
                                                for v, p in vllm_variants(version).items()]
                         + [("sglang-0.5.answers.jsonl.gz", v, p) for v, p in SGLANG_VARIANTS.items()])
def test_well_formed_outputs_come_back_exactly(name, variant, profile, kimi):
    got = well_formed_roundtrip(name, variant, profile, kimi)
    assert sum(got.values()) >= 100 and got["silent"] == 0
    assert got["equal"] / sum(got.values()) >= 0.9, got


def test_the_docs_table_is_what_the_vectors_give(kimi):
    """docs/servers.md's numbers, recomputed for one variant of each server (tools/server_vectors/report.py)."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "tools" / "server_vectors"))
    from report import SERVERS, check_prompts, row

    docs = (root / "docs" / "servers.md").read_text()
    for server, variant, profile in (("vllm-0.33", "space", "vllm-0.33"), ("sglang-0.5", "default", "sglang-0.5")):
        prompts = {server: check_prompts(SERVERS / f"{server}.prompts.jsonl.gz", server, {}, kimi)}
        assert row(kimi, server, variant, profile, prompts) in docs.splitlines()


def test_the_docs_say_how_far_the_legacy_transcriptions_are_from_the_servers(kimi):
    from test_server_answers import differing

    docs = " ".join((Path(__file__).resolve().parents[1] / "docs" / "servers.md").read_text().split())
    for name, variant, profile in (("vllm-0.33.answers.jsonl.gz", "space", "vllm-legacy"),
                                   ("vllm-0.33.answers.jsonl.gz", "nospace", "vllm-legacy"),
                                   ("sglang-0.5.answers.jsonl.gz", "default", "sglang-legacy")):
        _, vectors = load_vectors(name)
        answered = sum(v["answers"].get(variant, {}).get("status") == 200 for v in vectors)
        equal = answered - len(differing(name, variant, profile, kimi))
        assert f"{equal:,} of {answered:,}" in docs, (profile, variant, equal, answered)
