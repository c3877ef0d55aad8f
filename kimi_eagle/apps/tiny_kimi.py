"""``kimi-eagle tiny-kimi``: a small Llama-style model over Kimi token IDs, trained on CPU in minutes.

Every other engine measurement runs on stories260K: plain text, no reasoning, no tool calls, no Kimi
specials. This model samples *real Kimi IDs* in the K2.5 format, so the whole Kimi path (rendering,
``<think>``/``</think>``, the tool-call section, ``<|im_end|>`` as the stop, the tiktoken vocabulary,
and the non-canonical segmentations and misplaced markers a sampling model emits) is measured on a
real engine.

What :func:`build_tiny_kimi` does, deterministically for a seed:

1. **Data**: the bundled conversations (glaive tool calls, reasoning-with-tools, the first
   ``sharegpt_conversations`` ShareGPT ones, 20 by default) converted to API records and rendered by the kit's K2.5
   renderer; each conversation's last assistant turn (prompt + completion, reasoning and tool calls
   included) is one training document. A conversation that cannot be rendered is counted, with its
   reason, in the manifest.
2. **Vocabulary**: the Kimi IDs that occur in those documents plus every named special token of the
   tokenizer (``<|im_end|>``, ``<think>``, the tool-section markers, ...): the model's rows, in
   ascending Kimi-ID order, saved as the explicit map ``kimi_ids.json`` (kimi_eagle.engine.id_map).
3. **Model**: ``LlamaForCausalLM`` (hidden 128, 4 layers, 4 heads, tied embeddings, 2,048 positions),
   trained with AdamW on windows of the document stream (half of them starting at a document's start).
4. **Saved**: ``config.json`` + ``model.safetensors`` (an HF model directory), ``kimi_ids.json``, the
   Kimi tokenizer files (``tiktoken.model``, ``tokenizer_config.json``, read from the assets) and
   ``manifest.json`` (data SHA-256, code version, steps, seed, final loss, loss curve, sources, wall time).
   :func:`cached_tiny_kimi` keeps built models under ``runs/cache/tiny_kimi/<key>/`` (key: spec + data SHA-256 + code
   version), so `make demo` trains only when one of them changed.

``kimi-eagle serve --model DIR`` / ``generate --model DIR`` then serve it in ``kimi-k2.5`` (see
kimi_eagle.engine.local and docs/tiny_kimi.md). With ``--collect N`` the command also serves the model
and collects ``N`` glaive prompts (with their tools, so the model is asked for tool calls) through the
OpenRouter-shaped API: ``responses.jsonl`` (API records) and ``engine.jsonl`` (the IDs the engine
sampled for exactly those responses), ready for ``reconstruct --format kimi-k2.5`` and ``diff``.
Nothing is downloaded; the weights are built when needed and never committed.
"""
from __future__ import annotations

import hashlib
import json
import math
import sys
import time
from array import array
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kimi_eagle.engine.id_map import ID_MAP_FILE, MANIFEST_FILE, MANIFEST_KIND, IdMap
from kimi_eagle.io import atomic_path, read_jsonl, write_bytes, write_json, write_jsonl, write_text
from kimi_eagle.tokenize.tokenizer import KimiTokenizer, Tokenizer

TOKENIZER_FILES = ("tiktoken.model", "tokenizer_config.json")
SOURCES = ("glaive", "reason-tool-use", "sharegpt")
DEFAULT_STEPS = 150
DEFAULT_SEED = 0
STOP_TEXT = "<|im_end|>"


