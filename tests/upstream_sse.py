"""A real HTTP upstream for collect's tests (starlette + uvicorn in a thread, on a free port): it answers
``/v1/chat/completions`` from one fixed answer, as JSON or -- for ``stream: true`` -- as OpenRouter-shaped SSE
chunks, and misbehaves as the last user message names (``scenario:NAME``; see ``Upstream.reply``)."""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections import Counter
from typing import Any

ARGS = '{"city": "Paris", "unit": "celsius"}'
CONTENT = "Once upon a time, Lily found a shiny stone. "
REASONING = "The user wants a story; I will keep it short."


BAD_USAGE = {"usage-negative": {"prompt_tokens": -5}, "usage-string": {"completion_tokens": "7"},
             "usage-float": {"completion_tokens": 7.5}, "usage-huge": {"completion_tokens": 10**40},
             "usage-bool": {"total_tokens": True}}


def answer(record_id: str = "gen-test-1") -> dict[str, Any]:
    """The non-streaming answer, keys in OpenRouter's order (as ``kimi-eagle serve`` writes them)."""
    tokens = ["Once", " upon", " a", " time", ",", " Lily", " found", " a", " shiny", " stone", ". "]
    logprobs = {"content": [{"token": t, "logprob": -0.25 * i, "bytes": list(t.encode()),
                             "top_logprobs": [{"token": t, "logprob": -0.25 * i, "bytes": list(t.encode())}]}
                            for i, t in enumerate(tokens)], "refusal": None}
    message = {"role": "assistant", "content": CONTENT, "refusal": None, "reasoning": REASONING,
               "reasoning_details": [{"type": "reasoning.text", "text": REASONING, "format": "unknown", "index": 0}],
               "tool_calls": [{"id": "functions.get_weather:0", "type": "function",
                               "function": {"name": "get_weather", "arguments": ARGS}}]}
    return {"id": record_id, "provider": "Test", "model": "m", "object": "chat.completion", "created": 1_800_000_000,
            "choices": [{"logprobs": logprobs, "finish_reason": "tool_calls", "native_finish_reason": "tool_calls",
                         "index": 0, "message": message}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 30, "total_tokens": 42, "cost": 0.00012,
                      "prompt_tokens_details": {"cached_tokens": 4},
                      "completion_tokens_details": {"reasoning_tokens": 11}}}


def pieces(text: str, n: int) -> list[str]:
    step = max(1, -(-len(text) // n))
    return [text[i:i + step] for i in range(0, len(text), step)]


def stream_chunks(full: dict[str, Any], usage_in_last: bool = True) -> list[dict[str, Any]]:
    """``full`` as the chunks OpenRouter sends: role chunk, reasoning and reasoning_details deltas, content deltas
    with their logprobs, the tool call (id and name first, argument fragments after), the finish chunk, usage."""
    choice, message = full["choices"][0], full["choices"][0]["message"]
    head = {k: full[k] for k in ("id", "provider", "model")}
    tail = {"object": "chat.completion.chunk", "created": full["created"]}

    def chunk(delta: dict, finish: str | None = None, logprobs: Any = None, **extra: Any) -> dict:
        return {**head, **tail, "choices": [{"index": 0, "delta": delta, "finish_reason": finish,
                                             "native_finish_reason": finish, "logprobs": logprobs}], **extra}

    out = [chunk({"role": "assistant", "content": "", "refusal": None})]
    for part in pieces(message["reasoning"], 3):
        out.append(chunk({"role": "assistant", "content": "", "reasoning": part,
                          "reasoning_details": [{"type": "reasoning.text", "text": part, "format": "unknown",
                                                 "index": 0}]}))
    entries = choice["logprobs"]["content"]
    for entry in entries:
        out.append(chunk({"content": entry["token"]}, logprobs={"content": [entry], "refusal": None}))
    call = message["tool_calls"][0]
    out.append(chunk({"tool_calls": [{"index": 0, "id": call["id"], "type": "function",
                                      "function": {"name": call["function"]["name"], "arguments": ""}}]}))
    for part in pieces(call["function"]["arguments"], 4):
        out.append(chunk({"tool_calls": [{"index": 0, "function": {"arguments": part}}]}))
    out.append(chunk({"content": ""}, finish=choice["finish_reason"]))
    if usage_in_last:
        out.append({**head, **tail, "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": None,
                                                 "native_finish_reason": None, "logprobs": None}],
                    "usage": full["usage"]})
    return out


def sse(chunks: list[dict], keepalive_every: int = 0) -> list[bytes]:
    events = []
    for i, c in enumerate(chunks):
        if keepalive_every and i % keepalive_every == 0:
            events.append(b": OPENROUTER PROCESSING\n\n")
        events.append(b"data: " + json.dumps(c).encode() + b"\n\n")
    return events + [b"data: [DONE]\n\n"]


