"""``kimi-eagle collect``: collect chat completions from an OpenAI/OpenRouter-compatible API, resumably.

Input: a JSONL of prompts, one per line, any of
``{"id"?, "dataset"?, "messages": [...], ...request fields}``, ``{"id"?, "prompt": "text"}`` or
``{"id"?, "dataset"?, "request": {...}}``. Request fields on the line win over the command-line
defaults (``--model``, sampling, ``provider`` routing, ``reasoning``). A line without ``id`` gets
``line-<n>``.

Output: API records (docs/CONTRACTS.md) appended as JSONL in completion order, exactly one per
prompt: ``{"id", "dataset"?, "key", "status": "ok"|"error", "error", "request", "response",
"http_status", "timing", "base_url"}``. ``request`` is the exact JSON body sent, ``response`` the parsed body
as received (every field kept), ``base_url`` where it was collected (no user, password or query: the record's
data kind, :mod:`kimi_eagle.reconstruct.source`). ``key`` is the sha256 of the record id and request body: a rerun
skips keys already stored (``ok`` or a permanent error), drops a torn last line and transient
failures, and requests only what is missing -- killing a run and resuming loses and duplicates
nothing.

Retries: 429, 408, 409, 425, 5xx, timeouts, transport errors, and 200s whose body is not a
complete completion (truncated JSON, an ``error`` object, no choices) are retried with exponential
backoff and jitter, never sooner than ``Retry-After`` (capped at ``max_retry_after``, default
``backoff_max``; it also pauses every worker); after ``max_attempts`` the record is stored as
``exhausted`` (retried on the next run). Other 4xx are permanent errors, stored and not retried;
401/402 stop the run (nothing more would succeed).

Streams: a request with ``stream: true`` is read as SSE and its chunks assembled
(:mod:`kimi_eagle.reconstruct.stream`) into the response a non-streaming request gives; a stream that
breaks keeps what arrived and is retried, stored as ``stream_incomplete`` when every attempt broke.
Bounds: ``timeout`` is the silence allowed, ``response_timeout`` the whole attempt,
``max_body_bytes`` the reply's size. What cannot be stored as it came is an error record with the
reason (``bad_prompt``, ``lone_surrogate``, ``unstorable``; ``bad_usage`` for usage counts that are negative, not
integers (``"7"`` included), not finite or beyond 10**9: never a stored ok nor summed), never the end of the run: any exception out of the HTTP
client (a lying ``Content-Encoding``), the SSE reader or the JSON layer fails that attempt only, and nesting past
100 levels is refused by name. SIGINT/SIGTERM write the requests in flight as ``interrupted``. One run per output:
``.OUT.lock`` (as ``reconstruct`` holds) refuses a second run on it before anything is sent. The summary's ``ok``
counts every ok record in the output (those a rerun reused included, as ``totals.ok``); ``ok_this_run`` and the
error kinds count this run's requests.

The API key comes from ``OPENROUTER_API_KEY`` only, goes only into the ``Authorization`` header,
and is redacted in every form (:mod:`kimi_eagle.apps.api.redact`) from anything written or printed.
Each request carries its record id in ``X-Record-Id`` (percent-encoded UTF-8 when not printable
ASCII; ``kimi-eagle serve`` logs it as the engine record's id).
"""
from __future__ import annotations

import asyncio
import email.utils
import hashlib
import json
import math
import os
import random
import re
import signal
import sys
import threading
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kimi_eagle.apps.api.redact import REDACTED as REDACTED  # re-exported: callers match it in messages
from kimi_eagle.apps.api.redact import Redactor
from kimi_eagle.io import MAX_DEPTH, JsonlAppender, json_depth, read_jsonl, write_lines, write_text
from kimi_eagle.reconstruct.stream import DONE, SSEDecoder, StreamAssembler, StreamError
from kimi_eagle.reconstruct.usage import usage_count_problems

API_KEY_ENV = "OPENROUTER_API_KEY"
RECORD_ID_HEADER = "X-Record-Id"
RETRY_STATUS = {408, 409, 425, 429}
FATAL_STATUS = {401, 402}
PROVIDER_FIELDS = ("order", "only", "ignore", "quantizations", "allow_fallbacks", "require_parameters",
                   "data_collection", "sort", "max_price", "zdr")
SNIPPET_CHARS = 300  # of an upstream body kept in an error message (redacted before the cut)
RETRYABLE_KINDS = ("exhausted", "stream_incomplete", "interrupted", "unstorable")  # redone by the next run
LONE_SURROGATE = re.compile("[\ud800-\udfff]")
SIGNAL_EXIT = {"SIGINT": 130, "SIGTERM": 143}