@dataclass(frozen=True)
class TinyKimiSpec:
    """What to build: data selection, model shape and training settings (all recorded in the manifest)."""

    steps: int = DEFAULT_STEPS
    seed: int = DEFAULT_SEED
    sharegpt_conversations: int = 20  # ShareGPT is large (7,541 turns, 8 M tokens); the first N conversations
    hidden_size: int = 128
    intermediate_size: int = 384
    num_layers: int = 4
    num_heads: int = 4
    max_positions: int = 2048
    seq_len: int = 256
    batch_size: int = 4
    learning_rate: float = 3e-3
    warmup_steps: int = 20
    # one thread: the same weights bit for bit on every machine (the thread count changes float sums), and no OpenMP
    # oversubscription when the demo trains beside its notebooks: 30 steps took 12.5 s on 1 thread, 44.6 s on 2 at load 5
    threads: int = 1

    def validate(self) -> None:
        for name in ("steps", "sharegpt_conversations", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "max_positions", "seq_len", "batch_size", "threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < (0 if name == "sharegpt_conversations" else 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be an integer in [0, 2**63), got {self.seed!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError("hidden_size must be a multiple of num_heads")
        if self.seq_len > self.max_positions:
            raise ValueError("seq_len must not exceed max_positions")


@dataclass
class TrainingData:
    """The training documents (Kimi IDs), where they came from, and what could not be rendered."""

    documents: list[tuple[str, list[int]]]
    sources: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: list[dict[str, str]] = field(default_factory=list)

    @property
    def n_tokens(self) -> int:
        return sum(len(ids) for _, ids in self.documents)

    def sha256(self) -> str:
        """SHA-256 over every document's id and its IDs (int32, little-endian): equal data, equal hash."""
        h = hashlib.sha256()
        for doc_id, ids in self.documents:
            h.update(doc_id.encode("utf-8") + b"\0")
            a = array("i", ids)
            if sys.byteorder != "little":
                a.byteswap()
            h.update(len(ids).to_bytes(8, "little") + a.tobytes())
        return h.hexdigest()


def _conversation(record_id: str) -> str:
    """``glaive:12:5`` -> ``glaive:12`` (the converter's ids are ``SOURCE:CONVERSATION:TURN``)."""
    return record_id.rsplit(":", 1)[0]


def training_data(tok: Tokenizer, sharegpt_conversations: int = 20) -> TrainingData:
    """One document per bundled conversation: its last assistant turn rendered in K2.5 (prompt + completion IDs)."""
    from kimi_eagle.chat.encoder import PieceEncoder
    from kimi_eagle.chat.formats import get_format
    from kimi_eagle.reconstruct.convert import convert
    from kimi_eagle.reconstruct.record import reconstruct_record

    fmt, enc = get_format("kimi-k2.5"), PieceEncoder(tok)
    data = TrainingData([])
    for source in SOURCES:
        last: dict[str, dict] = {}
        for record in convert(source):
            conv = _conversation(str(record.get("id")))
            if conv not in last and source == "sharegpt" and len(last) >= sharegpt_conversations:
                break
            last[conv] = record  # records come turn by turn: the last one holds the whole conversation
        n_docs = n_tokens = 0
        for conv, record in last.items():
            try:
                row = reconstruct_record(record, tok, fmt, encoder=enc)
            except ValueError as e:  # RecordError and the converter's error records
                data.skipped.append({"id": str(record.get("id")), "reason": str(e)[:300]})
                continue
            ids = list(row.prompt_ids) + list(row.completion_ids)
            data.documents.append((conv, ids))
            n_docs, n_tokens = n_docs + 1, n_tokens + len(ids)
        data.sources[source] = {"conversations": len(last), "documents": n_docs, "tokens": n_tokens}
    return data


def format_special_ids(tok: Tokenizer) -> list[int]:
    """Every named special token of the tokenizer (``<|im_end|>``, ``<think>``, tool markers, ...), reserved slots excluded."""
    return sorted(i for i, text in tok.special_text_by_id.items() if not text.startswith("<|reserved_token_"))


def vocabulary(data: TrainingData, tok: Tokenizer) -> IdMap:
    """The model's rows: every Kimi ID in the documents plus every named special, ascending."""
    ids: set[int] = set(format_special_ids(tok))
    for _, doc in data.documents:
        ids.update(doc)
    return IdMap(sorted(ids))


def llama_config(spec: TinyKimiSpec, id_map: IdMap, tok: Tokenizer) -> Any:
    from transformers import LlamaConfig

    stop_row = id_map.row_by_kimi_id[tok.special_id_by_text[STOP_TEXT]]
    return LlamaConfig(vocab_size=len(id_map), hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
                       num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
                       num_key_value_heads=spec.num_heads, max_position_embeddings=spec.max_positions,
                       tie_word_embeddings=True, bos_token_id=None, eos_token_id=stop_row, pad_token_id=None)


def _windows(stream: Any, starts: Any, spec: TinyKimiSpec, gen: Any) -> Any:
    """A batch of ``seq_len + 1`` windows of the row stream; half start at a document's start."""
    import torch

    limit = len(stream) - spec.seq_len - 1
    random_starts = torch.randint(0, limit + 1, (spec.batch_size,), generator=gen)
    doc_starts = starts[torch.randint(0, len(starts), (spec.batch_size,), generator=gen)].clamp(max=limit)
    pick = torch.rand(spec.batch_size, generator=gen) < 0.5
    begin = torch.where(pick, doc_starts, random_starts)
    offsets = torch.arange(spec.seq_len + 1)
    return stream[begin[:, None] + offsets[None, :]]


def train(model: Any, data: TrainingData, id_map: IdMap, spec: TinyKimiSpec,
          progress: bool = False) -> list[float]:
    """Train ``model`` for ``spec.steps`` AdamW steps (linear warm-up, cosine decay); returns the loss of every step."""
    import torch

    rows = [id_map.to_rows(ids) for _, ids in data.documents]
    starts, pos = [], 0
    for r in rows:
        starts.append(pos)
        pos += len(r)
    stream = torch.tensor([t for r in rows for t in r], dtype=torch.long)
    if len(stream) <= spec.seq_len + 1:
        raise ValueError(f"only {len(stream)} training tokens; need more than seq_len + 1 = {spec.seq_len + 1}")
    starts_t = torch.tensor(starts, dtype=torch.long)
    gen = torch.Generator().manual_seed(spec.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate, weight_decay=0.01, betas=(0.9, 0.95))

    def lr_at(step: int) -> float:
        if step < spec.warmup_steps:
            return (step + 1) / spec.warmup_steps
        frac = (step - spec.warmup_steps) / max(1, spec.steps - spec.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    model.train()
    losses: list[float] = []
    began = time.perf_counter()
    for step in range(spec.steps):
        batch = _windows(stream, starts_t, spec, gen)
        out = model(input_ids=batch[:, :-1], labels=batch[:, :-1].clone())  # HF shifts the labels by one
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(out.loss.detach()))
        if progress and (step % 25 == 0 or step == spec.steps - 1):
            print(f"tiny-kimi: step {step + 1}/{spec.steps} loss {losses[-1]:.3f} "
                  f"({time.perf_counter() - began:.0f}s)", file=sys.stderr, flush=True)
    model.eval()
    return losses


def save_model(model: Any, config: Any, out: Path) -> None:
    """``config.json`` and ``model.safetensors`` (tied ``lm_head`` left out, as transformers saves it), atomically."""
    from safetensors.torch import save_file

    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()
             if not (config.tie_word_embeddings and k == "lm_head.weight")}
    with atomic_path(out / "model.safetensors") as tmp:
        save_file(state, str(tmp), metadata={"format": "pt"})
    write_text(out / "config.json", config.to_json_string(use_diff=False))


