"""The engine's side of the Kimi-K2.5 chat format: prompt IDs from chat messages, and the API message from sampled IDs.

A server that answers in the OpenRouter shape must render the request the way Kimi's template does
and parse the raw completion the way SGLang/vLLM's Kimi parsers do. Both already exist in the
reconstruct stage (the K2.5 renderer, ``PieceEncoder``, and ``parse_completion``); this module is the
engine's thin use of them, so the served model and the reconstruction speak exactly one format.

- :meth:`KimiPromptRenderer.prompt_ids`: ``messages`` (+ ``tools``) -> the K2.5 prompt IDs with the generation
  prompt (``<|im_assistant|>assistant<|im_middle|><think>``), specials exactly where the format puts them.
- :func:`kimi_chat_answer`: sampled IDs -> ``(message, finish_reason, reasoning_tokens, flags)``:
  reasoning, content and tool calls with the ids the model wrote, ``finish_reason``
  ``stop``/``tool_calls``/``length``; ``flags`` are the parser's (malformed sections, stray markers).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Sequence

from kimi_eagle.chat.encoder import PieceEncoder
from kimi_eagle.chat.formats import get_format
from kimi_eagle.chat.messages import normalise_messages
from kimi_eagle.chat.parse import SECTION_BEGIN, THINK_END, ParseOptions
from kimi_eagle.records import RecordError
from kimi_eagle.serving.answer import parse_completion
from kimi_eagle.serving.profiles import PROFILES, ServingProfile, get_profile
from kimi_eagle.serving.request import history_call_count, preprocess_request, served_prompt_pieces
from kimi_eagle.tokenize.tokenizer import Tokenizer, special_id

KIMI_CHAT_FORMAT = "kimi-k2.5"
KIMI_STOP_TEXT = "<|im_end|>"


class KimiPromptError(ValueError):
    """Messages or tools the K2.5 renderer cannot render (the message says why)."""


class KimiPromptRenderer:
    """K2.5 prompts for one tokenizer, rendered as ``serving``'s server renders them (its preprocessing and
    tool declaration; :mod:`kimi_eagle.serving.request`); the encoder's run cache is shared by calls (guarded by
    a lock)."""

    def __init__(self, tok: Tokenizer, serving: str | ServingProfile = "template") -> None:
        self.tok = tok
        self.serving = get_profile(serving)
        self.fmt = get_format(KIMI_CHAT_FORMAT, tool_declaration=self.serving.tool_declaration)
        self._encoder = PieceEncoder(tok)
        self._lock = threading.Lock()

    def prompt_ids(self, messages: Any, tools: Any = None) -> list[int]:
        """The K2.5 prompt IDs of ``messages`` and ``tools`` (OpenAI shapes), generation prompt included."""
        try:
            normalised = normalise_messages(messages)
            if tools is not None and not isinstance(tools, list):
                raise RecordError("tools must be a list")
            if self.serving != PROFILES["template"]:
                normalised, tools = preprocess_request(normalised, tools or None, self.serving)
            pieces = served_prompt_pieces(self.fmt.prompt_pieces(normalised, tools or None), self.serving,
                                          self.tok.special_id_by_text)
        except RecordError as e:
            raise KimiPromptError(str(e)) from None
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise KimiPromptError(f"cannot render the prompt: {type(e).__name__}: {e}"[:300]) from None
        with self._lock:
            ids, _literal_marker = self._encoder.encode_marked(pieces)
        return ids


@dataclass
class KimiAnswer:
    """The API view of one sampled Kimi completion."""

    message: dict[str, Any]
    finish_reason: str
    reasoning_tokens: int
    flags: list[str]


def reasoning_token_count(output_ids: Sequence[int], tok: Tokenizer) -> int:
    """IDs before ``</think>`` (or before the tool section when the model went straight to tools; all of them
    when it was cut off in reasoning): the count a Kimi server bills as ``reasoning_tokens``."""
    ends = {special_id(tok, t) for t in (THINK_END, SECTION_BEGIN, KIMI_STOP_TEXT)}
    for k, i in enumerate(output_ids):
        if i in ends:
            return k
    return len(output_ids)


def kimi_chat_answer(output_ids: Sequence[int], tok: Tokenizer, engine_finish_reason: str,
                     serving: str | ServingProfile = "template", messages: Sequence[dict] = ()) -> KimiAnswer:
    """Parse sampled K2.5 IDs (after the ``<think>`` of the generation prompt) into the API answer.

    The parse is :func:`kimi_eagle.serving.answer.parse_completion` as ``serving``'s server parses (``template``:
    whitespace kept, the ids the model wrote, a call never closed keeps its arguments); ``messages``: the
    request's (SGLang numbers ids after their tool calls). An engine ``length`` stop stays ``length`` unless
    the profile reports ``tool_calls`` for any tool section (vLLM); an output ending in ``<|im_end|>`` is
    ``tool_calls`` when a call parsed (or, for vLLM/SGLang, a tool section began), else ``stop``.
    """
    profile = get_profile(serving)
    parsed = parse_completion(list(output_ids), tok, ParseOptions(format_name=KIMI_CHAT_FORMAT, serving=profile,
                                                                  history_tool_calls=history_call_count(list(messages))))
    keep_length = engine_finish_reason == "length" and not (
        profile.finish_on_section == "always" and parsed.finish_reason == "tool_calls")
    finish = "length" if keep_length else parsed.finish_reason
    message = {"role": "assistant", "content": parsed.content, "refusal": None, "reasoning": parsed.reasoning}
    if parsed.tool_calls:
        message["tool_calls"] = parsed.tool_calls
    return KimiAnswer(message, finish, reasoning_token_count(output_ids, tok), list(parsed.flags))
