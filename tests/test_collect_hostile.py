"""Hostile answers and prompts for ``collect``, each case named after what it plants: every prompt ends as one
stored record (an error with its reason when it cannot be stored as it came), the run never stops, every wait
and body is bounded, and no form or fragment of the key is ever written or printed."""
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from upstream_sse import CONTENT, Upstream, answer

from kimi_eagle.apps.api.collect import CollectConfig, classify_response, collect, header_id, scan_output
from kimi_eagle.apps.api.redact import MIN_PREFIX, Redactor
from kimi_eagle.io import read_jsonl, write_jsonl
from kimi_eagle.reconstruct.stream import StreamAssembler, StreamError

pytestmark = pytest.mark.timeout(120)
SECRET = f"sk-or-v1-{uuid.uuid4().hex}"
STREAM = {"stream": True, "stream_options": {"include_usage": True}}
FAST = dict(concurrency=2, max_attempts=2, backoff_base=0.01, backoff_max=0.05, timeout=10, progress=False)


@pytest.fixture(scope="module")
def upstream():
    with Upstream(SECRET) as srv:
        yield srv


def run(upstream, tmp_path, lines, defaults=None, **config):
    prompts, out = tmp_path / "prompts.jsonl", tmp_path / "out.jsonl"
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))  # ASCII JSON: it can hold lone surrogates
    t0 = time.monotonic()
    summary = collect(prompts, out, CollectConfig(upstream.base_url, "m", defaults=defaults or {},
                                                  **{**FAST, **config}), api_key=SECRET)
    return summary, {line.obj["id"]: line.obj for line in read_jsonl(out)}, time.monotonic() - t0


def key_fragments(blob: bytes) -> list[str]:
    """Every prefix of the key of MIN_PREFIX+ characters found in ``blob`` (the whole key included)."""
    text = blob.decode("utf-8", "replace")
    return [SECRET[:n] for n in range(MIN_PREFIX, len(SECRET) + 1) if SECRET[:n] in text]


def written(tmp_path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(tmp_path.rglob("*")) if p.is_file() and "prompts" not in p.name)


# ---- what an answer or a prompt plants


def test_lone_surrogate_in_content(upstream, tmp_path):
    summary, by, _ = run(upstream, tmp_path, [{"id": "cut", "prompt": "scenario:surrogate"},
                                              {"id": "fine", "prompt": "scenario:full"}])
    rec = by["cut"]
    assert rec["status"] == "error" and rec["error"]["kind"] == "lone_surrogate"
    assert "$.choices[0].message.content" in rec["error"]["message"].replace("response", "$")
    assert rec["response"]["choices"][0]["message"]["content"] == "a cut emoji \ud83d here"  # kept, as an escape
    raw = (tmp_path / "out.jsonl").read_bytes()
    raw.decode("utf-8")  # the file is valid UTF-8
    assert b"\\ud83d" in raw
    assert by["fine"]["status"] == "ok" and summary["lone_surrogate"] == 1 and summary["ok"] == 1
    assert scan_output(tmp_path / "out.jsonl")[0]  # stored for good (a permanent error, not redone every run)


def test_lone_surrogate_in_prompt(upstream, tmp_path):
    summary, by, _ = run(upstream, tmp_path, [{"id": "p", "prompt": "scenario:full \ud83d"},
                                              {"id": "q", "prompt": "scenario:full"}])
    assert by["p"]["error"]["kind"] == "bad_prompt" and by["p"]["error"]["message"].startswith("line 1: holds a lone")
    assert by["p"]["request"]["messages"][0]["content"] == "scenario:full \ud83d"  # nothing lost
    assert by["q"]["status"] == "ok" and summary["bad_prompt"] == 1


def test_non_ascii_id(upstream, tmp_path):
    rid = "物語-é-\U0001f600 %41"
    upstream.record_ids.clear()
    _, by, _ = run(upstream, tmp_path, [{"id": rid, "prompt": "scenario:full"}])
    assert list(by) == [rid] and by[rid]["status"] == "ok"
    assert upstream.record_ids == [header_id(rid)] and header_id(rid).isascii()
    assert rid.encode() in (tmp_path / "out.jsonl").read_bytes()  # stored as given, UTF-8


def test_float_id(upstream, tmp_path):
    _, by, _ = run(upstream, tmp_path, [{"id": 1.5, "prompt": "scenario:full"}, {"id": True, "prompt": "x"}])
    assert by["line-1"]["error"]["message"] == "line 1: `id` must be a string or an integer, got float 1.5"
    assert by["line-2"]["error"]["kind"] == "bad_prompt"