def read_manifest(model_dir: str | Path) -> dict[str, Any] | None:
    """The manifest of a tiny-kimi directory, or None when there is none (or it is not one)."""
    path = Path(model_dir) / MANIFEST_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("kind") == MANIFEST_KIND else None


def code_version() -> str:
    """What decides the weights besides the spec and the data: this module's source (the model shape, the training
    loop) and the torch and transformers versions, as one SHA-256."""
    import torch
    import transformers

    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(f"\0torch {torch.__version__}\0transformers {transformers.__version__}".encode())
    return h.hexdigest()


def cache_key(spec: TinyKimiSpec, data_sha256: str, code: str) -> str:
    """The cache folder name of a model: 16 hex digits of SHA-256 over its spec, training data hash and code version."""
    blob = json.dumps({"spec": asdict(spec), "data_sha256": data_sha256, "code_version": code}, sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def reusable(out: Path, spec: TinyKimiSpec, data_sha256: str, code: str) -> dict[str, Any] | None:
    """The manifest of the model in ``out`` when it was built from this spec, data and code (every file there), else
    None."""
    old = read_manifest(out)
    if old and old.get("spec") == asdict(spec) and old.get("data_sha256") == data_sha256 \
            and old.get("code_version") == code \
            and all((out / f).is_file() for f in ("config.json", "model.safetensors", ID_MAP_FILE, *TOKENIZER_FILES)):
        return old
    return None


def cached_tiny_kimi(cache_dir: str | Path, spec: TinyKimiSpec = TinyKimiSpec(), tokenizer_dir: str | Path | None = None,
                     progress: bool = False) -> tuple[Path, dict[str, Any], bool]:
    """tiny-kimi from the cache: ``cache_dir/<cache_key>/`` (keyed by spec + training-data SHA-256 + code version),
    built there when it is not yet; returns the model directory, its manifest and whether it was reused."""
    from kimi_eagle.assets import kimi_dir

    spec.validate()
    data = training_data(KimiTokenizer.from_dir(kimi_dir(tokenizer_dir)), spec.sharegpt_conversations)
    code = code_version()
    out = Path(cache_dir) / cache_key(spec, data.sha256(), code)
    old = reusable(out, spec, data.sha256(), code)
    if old is not None:
        return out, old, True
    return out, build_tiny_kimi(out, spec, tokenizer_dir, progress, data=data), False


def build_tiny_kimi(out: str | Path, spec: TinyKimiSpec = TinyKimiSpec(), tokenizer_dir: str | Path | None = None,
                    progress: bool = False, reuse: bool = False, data: TrainingData | None = None) -> dict[str, Any]:
    """Build, train and save tiny-kimi into ``out``; returns the manifest (also ``out/manifest.json``).

    ``reuse``: keep a model already in ``out`` whose manifest has the same spec, data hash and :func:`code_version`.
    ``data``: the training data when the caller already has it (else read here).
    """
    import torch
    from transformers import LlamaForCausalLM

    from kimi_eagle.assets import kimi_dir

    spec.validate()
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out}: the output must be a directory")
    began = time.perf_counter()
    source_dir = kimi_dir(tokenizer_dir)
    tok = KimiTokenizer.from_dir(source_dir)
    data = data if data is not None else training_data(tok, spec.sharegpt_conversations)
    data_hash = data.sha256()
    code = code_version()
    old = reusable(out, spec, data_hash, code) if reuse else None
    if old is not None:
        print(f"tiny-kimi: {out} already holds this model (same spec, data and code); kept", file=sys.stderr)
        return old
    id_map = vocabulary(data, tok)
    threads_before = torch.get_num_threads()
    torch.set_num_threads(spec.threads)
    try:
        torch.manual_seed(spec.seed)
        config = llama_config(spec, id_map, tok)
        model = LlamaForCausalLM(config).float()
        losses = train(model, data, id_map, spec, progress)
    finally:
        torch.set_num_threads(threads_before)
    train_seconds = time.perf_counter() - began
    out.mkdir(parents=True, exist_ok=True)
    save_model(model, config, out)
    id_map.save(out)
    for name in TOKENIZER_FILES:
        write_bytes(out / name, (source_dir / name).read_bytes())
    tail = losses[-min(10, len(losses)):]
    manifest = {
        "kind": MANIFEST_KIND, "spec": asdict(spec), "steps": spec.steps, "seed": spec.seed,
        "data_sha256": data_hash, "n_documents": len(data.documents), "n_training_tokens": data.n_tokens,
        "sources": data.sources, "skipped": data.skipped,
        "n_rows": len(id_map), "n_special_rows": len(format_special_ids(tok)),
        "n_parameters": sum(p.numel() for p in model.parameters()),
        "final_loss": sum(tail) / len(tail), "last_step_loss": losses[-1], "first_step_loss": losses[0],
        "loss_curve": [round(x, 4) for x in losses], "chat_format": "kimi-k2.5", "stop": STOP_TEXT,
        "tokenizer_sha256": hashlib.sha256((source_dir / "tiktoken.model").read_bytes()).hexdigest(),
        "seconds": round(train_seconds, 1), "code_version": code,
    }
    write_json(out / MANIFEST_FILE, manifest)
    return manifest