@dataclass
class CollectConfig:
    base_url: str
    model: str
    concurrency: int = 4
    max_attempts: int = 8
    timeout: float = 120.0  # seconds of silence allowed while connecting or reading (per attempt)
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    max_retry_after: float | None = None  # cap on a server's Retry-After; None: backoff_max
    defaults: dict[str, Any] = field(default_factory=dict)  # request fields for every prompt
    retry_errors: bool = False  # also redo stored permanent errors
    limit: int | None = None  # only the first N prompts
    progress: bool = True
    response_timeout: float = 900.0  # seconds for a whole attempt, first byte to last (streams included)
    max_body_bytes: int = 64 << 20  # bytes of one reply (decoded), SSE framing included

    def __post_init__(self) -> None:
        """Refuse settings that would hang (no workers), never send (no attempts) or wait forever, before any work."""
        def whole(name: str, value: Any, low: int) -> None:
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= low):
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")

        def number(name: str, value: Any, positive: bool) -> None:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if not ok or value < 0 or (positive and value == 0):
                raise ValueError(f"{name} must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}")

        whole("concurrency", self.concurrency, 1)
        whole("max_attempts", self.max_attempts, 1)
        whole("max_body_bytes", self.max_body_bytes, 1)
        if self.limit is not None:
            whole("limit", self.limit, 1)
        number("timeout", self.timeout, True)
        number("response_timeout", self.response_timeout, True)
        number("backoff_base", self.backoff_base, False)
        number("backoff_max", self.backoff_max, False)
        if self.max_retry_after is not None:
            number("max_retry_after", self.max_retry_after, False)
        if not isinstance(self.base_url, str) or not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, got {self.base_url!r}")
        if not isinstance(self.defaults, dict):
            raise ValueError("defaults (request fields for every prompt) must be a JSON object")


@dataclass
class Prompt:
    id: str
    request: dict[str, Any] | None
    key: str
    dataset: str | None = None
    error: str | None = None  # a prompt line that cannot become a request
    body: dict[str, Any] | None = None  # the request it would have been (kept in its error record)


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")  # lone surrogates (which JSON can hold) hash too


def request_key(record_id: str, body: Any) -> str:
    canonical = json.dumps({"id": record_id, "request": body}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(_utf8(canonical)).hexdigest()


def surrogate_paths(value: Any, path: str = "", limit: int = 5) -> list[str]:
    """Where ``value`` (JSON-like) holds lone surrogates (``$.a[0].b``), at most ``limit`` places."""
    found: list[str] = []
    stack = [(path or "$", value)]
    while stack and len(found) < limit:
        where, v = stack.pop()
        if isinstance(v, str):
            m = LONE_SURROGATE.search(v)
            if m:
                found.append(f"{where} (U+{ord(m.group()):04X} at character {m.start()})")
        elif isinstance(v, dict):
            for k, item in reversed(list(v.items())):
                if isinstance(k, str) and LONE_SURROGATE.search(k):
                    found.append(f"{where} (a key)")
                stack.append((f"{where}.{k}", item))
        elif isinstance(v, list):
            stack.extend((f"{where}[{i}]", item) for i, item in reversed(list(enumerate(v))))
    return found


def build_request(line: dict[str, Any], model: str, defaults: dict[str, Any]) -> dict[str, Any]:
    """The request body for one prompt line (see the module docstring)."""
    if "request" in line:
        if not isinstance(line["request"], dict):
            raise ValueError("`request` must be an object")
        fields = dict(line["request"])
    else:
        fields = {k: v for k, v in line.items() if k not in ("id", "dataset", "prompt")}
        if "prompt" in line:
            if not isinstance(line["prompt"], str):
                raise ValueError("`prompt` must be a string")
            fields["messages"] = [{"role": "user", "content": line["prompt"]}]
    body = {"model": model, **defaults, **fields}
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise ValueError("needs `messages` (a non-empty list of {role, content}) or `prompt`")
    return body


def _record_id(obj: Any, lineno: int) -> tuple[str, str | None]:
    """The record id of a prompt line (as given: a string, or an integer written in decimal) and a problem."""
    raw = obj.get("id") if isinstance(obj, dict) else None
    if raw is None:
        return f"line-{lineno}", None
    if isinstance(raw, str):
        return raw, ("`id` is empty" if not raw else None)
    if isinstance(raw, int) and not isinstance(raw, bool):
        return str(raw), None
    return f"line-{lineno}", f"`id` must be a string or an integer, got {type(raw).__name__} {json.dumps(raw)[:60]}"


def load_prompts(path: str | Path, model: str, defaults: dict[str, Any] | None = None,
                 limit: int | None = None) -> list[Prompt]:
    """Every prompt line, in order; a bad line becomes a Prompt with ``error`` (never dropped)."""
    prompts: list[Prompt] = []
    seen: set[str] = set()
    for line in read_jsonl(path):
        if limit is not None and len(prompts) >= limit:
            break
        obj = line.obj
        rid, problem = _record_id(obj, line.lineno)
        dataset = obj.get("dataset") if isinstance(obj, dict) else None
        body = None
        try:
            if line.error:
                raise ValueError(line.error)
            if not isinstance(obj, dict):
                raise ValueError("prompt line is not a JSON object")
            if problem:
                raise ValueError(problem)
            if rid in seen:
                raise ValueError(f"duplicate id {rid!r}")
            body = build_request(obj, model, defaults or {})
            bad = surrogate_paths({"id": rid, "request": body})
            if bad:
                raise ValueError(f"holds a lone surrogate at {', '.join(bad)}: not valid Unicode, so not sent "
                                 "(kept in this record as a \\u escape)")
            prompts.append(Prompt(rid, body, request_key(rid, body), dataset))
        except ValueError as e:
            if rid in seen:
                rid = f"{rid}@line-{line.lineno}"
            prompts.append(Prompt(rid, None, request_key(rid, {"line": line.lineno, "obj": obj}), dataset,
                                  f"line {line.lineno}: {e}", body))
        seen.add(rid)
    return prompts


# ---- classifying replies


@dataclass
class Outcome:
    kind: str  # "ok" | "retry" | "permanent" | "fatal"
    message: str = ""
    response: Any = None
    retry_after: float | None = None
    incomplete: bool = False  # a stream that broke: ``response`` is what arrived


def parse_retry_after(headers: Any, now: float | None = None) -> float | None:
    """Seconds to wait from ``Retry-After`` (seconds or an HTTP date) or OpenRouter's ms ``X-RateLimit-Reset``."""
    now = time.time() if now is None else now
    value = headers.get("retry-after")
    if value:
        try:
            seconds = float(value)
            return max(0.0, seconds) if math.isfinite(seconds) else None
        except ValueError:
            try:
                return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - now)
            except (TypeError, ValueError, OverflowError):
                pass
    reset = headers.get("x-ratelimit-reset")
    if reset:
        try:
            seconds = float(reset) / 1000 - now
            return max(0.0, seconds) if math.isfinite(seconds) else None
        except ValueError:
            pass
    return None


