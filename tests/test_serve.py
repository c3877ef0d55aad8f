"""``kimi-eagle serve`` answers in the OpenRouter shape, logs the IDs it sampled, and injects faults on demand."""
import json
import time

import httpx
import pytest

from kimi_eagle.apps.api.faults import FaultConfig, FaultInjector
from kimi_eagle.apps.api.server import LocalServer
from kimi_eagle.assets import stories_dir
from kimi_eagle.engine.local import completion_text
from kimi_eagle.io import read_jsonl
from kimi_eagle.records import parse_engine_record

pytestmark = pytest.mark.timeout(180)
NO_FAULTS = FaultConfig().to_dict()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    records = tmp_path_factory.mktemp("serve") / "engine.jsonl"
    with LocalServer(stories_dir(), records, "--admin") as srv:
        srv.records_path = records
        yield srv
    assert srv.proc.poll() is not None, "the server process is stopped on exit"


def engine_records(server) -> dict[str, dict]:
    return {line.obj["id"]: line.obj for line in read_jsonl(server.records_path)}


def chat(server, messages, record_id=None, **params) -> httpx.Response:
    headers = {"X-Record-Id": record_id} if record_id else {}
    body = {"model": "stories260K", "messages": messages, **params}
    return httpx.post(server.base_url + "/chat/completions", json=body, headers=headers, timeout=60)


def test_the_server_states_its_plain_chat_format(server):
    card = httpx.get(server.base_url + "/models").json()["data"][0]
    assert card["id"] == "stories260K" and card["chat_format"] == "plain"
    assert card["bos_token_id"] == 1 and card["eos_token_ids"] == [2]


def test_keep_alive_replies_are_not_delayed_by_nagle(server):
    with httpx.Client(timeout=30) as client:
        client.get(server.base_url + "/models")
        times = []
        for _ in range(10):  # reused connection: Nagle + delayed ACK would add ~40 ms to every reply
            start = time.perf_counter()
            client.get(server.base_url + "/models")
            times.append(time.perf_counter() - start)
    assert min(times) < 0.03


def test_chat_completion_has_the_openrouter_shape_and_logs_the_sampled_ids(server, stories):
    messages = [{"role": "system", "content": "Once upon a time"}, {"role": "user", "content": ", there was"}]
    r = chat(server, messages, record_id="rec-1", temperature=1.0, seed=11, max_tokens=24)
    assert r.status_code == 200 and r.headers["x-chat-format"] == "plain"
    body = r.json()
    choice = body["choices"][0]
    assert body["provider"] == "kimi-eagle-local" and body["object"] == "chat.completion"
    assert choice["finish_reason"] == choice["native_finish_reason"] == "length"
    rec = engine_records(server)["rec-1"]
    assert rec["response_id"] == body["id"]
    assert parse_engine_record(rec).prompt_ids == [1] + stories.encode("Once upon a time, there was")
    assert body["usage"]["completion_tokens"] == len(rec["output_ids"]) == 24
    assert body["usage"]["prompt_tokens"] == len(rec["prompt_ids"])
    assert choice["message"]["content"] == completion_text(stories, rec["output_ids"], [2])
    assert rec["sampling"] == {"temperature": 1.0, "top_p": 1.0, "seed": 11, "max_tokens": 24}


def test_same_seed_same_completion(server):
    texts = {chat(server, [{"role": "user", "content": "Lily"}], seed=5, max_tokens=16).json()["choices"][0]["message"]["content"]
             for _ in range(2)}
    assert len(texts) == 1


def test_text_completions_endpoint(server, stories):
    r = httpx.post(server.base_url + "/completions", headers={"X-Record-Id": "rec-text"}, timeout=60,
                   json={"model": "stories260K", "prompt": "Once upon a time", "temperature": 0, "max_tokens": 12})
    body = r.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"].startswith(", there was a little girl named Lily")
    assert engine_records(server)["rec-text"]["prompt_ids"] == [1] + stories.encode("Once upon a time")


