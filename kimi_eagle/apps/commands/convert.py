"""``kimi-eagle convert``: real datasets or your own chat-completion logs -> API records.
``--from openai`` reads your logs, one JSON object per line or a JSON array, each one of:
``{"id"?, "request": {...}, "response": {...}}``; the request's own fields beside the response,
``{"model", "messages", "tools"?, "response": {...}}``, where the response is the OpenAI SDK's
``model_dump()`` or OpenRouter's response JSON (``usage``, ``provider``, ``finish_reason``, ``model`` are
kept); or a conversation ``{"id"?, "messages", "tools"?}`` (one record per assistant turn). Without an
``id`` the response's id is used, else a stable ``log:<sha256>`` (``id_from`` says which). Example log:
docs/examples/openai_log.jsonl.
``--from openai-stream`` reads logged ``stream: true`` answers: raw SSE (``data: {...}`` lines) or a JSONL of
chunk objects (the SDK's ``ChatCompletionChunk.model_dump()``, OpenRouter's chunks), one or many answers per
file grouped by the chunk ``id``, each after its request line, or ``{"request": {...}, "chunks": [...]}``
(see kimi_eagle/reconstruct/stream_log.py).
"""
from __future__ import annotations

import argparse

from kimi_eagle.apps.cli import POSITIVE_INT
from kimi_eagle.reconstruct.convert import SOURCES, _convert_file
from kimi_eagle.records import exit_status


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", nargs="?", metavar="INPUT", help="dataset file (default: the bundled dataset for --from)")
    p.add_argument("--from", dest="source", required=True, choices=SOURCES)
    p.add_argument("-o", "--output", required=True, help="output JSONL of API records")
    p.add_argument("--limit", type=POSITIVE_INT, default=None, help="convert only the first N conversations")


def run(args: argparse.Namespace) -> int:
    n, errors = _convert_file(args.source, args.input, args.output, args.limit)
    print(f"{args.output}: {n} API records from {args.source}" + (f", {len(errors)} of them errors" if errors else ""))
    return exit_status({"ok": n - len(errors), "error": len(errors)}, errors)
