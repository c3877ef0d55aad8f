"""``make demo``: execute every notebook, in order, on the bundled data into ``runs/demo/``."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .notebooks import execute, notebook_runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default="runs/demo")
    args = p.parse_args(argv)
    out = Path(args.out)
    for notebook, params in notebook_runs("demo"):
        start = time.perf_counter()
        print(f"[demo] {notebook.name} ...", flush=True)
        executed = execute(notebook, out / notebook.stem, params, progress=False)
        print(f"[demo] {notebook.name} done in {time.perf_counter() - start:.1f}s -> {executed}", flush=True)
    print(f"[demo] all notebooks executed into {out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
