"""Ask a real vLLM render server about the corpus and record its answers as test vectors.

Runs in the servers' environment (``make server-vectors`` builds it), never the kit's: it starts
``vllm launch render MODEL_DIR`` on 127.0.0.1 with the Kimi-K2 reasoning and tool parsers
(``VLLM_TARGET_DEVICE=cpu``, no GPU), renders every corpus request (``/v1/chat/completions/render``:
the prompt IDs) and derenders every corpus completion (``/v1/chat/completions/derender``) non-streaming
and streaming (seeded chunks of 1-4 tokens, one call per chunk carrying ``stream_state``), each with the
detokenizer's ``spaces_between_special_tokens`` on (vLLM's default) and off; then stops the server by PID.

    python collect_vllm.py --model-dir DIR --corpus corpus.jsonl --out tests/data/servers

With ``--requests REQUESTS.jsonl[.gz]`` (``outside_requests.py``: requests nobody here wrote) it also renders every
request of that corpus and records the prompt IDs or the refusal (HTTP status, the server's message verbatim)
in ``OUT/vllm-<major>.<minor>.requests.jsonl.gz``. Output files are named by the vLLM version installed.
On x86 without triton-cpu, vLLM 0.34's render server exits at start unless ``CUDA_VISIBLE_DEVICES=""``
("vLLM on x86 CPUs requires Triton (triton-cpu)"); without ``VLLM_TARGET_DEVICE=cpu`` it cannot infer a
device: both are set for the server process.
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
from shared import assemble, expand_requests, profile_stem, read_jsonl, write_request_vectors, write_vectors

MAX_ERROR_CHARS = 4000  # a refusal's message is kept verbatim up to this length (pydantic echoes whole inputs)
DROPPED_KEYS = ("stream", "stream_options")  # rendering is the same; vLLM refuses stream_options without stream

SETTINGS = {"space": True, "nospace": False}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model_dir: str, port: int, log: Path) -> subprocess.Popen:
    cmd = [str(Path(sys.executable).with_name("vllm")), "launch", "render", model_dir, "--trust-remote-code",
           "--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2", "--enable-auto-tool-choice",
           "--host", "127.0.0.1", "--port", str(port)]
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1"}
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


def verbatim_error_of(r: httpx.Response) -> dict:
    """A refusal as the server sent it: its status and message (``error.message``, or the body), verbatim."""
    try:
        body = r.json()
        err = body.get("error") if isinstance(body, dict) else None
        text = err.get("message") if isinstance(err, dict) else (body.get("message") if isinstance(body, dict)
                                                                 else None)
        if text is None:
            text = r.text
    except ValueError:
        text = r.text
    text = str(text)
    out = {"status": r.status_code, "error": text[:MAX_ERROR_CHARS]}
    if len(text) > MAX_ERROR_CHARS:
        out["error_chars"] = len(text)
    return out


def request_body(request: dict, model: str) -> bytes:
    """The client's request as JSON text (ASCII escapes, so lone surrogates travel as ``\\uD800``), the model
    name replaced by the served one and the streaming keys dropped."""
    body = {k: v for k, v in request.items() if k not in DROPPED_KEYS}
    body["model"] = model
    return json.dumps(body, ensure_ascii=True).encode("ascii")


class Client:
    def __init__(self, base: str, model: str) -> None:
        self.http = httpx.AsyncClient(base_url=base, timeout=120)
        self.model = model

    def chat_request(self, request: dict, spaces: bool, stream: bool) -> dict:
        return {"model": self.model, **request, "spaces_between_special_tokens": spaces, "stream": stream}

    async def render_outside(self, row: dict) -> dict:
        """One corpus request rendered, or the refusal verbatim."""
        try:
            r = await self.http.post("/v1/chat/completions/render", content=request_body(row["request"], self.model),
                                     headers={"content-type": "application/json"})
        except httpx.HTTPError as e:
            return {"id": row["id"], "status": 0, "error": f"client error: {type(e).__name__}: {e}"}
        if r.status_code != 200:
            return {"id": row["id"], **verbatim_error_of(r)}
        return {"id": row["id"], "status": 200, "prompt_ids": r.json()["token_ids"]}

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


async def collect_requests(base: str, model: str, rows: list[dict], workers: int) -> list[dict]:
    client = Client(base, model)
    sem = asyncio.Semaphore(workers)

    async def one(row):
        async with sem:
            return await client.render_outside(row)

    results = await asyncio.gather(*(one(r) for r in rows))
    await client.http.aclose()
    return list(results)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", required=True)
    p.add_argument("--corpus", help="the kit's seeded corpus (corpus.py): answers and prompts")
    p.add_argument("--requests", help="the outside request corpus (outside_requests.py)")
    p.add_argument("--out", required=True)
    p.add_argument("--workers", type=int, default=8)
    a = p.parse_args(argv)
    if not a.corpus and not a.requests:
        p.error("give --corpus, --requests or both")
    cases = [json.loads(line) for line in Path(a.corpus).read_text(encoding="utf-8").splitlines()] if a.corpus else []
    corpus_lines = read_jsonl(Path(a.requests)) if a.requests else []
    rows = expand_requests(corpus_lines)
    corpus_meta = next((line["meta"] for line in corpus_lines if "meta" in line), {})
    port = free_port()
    log = Path(a.out) / ".vllm-render.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    proc = start_server(a.model_dir, port, log)
    t0 = time.monotonic()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc)
        started = time.monotonic() - t0
        t1 = time.monotonic()
        results = asyncio.run(collect(base, a.model_dir, cases, a.workers)) if cases else []
        collect_s = time.monotonic() - t1
        t2 = time.monotonic()
        outside = asyncio.run(collect_requests(base, a.model_dir, rows, a.workers)) if rows else []
        requests_s = time.monotonic() - t2
    finally:
        stop_server(proc)
    stem = profile_stem("vllm", version("vllm"))
    config = json.loads((Path(a.model_dir) / "config.json").read_text(encoding="utf-8"))
    meta = {"server": "vllm", "version": version("vllm"), "transformers": version("transformers"),
            "tokenizers": version("tokenizers"), "tiktoken": version("tiktoken"),
            "model_type": config.get("model_type"), "architectures": config.get("architectures"),
            "command": "vllm launch render MODEL_DIR --trust-remote-code --reasoning-parser kimi_k2 "
                       "--tool-call-parser kimi_k2 --enable-auto-tool-choice "
                       "(VLLM_TARGET_DEVICE=cpu CUDA_VISIBLE_DEVICES=\"\")",
            "settings": {"space": "spaces_between_special_tokens=true (default)",
                         "nospace": "spaces_between_special_tokens=false",
                         "stream-*": "streamed derender, seeded chunks of 1-4 tokens"},
            "chat_template": "the model dir's chat_template.jinja (K2.5)",
            "server_start_s": round(started, 1), "collect_s": round(collect_s, 1)}
    if cases:
        write_vectors(Path(a.out), stem, cases, results, meta)
        n_ans = sum(1 for c in cases if c["kind"] == "answer")
        print(f"vllm {meta['version']}: {len(cases)} prompts, {n_ans} answer cases x {2 * len(SETTINGS)} variants "
              f"in {meta['collect_s']} s -> {a.out}/{stem}.*", file=sys.stderr)
    if rows:
        rmeta = {**{k: v for k, v in meta.items() if k not in ("settings", "collect_s")},
                 "endpoint": "/v1/chat/completions/render",
                 "request_changes": "model set to MODEL_DIR; stream and stream_options removed; sent as ASCII JSON",
                 "max_error_chars": MAX_ERROR_CHARS, "corpus": corpus_meta, "corpus_file": Path(a.requests).name,
                 "render_s": round(requests_s, 1)}
        path = write_request_vectors(Path(a.out), stem, rows, outside, rmeta)
        n_ok = sum(1 for r in outside if r["status"] == 200)
        print(f"vllm {meta['version']}: {len(rows)} outside requests, {n_ok} rendered, {len(rows) - n_ok} refused "
              f"in {rmeta['render_s']} s -> {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
