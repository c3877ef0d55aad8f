"""The local engine samples real token IDs from stories260K and records them as engine records."""
import json

import pytest

from kimi_eagle.apps import cli
from kimi_eagle.assets import stories_dir
from kimi_eagle.engine.local import (
    Engine,
    EngineError,
    SamplingParams,
    completion_bytes,
    completion_text,
    engine_record,
    plain_prompt_ids,
)
from kimi_eagle.engine.prompts import STORY_OPENERS, story_prompts
from kimi_eagle.io import read_jsonl, write_jsonl
from kimi_eagle.records import parse_engine_record
from kimi_eagle.tokenize.tokenizer import ids_to_bytes

STORY = [{"role": "user", "content": "Once upon a time"}]


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.from_dir(stories_dir(), threads=1)


def test_stories_model_has_no_template_so_the_format_is_plain(engine, stories):
    assert engine.name == "stories260K" and engine.chat_format == "plain"
    assert engine.bos_id == 1 and engine.eos_ids == [2] and engine.context_length == 512
    messages = [{"role": "system", "content": "Once upon"}, {"role": "user", "content": " a time"}]
    assert engine.prompt_ids(messages) == [1] + stories.encode("Once upon a time")
    assert plain_prompt_ids(stories, messages, None) == stories.encode("Once upon a time")


def test_greedy_continuation_matches_the_published_output(engine):
    gen = engine.generate(engine.prompt_ids(STORY), SamplingParams(temperature=0, max_tokens=30))
    assert engine.text(gen).startswith(", there was a little girl named Lily. She loved to play outside in the park.")
    assert gen.finish_reason == "length" and len(gen.output_ids) == 30


def test_completion_text_keeps_the_leading_space_of_the_first_token(stories):
    ids = stories.encode("Once upon a time")
    assert stories.token_bytes(ids[0]) == b" Once"
    assert completion_text(stories, ids, [2]) == " Once upon a time"
    assert completion_bytes(stories, ids + [2], [2]) == ids_to_bytes(stories, ids)  # a final EOS adds nothing


def test_seeded_sampling_is_reproducible_and_the_seed_is_recorded(engine):
    prompt = engine.prompt_ids(STORY)
    a = engine.generate(prompt, SamplingParams(temperature=1.0, seed=7, max_tokens=40))
    b = engine.generate(prompt, SamplingParams(temperature=1.0, seed=7, max_tokens=40))
    c = engine.generate(prompt, SamplingParams(temperature=1.0, seed=8, max_tokens=40))
    assert a.output_ids == b.output_ids != c.output_ids
    fresh = engine.generate(prompt, SamplingParams(temperature=1.0, max_tokens=40))
    assert isinstance(fresh.sampling.seed, int)
    replay = engine.generate(prompt, SamplingParams(temperature=1.0, seed=fresh.sampling.seed, max_tokens=40))
    assert replay.output_ids == fresh.output_ids


def test_a_tiny_nucleus_is_greedy(engine):
    prompt = engine.prompt_ids(STORY)
    greedy = engine.generate(prompt, SamplingParams(temperature=0, max_tokens=30))
    nucleus = engine.generate(prompt, SamplingParams(temperature=1.5, top_p=1e-6, seed=1, max_tokens=30))
    assert nucleus.output_ids == greedy.output_ids


def test_sampling_the_stop_token_ends_with_it_and_finish_reason_stop(engine):
    prompt = engine.prompt_ids(STORY)
    greedy = engine.generate(prompt, SamplingParams(temperature=0, max_tokens=10)).output_ids
    stop_id = greedy[4]  # make a token the greedy path reaches the engine's stop token
    stopper = Engine(engine.model, engine.tok, "stopper", "plain", [stop_id], engine.bos_id, engine.context_length)
    gen = stopper.generate(prompt, SamplingParams(temperature=0, max_tokens=50))
    assert gen.finish_reason == "stop"
    assert gen.output_ids[-1] == stop_id and stop_id not in gen.output_ids[:-1]
    assert stopper.text(gen).encode() == ids_to_bytes(engine.tok, gen.output_ids[:-1])


def test_template_is_an_older_name_of_the_hf_template_format(engine):
    with pytest.raises(EngineError, match="no chat template"):  # recognised, but stories260K has none
        Engine(engine.model, engine.tok, "stories260K", chat_format="template")
    with pytest.raises(EngineError, match="unknown chat format"):
        Engine(engine.model, engine.tok, "stories260K", chat_format="jinja")


