"""``--serving auto`` tells the server versions apart from what a provider's own answers and bills show.

Each recorded server answer (``tests/data/servers``) becomes an API record billed as that server would bill
it (``prompt_tokens`` = its prompt IDs, ``completion_tokens`` = the engine's IDs), under a provider named
after the server variant. Auto must give every provider the profile of its own server version and setting,
with the evidence in the choice (prompt counts, completion counts, answers' conventions).
"""
from __future__ import annotations

import itertools
import json

import pytest
from test_server_answers import load_vectors
from test_server_roundtrip import api_record

from kimi_eagle.reconstruct.prepass import reconstruct_counter
from kimi_eagle.serving.auto import answer_consistent, choose_profiles, describe
from kimi_eagle.serving.profiles import get_profile


def provider_records(name: str, variant: str, n: int) -> list[dict]:
    _, answers = load_vectors(name)
    _, prompts = load_vectors(name.replace("answers", "prompts"))
    prompt_ids = {p["case"]: p["prompt_ids"] for p in prompts if p.get("status") == 200}
    out = []
    for v in itertools.islice((v for v in answers if v["case"] in prompt_ids
                               and v["answers"].get(variant, {}).get("status") == 200), n):
        record = api_record(v, variant)
        record["response"]["provider"] = f"{name.split('.answers')[0]}:{variant}"
        record["response"]["usage"]["prompt_tokens"] = len(prompt_ids[v["case"]])
        out.append(record)
    return out


@pytest.mark.parametrize("variant,expected", [("space", "vllm-0.33"), ("nospace", "vllm-0.33-nospace")])
def test_auto_picks_the_vllm_version_and_its_detokenizer_setting(variant, expected, kimi):
    records = provider_records("vllm-0.33.answers.jsonl.gz", variant, 64)
    [choice] = choose_profiles(records, kimi, "kimi-k2.5", counter=reconstruct_counter(kimi, "kimi-k2.5"))
    assert choice["profile"] == expected, describe(choice)
    assert choice["prompt_matched"][expected] == choice["compared"] >= 60  # empty answers: not compared
    matched = choice["answer_matched"]
    assert choice["answer_compared"] > 0 and matched[expected] == max(matched.values()) > choice["answer_compared"] / 2
    assert f"{expected} profile" in describe(choice) and "answers consistent" in describe(choice)


def test_a_leading_space_is_the_detokenizers_and_a_returned_cut_call_is_vllm_0_33s():
    spaced = {"response": {"choices": [{"message": {"reasoning": " I look.", "content": None},
                                        "finish_reason": "stop"}]}}
    assert answer_consistent(spaced, get_profile("vllm-0.33")) is True
    assert answer_consistent(spaced, get_profile("vllm-0.33-nospace")) is False
    assert answer_consistent(spaced, get_profile("template")) is False
    cut = {"response": {"choices": [{"message": {"content": "ok", "tool_calls": [{"id": "functions.f:0"}]},
                                     "finish_reason": "length"}]}}
    assert answer_consistent(cut, get_profile("vllm-0.33-nospace")) is True
    assert answer_consistent(cut, get_profile("vllm-legacy")) is False
    assert answer_consistent({"response": {}}, get_profile("vllm-0.33")) is None
    random_id = {"response": {"choices": [{"message": {"content": "ok", "tool_calls": [{"id": "chatcmpl-tool-9f"}]},
                                           "finish_reason": "tool_calls"}]}}
    assert answer_consistent(random_id, get_profile("vllm-0.33-nospace")) is True
    assert answer_consistent(random_id, get_profile("sglang-0.5")) is False


def test_the_choice_and_its_evidence_reach_the_serving_json_and_the_billing_page(tmp_path, capsys):
    from kimi_eagle.apps.cli import main

    records = provider_records("vllm-0.33.answers.jsonl.gz", "space", 24)
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    recon = tmp_path / "recon.parquet"
    assert main(["reconstruct", str(log), "-o", str(recon), "--serving", "auto"]) == 0
    evidence = json.loads((tmp_path / "recon.parquet.serving.json").read_text())
    [group] = evidence["groups"]
    assert group["profile"] == "vllm-0.33" and group["answer_matched"]["vllm-0.33"] == group["answer_compared"] > 0
    assert main(["billing", str(recon), "-o", str(tmp_path / "billing")]) == 0
    page = (tmp_path / "billing" / "report.html").read_text()
    assert "serving profile chosen per provider" in page and "vllm-0.33 profile, prompt counts matched" in page
    summary = json.loads((tmp_path / "billing" / "summary.json").read_text())
    assert summary["serving_evidence"] == evidence["summary"]
