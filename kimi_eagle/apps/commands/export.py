"""``kimi-eagle export DRAFT --engine sglang|vllm|speculators -o OUT``: a drafter as an engine-loadable EAGLE-3 checkpoint."""
from __future__ import annotations

import argparse
import json

from kimi_eagle.apps.cli import add_option
from kimi_eagle.apps.interop.export_drafter import DTYPES, EXPORT_ENGINES, export_drafter


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("draft", metavar="DRAFT", help="a drafter directory written by `kimi-eagle train`")
    p.add_argument("--engine", choices=EXPORT_ENGINES, required=True)
    p.add_argument("--verifier", help="speculators only: the target's path or hub id, written as its verifier")
    add_option(p, "-o", "--output", aliases=("--out",), dest="out", required=True,
               help="output directory")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32", help="weight dtype (fp32 reproduces training exactly)")


def run(args: argparse.Namespace) -> int:
    out = export_drafter(args.draft, args.engine, args.out, args.dtype, verifier=getattr(args, "verifier", None))
    cfg = json.loads((out / "config.json").read_text())
    ids = cfg["eagle_aux_hidden_state_layer_ids"] if args.engine == "speculators" else cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    print(json.dumps({"out": str(out), "engine": args.engine,
                      "eagle_aux_hidden_state_layer_ids": ids,
                      "draft_vocab_size": cfg["draft_vocab_size"]}))
    return 0