def error_outcome(err: Any, what: str, response: Any, retry_after: float | None = None,
                  redactor: Redactor | None = None) -> Outcome:
    """An ``error`` object a 200 (or a stream) carried: retried when its code is transient or unknown."""
    redactor = redactor or Redactor(None)
    err = err if isinstance(err, dict) else {"message": str(err)}
    code = err.get("code")
    kind = "retry" if not isinstance(code, int) or isinstance(code, bool) or code in RETRY_STATUS or code >= 500 \
        else "permanent"
    said = err.get("message")
    if said is None:  # no message: what the error object holds, never "None"
        said = json.dumps({k: v for k, v in err.items() if k != "code"}, ensure_ascii=False) if len(err) > 1 or "code" not in err else "no message"
    message = redactor.cut(f"{what} error {'(no code)' if code is None else code}: {said}", SNIPPET_CHARS + 40)
    return Outcome(kind, message, response, retry_after)


def classify_response(status: int, headers: Any, content: bytes, redactor: Redactor | None = None) -> Outcome:
    """What to do with one HTTP reply: ``ok``, ``retry``, ``permanent`` error or ``fatal`` (stop the run)."""
    redactor = redactor or Redactor(None)
    retry_after = parse_retry_after(headers)
    try:
        body = json.loads(content)
    except (ValueError, RecursionError):
        body = None
    too_deep = body is not None and json_depth(body) > MAX_DEPTH
    body = None if too_deep else body  # kept out of the record: the kit's readers refuse such nesting
    if status == 200:
        if too_deep:
            return Outcome("retry", f"200 with a body nested more than {MAX_DEPTH} levels deep ({len(content)} bytes)")
        if body is None:
            return Outcome("retry", f"200 with a body that is not complete JSON ({len(content)} bytes)")
        if isinstance(body, dict) and body.get("error") and not body.get("choices"):
            return error_outcome(body["error"], "200 carrying", body, retry_after, redactor)
        if not isinstance(body, dict) or not isinstance(body.get("choices"), list) or not body["choices"]:
            return Outcome("retry", "200 without choices", body)
        return Outcome("ok", "", body)
    message = f"HTTP {status}: {redactor.bytes_cut(content, SNIPPET_CHARS)}"
    if status in RETRY_STATUS or status >= 500:
        return Outcome("retry", message, body, retry_after)
    if status in FATAL_STATUS:
        return Outcome("fatal", message, body)
    return Outcome("permanent", message, body)


def failure_reason(message: str) -> str:
    """A short class of an attempt's error message, for the top-reasons tally (numbers and bodies dropped)."""
    m = re.match(r"HTTP \d+", message)
    if m:
        return m.group()
    head = message.split(":")[0] if not message.startswith("stream_incomplete") else message.split("(")[0]
    return re.sub(r"\d+(?:\.\d+)?", "N", head).strip()[:80]


