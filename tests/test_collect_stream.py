"""``collect --stream``: chunks assembled into the record a non-streaming request gives (byte for byte),
keep-alive comments, a stream cut mid-way (kept as ``stream_incomplete``, retried, never counted complete),
mid-stream error events, and ``--logprobs`` stored as given -- against a real local SSE server."""
import json
import os
import subprocess
import sys

import pytest
from upstream_sse import CONTENT, REASONING, Upstream, answer, sse, stream_chunks

from kimi_eagle.apps.api.collect import CollectConfig, collect, scan_output
from kimi_eagle.io import read_jsonl, write_jsonl
from kimi_eagle.reconstruct.stream import SSEDecoder, assemble_chunks, chunk_payloads, parse_sse

pytestmark = pytest.mark.timeout(120)
STREAM = {"stream": True, "stream_options": {"include_usage": True}}


@pytest.fixture(scope="module")
def upstream():
    with Upstream() as srv:
        yield srv


def run(upstream, tmp_path, scenarios, defaults=None, name="out", **config):
    prompts = tmp_path / f"{name}.prompts.jsonl"
    write_jsonl(prompts, [{"id": f"{s}-{i}", "prompt": f"scenario:{s}"} for i, s in enumerate(scenarios)])
    out = tmp_path / f"{name}.jsonl"
    settings = dict(concurrency=2, max_attempts=3, backoff_base=0.01, backoff_max=0.05, timeout=10, progress=False)
    summary = collect(prompts, out, CollectConfig(upstream.base_url, "m", defaults=defaults or {},
                                                  **{**settings, **config}), api_key="")
    return summary, [line.obj for line in read_jsonl(out)]


# ---- the assembler and the SSE reader, no network


def test_assembled_chunks_are_byte_identical_to_the_non_streaming_answer():
    full = answer()
    assert json.dumps(assemble_chunks(stream_chunks(full))) == json.dumps(full)
    payloads, done = chunk_payloads(parse_sse(b"".join(sse(stream_chunks(full), keepalive_every=2))))
    assert done and json.dumps(assemble_chunks(payloads)) == json.dumps(full)


def test_the_sse_reader_takes_any_line_end_split_anywhere_and_logs_without_blank_lines():
    body = b"".join(sse(stream_chunks(answer()), keepalive_every=4))
    expected = parse_sse(body)
    for variant in (body.replace(b"\n", b"\r\n"), body.replace(b"\n", b"\r"), body.replace(b"\n\n", b"\n")):
        decoder, events = SSEDecoder(), []
        for i in range(0, len(variant), 7):  # 7-byte pieces split CRLFs, keys and UTF-8 alike
            events += decoder.feed(variant[i:i + 7])
        events += decoder.close()
        assert [e.data for e in events] == [e.data for e in expected]
        assert decoder.comments == sum(e.data is None for e in expected) > 0


# ---- collect against the local SSE server


def test_stream_and_non_stream_collect_store_byte_identical_responses(upstream, tmp_path):
    _, (plain,) = run(upstream, tmp_path, ["full"], name="plain")
    _, (streamed,) = run(upstream, tmp_path, ["full"], STREAM, name="streamed")
    assert plain["status"] == streamed["status"] == "ok"
    assert json.dumps(streamed["response"]) == json.dumps(plain["response"]) == json.dumps(answer())
    assert streamed["request"] == {**plain["request"], **STREAM}
    assert streamed["timing"]["stream"] == {"chunks": len(stream_chunks(answer())), "keepalives": 0, "done": True}
    assert "stream" not in plain["timing"]


def test_openrouter_processing_comments_are_keepalives(upstream, tmp_path):
    _, (rec,) = run(upstream, tmp_path, ["keepalive"], STREAM)
    assert rec["status"] == "ok" and json.dumps(rec["response"]) == json.dumps(answer())
    assert rec["timing"]["stream"]["keepalives"] == len(range(0, len(stream_chunks(answer())), 3))


def test_a_stream_cut_once_is_retried_and_its_answer_complete(upstream, tmp_path):
    _, (rec,) = run(upstream, tmp_path, ["cut-once"], STREAM)
    assert rec["status"] == "ok" and json.dumps(rec["response"]) == json.dumps(answer())
    first, second = rec["timing"]["attempt_log"]
    assert first["error"].startswith("stream_incomplete (RemoteProtocolError") and "error" not in second


def test_a_stream_that_always_breaks_keeps_what_arrived_and_is_redone_on_resume(upstream, tmp_path):
    summary, (rec,) = run(upstream, tmp_path, ["cut-always"], STREAM)
    assert rec["status"] == "error" and rec["error"]["kind"] == "stream_incomplete"
    assert summary["stream_incomplete"] == 1 and summary["ok"] == 0 and summary["totals"]["ok"] == 0
    message = rec["response"]["choices"][0]["message"]
    assert message["reasoning"] == REASONING and CONTENT.startswith(message["content"]) and message["content"]
    assert rec["response"]["choices"][0]["finish_reason"] is None
    assert len(rec["timing"]["attempt_log"]) == 3
    done, dropped = scan_output(tmp_path / "out.jsonl")
    assert done == {} and dropped == 1  # never counted complete: the next run asks again


