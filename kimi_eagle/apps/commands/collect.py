"""``kimi-eagle collect``: collect chat completions from an OpenAI/OpenRouter-compatible API, resumably."""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from kimi_eagle.apps.api.collect import API_KEY_ENV, CollectConfig, collect, exit_code, key_notice, provider_options
from kimi_eagle.apps.cli import NONNEG_FLOAT, NONNEG_INT, POSITIVE_FLOAT, POSITIVE_INT, TOP_P, add_option
from kimi_eagle.reuse import note_collect, reused_line


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompts", metavar="PROMPTS", help="prompts JSONL")
    o = p.add_argument_group("output")
    o.add_argument("-o", "--output", required=True, help="responses JSONL (appended; rerun to resume)")
    o.add_argument("--limit", type=POSITIVE_INT, help="only the first N prompts")
    o.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    c = p.add_argument_group("connection")
    c.add_argument("--base-url", required=True, help="e.g. https://openrouter.ai/api/v1 or http://127.0.0.1:8000/v1")
    c.add_argument("--model", required=True, help="API model name (a prompt line's own `model` wins; not a directory)")
    c.add_argument("--concurrency", type=POSITIVE_INT, default=4)
    c.add_argument("--timeout", type=POSITIVE_FLOAT, default=120.0, help="seconds of silence allowed while connecting or reading")
    add_option(c, "--response-timeout", type=POSITIVE_FLOAT, default=900.0,
               help="seconds for a whole attempt, first byte to last (a stream included); an endless or trickling "
                    "body ends here")
    add_option(c, "--max-body-bytes", type=POSITIVE_INT, default=64 << 20,
               help="bytes one reply may have (decoded, SSE framing included); a larger one is cut and retried")
    add_option(c, "--stream", action="store_true",
               help="request `stream: true` (with `stream_options.include_usage`) and assemble the chunks into the "
                    "same record a non-streaming request gives; a broken stream is kept as `stream_incomplete`")
    r = p.add_argument_group("retries")
    r.add_argument("--max-attempts", type=POSITIVE_INT, default=8)
    r.add_argument("--backoff-base", type=NONNEG_FLOAT, default=0.5)
    r.add_argument("--backoff-max", type=NONNEG_FLOAT, default=30.0, help="seconds; also caps a server's Retry-After")
    add_option(r, "--max-retry-after", type=NONNEG_FLOAT, default=None,
               help="cap on a server's Retry-After in seconds (default: --backoff-max)")
    r.add_argument("--retry-errors", action="store_true", help="also redo stored permanent errors")
    s = p.add_argument_group("sampling (request defaults)")
    s.add_argument("--temperature", type=NONNEG_FLOAT)
    s.add_argument("--top-p", type=TOP_P)
    s.add_argument("--max-tokens", type=POSITIVE_INT)
    s.add_argument("--seed", type=NONNEG_INT)
    s.add_argument("--extra", type=json.loads, default={}, help="JSON object merged into every request")
    add_option(s, "--logprobs", action="store_true",
               help="request `logprobs: true` (the tokens' bytes give the sampled segmentation, where the provider "
                    "returns them); stored as given")
    add_option(s, "--top-logprobs", type=NONNEG_INT, default=None, help="request `top_logprobs: K` (implies --logprobs)")
    g = p.add_argument_group("OpenRouter provider routing")
    g.add_argument("--provider", type=json.loads, help="a whole `provider` JSON object")
    g.add_argument("--provider-order")
    g.add_argument("--provider-only")
    g.add_argument("--provider-ignore")
    g.add_argument("--quantizations")
    g.add_argument("--no-fallbacks", action="store_true", help="allow_fallbacks: false")
    g.add_argument("--require-parameters", action="store_true",
                   help="require_parameters: true (only providers that support every request parameter)")
    g.add_argument("--data-collection", choices=["allow", "deny"])
    q = p.add_argument_group("reasoning")
    q.add_argument("--reasoning", type=json.loads, help="a whole `reasoning` JSON object")
    q.add_argument("--reasoning-effort", choices=["minimal", "low", "medium", "high"])
    q.add_argument("--reasoning-max-tokens", type=POSITIVE_INT)
    q.add_argument("--reasoning-exclude", action="store_true", help="reasoning.exclude: true (the answer carries no reasoning)")


def request_defaults(args: argparse.Namespace) -> dict[str, Any]:
    defaults: dict[str, Any] = dict(args.extra or {})
    for name, value in (("temperature", args.temperature), ("top_p", args.top_p), ("max_tokens", args.max_tokens),
                        ("seed", args.seed)):
        if value is not None:
            defaults[name] = value
    if args.stream:
        defaults["stream"] = True
        defaults["stream_options"] = {"include_usage": True, **(defaults.get("stream_options") or {})}
    if args.logprobs or args.top_logprobs is not None:
        if args.top_logprobs is not None and not 0 <= args.top_logprobs <= 20:
            raise ValueError(f"--top-logprobs must be 0..20, got {args.top_logprobs}")
        defaults["logprobs"] = True
        if args.top_logprobs is not None:
            defaults["top_logprobs"] = args.top_logprobs
    provider = provider_options(args.provider_order, args.provider_only, args.provider_ignore, args.quantizations,
                                False if args.no_fallbacks else None, True if args.require_parameters else None,
                                args.data_collection, args.provider)
    if provider:
        defaults["provider"] = provider
    reasoning = dict(args.reasoning or {})
    if args.reasoning_effort:
        reasoning["effort"] = args.reasoning_effort
    if args.reasoning_max_tokens is not None:
        reasoning["max_tokens"] = args.reasoning_max_tokens
    if args.reasoning_exclude:
        reasoning["exclude"] = True
    if reasoning:
        defaults["reasoning"] = reasoning
    return defaults


def run(args: argparse.Namespace) -> int:
    config = CollectConfig(args.base_url, args.model, args.concurrency, args.max_attempts, args.timeout,
                           args.backoff_base, args.backoff_max, args.max_retry_after, defaults=request_defaults(args),
                           retry_errors=args.retry_errors, limit=args.limit, progress=not args.no_progress,
                           response_timeout=args.response_timeout, max_body_bytes=args.max_body_bytes)
    notice = key_notice(config.base_url, os.environ.get(API_KEY_ENV))
    if notice is not None:
        level, message = notice
        if level == "error":
            raise ValueError(message)
        print(f"kimi-eagle collect: warning: {message}", file=sys.stderr)
    summary = collect(args.prompts, args.output, config)
    print(json.dumps(summary, indent=2))
    reused: dict[str, str] = {}
    note_collect(reused, "collect", summary)
    print(f"kimi-eagle collect: {summary['requested']} requests this run; {reused_line(reused)}", file=sys.stderr)
    if summary["failure_reasons"]:
        top = ", ".join(f"{reason} x{n}" for reason, n in list(summary["failure_reasons"].items())[:5])
        print(f"kimi-eagle collect: failed attempts by reason: {top}", file=sys.stderr)
    if summary["aborted"]:
        print(f"kimi-eagle collect: stopped: {summary['aborted']}", file=sys.stderr)
    return exit_code(summary)
