"""Engine/API record pairs from the real stories260K engine: the true IDs, and the text an API returns for them."""
import pytest

from kimi_eagle.assets import stories_dir
from kimi_eagle.diff.run import diff_files
from kimi_eagle.engine.local import Engine, SamplingParams, completion_text
from kimi_eagle.engine.pairs import generate_pairs
from kimi_eagle.io import write_jsonl
from kimi_eagle.reconstruct.job import JobOptions, reconstruct_file

PROMPTS = [
    {"id": "a", "prompt": "Once upon a time", "seed": 11},
    {"id": "b", "prompt": "The dog wanted to"},  # no seed of its own: the sampling seed
    {"id": "c", "messages": [{"role": "user", "content": "One day"}], "dataset": "mine", "seed": 12},
]


@pytest.fixture(scope="module")
def engine():
    return Engine.from_dir(stories_dir(), "plain")


@pytest.fixture(scope="module")
def pairs(engine):
    return generate_pairs(engine, PROMPTS, SamplingParams(1.0, 1.0, 5, 24))


def test_each_prompt_gives_an_engine_record_and_the_api_record_of_the_same_generation(engine, pairs):
    engine_records, api_records = pairs
    assert [e["id"] for e in engine_records] == [a["id"] for a in api_records] == ["a", "b", "c"]
    assert [e["sampling"]["seed"] for e in engine_records] == [11, 5, 12]
    assert all(e["chat_format"] == "plain" and 1 <= len(e["output_ids"]) <= 24 for e in engine_records)
    e, a = engine_records[0], api_records[0]
    assert a == {
        "id": "a", "dataset": "stories",
        "request": {"model": engine.name, "messages": [{"role": "user", "content": "Once upon a time"}]},
        "response": {"choices": [{"message": {"role": "assistant",
                                              "content": completion_text(engine.tok, e["output_ids"], engine.eos_ids)},
                                  "finish_reason": e["finish_reason"]}]},
    }
    assert e["prompt_ids"] == engine.prompt_ids(a["request"]["messages"])
    assert api_records[2]["dataset"] == "mine" and api_records[2]["request"]["messages"] == PROMPTS[2]["messages"]


def test_a_line_seed_makes_the_pair_reproducible(engine, pairs):
    again, _ = generate_pairs(engine, PROMPTS[:1], SamplingParams(1.0, 1.0, 99, 24))
    assert again[0]["output_ids"] == pairs[0][0]["output_ids"]


def test_reconstructing_the_api_records_gives_back_the_engine_bytes(engine, pairs, tmp_path):
    engine_records, api_records = pairs
    write_jsonl(tmp_path / "engine.jsonl", engine_records)
    write_jsonl(tmp_path / "api.jsonl", api_records)
    status = reconstruct_file(tmp_path / "api.jsonl", tmp_path / "recon.parquet", stories_dir(), "plain", JobOptions(progress=False))
    assert status == {"ok": 3}
    records = diff_files(engine.tok, tmp_path / "engine.jsonl", tmp_path / "recon.parquet").records
    assert list(records.status) == ["ok"] * 3 and records.prompt_match.all()
    assert set(records.verdict) <= {"exact", "bpe_split"}  # the text keeps every byte; only the split may differ