def test_a_mid_stream_error_event_is_retried_or_permanent_by_its_code(upstream, tmp_path):
    summary, records = run(upstream, tmp_path, ["error-once", "error-400"], STREAM)
    by = {r["id"]: r for r in records}
    once, bad = by["error-once-0"], by["error-400-1"]
    assert once["status"] == "ok" and json.dumps(once["response"]) == json.dumps(answer())
    assert once["timing"]["attempt_log"][0]["error"] == "stream carrying error 502: provider disconnected"
    assert bad["status"] == "error" and bad["error"]["kind"] == "permanent"
    assert bad["error"]["message"] == "stream carrying error 400: provider disconnected"
    assert bad["response"]["error"]["code"] == 400 and len(bad["timing"]["attempt_log"]) == 1
    assert summary["failure_reasons"]


def test_the_cli_streams_and_requests_logprobs(upstream, tmp_path):
    write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "prompt": "scenario:full"}])
    out = tmp_path / "out.jsonl"
    r = subprocess.run([sys.executable, "-m", "kimi_eagle", "collect", str(tmp_path / "p.jsonl"), "-o", str(out),
                        "--base-url", upstream.base_url, "--model", "m", "--stream", "--logprobs", "--top-logprobs", "1",
                        "--no-progress"], capture_output=True, timeout=60,
                       env={k: v for k, v in os.environ.items() if k != "OPENROUTER_API_KEY"})
    assert r.returncode == 0, r.stderr
    (rec,) = [line.obj for line in read_jsonl(out)]
    assert rec["request"]["logprobs"] is True and rec["request"]["top_logprobs"] == 1 and rec["request"]["stream"]
    full = answer()
    assert rec["response"]["choices"][0]["logprobs"] == full["choices"][0]["logprobs"]
    assert rec["response"]["choices"][0]["message"]["reasoning_details"] == full["choices"][0]["message"]["reasoning_details"]
    assert rec["response"]["usage"] == full["usage"]  # reasoning and cached tokens, cost: as given
    summary = json.loads(r.stdout)
    assert summary["totals"]["reasoning_tokens"] == 11 and summary["totals"]["cached_tokens"] == 4


# ---- against `kimi-eagle serve` (its own streaming), same seed


def test_serve_streamed_and_plain_answers_are_byte_identical_on_the_same_seed(tmp_path):
    from kimi_eagle.apps.api.server import LocalServer
    from kimi_eagle.assets import stories_dir

    lines = [{"id": f"p{i}", "prompt": f"Once upon a time, {name}", "seed": i, "max_tokens": 12, "temperature": 1.0}
             for i, name in enumerate(["Lily", "Tom", "Sue"])]
    write_jsonl(tmp_path / "prompts.jsonl", lines)
    with LocalServer(stories_dir(), tmp_path / "engine.jsonl", "--threads", "1") as srv:
        results = {}
        for name, defaults in (("plain", {}), ("streamed", STREAM)):
            config = CollectConfig(srv.base_url, "stories260K", concurrency=2, defaults=defaults, progress=False)
            summary = collect(tmp_path / "prompts.jsonl", tmp_path / f"{name}.jsonl", config, api_key="")
            assert summary["ok"] == 3, summary
            results[name] = {line.obj["id"]: line.obj for line in read_jsonl(tmp_path / f"{name}.jsonl")}
    for rid in results["plain"]:
        plain, streamed = results["plain"][rid]["response"], results["streamed"][rid]["response"]
        assert streamed["id"] != plain["id"]  # two generations...
        same = {**streamed, "id": plain["id"], "created": plain["created"]}
        assert json.dumps(same) == json.dumps(plain)  # ...of the same seed: the same answer, byte for byte
        assert results["streamed"][rid]["timing"]["stream"]["done"] is True


# ---- the official openai client as a peer


def test_collect_stores_what_the_openai_sdk_receives(upstream, tmp_path):
    from openai import OpenAI

    client = OpenAI(base_url=upstream.base_url, api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "scenario:full"}]
    sdk_plain = client.chat.completions.create(model="m", messages=messages, logprobs=True)
    sdk_chunks = [c.model_dump(exclude_unset=True)
                  for c in client.chat.completions.create(model="m", messages=messages, logprobs=True, stream=True,
                                                          stream_options={"include_usage": True})]
    _, (plain,) = run(upstream, tmp_path, ["full"], {"logprobs": True}, name="plain")
    _, (streamed,) = run(upstream, tmp_path, ["full"], {"logprobs": True, **STREAM}, name="streamed")
    assert plain["response"] == sdk_plain.model_dump(exclude_unset=True)  # every field the SDK got, and no other
    assert streamed["response"] == assemble_chunks(sdk_chunks)  # equal (the SDK's dump orders keys its own way)
    assert sdk_plain.choices[0].message.tool_calls[0].function.arguments == \
        streamed["response"]["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
