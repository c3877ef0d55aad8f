"""``kimi-eagle extract``: target hidden states for EAGLE-3 training (``--drafter dflash``: DFlash's layer set, for
the kit's DFlash and speculators' ``dflash``/``dspark``), in the kit's layout or a trainer's (``--layout
speculators|specforge``); ``train`` and ``evaluate`` read all three."""
from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

import torch

from kimi_eagle.apps.cli import POSITIVE_INT, add_main_input, add_option
from kimi_eagle.eagle3.dflash_config import BLOCK_SIZE, mask_token_id
from kimi_eagle.eagle3.extract import ExtractOptions, extract
from kimi_eagle.eagle3.hidden import load_rows
from kimi_eagle.eagle3.layers import DRAFTERS
from kimi_eagle.eagle3.layouts import LAYOUTS, is_arrow_dir, load_layout_rows
from kimi_eagle.reconstruct.job import output_lock


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, help="HF target model directory (with a kimi_ids.json row map, e.g. tiny-kimi, "
                   "the rows' Kimi IDs are mapped to its rows)")
    add_main_input(p, "data", alias="--data",
                   help="rows: reconstructed .parquet, or .jsonl with input_ids/loss_mask or engine records")
    add_option(p, "-o", "--output", aliases=("--out",), dest="out", required=True,
               help="output directory (resumes if it holds a partial extraction)")
    p.add_argument("--layers", help="comma-separated 0-based block-output indices (default: the --drafter's set)")
    p.add_argument("--drafter", choices=DRAFTERS, default="eagle3",
                   help="whose target layers: eagle3 (3: low/mid/high) or dflash (DFlash's set, also speculators' "
                        "dspark; kimi_eagle/eagle3/dflash_config.py)")
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp8"], default="bf16",
                   help="fp8: float8_e4m3fn with one fp32 scale per token and layer (about half of bf16's bytes)")
    p.add_argument("--shard-rows", type=POSITIVE_INT, default=256)
    p.add_argument("--max-tokens", type=POSITIVE_INT, default=4096, help="padded tokens per forward batch")
    p.add_argument("--keep-literal-marker", action="store_true",
                   help="keep rows flagged literal_marker (skipped by default and counted in the manifest)")
    p.add_argument("--threads", type=POSITIVE_INT, default=1, help="torch CPU threads (1 is fastest for small targets on a busy machine)")
    p.add_argument("--layout", choices=LAYOUTS, default="kimi",
                   help="kimi: the kit's shards; speculators: hs_{row}.safetensors per Arrow row of an export-data "
                        "directory (DATA), into -o DATA/hidden_states; specforge: rows_*/data_{idx}.ckpt")


def run(args: argparse.Namespace) -> int:
    """``--layout kimi`` is :func:`run_kit`; the trainer layouts are :func:`run_extract`."""
    torch.set_num_threads(args.threads)
    with output_lock(Path(args.out)):  # one extraction per output directory at a time
        return run_kit(args) if args.layout == "kimi" else run_extract(args)


def options_from(args: argparse.Namespace, skipped: list[dict]) -> ExtractOptions:
    """The extraction options the flags name (``--shard-rows`` is the trainer layouts' chunk size)."""
    return ExtractOptions(
        layout=args.layout, layer_ids=[int(x) for x in args.layers.split(",")] if args.layers else None,
        drafter=args.drafter,
        dtype=args.dtype, shard_rows=args.shard_rows, max_tokens=args.max_tokens, skipped=skipped,
        rows_source=None if args.layout == "kimi" else args.data, keep_literal_marker=args.keep_literal_marker,
        progress=True)


def refuse_no_rows(data: str, rows: list, skipped: list[dict]) -> None:
    """ValueError naming why when ``data`` gave no usable row (e.g. records without ``completion_ids``): an
    extraction of nothing is a mistake to name, not a success."""
    if rows:
        return
    if not skipped:
        raise ValueError(f"{data}: no records to extract")
    reasons = Counter(str(s["reason"]).split(":")[0][:80] for s in skipped)
    first = skipped[0]
    raise ValueError(f"{data}: no usable row: all {len(skipped)} records skipped ({dict(reasons.most_common(3))}); "
                     f"the first, {first.get('id')!r}: {str(first['reason'])[:160]}")


def run_extract(args: argparse.Namespace) -> int:
    """``kimi-eagle extract`` for the trainer layouts."""
    if args.layout == "speculators" and not is_arrow_dir(args.data):
        raise ValueError("--layout speculators: --data must be a `kimi-eagle export-data --to speculators` directory "
                         "(hs_{row} is the Arrow row `row`); write -o DATA/hidden_states")
    rows, skipped = load_layout_rows(args.data, keep_literal_marker=args.keep_literal_marker)
    refuse_no_rows(args.data, rows, skipped)
    t0 = time.perf_counter()
    m = extract(args.target, rows, args.out, options_from(args, skipped))
    block = {"mask_token_id": mask_token_id(args.target), "block_size": BLOCK_SIZE} if args.drafter == "dflash" else {}
    print(json.dumps({"out": args.out, "layout": args.layout, "rows": m["n_rows"], "written": m["rows_written"],
                      "skipped": len(m["skipped"]) + m["long_rows"]["n"], "tokens": m["n_tokens"],
                      "drafter": args.drafter, "layer_ids": m["layer_ids"], "trainer_layer_ids": m["trainer_layer_ids"],
                      **block, "bytes_per_token": m["bytes_per_token"], "seconds": round(time.perf_counter() - t0, 2)}))
    return 0


def run_kit(args: argparse.Namespace) -> int:
    """``kimi-eagle extract --layout kimi``: the kit's own shards."""
    rows, skipped = load_rows(args.data, keep_literal_marker=args.keep_literal_marker, target=args.target)
    refuse_no_rows(args.data, rows, skipped)
    t0 = time.perf_counter()
    m = extract(args.target, rows, args.out, options_from(args, skipped))
    print(json.dumps({"out": args.out, "rows": m["n_rows"], "skipped": len(m["skipped"]) + m["long_rows"]["n"],
                      "tokens": m["n_tokens"], "layer_ids": m["layer_ids"], "bytes_per_token": m["bytes_per_token"],
                      "payload_bytes_per_token": m["payload_bytes_per_token"], "payload_vs_bf16": m["payload_vs_bf16"],
                      "seconds": round(time.perf_counter() - t0, 2)}))
    return 0
