"""Your own chat-completion logs in one step: the shipped example log (docs/examples/openai_log.jsonl) in every
accepted shape goes through convert -> reconstruct -> billing with its ids, usage, provider and finish_reason."""
import hashlib
import json

import pandas as pd
import pytest

from kimi_eagle.apps import cli
from kimi_eagle.assets import REPO_ROOT
from kimi_eagle.reconstruct.convert import convert
from kimi_eagle.reconstruct.job import read_rows
from kimi_eagle.reconstruct.log_shapes import LogShapeError, api_record_from_log

EXAMPLE = REPO_ROOT / "docs" / "examples" / "openai_log.jsonl"
LOGGED = [json.loads(line) for line in EXAMPLE.read_text(encoding="utf-8").splitlines()]


def _content_id(item):
    response = item.get("response") or item.get("completion")
    request = item.get("request") or {k: v for k, v in item.items() if k not in ("response", "completion")}
    text = json.dumps([request, response], sort_keys=True, ensure_ascii=False)
    return "log:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def _expected_ids():
    return [item.get("id") or (item.get("response") or item.get("completion")).get("id") or _content_id(item) for item in LOGGED]


def test_the_example_log_holds_every_accepted_shape():
    shapes = {("request" in i, "messages" in i, "completion" in i, "id" in i) for i in LOGGED}
    assert (True, False, False, True) in shapes  # {id, request, response}
    assert (False, True, False, False) in shapes  # request kwargs beside the SDK's model_dump(), no id
    assert (True, False, True, True) in shapes  # {request, completion}
    sdk = next(i for i in LOGGED if "messages" in i)["response"]
    assert sdk["choices"][0]["message"]["function_call"] is None and "system_fingerprint" in sdk  # a real model_dump()


@pytest.mark.parametrize("as_array", [False, True], ids=["jsonl", "json-array"])
def test_convert_keeps_ids_usage_provider_finish_reason_and_model(tmp_path, as_array):
    src = tmp_path / ("log.json" if as_array else "log.jsonl")
    src.write_text(json.dumps(LOGGED) if as_array else EXAMPLE.read_text(encoding="utf-8"), encoding="utf-8")
    records = list(convert("openai", src))
    assert [r["id"] for r in records] == _expected_ids() and not any("error" in r for r in records)
    assert [r.get("id_from") for r in records] == [None, "response.id", None, "content sha256"]
    for record, item in zip(records, LOGGED):
        response = item.get("response") or item.get("completion")
        assert record["response"] == response  # usage, provider, finish_reason, model: as logged
        assert record["request"]["messages"] == (item.get("request") or item)["messages"]
        assert record["request"]["model"] == "moonshotai/kimi-k2.5"
    assert records[1]["request"]["tools"] == LOGGED[1]["tools"] and records[1]["request"]["temperature"] == 1.0
    assert records[2]["response"]["choices"][0]["finish_reason"] == "length"


def test_convert_reconstruct_billing_on_the_example_log_and_reconstruct_reads_it_directly(tmp_path, capsys):
    api = tmp_path / "api.jsonl"
    assert cli.main(["convert", "--from", "openai", str(EXAMPLE), "-o", str(api)]) == 0
    assert cli.main(["reconstruct", str(api), "-o", str(tmp_path / "recon.parquet"), "--no-progress"]) == 0
    assert cli.main(["reconstruct", str(EXAMPLE), "-o", str(tmp_path / "direct.parquet"), "--no-progress"]) == 0
    rows = read_rows(tmp_path / "recon.parquet")
    direct = read_rows(tmp_path / "direct.parquet")
    assert list(rows.id) == _expected_ids() and set(rows.status) == {"ok"}
    # reconstruct reads the same shapes; only the record with no id anywhere is an error there (convert makes one)
    assert list(direct.id[:3]) == _expected_ids()[:3] and list(direct.status) == ["ok", "ok", "ok", "error"]
    assert direct.error[3] == "record has no string id"
    for col in ("completion_ids", "prompt_ids", "finish_reason", "provider", "billed_completion_tokens"):
        assert [list(v) if hasattr(v, "__len__") and not isinstance(v, str) else v for v in rows[col][:3]] == \
               [list(v) if hasattr(v, "__len__") and not isinstance(v, str) else v for v in direct[col][:3]], col
    assert rows.finish_reason.tolist() == ["stop", "tool_calls", "length", "stop"]
    assert rows.provider.fillna("none").tolist() == ["Moonshot AI", "none", "Together", "Moonshot AI"]  # the SDK logs none
    usage = [(i.get("response") or i.get("completion"))["usage"]["completion_tokens"] for i in LOGGED]
    assert rows.billed_completion_tokens.tolist() == usage
    assert cli.main(["billing", str(tmp_path / "recon.parquet"), "-o", str(tmp_path / "billing")]) == 0
    billing = pd.read_parquet(tmp_path / "billing" / "billing_records.parquet")
    assert len(billing) == 4 and "no_billing" not in set(billing.verdict)
    summary = json.loads((tmp_path / "billing" / "summary.json").read_text())
    assert summary["n_records"] == 4 and summary["all"]["billed_tokens"] == sum(usage)


def test_a_bare_response_or_a_shape_without_a_response_is_one_clear_error(tmp_path):
    bare = dict(LOGGED[0]["response"])
    with pytest.raises(LogShapeError, match="without its request"):
        api_record_from_log(bare)
    with pytest.raises(LogShapeError, match="id is a int"):
        api_record_from_log({**LOGGED[0], "id": 7})
    src = tmp_path / "bad.jsonl"
    src.write_text(json.dumps(bare) + "\n" + json.dumps(LOGGED[0]) + "\n", encoding="utf-8")
    records = list(convert("openai", src))
    assert "without its request" in records[0]["error"] and records[1]["id"] == "paris-1"
