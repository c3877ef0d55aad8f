"""Each server-version profile answers exactly as its server did: the recorded vectors are the reference.

``tests/data/servers/<server>.answers.jsonl.gz`` holds what the real server (``make server-vectors``: vLLM
0.33.0's render server, SGLang 0.5.23's serving chat) returned for a seeded corpus of raw K2.5 completions,
non-streaming and streaming, with each detokenizer setting. For every vector, ``parse_completion`` with the
variant's profile must return the same reasoning, content, tool calls and finish reason. Exceptions are
named here with their reason (docs/reconstruct.md lists them):

- **random ids**: a call whose header has no ``:N`` gets ``chatcmpl-tool-<random>`` from vLLM; only the
  prefix is compared;
- **stream chunking**: a streamed answer depends on how the engine cut the output into chunks, which an API
  answer does not record; the cases below differ from the kit (which assumes token-per-token release) only
  in whitespace at a chunk edge (vLLM), or in what SGLang's streamed kimi_k2 detector had in its buffer when
  an unreadable call made it drop the buffer (SGLang). Replayed with the recorder's own chunks, every SGLang
  streamed answer is the server's (test below).
"""
from __future__ import annotations

import gzip
import json
import random
import re
from functools import lru_cache
from pathlib import Path

import pytest

from kimi_eagle.chat.parse import ParseOptions
from kimi_eagle.serving.answer import parse_completion
from kimi_eagle.serving.profiles import PROFILE_DIR, PROFILES, get_profile
from kimi_eagle.serving.request import history_call_count
from kimi_eagle.serving.sglang_answer import SglangOptions, sglang_answer
from kimi_eagle.serving.vllm_answer import RANDOM_ID

SERVERS = Path(__file__).parent / "data" / "servers"

# variant of the vectors -> the suffix of the profile that imitates it (every vLLM version: 0.33, 0.34, ...)
VLLM_VARIANTS = {"space": "", "nospace": "-nospace", "stream-space": "-stream", "stream-nospace": "-nospace-stream"}

# SGLang 0.5.23: default and nospace are the same answers (its slow-tokenizer decode ignores
# spaces_between_special_tokens); the stream variants are its streaming path
SGLANG_VARIANTS = {"default": "sglang-0.5", "stream-default": "sglang-0.5-stream", "nospace": "sglang-0.5",
                   "stream-nospace": "sglang-0.5-stream"}

STREAM_EDGE = ("the detokenizer's space after a marker is lost when the marker and the text after it arrive in one "
               "chunk: depends on the engine's chunking, which an answer does not record")
CUT_SPELLING = ("a length cut inside a marker spelling written as text ('<thin'): the stream's lexer holds the "
                "partial spelling back and drops the space before it")
SGLANG_DROPPED_BUFFER = "SGLang's streamed detector dropped its buffer on an error: what it held depends on the chunks"
SGLANG_OPENER_IN_REASONING = ("a section opener before </think> ends SGLang's streamed reasoning only when </think> is "
                              "not in the same chunk")
MIN_SGLANG_ANSWERS = 2000  # status-200 answers per SGLang variant
# (vectors file, or "vllm" for every vLLM version's, variant) -> {case: reason}
EXCEPTIONS: dict[tuple[str, str], dict[str, str]] = {
    ("vllm", "stream-space"): {"a00062": STREAM_EDGE, "a00076": STREAM_EDGE, "a00106": STREAM_EDGE, "a00201": STREAM_EDGE, "a00209": CUT_SPELLING, "a00235": STREAM_EDGE, "a00405": STREAM_EDGE, "a00439": STREAM_EDGE, "a00881": STREAM_EDGE, "a00895": STREAM_EDGE, "a01075": STREAM_EDGE, "a01095": STREAM_EDGE, "a01223": STREAM_EDGE, "a01314": STREAM_EDGE, "a01531": STREAM_EDGE, "a01589": STREAM_EDGE, "a01618": STREAM_EDGE, "a01768": STREAM_EDGE, "a01789": CUT_SPELLING, "a01844": STREAM_EDGE, "a01991": STREAM_EDGE, "a02099": STREAM_EDGE, "a02152": STREAM_EDGE, "a02222": STREAM_EDGE, "a02266": STREAM_EDGE, "a02421": STREAM_EDGE, "a02444": STREAM_EDGE, "a02459": STREAM_EDGE, "a02585": CUT_SPELLING, "a02755": STREAM_EDGE, "a02804": CUT_SPELLING, "a02827": CUT_SPELLING, "a02843": STREAM_EDGE, "a02910": STREAM_EDGE, "a02967": STREAM_EDGE},
    ("vllm", "stream-nospace"): {"a00209": CUT_SPELLING, "a01789": CUT_SPELLING, "a02585": CUT_SPELLING, "a02827": CUT_SPELLING},
    **{("sglang-0.5.answers.jsonl.gz", variant): {
        # a bare-counter call ("2", "1") whose arguments are JSON but not an object (7, [1, 2]): inferring its
        # tool raises in SGLang's streamed detector, which then drops its whole buffer; what the buffer held at
        # that moment (with the recorded chunks, the start of the next call's header, whose rest then comes
        # back as content) depends on where the chunks ended
        "a01882": SGLANG_DROPPED_BUFFER, "a02006": SGLANG_DROPPED_BUFFER, "a02964": SGLANG_DROPPED_BUFFER,
        # <|tool_calls_section_begin|> in the reasoning, then </think>: streamed, the reasoning ends at the
        # opener unless the </think> after it came in the same chunk (the recorded one did)
        "a02495": SGLANG_OPENER_IN_REASONING,
    } for variant in ("stream-default", "stream-nospace")},
}