class Upstream:
    """The server; ``attempts`` counts requests per scenario; ``secret`` is what it echoes for ``echo-*``."""

    def __init__(self, secret: str = "") -> None:
        import uvicorn
        from starlette.applications import Starlette
        from starlette.routing import Route

        self.secret = secret
        self.attempts: Counter[str] = Counter()
        self.record_ids: list[str] = []  # the X-Record-Id headers, as received
        app = Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"])])
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="critical", timeout_keep_alive=30))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> "Upstream":
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    async def chat(self, request: Any) -> Any:
        body = json.loads(await request.body())
        scenario = body["messages"][-1]["content"].removeprefix("scenario:")
        self.attempts[scenario] += 1
        self.record_ids.append(request.headers.get("x-record-id"))
        return self.reply(scenario, self.attempts[scenario], bool(body.get("stream")))

    def reply(self, scenario: str, attempt: int, stream: bool) -> Any:
        from starlette.responses import JSONResponse, Response, StreamingResponse

        full = answer()
        events = sse(stream_chunks(full), keepalive_every=3 if scenario == "keepalive" else 0)
        if scenario in ("cut-once", "cut-always") and (attempt == 1 or scenario == "cut-always"):
            return StreamingResponse(_cut(events[: len(events) // 2]), media_type="text/event-stream")
        if scenario in ("error-once", "error-400") and (attempt == 1 or scenario == "error-400"):
            code = 502 if scenario == "error-once" else 400
            error = {**{k: full[k] for k in ("id", "provider", "model")}, "object": "chat.completion.chunk",
                     "created": full["created"], "error": {"code": code, "message": "provider disconnected"},
                     "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "error",
                                  "native_finish_reason": "error"}]}
            return StreamingResponse(_plain(events[:8] + [b"data: " + json.dumps(error).encode() + b"\n\n",
                                                          b"data: [DONE]\n\n"]), media_type="text/event-stream")
        if scenario == "surrogate":  # a cut emoji: JSON may hold a lone surrogate escape, UTF-8 cannot
            text = json.dumps(full).replace(json.dumps(CONTENT), '"a cut emoji \\ud83d here"')
            return Response(text.encode(), media_type="application/json")
        if scenario in BAD_USAGE:  # usage counts that are not counts
            full["usage"] = {**full["usage"], **BAD_USAGE[scenario]}
            return Response(json.dumps(full).encode(), media_type="application/json")
        if scenario == "stall-stream":  # a few chunks, then silence (until the client gives up)
            return StreamingResponse(_stall(events[:6]), media_type="text/event-stream")
        if scenario == "endless":
            return StreamingResponse(_endless(), media_type="application/json")
        if scenario == "slow":
            return StreamingResponse(_slow(json.dumps(full).encode()), media_type="application/json")
        if scenario == "retry-after" and attempt == 1:
            return JSONResponse({"error": {"code": 429, "message": "slow down"}}, status_code=429,
                                headers={"Retry-After": "99999"})
        if scenario.startswith("echo-"):
            body = json.dumps({"error": {"code": 400, "message": self.echo(scenario)}})
            if scenario == "echo-u":  # the first letter as a JSON escape in the body itself
                body = body.replace(json.dumps("bad key: " + self.secret)[1:-1], "bad key: \\u0073" + self.secret[1:])
            return Response(body.encode(), status_code=400, media_type="application/json")
        if stream:
            return StreamingResponse(_plain(events), media_type="text/event-stream")
        return Response(json.dumps(full).encode(), media_type="application/json")

    def echo(self, scenario: str) -> str:
        """An error message quoting the key: cut by collect's 300-character snippet inside it (``echo-split``),
        with its first letter as a ``\\u0073`` JSON escape in the body (``echo-u``), or percent-encoded (``echo-pct``)."""
        if scenario == "echo-split":
            prefix = '{"error": {"code": 400, "message": "'  # as json.dumps writes the body (see reply)
            pad = "x" * (300 - len(prefix) - len("Bearer ") - (len(self.secret) - 1))
            return f"{pad}Bearer {self.secret}"
        if scenario == "echo-u":  # (the body then writes the first letter as \u0073; see reply)
            return "bad key: " + self.secret
        from urllib.parse import quote

        return "bad key: " + "".join(f"%{b:02X}" for b in self.secret.encode()) + " / " + quote(self.secret)


async def _plain(events: list[bytes]):
    for e in events:
        yield e
        await asyncio.sleep(0)


async def _cut(events: list[bytes]):
    for e in events:
        yield e
        await asyncio.sleep(0.01)
    raise ConnectionResetError("cut mid-stream (test)")  # uvicorn drops the connection: no chunked terminator


async def _stall(events: list[bytes]):
    for e in events:
        yield e
    await asyncio.sleep(3600)


async def _endless():
    yield b'{"choices": ['
    block = b"1," * 8192
    while True:
        yield block
        await asyncio.sleep(0)


async def _slow(body: bytes):
    for i in range(len(body)):
        yield body[i:i + 1]
        await asyncio.sleep(2)
