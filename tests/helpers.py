"""Builders shared by several test files: token splits, Kimi assistant turns, reconstructed rows, API records.

Import them as ``from helpers import ...`` (pytest puts ``tests/`` on ``sys.path`` through ``conftest.py``).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kimi_eagle.chat.completion import CompletionOptions
from kimi_eagle.chat.formats import get_format
from kimi_eagle.reconstruct.record import reconstruct_record

ARGS = '{"city": "Paris", "unit": "celsius"}'


def split_token(tok, ids, index):
    """Replace ``ids[index]`` by two valid tokens spelling the same bytes (as sampling can produce)."""
    raw = tok.token_bytes(ids[index])
    for cut in range(1, len(raw)):
        left, right = raw[:cut], raw[cut:]
        try:
            return ids[:index] + [tok.encoding.encode_single_token(left), tok.encoding.encode_single_token(right)] + ids[index + 1 :]
        except KeyError:
            continue
    return None


def build(tok, pieces):
    """IDs and segments for ``[(kind, text, is_special)]``: each piece encoded on its own."""
    ids, segments, nbytes = [], [], 0
    for kind, text, special in pieces:
        piece_ids = tok.encode(text, allow_special={text}) if special else tok.encode(text)
        n = len(text.encode())
        segments.append({"kind": kind, "byte_start": nbytes, "byte_end": nbytes + n,
                         "tok_start": len(ids), "tok_end": len(ids) + len(piece_ids)})
        ids += piece_ids
        nbytes += n
    return ids, segments


def turn(reasoning="Let me check the weather in Paris first.", think_end=True, content="",
         tool_id="functions.get_weather:0", args=ARGS, im_end=True):
    """The pieces of one Kimi assistant turn: reasoning, ``</think>``, content, one tool call, ``<|im_end|>``."""
    pieces = [("reasoning", reasoning, False)]
    if think_end:
        pieces.append(("think_end", "</think>", True))
    if content:
        pieces.append(("content", content, False))
    if tool_id is not None:
        pieces += [("tool_section_begin", "<|tool_calls_section_begin|>", True),
                   ("tool_call_begin", "<|tool_call_begin|>", True), ("tool_id", tool_id, False),
                   ("tool_arg_begin", "<|tool_call_argument_begin|>", True), ("tool_args", args, False),
                   ("tool_call_end", "<|tool_call_end|>", True), ("tool_section_end", "<|tool_calls_section_end|>", True)]
    if im_end:
        pieces.append(("im_end", "<|im_end|>", True))
    return pieces


def recon_row(rid, ids, segs, status="ok", error=None, billed=None, billed_reasoning=None, dataset="demo"):
    """A reconstructed row (the columns `kimi-eagle reconstruct` writes) with the given IDs and segments."""
    return {"id": rid, "dataset": dataset, "status": status, "error": error, "format": "kimi-k2.5",
            "prompt_ids": [1, 2, 3], "completion_ids": ids, "n_prompt_tokens": 3, "n_completion_tokens": len(ids),
            "segments": segs, "flags": [], "finish_reason": "tool_calls", "billed_completion_tokens": billed,
            "billed_reasoning_tokens": billed_reasoning, "provider": "test"}


def write_engine(path: Path, lines: list[Any]) -> None:
    """Engine records as JSONL; a ``str`` line is written verbatim (for malformed-input cases)."""
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))


def api(rid, provider="P", reasoning=None, content="Paris is sunny today.", tool_calls=None, finish="stop",
        usage=None):
    """An API record with one assistant message (``usage=...`` leaves ``usage`` out of the response)."""
    message = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning"] = reasoning
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    response = {"provider": provider, "choices": [{"message": message, "finish_reason": finish}]}
    if usage is not ...:
        response["usage"] = usage
    return {"id": rid, "dataset": "unit", "request": {"model": "m", "messages": [{"role": "user", "content": "Weather?"}]},
            "response": response}


def row(kimi, record, billed=0, billed_reasoning=0, options=CompletionOptions(), usage=None):
    """The reconstructed row of ``record``, billed ``recon + billed`` tokens (reasoning: ``recon + billed_reasoning``)."""
    fmt = get_format("kimi-k2.5", kimi)
    r = reconstruct_record(record, kimi, fmt, options).to_dict()
    if usage is None:
        n_reasoning = sum(s["tok_end"] - s["tok_start"] for s in r["segments"] if s["kind"] == "reasoning")
        record["response"]["usage"] = {"completion_tokens": r["n_completion_tokens"] + billed,
                                       "completion_tokens_details": {"reasoning_tokens": n_reasoning + billed_reasoning}}
    else:
        record["response"]["usage"] = usage
    return reconstruct_record(record, kimi, fmt, options).to_dict()
