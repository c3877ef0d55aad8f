"""Ask SGLang's own OpenAI serving code, in process, about the corpus and record its answers as test vectors.

Runs in the servers' environment (``make server-vectors`` builds it), never the kit's. No GPU, no weights,
no HTTP server: it builds ``ServerArgs`` as ``sglang serve MODEL_DIR --trust-remote-code --reasoning-parser
kimi_k2 --tool-call-parser kimi_k2`` would (plus ``--device cpu``), publishes them, loads the tokenizer and
templates with SGLang's own loaders and constructs SGLang's ``OpenAIServingChat``. Only the engine is a
stand-in (``EngineStandIn``, the ``tokenizer_manager`` the serving code talks to): it takes the
``GenerateReqInput`` the serving code hands it (its ``input_ids`` are the prompt vector), plays the
scheduler (the corpus completion IDs, finished by ``<|im_end|>`` or by length) into SGLang's real
``DetokenizerManager`` and hands the resulting text back the way the ``TokenizerManager`` does.

Every request goes through ``OpenAIServingChat.handle_request`` (request validation, template, tool and
reasoning parsers, the 400/500 classification), non-streaming and streaming (seeded chunks of 1-4 tokens,
as ``collect_vllm.py``), with ``spaces_between_special_tokens`` at SGLang's default (on) and off.

    python collect_sglang.py --model-dir DIR --corpus corpus.jsonl --out tests/data/servers

With ``--requests REQUESTS.jsonl[.gz]`` (``outside_requests.py``) it also renders every request of that corpus through
``handle_request`` and records the prompt IDs the serving code hands the engine, or the refusal (status and
message verbatim) in ``OUT/sglang-<major>.<minor>.requests.jsonl.gz``. Files are named by the SGLang version.
"""
from __future__ import annotations

import argparse
import asyncio
import copy
import json
import logging
import random
import sys
import time
import warnings
from importlib.metadata import version
from pathlib import Path

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
from sglang.srt.managers.detokenizer_manager import DetokenizerManager
from sglang.srt.managers.io_struct import BatchTokenIDOutput
from sglang.srt.managers.schedule_batch import INIT_INCREMENTAL_DETOKENIZATION_OFFSET
from sglang.srt.managers.scheduler_components.output_streamer import DEFAULT_FORCE_STREAM_INTERVAL
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.managers.utils import compute_num_reserved_tokens
from sglang.srt.parser.template_detection import resolve_auto_parsers
from sglang.srt.parser.template_manager import TemplateManager
from sglang.srt.runtime_context import get_model, get_observability, get_serving, publish
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import prepare_server_args
from sglang.srt.utils.hf_transformers_utils import get_tokenizer
from sglang.srt.utils.json_response import model_json_response
from sglang.srt.utils.request_logger import RequestLogger
from shared import assemble, expand_requests, profile_stem, read_jsonl, write_request_vectors, write_vectors

MAX_ERROR_CHARS = 4000  # a refusal's message is kept verbatim up to this length
DROPPED_KEYS = ("stream", "stream_options")

# spaces_between_special_tokens: left to SGLang's default (True, ChatCompletionRequest.to_sampling_params), and off
SETTINGS = {"default": None, "nospace": False}
SERVE_ARGS = ["--trust-remote-code", "--reasoning-parser", "kimi_k2", "--tool-call-parser", "kimi_k2",
              "--device", "cpu"]


def publish_server_args(model_dir: str):
    """``ServerArgs`` as ``sglang serve`` resolves and publishes them before it builds the tokenizer manager."""
    server_args = prepare_server_args(["--model-path", model_dir, *SERVE_ARGS])
    server_args.resolve_once()
    server_args.check_server_args()
    resolve_auto_parsers(server_args)
    publish(server_args, role="tokenizer")
    return server_args


def load_tokenizer():
    """The tokenizer exactly as ``TokenizerManager.init_tokenizer_and_processor`` loads it (text model)."""
    serving, model = get_serving(), get_model()
    return get_tokenizer(serving.tokenizer_path, tokenizer_mode=serving.tokenizer_mode,
                         trust_remote_code=model.trust_remote_code, revision=model.revision,
                         tokenizer_backend=serving.tokenizer_backend)


def build_detokenizer(server_args) -> DetokenizerManager:
    """SGLang's ``DetokenizerManager`` without its ZMQ sockets (it is called directly, not over IPC)."""
    detok = DetokenizerManager.__new__(DetokenizerManager)
    detok.init_tokenizer(server_args)
    detok.init_running_status(server_args)
    detok.init_request_dispatcher()
    return detok


