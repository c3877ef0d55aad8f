"""Exact-ID rate with and without logprobs: serve --logprobs -> requests with logprobs -> reconstruct -> diff.

Samples N completions from a local model (stories260K by default, temperature 1) through ``kimi-eagle serve
--logprobs``, each request asking ``logprobs: true``, and stores every answer twice: as received (with
``choices[0].logprobs.content``) and text-only (the same answer with ``"logprobs": null``). Both files are
reconstructed with ``kimi-eagle reconstruct`` and diffed by bytes against the IDs the server logged with
``kimi-eagle diff``, so the two rates are measured on the very same samples. The exact rate is also recomputed
independently (reconstructed ``completion_ids`` == the engine's ``output_ids``) and must agree with diff's.

    python bench/logprobs_exact.py [--n 500] [--max-tokens 256] [--model-dir DIR] [--format plain] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pandas as pd

from kimi_eagle.apps.api.server import LocalServer
from kimi_eagle.assets import stories_dir
from kimi_eagle.engine.pairs import prompt_messages
from kimi_eagle.engine.prompts import story_prompts
from kimi_eagle.io import read_jsonl, write_json, write_jsonl


def sh(cmd: list[str], timeout: float) -> str:
    print("$", " ".join(shlex.quote(c) for c in cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        sys.exit(f"command failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return r.stdout


def ask(client: httpx.Client, base_url: str, model: str, line: dict, args: argparse.Namespace) -> dict:
    request = {"model": model, "messages": prompt_messages(line), **({"tools": line["tools"]} if "tools" in line else {})}
    body = {**request, "temperature": args.temperature, "seed": line["seed"], "max_tokens": args.max_tokens,
            "logprobs": True}
    r = client.post(base_url + "/chat/completions", json=body, headers={"X-Record-Id": line["id"]})
    record = {"id": line["id"], "dataset": line.get("dataset"), "request": request}
    if r.status_code != 200:  # kept, as an error row downstream, never dropped
        return {**record, "error": f"HTTP {r.status_code}: {r.text[:200]}"}
    return {**record, "response": r.json()}


def text_only(record: dict) -> dict:
    if "response" not in record:
        return record
    response = {**record["response"], "choices": [{**c, "logprobs": None} for c in record["response"]["choices"]]}
    return {**record, "response": response}


def measure(py: list[str], name: str, api: Path, engine: Path, out: Path, args: argparse.Namespace) -> dict:
    recon, diff_dir = out / f"recon_{name}.parquet", out / f"diff_{name}"
    sh([*py, "reconstruct", str(api), "-o", str(recon), "--tokenizer", args.model_dir, "--format", args.format,
        "--no-progress"], timeout=1800)
    sh([*py, "diff", "--engine", str(engine), "--reconstructed", str(recon), "-o", str(diff_dir),
        "--tokenizer", args.model_dir], timeout=1800)
    records = pd.read_parquet(diff_dir / "records.parquet")
    rows = pd.read_parquet(recon)
    ok = records[records["status"] == "ok"]
    verdicts = Counter(ok["verdict"])
    truth = {r["id"]: r["output_ids"] for r in read_jsonl_objs(engine)}
    good = rows[rows["status"] == "ok"]
    same = sum(1 for rid, ids in zip(good["id"], good["completion_ids"]) if rid in truth and list(ids) == truth[rid])
    return {"records": len(records), "ok": len(ok), "verdicts": dict(verdicts),
            "exact_rate": verdicts["exact"] / len(ok) if len(ok) else None,
            "exact_rate_recomputed": same / len(good) if len(good) else None,
            "ids_source": dict(Counter(rows["ids_source"].fillna("none"))),
            "flags": dict(Counter(f for flags in rows["flags"] for f in flags))}


def read_jsonl_objs(path: Path) -> list[dict]:
    return [line.obj for line in read_jsonl(path)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=500)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--seed", type=int, default=0, help="prompt i is sampled with seed seed*1000003+i")
    p.add_argument("--model-dir", default=str(stories_dir()))
    p.add_argument("--format", default="plain", help="reconstruction chat format (kimi-k2.5 for a tiny-kimi model)")
    p.add_argument("--out", default="runs/logprobs_exact")
    args = p.parse_args()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    py = [sys.executable, "-m", "kimi_eagle"]
    engine_log, engine = out / "engine_log.jsonl", out / "engine.jsonl"
    engine_log.unlink(missing_ok=True)
    if args.format == "kimi-k2.5":  # tiny-kimi knows part of Kimi's vocabulary: the conversations it was trained on
        from kimi_eagle.apps.tiny_kimi import kimi_prompt_lines
        from kimi_eagle.tokenize.tokenizer import load_tokenizer

        prompts = kimi_prompt_lines(args.n, load_tokenizer(args.model_dir), seed=args.seed)
    else:
        prompts = story_prompts(args.n, args.seed)
    t0 = time.perf_counter()
    print(f"$ kimi-eagle serve --model-dir {args.model_dir} --logprobs --records {engine_log} --port 0")
    with LocalServer(args.model_dir, engine_log, "--logprobs", "--threads", "1", log=out / "serve.log") as srv:
        model = httpx.get(srv.base_url + "/models").json()["data"][0]["id"]
        with httpx.Client(timeout=600) as client, ThreadPoolExecutor(args.concurrency) as pool:
            answers = list(pool.map(lambda line: ask(client, srv.base_url, model, line, args), prompts))
    t_collect = time.perf_counter() - t0
    with_lp = write_jsonl(out / "api_logprobs.jsonl", answers)
    without = write_jsonl(out / "api_text.jsonl", [text_only(a) for a in answers])
    write_jsonl(engine, read_jsonl_objs(engine_log))
    summary = {"n": len(prompts), "http_errors": sum("error" in a for a in answers), "model_dir": args.model_dir, "format": args.format, "temperature": args.temperature,
               "max_tokens": args.max_tokens, "collect_seconds": round(t_collect, 1),
               "with_logprobs": measure(py, "logprobs", with_lp, engine, out, args),
               "text_only": measure(py, "text", without, engine, out, args)}
    write_json(out / "summary.json", summary)
    print(json.dumps(summary, indent=2))
    print(f"# exact-ID rate: with logprobs {summary['with_logprobs']['exact_rate']:.4f}, "
          f"text only {summary['text_only']['exact_rate']:.4f} (same {len(prompts)} samples)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
