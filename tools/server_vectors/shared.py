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
    (fp, raw_p), (fa, raw_a) = _gzip_writer(out_dir / f"{stem}.prompts.jsonl.gz"), \
        _gzip_writer(out_dir / f"{stem}.answers.jsonl.gz")
    with raw_p, raw_a, fp, fa:
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


# ------------------------------------------------------------------------------------------------------------
# The request corpus (tools/server_vectors/outside_requests.py) and what each server did with it, stored compactly:
# a request that repeats an earlier one's tools or opening messages names it instead of repeating them, and
# prompt IDs that start like an earlier request's name it and carry only the rest. ``expand_*`` undo it.

def _gzip_writer(path: Path):
    """A gzip text file whose bytes depend only on its content (no name, no time in the header)."""
    import io
    raw = open(path, "wb")
    return io.TextIOWrapper(gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9),
                            encoding="utf-8", errors="surrogatepass", newline="\n"), raw


def dumps_line(obj) -> str:
    """One compact JSON line; lone surrogates (which UTF-8 cannot hold) written as \\u escapes."""
    try:
        text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return json.dumps(obj, ensure_ascii=True, separators=(",", ":"))


def read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="surrogatepass") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_jsonl_gz(path: Path, lines: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    f, raw = _gzip_writer(path)
    with raw, f:
        for line in lines:
            f.write(dumps_line(line) + "\n")


def _key(obj) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=True)


def compact_requests(rows: list[dict]) -> list[dict]:
    """``{"id", "origin", "request"}`` rows -> lines where ``tools_from: ID`` stands for an earlier request's
    identical ``tools`` and ``messages_from: {"id": ID, "n": K}`` for its first K messages (``request.messages``
    then holds only the rest)."""
    tools_seen: dict[str, str] = {}
    by_first: dict[str, list[tuple[str, list[str]]]] = {}
    out = []
    for row in rows:
        req = dict(row["request"])
        line = {"id": row["id"], "origin": row["origin"]}
        if isinstance(req.get("tools"), list) and req["tools"]:
            k = _key(req["tools"])
            if k in tools_seen:
                line["tools_from"] = tools_seen[k]
                del req["tools"]
            else:
                tools_seen[k] = row["id"]
        msgs = req.get("messages")
        if isinstance(msgs, list) and msgs:
            keys = [_key(m) for m in msgs]
            best, best_n = None, 0
            for other_id, other_keys in by_first.get(keys[0], [])[-64:]:
                n = 0
                for a, b in zip(keys, other_keys):
                    if a != b:
                        break
                    n += 1
                if n > best_n:
                    best, best_n = other_id, n
            if best is not None and best_n >= 1 and len(json.dumps(msgs[:best_n])) > 200:
                line["messages_from"] = {"id": best, "n": best_n}
                req["messages"] = msgs[best_n:]
            by_first.setdefault(keys[0], []).append((row["id"], keys))
        line["request"] = req
        out.append(line)
    return out


def expand_requests(lines: list[dict]) -> list[dict]:
    """The inverse of ``compact_requests`` (lines without ``id``, such as a ``meta`` line, are skipped)."""
    full: dict[str, dict] = {}
    out = []
    for line in lines:
        if "id" not in line:
            continue
        req = dict(line["request"])
        if "messages_from" in line:
            ref = line["messages_from"]
            req["messages"] = full[ref["id"]]["messages"][:ref["n"]] + req.get("messages", [])
        if "tools_from" in line:
            req["tools"] = full[line["tools_from"]]["tools"]
        full[line["id"]] = req
        out.append({"id": line["id"], "origin": line["origin"], "request": req})
    return out


def compact_prompts(results: list[dict], min_keep: int = 256) -> list[dict]:
    """Per-request results -> lines where ``prompt_ids_from: {"id": ID, "n": K}`` stands for the first K prompt
    IDs of an earlier rendered request and ``prompt_ids`` holds the rest; ``prompt_len`` is always the full
    length."""
    buckets: dict[tuple, list[tuple[str, list[int]]]] = {}
    out = []
    for res in results:
        line = dict(res)
        ids = res.get("prompt_ids")
        if ids is not None:
            line["prompt_len"] = len(ids)
            head = tuple(ids[:min_keep])
            best, best_n = None, 0
            if len(ids) >= min_keep:
                for other_id, other in buckets.get(head, [])[-32:]:
                    n = min_keep
                    limit = min(len(ids), len(other))
                    while n < limit and ids[n] == other[n]:
                        n += 1
                    if n > best_n:
                        best, best_n = other_id, n
                buckets.setdefault(head, []).append((res["id"], ids))
            if best is not None:
                line["prompt_ids_from"] = {"id": best, "n": best_n}
                line["prompt_ids"] = ids[best_n:]
        out.append(line)
    return out


def expand_prompts(lines: list[dict]) -> list[dict]:
    """The inverse of ``compact_prompts`` (lines without ``id`` skipped)."""
    full: dict[str, list[int]] = {}
    out = []
    for line in lines:
        if "id" not in line:
            continue
        res = dict(line)
        if "prompt_ids_from" in res:
            ref = res.pop("prompt_ids_from")
            res["prompt_ids"] = full[ref["id"]][:ref["n"]] + res["prompt_ids"]
        if res.get("prompt_ids") is not None:
            if len(res["prompt_ids"]) != res.get("prompt_len", len(res["prompt_ids"])):
                raise ValueError(f"{res['id']}: prompt_len does not match")
            full[res["id"]] = res["prompt_ids"]
        out.append(res)
    return out


def profile_stem(server: str, version_text: str) -> str:
    """``vllm-0.34`` for vLLM 0.34.0: the profile name is ``<server>-<major>.<minor>`` of the version that ran."""
    return f"{server}-{'.'.join(version_text.split('.')[:2])}"


def write_request_vectors(out_dir: Path, stem: str, rows: list[dict], results: list[dict], meta: dict) -> Path:
    """``OUT/STEM.requests.jsonl.gz``: a ``meta`` line, then per corpus request (in corpus order) ``{"id",
    "origin", "status", "prompt_ids" | "error"}`` (prompt IDs compacted by ``compact_prompts``)."""
    by_id = {r["id"]: r for r in results}
    ordered = [{"id": row["id"], "origin": row["origin"], **by_id[row["id"]]} for row in rows]
    counts: dict[str, dict[str, int]] = {}
    for r in ordered:
        c = counts.setdefault(r["origin"], {"rendered": 0, "refused": 0})
        c["rendered" if r["status"] == 200 else "refused"] += 1
    meta = {**meta, "counts": {"rendered": sum(c["rendered"] for c in counts.values()),
                               "refused": sum(c["refused"] for c in counts.values()), "by_origin": counts}}
    path = out_dir / f"{stem}.requests.jsonl.gz"
    write_jsonl_gz(path, [{"meta": meta}, *compact_prompts(ordered)])
    return path