# ---- the real Kimi-format collection: serve tiny-kimi, collect glaive prompts with their tools


def kimi_prompt_lines(n: int, tok: Tokenizer, max_prompt_tokens: int = 384, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` collect prompt lines ``{id, dataset, messages, tools, seed}`` from the bundled glaive conversations: each
    conversation's first assistant turn whose K2.5 prompt has at most ``max_prompt_tokens`` IDs, conversations in
    order (the request is what the converter recorded, so the model is asked with the conversation's own tools)."""
    from kimi_eagle.engine.kimi_format import KimiPromptRenderer
    from kimi_eagle.reconstruct.convert import convert

    renderer = KimiPromptRenderer(tok)
    lines: list[dict[str, Any]] = []
    seen: set[str] = set()
    for record in convert("glaive"):
        if len(lines) >= n:
            break
        rid = str(record.get("id"))
        conv = _conversation(rid)
        request = record.get("request")
        if conv in seen or record.get("error") or not isinstance(request, dict):
            continue
        try:
            n_prompt = len(renderer.prompt_ids(request.get("messages"), request.get("tools")))
        except ValueError:
            continue
        if n_prompt > max_prompt_tokens:
            continue
        seen.add(conv)
        line = {"id": rid, "dataset": "glaive", "messages": request["messages"], "seed": seed * 1_000_003 + len(lines)}
        if request.get("tools"):
            line["tools"] = request["tools"]
        lines.append(line)
    return lines


def collect_tiny_kimi(model_dir: str | Path, out: str | Path, n: int, max_tokens: int = 128,
                      temperature: float = 1.0, seed: int = 0, max_prompt_tokens: int = 384,
                      concurrency: int = 2, progress: bool = False) -> dict[str, Any]:
    """Serve ``model_dir`` and collect ``n`` glaive prompts through the OpenRouter-shaped API into ``out``.

    Writes ``prompts.jsonl``, ``responses.jsonl`` (collect's API records), ``engine_log.jsonl`` (every engine
    record the server logged) and ``engine.jsonl`` (exactly the engine record of each stored response, paired by
    ``response_id``); returns (and writes as ``collect_summary.json``) the counts and the wall time.
    """
    from kimi_eagle.apps.api.collect import CollectConfig, collect
    from kimi_eagle.apps.api.server import LocalServer
    from kimi_eagle.diff.inputs import delivered_engine_records
    from kimi_eagle.engine.local import default_model_name

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = KimiTokenizer.from_dir(model_dir)
    prompts = write_jsonl(out / "prompts.jsonl", kimi_prompt_lines(n, tok, max_prompt_tokens, seed))
    responses, engine_log = out / "responses.jsonl", out / "engine_log.jsonl"
    for stale in (responses, engine_log):  # a collection is one run: never mix two runs' records
        stale.unlink(missing_ok=True)
    name = default_model_name(model_dir)
    began = time.perf_counter()
    with LocalServer(model_dir, engine_log, "--threads", "1", log=out / "serve.log", start_timeout=120) as server:
        summary = collect(prompts, responses, CollectConfig(
            base_url=server.base_url, model=name, concurrency=concurrency, progress=progress, timeout=600,
            defaults={"temperature": temperature, "max_tokens": max_tokens}), api_key="")
    delivered = delivered_engine_records(engine_log, responses)
    write_jsonl(out / "engine.jsonl", delivered)
    n_prompts = sum(1 for _ in read_jsonl(prompts))
    result = {"prompts": n_prompts, "responses_ok": summary.get("ok", 0), "engine_records": len(delivered),
              "collect": {k: v for k, v in summary.items() if k != "totals"}, "max_tokens": max_tokens,
              "temperature": temperature, "seed": seed, "model": name, "seconds": round(time.perf_counter() - began, 1)}
    write_json(out / "collect_summary.json", result)
    return result


# ---- command line: kimi-eagle tiny-kimi -o DIR [--steps N] [--seed S] [--collect N --collect-dir DIR2]
