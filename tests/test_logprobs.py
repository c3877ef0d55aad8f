"""Exact completion IDs from ``logprobs.content`` (bytes / token text / specials), checked against the rendered
completion; ``reasoning_details`` read and cross-checked; usage details carried into the rows and the parquet."""
import httpx
import pytest

from kimi_eagle.apps.api.server import LocalServer
from kimi_eagle.assets import stories_dir
from kimi_eagle.chat.formats import get_format
from kimi_eagle.io import read_jsonl
from kimi_eagle.reconstruct.job import read_rows, write_rows
from kimi_eagle.reconstruct.logprobs import LogprobError, logprob_ids, prefer_logprob_ids
from kimi_eagle.reconstruct.record import reconstruct_line, reconstruct_record

pytestmark = pytest.mark.timeout(180)


def entries(tok, ids, with_bytes=True):
    """Logprob entries as serve (and OpenAI) write them for ``ids``."""
    out = []
    for i in ids:
        special = tok.special_text_by_id.get(i)
        raw = special.encode() if special else tok.token_bytes(i)
        e = {"token": special or raw.decode("utf-8", "replace"), "logprob": -0.5, "top_logprobs": []}
        if with_bytes:
            e["bytes"] = list(raw)
        out.append(e)
    return out


def record(content, finish="length", logprobs=None, message_extra=None, usage=None):
    message = {"role": "assistant", "content": content, **(message_extra or {})}
    choice = {"index": 0, "message": message, "finish_reason": finish,
              "logprobs": None if logprobs is None else {"content": logprobs, "refusal": None}}
    response = {"id": "gen-1", "choices": [choice], "usage": usage or {"completion_tokens": 3}}
    return {"id": "r1", "request": {"messages": [{"role": "user", "content": "Once"}]}, "response": response}


def split_ids(tok, text):
    """``text``'s IDs with one multi-byte token replaced by two tokens spelling the same bytes."""
    ids = tok.encode(text, continuation=True)
    table = tok.id_by_bytes
    for k, i in enumerate(ids):
        raw = tok.token_bytes(i)
        for cut in range(1, len(raw)):
            if raw[:cut] in table and raw[cut:] in table:
                return ids[:k] + [table[raw[:cut]], table[raw[cut:]]] + ids[k + 1:]
    raise AssertionError("no splittable token")


def test_logprobs_give_the_sampled_segmentation_the_text_cannot(stories):
    fmt = get_format("plain", stories)
    text = " there was a little girl"
    sampled = split_ids(stories, text)
    assert sampled != stories.encode(text, continuation=True)
    text_row = reconstruct_record(record(text), stories, fmt)
    row = reconstruct_record(record(text, logprobs=entries(stories, sampled)), stories, fmt)
    assert text_row.ids_source == "text" and text_row.completion_ids != sampled
    assert row.ids_source == "logprobs" and row.completion_ids == sampled and row.flags == ["truncated"]
    assert row.segments == [{"kind": "content", "byte_start": 0, "byte_end": len(text), "tok_start": 0,
                             "tok_end": len(sampled)}]
    no_bytes = reconstruct_record(record(text, logprobs=entries(stories, sampled, with_bytes=False)), stories, fmt)
    assert no_bytes.ids_source == "logprobs" and no_bytes.completion_ids == sampled


def test_the_stop_token_left_out_of_the_entries_comes_from_the_rendering(stories):
    fmt = get_format("plain", stories)
    sampled = split_ids(stories, " the end.")
    row = reconstruct_record(record(" the end.", "stop", entries(stories, sampled)), stories, fmt)
    assert row.ids_source == "logprobs" and row.completion_ids == sampled + [2]
    assert row.segments[-1]["kind"] == "im_end" and row.segments[-1]["tok_start"] == len(sampled)
    both = reconstruct_record(record(" the end.", "stop", entries(stories, sampled + [2])), stories, fmt)
    assert both.completion_ids == sampled + [2]


def test_a_special_token_inside_the_answer_is_found_by_its_text(stories):
    ids = stories.encode(" a", continuation=True) + [1] + stories.encode(" b", continuation=True)
    lp = entries(stories, ids)
    assert lp[len(ids) - 2]["token"] == "<s>"
    row = reconstruct_record(record(" a<s> b", logprobs=lp), stories, get_format("plain", stories))
    assert row.ids_source == "logprobs" and row.completion_ids == ids  # text alone spells <s> as ordinary tokens