def token_batch(rid: str, ids: list[int], read_offset: int, new_ids: list[int], finish: dict | None,
                sampling: SamplingParams, prompt_len: int) -> BatchTokenIDOutput:
    """One scheduler output for one request, as ``output_streamer`` fills it for the detokenizer."""
    return BatchTokenIDOutput(
        rids=[rid], http_worker_ipcs=[None], finished_reasons=[finish], decoded_texts=[""], decode_ids=[ids],
        read_offsets=[read_offset], output_ids=[new_ids], skip_special_tokens=[sampling.skip_special_tokens],
        spaces_between_special_tokens=[sampling.spaces_between_special_tokens],
        no_stop_trim=[sampling.no_stop_trim], prompt_tokens=[prompt_len], reasoning_tokens=[0],
        completion_tokens=[0], cached_tokens=[0], input_token_logprobs_val=None, input_token_logprobs_idx=None,
        output_token_logprobs_val=None, output_token_logprobs_idx=None, input_top_logprobs_val=None,
        input_top_logprobs_idx=None, output_top_logprobs_val=None, output_top_logprobs_idx=None,
        input_token_ids_logprobs_val=None, input_token_ids_logprobs_idx=None, output_token_ids_logprobs_val=None,
        output_token_ids_logprobs_idx=None, output_token_entropy_val=None, output_token_sampling_mask=None,
        output_hidden_states=None, routed_experts=None, indexer_topk=None, placeholder_tokens_idx=None,
        placeholder_tokens_val=None, retraction_counts=[0])


class EngineStandIn:
    """What ``OpenAIServingChat`` reads from its ``tokenizer_manager``; ``generate_request`` replaces the engine.

    ``plan`` is set before each request: ``None`` (prompt only: finish at once with no tokens) or
    ``(completion_ids, finish_reason, chunk_ends)`` where ``chunk_ends`` are the token counts at which the
    scheduler hands output to the detokenizer.
    """

    # The tokenizer manager's own code where it reads only what is set below.
    config_value = TokenizerManager.config_value
    _validate_one_request = TokenizerManager._validate_one_request
    _validate_joint_schema_request = TokenizerManager._validate_joint_schema_request
    _validate_token_ids_logprob = TokenizerManager._validate_token_ids_logprob

    def __init__(self, server_args, tokenizer, detokenizer: DetokenizerManager) -> None:
        obs = get_observability()
        self.server_args = server_args
        self.tokenizer = tokenizer
        self.processor = None
        self.model_config = ModelConfig.from_server_args(server_args)
        self.context_len, self.is_generation = self.model_config.context_len, self.model_config.is_generation
        self.num_reserved_tokens, self.max_req_input_len = compute_num_reserved_tokens(), None
        self.allow_auto_truncate, self.validate_total_tokens = get_serving().allow_auto_truncate, True
        self.model_path = get_model().model_path
        self.served_model_name = get_serving().served_model_name
        self.request_logger = RequestLogger(log_requests=obs.log_requests, log_requests_level=obs.log_requests_level,
                                            log_requests_format=obs.log_requests_format,
                                            log_requests_target=obs.log_requests_target)
        self.detokenizer = detokenizer
        self.plan: tuple | None = None
        self.prompt_ids: list[int] | None = None
        self.prompt_text: str | None = None

    def create_abort_task(self, obj):
        return None

    def sampling_params(self, obj) -> SamplingParams:
        """``TokenizerManager._create_tokenized_object``: the engine's sampling parameters (may raise 400s)."""
        preferred = get_serving().preferred_sampling_params or {}
        params = SamplingParams(**{**preferred, **obj.sampling_params})
        params.normalize(self.tokenizer)
        params.verify(self.model_config.vocab_size)
        return params

    async def generate_request(self, obj, request=None):
        obj.normalize_batch_and_arguments()
        if obj.input_ids is None and self.plan is None and obj.text is not None:
            # kimi_k25 is a multimodal model type: where the serving code cannot reuse the prompt IDs (an empty
            # render, media parts) it hands the engine the rendered text, which SGLang's multimodal processor
            # (the checkpoint's remote processor code, not in the model dir) would tokenize: record the text
            self.prompt_text = obj.text
            return
        if obj.input_ids is None:
            raise RuntimeError("the serving code sent text, not input_ids")
        self._validate_one_request(obj, obj.input_ids)
        sampling = self.sampling_params(obj)
        self.prompt_ids = list(obj.input_ids)
        ids, finish, ends = self.plan or ([], {"type": "length", "length": 0}, [0])
        for out in self.outputs(obj, sampling, ids, finish, ends):
            yield out

    def outputs(self, obj, sampling: SamplingParams, ids: list[int], finish: dict, ends: list[int]):
        """Scheduler -> ``DetokenizerManager`` -> ``TokenizerManager._handle_batch_output`` for one request."""
        prompt = self.prompt_ids
        surr = max(len(prompt) - INIT_INCREMENTAL_DETOKENIZATION_OFFSET, 0)
        stream, incremental = obj.stream, obj.stream and get_serving().incremental_streaming_output
        text, sent = "", 0
        for end in ends:
            done = end == len(ids)
            decode_ids = (prompt[surr:] if sent == 0 else []) + ids[sent:end]
            batch = token_batch(obj.rid, decode_ids, len(prompt) - surr, ids[sent:end], finish if done else None,
                                sampling, len(prompt))
            delta = self.detokenizer.handle_batch_token_id_out(batch).output_strs[0]
            text += delta
            sent = end
            meta = {"id": obj.rid, "finish_reason": finish if done else None, "prompt_tokens": len(prompt),
                    "weight_version": self.config_value("weight_version"), "num_retractions": 0,
                    "reasoning_tokens": 0, "completion_tokens": end, "cached_tokens": 0}
            if done or stream:
                yield {"text": delta if incremental else text, "output_ids": ids[:end], "meta_info": meta}


