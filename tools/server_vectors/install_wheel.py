"""Install a package's wheel when one of its pinned requirements is not served by the index.

Runs with the servers' environment's python (stdlib and pip only). ``pip install NAME==VERSION`` fails as a
whole when a single requirement cannot be had (vLLM 0.34.0 pins ``flashinfer-python==0.7.3``, a CUDA kernel
package the render server never loads, and the index here does not serve that version). This script:

1. downloads the wheel alone (``pip download --no-deps``) and reads its ``Requires-Dist`` (markers evaluated
   for this interpreter and platform, extras left out);
2. installs those requirements; when pip answers that one of them has no matching distribution, that
   requirement is skipped (printed with pip's reason) and the rest installed again;
3. installs the wheel itself with ``--no-deps``.

    python install_wheel.py vllm==0.34.0 [--skip-log FILE]

Exit status 0 when the wheel is installed; the skipped requirements are printed (and written to --skip-log).
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from pip._vendor.packaging.requirements import Requirement

PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
NO_MATCH = re.compile(r"No matching distribution found for (\S+)")
NO_VERSION = re.compile(r"Could not find a version that satisfies the requirement (\S+) \(from versions: ([^)]*)\)")


def requirements_of(wheel: Path) -> list[str]:
    """The wheel's ``Requires-Dist`` lines that apply here (no extra requested)."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode("utf-8")
    out = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        req.marker = None
        out.append(str(req))
    return out


def name_of(spec: str) -> str:
    return Requirement(spec).name.lower().replace("_", "-")


def install_requirements(reqs: list[str]) -> list[tuple[str, str]]:
    """Install ``reqs``; drop each one pip says the index does not serve and retry. Returns (req, why)."""
    skipped: list[tuple[str, str]] = []
    remaining = list(reqs)
    while remaining:
        print(f"[install_wheel] pip install {len(remaining)} requirements", flush=True)
        proc = subprocess.run([*PIP, "install", "--progress-bar", "off", *remaining], text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        sys.stdout.write(proc.stdout)
        if proc.returncode == 0:
            return skipped
        missing = NO_MATCH.search(proc.stdout)
        if not missing:
            raise SystemExit(f"[install_wheel] pip failed (exit {proc.returncode}) for a reason other than an "
                             "unserved requirement; see above")
        bad = name_of(missing.group(1))
        versions = NO_VERSION.search(proc.stdout)
        why = (f"the index serves no matching version (it has: {versions.group(2) or 'none'})" if versions
               else "the index serves no matching distribution")
        hit = [r for r in remaining if name_of(r) == bad]
        if not hit:  # a requirement of a requirement: nothing of ours to drop
            raise SystemExit(f"[install_wheel] {missing.group(1)} (a transitive requirement) is not served; "
                             "cannot work around it here")
        for r in hit:
            print(f"[install_wheel] SKIPPED requirement {r}: {why}", flush=True)
            skipped.append((r, why))
            remaining.remove(r)
    return skipped


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("spec", help="NAME==VERSION")
    p.add_argument("--skip-log", help="write the skipped requirements here, one per line with the reason")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([*PIP, "download", "--no-deps", "--progress-bar", "off", "-d", tmp, a.spec], check=True)
        wheel = next(Path(tmp).glob("*.whl"))
        reqs = requirements_of(wheel)
        print(f"[install_wheel] {wheel.name}: {len(reqs)} requirements apply here", flush=True)
        skipped = install_requirements(reqs)
        subprocess.run([*PIP, "install", "--no-deps", "--progress-bar", "off", str(wheel)], check=True)
    if a.skip_log:
        Path(a.skip_log).write_text("".join(f"{r}\t{why}\n" for r, why in skipped), encoding="utf-8")
    if skipped:
        print(f"[install_wheel] {a.spec} installed --no-deps; its requirements installed except "
              + "; ".join(f"{r} ({why})" for r, why in skipped), flush=True)
    else:
        print(f"[install_wheel] {a.spec} installed with all its requirements", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