def test_kimi_specials_by_text(kimi):
    ids = kimi.encode("Hi") + [kimi.special_id_by_text["</think>"], kimi.special_id_by_text["<|im_end|>"]]
    assert logprob_ids(entries(kimi, ids), kimi) == ids
    assert logprob_ids(entries(kimi, ids, with_bytes=False), kimi) == ids


@pytest.mark.parametrize("bad, reason", [
    ({"token": "x", "bytes": [1.0]}, "integers"), ({"token": "x", "bytes": [300]}, "integers"),
    ({"token": "x", "bytes": [True]}, "integers"), ({"logprob": -1}, "neither"), ("x", "not an object"),
    ({"token": "zzzzqqqq"}, "not a token"),
])
def test_unusable_entries_are_named(stories, bad, reason):
    with pytest.raises(LogprobError, match=reason):
        logprob_ids([bad], stories)


def test_disagreeing_or_unreadable_logprobs_fall_back_to_the_text_with_a_flag(stories):
    fmt = get_format("plain", stories)
    other = entries(stories, stories.encode(" a dog", continuation=True))
    row = reconstruct_record(record(" a cat", logprobs=other), stories, fmt)
    assert row.ids_source == "text" and "logprobs_mismatch" in row.flags
    assert row.completion_ids == stories.encode(" a cat", continuation=True)
    bad = reconstruct_record(record(" a cat", logprobs=[{"token": "x", "bytes": [0.5]}]), stories, fmt)
    assert bad.ids_source == "text" and "logprobs_unreadable" in bad.flags
    ids, spans, source, flags = prefer_logprob_ids({"choices": [{"logprobs": None}]}, stories, [5], [])
    assert (ids, source, flags) == ([5], "text", [])


def test_reasoning_details_text_blocks_are_read_and_cross_checked(stories):
    fmt = get_format("plain", stories)
    blocks = [{"type": "reasoning.text", "text": "Think "}, {"type": "reasoning.text", "text": "twice."}]
    same = reconstruct_record(record(" a", message_extra={"reasoning": "Think twice.", "reasoning_details": blocks}),
                              stories, fmt)
    assert "reasoning_details_mismatch" not in same.flags and "reasoning_dropped" in same.flags
    differ = reconstruct_record(record(" a", message_extra={"reasoning": "Other.", "reasoning_details": blocks}),
                                stories, fmt)
    assert "reasoning_details_mismatch" in differ.flags


@pytest.mark.parametrize("blocks, name", [
    ([{"type": "reasoning.encrypted", "data": "gAAAA"}], "reasoning is encrypted"),
    ([{"type": "reasoning.text", "text": "a"}, {"type": "reasoning.encrypted", "data": "x"}], "reasoning is partly encrypted"),
    ([{"type": "reasoning.summary", "summary": "I thought."}], "reasoning is summary-only"),
])
def test_encrypted_or_summary_only_reasoning_is_an_error_by_name(stories, blocks, name):
    import json

    rec = record(" a", message_extra={"reasoning": "I thought.", "reasoning_details": blocks})
    (row,) = reconstruct_line(json.dumps(rec).encode(), 1, stories, get_format("plain", stories), None)
    assert row["status"] == "error" and row["error"].startswith(name)
    assert "reasoning tokens are not in the answer" in row["error"]


def test_usage_details_become_columns_and_the_parquet_has_them(stories, tmp_path):
    usage = {"completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 2}, "cost": 0.00125,
             "completion_tokens_details": {"reasoning_tokens": 0}}
    row = reconstruct_record(record(" a b", usage=usage), stories, get_format("plain", stories))
    assert (row.billed_cached_tokens, row.cost, row.billed_reasoning_tokens) == (2, 0.00125, 0)
    bad = reconstruct_record(record(" a b", usage={"completion_tokens": 3, "cost": True,
                                                   "prompt_tokens_details": {"cached_tokens": 1.0}}),
                             stories, get_format("plain", stories))
    assert bad.cost is None and bad.billed_cached_tokens is None
    write_rows([{**row.to_dict(), "line": 1}], tmp_path / "r.parquet")
    table = read_rows(tmp_path / "r.parquet")
    got = table.to_pylist()[0] if hasattr(table, "to_pylist") else table.iloc[0].to_dict()
    assert (got["ids_source"], got["billed_cached_tokens"], got["cost"]) == ("text", 2, 0.00125)


