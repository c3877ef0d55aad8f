"""``kimi-eagle convert``: real datasets -> one API record per assistant turn, nothing lost."""
import json
import subprocess
import sys

import pytest

from kimi_eagle.assets import kimi_dir
from kimi_eagle.chat.formats import get_format
from kimi_eagle.reconstruct.convert import convert, convert_file
from kimi_eagle.reconstruct.job import JobOptions, read_rows, reconstruct_file
from kimi_eagle.reconstruct.record import reconstruct_record


def by_id(records):
    return {r["id"]: r for r in records}


def test_glaive_function_calls_and_observations():
    records = list(convert("glaive"))
    assert len(records) == 957 and len({r["id"] for r in records}) == 957
    rec = by_id(records)["glaive:0:3"]  # human, gpt, human, function_call
    msg = rec["response"]["choices"][0]["message"]
    assert rec["response"]["choices"][0]["finish_reason"] == "tool_calls" and msg["content"] is None
    call = msg["tool_calls"][0]
    assert call["id"] == "functions.search_recipes:0" and call["function"]["name"] == "search_recipes"
    assert json.loads(call["function"]["arguments"]) == {"ingredients": ["chicken", "bell peppers", "rice"]}
    assert rec["request"]["tools"][0]["type"] == "function"
    assert rec["request"]["tools"][0]["function"]["name"] == "search_recipes"
    after = by_id(records)["glaive:0:5"]  # the answer after the observation
    tool_msg = after["request"]["messages"][-1]
    assert tool_msg["role"] == "tool" and tool_msg["tool_call_id"] == "functions.search_recipes:0"
    assert after["request"]["messages"][-2]["tool_calls"][0]["id"] == "functions.search_recipes:0"
    assert [m["role"] for m in after["request"]["messages"]] == ["user", "assistant", "user", "assistant", "tool"]


def test_reason_tool_use_reasoning_calls_and_split_results():
    records = list(convert("reason-tool-use"))
    assert len(records) == 112
    multi = [r for r in records if len(r["response"]["choices"][0]["message"].get("tool_calls") or []) > 1]
    assert multi and all(r["response"]["choices"][0]["message"]["reasoning"] for r in records)
    # an assistant turn after a two-call turn sees one tool message per call, ids in order
    follow = next(r for r in records if any(len(m.get("tool_calls") or []) == 2 for m in r["request"]["messages"]))
    msgs = follow["request"]["messages"]
    k = next(i for i, m in enumerate(msgs) if len(m.get("tool_calls") or []) == 2)
    ids = [c["id"] for c in msgs[k]["tool_calls"]]
    assert [m["tool_call_id"] for m in msgs[k + 1:k + 3]] == ids and all(m["role"] == "tool" for m in msgs[k + 1:k + 3])
    assert msgs[k]["reasoning_content"]  # history keeps the reasoning the template may render


def test_sharegpt_one_record_per_gpt_turn():
    records = list(convert("sharegpt"))
    assert len(records) == 7541
    first = by_id(records)["sharegpt:QWJhYvA_0:1"]
    assert [m["role"] for m in first["request"]["messages"]] == ["user"]
    assert any(r["request"]["messages"] == [] for r in records)  # conversations that open with the assistant


def test_openai_source_and_bad_conversations(tmp_path):
    src = tmp_path / "chats.jsonl"
    good = {"id": "c1", "messages": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": None, "reasoning_content": "add", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 2}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "4"},
        {"role": "assistant", "content": "4"}]}
    src.write_text(json.dumps(good) + "\n{broken\n" + json.dumps({"id": "c3", "messages": "nope"}) + "\n")
    records = list(convert("openai", src))
    assert [r["id"] for r in records] == ["openai:c1:1", "openai:c1:3", "openai:1", "openai:c3:0"]
    assert records[0]["response"]["choices"][0]["message"]["reasoning"] == "add"
    assert records[1]["request"]["messages"][1]["reasoning_content"] == "add"
    assert "not JSON" in records[2]["error"] and "c3" in records[3]["error"]
    out = tmp_path / "out.jsonl"
    assert convert_file("openai", src, out) == 4
    parquet = tmp_path / "o.parquet"
    reconstruct_file(out, parquet, kimi_dir(), "kimi-k2.5", JobOptions(progress=False))
    df = read_rows(parquet)
    assert df.status.tolist() == ["ok", "ok", "error", "error"]
    assert df.error[2].startswith("converter: line 2: not JSON")


