"""A small local engine: sample from any HF causal LM and record the token IDs it produced.

The API gives text; validation needs the IDs a real engine sampled. ``Engine.generate`` runs a
plain KV-cached sampling loop (temperature, top-p, seeded ``torch.Generator``) over a
``transformers`` model and returns the prompt IDs, the output IDs (ending with the EOS ID when
one was sampled) and the finish reason. ``engine_record`` turns that into the engine-record
schema of docs/CONTRACTS.md, with the sampling parameters alongside, so a run can be replayed.

Chat formats (how messages become prompt IDs; the names are the reconstruction's, kimi_eagle.chat.formats):

- ``plain``: ``[BOS] + encode(concatenation of the message contents)`` -- a format with no
  template, for base models such as stories260K.
- ``hf-template``: the tokenizer's own Jinja chat template, rendered with the generation prompt
  and encoded with special tokens allowed (``template`` is accepted as an older name for it).
- ``kimi-k2.5``: Kimi-K2.5's native format (messages and tools rendered by the reconstruction's K2.5
  renderer, kimi_eagle.engine.kimi_format); the default for a model directory with a ``kimi_ids.json``
  row map (kimi_eagle.apps.tiny_kimi), which also makes ``<|im_end|>`` the stop token. Such a model
  samples rows; the engine maps them to Kimi IDs, so prompts and outputs are always Kimi IDs.

``kimi-eagle generate PROMPTS.jsonl -o ENGINE.jsonl --model DIR`` (or ``python -m kimi_eagle.engine.local``)
samples every prompt line and writes one engine record per line.

The completion text an engine returns is the bytes of the sampled tokens decoded *in context*
(``completion_text``): a first token ``▁Once`` gives ``" Once"``, leading space kept, as real
engines' incremental detokenizers do; a final EOS contributes nothing.
"""
from __future__ import annotations

import inspect
import secrets
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from kimi_eagle.engine.id_map import MANIFEST_FILE, MANIFEST_KIND, IdMap, IdMapError
from kimi_eagle.tokenize.tokenizer import HFTokenizer, Tokenizer, load_tokenizer, special_id

CHAT_FORMATS = ("plain", "hf-template", "kimi-k2.5")
CHAT_FORMAT_ALIASES = {"template": "hf-template"}  # older names still accepted on input
STOP_TOKEN_TEXTS = ("</s>", "<|endoftext|>", "<|im_end|>")  # stop tokens when the config names no eos


class EngineError(ValueError):
    """A request the engine cannot serve (prompt too long, bad parameters); the message says why."""


class TemplateRefused(EngineError):
    """The model folder's chat template failed or tried something the sandbox forbids (the server's fault, not the client's)."""


def sandboxed_template(source: str) -> Any:
    """``source`` compiled in jinja2's immutable sandbox with the options transformers renders chat templates with
    (``trim_blocks``, ``lstrip_blocks``, ``loopcontrols``, ``raise_exception``, ``tojson``); its ``render`` is
    bounded in steps, time and output size (:mod:`kimi_eagle.chat.template_sandbox`: ``TemplateLimitError``)."""
    from jinja2.exceptions import TemplateError

    from kimi_eagle.chat.template_sandbox import bounded_template

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    return bounded_template(source, raise_exception)


@dataclass(frozen=True)
class SamplingParams:
    """Sampling parameters. ``temperature == 0`` is greedy; ``seed=None`` draws a fresh seed (recorded)."""

    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int | None = None  # None: up to the model's context length

    def validate(self) -> None:
        if not (isinstance(self.temperature, (int, float)) and not isinstance(self.temperature, bool)
                and 0 <= self.temperature <= 100):
            raise EngineError(f"temperature must be a number in [0, 100], got {self.temperature!r}")
        if not (isinstance(self.top_p, (int, float)) and not isinstance(self.top_p, bool) and 0 < self.top_p <= 1):
            raise EngineError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and not (isinstance(self.seed, int) and not isinstance(self.seed, bool)
                                          and 0 <= self.seed < 2**63):
            raise EngineError(f"seed must be an integer in [0, 2**63), got {self.seed!r}"[:200])
        if self.max_tokens is not None and not (isinstance(self.max_tokens, int) and not isinstance(self.max_tokens, bool)
                                                and self.max_tokens >= 1):
            raise EngineError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")