def test_served_logprobs_reconstruct_the_engine_ids_exactly(stories, tmp_path):
    """End to end: serve --logprobs at temperature 1 -> reconstruct -> the engine's own IDs, every record."""
    fmt = get_format("plain", stories)
    with LocalServer(stories_dir(), tmp_path / "engine.jsonl", "--logprobs") as srv:
        answers = {}
        for k in range(8):
            body = {"model": "stories260K", "messages": [{"role": "user", "content": "Once upon a time"}],
                    "temperature": 1.0, "seed": 100 + k, "max_tokens": 80, "logprobs": True, "top_logprobs": 2}
            answers[f"r{k}"] = httpx.post(srv.base_url + "/chat/completions", json=body, timeout=60,
                                          headers={"X-Record-Id": f"r{k}"}).json()
    engine = {line.obj["id"]: line.obj for line in read_jsonl(tmp_path / "engine.jsonl")}
    for rid, answer in answers.items():
        rec = {"id": rid, "request": {"messages": [{"role": "user", "content": "Once upon a time"}]}, "response": answer}
        row = reconstruct_record(rec, stories, fmt)
        assert row.ids_source == "logprobs" and row.completion_ids == engine[rid]["output_ids"], rid
        assert all(len(e["top_logprobs"]) == 2 and e["top_logprobs"][0]["logprob"] >= e["logprob"] - 1e-6
                   for e in answer["choices"][0]["logprobs"]["content"])


@pytest.fixture(scope="module")
def tiny_kimi_engine(tmp_path_factory):
    from kimi_eagle.apps.tiny_kimi import TinyKimiSpec, build_tiny_kimi
    from kimi_eagle.engine.local import Engine

    spec = TinyKimiSpec(steps=1, seed=0, sharegpt_conversations=2, hidden_size=32, intermediate_size=64, num_layers=1,
                        num_heads=2, seq_len=64, batch_size=2, max_positions=1024)
    out = tmp_path_factory.mktemp("tiny_kimi_lp") / "model"
    build_tiny_kimi(out, spec)
    return Engine.from_dir(out)


@pytest.mark.parametrize("split", [False, True])
def test_a_served_k25_answer_with_reasoning_and_a_tool_call_gives_its_ids_back(kimi, tiny_kimi_engine, tmp_path, split):
    """serve's logprobs of a K2.5 answer (reasoning, </think>, a tool call, <|im_end|>) reconstruct its IDs exactly,
    also when the model sampled a segmentation that encoding the text would not give."""
    from helpers import build, turn

    from kimi_eagle.apps.api.server import App
    from kimi_eagle.engine.local import Generation, SamplingParams

    ids, _ = build(kimi, turn(reasoning="Let me check the weather in Paris first."))
    if split:
        k = next(i for i, t in enumerate(ids) if len(kimi.token_bytes(t)) > 3 and t not in kimi.special_ids)
        raw = kimi.token_bytes(ids[k])
        cut = next(c for c in range(1, len(raw)) if raw[:c] in kimi.id_by_bytes and raw[c:] in kimi.id_by_bytes)
        ids = ids[:k] + [kimi.id_by_bytes[raw[:cut]], kimi.id_by_bytes[raw[cut:]]] + ids[k + 1:]
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    gen = Generation(tiny_kimi_engine.prompt_ids(messages), ids, "stop", SamplingParams(1.0, 1.0, 0, None),
                     logprobs=[(-0.1, [])] * len(ids))
    response = App(tiny_kimi_engine, tmp_path / "log.jsonl", logprobs=True)._response(gen, True, "p", tiny_kimi_engine,
                                                                                      [], 0)
    assert response["choices"][0]["finish_reason"] == "tool_calls"
    assert len(response["choices"][0]["logprobs"]["content"]) == len(ids) - 1  # <|im_end|> left out
    row = reconstruct_record({"id": "k", "request": {"messages": messages}, "response": response}, kimi,
                             get_format("kimi-k2.5"))
    assert row.status == "ok" and row.ids_source == "logprobs" and row.completion_ids == ids
    text = reconstruct_record({"id": "k", "request": {"messages": messages},
                               "response": {**response, "choices": [{**response["choices"][0], "logprobs": None}]}},
                              kimi, get_format("kimi-k2.5"))
    assert (text.completion_ids == ids) is (not split)
    assert [s["kind"] for s in row.segments] == [s["kind"] for s in text.segments]
