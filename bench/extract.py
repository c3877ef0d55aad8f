"""Hidden-state extraction vs a bare target forward pass over the same batches (target ratio <= 1.1).

Rows are real text (Alpaca outputs) tokenised with the target's tokenizer, cut to ``--max-len``
tokens. The baseline runs the full causal LM (logits included) over the exact padded batches that
``kimi_eagle.eagle3.extract.extract`` forms; extraction is the whole ``extract`` call: hooks, bf16 casts,
safetensors serialisation, sha256 and atomic writes. Repeats are interleaved and the best of each
kept, to beat noise on a shared machine.

    python bench/extract.py [--rows 128] [--max-len 256] [--repeats 5] [--threads 1]
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch

from kimi_eagle.assets import data_path, stories_dir
from kimi_eagle.eagle3.extract import extract
from kimi_eagle.eagle3.hidden import Row, batches_by_length, load_target, pad_batch
from kimi_eagle.tokenize.tokenizer import HFTokenizer


def real_rows(n: int, max_len: int) -> list[Row]:
    tok = HFTokenizer.from_dir(stories_dir())
    items = json.loads(data_path("alpaca").read_text())
    rows = []
    for i, item in enumerate(items):
        prompt = [1] + tok.encode(item["instruction"])[:32]
        completion = tok.encode(item["output"])[: max_len - len(prompt)]
        if len(completion) >= 16:
            rows.append(Row(str(i), prompt + completion, [0] * len(prompt) + [1] * len(completion)))
        if len(rows) == n:
            break
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=128)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=4096, help="padded tokens per batch (as kimi-eagle extract)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model = load_target(stories_dir())
    rows = real_rows(args.rows, args.max_len)
    batches = [pad_batch([rows[i].input_ids for i in b]) for b in batches_by_length([len(r.input_ids) for r in rows], args.max_tokens)]
    n_tokens = sum(len(r.input_ids) for r in rows)
    tmp = Path(tempfile.mkdtemp(prefix="bench_extract_"))

    def bare() -> None:
        with torch.inference_mode():
            for ids, mask in batches:
                model(input_ids=ids, attention_mask=mask, use_cache=False)

    def extraction() -> None:
        out = tmp / "hs"
        shutil.rmtree(out, ignore_errors=True)
        extract(stories_dir(), rows, out, dtype="bf16", max_tokens=args.max_tokens, model=model)

    bare(), extraction()  # warm up
    best = {"bare": float("inf"), "extract": float("inf")}
    for _ in range(args.repeats):
        for name, fn in (("bare", bare), ("extract", extraction)):
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    manifest = json.loads((tmp / "hs" / "manifest.json").read_text())
    shutil.rmtree(tmp, ignore_errors=True)
    ratio = best["extract"] / best["bare"]
    print(f"rows {len(rows)}, tokens {n_tokens:,}, batches {len(batches)}, layer ids {manifest['layer_ids']}, "
          f"{manifest['bytes_per_token']} bytes/token on disk")
    print(f"bare forward  {best['bare'] * 1e3:8.1f} ms  ({n_tokens / best['bare']:,.0f} tok/s)")
    print(f"extraction    {best['extract'] * 1e3:8.1f} ms  ({n_tokens / best['extract']:,.0f} tok/s)")
    print(f"overhead ratio extract / bare = {ratio:.3f} (target <= 1.1)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
