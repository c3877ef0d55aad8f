"""``kimi-eagle serve``: an OpenRouter-compatible HTTP server over a local HF causal LM.

``POST /v1/chat/completions`` and ``POST /v1/completions`` return the OpenRouter response shape
(``provider``, ``choices[0].finish_reason``, ``native_finish_reason``, ``usage``; on chat, ``stream: true``
answers in chunks (kimi_eagle.apps.api.sse) and, with ``--logprobs``, ``logprobs: true`` adds
``choices[0].logprobs.content`` with each token's ``token``, ``logprob``, ``bytes`` and ``top_logprobs``) and
append the token IDs actually sampled to an engine-record file (docs/CONTRACTS.md), one line per
delivered response. The record's ``id`` is the request's ``X-Record-Id`` header (``kimi-eagle
collect`` sends its record id there) or else the response id; ``response_id`` is always the
response's ``id``, so a record pairs with exactly one stored response even after retries.

The chat format (``plain`` for models without a template, such as stories260K: BOS + the
concatenated message contents; ``hf-template``: the tokenizer's own chat template) is stated at
start-up, in ``GET /v1/models`` and in the ``X-Chat-Format`` response header. Faults
(kimi_eagle.apps.api.faults) are off unless flags set them; ``--admin`` adds ``GET/POST /admin/faults``
and ``GET /admin/stats``; ``--api-key-env NAME`` makes the server require
``Authorization: Bearer $NAME`` (401 otherwise), like a real API.

In the ``kimi-k2.5`` chat format (a tiny-kimi model, kimi_eagle.apps.tiny_kimi) the request's
``messages`` and ``tools`` are rendered by the K2.5 renderer, generation stops at ``<|im_end|>``, and
the sampled IDs are parsed by the kit's Kimi parser (kimi_eagle.chat.parse) into
``reasoning``, ``content`` and ``tool_calls`` with ``finish_reason`` ``stop``/``tool_calls``/``length``,
as SGLang/vLLM's Kimi parsers answer; the engine record logs the parser's flags as ``parse_flags``.

Bounds: a body over ``MAX_BODY_BYTES`` is a JSON 413 as soon as its ``Content-Length`` (or the bytes read so far)
says so; parsing, rendering and tokenising run in worker threads (bodies over ``LARGE_BODY_BYTES`` one at a time), so
``/health`` answers meanwhile; a ``plain``/completions prompt whose text cannot fit the context is refused before it
is tokenised; a refused large prompt's memory is given back to the OS (``release_memory``).
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kimi_eagle.apps.api.faults import Fault, FaultConfig, FaultInjector
from kimi_eagle.apps.api.sse import (
    CUT,
    DONE,
    KEEPALIVE,
    SSEResponse,
    answer_chunks,
    error_chunk,
    event,
    stream_bytes,
    token_text_pieces,
)
from kimi_eagle.engine.local import (
    Engine,
    EngineError,
    Generation,
    SamplingParams,
    TemplateRefused,
    engine_record,
    message_text,
)
from kimi_eagle.io import JsonlAppender

DEFAULT_PROVIDER = "kimi-eagle-local"


class RequestError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ContextRefused(RequestError):
    """A prompt longer than the context, found before sampling; a streamed request still gets it as OpenRouter's
    mid-stream error chunk, as when the engine finds it."""

    def __init__(self, message: str, stream: bool, provider: str) -> None:
        super().__init__(400, message)
        self.stream, self.provider = stream, provider


def _error_body(status: int, message: str) -> dict[str, Any]:
    return {"error": {"code": status, "message": message}}


MAX_TOP_LOGPROBS = 20  # OpenAI's bound


@dataclass(frozen=True)
class _Job:
    """A checked generation request."""

    provider: str
    engine: Engine
    sampling: SamplingParams
    prompt_ids: list[int]
    logprobs: int | None  # None: no logprobs; k: logprobs with the top k alternatives
    stream: bool
    include_usage: bool


def _stream_request(body: dict[str, Any], chat: bool) -> tuple[bool, bool]:
    """``(stream, include_usage)`` of a request; streaming is offered on ``/v1/chat/completions``."""
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise RequestError(400, "stream must be a boolean")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise RequestError(400, "stream_options must be an object")
    usage = (options or {}).get("include_usage", False)
    if not isinstance(usage, bool):
        raise RequestError(400, "stream_options.include_usage must be a boolean")
    if stream and not chat:
        raise RequestError(400, "streaming is offered on /v1/chat/completions only")
    return stream, stream and usage


def _logprobs_request(body: dict[str, Any]) -> int | None:
    """None when the request does not ask for logprobs, else how many alternatives (``top_logprobs``) per token."""
    asked, top = body.get("logprobs"), body.get("top_logprobs")
    if asked is not None and not isinstance(asked, bool):
        raise RequestError(400, "logprobs must be a boolean")
    if top is not None and not (isinstance(top, int) and not isinstance(top, bool) and 0 <= top <= MAX_TOP_LOGPROBS):
        raise RequestError(400, f"top_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}]")
    if top is not None and not asked:
        raise RequestError(400, "top_logprobs needs logprobs: true")
    return (top or 0) if asked else None


BYTE_PROBE = "a\u0378\U0001f9ff\ufffd\u01c5\u20ac\x7f\U0010fffd z"  # unassigned, private-use, rare, control


def max_token_bytes(tok: Any) -> int:
    """The most bytes of text one token of ``tok`` can spell, or 0 (unbounded) for a tokenizer that is not byte-faithful:
    one whose tokens' bytes do not spell a probe of unassigned and rare characters (an unknown token, which may
    stand for any run of text)."""
    ids = tok.encode(BYTE_PROBE)
    if not b"".join(tok.token_bytes(i) for i in ids).endswith(BYTE_PROBE.encode("utf-8")):
        return 0
    return max(max(map(len, tok.token_table)), *(len(t.encode("utf-8")) for t in tok.special_text_by_id.values()), 1)


def logprobs_content(gen: Generation, engine: Engine) -> list[dict[str, Any]]:
    """``choices[0].logprobs.content``: one entry per sampled token (a final stop token excluded, as its text is
    not in the answer) with ``token`` (its text; a special token's spelling), ``logprob``, ``bytes`` (the token's
    raw bytes as integers: partial UTF-8 stays exact) and ``top_logprobs``."""
    tok = engine.tok
    special = tok.special_text_by_id

    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        raw = special[token_id].encode("utf-8") if token_id in special else tok.token_bytes(token_id)
        text = special.get(token_id) or raw.decode("utf-8", errors="replace")
        return {"token": text, "logprob": logprob, "bytes": list(raw)}

    ids = list(gen.output_ids)
    scores = list(gen.logprobs or [])
    if gen.finish_reason == "stop" and ids and ids[-1] in set(engine.eos_ids):
        ids, scores = ids[:-1], scores[:-1]
    return [{**entry(i, lp), "top_logprobs": [entry(t, tlp) for t, tlp in top]} for i, (lp, top) in zip(ids, scores)]


def completion_token_bytes(tok: Any, output_ids: list[int], eos_ids: list[int]) -> list[bytes]:
    """Each output token's bytes, a final stop token excluded (they join to the answer's text bytes)."""
    ids = output_ids[:-1] if output_ids and output_ids[-1] in set(eos_ids) else output_ids
    return [tok.token_bytes(i) for i in ids]


def _sampling(body: dict[str, Any]) -> SamplingParams:
    if body.get("n", 1) != 1:
        raise RequestError(400, "n must be 1")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    sp = SamplingParams(
        temperature=1.0 if body.get("temperature") is None else body["temperature"],
        top_p=1.0 if body.get("top_p") is None else body["top_p"],
        seed=body.get("seed"),
        max_tokens=max_tokens,
    )
    try:
        sp.validate()
    except EngineError as e:
        raise RequestError(400, str(e)) from None
    return sp


def _names(prefs: dict[str, Any], key: str) -> list[str]:
    value = prefs.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RequestError(400, f"provider.{key} must be a list of provider names (strings)")
    return [v.lower() for v in value]


def route_provider(body: dict[str, Any], providers: list[str]) -> str:
    """The provider (of ``providers``, in table order) that serves ``body`` under OpenRouter's provider routing:
    ``only`` / ``ignore`` filter, ``order`` is tried first, and with ``allow_fallbacks: false`` nothing outside
    ``order`` is used. None left: OpenRouter's 404 "No endpoints found"."""
    prefs = body.get("provider")
    if prefs is None:
        return providers[0]
    if not isinstance(prefs, dict):
        raise RequestError(400, "provider must be an object")
    only, ignore, order = _names(prefs, "only"), _names(prefs, "ignore"), _names(prefs, "order")
    fallbacks = prefs.get("allow_fallbacks", True)
    if not isinstance(fallbacks, bool):
        raise RequestError(400, "provider.allow_fallbacks must be a boolean")
    candidates = [p for p in providers if (not only or p.lower() in only) and p.lower() not in ignore]
    ordered = sorted((p for p in candidates if p.lower() in order), key=lambda p: order.index(p.lower()))
    rest = [p for p in candidates if p not in ordered] if (fallbacks or not order) else []
    chosen = ordered + rest
    if not chosen:
        raise RequestError(404, "No endpoints found matching your provider preferences")
    return chosen[0]


