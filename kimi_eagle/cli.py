"""``kimi-eagle`` command line: one subcommand per module, imported only when used."""
from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module that defines ``add_arguments(parser)`` and ``run(args) -> int``, help)
COMMANDS: dict[str, tuple[str, str]] = {
    "probe": ("kimi_eagle.tokenize.probe", "probe a tokenizer's special tokens and stop tokens"),
    "convert": ("kimi_eagle.reconstruct.convert", "convert a real dataset to API records"),
    "reconstruct": ("kimi_eagle.reconstruct.job", "reconstruct token IDs from API records"),
    "simulate": ("kimi_eagle.diff.simulate", "make labelled engine/API pairs with injected effects"),
    "diff": ("kimi_eagle.diff.run", "diff engine token IDs against reconstructions by bytes"),
    "report": ("kimi_eagle.diff.report", "charts and an HTML report from a diff"),
    "generate": ("kimi_eagle.engine.local", "sample completions from a local HF model into engine records"),
    "serve": ("kimi_eagle.engine.server", "an OpenRouter-compatible server over a local HF model"),
    "collect": ("kimi_eagle.engine.collect", "collect chat completions from an OpenAI/OpenRouter API"),
    "extract": ("kimi_eagle.eagle3.hidden", "extract target hidden states for EAGLE-3 training"),
    "train": ("kimi_eagle.eagle3.train", "train an EAGLE-3 drafter"),
    "export": ("kimi_eagle.eagle3.export", "export a drafter for SGLang or vLLM"),
    "evaluate": ("kimi_eagle.eagle3.evaluate", "measure acceptance length with speculative decoding"),
    "batch": ("kimi_eagle.batch.run", "run a notebook over a grid of parameters with papermill"),
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kimi-eagle", description=__doc__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        if name == wanted:  # import only the module of the command being run
            importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    module = importlib.import_module(COMMANDS[args.command][0])
    try:
        return int(module.run(args) or 0)
    except (OSError, ValueError) as e:  # clear one-line errors for bad input, no deep traceback
        print(f"kimi-eagle {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
