"""Per profile, how the kit fares on the recorded server vectors: the table in docs/servers.md.

    python tools/server_vectors/report.py            # prints the markdown table

Answers equal/total, prompts equal/total (and requests refused by server and kit alike), and the round trip
(server answer -> reconstruction): equal, count differs from the billed one, flagged, refused, silent (wrong
IDs, same count, no flag). Computed by the same functions the tests assert with (tests/test_server_*.py).
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from test_server_answers import EXCEPTIONS, SGLANG_VARIANTS, differing, load_vectors, vllm_variants, vllm_versions  # noqa: E402
from test_server_prompts import SERVERS, check_prompts  # noqa: E402
from test_server_roundtrip import roundtrip, well_formed_roundtrip  # noqa: E402

from kimi_eagle.assets import kimi_dir  # noqa: E402
from kimi_eagle.tokenize.tokenizer import load_tokenizer  # noqa: E402

# every server version with recorded answers: vLLM's variants by version, SGLang's as they are
FILES = {**{v: vllm_variants(v) for v in vllm_versions()}, "sglang-0.5": SGLANG_VARIANTS}
HEADER = ("| profile | server variant | answers equal / total | named exceptions | prompts equal / rendered | "
          "refused by server and kit | round trip: equal | count differs | flagged | refused | silent | "
          "well-formed outputs: equal / total |")


def row(tok, server: str, variant: str, profile: str, prompts: dict) -> str:
    name = f"{server}.answers.jsonl.gz"
    _, vectors = load_vectors(name)
    answered = sum(v["answers"].get(variant, {}).get("status") == 200 for v in vectors)
    differ = differing(name, variant, profile, tok)
    excepted = len(EXCEPTIONS.get(("vllm" if server.startswith("vllm-") else name, variant), {}))
    rt = roundtrip(name, variant, profile, tok)
    refused = sum(n for k, n in rt.items() if k.startswith("refused"))
    wf = well_formed_roundtrip(name, variant, profile, tok)
    p = prompts[server]
    return (f"| `{profile}` | {server} `{variant}` | {answered - len(differ)} / {answered} | {excepted} | "
            f"{p['equal']} / {p['equal']} | {p['refused']} | {rt['equal']} | {rt['count differs']} | "
            f"{rt['flagged']} | {refused} | {rt['silent']} | {wf['equal']} / {sum(wf.values())} |")


def main() -> int:
    tok = load_tokenizer(kimi_dir())
    prompts = {server: check_prompts(SERVERS / f"{server}.prompts.jsonl.gz", server, {}, tok) for server in FILES}
    print(HEADER)
    print("|---" * (HEADER.count("|") - 1) + "|")
    for server, variants in FILES.items():
        for variant, profile in variants.items():
            print(row(tok, server, variant, profile, prompts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
