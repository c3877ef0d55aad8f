"""``kimi-eagle collect``: collect chat completions from an OpenAI/OpenRouter-compatible API, resumably."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kimi_eagle.apps.api.collect import CollectConfig, collect, provider_options


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompts", metavar="PROMPTS", help="prompts JSONL")
    o = p.add_argument_group("output")
    o.add_argument("-o", "--output", required=True, help="responses JSONL (appended; rerun to resume)")
    o.add_argument("--limit", type=int, help="only the first N prompts")
    o.add_argument("--no-progress", action="store_true")
    c = p.add_argument_group("connection")
    c.add_argument("--base-url", required=True, help="e.g. https://openrouter.ai/api/v1 or http://127.0.0.1:8000/v1")
    c.add_argument("--model", required=True, help="API model name (a prompt line's own `model` wins; not a directory)")
    c.add_argument("--concurrency", type=int, default=4)
    c.add_argument("--timeout", type=float, default=120.0, help="seconds per attempt")
    r = p.add_argument_group("retries")
    r.add_argument("--max-attempts", type=int, default=8)
    r.add_argument("--backoff-base", type=float, default=0.5)
    r.add_argument("--backoff-max", type=float, default=30.0)
    r.add_argument("--retry-errors", action="store_true", help="also redo stored permanent errors")
    s = p.add_argument_group("sampling (request defaults)")
    s.add_argument("--temperature", type=float)
    s.add_argument("--top-p", type=float)
    s.add_argument("--max-tokens", type=int)
    s.add_argument("--seed", type=int)
    s.add_argument("--extra", type=json.loads, default={}, help="JSON object merged into every request")
    g = p.add_argument_group("OpenRouter provider routing")
    g.add_argument("--provider", type=json.loads, help="a whole `provider` JSON object")
    g.add_argument("--provider-order")
    g.add_argument("--provider-only")
    g.add_argument("--provider-ignore")
    g.add_argument("--quantizations")
    g.add_argument("--no-fallbacks", action="store_true", help="allow_fallbacks: false")
    g.add_argument("--require-parameters", action="store_true")
    g.add_argument("--data-collection", choices=["allow", "deny"])
    q = p.add_argument_group("reasoning")
    q.add_argument("--reasoning", type=json.loads, help="a whole `reasoning` JSON object")
    q.add_argument("--reasoning-effort", choices=["minimal", "low", "medium", "high"])
    q.add_argument("--reasoning-max-tokens", type=int)
    q.add_argument("--reasoning-exclude", action="store_true")


def request_defaults(args: argparse.Namespace) -> dict[str, Any]:
    defaults: dict[str, Any] = dict(args.extra or {})
    for name, value in (("temperature", args.temperature), ("top_p", args.top_p), ("max_tokens", args.max_tokens),
                        ("seed", args.seed)):
        if value is not None:
            defaults[name] = value
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
                           args.backoff_base, args.backoff_max, defaults=request_defaults(args),
                           retry_errors=args.retry_errors, limit=args.limit, progress=not args.no_progress)
    summary = collect(args.prompts, args.output, config)
    print(json.dumps(summary, indent=2))
    if summary["aborted"]:
        print(f"kimi-eagle collect: stopped: {summary['aborted']}", file=sys.stderr)
        return 3
    return 1 if summary["exhausted"] else 0