# ---- the output file


def scan_output(path: Path, retry_errors: bool = False) -> tuple[dict[str, dict], int]:
    """Keys already done in ``path`` and how many lines were dropped; rewrites the file (atomically) if any were.

    Kept: ``ok`` records and permanent errors (unless ``retry_errors``). Dropped: torn or invalid
    lines (a run killed mid-write), ``exhausted``/``stream_incomplete``/``interrupted`` records, and
    duplicate keys.
    """
    if not path.exists():
        return {}, 0
    done: dict[str, dict] = {}
    kept: list[bytes] = []
    dropped = 0
    with open(path, "rb") as f:
        for raw in f:
            try:
                rec = json.loads(raw)
                key, status = rec["key"], rec["status"]
                is_error = status != "ok"
                kind = (rec.get("error") or {}).get("kind") if is_error else None
            except (ValueError, RecursionError, KeyError, TypeError, AttributeError):
                dropped += bool(raw.strip())
                continue
            if key in done or (is_error and (kind in RETRYABLE_KINDS or retry_errors)) or not raw.endswith(b"\n"):
                dropped += 1
                continue
            done[key] = {"status": status, "kind": kind}
            kept.append(raw)
    if dropped:
        write_lines(path, kept, fsync=True)
    return done, dropped


def stored_line(redactor: Redactor, text: str) -> str:
    """A serialised record as written: the whole key redacted in any JSON-escaped form (:meth:`Collector.store` has
    already redacted every fragment from the record's strings), lone surrogates (which UTF-8 cannot hold) as ``\\u``
    escapes."""
    return LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", redactor.whole(text))


