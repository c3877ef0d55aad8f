"""Bounded chat-template rendering (kimi_eagle.chat.template_sandbox) vs jinja2's plain immutable sandbox, in one run.

Renders the real Qwen3 and DeepSeek-V3 chat templates over glaive conversations (with their tools) both ways,
checks the outputs are identical, and prints renders/s and the ratio (bounded / plain; 1.0 = no cost).
Usage: python bench/template_bounds.py [--repeats 5] [--limit 100]
"""
from __future__ import annotations

import argparse
import json
import time

from jinja2.exceptions import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kimi_eagle.assets import asset_path, data_path
from kimi_eagle.chat.template_sandbox import bounded_template


def _raise(message: str) -> None:
    raise TemplateError(message)


def plain(source: str):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals["raise_exception"] = _raise
    return env.from_string(source)


def conversations(limit: int) -> list[dict]:
    rows = json.loads(data_path("glaive").read_text())[:limit]
    roles = {"human": "user", "gpt": "assistant", "function_call": "assistant", "observation": "user"}
    out = []
    for r in rows:
        messages = [{"role": roles[t["from"]], "content": t["value"]} for t in r["conversations"]]
        tools = [{"type": "function", "function": t} for t in json.loads(r.get("tools") or "[]")]
        out.append({"messages": messages, "tools": tools or None, "add_generation_prompt": True})
    return out


def timed(template, contexts: list[dict], repeats: int) -> tuple[float, list[str]]:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        outputs = [template.render(**c) for c in contexts]
        best = min(best, time.perf_counter() - t0)
    return best, outputs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--limit", type=int, default=100)
    args = ap.parse_args()
    contexts = conversations(args.limit)
    for name in ("qwen3", "deepseek-v3"):
        source = json.loads((asset_path(f"tokenizers/{name}") / "tokenizer_config.json").read_text())["chat_template"]
        base, want = timed(plain(source), contexts, args.repeats)
        bounded, got = timed(bounded_template(source, _raise), contexts, args.repeats)
        assert got == want, f"{name}: the bounded rendering differs"
        print(f"{name:12s} plain {len(contexts) / base:8.0f} renders/s  bounded {len(contexts) / bounded:8.0f} renders/s  "
              f"ratio {base / bounded:.2f} (bounded speed / plain; identical outputs: {len(got)})")


if __name__ == "__main__":
    main()
