"""``kimi-eagle`` command line: one subcommand per module, imported only when used.

One vocabulary for every command:

* inputs: a command's main input -- the file or directory it turns into its output (records, rows, prompts, a
  diff, a drafter, a notebook) -- is positional; everything it uses to do that is a named option: models it runs
  (--model-dir, --target, --draft), tokenizers (--tokenizer), grids, labels, references. A command with two inputs
  of equal standing names both (diff --engine E --reconstructed R), one without a main input names all of its
  inputs (probe, simulate, serve, tiny-kimi, demo).
* output: -o/--output (a file or a directory, as the command's help says).
* chat format: --format.
* models: --model-dir is a local model directory; --model is a model name sent to an API (collect, audit).
* old spellings (--out, --chat-format, --model for a directory, --data/--prompts/--reconstructed for a positional
  input) still parse to the same arguments; `--help` marks each one "deprecated alias".
"""
from __future__ import annotations

import argparse
import copy
import importlib
import math
import os
import re
import sys
import textwrap
from typing import Any, Protocol

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
    "providers": ("kimi_eagle.apps.commands.providers", "calibrate each provider from its billed counts: the provider table"),
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
    "compare": ("kimi_eagle.apps.commands.compare", "two diff, billing or batch outputs side by side: each change with its interval"),
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
    "billing": "kimi-eagle billing runs/mine/recon.parquet -o runs/mine/billing",
    "providers": "kimi-eagle providers runs/mine/api.jsonl",
    "generate": "kimi-eagle generate prompts.jsonl -o runs/gen/engine.jsonl --model-dir ../shared/assets/models/stories260K/hf",
    "serve": "kimi-eagle serve --model-dir ../shared/assets/models/stories260K/hf --port 8000",
    "tiny-kimi": "kimi-eagle tiny-kimi -o runs/tiny_kimi/model --steps 150 --seed 0 --collect 48",
    "collect": "kimi-eagle collect prompts.jsonl -o runs/mine/api.jsonl --base-url https://openrouter.ai/api/v1 "
               "--model moonshotai/kimi-k2.5",
    "audit": "kimi-eagle audit prompts.jsonl -o runs/audit --base-url http://127.0.0.1:8000/v1 --model stories260K "
             "--providers fp32,bf16,int8 --reference runs/gen/engine.jsonl --tokenizer ../shared/assets/models/stories260K/hf "
             "--format plain",
    "extract": "kimi-eagle extract runs/mine/recon.parquet --target ../shared/assets/models/stories260K/hf -o runs/hidden",
    "train": "kimi-eagle train runs/hidden --target ../shared/assets/models/stories260K/hf -o runs/train --steps 200",
    "export": "kimi-eagle export runs/train/drafter --engine sglang -o runs/export",
    "export-data": "kimi-eagle export-data runs/mine/recon.parquet --to specforge -o runs/specforge "
                   "--target ../shared/assets/models/stories260K/hf",
    "evaluate": "kimi-eagle evaluate prompts.jsonl --target ../shared/assets/models/stories260K/hf --draft runs/train/drafter",
    "batch": "kimi-eagle batch --grid notebooks/grids/diff_datasets.yaml -o runs/batch/diff_datasets --workers 2",
    "compare": "kimi-eagle compare runs/last_week/billing runs/mine/billing -o runs/compare",
    "demo": "kimi-eagle demo -o runs/demo --batch-workers 2",
}


DEPRECATED_ALIASES = "deprecated_aliases"  # the attribute of an argparse Action that holds its old spellings
MAIN_INPUT = "main_input"  # the attribute that marks a positional main input (required, though nargs="?")


class ArgumentContainer(Protocol):
    """An argparse parser or one of its argument groups."""

    def add_argument(self, *name_or_flags: str, **kwargs: Any) -> argparse.Action: ...


def deprecated_aliases(action: argparse.Action) -> tuple[str, ...]:
    """The old spellings that still fill ``action``'s dest (empty for an option without any)."""
    return getattr(action, DEPRECATED_ALIASES, ())


