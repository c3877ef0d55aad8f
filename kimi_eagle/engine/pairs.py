"""Ground truth for reconstruction: what the local engine sampled, and what an API would have returned for it.

For every prompt line the engine samples one completion; the pair is

* an **engine record** (:func:`~kimi_eagle.engine.local.engine_record`): the true ``prompt_ids`` and
  ``output_ids``, with the sampling parameters and finish reason;
* an **API record**, the text-only view a chat-completions API gives of the same generation, in the
  shape ``kimi-eagle reconstruct`` reads::

      {"id", "dataset",
       "request": {"model", "messages"},
       "response": {"choices": [{"message": {"role": "assistant", "content": TEXT}, "finish_reason"}]}}

Reconstructing the API records and diffing the result against the engine records measures what the
text loses (e.g. a sampled ``▁the`` ``re`` that the text can only say as ``▁there``).
"""
from __future__ import annotations

from typing import Any, Iterable

from kimi_eagle.engine.local import Engine, Generation, SamplingParams, engine_record

DEFAULT_DATASET = "stories"


def prompt_messages(prompt: dict[str, Any]) -> list[dict[str, Any]]:
    """The chat messages of a prompt line: its ``messages``, or its ``prompt`` text as one user message."""
    if "messages" in prompt:
        return list(prompt["messages"])
    return [{"role": "user", "content": prompt["prompt"]}]


def api_record(record_id: str, engine: Engine, messages: list[dict[str, Any]], gen: Generation,
               dataset: str = DEFAULT_DATASET) -> dict[str, Any]:
    """The API record of ``gen``: the request's messages and the completion as text (EOS not spelled)."""
    return {"id": record_id, "dataset": dataset, "request": {"model": engine.name, "messages": messages},
            "response": {"choices": [{"message": {"role": "assistant", "content": engine.text(gen)},
                                      "finish_reason": gen.finish_reason}]}}


def generate_pairs(engine: Engine, prompts: Iterable[dict[str, Any]],
                   sampling: SamplingParams) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Sample one completion per prompt line; returns ``(engine_records, api_records)``, aligned by index.

    A prompt line is ``{"id", "prompt" | "messages"}`` with optional ``seed`` (default ``sampling.seed``)
    and ``dataset`` (default ``"stories"``); ``sampling`` gives temperature, top-p and max tokens.
    """
    engine_records, api_records = [], []
    for p in prompts:
        messages = prompt_messages(p)
        params = SamplingParams(sampling.temperature, sampling.top_p, p.get("seed", sampling.seed), sampling.max_tokens)
        gen = engine.generate(engine.prompt_ids(messages), params)
        engine_records.append(engine_record(p["id"], gen, engine.name, engine.chat_format))
        api_records.append(api_record(p["id"], engine, messages, gen, p.get("dataset", DEFAULT_DATASET)))
    return engine_records, api_records
