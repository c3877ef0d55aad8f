"""Fuzz: any JSON value in any field of an API record gives exactly one storable row and no exception.

Hypothesis puts random JSON values (lone surrogates, special-token spellings, NaN, huge and negative
integers, deep nesting included) into one or more fields of a valid API record; ``reconstruct_line``
must return one row for it, ``ok`` or ``error`` with a reason, and the rows must be writable as parquet.
"""
from __future__ import annotations

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kimi_eagle.chat.formats import get_format
from kimi_eagle.reconstruct.job import read_rows, write_rows
from kimi_eagle.reconstruct.record import ReconstructOptions, reconstruct_line

BASE = {
    "id": "fuzz", "dataset": "unit",
    "request": {"model": "m",
                "messages": [{"role": "user", "content": "Hi"},
                             {"role": "assistant", "content": None, "reasoning": "r",
                              "tool_calls": [{"id": "functions.f:0", "type": "function",
                                              "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
                             {"role": "tool", "tool_call_id": "functions.f:0", "content": "ok"}],
                "tools": [{"type": "function", "function": {"name": "f", "description": "d",
                                                            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}]},
    "response": {"id": "gen", "provider": "P",
                 "choices": [{"index": 0, "finish_reason": "tool_calls",
                              "message": {"role": "assistant", "content": "c", "reasoning": "think",
                                          "reasoning_details": [{"type": "reasoning.text", "text": "think"}],
                                          "tool_calls": [{"id": "functions.f:1", "type": "function",
                                                          "function": {"name": "f", "arguments": "{\"a\": 2}"}}]}}],
                 "usage": {"completion_tokens": 9, "completion_tokens_details": {"reasoning_tokens": 2}}},
}


def _paths(value, prefix=()):
    """Every path to a field of ``value`` (dict keys and list indexes)."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        yield prefix + (key,)
        yield from _paths(child, prefix + (key,))


PATHS = [()] + list(_paths(BASE))

TEXT = (st.text(alphabet=st.characters() | st.sampled_from(["\ud800", "\udfff", "\x00", "$"]), max_size=12)
        | st.sampled_from(["<|im_end|>", "</think>", "stop", "tool_calls", "length", "{\"a\": NaN}", ""]))
SCALARS = (st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70) | st.floats() | TEXT)
VALUES = st.recursive(SCALARS, lambda c: st.lists(c, max_size=3) | st.dictionaries(TEXT, c, max_size=3), max_leaves=10)
DEEP = st.integers(min_value=95, max_value=1200).map(lambda n: json.loads("[" * n + "]" * n))


def _set(record, path, value):
    if not path:
        return value
    target = record
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return record


@pytest.fixture(scope="module")
def kimi_setup(kimi):
    from kimi_eagle.chat.encoder import PieceEncoder

    return kimi, get_format("kimi-k2.5", kimi), PieceEncoder(kimi)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(changes=st.lists(st.tuples(st.sampled_from(PATHS), VALUES | DEEP), min_size=1, max_size=3))
def test_any_value_in_any_field_gives_one_storable_row(kimi_setup, tmp_path_factory, changes):
    tok, fmt, encoder = kimi_setup
    record = copy.deepcopy(BASE)
    for path, value in changes:
        try:
            record = _set(record, path, value)
        except (KeyError, IndexError, TypeError):  # an earlier change removed the parent: keep the record as it is
            pass
    raw = json.dumps(record).encode()
    rows = reconstruct_line(raw, 7, tok, fmt, ReconstructOptions(), encoder)
    assert len(rows) == 1
    row = rows[0]
    assert row["line"] == 7 and row["status"] in ("ok", "error")
    assert (row["status"] == "error") == bool(row["error"])
    if row["status"] == "ok":
        assert row["completion_ids"] and row["prompt_ids"]
    path = tmp_path_factory.mktemp("fuzz") / "rows.parquet"
    write_rows(rows, path)
    assert read_rows(path).id.tolist() == [row["id"]]