def add_option(container: ArgumentContainer, *names: str, aliases: tuple[str, ...] = (), help: str,
               **kwargs: Any) -> argparse.Action:
    """Add the option spelled ``names`` that also accepts the old spellings ``aliases`` (same dest, same value);
    ``--help`` lists only ``names`` and ends the help with "(ALIAS: deprecated alias)". Pass ``dest`` to keep
    the attribute name the command's ``run()`` reads when the canonical spelling differs from it."""
    long_name = next((n for n in names if n.startswith("--")), names[0])
    if "action" not in kwargs and "choices" not in kwargs:  # `-o OUTPUT`, not `-o OUT` after a kept dest
        kwargs.setdefault("metavar", long_name.lstrip("-").upper().replace("-", "_"))
    action = container.add_argument(*names, *aliases, help=help, **kwargs)
    setattr(action, DEPRECATED_ALIASES, tuple(aliases))
    return action


def add_main_input(parser: argparse.ArgumentParser, dest: str, *, alias: str, help: str,
                   metavar: str | None = None) -> argparse.Action:
    """Add a command's main input as the positional ``DEST``, still accepted as the old option ``alias``: exactly
    one of the two is required, and both parse to the same ``args.<dest>``."""
    either = parser.add_mutually_exclusive_group(required=True)
    positional = either.add_argument(dest, nargs="?", default=argparse.SUPPRESS, metavar=metavar or dest.upper(),
                                     help=help)
    either.add_argument(alias, dest=dest, help=argparse.SUPPRESS)
    setattr(positional, DEPRECATED_ALIASES, (alias,))
    setattr(positional, MAIN_INPUT, True)
    return positional


_INT = re.compile(r"[+-]?[0-9]+")  # ASCII digits only: `７` or `1.0` is not an integer argument
_FLOAT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


class Number:
    """An argparse ``type=``: a number of ``kind`` (int or a finite float) in ``[low, high]`` (``low_open``: above
    ``low``), spelled in ASCII. A value outside is argparse's one-line usage error (exit 2) naming the flag."""

    def __init__(self, kind: type, low: float | None = None, high: float | None = None, low_open: bool = False):
        self.kind, self.low, self.high, self.low_open = kind, low, high, low_open
        self.__name__ = self.describe()  # argparse names the type in its own messages

    def describe(self) -> str:
        what = "an integer" if self.kind is int else "a finite number"
        if self.low is not None and self.high is not None:
            return f"{what} in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"
        if self.low is not None:
            return f"{what} {'>' if self.low_open else '>='} {self.low:g}"
        return what

    def __call__(self, text: str) -> int | float:
        pattern = _INT if self.kind is int else _FLOAT
        if not pattern.fullmatch(text.strip()):
            raise argparse.ArgumentTypeError(f"expected {self.describe()}, got {text!r}"[:200])
        value = self.kind(text.strip())
        if self.kind is float and not math.isfinite(value):  # 1e999
            raise argparse.ArgumentTypeError(f"expected {self.describe()}, got {text!r}"[:200])
        below = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        if below and not self.low_open and self.high is None:
            raise argparse.ArgumentTypeError(f"must be at least {self.low:g}, not {value:g} (expected {self.describe()})")
        if below or (self.high is not None and value > self.high):
            raise argparse.ArgumentTypeError(f"expected {self.describe()}, got {text!r}"[:200])
        return value

    def __repr__(self) -> str:
        return f"Number({self.describe()})"


class NumberList:
    """An argparse ``type=``: comma-separated numbers, each checked by ``item`` (a :class:`Number`); a tuple."""

    def __init__(self, item: Number):
        self.item = item
        self.__name__ = f"comma-separated {item.describe()}"

    def __call__(self, text: str) -> tuple:
        parts = text.split(",")
        try:
            return tuple(self.item(part) for part in parts)
        except argparse.ArgumentTypeError as e:
            raise argparse.ArgumentTypeError(f"{e} (in the list {text!r})"[:240]) from None


POSITIVE_INT = Number(int, 1)  # counts, sizes, steps, threads, workers


def serving_argument(*extra: str):
    """An argparse ``type`` for ``--serving``: a shipped profile name or alias, one of ``extra`` (``auto``), or a
    profile file ``PATH.toml`` (loaded and checked as the shipped ones are: a one-line error otherwise)."""
    from kimi_eagle.serving.profiles import SERVING_CHOICES, is_profile_file, load_profile_file

    def parse(text: str) -> str:
        if text in SERVING_CHOICES or text in extra:
            return text
        if is_profile_file(text):
            try:
                load_profile_file(text)
            except ValueError as e:
                raise argparse.ArgumentTypeError(str(e)[:300]) from None
            return text
        raise argparse.ArgumentTypeError(f"unknown serving profile {text!r}; known: "
                                         f"{', '.join((*SERVING_CHOICES, *extra))}, or a profile file PATH.toml")
    return parse
