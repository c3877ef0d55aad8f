"""``kimi-eagle collect``: collect chat completions from an OpenAI/OpenRouter-compatible API, resumably.

Input: a JSONL of prompts, one per line, any of
``{"id"?, "dataset"?, "messages": [...], ...request fields}``, ``{"id"?, "prompt": "text"}`` or
``{"id"?, "dataset"?, "request": {...}}``. Request fields on the line win over the command-line
defaults (``--model``, sampling, ``provider`` routing, ``reasoning``). A line without ``id`` gets
``line-<n>``.

Output: API records (docs/CONTRACTS.md) appended as JSONL in completion order, exactly one per
prompt: ``{"id", "dataset"?, "key", "status": "ok"|"error", "error", "request", "response",
"http_status", "timing"}``. ``request`` is the exact JSON body sent, ``response`` the parsed body
as received (every field kept). ``key`` is the sha256 of the record id and request body: a rerun
skips keys already stored (``ok`` or a permanent error), drops a torn last line and transient
failures, and requests only what is missing -- killing a run and resuming loses and duplicates
nothing.

Retries: 429, 408, 409, 425, 5xx, timeouts, transport errors, and 200s whose body is not a
complete completion (truncated JSON, an ``error`` object, no choices) are retried with exponential
backoff and jitter, never sooner than ``Retry-After`` (which also pauses every worker); after
``max_attempts`` the record is stored as ``exhausted`` (retried on the next run). Other 4xx
are permanent errors, stored and not retried; 401/402 stop the run (nothing more would succeed).

The API key comes from ``OPENROUTER_API_KEY`` only, goes only into the ``Authorization`` header,
and is redacted from anything written. Each request carries its record id in ``X-Record-Id``
(``kimi-eagle serve`` logs it as the engine record's id).
"""
from __future__ import annotations

import asyncio
import email.utils
import hashlib
import json
import math
import os
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kimi_eagle.io import JsonlAppender, read_jsonl, write_lines, write_text

API_KEY_ENV = "OPENROUTER_API_KEY"
RECORD_ID_HEADER = "X-Record-Id"
RETRY_STATUS = {408, 409, 425, 429}
FATAL_STATUS = {401, 402}
PROVIDER_FIELDS = ("order", "only", "ignore", "quantizations", "allow_fallbacks", "require_parameters",
                   "data_collection", "sort", "max_price", "zdr")
REDACTED = "[REDACTED]"


@dataclass
class CollectConfig:
    base_url: str
    model: str
    concurrency: int = 4
    max_attempts: int = 8
    timeout: float = 120.0  # seconds per attempt
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    max_retry_after: float = 300.0
    defaults: dict[str, Any] = field(default_factory=dict)  # request fields for every prompt
    retry_errors: bool = False  # also redo stored permanent errors
    limit: int | None = None  # only the first N prompts
    progress: bool = True

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
        if self.limit is not None:
            whole("limit", self.limit, 1)
        number("timeout", self.timeout, True)
        number("backoff_base", self.backoff_base, False)
        number("backoff_max", self.backoff_max, False)
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