@dataclass
class Generation:
    """One sampled completion: ``output_ids`` ends with an EOS ID iff ``finish_reason == "stop"``."""

    prompt_ids: list[int]
    output_ids: list[int]
    finish_reason: str  # "stop" (EOS sampled) or "length" (max_tokens or the context length reached)
    sampling: SamplingParams
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    # with ``generate(..., logprobs=k)``: per output token, its log-probability and the ``k`` most likely
    # ``(token ID, log-probability)`` pairs, from the model's raw distribution (before temperature and top-p)
    logprobs: list[tuple[float, list[tuple[int, float]]]] | None = None


def plain_prompt_ids(tok: Tokenizer, messages: Sequence[dict], bos_id: int | None) -> list[int]:
    """The ``plain`` chat format: ``[BOS] + encode(concatenated message contents)``."""
    text = "".join(message_text(m) for m in messages)
    return ([bos_id] if bos_id is not None else []) + tok.encode(text)


def message_text(message: dict) -> str:
    """A message's text content (a string, or the ``text`` parts of an OpenAI content list)."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type", "text") == "text")
    raise EngineError(f"message content must be a string or a list of parts, got {type(content).__name__}")


def completion_bytes(tok: Tokenizer, output_ids: Sequence[int], eos_ids: Iterable[int]) -> bytes:
    """The bytes an engine returns for ``output_ids``: every token's bytes, a final EOS excluded."""
    ids = list(output_ids)
    if ids and ids[-1] in set(eos_ids):
        ids = ids[:-1]
    return b"".join(tok.token_bytes(i) for i in ids)


def completion_text(tok: Tokenizer, output_ids: Sequence[int], eos_ids: Iterable[int]) -> str:
    """``completion_bytes`` as UTF-8 (invalid bytes replaced, as engines do for cut-off characters)."""
    return completion_bytes(tok, output_ids, eos_ids).decode("utf-8", errors="replace")


def engine_record(record_id: str, gen: Generation, model: str | None = None, chat_format: str | None = None,
                  **extra: Any) -> dict[str, Any]:
    """An engine record (docs/CONTRACTS.md) with the sampling parameters and finish reason."""
    rec: dict[str, Any] = {"id": record_id, "prompt_ids": gen.prompt_ids, "output_ids": gen.output_ids,
                           "finish_reason": gen.finish_reason, "sampling": asdict(gen.sampling)}
    if model is not None:
        rec["model"] = model
    if chat_format is not None:
        rec["chat_format"] = chat_format
    rec.update(extra)
    return rec


def chat_format_name(name: str) -> str:
    """The chat format's name in the ``plain``/``hf-template`` vocabulary (``template`` -> ``hf-template``)."""
    return CHAT_FORMAT_ALIASES.get(name, name)


def default_model_name(model_dir: str | Path) -> str:
    """``.../stories260K/hf`` -> ``stories260K``; otherwise the directory name. A tiny-kimi directory (its manifest
    says so) whose name does not say tiny-kimi, such as the demo's cache folder ``runs/cache/tiny_kimi/<16 hex
    digits>``, is ``tiny-kimi-<name>``: the name every engine record and answer carries, so that each names the toy
    model it came from (#46: ``diff`` read records of a hex-named tiny-kimi as real data)."""
    from kimi_eagle.data_kinds import TOY, model_kind

    p = Path(model_dir).resolve()
    name = p.parent.name if p.name in {"hf", "model", "checkpoint"} else p.name
    return f"tiny-kimi-{name}" if is_tiny_kimi(p) and model_kind(name) != TOY else name