def chunk_ends(case: dict, stream: bool) -> list[int]:
    """Where the scheduler hands tokens over: seeded 1-4 token chunks (streaming, as ``collect_vllm.py``), or
    every ``SGLANG_FORCE_STREAM_INTERVAL`` tokens and at the end (non-streaming)."""
    n = len(case["completion_ids"])
    if not stream:
        return [k for k in range(DEFAULT_FORCE_STREAM_INTERVAL, n, DEFAULT_FORCE_STREAM_INTERVAL)] + [n]
    rng, ends, pos = random.Random(case["case"]), [], 0
    while pos < n:
        pos = min(pos + rng.randint(1, 4), n)
        ends.append(pos)
    return ends


def finish_of(case: dict) -> dict:
    """The engine's finish reason: ``FINISH_MATCHED_TOKEN(<|im_end|>)`` or ``FINISH_LENGTH``."""
    if case["finish_reason"] == "stop":
        return {"type": "stop", "matched": case["completion_ids"][-1]}
    return {"type": "length", "length": len(case["completion_ids"])}


def one_line(text) -> str:
    return " ".join(str(text).splitlines())[:300]


def parse_request(body: dict) -> ChatCompletionRequest | dict:
    """FastAPI's body validation; errors become 400s as ``http_server``'s ``validation_exception_handler``."""
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        exc = RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in e.errors()])
        exc_str, errors_str = str(exc), str(exc.errors())
        return {"status": 400, "error": one_line(f"{exc_str} {errors_str}" if errors_str != exc_str else exc_str)}


def error_of(response) -> dict:
    body = json.loads(response.body)
    return {"status": response.status_code, "error": one_line(body.get("message"))}


def message_of(msg: dict) -> dict:
    """The fields of an API message the vectors keep (``reasoning`` is SGLang's ``reasoning_content``)."""
    calls = [{"id": c.get("id"), "name": (c.get("function") or {}).get("name"),
              "arguments": (c.get("function") or {}).get("arguments")} for c in msg.get("tool_calls") or []]
    return {"reasoning": msg.get("reasoning_content"), "content": msg.get("content"), "tool_calls": calls}


def sse_chunks(lines: list[str]) -> tuple[list[dict], dict | None]:
    """The JSON chunks of an SSE body, and the first in-stream error."""
    chunks, error = [], None
    for line in "".join(lines).splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[len("data: "):])
        if "error" in chunk and error is None:
            error = {"status": chunk["error"].get("code") or 500, "error": one_line(chunk["error"].get("message"))}
        chunks.append(chunk)
    return chunks, error


def verbatim(status: int, text) -> dict:
    text = str(text)
    out = {"status": status, "error": text[:MAX_ERROR_CHARS]}
    if len(text) > MAX_ERROR_CHARS:
        out["error_chars"] = len(text)
    return out


def parse_request_verbatim(body: dict) -> ChatCompletionRequest | dict:
    """As ``parse_request``, the message kept whole (FastAPI's handler: ``str(exc)``, plus its errors)."""
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        exc = RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in e.errors()])
        exc_str, errors_str = str(exc), str(exc.errors())
        return verbatim(400, f"{exc_str} {errors_str}" if errors_str != exc_str else exc_str)