def request_key(record_id: str, body: Any) -> str:
    canonical = json.dumps({"id": record_id, "request": body}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


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


def load_prompts(path: str | Path, model: str, defaults: dict[str, Any] | None = None,
                 limit: int | None = None) -> list[Prompt]:
    """Every prompt line, in order; a bad line becomes a Prompt with ``error`` (never dropped)."""
    prompts: list[Prompt] = []
    seen: set[str] = set()
    for line in read_jsonl(path):
        if limit is not None and len(prompts) >= limit:
            break
        obj = line.obj
        rid = str(obj["id"]) if isinstance(obj, dict) and obj.get("id") is not None else f"line-{line.lineno}"
        dataset = obj.get("dataset") if isinstance(obj, dict) else None
        try:
            if line.error:
                raise ValueError(line.error)
            if not isinstance(obj, dict):
                raise ValueError("prompt line is not a JSON object")
            if rid in seen:
                raise ValueError(f"duplicate id {rid!r}")
            body = build_request(obj, model, defaults or {})
            prompts.append(Prompt(rid, body, request_key(rid, body), dataset))
        except ValueError as e:
            if rid in seen:
                rid = f"{rid}@line-{line.lineno}"
            prompts.append(Prompt(rid, None, request_key(rid, {"line": line.lineno, "obj": obj}), dataset,
                                  f"line {line.lineno}: {e}"))
        seen.add(rid)
    return prompts


# ---- classifying replies


@dataclass
class Outcome:
    kind: str  # "ok" | "retry" | "permanent" | "fatal"
    message: str = ""
    response: Any = None
    retry_after: float | None = None


def parse_retry_after(headers: Any, now: float | None = None) -> float | None:
    """Seconds to wait from ``Retry-After`` (seconds or an HTTP date) or OpenRouter's ms ``X-RateLimit-Reset``."""
    now = time.time() if now is None else now
    value = headers.get("retry-after")
    if value:
        try:
            return max(0.0, float(value))
        except ValueError:
            try:
                return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - now)
            except (TypeError, ValueError):
                pass
    reset = headers.get("x-ratelimit-reset")
    if reset:
        try:
            return max(0.0, float(reset) / 1000 - now)
        except ValueError:
            pass
    return None


def classify_response(status: int, headers: Any, content: bytes) -> Outcome:
    """What to do with one HTTP reply: ``ok``, ``retry``, ``permanent`` error or ``fatal`` (stop the run)."""
    retry_after = parse_retry_after(headers)
    try:
        body = json.loads(content)
    except (json.JSONDecodeError, UnicodeDecodeError):
        body = None
    snippet = content[:300].decode("utf-8", errors="replace")
    if status == 200:
        if body is None:
            return Outcome("retry", f"200 with a body that is not complete JSON ({len(content)} bytes)")
        if isinstance(body, dict) and body.get("error") and not body.get("choices"):
            err = body["error"] if isinstance(body["error"], dict) else {"message": str(body["error"])}
            code = err.get("code")
            kind = "retry" if not isinstance(code, int) or code in RETRY_STATUS or code >= 500 else "permanent"
            return Outcome(kind, f"200 carrying error {code}: {err.get('message')}", body, retry_after)
        if not isinstance(body, dict) or not isinstance(body.get("choices"), list) or not body["choices"]:
            return Outcome("retry", "200 without choices", body)
        return Outcome("ok", "", body)
    message = f"HTTP {status}: {snippet}"
    if status in RETRY_STATUS or status >= 500:
        return Outcome("retry", message, body, retry_after)
    if status in FATAL_STATUS:
        return Outcome("fatal", message, body)
    return Outcome("permanent", message, body)


# ---- the output file