def test_endless_body(upstream, tmp_path):
    _, by, seconds = run(upstream, tmp_path, [{"id": "e", "prompt": "scenario:endless"}], max_body_bytes=1 << 20)
    assert by["e"]["error"]["kind"] == "exhausted" and "--max-body-bytes 1048576" in by["e"]["error"]["message"]
    assert seconds < 120  # a hang guard: the cap ends it, however slow the machine


def test_endless_body_ends_at_the_deadline(upstream, tmp_path):
    _, by, seconds = run(upstream, tmp_path, [{"id": "e", "prompt": "scenario:endless"}], max_attempts=1,
                         max_body_bytes=1 << 40, response_timeout=2)
    assert "response deadline (2 s" in by["e"]["error"]["message"] and seconds < 120  # hang guard


def test_slow_body(upstream, tmp_path):
    _, by, seconds = run(upstream, tmp_path, [{"id": "s", "prompt": "scenario:slow"}], max_attempts=1,
                         timeout=5, response_timeout=3)
    assert by["s"]["error"]["kind"] == "exhausted" and "response deadline (3 s" in by["s"]["error"]["message"]
    assert 3 <= seconds < 120  # the deadline fired (not before 3 s); the upper bound only guards a hang


def test_retry_after_99999(upstream, tmp_path):
    _, by, seconds = run(upstream, tmp_path, [{"id": "r", "prompt": "scenario:retry-after"}], backoff_max=0.2)
    first, second = by["r"]["timing"]["attempt_log"]
    assert first["status"] == 429 and first["wait_s"] == 0.2 and by["r"]["status"] == "ok" and seconds < 120  # 99999 s not waited


@pytest.mark.parametrize("scenario", ["echo-split", "echo-u", "echo-pct"],
                         ids=["key echoed split at the cut", "\\u0073-escaped key", "percent-encoded key"])
def test_key_echoed(upstream, tmp_path, scenario, capsys):
    summary, by, _ = run(upstream, tmp_path, [{"id": "k", "prompt": f"scenario:{scenario}"}])
    rec = by["k"]
    assert rec["error"]["kind"] == "permanent" and "[REDACTED" in rec["error"]["message"]
    blob = written(tmp_path) + json.dumps(summary).encode() + "".join(capsys.readouterr()).encode()
    assert key_fragments(blob) == []
    if scenario == "echo-split":  # the 300-character snippet ends inside the key
        body = (tmp_path / "out.jsonl").read_text()
        assert "Bearer [REDACTED" in body


def test_redaction_forms_and_cuts():
    r = Redactor(SECRET)
    forms = [SECRET, json.dumps(SECRET), "\\u0073" + SECRET[1:], "\\\\u0073" + SECRET[1:],
             "".join(f"%{b:02x}" for b in SECRET.encode()), SECRET[:5] + "%2D" + SECRET[6:],
             SECRET.replace("-", "\\u002D")]
    for form in forms:
        assert key_fragments(r(f"x {form} y").encode()) == [] and r(f"x {form} y").count("[REDACTED]") == 1
    text = "Authorization: Bearer " + SECRET
    for limit in range(len(text) - len(SECRET), len(text) + 1):
        for form in ("\\u0073" + SECRET[1:], SECRET):
            cut = Redactor(SECRET).cut(text.replace(SECRET, form), limit)
            assert key_fragments(cut.encode()) == []
    assert Redactor(SECRET).cut("abc " + SECRET[:5], 100) == "abc " + SECRET[:5]  # 5 characters are no key
    for n in range(MIN_PREFIX, len(SECRET)):  # the upstream cut its own echo: a prefix ends the body
        for form in (SECRET[:n], "\\u0073" + SECRET[1:n], "".join(f"%{b:02X}" for b in SECRET[:n].encode())):
            assert r.cut("Bearer " + form, 300) == "Bearer [REDACTED]"
    assert r.cut("Bearer " + "\\u0073" + SECRET[1:9] + "\\u00", 300) == "Bearer [REDACTED]"  # a half escape too


def test_stream_cut_mid_way(upstream, tmp_path):
    summary, by, _ = run(upstream, tmp_path, [{"id": "c", "prompt": "scenario:cut-always"}], STREAM)
    assert by["c"]["error"]["kind"] == "stream_incomplete" and CONTENT.startswith(
        by["c"]["response"]["choices"][0]["message"]["content"])
    assert summary["totals"]["ok"] == 0