class App:
    """The ASGI application: routes, fault injection, generation in a worker thread, record logging."""

    def __init__(self, engine: Engine, records: str | Path, faults: FaultConfig | None = None,
                 provider: str = DEFAULT_PROVIDER, admin: bool = False, api_key: str | None = None,
                 more_providers: dict[str, Engine] | None = None, logprobs: bool = False,
                 keepalive_seconds: float = 2.0) -> None:
        """``engine`` is served as ``provider``; ``more_providers`` (name -> engine of the same model, e.g. at another
        precision) makes a provider table that requests choose from with OpenRouter's ``provider`` routing.
        ``logprobs``: honour ``logprobs: true`` on chat requests (else it is ignored and ``"logprobs": null``, as
        from a provider without logprobs); ``keepalive_seconds``: a stream's keep-alive comment interval."""
        from starlette.applications import Starlette
        from starlette.routing import Route

        self.engine = engine
        self.providers: dict[str, Engine] = {provider: engine, **(more_providers or {})}
        if any(e.name != engine.name for e in self.providers.values()):
            raise ValueError("every provider of one server serves the same model name")
        self.log = JsonlAppender(records)  # engine records, one complete flushed line each
        self.faults = FaultInjector(faults)
        self.provider = provider
        self.logprobs = logprobs
        self.keepalive_seconds = keepalive_seconds
        self._api_key = api_key
        self.stats = {"requests": 0, "delivered": 0, "errors": 0}
        self._large_bodies = asyncio.Semaphore(1)  # one large prompt prepared at a time (see _prepared_job)
        self._max_token_bytes: dict[str, int] = {}  # model name -> max_token_bytes(tokenizer), 0 for unbounded
        self._prompt_lock = threading.Lock()  # prompts are rendered and tokenised in worker threads, one at a time
        routes = [
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
        ]
        if admin:
            routes += [Route("/admin/faults", self.admin_faults, methods=["GET", "POST"]),
                       Route("/admin/stats", self.admin_stats, methods=["GET"])]
        self.app = Starlette(routes=routes, exception_handlers={Exception: _internal_error})

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)

    def _unauthorized(self, request: Any) -> Any:
        """A 401 JSON reply when a key is required and the request lacks it (else None); compared in constant time."""
        import hmac

        from starlette.responses import JSONResponse

        if not self._api_key:
            return None
        given = request.headers.get("authorization", "").encode("utf-8", "surrogateescape")
        if hmac.compare_digest(given, f"Bearer {self._api_key}".encode()):
            return None
        return JSONResponse(_error_body(401, "No auth credentials found"), status_code=401)

    # ---- informational routes

    def model_card(self) -> dict[str, Any]:
        e = self.engine
        return {"id": e.name, "object": "model", "owned_by": self.provider, "chat_format": e.chat_format,
                "providers": {name: eng.precision for name, eng in self.providers.items()},
                "supported_parameters": ["max_tokens", "seed", "stream", "temperature", "top_p"]
                + (["logprobs", "top_logprobs"] if self.logprobs else []) + (["tools"] if e.chat_format != "plain" else []),
                "context_length": e.context_length, "bos_token_id": e.bos_id, "eos_token_ids": e.eos_ids,
                "chat_format_description": ("BOS + the concatenated message contents, no template"
                                            if e.chat_format == "plain" else "the tokenizer's chat template")}

    async def models(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        return JSONResponse({"object": "list", "data": [self.model_card()]})

    async def health(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        return JSONResponse({"status": "ok", "model": self.engine.name, "chat_format": self.engine.chat_format})

    async def admin_faults(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        denied = self._unauthorized(request)
        if denied is not None:
            return denied
        if request.method == "POST":
            try:
                payload = await _json_body(request)
                if not isinstance(payload, dict):
                    raise RequestError(400, "the fault configuration must be a JSON object")
                self.faults.configure(FaultConfig.from_dict(payload))
            except RequestError as e:
                return JSONResponse(_error_body(e.status, str(e)), status_code=e.status)
            except (ValueError, TypeError) as e:
                return JSONResponse(_error_body(400, str(e)), status_code=400)
        return JSONResponse(self.faults.config.to_dict())

    async def admin_stats(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        denied = self._unauthorized(request)
        if denied is not None:
            return denied
        return JSONResponse({**self.stats, "faults": dict(self.faults.counts)})

    # ---- generation routes

    async def chat(self, request: Any) -> Any:
        return await self._complete(request, chat=True)

    async def completions(self, request: Any) -> Any:
        return await self._complete(request, chat=False)

    async def _complete(self, request: Any, chat: bool) -> Any:
        from starlette.concurrency import run_in_threadpool
        from starlette.responses import JSONResponse

        self.stats["requests"] += 1
        denied = self._unauthorized(request)
        if denied is not None:
            return denied
        fault = self.faults.draw()
        if fault.slow:
            await asyncio.sleep(self.faults.config.slow_seconds)
        headers = {"X-Chat-Format": self.engine.chat_format}
        if fault.kind in ("429", "500", "503"):
            status = int(fault.kind)
            message = {429: "Rate limit exceeded (injected)", 500: "Internal server error (injected)",
                       503: "Service unavailable (injected)"}[status]
            if status == 429:
                headers["Retry-After"] = _seconds(self.faults.config.retry_after)
            return JSONResponse(_error_body(status, message), status_code=status, headers=headers)
        try:
            job = await self._prepared_job(request, chat)
            if job.stream:
                return SSEResponse(self._stream_events(job, request, fault), headers)
            gen = await run_in_threadpool(job.engine.generate, job.prompt_ids, job.sampling, job.logprobs)
        except Exception as e:
            failure = self._failure(e)
            refused_stream = e.provider if isinstance(e, ContextRefused) and e.stream else None
            job = None  # a rejected prompt's body and IDs go now (and its traceback with ``e``), not when this ends
        else:
            failure = None
        if failure is not None:
            if getattr(request.state, "body_bytes", 0) > LARGE_BODY_BYTES:
                await run_in_threadpool(release_memory)
            if refused_stream is not None:
                return SSEResponse(self._refused_events(refused_stream, *failure), headers)
            return JSONResponse(_error_body(*failure), status_code=failure[0], headers=headers)
        parse_flags: list[str] = []
        response = self._response(gen, chat, job.provider, job.engine, parse_flags, job.logprobs)
        if fault.kind in ("truncate", "drop", "stream_cut"):
            return _BrokenResponse(response, Fault("drop" if fault.kind == "stream_cut" else fault.kind), headers)
        self._log(request, gen, job, response, parse_flags)
        return JSONResponse(response, headers=headers)

    def _failure(self, e: Exception) -> tuple[int, str]:
        """``(status, message)`` of a request that failed; re-raises what no request can be blamed for."""
        if not isinstance(e, (RequestError, EngineError, ValueError, TypeError, KeyError, AttributeError, RecursionError)):
            raise e  # unforeseen: the JSON 500 of ``_internal_error``
        self.stats["errors"] += 1
        if isinstance(e, RequestError):
            return e.status, str(e)
        if isinstance(e, TemplateRefused):  # the model folder's template, not the request, is at fault
            return 500, str(e)
        # anything else a request's content can provoke is the request's fault: a JSON 400, never a traceback
        return 400, f"invalid request: {type(e).__name__}: {e}"[:500]

    async def _prepared_job(self, request: Any, chat: bool) -> "_Job":
        """The request's body read (bounded) and turned into a job in a worker thread, so parsing, template rendering
        and tokenising a large prompt never hold up the event loop (``/health`` answers meanwhile); bodies over
        ``LARGE_BODY_BYTES`` are prepared one at a time, so concurrent huge prompts cannot multiply the peak memory."""
        from starlette.concurrency import run_in_threadpool

        raw = await read_body(request)
        request.state.body_bytes = len(raw)
        if len(raw) <= LARGE_BODY_BYTES:
            return await run_in_threadpool(self._job, raw, chat)
        async with self._large_bodies:
            return await run_in_threadpool(self._job, raw, chat)

    def _job(self, raw: bytes, chat: bool) -> "_Job":
        """The body ``raw`` parsed and checked and its prompt rendered (in a worker thread); a ``RequestError`` (or
        EngineError) says what is wrong. A prompt longer than the context is refused here, before sampling starts."""
        body = parse_json_body(raw)
        del raw
        if not isinstance(body, dict):
            raise RequestError(400, "request body must be a JSON object")
        if body.get("model") != self.engine.name:
            model = body.get("model")
            shown = repr(model)[:100] if isinstance(model, str) else f"a {type(model).__name__}"
            raise RequestError(400, f"{shown} is not a valid model ID (this server has {self.engine.name!r})")
        provider = route_provider(body, list(self.providers))
        engine = self.providers[provider]
        sampling = _sampling(body)
        stream, include_usage = _stream_request(body, chat)
        _check_text(body.get("messages" if chat else "prompt"), "messages" if chat else "prompt")
        self._refuse_text_beyond_context(engine, body.get("messages") if chat else body.get("prompt"), stream, provider)
        with self._prompt_lock:  # a tokenizer's per-call settings (special spellings) are not thread-safe
            if chat:
                prompt_ids = engine.prompt_ids(body.get("messages"), body.get("tools"))
            else:
                prompt_ids = engine.text_prompt_ids(body.get("prompt"))
        logprobs = _logprobs_request(body) if chat and self.logprobs else None
        del body
        if engine.context_length and len(prompt_ids) >= engine.context_length:
            raise ContextRefused(f"prompt has {len(prompt_ids)} tokens; the context length is {engine.context_length}",
                                 stream, provider)
        return _Job(provider, engine, sampling, prompt_ids, logprobs, stream, include_usage)

    def _refuse_text_beyond_context(self, engine: Engine, prompt: Any, stream: bool, provider: str) -> None:
        """Refuse, before tokenising it, a prompt whose text alone cannot fit the context: where the chat format is
        ``plain`` (or on ``/v1/completions``) the prompt's tokens spell at least its text's bytes, so it has at least
        ``ceil(bytes / longest token)`` tokens. (Tokenising a 15 MB prompt costs ~40 s with the GIL held and ~2 GB.)
        Template formats are not bounded this way: a template may drop text."""
        if not engine.context_length or (isinstance(prompt, list) and engine.chat_format != "plain"):
            return
        if isinstance(prompt, str):
            text = prompt
        elif isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt):
            text = "".join(message_text(m) for m in prompt)
        else:
            return  # the engine says what is wrong with it
        per_token = self._max_token_bytes.get(engine.name)
        if per_token is None:
            per_token = self._max_token_bytes[engine.name] = max_token_bytes(engine.tok)
        n_bytes = len(text.encode("utf-8"))
        at_least = -(-n_bytes // per_token) + (engine.bos_id is not None) if per_token else 0
        if at_least >= engine.context_length:
            raise ContextRefused(f"prompt has at least {at_least} tokens ({n_bytes} bytes of text, at most {per_token}"
                                 f" bytes a token); the context length is {engine.context_length}", stream, provider)

    def _log(self, request: Any, gen: Generation, job: "_Job", response: dict[str, Any], parse_flags: list[str]) -> None:
        """Append the engine record of a delivered answer."""
        engine = job.engine
        extra = {"parse_flags": parse_flags} if engine.chat_format == "kimi-k2.5" and "message" in response["choices"][0] else {}
        self.log.append(engine_record(request.headers.get("x-record-id") or response["id"], gen, engine.name,
                                      engine.chat_format, response_id=response["id"], provider=job.provider,
                                      precision=engine.precision, **extra))
        self.stats["delivered"] += 1

    async def _refused_events(self, provider: str, status: int, message: str) -> Any:
        """A streamed request refused before sampling: a keep-alive, the error chunk, ``[DONE]``."""
        yield KEEPALIVE
        yield event(error_chunk(f"gen-{uuid.uuid4().hex}", self.engine.name, provider, int(time.time()), status, message))
        yield DONE

    async def _stream_events(self, job: "_Job", request: Any, fault: Fault) -> Any:
        """The events of a streamed answer: keep-alive comments while the engine samples, then the chunks; a
        ``stream_cut`` (or ``truncate``/``drop``) fault drops the connection halfway through the chunks."""
        from starlette.concurrency import run_in_threadpool

        yield KEEPALIVE
        task = asyncio.ensure_future(run_in_threadpool(job.engine.generate, job.prompt_ids, job.sampling, job.logprobs))
        while not task.done():
            done, _ = await asyncio.wait({task}, timeout=self.keepalive_seconds)
            if not done:
                yield KEEPALIVE
        created = int(time.time())
        try:
            gen = task.result()
        except Exception as e:
            status, message = self._failure(e)
            yield event(error_chunk(f"gen-{uuid.uuid4().hex}", job.engine.name, job.provider, created, status, message))
            yield DONE
            return
        parse_flags: list[str] = []
        response = self._response(gen, True, job.provider, job.engine, parse_flags, job.logprobs)
        pieces = None
        if job.engine.chat_format != "kimi-k2.5":
            pieces = token_text_pieces(completion_token_bytes(job.engine.tok, gen.output_ids, job.engine.eos_ids))
        events = stream_bytes(answer_chunks(response, pieces, job.include_usage))
        cut = len(events) // 2 if fault.kind in ("truncate", "drop", "stream_cut") else None
        for k, data in enumerate(events):
            if k == cut:
                yield CUT
                return
            yield data
        self._log(request, gen, job, response, parse_flags)

    def _response(self, gen: Generation, chat: bool, provider: str, engine: Engine,
                  parse_flags: list[str] | None = None, logprobs: int | None = None) -> dict[str, Any]:
        """The OpenRouter-shaped reply to ``gen``; in ``kimi-k2.5`` the parser's flags are appended to ``parse_flags``;
        with ``logprobs`` (not None) the choice carries ``logprobs.content``."""
        text = engine.text(gen)
        n_prompt, n_out = len(gen.prompt_ids), len(gen.output_ids)
        reasoning_tokens = 0
        if chat and engine.chat_format == "kimi-k2.5":
            from kimi_eagle.engine.kimi_format import kimi_chat_answer

            answer = kimi_chat_answer(gen.output_ids, engine.tok, gen.finish_reason,
                                      getattr(engine, "serving", "template"))  # serve --serving (serving/profiles)
            reasoning_tokens = answer.reasoning_tokens
            if parse_flags is not None:
                parse_flags.extend(answer.flags)
            choice = {"logprobs": None, "finish_reason": answer.finish_reason, "native_finish_reason": answer.finish_reason,
                      "index": 0, "message": answer.message}
        elif chat:
            choice = {"logprobs": None, "finish_reason": gen.finish_reason, "native_finish_reason": gen.finish_reason,
                      "index": 0, "message": {"role": "assistant", "content": text, "refusal": None, "reasoning": None}}
        else:
            choice = {"logprobs": None, "finish_reason": gen.finish_reason, "native_finish_reason": gen.finish_reason,
                      "index": 0, "text": text}
        if logprobs is not None and chat:
            choice["logprobs"] = {"content": logprobs_content(gen, engine), "refusal": None}
        return {
            "id": f"gen-{uuid.uuid4().hex}",
            "provider": provider,
            "model": engine.name,
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "choices": [choice],
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out,
                      "cost": 0, "completion_tokens_details": {"reasoning_tokens": reasoning_tokens}},
        }


MAX_JSON_DEPTH = 64  # far deeper than any chat request; a 5,000-deep body is refused before parsing
MAX_BODY_BYTES = 16 * 1024 * 1024
LARGE_BODY_BYTES = 1 << 20  # bodies above this are prepared one at a time and their memory given back when refused


def json_depth_exceeds(raw: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``raw`` (JSON text) nests arrays/objects deeper than ``limit``, brackets inside strings ignored.
    A linear scan, so a hostile body cannot make the parser recurse."""
    depth = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > limit:
                return True
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return False


async def read_body(request: Any, limit: int = MAX_BODY_BYTES) -> bytes:
    """The request body, read chunk by chunk: a ``Content-Length`` over ``limit`` is a 413 before any byte is read,
    and a body (chunked, or lying about its length) that passes ``limit`` is a 413 as soon as it does, so at most
    ``limit`` bytes are ever held."""
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise RequestError(413, f"request body over {limit} bytes (Content-Length {declared})")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            chunks.clear()
            raise RequestError(413, f"request body over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def release_memory() -> None:
    """Give the heap a rejected large prompt freed back to the OS: glibc keeps freed blocks in its arenas (RSS
    stays at the peak otherwise); ``malloc_trim(0)`` returns them. A no-op where there is no glibc."""
    import ctypes
    import gc

    gc.collect()  # a traceback cycle may still hold the prompt's frames; then trim what that freed
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


async def _json_body(request: Any) -> Any:
    """The request body read (bounded) and parsed as JSON, or a ``RequestError`` (400/413) saying why not."""
    return parse_json_body(await read_body(request))


def parse_json_body(raw: bytes) -> Any:
    """``raw`` parsed as JSON, or a ``RequestError`` (400) saying why not; nesting is checked before parsing."""
    if json_depth_exceeds(raw):
        raise RequestError(400, f"request body nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise RequestError(400, f"request body is not JSON: {e}"[:300]) from None


def _check_text(value: Any, where: str) -> None:
    """Every string in ``value`` must be encodable as UTF-8 (a lone surrogate such as ``"\\ud800"`` is refused with a
    400, never turned into U+FFFD or a crash)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                raise RequestError(400, f"{where}: text is not valid Unicode ({e.reason} at index {e.start})") from None
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


async def _internal_error(request: Any, exc: Exception) -> Any:
    """An unforeseen failure is a JSON 500 naming the exception type; the traceback goes to the server's log only."""
    from starlette.responses import JSONResponse

    return JSONResponse(_error_body(500, f"internal error ({type(exc).__name__})"), status_code=500)


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


class _BrokenResponse:
    """A reply that goes wrong on the wire: a truncated JSON body, or a connection dropped mid-body."""

    def __init__(self, payload: dict[str, Any], fault: Fault, headers: dict[str, str]) -> None:
        self.body = json.dumps(payload).encode()
        self.fault = fault
        self.headers = headers

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        half = self.body[: len(self.body) // 2]
        length = len(half) if self.fault.kind == "truncate" else len(self.body)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(length).encode())]
        headers += [(k.lower().encode(), v.encode()) for k, v in self.headers.items()]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        # truncate: a complete HTTP message carrying half a JSON document; drop: the connection
        # closes after half the promised bytes (the server closes it when we return early).
        await send({"type": "http.response.body", "body": half, "more_body": self.fault.kind == "drop"})


# ---- command line


class LocalServer:
    """``kimi-eagle serve`` in a child process on a free 127.0.0.1 port (tests, notebooks, benchmarks).

    ``with LocalServer(model_dir, records) as srv: srv.base_url`` -- the process is stopped by its PID
    on exit (SIGTERM, then SIGKILL after ``stop_timeout``); every wait is bounded.
    """

    def __init__(self, model_dir: str | Path, records: str | Path, *extra_args: str, model_name: str | None = None,
                 start_timeout: float = 60.0, stop_timeout: float = 10.0, log: str | Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.model_dir, self.records = str(model_dir), str(records)
        self.extra_args = [str(a) for a in extra_args]
        self.model_name = model_name
        self.start_timeout, self.stop_timeout = start_timeout, stop_timeout
        self.log_path = Path(log) if log else None
        self.env = {**os.environ, **env} if env else None
        self.proc: subprocess.Popen | None = None
        self.api_key = None  # the admin routes need the key when the server requires one
        if "--api-key-env" in self.extra_args:
            name = self.extra_args[self.extra_args.index("--api-key-env") + 1]
            self.api_key = (self.env or os.environ).get(name)
        self.base_url = ""
        self.pid = 0

    def start(self) -> "LocalServer":
        ready = Path(tempfile.mkdtemp(prefix="kimi-eagle-serve-")) / "ready.json"
        cmd = [sys.executable, "-m", "kimi_eagle", "serve", "--model-dir", self.model_dir, "--host", "127.0.0.1",
               "--port", "0", "--records", self.records, "--ready-file", str(ready), *self.extra_args]
        if self.model_name:
            cmd += ["--served-model-name", self.model_name]
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT if self.log_path else out,
                                         env=self.env)
        finally:
            if self.log_path:
                out.close()
        self.pid = self.proc.pid
        deadline = time.monotonic() + self.start_timeout
        while not ready.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"kimi-eagle serve exited with {self.proc.returncode} before listening"
                                   + (f"; see {self.log_path}" if self.log_path else ""))
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"kimi-eagle serve not ready after {self.start_timeout}s")
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        ready.unlink()
        ready.parent.rmdir()
        self.base_url = info["base_url"]
        self._wait_healthy(deadline)
        return self

    def _wait_healthy(self, deadline: float) -> None:
        import httpx

        while True:
            try:
                if httpx.get(self.base_url.rsplit("/v1", 1)[0] + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or (self.proc and self.proc.poll() is not None):
                self.stop()
                raise TimeoutError("kimi-eagle serve did not become healthy")
            time.sleep(0.05)

    def admin(self, path: str, payload: dict | None = None) -> dict:
        """GET (or POST ``payload`` to) an admin route; the server must run with ``--admin``."""
        import httpx

        url = self.base_url.rsplit("/v1", 1)[0] + path
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        r = (httpx.post(url, json=payload, headers=headers, timeout=10) if payload is not None
             else httpx.get(url, headers=headers, timeout=10))
        r.raise_for_status()
        return r.json()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=self.stop_timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=self.stop_timeout)

    def __enter__(self) -> "LocalServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