class Collector:
    """Drives ``OpenAIServingChat.handle_request`` one request at a time (the stand-in holds one plan)."""

    def __init__(self, chat: OpenAIServingChat, engine: EngineStandIn, model: str) -> None:
        self.chat, self.engine, self.model = chat, engine, model

    def body(self, request: dict, spaces: bool | None = None, stream: bool = False) -> dict:
        body = {"model": self.model, **copy.deepcopy(request)}
        if spaces is not None:  # SGLang's chat API reads it from chat_template_kwargs (protocol.to_sampling_params)
            body["chat_template_kwargs"] = {**(body.get("chat_template_kwargs") or {}),
                                            "spaces_between_special_tokens": spaces}
        return {**body, "stream": True} if stream else body

    async def handle(self, body: dict, plan: tuple | None):
        request = parse_request(body)
        if isinstance(request, dict):
            return request
        self.engine.plan, self.engine.prompt_ids = plan, None
        return await self.chat.handle_request(request, None)

    async def render(self, request: dict) -> dict:
        response = await self.handle(self.body(request), None)
        if self.engine.prompt_ids is not None:
            return {"status": 200, "prompt_ids": self.engine.prompt_ids}
        return response if isinstance(response, dict) else error_of(response)

    async def answer(self, case: dict, spaces: bool) -> dict:
        plan = (case["completion_ids"], finish_of(case), chunk_ends(case, False))
        response = await self.handle(self.body(case["request"], spaces), plan)
        if isinstance(response, dict):
            return response
        response = model_json_response(response)
        if response.status_code != 200:
            return error_of(response)
        choice = json.loads(response.body)["choices"][0]
        return {"status": 200, "message": message_of(choice["message"]), "finish_reason": choice["finish_reason"]}

    async def answer_stream(self, case: dict, spaces: bool) -> dict:
        plan = (case["completion_ids"], finish_of(case), chunk_ends(case, True))
        response = await self.handle(self.body(case["request"], spaces, stream=True), plan)
        if isinstance(response, dict):
            return response
        if response.status_code != 200 or not hasattr(response, "body_iterator"):
            return error_of(response)
        chunks, error = sse_chunks([chunk async for chunk in response.body_iterator])
        return error or {"status": 200, **assemble(chunks, "reasoning_content")}

    async def run_case(self, case: dict) -> dict:
        prompt = await self.render(case["request"])
        out = {"case": case["case"], "prompt": prompt}
        if case["kind"] != "answer":
            return out
        answers = {}
        if prompt["status"] == 200:
            for name, spaces in SETTINGS.items():
                answers[name] = await self.answer(case, spaces)
                answers["stream-" + name] = await self.answer_stream(case, spaces)
        out["answers"] = answers
        return out

    async def render_outside(self, row: dict) -> dict:
        """One outside request through ``handle_request``: the prompt IDs, or the refusal verbatim. The body
        goes through JSON text first, as over HTTP (lone surrogates pair up or stay as the server's parser
        leaves them)."""
        request = {k: v for k, v in row["request"].items() if k not in DROPPED_KEYS}
        body = json.loads(json.dumps({**request, "model": self.model}, ensure_ascii=True))
        parsed = parse_request_verbatim(body)
        if isinstance(parsed, dict):
            return {"id": row["id"], **parsed}
        self.engine.plan, self.engine.prompt_ids, self.engine.prompt_text = None, None, None
        try:
            response = await self.chat.handle_request(parsed, None)
        except Exception as e:  # what the HTTP server would answer as a 500
            return {"id": row["id"], "status": 500, "error": f"{type(e).__name__}: {e}"[:MAX_ERROR_CHARS],
                    "uncaught": True}
        if self.engine.prompt_ids is not None:
            return {"id": row["id"], "status": 200, "prompt_ids": self.engine.prompt_ids}
        if self.engine.prompt_text is not None:
            return {"id": row["id"], "status": 200, "prompt_ids": None, "prompt_text": self.engine.prompt_text,
                    "engine_input": "text"}
        if isinstance(response, dict):
            return {"id": row["id"], **response}
        msg = json.loads(response.body)
        return {"id": row["id"], **verbatim(response.status_code, msg.get("message"))}

    async def collect_requests(self, rows: list[dict]) -> list[dict]:
        return [await self.render_outside(row) for row in rows]

    async def collect(self, cases: list[dict]) -> list[dict]:
        return [await self.run_case(case) for case in cases]


