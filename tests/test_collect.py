"""``kimi-eagle collect`` ends every prompt with exactly one stored response or one permanent error,
survives injected faults and a kill, and never writes the API key anywhere."""
import email.utils
import json
import os
import subprocess
import sys
import time
import uuid

import pytest

from kimi_eagle.apps.api.collect import (
    CollectConfig,
    Collector,
    classify_response,
    collect,
    load_prompts,
    parse_retry_after,
    provider_options,
    request_key,
    scan_output,
)
from kimi_eagle.apps.api.faults import FaultConfig
from kimi_eagle.apps.api.server import LocalServer
from kimi_eagle.assets import stories_dir
from kimi_eagle.diff.inputs import delivered_engine_records
from kimi_eagle.engine.local import completion_text
from kimi_eagle.io import read_jsonl

pytestmark = pytest.mark.timeout(240)
SECRET = f"sk-or-v1-test-{uuid.uuid4().hex}"
KEY_ENV = "KIMI_EAGLE_TEST_SERVER_KEY"
NO_FAULTS = FaultConfig().to_dict()


# ---- units


def test_classify_response_replies():
    ok = json.dumps({"choices": [{"message": {"content": "hi"}}]}).encode()
    assert classify_response(200, {}, ok).kind == "ok"
    assert classify_response(200, {}, ok[: len(ok) // 2]).kind == "retry"  # truncated JSON
    assert classify_response(200, {}, b'{"choices": []}').kind == "retry"
    assert classify_response(200, {}, b'{"error": {"code": 502, "message": "provider down"}}').kind == "retry"
    assert classify_response(200, {}, b'{"error": {"code": 400, "message": "bad"}}').kind == "permanent"
    for status in (408, 429, 500, 502, 503, 504, 524):
        assert classify_response(status, {}, b"{}").kind == "retry"
    for status in (400, 403, 404, 413, 422):
        assert classify_response(status, {}, b'{"error": {"code": 400}}').kind == "permanent"
    assert classify_response(401, {}, b"").kind == classify_response(402, {}, b"").kind == "fatal"
    assert classify_response(429, {"retry-after": "3"}, b"").retry_after == 3.0


def test_retry_after_in_seconds_dates_and_openrouter_reset():
    now = 1_800_000_000.0
    assert parse_retry_after({"retry-after": "1.5"}, now) == 1.5
    assert parse_retry_after({"retry-after": email.utils.formatdate(now + 30, usegmt=True)}, now) == pytest.approx(30)
    assert parse_retry_after({"x-ratelimit-reset": str(int((now + 4) * 1000))}, now) == pytest.approx(4)
    assert parse_retry_after({}, now) is None


def test_backoff_is_exponential_jittered_capped_and_honours_retry_after():
    c = Collector(CollectConfig("http://x", "m", backoff_base=1.0, backoff_max=8.0, max_retry_after=60))
    for failures, (lo, hi) in {1: (0.5, 1), 2: (1, 2), 3: (2, 4), 4: (4, 8), 9: (4, 8)}.items():
        waits = [c.backoff(failures, None) for _ in range(200)]
        assert lo <= min(waits) and max(waits) <= hi and len(set(waits)) > 100
    assert c.backoff(1, 20.0) == 20.0
    assert c.backoff(1, 1e6) == 60  # an absurd Retry-After is capped


def test_prompt_lines_become_requests_and_bad_lines_are_kept(tmp_path):
    path = tmp_path / "p.jsonl"
    lines = [
        json.dumps({"id": "a", "prompt": "hi", "temperature": 0.5}),
        json.dumps({"messages": [{"role": "user", "content": "yo"}], "dataset": "d"}),
        json.dumps({"id": "c", "request": {"model": "other", "messages": [{"role": "user", "content": "x"}]}}),
        "{not json",
        json.dumps({"id": "a", "prompt": "dup"}),
        json.dumps({"id": "e", "messages": []}),
    ]
    path.write_text("\n".join(lines) + "\n")
    prompts = load_prompts(path, "m", {"temperature": 1.0, "max_tokens": 9, "provider": {"only": ["x"]}})
    assert [p.id for p in prompts] == ["a", "line-2", "c", "line-4", "a@line-5", "e"]
    a, b, c = (p.request for p in prompts[:3])
    assert a == {"model": "m", "temperature": 0.5, "max_tokens": 9, "provider": {"only": ["x"]},
                 "messages": [{"role": "user", "content": "hi"}]}
    assert prompts[1].dataset == "d" and "dataset" not in b
    assert c["model"] == "other"
    assert [p.error is not None for p in prompts] == [False, False, False, True, True, True]
    assert "duplicate id" in prompts[4].error
    assert len({p.key for p in prompts}) == 6
    assert request_key("a", a) == prompts[0].key != request_key("a", {**a, "seed": 1})


def test_provider_options():
    assert provider_options(order="a, b", allow_fallbacks=False, data_collection="deny", quantizations="fp8") == {
        "order": ["a", "b"], "quantizations": ["fp8"], "allow_fallbacks": False, "data_collection": "deny"}
    with pytest.raises(ValueError, match="unknown provider"):
        provider_options(extra={"nope": 1})


def test_resume_scan_keeps_finished_records_and_drops_the_rest(tmp_path):
    out = tmp_path / "out.jsonl"
    rec = lambda key, status, kind=None: json.dumps(
        {"id": key, "key": key, "status": status, "error": {"kind": kind} if kind else None}) + "\n"
    out.write_text(rec("k1", "ok") + rec("k2", "error", "permanent") + rec("k3", "error", "exhausted")
                   + rec("k1", "ok") + '{"id": "k4", "key": "k4", "sta')
    done, dropped = scan_output(out)
    assert set(done) == {"k1", "k2"} and dropped == 3
    assert out.read_text() == rec("k1", "ok") + rec("k2", "error", "permanent")  # rewritten atomically
    assert scan_output(out) == (done, 0)
    assert set(scan_output(out, retry_errors=True)[0]) == {"k1"}


# ---- against the local server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    records = tmp_path_factory.mktemp("collect-serve") / "engine.jsonl"
    with LocalServer(stories_dir(), records, "--admin", "--api-key-env", KEY_ENV, env={KEY_ENV: SECRET}) as srv:
        srv.records_path = records
        yield srv


def write_prompts(path, n, extra=()):
    names = ["Lily", "Tom", "Sue", "Ben", "Max"]
    lines = [json.dumps({"id": f"p{i}", "prompt": f"Once upon a time, {names[i % 5]}", "seed": i}) for i in range(n)]
    path.write_text("\n".join([*lines, *extra]) + "\n")


def by_id(path) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for line in read_jsonl(path):
        out.setdefault(line.obj["id"], []).append(line.obj)
    return out


def test_every_prompt_ends_with_one_response_or_one_permanent_error_under_faults(server, tmp_path, stories):
    prompts, out = tmp_path / "prompts.jsonl", tmp_path / "out.jsonl"
    write_prompts(prompts, 40, [
        "this line is not JSON",
        json.dumps({"id": "wrong-model", "prompt": "x", "model": "no/such-model"}),
        json.dumps({"id": "routed-away", "prompt": "x", "provider": {"only": ["someone-else"]}}),
    ])
    faults = dict(rate_429=0.08, burst_429=2, retry_after=0.2, rate_500=0.08, rate_503=0.08, rate_truncate=0.08,
                  rate_drop=0.08, rate_slow=0.06, slow_seconds=4.0, seed=3)
    server.admin("/admin/faults", faults)
    config = CollectConfig(server.base_url, "stories260K", concurrency=6, max_attempts=25, timeout=2.5,
                           backoff_base=0.02, backoff_max=0.3, defaults={"max_tokens": 8, "temperature": 1.0},
                           progress=False)
    try:
        summary = collect(prompts, out, config, api_key=SECRET)
    finally:
        stats = server.admin("/admin/stats")
        server.admin("/admin/faults", NO_FAULTS)
    assert all(stats["faults"][k] > 0 for k in ("429", "500", "503", "truncate", "drop", "slow")), stats
    records = by_id(out)
    assert sorted(records) == sorted([f"p{i}" for i in range(40)] + ["line-41", "wrong-model", "routed-away"])
    assert all(len(v) == 1 for v in records.values())
    assert summary["ok"] == 40 and summary["permanent"] == 2 and summary["bad_prompt"] == 1 and summary["retries"] > 0
    assert summary["totals"]["completion_tokens"] == 40 * 8
    assert records["wrong-model"][0]["error"]["http_status"] == 400
    assert records["routed-away"][0]["error"]["http_status"] == 404
    statuses = [a["status"] for a in records["wrong-model"][0]["timing"]["attempt_log"]]
    assert statuses[-1] == 400 and statuses.count(400) == 1  # permanent: not retried (earlier tries met faults)
    delivered = {r["response_id"]: r for r in delivered_engine_records(server.records_path, out)}
    assert len(delivered) == 40
    for i in range(40):
        rec = records[f"p{i}"][0]
        assert rec["status"] == "ok" and rec["request"]["seed"] == i
        assert len(rec["timing"]["attempt_log"]) == rec["timing"]["attempts"]
        logged = delivered[rec["response"]["id"]]  # the engine record of exactly this delivered response
        assert logged["id"] == f"p{i}" and logged["sampling"]["seed"] == i
        assert rec["response"]["choices"][0]["message"]["content"] == completion_text(stories, logged["output_ids"], [2])


def test_killing_the_collector_and_resuming_loses_and_duplicates_nothing(server, tmp_path):
    prompts, out = tmp_path / "prompts.jsonl", tmp_path / "out.jsonl"
    write_prompts(prompts, 40)
    server.admin("/admin/faults", dict(rate_slow=0.5, slow_seconds=0.4, rate_503=0.1, seed=1))
    cmd = [sys.executable, "-m", "kimi_eagle", "collect", str(prompts), "-o", str(out), "--base-url", server.base_url,
           "--model", "stories260K", "--concurrency", "3", "--max-tokens", "6", "--backoff-base", "0.05"]
    env = {**os.environ, "OPENROUTER_API_KEY": SECRET}
    logs = []
    try:
        first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 90
        while (not out.exists() or len(out.read_bytes().splitlines()) < 8) and time.monotonic() < deadline:
            assert first.poll() is None, "the collector finished before it could be killed"
            time.sleep(0.05)
        first.kill()  # SIGKILL by PID: no chance to clean up
        logs += first.communicate(timeout=30)
        assert first.returncode == -9
        with open(out, "a") as f:
            f.write('{"id": "p39", "key": "torn')  # and a torn last line, as a kill mid-write leaves
        before = {rid: recs[0] for rid, recs in by_id_complete(out).items()}
        assert 8 <= len(before) < 40
        second = subprocess.run(cmd, env=env, capture_output=True, timeout=180)
        logs += [second.stdout, second.stderr]
        assert second.returncode == 0, second.stderr.decode()[-2000:]
    finally:
        server.admin("/admin/faults", NO_FAULTS)
    summary = json.loads(second.stdout)
    assert summary["already_done"] == len(before) and summary["requested"] == 40 - len(before)
    assert summary["dropped_on_resume"] == 1
    records = by_id(out)
    assert sorted(records) == sorted(f"p{i}" for i in range(40))
    assert all(len(v) == 1 and v[0]["status"] == "ok" for v in records.values())
    assert all(records[rid][0] == rec for rid, rec in before.items())  # finished work was kept, not redone
    scanned = [out.read_bytes(), (tmp_path / "out.jsonl.summary.json").read_bytes(), *logs]
    assert all(SECRET.encode() not in blob for blob in scanned)


def by_id_complete(path) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for line in read_jsonl(path):
        if line.error is None:
            out.setdefault(line.obj["id"], []).append(line.obj)
    return out


def test_a_rejected_key_stops_the_run_and_stores_nothing(server, tmp_path):
    prompts, out = tmp_path / "prompts.jsonl", tmp_path / "out.jsonl"
    write_prompts(prompts, 5)
    wrong = "sk-or-v1-wrong-" + uuid.uuid4().hex
    env = {**os.environ, "OPENROUTER_API_KEY": wrong}
    r = subprocess.run([sys.executable, "-m", "kimi_eagle", "collect", str(prompts), "-o", str(out),
                        "--base-url", server.base_url, "--model", "stories260K", "--no-progress"],
                       env=env, capture_output=True, timeout=120)
    assert r.returncode == 3 and b"HTTP 401" in r.stderr
    assert out.read_text() == ""  # nothing stored, so the next run (with a good key) does everything
    assert wrong.encode() not in r.stdout + r.stderr + (tmp_path / "out.jsonl.summary.json").read_bytes()


def test_the_collect_notebook_never_writes_the_key(tmp_path):
    from kimi_eagle.apps.batch.notebooks import NOTEBOOK_DIR, execute

    os.environ["OPENROUTER_API_KEY"] = SECRET  # the kernel inherits it, as it would a real key
    try:
        executed = execute(NOTEBOOK_DIR / "00_collect.ipynb", tmp_path, {"limit": 4, "max_tokens": 8})
    finally:
        del os.environ["OPENROUTER_API_KEY"]
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert executed in files and len(files) >= 3
    assert all(SECRET.encode() not in p.read_bytes() for p in files)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["ok"] == 4
