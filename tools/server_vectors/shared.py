"""Shared by both collectors (stdlib only): what a client assembles from a streamed answer, and the vector files."""
from __future__ import annotations

import gzip
import json
from pathlib import Path


def assemble(chunks: list[dict], reasoning_key: str = "reasoning") -> dict:
    """The message a client assembles from streamed deltas (tool calls by ``index``; ``reasoning_key``: the
    server's reasoning field, ``reasoning`` for vLLM, ``reasoning_content`` for SGLang)."""
    reasoning, content, calls, finish = [], [], {}, None
    for chunk in chunks:
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get(reasoning_key) is not None:
                reasoning.append(delta[reasoning_key])
            if delta.get("content") is not None:
                content.append(delta["content"])
            for tc in delta.get("tool_calls") or []:
                slot = calls.setdefault(tc.get("index", len(calls)), {"id": None, "name": None, "arguments": ""})
                fn = tc.get("function") or {}
                slot["id"] = tc.get("id") or slot["id"]
                slot["name"] = fn.get("name") or slot["name"]
                slot["arguments"] += fn.get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    return {"message": {"reasoning": "".join(reasoning) if reasoning else None,
                        "content": "".join(content) if content else None,
                        "tool_calls": [calls[k] for k in sorted(calls)]},
            "finish_reason": finish}


def write_vectors(out_dir: Path, stem: str, cases: list[dict], results: list[dict], meta: dict) -> None:
    """``OUT/STEM.prompts.jsonl.gz`` and ``OUT/STEM.answers.jsonl.gz``: a ``meta`` line, then one line per case
    with its inputs and what the server returned (``results``: ``{"case", "prompt", "answers"?}`` per case)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    by_case = {r["case"]: r for r in results}
    with gzip.open(out_dir / f"{stem}.prompts.jsonl.gz", "wt", encoding="utf-8") as fp, \
            gzip.open(out_dir / f"{stem}.answers.jsonl.gz", "wt", encoding="utf-8") as fa:
        fp.write(json.dumps({"meta": meta}) + "\n")
        fa.write(json.dumps({"meta": meta}) + "\n")
        for case in cases:
            got = by_case[case["case"]]
            fp.write(json.dumps({"case": case["case"], "request": case["request"], **got["prompt"]},
                                ensure_ascii=False) + "\n")
            if case["kind"] == "answer":
                fa.write(json.dumps({"case": case["case"], "request": case["request"],
                                     "completion_ids": case["completion_ids"],
                                     "finish_reason": case["finish_reason"], "prompt_status": got["prompt"]["status"],
                                     "answers": got["answers"]}, ensure_ascii=False) + "\n")
