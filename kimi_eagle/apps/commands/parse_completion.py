"""The inverse of reconstruction: a raw Kimi completion (engine IDs or text) -> the API message."""
from __future__ import annotations

import argparse
import json
import sys

from kimi_eagle.apps.cli import NONNEG_INT, add_option, serving_argument
from kimi_eagle.chat.parse import PARSE_FORMATS, TOOL_ID_OUTPUTS, ParseOptions, parse_id_list
from kimi_eagle.serving.answer import parse_completion
from kimi_eagle.serving.profiles import get_profile
from kimi_eagle.tokenize.tokenizer import load_tokenizer


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--ids", help="completion IDs: '1,2,3', '1 2 3' or a JSON list ('-' reads stdin)")
    src.add_argument("--text", help="raw completion text with markers spelled out ('-' reads stdin)")
    p.add_argument("--tokenizer", help="tokenizer directory (needed for --ids; default: the Kimi assets)")
    p.add_argument("--format", default="kimi-k2.5", choices=list(PARSE_FORMATS))
    p.add_argument("--finish-reason", choices=["stop", "tool_calls", "length"], help="override the finish reason")
    p.add_argument("--strip", action="store_true", help="strip whitespace as the servers' regexes do")
    p.add_argument("--tool-ids", choices=TOOL_ID_OUTPUTS, default="model",
                   help="model: the ids the model wrote (vLLM); sglang: functions.NAME:{history + N}")
    add_option(p, "--serving", type=serving_argument(), metavar="PROFILE|PATH.toml", default="template",
               help="answer as this server version does: template (the kit's parse of the IDs), moonshot, vllm-0.33 "
                    "(alias vllm), sglang-0.5 (alias sglang), their -nospace/-stream variants, or the -legacy "
                    "transcriptions (docs/reconstruct.md, 'Serving profiles')")
    p.add_argument("--history-tool-calls", type=NONNEG_INT, default=0, help="tool calls already in the conversation (sglang ids)")


def run(args: argparse.Namespace) -> int:
    options = ParseOptions(format_name=args.format, finish_reason=args.finish_reason, strip=args.strip,
                           tool_ids=args.tool_ids, history_tool_calls=args.history_tool_calls,
                           serving=args.serving)
    if args.ids is not None:
        from kimi_eagle.assets import kimi_dir

        tok = load_tokenizer(args.tokenizer or kimi_dir())
        ids = parse_id_list(sys.stdin.read() if args.ids == "-" else args.ids)
        bad = [i for i in ids if not 0 <= i < tok.n_vocab]
        if bad:
            raise ValueError(f"--ids: {bad[0]} is outside the vocabulary (n_vocab {tok.n_vocab})")
        parsed = parse_completion(ids, tok, options)
    else:
        text = sys.stdin.read() if args.text == "-" else args.text
        tok = None
        if get_profile(args.serving).answer_rules != "legacy":  # a server version decodes IDs: encode the text first
            from kimi_eagle.assets import kimi_dir

            tok = load_tokenizer(args.tokenizer or kimi_dir())
        parsed = parse_completion(text, tok, options)
    print(json.dumps(parsed.to_dict(), ensure_ascii=False, indent=1))
    return 0