def build_collector(model_dir: str) -> Collector:
    server_args = publish_server_args(model_dir)
    engine = EngineStandIn(server_args, load_tokenizer(), build_detokenizer(server_args))
    templates = TemplateManager()
    templates.initialize_templates(tokenizer_manager=engine, model_path=get_model().model_path,
                                   chat_template=get_serving().chat_template,
                                   completion_template=get_serving().completion_template)
    return Collector(OpenAIServingChat(engine, templates), engine, model_dir)


def quiet_logs(log: Path) -> None:
    """From here on SGLang's own logging (refused requests, unparsed tool calls) goes to a file beside the
    vectors (its setup reconfigures the root logger, so this runs after it)."""
    logging.basicConfig(filename=log, filemode="w", level=logging.INFO, force=True,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.captureWarnings(True)
    warnings.simplefilter("default")


def meta_of(setup_s: float, collect_s: float) -> dict:
    return {"server": "sglang", "version": version("sglang"), "transformers": version("transformers"),
            "tokenizers": version("tokenizers"), "tiktoken": version("tiktoken"),
            "command": "in process, as sglang serve MODEL_DIR " + " ".join(SERVE_ARGS)
                       + ": SGLang's OpenAIServingChat.handle_request and DetokenizerManager, engine stand-in",
            "settings": {"default": "no knob: spaces_between_special_tokens=true (SGLang's default)",
                         "nospace": "chat_template_kwargs.spaces_between_special_tokens=false",
                         "stream-*": "streamed, seeded chunks of 1-4 tokens per scheduler output",
                         "non-stream": f"detokenized every {DEFAULT_FORCE_STREAM_INTERVAL} tokens and at the end"},
            "chat_template": "the model dir's chat_template.jinja (K2.5), the tokenizer's own",
            "prompt_ids": "GenerateReqInput.input_ids as OpenAIServingChat hands them to the engine",
            "server_start_s": round(setup_s, 1), "collect_s": round(collect_s, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", required=True)
    p.add_argument("--corpus", help="the kit's seeded corpus (corpus.py): answers and prompts")
    p.add_argument("--requests", help="the outside request corpus (outside_requests.py)")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    if not a.corpus and not a.requests:
        p.error("give --corpus, --requests or both")
    cases = [json.loads(line) for line in Path(a.corpus).read_text(encoding="utf-8").splitlines()] if a.corpus else []
    corpus_lines = read_jsonl(Path(a.requests)) if a.requests else []
    rows = expand_requests(corpus_lines)
    corpus_meta = next((line["meta"] for line in corpus_lines if "meta" in line), {})
    Path(a.out).mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    collector = build_collector(a.model_dir)
    setup_s = time.monotonic() - t0
    quiet_logs(Path(a.out) / ".sglang-inprocess.log")
    t1 = time.monotonic()
    results = asyncio.run(collector.collect(cases)) if cases else []
    collect_s = time.monotonic() - t1
    t2 = time.monotonic()
    outside = asyncio.run(collector.collect_requests(rows)) if rows else []
    requests_s = time.monotonic() - t2
    meta = meta_of(setup_s, collect_s)
    config = json.loads((Path(a.model_dir) / "config.json").read_text(encoding="utf-8"))
    meta["model_type"], meta["architectures"] = config.get("model_type"), config.get("architectures")
    stem = profile_stem("sglang", version("sglang"))
    if cases:
        write_vectors(Path(a.out), stem, cases, results, meta)
        n_ans = sum(1 for c in cases if c["kind"] == "answer")
        print(f"sglang {meta['version']}: {len(cases)} prompts, {n_ans} answer cases x {2 * len(SETTINGS)} "
              f"variants in {meta['collect_s']} s -> {a.out}/{stem}.*", file=sys.stderr)
    if rows:
        rmeta = {**{k: v for k, v in meta.items() if k not in ("settings", "collect_s")},
                 "request_changes": "model set to MODEL_DIR; stream and stream_options removed; the body "
                                    "round-tripped through ASCII JSON text",
                 "max_error_chars": MAX_ERROR_CHARS, "corpus": corpus_meta, "corpus_file": Path(a.requests).name,
                 "render_s": round(requests_s, 1)}
        path = write_request_vectors(Path(a.out), stem, rows, outside, rmeta)
        n_ok = sum(1 for r in outside if r["status"] == 200)
        print(f"sglang {meta['version']}: {len(rows)} outside requests, {n_ok} rendered, {len(rows) - n_ok} "
              f"refused in {rmeta['render_s']} s -> {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