NONNEG_INT = Number(int, 0)  # seeds, counts where 0 means none
PORT = Number(int, 0, 65535)
NONNEG_FLOAT = Number(float, 0)  # temperatures, seconds
POSITIVE_FLOAT = Number(float, 0, low_open=True)  # timeouts, learning rates
PROBABILITY = Number(float, 0, 1)
TOP_P = Number(float, 0, 1, low_open=True)
TEMPERATURES = NumberList(NONNEG_FLOAT)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and examples kept as written; every option's default shown (unless its help already says it);
    deprecated aliases named only in a note at the end of the help, main inputs shown as required."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if not (_no_default(default) or "%(default)" in text or "default" in text or _is_flag(action)
                or not action.option_strings or isinstance(action, argparse._VersionAction)):
            text = f"{text} (default: %(default)s)" if text else "default: %(default)s"
        notes = " ".join(f"({alias}: deprecated alias)" for alias in deprecated_aliases(action))
        return f"{text} {notes}" if notes else text

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)  # keep `--chat-format` whole

    def _format_action_invocation(self, action: argparse.Action) -> str:
        aliases = deprecated_aliases(action)
        if action.option_strings and aliases:
            action = copy.copy(action)
            action.option_strings = [s for s in action.option_strings if s not in aliases]
        return super()._format_action_invocation(action)

    def _format_args(self, action: argparse.Action, default_metavar: str) -> str:
        if getattr(action, MAIN_INPUT, False):  # required through its group, so no [brackets]
            return self._metavar_formatter(action, default_metavar)(1)[0]
        return super()._format_args(action, default_metavar)


def _is_flag(action: argparse.Action) -> bool:
    """An option that takes no value (``store_true``, ``store_false``, ``store_const``): its default is implied."""
    return bool(action.option_strings) and action.nargs == 0


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
    """The ``kimi-eagle`` parser; only the command named in ``argv`` gets its options (its module is imported)."""
    parser = argparse.ArgumentParser(
        prog="kimi-eagle", description=(__doc__ or "").replace("``", "`"), formatter_class=HelpFormatter,
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
            if action.help is None and action.option_strings and not _no_default(action.default) and not _is_flag(action):
                action.help = "default: %(default)s"
    return parser


def _refuse_unknown_options(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """A misspelt option (``--ouput``) is argparse's one-line error naming it, with the nearest spelling, before
    argparse would report a required option as missing (#35). Unambiguous prefixes stay accepted."""
    import difflib

    sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    command = next((a for a in argv if not a.startswith("-")), None)
    if sub is None or command not in sub.choices:
        return
    cmd = sub.choices[command]
    known = [s for a in cmd._actions for s in a.option_strings]
    for word in argv[argv.index(command) + 1:]:
        if word == "--":
            break
        name = word.split("=", 1)[0]
        if not name.startswith("--") or name in known or any(k.startswith(name) for k in known if k.startswith("--")):
            continue
        near = difflib.get_close_matches(name, [k for k in known if k.startswith("--")], n=1)
        cmd.error(f"unrecognized option {name}" + (f" (did you mean {near[0]}?)" if near else ""))


def main(argv: list[str] | None = None) -> int:
    """Run one ``kimi-eagle`` command; its exit status (2 with a one-line error for unreadable or bad input)."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    _refuse_unknown_options(parser, argv)
    args = parser.parse_args(argv)
    module = importlib.import_module(COMMANDS[args.command][0])
    saved = {k: os.environ.get(k) for k in RUN_SCOPED_ENV}  # --figure-format/--dpi hold for this command only
    from kimi_eagle.apps.reports.safe_text import VisibleStream, visible

    stdout, sys.stdout = sys.stdout, VisibleStream(sys.stdout)  # a provider name's ESC or BEL never reaches the terminal raw
    try:
        return int(module.run(args) or 0)
    except (OSError, ValueError) as e:  # clear one-line errors for bad input, no deep traceback
        print(f"kimi-eagle {args.command}: error: {visible(e)}", file=sys.stderr)
        return 2
    finally:
        sys.stdout = stdout
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# set by a command for the notebooks it runs (kimi_eagle.apps.reports.outputs), restored when it returns
RUN_SCOPED_ENV = ("KIMI_EAGLE_FIGURE_FORMAT", "KIMI_EAGLE_FIGURE_DPI")


if __name__ == "__main__":
    sys.exit(main())
