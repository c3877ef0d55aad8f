"""The chat format of each record from its model name: ``--format auto``.

A log of one's own traffic mixes models (Kimi-K2.5 and Kimi-K2-0905 through the same router), and a record
rendered in another model's format is off by hundreds of tokens however well its provider is calibrated. Under
``auto`` each record is rendered in the format of the model its request names (else its response): the table
below, knowledge as data. A record whose model is missing or not in the table is rendered in
:data:`DEFAULT_FORMAT` and its row says so (flag ``format_assumed``), never silently.

>>> format_of_model("moonshotai/kimi-k2-0905"), format_of_model("moonshot.kimi-k2-thinking")
('kimi-k2-instruct', 'kimi-k2-thinking')
>>> format_of_model("tiny-kimi-demo"), format_of_model("gpt-4o") is None
('kimi-k2.5', True)
"""
from __future__ import annotations

from typing import Any

from kimi_eagle.chat.formats import get_format
from kimi_eagle.tokenize.tokenizer import Tokenizer

AUTO = "auto"
DEFAULT_FORMAT = "kimi-k2.5"  # a model name the table does not know: the kit's default format, flagged
ASSUMED_FLAG = "format_assumed"
# model name (without a "vendor/" or Bedrock "moonshot." prefix) -> the kit's chat format
MODEL_FORMATS = {
    "kimi-k2-0905": "kimi-k2-instruct",
    "kimi-k2-instruct-0905": "kimi-k2-instruct",
    "kimi-k2-instruct": "kimi-k2-instruct",
    "kimi-k2-thinking": "kimi-k2-thinking",
    "kimi-k2.5": "kimi-k2.5",
    "kimi-k2.5-0127": "kimi-k2.5",
    "kimi-k2.6": "kimi-k2.5",  # an assumption: the assets hold no K2.6 template; K2.6 answers in K2.5's format
}
# a name beginning so -> its format: the kit's own tiny-kimi, trained on the K2.5 format, is served as tiny-kimi-<name>
MODEL_PREFIX_FORMATS = {"tiny-kimi": "kimi-k2.5"}


def format_of_model(model: Any) -> str | None:
    """The chat format of a model name (:data:`MODEL_FORMATS`; case and a ``:tag`` suffix ignored), None when it
    is not known."""
    if not isinstance(model, str):
        return None
    name = model.rpartition("/")[2].lower().partition(":")[0].removeprefix("moonshot.")
    prefixed = [f for prefix, f in MODEL_PREFIX_FORMATS.items() if name.startswith(prefix)]
    return MODEL_FORMATS.get(name) or (prefixed[0] if prefixed else None)


def record_model(record: Any) -> Any:
    """The model a record names: its request's ``model``, else its response's (None when neither is a string)."""
    for part in ("request", "response"):
        value = record.get(part) if isinstance(record, dict) else None
        model = value.get("model") if isinstance(value, dict) else None
        if isinstance(model, str):
            return model
    return None


class ByModel:
    """The ``auto`` format: not a format itself but the choice of one per record (:meth:`pick`), each built once."""

    name = AUTO

    def __init__(self, tokenizer: Tokenizer | None = None, tool_declaration: str = "json") -> None:
        self.tokenizer, self.tool_declaration = tokenizer, tool_declaration
        self._built: dict[str, Any] = {}

    def format_named(self, name: str) -> Any:
        if name not in self._built:
            self._built[name] = get_format(name, self.tokenizer, self.tool_declaration)
        return self._built[name]

    def pick(self, record: Any) -> tuple[Any, bool]:
        """``(the format of the record's model, whether it was assumed)``: :data:`DEFAULT_FORMAT`, assumed, when the
        record names no model the table knows."""
        name = format_of_model(record_model(record))
        return self.format_named(name or DEFAULT_FORMAT), name is None


def record_format(name: str, tokenizer: Tokenizer | None = None, tool_declaration: str = "json") -> Any:
    """:func:`~kimi_eagle.chat.formats.get_format`, and for ``auto`` the per-record choice (:class:`ByModel`)."""
    return ByModel(tokenizer, tool_declaration) if name == AUTO else get_format(name, tokenizer, tool_declaration)


def pick_format(fmt: Any, record: Any) -> tuple[Any, list[str]]:
    """``fmt`` itself, or under ``auto`` the record's format and ``[ASSUMED_FLAG]`` when it was assumed."""
    if not isinstance(fmt, ByModel):
        return fmt, []
    chosen, assumed = fmt.pick(record)
    return chosen, [ASSUMED_FLAG] * assumed


def format_name_for(format_name: str, model: Any) -> str:
    """The format a record of ``model`` is rendered in under ``format_name`` (itself unless it is ``auto``)."""
    return (format_of_model(model) or DEFAULT_FORMAT) if format_name == AUTO else format_name
