"""The readers of issue 37 on hostile sizes, N against 2N in one run: one long JSONL line (``read_jsonl``) and one SSE
event of many ``data:`` lines (``convert --from openai-stream``). Linear readers print a ratio near 2; a reader that
re-scans what it has read prints about 4. One JSON object on stdout.

    python bench/readers_linear.py [--line-mb 128] [--lines 2000000]
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from kimi_eagle.io import read_jsonl
from kimi_eagle.reconstruct.convert import convert


def _timed(fn, path: Path) -> float:
    t0 = time.perf_counter()
    fn(path)
    return round(time.perf_counter() - t0, 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--line-mb", type=int, default=128, help="size of the long line (2N); N is half")
    ap.add_argument("--lines", type=int, default=2_000_000, help="data lines of the event (2N); N is half")
    args = ap.parse_args()
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, size, write, read in (
                ("jsonl_line_mb", args.line_mb, lambda p, n: p.write_bytes(b'{"x": "' + b"a" * (n << 20) + b'"}\n'),
                 lambda p: sum(1 for _ in read_jsonl(p))),
                ("sse_data_lines", args.lines, lambda p, n: p.write_bytes(b"data: x\n" * n + b"\n"),
                 lambda p: list(convert("openai-stream", p)))):
            seconds = {}
            for n in (size // 2, size):
                path = Path(tmp) / f"{name}-{n}"
                write(path, n)
                seconds[n] = _timed(read, path)
                path.unlink()
            out[name] = {"seconds": {str(k): v for k, v in seconds.items()},
                         "ratio_2n_over_n": round(seconds[size] / max(seconds[size // 2], 1e-3), 2)}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
