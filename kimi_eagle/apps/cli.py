"""``kimi-eagle`` command line: one subcommand per module, imported only when used."""
from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module that defines ``add_arguments(parser)`` and ``run(args) -> int``, help)
COMMANDS: dict[str, tuple[str, str]] = {
    "probe": ("kimi_eagle.apps.commands.probe", "probe a tokenizer's special tokens and stop tokens"),
    "convert": ("kimi_eagle.apps.commands.convert", "convert a real dataset to API records"),
    "reconstruct": ("kimi_eagle.apps.commands.reconstruct", "reconstruct token IDs from API records"),
    "parse-completion": ("kimi_eagle.apps.commands.parse_completion", "parse raw Kimi completion IDs or text into the API message"),
    "simulate": ("kimi_eagle.apps.commands.simulate", "make labelled engine/API pairs with injected effects"),
    "diff": ("kimi_eagle.apps.commands.diff", "diff engine token IDs against reconstructions by bytes"),
    "report": ("kimi_eagle.apps.commands.report", "charts and an HTML report from a diff"),
    "billing": ("kimi_eagle.apps.commands.billing", "billing-only validation (no engine): provider counts vs reconstruction"),
    "generate": ("kimi_eagle.apps.commands.generate", "sample completions from a local HF model into engine records"),
    "serve": ("kimi_eagle.apps.commands.serve", "an OpenRouter-compatible server over a local HF model"),
    "collect": ("kimi_eagle.apps.commands.collect", "collect chat completions from an OpenAI/OpenRouter API"),
    "tiny-kimi": ("kimi_eagle.apps.commands.tiny_kimi", "build and train a tiny model over Kimi token IDs (K2.5 format, CPU)"),
    "audit": ("kimi_eagle.apps.commands.audit", "audit API providers: greedy completions compared across providers and an engine"),
    "extract": ("kimi_eagle.apps.commands.extract", "extract target hidden states for EAGLE-3 training"),
    "train": ("kimi_eagle.apps.commands.train", "train an EAGLE-3 drafter"),
    "export": ("kimi_eagle.apps.commands.export", "export a drafter for SGLang or vLLM"),
    "export-data": ("kimi_eagle.apps.commands.export_data", "export exact-ID training rows for SpecForge or speculators"),
    "evaluate": ("kimi_eagle.apps.commands.evaluate", "measure acceptance length with speculative decoding"),
    "batch": ("kimi_eagle.apps.commands.batch", "run a notebook over a grid of parameters with papermill"),
    "demo": ("kimi_eagle.apps.commands.demo", "run every notebook, tiny-kimi and every grid on the bundled data (make demo)"),
}


# subcommand -> one example command line, shown at the end of ``kimi-eagle COMMAND --help``
EXAMPLES: dict[str, str] = {
    "probe": "kimi-eagle probe --check-ids 163533,163586 --engine-outputs runs/e2e/engine.jsonl",
    "convert": "kimi-eagle convert --from openai my_openrouter_log.jsonl -o runs/mine/api.jsonl",
    "reconstruct": "kimi-eagle reconstruct runs/mine/api.jsonl -o runs/mine/recon.parquet --workers 2",
    "parse-completion": "kimi-eagle parse-completion --text '<think>hm</think>Hello<|im_end|>'",
    "simulate": "kimi-eagle simulate -o runs/sim --per-effect 10 --run",
    "diff": "kimi-eagle diff --engine runs/mine/engine.jsonl --reconstructed runs/mine/recon.parquet -o runs/mine/diff",
    "report": "kimi-eagle report runs/mine/diff -o runs/mine/report",
    "billing": "kimi-eagle billing --reconstructed runs/mine/recon.parquet -o runs/mine/billing",
    "generate": "kimi-eagle generate prompts.jsonl -o runs/gen/engine.jsonl --model ../shared/assets/stories260K",
    "serve": "kimi-eagle serve --model ../shared/assets/stories260K --port 8000",
    "tiny-kimi": "kimi-eagle tiny-kimi -o runs/tiny_kimi/model --steps 150 --seed 0 --collect 48",
    "collect": "kimi-eagle collect prompts.jsonl -o runs/mine/api.jsonl --base-url https://openrouter.ai/api/v1 "
               "--model moonshotai/kimi-k2.5",
    "audit": "kimi-eagle audit prompts.jsonl -o runs/audit --base-url http://127.0.0.1:8000/v1 --model stories260K "
             "--providers fp32,bf16,int8 --reference runs/gen/engine.jsonl --tokenizer ../shared/assets/stories260K "
             "--format plain",
    "extract": "kimi-eagle extract --target ../shared/assets/stories260K --data runs/mine/recon.parquet -o runs/hidden",
    "train": "kimi-eagle train --data runs/hidden --target ../shared/assets/stories260K -o runs/train --steps 200",
    "export": "kimi-eagle export runs/train/drafter --engine sglang -o runs/export",
    "export-data": "kimi-eagle export-data runs/mine/recon.parquet --to specforge -o runs/specforge "
                   "--target ../shared/assets/stories260K",
    "evaluate": "kimi-eagle evaluate --target ../shared/assets/stories260K --draft runs/train/drafter "
                "--prompts prompts.jsonl",
    "batch": "kimi-eagle batch --grid notebooks/grids/diff_datasets.yaml -o runs/batch/diff_datasets --workers 2",
    "demo": "kimi-eagle demo -o runs/demo --batch-workers 2",
}


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and examples kept as written; every option's default shown (unless its help already says it)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (_no_default(default) or "%(default)" in text or "default" in text
                or not action.option_strings or isinstance(action, argparse._VersionAction)):
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


def _no_default(value: object) -> bool:
    """``None``, ``False`` (a store_true flag) and SUPPRESS are not worth showing; ``0`` is."""
    return value is None or value is False or value == argparse.SUPPRESS


def version() -> str:
    """The installed package's version (``kimi-eagle --version``)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("kimi-eagle")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _description(module) -> str:
    """The module docstring's first paragraph, without reST markup."""
    doc = (module.__doc__ or "").strip().split("\n\n")[0]
    return doc.replace("``", "`")


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kimi-eagle", description=__doc__, formatter_class=HelpFormatter,
        epilog="Run `kimi-eagle COMMAND --help` for a command's options, defaults and an example.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (module_name, help_text) in COMMANDS.items():
        if name != wanted:
            sub.add_parser(name, help=help_text)
            continue
        module = importlib.import_module(module_name)  # import only the module of the command being run
        example = EXAMPLES.get(name)
        p = sub.add_parser(name, help=help_text, description=_description(module) or help_text,
                           formatter_class=HelpFormatter, epilog=f"example:\n  {example}" if example else None)
        module.add_arguments(p)
        for action in p._actions:  # options without help still show their default
            if action.help is None and action.option_strings and not _no_default(action.default):
                action.help = "default: %(default)s"
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
