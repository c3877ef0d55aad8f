"""``kimi-eagle serve``: an OpenRouter-compatible HTTP server over a local HF causal LM."""
from __future__ import annotations

import argparse
import os
import socket
import sys

from kimi_eagle.apps.api.faults import FaultConfig
from kimi_eagle.apps.api.server import DEFAULT_PROVIDER, App
from kimi_eagle.apps.cli import NONNEG_FLOAT, NONNEG_INT, PORT, POSITIVE_INT, PROBABILITY, add_option, serving_argument
from kimi_eagle.engine.local import (
    CHAT_FORMAT_ALIASES,
    CHAT_FORMATS,
    Engine,
)
from kimi_eagle.engine.precision import PRECISIONS, parse_provider_table
from kimi_eagle.io import write_json


def add_arguments(p: argparse.ArgumentParser) -> None:
    m = p.add_argument_group("model")
    add_option(m, "--model-dir", aliases=("--model",), dest="model", required=True,
               help="HF model directory (weights + tokenizer.json)")
    m.add_argument("--served-model-name", help="model ID clients must send (default: from the directory name)")
    add_option(m, "--format", aliases=("--chat-format",), dest="chat_format",
               choices=(*CHAT_FORMATS, *CHAT_FORMAT_ALIASES),
               help="chat format; default: hf-template (the tokenizer's own chat template) if it has one, else plain")
    add_option(m, "--serving", type=serving_argument(), metavar="PROFILE|PATH.toml", default="template",
               help="kimi-k2.5: render and answer as this server does (docs/reconstruct.md, 'Serving profiles'): "
                    "template (the jinja alone, the default), moonshot, vllm, sglang")
    m.add_argument("--stop-ids", help="comma-separated token IDs that end a generation (default: the config's eos)")
    add_option(m, "--logprobs", action="store_true",
               help="honour logprobs: true / top_logprobs on chat requests (token, logprob, bytes, top_logprobs); "
                    "without it they are ignored and answers carry \"logprobs\": null")
    m.add_argument("--threads", type=POSITIVE_INT, default=1, help="torch CPU threads")
    v = p.add_argument_group("providers")
    v.add_argument("--provider-name", default=DEFAULT_PROVIDER, help="the `provider` field of responses")
    v.add_argument("--precision", "--dtype", dest="precision", choices=PRECISIONS, default="float32",
                   help="serve the model cast to this dtype, or with int8 weight quantization of its Linear layers")
    v.add_argument("--providers", metavar="NAME=PRECISION,...",
                   help="serve a provider table instead of one provider, e.g. fp32=float32,bf16=bfloat16,int8=int8: "
                        "requests pick one with OpenRouter routing (provider.only / order), the first is the default")
    c = p.add_argument_group("connection")
    c.add_argument("--host", default="127.0.0.1")
    c.add_argument("--port", type=PORT, default=8000, help="0 picks a free port (see --ready-file)")
    c.add_argument("--ready-file", help="write {base_url, port, pid} here once listening")
    c.add_argument("--api-key-env", metavar="NAME",
                   help="require `Authorization: Bearer $NAME` (the key is read from that variable, never logged)")
    c.add_argument("--admin", action="store_true", help="enable /admin/faults and /admin/stats")
    o = p.add_argument_group("output")
    o.add_argument("--records", default="runs/serve/engine_records.jsonl", help="engine-record JSONL to append to")
    g = p.add_argument_group("fault injection (all off by default)")
    g.add_argument("--fault-429", type=PROBABILITY, default=0.0, metavar="P", help="probability of starting a 429 burst")
    g.add_argument("--fault-429-burst", type=POSITIVE_INT, default=1, metavar="N")
    g.add_argument("--retry-after", type=NONNEG_FLOAT, default=1.0, metavar="S")
    g.add_argument("--fault-500", type=PROBABILITY, default=0.0, metavar="P")
    g.add_argument("--fault-503", type=PROBABILITY, default=0.0, metavar="P")
    g.add_argument("--fault-truncate", type=PROBABILITY, default=0.0, metavar="P")
    g.add_argument("--fault-drop", type=PROBABILITY, default=0.0, metavar="P")
    g.add_argument("--fault-stream-cut", type=PROBABILITY, default=0.0, metavar="P",
                   help="probability that a streamed answer stops halfway and the connection drops")
    g.add_argument("--fault-slow", type=PROBABILITY, default=0.0, metavar="P")
    g.add_argument("--slow-seconds", type=NONNEG_FLOAT, default=5.0, metavar="S")
    g.add_argument("--fault-seed", type=NONNEG_INT)


def fault_config(args: argparse.Namespace) -> FaultConfig:
    return FaultConfig.from_dict(dict(
        rate_429=args.fault_429, burst_429=args.fault_429_burst, retry_after=args.retry_after,
        rate_500=args.fault_500, rate_503=args.fault_503, rate_truncate=args.fault_truncate,
        rate_drop=args.fault_drop, rate_stream_cut=args.fault_stream_cut, rate_slow=args.fault_slow, slow_seconds=args.slow_seconds, seed=args.fault_seed))


def run(args: argparse.Namespace) -> int:
    import uvicorn

    faults = fault_config(args)
    stop_ids = [int(i) for i in args.stop_ids.split(",")] if args.stop_ids else None
    table = parse_provider_table(args.providers) if args.providers else {args.provider_name: args.precision}
    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    if args.api_key_env and not api_key:
        raise ValueError(f"--api-key-env {args.api_key_env}: that variable is not set")
    engines = {name: Engine.from_dir(args.model, args.chat_format, args.served_model_name, threads=args.threads,
                                     stop_ids=stop_ids, precision=precision) for name, precision in table.items()}
    for e in engines.values():  # kimi-k2.5 prompts and answers through this serving profile
        e.serving = args.serving
    (first, engine), *rest = engines.items()
    app = App(engine, args.records, faults, first, args.admin, api_key, more_providers=dict(rest), logprobs=args.logprobs)
    # proto IPPROTO_TCP so asyncio sets TCP_NODELAY on accepted connections (else Nagle adds ~40 ms per reply)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    sock.listen(1024)
    host, port = sock.getsockname()[:2]
    base_url = f"http://{host}:{port}/v1"
    print(f"kimi-eagle serve: model {engine.name!r}, chat format {engine.chat_format!r}"
          f" ({app.model_card()['chat_format_description']}), providers {table}, engine records -> {args.records}",
          file=sys.stderr)
    print(f"kimi-eagle serve: faults {faults.to_dict() if faults.enabled else 'off'}; listening on {base_url}",
          file=sys.stderr, flush=True)
    if args.ready_file:
        write_json(args.ready_file, {"base_url": base_url, "port": port, "pid": os.getpid()}, indent=None)
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=2)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        app.log.close()
    return 0
