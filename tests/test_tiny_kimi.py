"""tiny-kimi: a small model over real Kimi token IDs, trained on the K2.5 renderings, served in the Kimi format."""
import json
import math

import pytest

from kimi_eagle.apps.api.server import App
from kimi_eagle.apps.tiny_kimi import (
    TinyKimiSpec,
    build_tiny_kimi,
    collect_tiny_kimi,
    format_special_ids,
    kimi_prompt_lines,
)
from kimi_eagle.assets import kimi_dir
from kimi_eagle.chat.formats import get_format
from kimi_eagle.chat.parse import reconstruction_options
from kimi_eagle.diff.run import diff_files
from kimi_eagle.engine.id_map import ID_MAP_FILE, IdMap, IdMapError
from kimi_eagle.engine.kimi_format import kimi_chat_answer
from kimi_eagle.engine.local import Engine, EngineError, Generation, SamplingParams
from kimi_eagle.io import read_jsonl
from kimi_eagle.reconstruct.convert import convert
from kimi_eagle.reconstruct.job import JobOptions, reconstruct_file
from kimi_eagle.reconstruct.record import reconstruct_record
from kimi_eagle.serving.answer import parse_completion
from kimi_eagle.tokenize.tokenizer import KimiTokenizer

# a few seconds: the real data and vocabulary, a very small network, two steps
SPEC = TinyKimiSpec(steps=2, seed=0, sharegpt_conversations=2, hidden_size=32, intermediate_size=64, num_layers=1,
                    num_heads=2, seq_len=64, batch_size=2, max_positions=1024)
IM_END = 163586


@pytest.fixture(scope="module")
def tok():
    return KimiTokenizer.from_dir(kimi_dir())


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny_kimi") / "model"
    return out, build_tiny_kimi(out, SPEC)


@pytest.fixture(scope="module")
def engine(built):
    return Engine.from_dir(built[0])


def test_the_model_trains_saves_a_manifest_and_loads_as_a_kimi_engine(built, engine):
    out, manifest = built
    assert {"config.json", "model.safetensors", ID_MAP_FILE, "tiktoken.model", "manifest.json"} <= {
        p.name for p in out.iterdir()}
    assert manifest["steps"] == 2 and manifest["seed"] == 0 and len(manifest["loss_curve"]) == 2
    assert len(manifest["data_sha256"]) == 64 and math.isfinite(manifest["final_loss"])
    assert set(manifest["sources"]) == {"glaive", "reason-tool-use", "sharegpt"}
    assert manifest["sources"]["glaive"]["documents"] == 300 and manifest["sources"]["sharegpt"]["conversations"] == 2
    assert json.loads((out / "manifest.json").read_text()) == manifest
    assert engine.chat_format == "kimi-k2.5" and engine.eos_ids == [IM_END] and engine.bos_id is None
    assert engine.model.config.vocab_size == len(engine.id_map) == manifest["n_rows"]


def test_the_vocabulary_holds_every_training_id_and_every_named_special(engine, tok):
    specials = format_special_ids(tok)
    assert {tok.special_id_by_text[t] for t in ("<|im_end|>", "<think>", "</think>", "<|tool_calls_section_begin|>",
                                                "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
                                                "<|tool_call_end|>", "<|tool_calls_section_end|>")} <= set(specials)
    assert set(specials) <= set(engine.id_map.kimi_ids)
    record = next(r for r in convert("glaive") if r["id"].startswith("glaive:0:"))
    row = reconstruct_record(record, tok, get_format("kimi-k2.5"))
    assert set(row.prompt_ids) | set(row.completion_ids) <= set(engine.id_map.kimi_ids)


def test_the_id_map_round_trips_and_refuses_what_it_does_not_hold(built, engine):
    out, _ = built
    loaded = IdMap.load(out)
    assert loaded.kimi_ids == engine.id_map.kimi_ids
    rows = list(range(len(loaded)))
    assert loaded.to_rows(loaded.to_kimi(rows)) == rows
    assert loaded.to_kimi(loaded.to_rows(loaded.kimi_ids)) == loaded.kimi_ids
    missing = next(i for i in range(200_000) if i not in loaded)
    with pytest.raises(IdMapError, match=f"Kimi ID {missing} is outside"):
        loaded.to_rows([loaded.kimi_ids[0], missing])
    with pytest.raises(IdMapError):
        loaded.to_kimi([len(loaded)])
    with pytest.raises(IdMapError):
        IdMap([5, 3])


