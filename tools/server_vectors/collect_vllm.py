"""Ask a real vLLM render server about the corpus and record its answers as test vectors.

Runs in the servers' environment (``make server-vectors`` builds it), never the kit's: it starts
``vllm launch render MODEL_DIR`` on 127.0.0.1 with the Kimi-K2 reasoning and tool parsers
(``VLLM_TARGET_DEVICE=cpu``, no GPU), renders every corpus request (``/v1/chat/completions/render``:
the prompt IDs) and derenders every corpus completion (``/v1/chat/completions/derender``) non-streaming
and streaming (seeded chunks of 1-4 tokens, one call per chunk carrying ``stream_state``), each with the
detokenizer's ``spaces_between_special_tokens`` on (vLLM's default) and off; then stops the server by PID.

    python collect_vllm.py --model-dir DIR --corpus corpus.jsonl --out tests/data/servers
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import httpx
from shared import assemble, write_vectors

SETTINGS = {"space": True, "nospace": False}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model_dir: str, port: int, log: Path) -> subprocess.Popen:
    cmd = [str(Path(sys.executable).with_name("vllm")), "launch", "render", model_dir, "--trust-remote-code",
           "--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2", "--enable-auto-tool-choice",
           "--host", "127.0.0.1", "--port", str(port)]
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def wait_ready(base: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"vllm render server exited with {proc.returncode} (see its log)")
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise SystemExit(f"vllm render server not ready after {timeout:.0f} s")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def message_of(msg: dict) -> dict:
    """The fields of an API message the vectors keep."""
    calls = [{"id": c.get("id"), "name": (c.get("function") or {}).get("name"),
              "arguments": (c.get("function") or {}).get("arguments")} for c in msg.get("tool_calls") or []]
    return {"reasoning": msg.get("reasoning"), "content": msg.get("content"), "tool_calls": calls}


def error_of(r: httpx.Response) -> dict:
    try:
        body = r.json()
        text = (body.get("error") or {}).get("message") if isinstance(body.get("error"), dict) else body.get("message")
    except ValueError:
        text = r.text
    return {"status": r.status_code, "error": str(text)[:300]}


class Client:
    def __init__(self, base: str, model: str) -> None:
        self.http = httpx.AsyncClient(base_url=base, timeout=120)
        self.model = model

    def chat_request(self, request: dict, spaces: bool, stream: bool) -> dict:
        return {"model": self.model, **request, "spaces_between_special_tokens": spaces, "stream": stream}

    async def render(self, request: dict) -> dict:
        r = await self.http.post("/v1/chat/completions/render", json={"model": self.model, **request})
        if r.status_code != 200:
            return error_of(r)
        return {"status": 200, "prompt_ids": r.json()["token_ids"]}

    async def derender(self, case: dict, prompt_ids: list[int], spaces: bool) -> dict:
        gen = {"request_id": case["case"], "output_mode": "tokens",
               "choices": [{"index": 0, "finish_reason": case["finish_reason"], "token_ids": case["completion_ids"]}]}
        body = {"generate_response": gen, "prompt_token_ids": prompt_ids,
                "chat_request": self.chat_request(case["request"], spaces, False)}
        r = await self.http.post("/v1/chat/completions/derender", json=body)
        if r.status_code != 200:
            return error_of(r)
        choice = r.json()["choices"][0]
        return {"status": 200, "message": message_of(choice["message"]), "finish_reason": choice["finish_reason"]}

    async def derender_stream(self, case: dict, prompt_ids: list[int], spaces: bool) -> dict:
        ids = case["completion_ids"]
        rng = random.Random(case["case"])
        state = None
        chunks: list[dict] = []
        pos = 0
        while pos < len(ids):
            step = rng.randint(1, 4)
            last = pos + step >= len(ids)
            choice = {"index": 0, "token_ids": ids[pos:pos + step],
                      "finish_reason": case["finish_reason"] if last else None}
            body = {"stream": True, "generate_chunk": {"request_id": case["case"], "output_mode": "tokens",
                                                        "choices": [choice]},
                    "stream_state": state, "prompt_token_ids": prompt_ids,
                    "chat_request": self.chat_request(case["request"], spaces, True)}
            r = await self.http.post("/v1/chat/completions/derender", json=body)
            if r.status_code != 200:
                return error_of(r)
            got = r.json()
            state = got["stream_state"]
            chunks.append(got["chunk"])
            pos += step
        return {"status": 200, **assemble(chunks)}


async def run_case(client: Client, case: dict, sem: asyncio.Semaphore) -> dict:
    async with sem:
        prompt = await client.render(case["request"])
        out = {"case": case["case"], "prompt": prompt}
        if case["kind"] != "answer":
            return out
        answers = {}
        if prompt["status"] == 200:
            for name, spaces in SETTINGS.items():
                answers[name] = await client.derender(case, prompt["prompt_ids"], spaces)
                answers["stream-" + name] = await client.derender_stream(case, prompt["prompt_ids"], spaces)
        out["answers"] = answers
        return out


async def collect(base: str, model: str, cases: list[dict], workers: int) -> list[dict]:
    client = Client(base, model)
    sem = asyncio.Semaphore(workers)
    results = await asyncio.gather(*(run_case(client, c, sem) for c in cases))
    await client.http.aclose()
    return list(results)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", required=True)
    p.add_argument("--corpus", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--workers", type=int, default=8)
    a = p.parse_args(argv)
    cases = [json.loads(line) for line in Path(a.corpus).read_text(encoding="utf-8").splitlines()]
    port = free_port()
    log = Path(a.out) / ".vllm-render.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    proc = start_server(a.model_dir, port, log)
    t0 = time.monotonic()
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc)
        started = time.monotonic() - t0
        results = asyncio.run(collect(f"http://127.0.0.1:{port}", a.model_dir, cases, a.workers))
    finally:
        stop_server(proc)
    meta = {"server": "vllm", "version": version("vllm"), "transformers": version("transformers"),
            "tokenizers": version("tokenizers"), "tiktoken": version("tiktoken"),
            "command": "vllm launch render MODEL_DIR --trust-remote-code --reasoning-parser kimi_k2 "
                       "--tool-call-parser kimi_k2 --enable-auto-tool-choice (VLLM_TARGET_DEVICE=cpu)",
            "settings": {"space": "spaces_between_special_tokens=true (default)",
                         "nospace": "spaces_between_special_tokens=false",
                         "stream-*": "streamed derender, seeded chunks of 1-4 tokens"},
            "chat_template": "the model dir's chat_template.jinja (K2.5)",
            "server_start_s": round(started, 1), "collect_s": round(time.monotonic() - t0 - started, 1)}
    write_vectors(Path(a.out), "vllm-0.33", cases, results, meta)
    n_ans = sum(1 for c in cases if c["kind"] == "answer")
    print(f"vllm {meta['version']}: {len(cases)} prompts, {n_ans} answer cases x {2 * len(SETTINGS)} variants "
          f"in {meta['collect_s']} s -> {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
