"""A small local engine: sample from any HF causal LM and record the token IDs it produced."""
from __future__ import annotations

import argparse
import json
import sys

from kimi_eagle.apps.cli import NONNEG_FLOAT, NONNEG_INT, POSITIVE_INT, TOP_P, add_option
from kimi_eagle.engine.local import CHAT_FORMAT_ALIASES, CHAT_FORMATS, Engine, SamplingParams, generate_records
from kimi_eagle.io import atomic_path, read_jsonl


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompts", metavar="PROMPTS", help="JSONL of {id, messages} or {id, prompt}")
    p.add_argument("-o", "--output", required=True, help="engine-record JSONL to write")
    add_option(p, "--model-dir", aliases=("--model",), dest="model", required=True, help="HF model directory")
    add_option(p, "--format", aliases=("--chat-format",), dest="chat_format",
               choices=(*CHAT_FORMATS, *CHAT_FORMAT_ALIASES),
               help="chat format; default: kimi-k2.5 for a model with a kimi_ids.json row map (tiny-kimi), else "
                    "hf-template if the tokenizer has a chat template, else plain")
    p.add_argument("--temperature", type=NONNEG_FLOAT, default=1.0)
    p.add_argument("--top-p", type=TOP_P, default=1.0)
    p.add_argument("--seed", type=NONNEG_INT, help="seed of the first prompt; prompt i uses seed + i")
    p.add_argument("--max-tokens", type=POSITIVE_INT)


def run(args: argparse.Namespace) -> int:
    """Sample every prompt line of ``args.prompts``; write one engine record per line to ``args.output`` atomically."""
    engine = Engine.from_dir(args.model, args.chat_format)
    prompts = [line.obj if line.error is None else None for line in read_jsonl(args.prompts)]
    sampling = SamplingParams(args.temperature, args.top_p, args.seed, args.max_tokens)
    with atomic_path(args.output) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for rec in generate_records(engine, prompts, sampling):
            f.write(json.dumps(rec) + "\n")  # ASCII escapes: an id with a lone surrogate cannot stop the run
    print(f"wrote {len(prompts)} engine records to {args.output}", file=sys.stderr)
    return 0