def test_error_event_mid_stream(upstream, tmp_path):
    _, by, _ = run(upstream, tmp_path, [{"id": "e", "prompt": "scenario:error-400"}], STREAM)
    assert by["e"]["error"]["kind"] == "permanent" and by["e"]["response"]["error"]["code"] == 400


# ---- the command line: the stop, the exit code, the key up front


def cli(tmp_path, base_url, *extra, key=SECRET):
    env = {k: v for k, v in os.environ.items() if k != "OPENROUTER_API_KEY"}
    if key:
        env["OPENROUTER_API_KEY"] = key
    return [sys.executable, "-m", "kimi_eagle", "collect", str(tmp_path / "prompts.jsonl"), "-o",
            str(tmp_path / "out.jsonl"), "--base-url", base_url, "--model", "m", "--no-progress", *extra], env


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_in_flight_requests_are_written_when_the_run_is_stopped(upstream, tmp_path, sig):
    write_jsonl(tmp_path / "prompts.jsonl", [{"id": "a", "prompt": "scenario:stall-stream"},
                                             {"id": "b", "prompt": "scenario:full"},
                                             {"id": "c", "prompt": "scenario:stall-stream"}])
    before = upstream.attempts["stall-stream"]
    cmd, env = cli(tmp_path, upstream.base_url, "--stream", "--concurrency", "2")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while upstream.attempts["stall-stream"] < before + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == {signal.SIGTERM: 143, signal.SIGINT: 130}[sig], err
    by = {line.obj["id"]: line.obj for line in read_jsonl(tmp_path / "out.jsonl")}
    assert sorted(by) == ["a", "b", "c"]
    assert by["b"]["status"] == "ok"
    for rid in ("a", "c"):
        assert by[rid]["error"]["kind"] == "interrupted" and sig.name in by[rid]["error"]["message"]
        assert by[rid]["response"]["choices"][0]["message"]["reasoning"]  # what had arrived
    assert json.loads(out)["signal"] == sig.name
    done, dropped = scan_output(tmp_path / "out.jsonl")
    assert set(done) == {by["b"]["key"]} and dropped == 2  # the next run redoes them


def test_the_exit_code_reflects_what_was_stored(upstream, tmp_path):
    write_jsonl(tmp_path / "prompts.jsonl", [{"id": "ok", "prompt": "scenario:full"}])
    cmd, env = cli(tmp_path, upstream.base_url)
    assert subprocess.run(cmd, env=env, capture_output=True, timeout=60).returncode == 0
    write_jsonl(tmp_path / "prompts.jsonl", [{"id": "ok", "prompt": "scenario:full"},
                                             {"id": "bad", "prompt": "scenario:echo-pct"}])
    r = subprocess.run(cmd, env=env, capture_output=True, timeout=60)
    assert r.returncode == 1
    assert b"failed attempts by reason: HTTP 400 x1" in r.stderr and key_fragments(r.stdout + r.stderr) == []


def test_an_unset_key_is_said_up_front(tmp_path):
    write_jsonl(tmp_path / "prompts.jsonl", [{"id": "a", "prompt": "x"}])
    cmd, env = cli(tmp_path, "https://openrouter.ai/api/v1", key=None)
    r = subprocess.run(cmd, env=env, capture_output=True, timeout=60)
    assert r.returncode == 2 and b"OPENROUTER_API_KEY is not set: openrouter.ai needs an API key" in r.stderr
    assert b"Traceback" not in r.stderr and not (tmp_path / "out.jsonl").exists()
    cmd, env = cli(tmp_path, "http://127.0.0.1:9/v1", "--max-attempts", "1", key=None)
    r = subprocess.run(cmd, env=env, capture_output=True, timeout=60)
    assert b"not set" not in r.stderr and r.returncode == 1  # a local server needs none: no word


def test_answer_shape_is_kept_as_given(upstream, tmp_path):
    _, by, _ = run(upstream, tmp_path, [{"id": "a", "prompt": "scenario:full"}], {"logprobs": True})
    assert json.dumps(by["a"]["response"]) == json.dumps(answer())


# ---- fuzzing: answer bodies, chunks, echoed keys


JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                       lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                           st.sampled_from(["choices", "delta", "index", "content", "tool_calls", "function",
                                            "arguments", "logprobs", "error", "usage", "id", "finish_reason",
                                            "reasoning_details", "text", "message"]), inner, max_size=5),
                       max_leaves=20)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(100, 599), st.binary(max_size=400) | JSONISH.map(lambda v: json.dumps(v).encode()))
def test_any_answer_body_is_classified_never_raised(status, body):
    outcome = classify_response(status, {}, body, Redactor(SECRET))
    assert outcome.kind in ("ok", "retry", "permanent", "fatal")


@settings(max_examples=300, deadline=None)
@given(st.lists(JSONISH, max_size=6))
def test_any_chunk_sequence_assembles_or_is_a_stream_error(chunks):
    asm = StreamAssembler()
    try:
        for chunk in chunks:
            asm.add(chunk)
    except StreamError:
        return
    json.dumps(asm.response())  # always JSON


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40), st.text(max_size=40), st.lists(st.sampled_from(["raw", "u", "uu", "pct", "PCT"]),
                                                           min_size=len(SECRET), max_size=len(SECRET)),
       st.integers(0, 400))
def test_an_echoed_key_in_any_mix_of_forms_never_survives_a_cut(before, after, forms, limit):
    def enc(c, form):
        return {"raw": c, "u": f"\\u{ord(c):04x}", "uu": f"\\\\u{ord(c):04X}", "pct": f"%{ord(c):02x}",
                "PCT": f"%{ord(c):02X}"}[form]
    text = before + "Bearer " + "".join(enc(c, f) for c, f in zip(SECRET, forms)) + after
    cut = Redactor(SECRET).cut(text, limit)
    assert key_fragments(cut.encode()) == [] and len(cut) <= limit + len("[REDACTED]")
    decoded = re.sub(r"%([0-9a-fA-F]{2})", lambda m: chr(int(m.group(1), 16)),
                     re.sub(r"\\+u([0-9a-fA-F]{4})", lambda m: chr(int(m.group(1), 16)), cut))
    assert key_fragments(decoded.encode()) == []  # no fragment in any form either


# ---- usage validated where it enters (#47)


@pytest.mark.parametrize("scenario, field", [("usage-negative", "usage.prompt_tokens is -5"),
                                             ("usage-string", "usage.completion_tokens is '7'"),
                                             ("usage-float", "usage.completion_tokens is 7.5"),
                                             ("usage-huge", "usage.completion_tokens is 1000000"),
                                             ("usage-bool", "usage.total_tokens is True")])
def test_usage_counts_that_are_not_counts_are_a_flagged_error_never_a_summed_ok(upstream, tmp_path, scenario, field):
    summary, by, _ = run(upstream, tmp_path, [{"id": "bad", "prompt": f"scenario:{scenario}"},
                                              {"id": "fine", "prompt": "scenario:full"}])
    rec = by["bad"]
    assert rec["status"] == "error" and rec["error"]["kind"] == "bad_usage" and field in rec["error"]["message"]
    assert rec["response"]["usage"]  # kept as it came, for a look
    assert summary["bad_usage"] == 1 and summary["ok"] == 1
    totals = summary["totals"]
    assert (totals["ok"], totals["errors"], totals["prompt_tokens"], totals["completion_tokens"]) == (1, 1, 12, 30)


def test_a_rerun_that_reuses_every_answer_says_they_are_ok(upstream, tmp_path):
    lines = [{"id": "a", "prompt": "scenario:full"}, {"id": "b", "prompt": "scenario:full"}]
    first, _, _ = run(upstream, tmp_path, lines)
    again, _, _ = run(upstream, tmp_path, lines)
    assert (first["ok"], first["ok_this_run"]) == (2, 2)
    assert (again["ok"], again["ok_this_run"], again["requested"], again["totals"]["ok"]) == (2, 0, 0, 2)


def test_an_earlier_runs_record_with_broken_usage_is_not_summed(upstream, tmp_path):
    from upstream_sse import answer as full

    bad = {"id": "old", "key": "k-old", "status": "ok", "error": None, "request": {},
           "response": {**full(), "usage": {"prompt_tokens": -5, "completion_tokens": "7"}}}
    (tmp_path / "out.jsonl").write_text(json.dumps(bad) + "\n")
    summary, _, _ = run(upstream, tmp_path, [{"id": "fine", "prompt": "scenario:full"}])
    totals = summary["totals"]
    assert (totals["ok"], totals["bad_usage"], totals["prompt_tokens"], totals["completion_tokens"]) == (1, 1, 12, 30)