def test_bad_glaive_call_is_an_error_record(tmp_path):
    src = tmp_path / "g.json"
    src.write_text(json.dumps([{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"},
                                                  {"from": "function_call", "value": "{not json"}], "tools": "[]"}]))
    records = list(convert("glaive", src))
    assert records[0]["id"] == "glaive:0:1" and "error" not in records[0]
    assert records[1]["id"] == "glaive:0:2" and "tool call is not JSON" in records[1]["error"]


def test_cli_writes_jsonl_with_limit(tmp_path):
    out = tmp_path / "g.jsonl"
    res = subprocess.run([sys.executable, "-m", "kimi_eagle", "convert", "--from", "glaive", "-o", str(out), "--limit", "3"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    lines = out.read_text().splitlines()
    assert {json.loads(x)["id"].split(":")[1] for x in lines} == {"0", "1", "2"}
    assert f"{len(lines)} API records" in res.stdout
    with pytest.raises(ValueError, match="unknown source"):
        list(convert("alpaca"))


# --------------------------------------------------------------------------------------------
# Answer shapes of real providers, as `convert --from openai` reads them (minimal synthetic answers)

REQUEST = {"model": "kimi", "messages": [{"role": "user", "content": "Look it up."}],
           "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]}


def _answer(rid: str, message: dict, finish: str = "stop", **usage) -> dict:
    return {"id": rid, "request": REQUEST, "response": {
        "id": f"gen-{rid}", "object": "chat.completion", "model": "kimi",
        "choices": [{"index": 0, "finish_reason": finish, "message": {"role": "assistant", **message}}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 9, **usage}}}


def test_real_provider_answer_shapes_convert_and_reconstruct(tmp_path, kimi):
    calls = [{"id": i, "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
             for i in ("functions.lookup:0", "lookup:1", "call_Zx81Qp0RtY5uWv3", "0", "lookup_1")]
    items = [  # OpenRouter: reasoning + reasoning_details; Moonshot / Avian: reasoning_content; leading spaces
        _answer("openrouter", {"content": " Done.", "reasoning": " Think.",
                               "reasoning_details": [{"type": "reasoning.text", "text": " Think."}]}),
        _answer("moonshot", {"content": None, "reasoning_content": "Think.", "tool_calls": calls}, "tool_calls"),
        # Moonshot bills one reasoning token for an empty reasoning (the `</think>` it writes)
        _answer("empty-reasoning", {"content": "OK", "reasoning_content": ""},
                completion_tokens_details={"reasoning_tokens": 1})]
    src = tmp_path / "log.jsonl"
    src.write_text("".join(json.dumps(i) + "\n" for i in items))
    records = by_id(convert("openai", src))
    assert [c["id"] for c in records["moonshot"]["response"]["choices"][0]["message"]["tool_calls"]] == [
        c["id"] for c in calls]  # every tool-id style kept as sent
    rows = {rid: reconstruct_record(r, kimi, get_format("kimi-k2.5")) for rid, r in records.items()}
    assert {r.status for r in rows.values()} == {"ok"}
    text = kimi.decode(rows["openrouter"].completion_ids)
    assert text.startswith(" Think.</think> Done.")  # leading spaces encoded as sent
    assert "no_reasoning" in rows["empty-reasoning"].flags and rows["empty-reasoning"].billed_reasoning_tokens == 1


def test_an_empty_answer_is_kept_by_convert_and_flagged_by_name_by_reconstruct(tmp_path, kimi):
    src = tmp_path / "log.jsonl"
    src.write_text(json.dumps(_answer("empty", {"content": "", "reasoning_content": None})) + "\n")
    (record,) = convert("openai", src)
    assert "error" not in record and record["response"]["choices"][0]["message"]["content"] == ""
    assert "answer_empty" in reconstruct_record(record, kimi, get_format("kimi-k2.5")).flags
