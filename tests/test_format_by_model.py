"""``reconstruct --format auto`` (the default): each record is rendered in the chat format of the model it names.

The README's own-logs flow once read every record as Kimi-K2.5 unless told otherwise: a coding agent's log of
Kimi-K2-0905 traffic was rendered in the wrong template and every provider table entry for K2-0905 "did not apply".
Now the model a request names (else its response) picks the format; a model the table does not know is rendered
in Kimi-K2.5's and its row is flagged ``format_assumed``."""
from __future__ import annotations

import json

import pytest

from kimi_eagle.apps import cli
from kimi_eagle.chat.by_model import DEFAULT_FORMAT, MODEL_FORMATS, ByModel, format_of_model, pick_format, record_format
from kimi_eagle.chat.formats import FORMATS, get_format
from kimi_eagle.reconstruct.job import read_rows
from kimi_eagle.reconstruct.record import reconstruct_record
from kimi_eagle.reconstruct.recorded import DATASET, corpus_records


@pytest.mark.parametrize("model, expected", [
    ("moonshotai/kimi-k2-0905", "kimi-k2-instruct"),
    ("moonshotai/Kimi-K2-Instruct-0905:groq", "kimi-k2-instruct"),  # Hugging Face router: case and a :tag
    ("moonshot.kimi-k2-thinking", "kimi-k2-thinking"),  # Bedrock's prefix
    ("kimi-k2.5", "kimi-k2.5"),
    ("moonshotai/kimi-k2.5-0127", "kimi-k2.5"),
    ("tiny-kimi-model", "kimi-k2.5"), ("tiny-kimi", "kimi-k2.5"),  # the kit's own tiny-kimi: the K2.5 format
    ("gpt-4o", None), ("", None), (None, None), (12, None),
])
def test_a_model_name_names_its_format(model, expected):
    assert format_of_model(model) == expected


def test_every_format_the_table_names_is_a_format_the_kit_renders():
    assert set(MODEL_FORMATS.values()) <= set(FORMATS) and DEFAULT_FORMAT in FORMATS
    assert isinstance(record_format("auto"), ByModel) and record_format("auto").name == "auto"


def _record(model_in_request, model_in_response="kimi-k2.5"):
    request = {"messages": [{"role": "user", "content": "Hi"}]}
    if model_in_request is not None:
        request["model"] = model_in_request
    response = {"model": model_in_response, "provider": "P",
                "choices": [{"message": {"role": "assistant", "content": "Hello."}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 2}}
    return {"id": "r", "request": request, "response": response}


def test_the_request_names_the_model_else_the_response_else_the_default_is_flagged(kimi):
    auto = record_format("auto", kimi)
    fmt, flags = pick_format(auto, _record("moonshotai/kimi-k2-0905"))
    assert (fmt.name, flags) == ("kimi-k2-instruct", [])
    fmt, flags = pick_format(auto, _record(None, "moonshotai/kimi-k2-0905"))
    assert (fmt.name, flags) == ("kimi-k2-instruct", [])
    fmt, flags = pick_format(auto, _record("some/other-model", "also-unknown"))
    assert (fmt.name, flags) == (DEFAULT_FORMAT, ["format_assumed"])
    explicit = get_format("kimi-k2-thinking", kimi)
    assert pick_format(explicit, _record("moonshotai/kimi-k2-0905")) == (explicit, [])  # an explicit format stays


def test_an_auto_row_is_the_row_of_its_models_format_and_says_which(kimi):
    auto = record_format("auto", kimi)
    for model, name in (("moonshotai/kimi-k2-0905", "kimi-k2-instruct"), ("kimi-k2.5", "kimi-k2.5")):
        record = _record(model)
        row, same = reconstruct_record(record, kimi, auto), reconstruct_record(record, kimi, get_format(name, kimi))
        assert row.format == name and row.prompt_ids == same.prompt_ids and row.completion_ids == same.completion_ids
        assert "format_assumed" not in row.flags
    assert "format_assumed" in reconstruct_record(_record("mystery", "mystery"), kimi, auto).flags


def test_a_log_mixing_models_is_reconstructed_each_in_its_own_format(tmp_path):
    """Real recorded exchanges, K2-0905 and K2.5 in one file, no --format: each row as its model's format renders
    it alone (the same prompt IDs as a run of that format)."""
    _, records = corpus_records(DATASET)
    picked = ([r for r in records if r.get("format") == "kimi-k2-instruct" and "error" not in r][:4]
              + [r for r in records if r.get("format") == "kimi-k2.5" and "error" not in r][:4])
    log = tmp_path / "mixed.jsonl"
    log.write_text("".join(json.dumps({k: r[k] for k in ("id", "request", "response")}) + "\n" for r in picked))
    common = ["--no-progress", "--serving", "template"]
    assert cli.main(["reconstruct", str(log), "-o", str(tmp_path / "auto.parquet"), *common]) == 0
    auto = {r["id"]: r for r in read_rows(tmp_path / "auto.parquet").to_dict("records")}
    assert {r["id"]: auto[r["id"]]["format"] for r in picked} == {r["id"]: r["format"] for r in picked}
    for name in ("kimi-k2-instruct", "kimi-k2.5"):
        assert cli.main(["reconstruct", str(log), "-o", str(tmp_path / f"{name}.parquet"), "--format", name,
                         *common]) == 0
        alone = {r["id"]: r for r in read_rows(tmp_path / f"{name}.parquet").to_dict("records")}
        for r in picked:
            if r["format"] == name:
                assert list(auto[r["id"]]["prompt_ids"]) == list(alone[r["id"]]["prompt_ids"]), r["id"]
    assert not any("format_assumed" in list(r["flags"]) for r in auto.values())