def header_id(record_id: str) -> str:
    """``record_id`` as an HTTP header value: as is when it is printable ASCII, else percent-encoded UTF-8."""
    if record_id.isascii() and record_id.isprintable() and "%" not in record_id:
        return record_id
    return urllib.parse.quote(_utf8(record_id), safe="".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%"))


def key_notice(base_url: str, api_key: str | None) -> tuple[str, str] | None:
    """``("error"|"warning", message)`` when the key is unset and the endpoint needs (or may need) one."""
    if api_key:
        return None
    host = (urllib.parse.urlsplit(base_url).hostname or "").lower()
    if host == "openrouter.ai" or host.endswith(".openrouter.ai"):
        return "error", f"{API_KEY_ENV} is not set: {host} needs an API key (every request would get HTTP 401)"
    if host in ("127.0.0.1", "localhost", "::1") or host.startswith("127."):
        return None
    return "warning", f"{API_KEY_ENV} is not set: requests to {host} go without an Authorization header"


class CollectError(RuntimeError):
    """An unexpected failure inside the collector, its message redacted (the original had the key in it)."""


class BodyTooLarge(Exception):
    """A reply grew past ``max_body_bytes``."""


# ---- the collector


@dataclass
class Attempts:
    """What one prompt's attempts have gathered so far (kept when the run is interrupted mid-request)."""
    started: float = field(default_factory=time.time)
    t0: float = field(default_factory=time.perf_counter)
    log: list[dict[str, Any]] = field(default_factory=list)
    status: int | None = None
    assembler: StreamAssembler | None = None
    stream: dict[str, Any] | None = None  # chunks, keep-alive comments, [DONE] seen

    def timing(self) -> dict[str, Any]:
        out = {"started_at": self.started, "seconds": round(time.perf_counter() - self.t0, 6),
               "attempts": len(self.log), "latency_s": self.log[-1]["latency_s"] if self.log else None,
               "attempt_log": self.log}
        if self.stream is not None:
            out["stream"] = self.stream
        return out


def stored_base_url(base_url: str) -> str:
    """``base_url`` as each record stores it: scheme, host, port and path, never user, password, query or fragment
    (where a key could ride along).

    >>> stored_base_url("https://user:secret@openrouter.ai/api/v1?key=k#x")
    'https://openrouter.ai/api/v1'
    """
    parts = urllib.parse.urlsplit(base_url)
    host = parts.hostname or ""
    netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def base_record(prompt: Prompt) -> dict[str, Any]:
    return {"id": prompt.id, **({"dataset": prompt.dataset} if prompt.dataset is not None else {}), "key": prompt.key}


class Collector:
    def __init__(self, config: CollectConfig, api_key: str | None = None) -> None:
        self.config = config
        self.api_key = api_key
        self.redactor = Redactor(api_key)
        self.url = config.base_url.rstrip("/") + "/chat/completions"
        self.source = stored_base_url(config.base_url)  # each record says where it was collected (#46: its kind)
        self.counts = {"ok": 0, "permanent": 0, "exhausted": 0, "bad_prompt": 0, "retries": 0,
                       "stream_incomplete": 0, "lone_surrogate": 0, "interrupted": 0}
        self.reasons: Counter[str] = Counter()  # failed attempts by reason
        self.abort: str | None = None
        self.signal: str | None = None
        self._pause_until = 0.0
        self._rng = random.Random()
        self._tasks: list[asyncio.Task] = []

    def backoff(self, failures: int, retry_after: float | None) -> float:
        """Exponential backoff with jitter; never sooner than ``retry_after``, which is capped at
        ``max_retry_after`` (default: ``backoff_max``)."""
        c = self.config
        delay = min(c.backoff_max, c.backoff_base * 2 ** (failures - 1)) * self._rng.uniform(0.5, 1.0)
        if retry_after is not None:
            cap = c.backoff_max if c.max_retry_after is None else c.max_retry_after
            delay = max(delay, min(retry_after, cap))
        return delay

    async def read_body(self, r: Any) -> bytes:
        parts, size = [], 0
        async for data in r.aiter_bytes():
            size += len(data)
            if size > self.config.max_body_bytes:
                raise BodyTooLarge(f"the reply passed --max-body-bytes {self.config.max_body_bytes}")
            parts.append(data)
        return b"".join(parts)

    async def read_stream(self, r: Any, state: Attempts) -> Outcome:
        """Assemble an SSE reply; a break raises (the caller keeps ``state.assembler``)."""
        decoder, asm = SSEDecoder(), StreamAssembler()
        state.assembler, state.stream = asm, {"chunks": 0, "keepalives": 0, "done": False}
        size = 0
        async for data in r.aiter_bytes():
            size += len(data)
            if size > self.config.max_body_bytes:
                raise BodyTooLarge(f"the stream passed --max-body-bytes {self.config.max_body_bytes}")
            for event in decoder.feed(data):
                outcome = self.stream_event(event, asm, state)
                if outcome is not None:
                    return outcome
        for event in decoder.close():
            outcome = self.stream_event(event, asm, state)
            if outcome is not None:
                return outcome
        return self.stream_end(asm, state)

    def stream_event(self, event: Any, asm: StreamAssembler, state: Attempts) -> Outcome | None:
        """Merge one event; an outcome when the stream is over ([DONE] or an error event)."""
        if event.data is None:
            state.stream["keepalives"] += 1
            return None
        if event.data.strip() == DONE:
            state.stream["done"] = True
            return self.stream_end(asm, state)
        try:
            asm.add(json.loads(event.data))
        except (ValueError, RecursionError) as e:  # StreamError is a ValueError too
            raise StreamError(f"chunk {asm.chunks}: {str(e)[:120]}") from None
        state.stream["chunks"] = asm.chunks
        if asm.error is not None:
            outcome = error_outcome(asm.error, "stream carrying", {**asm.response(), "error": asm.error},
                                    redactor=self.redactor)
            outcome.incomplete = outcome.kind == "retry"
            return outcome
        return None

    def stream_end(self, asm: StreamAssembler, state: Attempts) -> Outcome:
        response = asm.response()
        if asm.usage_conflict:
            state.stream["usage_conflict"] = asm.usage_conflict
        if not asm.finished:
            how = "[DONE] came before a finish_reason" if state.stream["done"] else "no finish_reason or [DONE]"
            return Outcome("retry", f"stream_incomplete (ended after {asm.chunks} chunks: {how})", response,
                           incomplete=True)
        if not response.get("choices"):
            return Outcome("retry", "stream without choices", response, incomplete=True)
        errored = [c.get("index") for c in response["choices"] if c.get("finish_reason") == "error"]
        if errored:
            return Outcome("retry", f"stream_incomplete (finish_reason error in choice {errored[0]})", response,
                           incomplete=True)
        return Outcome("ok", "", response)

    async def attempt(self, client: Any, prompt: Prompt, headers: dict[str, str], state: Attempts) -> Outcome:
        """One request, read whole (or as a stream) within ``response_timeout`` and ``max_body_bytes``."""
        async with client.stream("POST", self.url, json=prompt.request, headers=headers) as r:
            state.status = r.status_code
            streamed = "text/event-stream" in r.headers.get("content-type", "").lower()  # media types ignore case
            if r.status_code == 200 and streamed:
                return await self.read_stream(r, state)
            state.assembler = None
            return classify_response(r.status_code, r.headers, await self.read_body(r), self.redactor)

    async def attempt_outcome(self, client: Any, prompt: Prompt, headers: dict[str, str], state: Attempts) -> Outcome:
        import httpx

        c = self.config
        state.assembler, state.status = None, None
        try:
            return await asyncio.wait_for(self.attempt(client, prompt, headers, state), c.response_timeout)
        except asyncio.TimeoutError:
            message = f"response deadline ({c.response_timeout:g} s, --response-timeout) passed"
        except httpx.TimeoutException as e:
            message = f"timeout ({type(e).__name__})"
        except httpx.TransportError as e:
            message = f"{type(e).__name__}: {self.redactor.cut(str(e), SNIPPET_CHARS)}"
        except (BodyTooLarge, StreamError) as e:
            message = str(e)
        except (httpx.HTTPError, httpx.StreamError) as e:  # e.g. DecodingError: a lying Content-Encoding
            message = f"{type(e).__name__}: {self.redactor.cut(str(e), SNIPPET_CHARS)}"
        except (ValueError, TypeError, KeyError, AttributeError, UnicodeError, RecursionError, OverflowError,
                MemoryError, OSError) as e:  # any other answer that breaks a layer: this prompt's error, not the run's
            message = f"unreadable answer ({type(e).__name__}: {self.redactor.cut(str(e), SNIPPET_CHARS)})"
        if state.assembler is not None:  # a stream broke: keep what arrived
            return Outcome("retry", f"stream_incomplete ({message})", state.assembler.response(), incomplete=True)
        return Outcome("retry", message)

    async def request_one(self, client: Any, prompt: Prompt, state: Attempts | None = None) -> dict[str, Any]:
        """Send one prompt until it succeeds, fails permanently or runs out of attempts; returns its record."""
        c = self.config
        state = state if state is not None else Attempts()
        headers = {RECORD_ID_HEADER: header_id(prompt.id)}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        outcome = Outcome("retry", "not sent")
        for attempt in range(1, c.max_attempts + 1):
            pause = self._pause_until - time.monotonic()
            if pause > 0:
                await asyncio.sleep(pause)
            a0 = time.perf_counter()
            outcome = await self.attempt_outcome(client, prompt, headers, state)
            entry = {"attempt": attempt, "status": state.status, "latency_s": round(time.perf_counter() - a0, 6)}
            if outcome.kind != "ok":
                entry["error"] = self.redactor.cut(outcome.message, SNIPPET_CHARS)
                self.reasons[failure_reason(entry["error"])] += 1
            state.log.append(entry)
            if outcome.kind != "retry" or attempt == c.max_attempts:
                break
            wait = self.backoff(attempt, outcome.retry_after)
            if outcome.retry_after is not None:  # the server asked everyone to wait
                self._pause_until = max(self._pause_until, time.monotonic() + wait)
            entry["wait_s"] = round(wait, 4)
            self.counts["retries"] += 1
            await asyncio.sleep(wait)
        return self.outcome_record(prompt, outcome, state)

    def outcome_record(self, prompt: Prompt, outcome: Outcome, state: Attempts) -> dict[str, Any]:
        if outcome.kind == "ok":
            state_name, error = "ok", None
        else:
            if outcome.kind == "fatal":
                self.abort = outcome.message
            kind = {"retry": "stream_incomplete" if outcome.incomplete else "exhausted", "permanent": "permanent",
                    "fatal": "fatal"}[outcome.kind]
            state_name, error = "error", {"kind": kind, "http_status": state.status,
                                          "message": self.redactor.cut(outcome.message, SNIPPET_CHARS + 100)}
        return {**base_record(prompt), "status": state_name, "error": error, "request": prompt.request,
                "response": outcome.response, "http_status": state.status, "timing": state.timing()}

    def interrupted_record(self, prompt: Prompt, state: Attempts) -> dict[str, Any]:
        partial = state.assembler.response() if state.assembler is not None else None
        message = f"interrupted by {self.signal or 'a stop'} during attempt {len(state.log) + 1}"
        return {**base_record(prompt), "status": "error",
                "error": {"kind": "interrupted", "http_status": state.status, "message": message},
                "request": prompt.request, "response": partial, "http_status": state.status,
                "timing": state.timing()}

    def bad_prompt_record(self, prompt: Prompt) -> dict[str, Any]:
        return {**base_record(prompt), "status": "error",
                "error": {"kind": "bad_prompt", "http_status": None, "message": prompt.error},
                "request": prompt.body, "response": None, "http_status": None, "timing": None}

    def store(self, writer: JsonlAppender, record: dict[str, Any]) -> str:
        """Write ``record`` with the key redacted in every form and fragment (:meth:`Redactor.record`: the assembled
        record is scanned, not only each string); an answer with lone surrogates becomes a ``lone_surrogate`` error
        (kept as escapes), one that cannot be written an ``unstorable`` one (the answer dropped, the reason kept)."""
        record = self.redactor.record({**record, "base_url": self.source})
        if record["status"] == "ok":
            bad = surrogate_paths(record.get("response"), "response")
            usage = record["response"].get("usage") if isinstance(record.get("response"), dict) else None
            if problems := usage_count_problems(usage):  # validated where it enters: never a stored ok
                record["status"] = "error"
                record["error"] = {"kind": "bad_usage", "http_status": record.get("http_status"),
                                   "message": self.redactor.cut("the answer's usage is not counts: "
                                                                + "; ".join(problems), SNIPPET_CHARS)}
            elif bad:
                record["status"] = "error"
                record["error"] = {"kind": "lone_surrogate", "http_status": record.get("http_status"),
                                   "message": f"the answer holds lone surrogates (not valid Unicode) at "
                                              f"{', '.join(bad)}; stored as \\u escapes"}
        try:
            writer.append(record)
        except (ValueError, TypeError, RecursionError, OverflowError) as e:
            record = {**record, "status": "error", "response": None,
                      "error": {"kind": "unstorable", "http_status": record.get("http_status"),
                                "message": self.redactor.cut(f"the answer cannot be written as JSON "
                                                             f"({type(e).__name__}: {e})", SNIPPET_CHARS)}}
            writer.append(record)
        kind = "ok" if record["status"] == "ok" else record["error"]["kind"]
        self.counts[kind] = self.counts.get(kind, 0) + 1
        return kind

    def stop(self, name: str) -> None:
        """Stop the run (a signal): in-flight requests are written as ``interrupted`` records."""
        if self.signal is None:
            self.signal, self.abort = name, f"interrupted by {name}"
            for task in self._tasks:
                task.cancel()

    async def worker(self, client: Any, queue: asyncio.Queue, writer: JsonlAppender, on_done: Any) -> None:
        while not self.abort:
            try:
                prompt = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            state = Attempts()
            if prompt.error is not None:
                record = self.bad_prompt_record(prompt)
            else:
                try:
                    record = await self.request_one(client, prompt, state)
                except asyncio.CancelledError:
                    self.store(writer, self.interrupted_record(prompt, state))
                    raise
            if record["status"] != "ok" and record["error"]["kind"] == "fatal":  # not stored: the next run retries it
                return
            self.store(writer, record)
            if on_done:
                on_done(record)

    async def run(self, prompts: list[Prompt], writer: JsonlAppender, on_done: Any = None) -> None:
        import httpx

        c = self.config
        queue: asyncio.Queue[Prompt] = asyncio.Queue()
        for p in prompts:
            queue.put_nowait(p)
        limits = httpx.Limits(max_connections=c.concurrency, max_keepalive_connections=c.concurrency)
        timeout = httpx.Timeout(c.timeout, connect=min(c.timeout, 10.0))
        async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
            self._tasks = [asyncio.create_task(self.worker(client, queue, writer, on_done))
                           for _ in range(max(1, c.concurrency))]
            if self.signal:
                self.stop(self.signal)
            results = await asyncio.gather(*self._tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                raise result


def summarize_output(path: str | Path) -> dict[str, Any]:
    """Totals over an output file: records by status, usage tokens and cost."""
    totals: dict[str, Any] = {"records": 0, "ok": 0, "errors": 0, "bad_usage": 0, "prompt_tokens": 0,
                              "completion_tokens": 0, "reasoning_tokens": 0, "cached_tokens": 0, "cost": 0.0}
    for line in read_jsonl(path):
        rec = line.obj
        if not isinstance(rec, dict):
            continue
        totals["records"] += 1
        if rec.get("status") != "ok":
            totals["errors"] += 1
            continue
        usage = rec["response"].get("usage") if isinstance(rec.get("response"), dict) else None
        if usage_count_problems(usage):  # an earlier run's record with broken counts: an error, never summed
            totals["errors"] += 1
            totals["bad_usage"] += 1
            continue
        totals["ok"] += 1
        usage = usage or {}
        for name, value in (("prompt_tokens", usage.get("prompt_tokens")),
                            ("completion_tokens", usage.get("completion_tokens")),
                            ("reasoning_tokens", (usage.get("completion_tokens_details") or {}).get("reasoning_tokens")),
                            ("cached_tokens", (usage.get("prompt_tokens_details") or {}).get("cached_tokens")),
                            ("cost", usage.get("cost"))):
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                totals[name] += value
    return totals


def _signal_handlers(collector: Collector) -> list[int]:
    """Route SIGINT/SIGTERM to ``collector.stop`` (main thread only); returns the signals to restore."""
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, collector.stop, sig.name)
            installed.append(sig)
        except (ValueError, RuntimeError, NotImplementedError):  # not the main thread (a notebook) or no support
            pass
    return installed


async def collect_async(prompts_path: str | Path, output_path: str | Path, config: CollectConfig,
                        api_key: str | None = None) -> dict[str, Any]:
    """Collect every prompt not yet in ``output_path``; returns the summary (also written to ``<output>.summary.json``).
    One run per output: a second run on it is refused while one runs (``.OUT.lock``, as ``reconstruct`` holds), so
    two runs never both send (and bill) the same prompts."""
    from kimi_eagle.reconstruct.job import output_lock

    output = Path(output_path)
    if output.exists() and not output.is_file():
        raise ValueError(f"{output}: the output must be a file (it is a directory or something else)")
    t0 = time.perf_counter()
    prompts = load_prompts(prompts_path, config.model, config.defaults, config.limit)
    with output_lock(output):
        return await _collect_locked(prompts, output, config, api_key, t0)


async def _collect_locked(prompts: list[Prompt], output: Path, config: CollectConfig, api_key: str | None,
                          t0: float) -> dict[str, Any]:
    """:func:`collect_async` once the output is locked."""
    from tqdm.auto import tqdm

    done, dropped = scan_output(output, config.retry_errors)
    todo = [p for p in prompts if p.key not in done]
    stale = len(set(done) - {p.key for p in prompts})
    collector = Collector(config, api_key)
    # one complete, flushed line per record, the API key redacted, synced to disk every second
    writer = JsonlAppender(output, transform=lambda text: stored_line(collector.redactor, text), fsync_every=1.0)
    bar = tqdm(total=len(prompts), initial=len(prompts) - len(todo), disable=not config.progress, unit="req",
               desc="collect", file=sys.stderr, dynamic_ncols=True)

    def on_done(record: dict) -> None:
        bar.update(1)
        bar.set_postfix({k: v for k, v in collector.counts.items() if v}, refresh=False)

    installed = _signal_handlers(collector)
    try:
        await collector.run(todo, writer, on_done)
    finally:
        for sig in installed:
            asyncio.get_running_loop().remove_signal_handler(sig)
        writer.close()
        bar.close()
    totals = summarize_output(output)
    counts = {**collector.counts, "ok": totals["ok"], "ok_this_run": collector.counts["ok"]}  # ok: reused ones too
    summary = {"prompts": len(prompts), "already_done": len(prompts) - len(todo), "requested": len(todo),
               "dropped_on_resume": dropped, "stale_records": stale, **counts, "aborted": collector.abort,
               "signal": collector.signal, "failure_reasons": dict(collector.reasons.most_common(10)),
               "seconds": round(time.perf_counter() - t0, 3), "totals": totals}
    summary = collector.redactor.value(summary)  # an upstream's error body may echo the Authorization header
    write_text(output.with_name(output.name + ".summary.json"), json.dumps(summary, indent=2))
    from kimi_eagle.apps.reports.outputs import write_summary_tables

    write_summary_tables(summary, output.with_name(output.name + ".summary.json"))  # .summary.md, .summary.csv
    return summary


def collect(prompts_path: str | Path, output_path: str | Path, config: CollectConfig,
            api_key: str | None = None) -> dict[str, Any]:
    """Blocking ``collect_async``; works inside a running event loop too (e.g. a notebook). The key never leaves in
    the return value or in an exception's message (both redacted)."""
    api_key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
    try:
        return _collect_blocking(collect_async(prompts_path, output_path, config, api_key))
    except Exception as e:
        redactor = Redactor(api_key)
        text = str(e)
        if api_key and (redactor(text) != text or redactor(repr(e.args)) != repr(e.args)):
            raise CollectError(f"{type(e).__name__}: {redactor(text)}") from None
        raise


def exit_code(summary: dict[str, Any]) -> int:
    """0: every prompt stored ok; 1: some stored as errors; 3: stopped by 401/402; 130/143: stopped by a signal."""
    if summary.get("signal"):
        return SIGNAL_EXIT.get(summary["signal"], 130)
    if summary.get("aborted"):
        return 3
    totals = summary.get("totals") or {}
    return 1 if totals.get("errors") or totals.get("ok", 0) < summary.get("prompts", 0) else 0


def _collect_blocking(coro: Any) -> dict[str, Any]:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = asyncio.run(coro)
        except BaseException as e:  # re-raised in the caller's thread
            result["error"] = e

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


# ---- command line


def provider_options(order: str | None = None, only: str | None = None, ignore: str | None = None,
                     quantizations: str | None = None, allow_fallbacks: bool | None = None,
                     require_parameters: bool | None = None, data_collection: str | None = None,
                     extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """An OpenRouter ``provider`` object from comma-separated lists and flags (unset ones omitted)."""
    def split(s: str | None) -> list[str] | None:
        return [x.strip() for x in s.split(",") if x.strip()] if s else None

    opts: dict[str, Any] = dict(extra or {})
    for name, value in (("order", split(order)), ("only", split(only)), ("ignore", split(ignore)),
                        ("quantizations", split(quantizations)), ("allow_fallbacks", allow_fallbacks),
                        ("require_parameters", require_parameters), ("data_collection", data_collection)):
        if value is not None:
            opts[name] = value
    unknown = set(opts) - set(PROVIDER_FIELDS)
    if unknown:
        raise ValueError(f"unknown provider options {sorted(unknown)}; known: {list(PROVIDER_FIELDS)}")
    return opts