@lru_cache(maxsize=4)
def load_vectors(name: str) -> tuple[dict, list[dict]]:
    with gzip.open(SERVERS / name, "rt", encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    return lines[0]["meta"], lines[1:]


def _calls(calls: list[dict]) -> list[dict]:
    return [{"id": RANDOM_ID if (c["id"] or "").startswith(RANDOM_ID) else c["id"], "name": c["name"],
             "arguments": c["arguments"]} for c in calls]


def kit_answer(vector: dict, profile: str, tok) -> dict:
    request = vector["request"]
    parsed = parse_completion(vector["completion_ids"], tok, ParseOptions(
        serving=profile, finish_reason=vector["finish_reason"], tools=request.get("tools") or (),
        history_tool_calls=history_call_count(request["messages"])))
    calls = [{"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
             for c in parsed.tool_calls]
    return {"reasoning": parsed.reasoning, "content": parsed.content, "tool_calls": _calls(calls),
            "finish_reason": parsed.finish_reason}


def server_answer(vector: dict, variant: str) -> dict:
    got = vector["answers"][variant]
    msg = got["message"]
    return {"reasoning": msg["reasoning"], "content": msg["content"], "tool_calls": _calls(msg["tool_calls"]),
            "finish_reason": got["finish_reason"]}


def differing(name: str, variant: str, profile: str, tok) -> dict[str, list[str]]:
    """``{case: [fields that differ]}`` over every vector of ``variant`` the server answered."""
    _, vectors = load_vectors(name)
    out = {}
    for v in vectors:
        if v["answers"].get(variant, {}).get("status") != 200:
            continue
        kit, server = kit_answer(v, profile, tok), server_answer(v, variant)
        fields = [k for k in kit if kit[k] != server[k]]
        if fields:
            out[v["case"]] = fields
    return out


def vllm_versions() -> list[str]:
    """The vLLM versions with a profile file (``kimi_eagle/serving/profiles/vllm-X.Y.toml``): each must come with its
    recorded answers (``tests/data/servers/vllm-X.Y.answers.jsonl.gz``)."""
    return sorted(p.stem for p in PROFILE_DIR.glob("vllm-*.toml") if re.fullmatch(r"vllm-\d+\.\d+", p.stem))


def vllm_variants(version: str) -> dict[str, str]:
    """Variant of the vectors -> the profile of ``version`` that imitates it."""
    return {variant: version + suffix for variant, suffix in VLLM_VARIANTS.items()}


@pytest.mark.parametrize("version", vllm_versions())
def test_the_vllm_vectors_are_real_and_large_enough(version):
    meta, vectors = load_vectors(f"{version}.answers.jsonl.gz")
    assert meta["server"] == "vllm" and meta["version"].startswith(version.removeprefix("vllm-") + ".")
    assert len(vectors) >= 2000
    for variant in VLLM_VARIANTS:
        assert sum(v["answers"][variant]["status"] == 200 for v in vectors) >= 2000


@pytest.mark.parametrize("version, variant", [(v, x) for v in vllm_versions() for x in VLLM_VARIANTS])
def test_each_vllm_profile_answers_as_its_vllm_version(version, variant, kimi):
    profile = vllm_variants(version)[variant]
    assert get_profile(profile).streaming == variant.startswith("stream")
    got = differing(f"{version}.answers.jsonl.gz", variant, profile, kimi)
    allowed = EXCEPTIONS.get(("vllm", variant), {})
    unexplained = {case: fields for case, fields in got.items() if case not in allowed}
    assert unexplained == {}, f"{len(unexplained)} answers differ from {version} ({variant})"
    assert set(allowed) <= set(got), "an exception no longer needed: remove it"


def test_the_sglang_vectors_are_real_and_large_enough():
    meta, vectors = load_vectors("sglang-0.5.answers.jsonl.gz")
    assert meta["server"] == "sglang" and meta["version"] == "0.5.23"
    assert len(vectors) >= 2000
    for variant in SGLANG_VARIANTS:
        assert sum(v["answers"].get(variant, {}).get("status") == 200 for v in vectors) >= MIN_SGLANG_ANSWERS


@pytest.mark.parametrize("variant", list(SGLANG_VARIANTS))
def test_each_sglang_profile_answers_as_sglang_0_5(variant, kimi):
    profile = SGLANG_VARIANTS[variant]
    assert get_profile(profile).streaming == variant.startswith("stream")
    got = differing("sglang-0.5.answers.jsonl.gz", variant, profile, kimi)
    allowed = EXCEPTIONS.get(("sglang-0.5.answers.jsonl.gz", variant), {})
    unexplained = {case: fields for case, fields in got.items() if case not in allowed}
    assert unexplained == {}, f"{len(unexplained)} answers differ from SGLang 0.5 ({variant})"
    assert set(allowed) <= set(got), "an exception no longer needed: remove it"


def recorded_chunk_ends(vector: dict) -> tuple[int, ...]:
    """Where the recorder cut a streamed answer into scheduler outputs (collect_sglang.chunk_ends)."""
    n, rng, ends, pos = len(vector["completion_ids"]), random.Random(vector["case"]), [], 0
    while pos < n:
        pos = min(pos + rng.randint(1, 4), n)
        ends.append(pos)
    return tuple(ends)


@pytest.mark.parametrize("variant", ["stream-default", "stream-nospace"])
def test_sglang_streams_replayed_with_the_recorded_chunks_are_the_servers(variant, kimi):
    """The stream exceptions above are chunking only: with the recorder's chunks every streamed answer is equal."""
    _, vectors = load_vectors("sglang-0.5.answers.jsonl.gz")
    differ = []
    for v in vectors:
        if v["answers"].get(variant, {}).get("status") != 200:
            continue
        answer = sglang_answer(v["completion_ids"], kimi, SglangOptions(
            streaming=True, finish_reason=v["finish_reason"], tools=tuple(v["request"].get("tools") or ()),
            history_tool_calls=history_call_count(v["request"]["messages"]), chunk_ends=recorded_chunk_ends(v)))
        calls = [{"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                 for c in answer.tool_calls]
        kit = {"reasoning": answer.reasoning, "content": answer.content, "tool_calls": calls,
               "finish_reason": answer.finish_reason}
        if kit != server_answer(v, variant):
            differ.append(v["case"])
    assert differ == []


@pytest.mark.parametrize("profile", [n for n, p in PROFILES.items() if p.answer_rules != "legacy"])
def test_a_server_profile_reads_another_tokenizers_ids_without_kimis_constants(profile, stories):
    """A non-Kimi tokenizer (stories260K: 512 IDs) has no <think> to seed the decode with: no IndexError."""
    ids = stories.encode("Let me think.</think>Paris is sunny today.", allow_special=True)
    parsed = parse_completion(ids, stories, ParseOptions(serving=profile))
    assert parsed.n_tokens == len(ids)


@pytest.mark.parametrize("profile, arguments", [("vllm-0.34", '{"cmd": "a  b"}'), ("vllm-0.34-nospace", '{"cmd": "ab"}')])
def test_vllm_deletes_a_think_end_written_inside_a_calls_arguments(profile, arguments, kimi):
    """vLLM 0.34.0 asked by hand (``/v1/chat/completions/derender`` of this completion, spaces on and off; the seeded
    corpus has no such case): ``</think>`` inside a call's arguments is deleted, the detokenizer's spaces stay."""
    text = ('Hmm.</think><|tool_calls_section_begin|><|tool_call_begin|>functions.run:0<|tool_call_argument_begin|>'
            '{"cmd": "a</think>b"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>')
    ids = kimi.encode(text, allow_special=True)
    tools = ({"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}},)
    parsed = parse_completion(ids, kimi, ParseOptions(serving=profile, tools=tools))
    assert [c["function"]["arguments"] for c in parsed.tool_calls] == [arguments]
