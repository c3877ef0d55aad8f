"""Requests nobody on the project wrote, rendered or refused as the real servers did, request for request.

``tests/data/servers/requests.corpus.jsonl.gz`` holds the corpus (``tools/server_vectors/outside_requests.py``): every
recorded request of the real exchanges and of a coding agent's traces, the chat datasets of the assets turned into
requests, and requests drawn by hypothesis over the chat request schema with the shapes real clients send that it
forbids. ``<server>-<version>.requests.jsonl.gz`` holds what that server version did with each (``make
server-vectors``): the prompt IDs it rendered, or its refusal (status and message). Under the version's profile the
kit must render the same IDs, or refuse with a reason naming the server, for every request.
"""
from __future__ import annotations

import re
import sys
from collections import Counter
from functools import lru_cache
from pathlib import Path

import pytest

from kimi_eagle.records import RecordError
from kimi_eagle.serving.profiles import PROFILES

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools" / "server_vectors"))
from shared import expand_prompts, expand_requests, read_jsonl  # noqa: E402  (the vectors' own reader, stdlib only)
from test_server_prompts import render_ids  # noqa: E402

SERVERS = Path(__file__).resolve().parent / "data" / "servers"
VERSIONS = sorted(p.name.split(".requests")[0] for p in SERVERS.glob("*.requests.jsonl.gz"))
EXCEPTIONS: dict[str, dict[str, str]] = {}  # version -> {request id: why the kit differs} (none today)


@lru_cache(maxsize=1)
def corpus() -> dict[str, dict]:
    return {r["id"]: r for r in expand_requests(read_jsonl(SERVERS / "requests.corpus.jsonl.gz"))}


@lru_cache(maxsize=4)
def vectors(version: str) -> tuple[dict, list[dict]]:
    lines = read_jsonl(SERVERS / f"{version}.requests.jsonl.gz")
    return lines[0]["meta"], expand_prompts(lines)


def reason_of(error: str) -> str:
    """A refusal's reason as docs/servers.md tabulates it: the kit's words after ``<profile> would answer <status>:``,
    message and tool positions, quoted values and numbers left out."""
    reason = error.split(": ", 1)[1] if " would answer " in error else error
    reason = re.sub(r"^message \d+: ", "", reason).split("; details: ")[0]  # details vary with the schema library
    return re.sub(r"\d+", "N", re.sub(r"'[^'\s]*'", "X", reason))[:100]


def outcome(row: dict, request: dict, profile: str, tok, cache: dict) -> str:
    """``equal`` / ``refused alike`` (or ``equal text``: the server handed the engine text, as for images), else
    what differs."""
    try:
        ids, error = render_ids(request, profile, tok, cache), None
    except RecordError as e:
        ids, error = None, str(e)
    if row["status"] != 200:
        if error is None:
            return "the kit rendered a request the server refused"
        if not error.startswith(f"{profile} would answer"):
            return f"refused, not naming the server: {error[:80]}"
        return f"refused alike: {reason_of(error)}"
    if error is not None:
        return f"the kit refused a request the server rendered: {error[:100]}"
    if row.get("prompt_ids") is None:
        text = b"".join(tok.token_bytes(i) for i in ids).decode("utf-8", "replace")
        return "equal text" if text == row.get("prompt_text") else "the rendered text differs"
    return "equal" if ids == row["prompt_ids"] else "the prompt IDs differ"


def test_the_corpus_is_large_mostly_not_generated_and_often_refused():
    requests = corpus()
    origins = Counter(r["origin"].split(":")[0] for r in requests.values())
    assert len(requests) >= 5000
    assert len(requests) - origins["generated"] >= len(requests) / 2, origins
    assert {"recorded", "agent", "dataset", "generated"} <= set(origins)
    refused = {v: sum(r["status"] != 200 for r in vectors(v)[1]) for v in VERSIONS}
    assert max(refused.values(), default=0) >= 1000, refused


@pytest.mark.parametrize("version", VERSIONS)
def test_the_vectors_are_the_servers_recorded_with_a_k25_model_directory(version):
    meta, rows = vectors(version)
    server, number = version.split("-", 1)
    assert meta["server"] == server and meta["version"].startswith(number + ".")
    assert meta["model_type"] == "kimi_k25" and version in PROFILES
    assert [r["id"] for r in rows] == list(corpus()), "one answer per corpus request, in corpus order"


@pytest.mark.parametrize("version", VERSIONS)
def test_the_kit_renders_or_refuses_every_request_as_the_server_did(version, kimi):
    _, rows = vectors(version)
    cache: dict = {}
    got = Counter()
    wrong = []
    for row in rows:
        if row["id"] in EXCEPTIONS.get(version, {}):
            got["excepted"] += 1
            continue
        result = outcome(row, corpus()[row["id"]]["request"], version, kimi, cache)
        got[result] += 1
        if result not in ("equal", "equal text") and not result.startswith("refused alike: "):
            wrong.append(f"{row['id']}: {result}")
    assert not wrong, f"{len(wrong)} of {len(rows)} requests differ under {version}:\n" + "\n".join(wrong[:20])
    refused = Counter({k.removeprefix("refused alike: "): n for k, n in got.items() if k.startswith("refused alike")})
    assert got["equal"] >= 3000 and sum(refused.values()) >= 1000, got
    docs = (Path(__file__).resolve().parent.parent / "docs" / "servers.md").read_text()
    totals = (f"| `{version}` | {got['equal']:,} | {sum(refused.values()):,} | {got['equal text']:,} | 0 | "
              f"{sum(r['status'] != 200 for r in rows):,} |")
    assert totals in docs, totals
    for reason, n in refused.items():  # every refusal reason with its count, as docs/servers.md lists it
        assert f"| {n:,} | {reason} |" in docs, f"| {n:,} | {reason} |"
