"""`convert --from openai` on logged usage and records it cannot read (#47): usage counts that are not counts are a
record error naming the field (never stored as billed), a request logged without its response says so, and the
wrong-`--from` hint reads as English."""
import json

import pytest

from kimi_eagle.apps import cli
from kimi_eagle.reconstruct.convert import convert

REQUEST = {"model": "moonshotai/kimi-k2.5", "messages": [{"role": "user", "content": "Hi"}]}


def response(**usage):
    return {"id": "gen-1", "provider": "Moonshot AI", "model": "moonshotai/kimi-k2.5",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Hello"}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, **usage}}


def one(tmp_path, item):
    path = tmp_path / "log.jsonl"
    path.write_text(json.dumps(item) + "\n")
    return list(convert("openai", path))


@pytest.mark.parametrize("usage, says", [
    ({"prompt_tokens": -5}, "usage.prompt_tokens is -5, not a count"),
    ({"completion_tokens": "7"}, "usage.completion_tokens is '7', not a count"),
    ({"completion_tokens": 7.5}, "usage.completion_tokens is 7.5, not a count"),
    ({"completion_tokens": 10**40}, "usage.completion_tokens is 1000000000000000000"),
    ({"completion_tokens_details": {"reasoning_tokens": -1}},
     "usage.completion_tokens_details.reasoning_tokens is -1, not a count"),
])
def test_usage_counts_that_are_not_counts_make_the_record_an_error_by_name(tmp_path, usage, says):
    (record,) = one(tmp_path, {"request": REQUEST, "response": response(**usage)})
    assert "request" not in record and says in record["error"]


def test_good_usage_is_kept_as_logged(tmp_path):
    (record,) = one(tmp_path, {"request": REQUEST, "response": response()})
    assert "error" not in record and record["response"]["usage"] == {"prompt_tokens": 3, "completion_tokens": 2}


@pytest.mark.parametrize("item, says", [
    ({"request": REQUEST}, "a request logged without its response (no `response` object)"),
    ({"request": REQUEST, "response": None}, "a request logged without its response (`response` is null)"),
])
def test_a_request_without_its_response_says_so(tmp_path, item, says):
    (record,) = one(tmp_path, item)
    assert says in record["error"] and "missing field" not in record["error"]


def test_the_wrong_from_hint_reads_an_openai_file(tmp_path, capsys):
    (record,) = one(tmp_path, {"conversations": []})
    assert "(is this an openai file? check --from)" in record["error"]
    path = tmp_path / "log.jsonl"
    assert cli.main(["convert", "--from", "openai", str(path), "-o", str(tmp_path / "api.jsonl")]) == 3
    assert "a openai" not in capsys.readouterr().out