def is_tiny_kimi(model_dir: str | Path) -> bool:
    """Whether ``model_dir`` holds a tiny-kimi model (its ``manifest.json`` says so: kimi_eagle.apps.tiny_kimi)."""
    import json

    try:
        manifest = json.loads((Path(model_dir) / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("kind") == MANIFEST_KIND


class Engine:
    """An HF causal LM plus its tokenizer, sampling one sequence at a time (thread-safe)."""

    def __init__(self, model: Any, tok: Tokenizer, name: str, chat_format: str | None = None,
                 eos_ids: Sequence[int] = (), bos_id: int | None = None, context_length: int | None = None,
                 id_map: IdMap | None = None) -> None:
        """``id_map``: the model's rows are these token IDs (a tiny model over part of a vocabulary); prompts are
        mapped to rows before the model and sampled rows back to IDs, so callers only ever see token IDs."""
        import torch

        self.torch = torch
        self.model = model
        self.tok = tok
        self.name = name
        self.eos_ids = list(eos_ids)
        self.bos_id = bos_id
        self.context_length = context_length
        self.id_map = id_map
        self.precision = "float32"  # set by from_dir; see kimi_eagle.engine.precision
        template = getattr(tok, "chat_template", None)
        self.chat_format = chat_format_name(chat_format) if chat_format else "hf-template" if template else "plain"
        if self.chat_format not in CHAT_FORMATS:
            raise EngineError(f"unknown chat format {self.chat_format!r}; expected one of {CHAT_FORMATS}")
        if self.chat_format == "hf-template" and not template:
            raise EngineError(f"{name}: the tokenizer has no chat template; use the plain format")
        self._lock = threading.Lock()
        self._compiled_template: Any = None
        self._kimi_renderer: Any = None
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"  # transformers 5.x renamed it

    @classmethod
    def from_dir(cls, model_dir: str | Path, chat_format: str | None = None, name: str | None = None,
                 threads: int | None = None, stop_ids: Sequence[int] | None = None,
                 precision: str = "float32") -> "Engine":
        """Load ``model_dir`` (weights + ``tokenizer.json``) on the CPU in float32, then convert it to ``precision``
        (kimi_eagle.engine.precision: ``float32``, ``bfloat16``, ``float16``, or ``int8`` weight quantization).

        ``stop_ids`` replaces the config's ``eos_token_id`` as the tokens that end a generation. A directory with a
        ``kimi_ids.json`` row map (kimi_eagle.apps.tiny_kimi) is served in ``kimi-k2.5`` with ``<|im_end|>`` as the
        stop unless told otherwise.
        """
        from kimi_eagle.engine.precision import PRECISIONS, apply_precision

        if precision not in PRECISIONS:
            raise EngineError(f"unknown precision {precision!r}; expected one of {PRECISIONS}")
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        model_dir = Path(model_dir)
        if not (model_dir / "config.json").is_file():
            raise EngineError(f"{model_dir}: no config.json (not an HF model directory)")
        if threads:
            torch.set_num_threads(threads)
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        config = AutoConfig.from_pretrained(model_dir)
        model = apply_precision(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval(), precision)
        tok = load_tokenizer(model_dir)
        eos = config.eos_token_id
        id_map = IdMap.load(model_dir) if IdMap.present(model_dir) else None
        if id_map is not None:  # the config's ids are rows: the stop is Kimi's end of turn, the format K2.5
            eos = special_id(tok, "<|im_end|>")
            chat_format = chat_format or "kimi-k2.5"
        eos_ids = list(stop_ids) if stop_ids else [eos] if isinstance(eos, int) else list(eos or [])
        if not eos_ids and isinstance(tok, HFTokenizer):
            eos_ids = [i for i, text in tok.special_text_by_id.items() if text in STOP_TOKEN_TEXTS]
        context = getattr(config, "max_position_embeddings", None)
        engine = cls(model, tok, name or default_model_name(model_dir), chat_format, eos_ids,
                     None if id_map is not None else config.bos_token_id, context, id_map)
        engine.precision = precision
        return engine

    # ---- prompts

    def prompt_ids(self, messages: Sequence[dict], tools: list | None = None) -> list[int]:
        """Render chat ``messages`` (and ``tools``, for the formats that declare them) in this engine's chat format."""
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise EngineError("messages must be a non-empty list of objects")
        if self.chat_format == "plain":
            return plain_prompt_ids(self.tok, messages, self.bos_id)
        if self.chat_format == "kimi-k2.5":
            from kimi_eagle.engine.kimi_format import KimiPromptError, KimiPromptRenderer

            if self._kimi_renderer is None:
                self._kimi_renderer = KimiPromptRenderer(self.tok, getattr(self, "serving", "template"))
            try:
                return self._kimi_renderer.prompt_ids(messages, tools)
            except KimiPromptError as e:
                raise EngineError(str(e)) from None
        import jinja2

        config = getattr(self.tok, "config", {})
        try:
            text = self._template().render(
                messages=messages, add_generation_prompt=True, **({"tools": tools} if tools else {}),
                bos_token=_token_text(config.get("bos_token")), eos_token=_token_text(config.get("eos_token")))
        except (jinja2.TemplateError, ArithmeticError, LookupError, TypeError, ValueError, RecursionError) as e:
            # SecurityError (a TemplateError): the template reached for unsafe attributes or mutated its input;
            # OverflowError: a sandboxed range() too large; the others: a template that fails on these messages
            raise TemplateRefused(f"chat template of {self.name}: {type(e).__name__}: {e}"[:500]) from None
        return self.tok.encode(text, allow_special=True)  # the template's special spellings become their IDs

    def _template(self) -> Any:
        """The tokenizer's chat template compiled once in jinja2's immutable sandbox (a template comes from a
        model folder, i.e. from anyone: attribute access to ``__globals__``, ``__subclasses__`` and the like,
        and mutating the messages, raise ``SecurityError`` instead of running)."""
        if self._compiled_template is None:
            self._compiled_template = sandboxed_template(self.tok.chat_template)
        return self._compiled_template

    def text_prompt_ids(self, prompt: str | list[int]) -> list[int]:
        """A ``/v1/completions`` prompt: a string (BOS prepended) or a list of token IDs as given."""
        if isinstance(prompt, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt):
            if not prompt or not all(0 <= i < self.tok.n_vocab for i in prompt):
                raise EngineError("prompt token IDs must be a non-empty list within the vocabulary")
            return list(prompt)
        if not isinstance(prompt, str):
            raise EngineError("prompt must be a string or a list of token IDs")
        return ([self.bos_id] if self.bos_id is not None else []) + self.tok.encode(prompt)

    # ---- sampling

    def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams, logprobs: int | None = None) -> Generation:
        """Sample one completion. The seed actually used is recorded in ``Generation.sampling``.

        ``logprobs`` (``None``: off; ``k >= 0``): record each sampled token's log-probability and the top ``k``
        alternatives in ``Generation.logprobs`` (the sampling itself is unchanged: same seed, same tokens)."""
        sampling.validate()
        torch = self.torch
        prompt = list(prompt_ids)
        room = (self.context_length - len(prompt)) if self.context_length else None
        if room is not None and room < 1:
            raise EngineError(f"prompt has {len(prompt)} tokens; the context length is {self.context_length}")
        max_new = sampling.max_tokens if sampling.max_tokens is not None else (room or 256)
        if room is not None:
            max_new = min(max_new, room)
        seed = sampling.seed if sampling.seed is not None else secrets.randbits(63)
        used = SamplingParams(sampling.temperature, sampling.top_p, seed, sampling.max_tokens)
        gen = torch.Generator().manual_seed(seed)
        eos = set(self.eos_ids)
        rows = self.id_map
        try:
            model_prompt = rows.to_rows(prompt) if rows is not None else prompt
        except IdMapError as e:
            raise EngineError(f"{self.name}: {e}") from None
        out: list[int] = []
        scores: list[tuple[float, list[tuple[int, float]]]] | None = [] if logprobs is not None else None
        finish = "length"
        start = time.perf_counter()
        with self._lock, torch.inference_mode():
            result = self.model(input_ids=torch.tensor([model_prompt]), use_cache=True)
            while True:
                row = self._sample(result.logits[0, -1], used, gen)
                token = rows.kimi_ids[row] if rows is not None else row
                out.append(token)
                if scores is not None:
                    scores.append(self._logprob_entry(result.logits[0, -1], row, logprobs or 0))
                if token in eos:
                    finish = "stop"
                    break
                if len(out) >= max_new:
                    break
                cache = getattr(result, self._cache_arg, None)
                result = self.model(input_ids=torch.tensor([[row]]), use_cache=True, **{self._cache_arg: cache})
        return Generation(prompt, out, finish, used, time.perf_counter() - start, logprobs=scores)

    def _logprob_entry(self, logits: Any, row: int, k: int) -> tuple[float, list[tuple[int, float]]]:
        """The sampled row's log-probability and the top ``k`` ``(token ID, log-probability)`` pairs."""
        torch = self.torch
        logp = torch.log_softmax(logits.float(), dim=-1)
        to_id = self.id_map.kimi_ids if self.id_map is not None else None
        top: list[tuple[int, float]] = []
        if k > 0:
            values, rows = torch.topk(logp, min(k, logp.shape[-1]))
            top = [(to_id[int(r)] if to_id is not None else int(r), float(v)) for v, r in zip(values, rows)]
        return float(logp[row]), top

    def _sample(self, logits: Any, sp: SamplingParams, gen: Any) -> int:
        torch = self.torch
        logits = logits.float()
        if sp.temperature == 0:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits / sp.temperature, dim=-1)
        if sp.top_p < 1:
            sorted_p, order = torch.sort(probs, descending=True)
            keep = (torch.cumsum(sorted_p, dim=-1) - sorted_p) < sp.top_p  # the smallest nucleus >= top_p
            sorted_p = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
            return int(order[torch.multinomial(sorted_p / sorted_p.sum(), 1, generator=gen)])
        return int(torch.multinomial(probs, 1, generator=gen))

    def text(self, gen: Generation) -> str:
        return completion_text(self.tok, gen.output_ids, self.eos_ids)


def _token_text(value: Any) -> str:
    if isinstance(value, dict):
        return value.get("content", "")
    return value or ""


# ---- command line: kimi-eagle generate PROMPTS.jsonl -o ENGINE.jsonl --model DIR


def generate_records(engine: Engine, prompts: Iterable[dict], sampling: SamplingParams) -> Iterable[dict]:
    """Engine records for prompt lines ``{"id", "messages"}`` or ``{"id", "prompt"}``; bad lines get an ``error``."""
    for i, p in enumerate(prompts):
        rid = str(p.get("id", f"line-{i + 1}")) if isinstance(p, dict) else f"line-{i + 1}"
        try:
            if not isinstance(p, dict):
                raise EngineError("prompt line is not a JSON object")
            ids = (engine.prompt_ids(p["messages"], p.get("tools")) if "messages" in p
                   else engine.text_prompt_ids(p.get("prompt")))
            seed = p.get("seed", None if sampling.seed is None else sampling.seed + i)
            gen = engine.generate(ids, SamplingParams(sampling.temperature, sampling.top_p, seed, sampling.max_tokens))
            yield engine_record(rid, gen, engine.name, engine.chat_format)
        except (EngineError, KeyError) as e:
            yield {"id": rid, "error": str(e)}