@pytest.mark.parametrize("body,status", [
    ({"model": "other-model", "messages": [{"role": "user", "content": "x"}]}, 400),
    ({"model": "stories260K", "messages": []}, 400),
    ({"model": "stories260K", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}, 400),
    ({"model": "stories260K", "messages": [{"role": "user", "content": "x"}], "stream_options": []}, 400),
    ({"model": "stories260K", "messages": [{"role": "user", "content": "x"}], "temperature": -2}, 400),
    ({"model": "stories260K", "messages": [{"role": "user", "content": "x"}], "provider": {"only": ["openai"]}}, 404),
    ({"model": "stories260K", "messages": [{"role": "user", "content": "x"}],
      "provider": {"order": ["openai"], "allow_fallbacks": False}}, 404),
])
def test_bad_requests_get_openrouter_errors_and_log_nothing(server, body, status):
    r = httpx.post(server.base_url + "/chat/completions", json=body, headers={"X-Record-Id": "bad"}, timeout=60)
    assert r.status_code == status and r.json()["error"]["code"] == status
    assert "bad" not in engine_records(server)


def test_provider_routing_that_includes_this_provider_is_served(server):
    r = chat(server, [{"role": "user", "content": "x"}], max_tokens=2,
             provider={"order": ["kimi-eagle-local"], "allow_fallbacks": False, "data_collection": "deny"})
    assert r.status_code == 200


def test_injected_faults(server):
    post = lambda: httpx.post(server.base_url + "/chat/completions", timeout=60, headers={"X-Record-Id": "faulty"},
                              json={"model": "stories260K", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4})
    try:
        server.admin("/admin/faults", {"rate_429": 1.0, "retry_after": 2})
        r = post()
        assert r.status_code == 429 and r.headers["retry-after"] == "2"
        for code in (500, 503):
            server.admin("/admin/faults", {f"rate_{code}": 1.0})
            assert post().status_code == code
        server.admin("/admin/faults", {"rate_truncate": 1.0})
        r = post()
        assert r.status_code == 200
        with pytest.raises(json.JSONDecodeError):
            json.loads(r.content)
        server.admin("/admin/faults", {"rate_drop": 1.0})
        with pytest.raises(httpx.RemoteProtocolError):
            post()
        server.admin("/admin/faults", {"rate_slow": 1.0, "slow_seconds": 0.6})
        start = time.perf_counter()
        assert post().status_code == 200
        assert time.perf_counter() - start >= 0.6
        assert server.admin("/admin/stats")["faults"]["slow"] == 1
    finally:
        server.admin("/admin/faults", NO_FAULTS)
    assert list(read_jsonl(server.records_path))[-1].obj["id"] == "faulty"  # only the delivered (slow) reply is logged
    assert sum(1 for line in read_jsonl(server.records_path) if line.obj["id"] == "faulty") == 1


def test_fault_config_is_validated(server):
    with pytest.raises(httpx.HTTPStatusError):
        server.admin("/admin/faults", {"rate_500": 0.8, "rate_503": 0.8})
    with pytest.raises(httpx.HTTPStatusError):
        server.admin("/admin/faults", {"no_such_fault": 1})


def test_fault_draws_are_seeded_and_429s_come_in_bursts():
    config = FaultConfig(rate_429=0.1, burst_429=3, rate_500=0.1, rate_drop=0.1, seed=4)
    a, b = FaultInjector(config), FaultInjector(config)
    kinds = [a.draw().kind for _ in range(300)]
    assert kinds == [b.draw().kind for _ in range(300)]
    runs = "".join("R" if k == "429" else "." for k in kinds).split(".")
    assert all(len(r) % 3 == 0 for r in runs) and any(runs)  # every burst is exactly 3 long (bursts may abut)
    assert {"500", "drop", None} <= set(kinds)