def test_a_tampered_id_map_file_is_refused(tmp_path):
    (tmp_path / ID_MAP_FILE).write_text(json.dumps({"kind": "kimi-eagle model-row <-> Kimi-ID map", "n_rows": 3,
                                                    "kimi_ids": [1, 2]}))
    with pytest.raises(IdMapError, match="3 integers"):
        IdMap.load(tmp_path)


def test_the_same_seed_builds_the_same_model_and_another_seed_does_not(built, tmp_path):
    out, manifest = built
    again = build_tiny_kimi(tmp_path / "again", SPEC)
    assert (tmp_path / "again" / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
    assert again["loss_curve"] == manifest["loss_curve"] and again["data_sha256"] == manifest["data_sha256"]
    other = TinyKimiSpec(**{**SPEC.__dict__, "seed": 1})
    build_tiny_kimi(tmp_path / "other", other)
    assert (tmp_path / "other" / "model.safetensors").read_bytes() != (out / "model.safetensors").read_bytes()


def test_generate_renders_k25_with_tools_and_samples_only_kimi_ids(engine, tok):
    line = kimi_prompt_lines(1, tok)[0]
    assert line["tools"]  # glaive prompts carry their tools, so the model is asked for tool calls
    prompt = engine.prompt_ids(line["messages"], line["tools"])
    record = {"id": "x", "request": {"messages": line["messages"], "tools": line["tools"]},
              "response": {"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}]}}
    assert prompt == reconstruct_record(record, tok, get_format("kimi-k2.5")).prompt_ids
    gen = engine.generate(prompt, SamplingParams(1.0, 1.0, 3, 24))
    assert 1 <= len(gen.output_ids) <= 24 and set(gen.output_ids) <= set(engine.id_map.kimi_ids)
    assert gen.finish_reason == ("stop" if gen.output_ids[-1] == IM_END else "length")
    assert engine.generate(prompt, SamplingParams(1.0, 1.0, 3, 24)).output_ids == gen.output_ids


def test_generation_stops_at_a_stop_id(built, engine, tok):
    line = kimi_prompt_lines(1, tok)[0]
    prompt = engine.prompt_ids(line["messages"], line["tools"])
    greedy = engine.generate(prompt, SamplingParams(0, 1.0, 0, 6)).output_ids
    stopper = Engine.from_dir(built[0], stop_ids=[greedy[2]])
    out = stopper.generate(prompt, SamplingParams(0, 1.0, 0, 6))
    assert out.output_ids == greedy[:greedy.index(greedy[2]) + 1] and out.finish_reason == "stop"


def test_a_prompt_token_outside_the_model_vocabulary_is_an_engine_error(engine):
    missing = next(i for i in range(200_000) if i not in engine.id_map)
    with pytest.raises(EngineError, match="outside this model's vocabulary"):
        engine.generate([IM_END, missing], SamplingParams(0, 1.0, 0, 2))


def _well_formed_completions(tok, n_each=4):
    """Real K2.5 completions from the bundled conversations: tool calls (glaive) and reasoning with tools."""
    fmt = get_format("kimi-k2.5")
    out = []
    for source in ("glaive", "reason-tool-use"):
        for with_tools in (True, False):
            picked = 0
            for record in convert(source):
                message = record["response"]["choices"][0]["message"]
                if bool(message.get("tool_calls")) != with_tools:
                    continue
                out.append((record, reconstruct_record(record, tok, fmt)))
                picked += 1
                if picked == n_each:
                    break
    return out


def test_served_answers_parse_back_to_exactly_the_engine_bytes_for_well_formed_outputs(engine, tok, tmp_path):
    app = App(engine, tmp_path / "log.jsonl")
    completions = _well_formed_completions(tok)
    assert any(row.finish_reason == "tool_calls" for _, row in completions)
    assert any(r["response"]["choices"][0]["message"].get("reasoning") for r, _ in completions)
    for record, row in completions:
        gen = Generation(list(row.prompt_ids), list(row.completion_ids), "stop", SamplingParams(1.0, 1.0, 0, None))
        flags: list[str] = []
        response = app._response(gen, True, "local", engine, flags)
        assert flags == [], record["id"]
        choice = response["choices"][0]
        assert choice["finish_reason"] == ("tool_calls" if choice["message"].get("tool_calls") else "stop")
        assert response["usage"]["completion_tokens"] == len(row.completion_ids)
        served = {"id": record["id"], "request": record["request"], "response": response}
        parsed = parse_completion(row.completion_ids, tok)
        back = reconstruct_record(served, tok, get_format("kimi-k2.5"), reconstruction_options(parsed))
        engine_bytes = b"".join(tok.token_bytes(i) for i in row.completion_ids)
        assert b"".join(tok.token_bytes(i) for i in back.completion_ids) == engine_bytes, record["id"]


def test_a_malformed_output_is_answered_the_way_the_servers_parsers_answer(tok):
    ids = tok.encode("Let me look.</think>Sure<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
                     "<|tool_call_argument_begin|>{\"a\": 1", allow_special=True)  # the call is never closed
    answer = kimi_chat_answer(ids, tok, "length")
    assert answer.finish_reason == "length" and "truncated_in_tool_call" in answer.flags
    assert answer.message["content"] == "Sure" and answer.message["reasoning"] == "Let me look."
    assert answer.message["tool_calls"][0]["function"] == {"name": "f", "arguments": "{\"a\": 1"}
    assert answer.reasoning_tokens == ids.index(tok.special_id_by_text["</think>"])


def test_end_to_end_serve_collect_reconstruct_diff_accounts_for_every_prompt(built, tok, tmp_path):
    result = collect_tiny_kimi(built[0], tmp_path, n=3, max_tokens=10, seed=0)
    prompt_ids = [p.obj["id"] for p in read_jsonl(tmp_path / "prompts.jsonl")]
    assert result["prompts"] == 3 == result["responses_ok"] == result["engine_records"]
    responses = [line.obj for line in read_jsonl(tmp_path / "responses.jsonl")]
    engine_records = [line.obj for line in read_jsonl(tmp_path / "engine.jsonl")]
    assert sorted(r["id"] for r in responses) == sorted(prompt_ids) == sorted(e["id"] for e in engine_records)
    by_id = {e["id"]: e for e in engine_records}
    tools = {p.obj["id"]: p.obj.get("tools") for p in read_jsonl(tmp_path / "prompts.jsonl")}
    assert any(tools.values())
    for r in responses:  # each served message is the Kimi parse of the IDs the engine logged beside it
        e = by_id[r["id"]]
        assert r["request"].get("tools") == tools[r["id"]] and e["chat_format"] == "kimi-k2.5" and "parse_flags" in e
        answer = kimi_chat_answer(e["output_ids"], tok, e["finish_reason"])
        message = r["response"]["choices"][0]["message"]
        assert {k: message.get(k) for k in ("content", "reasoning", "tool_calls")} == {
            k: answer.message.get(k) for k in ("content", "reasoning", "tool_calls")}
        assert answer.flags == e["parse_flags"]
    reconstruct_file(tmp_path / "responses.jsonl", tmp_path / "recon.parquet", kimi_dir(), "kimi-k2.5", JobOptions(progress=False))
    records = diff_files(tok, tmp_path / "engine.jsonl", tmp_path / "recon.parquet").records
    assert sorted(records["id"]) == sorted(prompt_ids)
    assert set(records["status"]) <= {"ok", "error"} and records["status"].notna().all()


def test_the_cache_keeps_a_model_per_spec_data_and_code_and_trains_only_when_one_changed(built, tmp_path, monkeypatch):
    from kimi_eagle.apps import tiny_kimi

    cache = tmp_path / "cache"
    first, manifest, reused = tiny_kimi.cached_tiny_kimi(cache, SPEC)
    assert not reused and first.parent == cache and manifest["code_version"] == tiny_kimi.code_version()
    assert first.name == tiny_kimi.cache_key(SPEC, manifest["data_sha256"], manifest["code_version"])
    assert (first / "model.safetensors").read_bytes() == (built[0] / "model.safetensors").read_bytes()  # same model
    trained = []
    monkeypatch.setattr(tiny_kimi, "train", lambda *a, **k: trained.append(1) or [1.0])
    again, same, reused = tiny_kimi.cached_tiny_kimi(cache, SPEC)
    assert (again, same, reused, trained) == (first, manifest, True, [])  # the second run: nothing trained
    other, _, reused = tiny_kimi.cached_tiny_kimi(cache, TinyKimiSpec(**{**SPEC.__dict__, "seed": 1}))
    assert other != first and not reused and trained == [1]  # another spec: its own folder, trained
    monkeypatch.setattr(tiny_kimi, "code_version", lambda: "changed")  # the code changed: trained again
    changed, m, reused = tiny_kimi.cached_tiny_kimi(cache, SPEC)
    assert changed != first and not reused and m["code_version"] == "changed" and trained == [1, 1]
    assert tiny_kimi.cache_key(SPEC, "a" * 64, "c") != tiny_kimi.cache_key(SPEC, "b" * 64, "c")
    (first / "model.safetensors").unlink()  # a cache entry with a file missing is never reused
    assert tiny_kimi.reusable(first, SPEC, manifest["data_sha256"], manifest["code_version"]) is None