def scan_output(path: Path, retry_errors: bool = False) -> tuple[dict[str, dict], int]:
    """Keys already done in ``path`` and how many lines were dropped; rewrites the file (atomically) if any were.

    Kept: ``ok`` records and permanent errors (unless ``retry_errors``). Dropped: torn or invalid
    lines (a run killed mid-write), ``exhausted`` records, and duplicate keys.
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
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
                dropped += bool(raw.strip())
                continue
            if key in done or (is_error and (kind == "exhausted" or retry_errors)) or not raw.endswith(b"\n"):
                dropped += 1
                continue
            done[key] = {"status": status, "kind": kind}
            kept.append(raw)
    if dropped:
        write_lines(path, kept, fsync=True)
    return done, dropped


def redact(text: str, secret: str | None) -> str:
    """``text`` with every occurrence of ``secret`` (as is, and as JSON writes it) replaced by ``[REDACTED]``."""
    if not secret:
        return text
    for form in {secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1]}:
        text = text.replace(form, REDACTED)
    return text


def redact_value(value: Any, secret: str | None) -> Any:
    """``value`` (JSON-like: dicts, lists, strings, numbers) with ``secret`` redacted from every string and key."""
    if not secret:
        return value
    if isinstance(value, str):
        return redact(value, secret)
    if isinstance(value, dict):
        return {redact_value(k, secret): redact_value(v, secret) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_value(v, secret) for v in value]
    return value


class CollectError(RuntimeError):
    """An unexpected failure inside the collector, its message redacted (the original had the key in it)."""


# ---- the collector


class Collector:
    def __init__(self, config: CollectConfig, api_key: str | None = None) -> None:
        self.config = config
        self.api_key = api_key
        self.url = config.base_url.rstrip("/") + "/chat/completions"
        self.counts = {"ok": 0, "permanent": 0, "exhausted": 0, "bad_prompt": 0, "retries": 0}
        self.abort: str | None = None
        self._pause_until = 0.0
        self._rng = random.Random()

    def backoff(self, failures: int, retry_after: float | None) -> float:
        """Exponential backoff with jitter; never sooner than ``retry_after`` (capped at max_retry_after)."""
        c = self.config
        delay = min(c.backoff_max, c.backoff_base * 2 ** (failures - 1)) * self._rng.uniform(0.5, 1.0)
        if retry_after is not None:
            delay = max(delay, min(retry_after, c.max_retry_after))
        return delay

    async def request_one(self, client: Any, prompt: Prompt) -> dict[str, Any]:
        """Send one prompt until it succeeds, fails permanently or runs out of attempts; returns its record."""
        import httpx

        c = self.config
        headers = {RECORD_ID_HEADER: prompt.id}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        log: list[dict[str, Any]] = []
        started = time.time()
        t0 = time.perf_counter()
        outcome = Outcome("retry", "not sent")
        status: int | None = None
        for attempt in range(1, c.max_attempts + 1):
            pause = self._pause_until - time.monotonic()
            if pause > 0:
                await asyncio.sleep(pause)
            a0 = time.perf_counter()
            try:
                r = await client.post(self.url, json=prompt.request, headers=headers)
                status = r.status_code
                outcome = classify_response(r.status_code, r.headers, r.content)
            except httpx.TimeoutException as e:
                status, outcome = None, Outcome("retry", f"timeout ({type(e).__name__})")
            except httpx.TransportError as e:
                status, outcome = None, Outcome("retry", f"{type(e).__name__}: {e}")
            entry = {"attempt": attempt, "status": status, "latency_s": round(time.perf_counter() - a0, 6)}
            if outcome.kind != "ok":
                entry["error"] = outcome.message[:300]
            log.append(entry)
            if outcome.kind != "retry" or attempt == c.max_attempts:
                break
            wait = self.backoff(attempt, outcome.retry_after)
            if outcome.retry_after is not None:  # the server asked everyone to wait
                self._pause_until = max(self._pause_until, time.monotonic() + wait)
            entry["wait_s"] = round(wait, 4)
            self.counts["retries"] += 1
            await asyncio.sleep(wait)
        timing = {"started_at": started, "seconds": round(time.perf_counter() - t0, 6), "attempts": len(log),
                  "latency_s": log[-1]["latency_s"], "attempt_log": log}
        if outcome.kind == "ok":
            state, error = "ok", None
        else:
            if outcome.kind == "fatal":
                self.abort = outcome.message
            kind = {"retry": "exhausted", "permanent": "permanent", "fatal": "fatal"}[outcome.kind]
            state, error = "error", {"kind": kind, "http_status": status, "message": outcome.message}
        return {"id": prompt.id, **({"dataset": prompt.dataset} if prompt.dataset is not None else {}),
                "key": prompt.key, "status": state, "error": error, "request": prompt.request,
                "response": outcome.response, "http_status": status, "timing": timing}

    async def run(self, prompts: list[Prompt], writer: JsonlAppender, on_done: Any = None) -> None:
        import httpx

        c = self.config
        queue: asyncio.Queue[Prompt] = asyncio.Queue()
        for p in prompts:
            queue.put_nowait(p)
        limits = httpx.Limits(max_connections=c.concurrency, max_keepalive_connections=c.concurrency)
        timeout = httpx.Timeout(c.timeout, connect=min(c.timeout, 10.0))

        async def worker(client: httpx.AsyncClient) -> None:
            while not self.abort:
                try:
                    prompt = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                if prompt.error is not None:
                    record = {"id": prompt.id, **({"dataset": prompt.dataset} if prompt.dataset is not None else {}),
                              "key": prompt.key, "status": "error",
                              "error": {"kind": "bad_prompt", "http_status": None, "message": prompt.error},
                              "request": None, "response": None, "http_status": None, "timing": None}
                else:
                    record = await self.request_one(client, prompt)
                kind = "ok" if record["status"] == "ok" else record["error"]["kind"]
                if kind == "fatal":  # not stored: the next run retries it
                    return
                writer.append(record)
                self.counts[kind] += 1
                if on_done:
                    on_done(record)

        async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
            await asyncio.gather(*(worker(client) for _ in range(max(1, c.concurrency))))


def summarize_output(path: str | Path) -> dict[str, Any]:
    """Totals over an output file: records by status, usage tokens and cost."""
    totals: dict[str, Any] = {"records": 0, "ok": 0, "errors": 0, "prompt_tokens": 0, "completion_tokens": 0,
                              "reasoning_tokens": 0, "cost": 0.0}
    for line in read_jsonl(path):
        rec = line.obj
        if not isinstance(rec, dict):
            continue
        totals["records"] += 1
        if rec.get("status") != "ok":
            totals["errors"] += 1
            continue
        totals["ok"] += 1
        usage = (rec.get("response") or {}).get("usage") or {}
        totals["prompt_tokens"] += usage.get("prompt_tokens") or 0
        totals["completion_tokens"] += usage.get("completion_tokens") or 0
        totals["reasoning_tokens"] += (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
        totals["cost"] += float(usage.get("cost") or 0)
    return totals


async def collect_async(prompts_path: str | Path, output_path: str | Path, config: CollectConfig,
                        api_key: str | None = None) -> dict[str, Any]:
    """Collect every prompt not yet in ``output_path``; returns the summary (also written to ``<output>.summary.json``)."""
    from tqdm.auto import tqdm

    output = Path(output_path)
    if output.exists() and not output.is_file():
        raise ValueError(f"{output}: the output must be a file (it is a directory or something else)")
    t0 = time.perf_counter()
    prompts = load_prompts(prompts_path, config.model, config.defaults, config.limit)
    done, dropped = scan_output(output, config.retry_errors)
    todo = [p for p in prompts if p.key not in done]
    stale = len(set(done) - {p.key for p in prompts})
    collector = Collector(config, api_key)
    # one complete, flushed line per record, the API key redacted, synced to disk every second
    writer = JsonlAppender(output, transform=(lambda text: redact(text, api_key)) if api_key else None, fsync_every=1.0)
    bar = tqdm(total=len(prompts), initial=len(prompts) - len(todo), disable=not config.progress, unit="req",
               desc="collect", file=sys.stderr, dynamic_ncols=True)

    def on_done(record: dict) -> None:
        bar.update(1)
        bar.set_postfix({k: v for k, v in collector.counts.items() if v}, refresh=False)

    try:
        await collector.run(todo, writer, on_done)
    finally:
        writer.close()
        bar.close()
    seconds = time.perf_counter() - t0
    summary = {"prompts": len(prompts), "already_done": len(prompts) - len(todo), "requested": len(todo),
               "dropped_on_resume": dropped, "stale_records": stale, **collector.counts, "aborted": collector.abort,
               "seconds": round(seconds, 3), "totals": summarize_output(output)}
    summary = redact_value(summary, api_key)  # an upstream's error body may echo the Authorization header
    write_text(output.with_name(output.name + ".summary.json"), json.dumps(summary, indent=2))
    return summary


def collect(prompts_path: str | Path, output_path: str | Path, config: CollectConfig,
            api_key: str | None = None) -> dict[str, Any]:
    """Blocking ``collect_async``; works inside a running event loop too (e.g. a notebook). The key never leaves in
    the return value or in an exception's message (both redacted)."""
    api_key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
    try:
        return _collect_blocking(collect_async(prompts_path, output_path, config, api_key))
    except Exception as e:
        if api_key and (api_key in str(e) or api_key in repr(e.args)):
            raise CollectError(f"{type(e).__name__}: {redact(str(e), api_key)}") from None
        raise


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
