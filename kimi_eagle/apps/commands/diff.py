"""``kimi-eagle diff``: engine token IDs against reconstructed IDs, by bytes, for every record."""
from __future__ import annotations

import argparse
from pathlib import Path

from kimi_eagle.apps.cli import add_option
from kimi_eagle.diff.inputs import engine_model
from kimi_eagle.diff.run import diff_rows, read_engine, read_labels, read_reconstructed, write_diff
from kimi_eagle.diff.summary import diff_data_kind
from kimi_eagle.io import check_jsonl, check_parquet
from kimi_eagle.reconstruct.job import output_lock
from kimi_eagle.reconstruct.source import reconstruction_source
from kimi_eagle.records import exit_status
from kimi_eagle.tokenize.tokenizer import load_tokenizer


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", required=True, help="engine records (JSONL: id + output_ids, SGLang or vLLM shape); "
                   "without engine records, validate by billing: `kimi-eagle billing ROWS -o DIR`")
    p.add_argument("--reconstructed", required=True, help="reconstructed rows (parquet from `kimi-eagle reconstruct`)")
    add_option(p, "-o", "--output", aliases=("--out",), dest="out", required=True,
               help="output directory (records.parquet, hunks.parquet, meta.json)")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the Kimi tokenizer in the assets)")
    p.add_argument("--labels", default=None, help="expected labels (labels.parquet from `kimi-eagle simulate`)")


def run(args: argparse.Namespace) -> int:
    from kimi_eagle.assets import kimi_dir

    check_jsonl(args.engine)  # a folder, Parquet, gzip, a JSON array: refused before any output
    check_parquet(args.reconstructed, "`kimi-eagle reconstruct`")
    recon_rows = read_reconstructed(args.reconstructed)  # refuse a bad file before loading the tokenizer
    labels = read_labels(args.labels) if args.labels else None
    tok = load_tokenizer(args.tokenizer or kimi_dir())
    result = diff_rows(tok, read_engine(args.engine, tok), recon_rows, labels)
    meta = {"engine": str(args.engine), "reconstructed": str(args.reconstructed), "tokenizer": tok.name,
            "labels": args.labels, **({"engine_model": m} if (m := engine_model(args.engine)) else {}),
            **({"api_model": s["model"]} if (s := reconstruction_source(args.reconstructed)) and s.get("model") else {})}
    meta["data"], meta["data_from"] = diff_data_kind(result.records, meta)  # provenance, read by report and compare
    with output_lock(Path(args.out)):  # one diff per output directory at a time
        out = write_diff(result, args.out, meta)
    counts = result.records["status"].value_counts().to_dict()
    labels = result.records["label"].value_counts().to_dict()
    print(f"{len(result.records)} records ({counts}), {len(result.hunks)} hunks; labels {labels} -> {out}")
    return exit_status(counts, [e for e, st in zip(result.records["error"], result.records["status"]) if st == "error"])
