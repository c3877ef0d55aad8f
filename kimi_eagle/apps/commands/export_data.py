"""``kimi-eagle export-data ROWS --to tokens|speculators|specforge -o DIR``: exact-ID training rows."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from kimi_eagle.apps.cli import POSITIVE_INT, Number, add_option
from kimi_eagle.apps.interop.export_data import TARGETS, _target_config, export_data
from kimi_eagle.reconstruct.job import output_lock


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("rows", metavar="ROWS", help="reconstructed .parquet, engine-record .jsonl, or {input_ids, loss_mask} .jsonl")
    p.add_argument("--to", choices=TARGETS, required=True)
    add_option(p, "-o", "--output", aliases=("--out",), dest="out", required=True,
               help="output directory")
    p.add_argument("--target", help="target model directory (its config.json gives vocab size, layers, hidden size)")
    p.add_argument("--vocab-size", type=POSITIVE_INT, help="target vocabulary size (default: from --target)")
    p.add_argument("--n-layers", type=Number(int, 1, MAX_LAYERS),
                   help=f"target decoder layers, 1 to {MAX_LAYERS}, for the run configs; with --target it must be the "
                        "target's (default: from --target)")
    p.add_argument("--hidden-size", type=POSITIVE_INT, help="target hidden size, for the run configs (default: from --target)")
    p.add_argument("--max-length", type=POSITIVE_INT, help="cut rows to this many tokens (counted as truncated)")
    p.add_argument("--drop-flag", action="append", default=None, metavar="FLAG",
                   help="drop rows carrying this reconstruction flag (repeatable; default: literal_marker, whose "
                        "marker text cannot say whether the model emitted special tokens, and dropped_by_server, "
                        "whose IDs after a tool call the server dropped are unknown, and answer_empty, whose answer the "
                        "server returned none of)")
    p.add_argument("--keep-literal-marker", action="store_true",
                   help="keep rows flagged literal_marker (dropped by default)")
    p.add_argument("--draft-vocab-size", type=POSITIVE_INT, default=32000)


DEFAULT_DROP_FLAGS = ("literal_marker", "dropped_by_server", "answer_empty")
MAX_LAYERS = 1024  # decoder layers of a target (Kimi-K2.5 has 61)


def check_target_shape(args: argparse.Namespace, cfg: dict) -> None:
    """ValueError when ``--n-layers``/``--hidden-size`` contradict the target's ``config.json`` (the layer ids of the
    run configs must exist in the target) or the config's own value (those two, ``vocab_size``) is not a whole number
    in range."""
    for option, key, given in (("--n-layers", "num_hidden_layers", args.n_layers),
                               ("--hidden-size", "hidden_size", args.hidden_size),
                               ("--vocab-size", "vocab_size", None)):  # vocab_size: its type only (issue 48)
        have = cfg.get(key)
        if key in cfg and (type(have) is not int or have < 1 or (key == "num_hidden_layers" and have > MAX_LAYERS)):
            bound = f"1..{MAX_LAYERS}" if key == "num_hidden_layers" else "1 or more"
            raise ValueError(f"--target {args.target}: config.json {key} is {str(have)[:40]!r}, not a whole number "
                             f"in {bound}")
        if given is not None and have is not None and given != have:
            raise ValueError(f"{option} {given}: the target {args.target} has {have} ({key} in its config.json); "
                             f"leave {option} out or give {have}")


def check_drop_flags(flags: list[str]) -> None:
    """ValueError for a ``--drop-flag`` no reconstructed row carries (a typo would silently drop nothing and
    replace the default drop flags), listing the valid ones."""
    from kimi_eagle.reconstruct.flags import ROW_FLAGS, is_row_flag

    unknown = [f for f in flags if not is_row_flag(f)]
    if unknown:
        raise ValueError(f"--drop-flag {unknown[0]!r}: not a flag of reconstructed rows; valid: {', '.join(ROW_FLAGS)}, choices_dropped:N, stray_marker:TEXT")


def _drop_flags(args: argparse.Namespace) -> list[str]:
    """The flags to drop rows by: ``--drop-flag`` values, else :data:`DEFAULT_DROP_FLAGS` unless kept."""
    flags = list(args.drop_flag) if args.drop_flag is not None else list(DEFAULT_DROP_FLAGS)
    return [f for f in flags if not (f == "literal_marker" and args.keep_literal_marker)]


def run(args: argparse.Namespace) -> int:
    cfg = _target_config(args.target)
    check_target_shape(args, cfg)  # before any row is read
    check_drop_flags(_drop_flags(args))
    if args.target and args.to == "speculators":
        from kimi_eagle.apps.interop.configs import target_mask_token

        target_mask_token(args.target, int(args.vocab_size or cfg.get("vocab_size") or 0))  # a bad id: refused now
    vocab_size = args.vocab_size or cfg.get("vocab_size")
    if not vocab_size:
        raise ValueError("give --vocab-size or --target")
    with output_lock(Path(args.out)):  # one export per output directory at a time
        m = _export(args, cfg, vocab_size)
    print(json.dumps({k: m[k] for k in ("to", "rows_in", "rows_written", "rows_dropped", "dropped_by_reason",
                                        "rows_truncated", "tokens_written", "files")}))
    if not m["rows_written"]:  # issue 37: an export of nothing is a mistake to name, not a success
        first = m["dropped"][0] if m["dropped"] else {}
        why = f"; the first, {first.get('id')!r}: {first.get('reason')}: {str(first.get('detail', ''))[:120]}" if first else ""
        raise ValueError(f"{args.rows}: no row written: {m['rows_in']} records in, all dropped "
                         f"{m['dropped_by_reason']}{why} (see {Path(args.out) / 'manifest.json'})")
    return 0


def _export(args: argparse.Namespace, cfg: dict, vocab_size: int) -> dict:
    return export_data(args.rows, args.to, args.out, vocab_size=int(vocab_size), max_length=args.max_length,
                       drop_flags=_drop_flags(args), draft_vocab_size=args.draft_vocab_size, target=args.target,
                       n_layers=args.n_layers or cfg.get("num_hidden_layers"),
                       hidden_size=args.hidden_size or cfg.get("hidden_size"))
