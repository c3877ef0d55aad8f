"""``serve`` under oversized input: bodies over the limit are a JSON 413 before they are held, a prompt that cannot fit
the context is refused before tokenising, ``/health`` keeps answering meanwhile, and rejected prompts give their
memory back (issue 27, bullet 3)."""
from __future__ import annotations

import json
import random
import threading
import time

import httpx
import psutil
import pytest

from kimi_eagle.apps.api.server import MAX_BODY_BYTES, LocalServer, max_token_bytes
from kimi_eagle.assets import stories_dir

pytestmark = pytest.mark.timeout(300)
SENTENCE = "Once upon a time, there was a little girl named Lily. She loved to play outside in the sunshine. "
MB = 1 << 20


def big_chat(n_bytes: int) -> bytes:
    text = (SENTENCE * (n_bytes // len(SENTENCE) + 1))[:n_bytes]
    return json.dumps({"model": "stories260K", "messages": [{"role": "user", "content": text}], "max_tokens": 4}).encode()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with LocalServer(stories_dir(), tmp_path_factory.mktemp("serve-bounds") / "engine.jsonl") as srv:
        srv.root = srv.base_url.removesuffix("/v1")
        yield srv


def ok_chat(server) -> httpx.Response:
    return httpx.post(server.base_url + "/chat/completions", timeout=60, json={
        "model": "stories260K", "messages": [{"role": "user", "content": "Once upon a time"}], "max_tokens": 4})


class HealthPoller(threading.Thread):
    """Polls ``/health`` until stopped; the longest wait and any non-200."""

    def __init__(self, root: str) -> None:
        super().__init__(daemon=True)
        self.root, self.stop, self.latencies, self.bad = root, threading.Event(), [], 0

    def run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self.stop.is_set():
                t0 = time.perf_counter()
                try:
                    self.bad += client.get(self.root + "/health").status_code != 200
                except httpx.HTTPError:
                    self.bad += 1
                self.latencies.append(time.perf_counter() - t0)
                time.sleep(0.05)


def test_health_answers_while_a_large_rejected_prompt_is_in_flight(server):
    poller = HealthPoller(server.root)
    poller.start()
    time.sleep(0.2)
    before = len(poller.latencies)
    for route, body in (("/chat/completions", big_chat(15_000_000)),
                        ("/completions", json.dumps({"model": "stories260K", "prompt": SENTENCE * 150_000}).encode())):
        r = httpx.post(server.base_url + route, content=body, headers={"Content-Type": "application/json"}, timeout=120)
        assert r.status_code == 400 and "the context length is 512" in r.json()["error"]["message"]
    poller.stop.set()
    poller.join(timeout=40)
    assert len(poller.latencies) > before and poller.bad == 0
    assert max(poller.latencies) < 2.0, max(poller.latencies)  # unbounded before: 15-45 s per 15 MB prompt
    assert ok_chat(server).status_code == 200


@pytest.mark.parametrize("kind", ["content-length", "chunked"])
def test_a_body_over_the_limit_gets_a_json_413_and_the_server_keeps_answering(server, kind):
    if kind == "content-length":
        content = b"x" * (MAX_BODY_BYTES + 1)
    else:  # no Content-Length: the cap is found while reading
        content = (b"y" * MB for _ in range(MAX_BODY_BYTES // MB + 2))
    r = httpx.post(server.base_url + "/chat/completions", content=content, timeout=60,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    assert r.json()["error"] == {"code": 413, "message": r.json()["error"]["message"]}
    assert str(MAX_BODY_BYTES) in r.json()["error"]["message"]
    assert httpx.get(server.root + "/health", timeout=10).status_code == 200
    assert ok_chat(server).status_code == 200


def test_memory_after_ten_rejected_15_mb_prompts_stays_bounded(server):
    """Idle RSS ~350 MB. One prompt in flight holds its body, the parsed string and its UTF-8 copy (~15 MB each)
    plus allocator slack, so the peak stays under idle + 400 MB and what is left after ten under idle + 200 MB.
    Before the fix one rejected 15 MB prompt peaked at ~+2.2 GB and left ~+330 MB each (never given back)."""
    proc = psutil.Process(server.pid)
    idle = proc.memory_info().rss
    peak, stop = [idle], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    body = big_chat(15_000_000)
    with httpx.Client(timeout=120) as client:
        statuses = [client.post(server.base_url + "/chat/completions", content=body,
                                headers={"Content-Type": "application/json"}).status_code for _ in range(10)]
    time.sleep(0.5)
    stop.set()
    sampler.join(timeout=10)
    final = proc.memory_info().rss
    assert statuses == [400] * 10
    assert peak[0] < idle + 400 * MB, (idle // MB, peak[0] // MB)
    assert final < idle + 200 * MB, (idle // MB, final // MB)
    assert ok_chat(server).status_code == 200


def test_a_prompt_that_fits_is_never_refused_by_the_byte_bound(server, stories):
    """The early refusal rests on each token spelling at most ``max_token_bytes`` bytes: checked against real
    tokenisations, and a prompt just inside the context is still answered."""
    tok = stories
    per_token = max_token_bytes(tok)
    assert per_token == max(len(b) for b in tok.token_table)
    rng = random.Random(0)
    for _ in range(50):
        text = "".join(rng.choice([SENTENCE, "ü€😀 ", "\u0378x", "zzzz", " "]) for _ in range(rng.randint(1, 40)))
        assert len(tok.encode(text)) >= -(-len(text.encode()) // per_token)
    text = SENTENCE * 3  # ~90 tokens, far under 512
    r = httpx.post(server.base_url + "/chat/completions", timeout=60, json={
        "model": "stories260K", "messages": [{"role": "user", "content": text}], "max_tokens": 2})
    assert r.status_code == 200