def test_stop_ids_can_replace_the_configured_eos(engine):
    bos_stops = Engine.from_dir(stories_dir(), stop_ids=[1, 2], threads=1)
    assert bos_stops.eos_ids == [1, 2] and engine.eos_ids == [2]


def test_the_context_length_bounds_the_output_and_rejects_long_prompts(engine, stories):
    long_prompt = [1] + stories.encode("the cat sat " * 300)[:508]
    gen = engine.generate(long_prompt, SamplingParams(temperature=1.0, seed=0, max_tokens=100))
    assert len(long_prompt) + len(gen.output_ids) <= 512 and gen.finish_reason in ("length", "stop")
    with pytest.raises(EngineError, match="context length"):
        engine.generate([1] * 512, SamplingParams())


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0), dict(max_tokens=0), dict(seed="x")])
def test_bad_sampling_parameters_are_rejected(engine, bad):
    with pytest.raises(EngineError):
        engine.generate([1], SamplingParams(**bad))


def test_engine_records_follow_the_contract(engine):
    gen = engine.generate(engine.prompt_ids(STORY), SamplingParams(temperature=1.0, seed=3, max_tokens=12))
    rec = json.loads(json.dumps(engine_record("r1", gen, engine.name, engine.chat_format)))
    parsed = parse_engine_record(rec)
    assert (parsed.id, parsed.output_ids, parsed.prompt_ids, parsed.finish_reason) == (
        "r1", gen.output_ids, gen.prompt_ids, "length")
    assert rec["sampling"] == {"temperature": 1.0, "top_p": 1.0, "seed": 3, "max_tokens": 12}


def test_command_line_writes_one_record_per_prompt_line(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "a", "messages": STORY}) + "\n" + "not json\n"
                       + json.dumps({"id": "b", "prompt": "Lily"}) + "\n")
    out = tmp_path / "engine.jsonl"
    assert cli.main(["generate", str(prompts), "-o", str(out), "--model", str(stories_dir()), "--seed", "5", "--max-tokens", "8"]) == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in recs] == ["a", "line-2", "b"]
    assert "error" in recs[1] and len(recs[0]["output_ids"]) == 8
    assert [r["sampling"]["seed"] for r in (recs[0], recs[2])] == [5, 7]


def test_kimi_eagle_generate_samples_each_prompt_line_into_an_engine_record(tmp_path, stories):
    prompts = write_jsonl(tmp_path / "prompts.jsonl", story_prompts(2, seed=4))
    out = tmp_path / "engine.jsonl"
    argv = ["generate", str(prompts), "-o", str(out), "--model", str(stories_dir()), "--chat-format", "plain",
            "--max-tokens", "6"]
    assert cli.main(argv) == 0
    recs = [line.obj for line in read_jsonl(out)]
    assert [r["id"] for r in recs] == ["story-00000", "story-00001"]
    for rec, opener, line in zip(recs, STORY_OPENERS, story_prompts(2, seed=4)):
        parsed = parse_engine_record(rec)
        assert parsed.prompt_ids == [1] + stories.encode(opener)  # the plain format: BOS + the prompt text
        assert 1 <= len(parsed.output_ids) <= 6 and (parsed.finish_reason == "stop") == (parsed.output_ids[-1] == 2)
        assert (rec["model"], rec["chat_format"], rec["sampling"]["seed"]) == ("stories260K", "plain", line["seed"])
    first = out.read_bytes()
    assert cli.main(argv) == 0 and out.read_bytes() == first  # every line's own seed makes the run replayable


def test_logprobs_are_the_models_and_leave_sampling_unchanged(engine):
    import torch

    prompt = engine.prompt_ids([{"role": "user", "content": "Once upon a time"}])
    sp = SamplingParams(temperature=1.0, seed=7, max_tokens=12)
    plain, scored = engine.generate(prompt, sp), engine.generate(prompt, sp, logprobs=3)
    assert plain.logprobs is None and scored.output_ids == plain.output_ids and len(scored.logprobs) == 12
    with torch.inference_mode():  # recomputed independently: one full forward pass over prompt + output
        logits = engine.model(input_ids=torch.tensor([prompt + scored.output_ids])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    for k, (token, (lp, top)) in enumerate(zip(scored.output_ids, scored.logprobs)):
        row = logp[len(prompt) - 1 + k]
        assert lp == pytest.approx(float(row[token]), abs=1e-4)
        assert [t for t, _ in top] == row.topk(3).indices.tolist()
        assert [v for _, v in top] == sorted((v for _, v in top), reverse=True)
