"""A packing ``PieceEncoder`` (the file job's, issue #28) gives exactly the list encoder's IDs, spans and flags,
as numpy ``int32`` arrays the Arrow column takes without converting an ID again."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from kimi_eagle.chat.completion import Span
from kimi_eagle.chat.encoder import PieceEncoder
from kimi_eagle.chat.formats import get_format
from kimi_eagle.reconstruct.columns import int_list_array
from kimi_eagle.reconstruct.convert import convert_file
from kimi_eagle.reconstruct.job import reference_table, rows_table
from kimi_eagle.reconstruct.logprobs import prefer_logprob_ids
from kimi_eagle.reconstruct.record import ReconstructOptions, reconstruct_line, reconstruct_record
from kimi_eagle.tokenize.tokenizer import MAX_RUN_CHARS


def as_lists(row: dict) -> dict:
    return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in row.items()}


def api_record(rid: str, content: str, history: list[dict] | None = None, **message) -> dict:
    messages = (history or []) + [{"role": "user", "content": "Go on."}]
    return {"id": rid, "request": {"messages": messages},
            "response": {"choices": [{"message": {"role": "assistant", "content": content, **message},
                                      "finish_reason": "stop"}], "usage": {"completion_tokens": 5}}}


CALL = {"id": "functions.get_weather:0", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
CRAFTED = [  # what a packing encoder must not change
    api_record("plain", "Paris is sunny."),
    api_record("literal marker", "Write <|im_end|> and <|tool_calls_section_begin|> as text."),
    api_record("long run", "a" * (MAX_RUN_CHARS + 7) + " end"),
    api_record("long spaces", " " * (MAX_RUN_CHARS * 2 + 3) + "x"),
    api_record("unicode", "Ünïcödé — 日本語 🙂 \u2028 line"),
    api_record("reasoning", "Done.", reasoning="Let me think about Paris first."),
    api_record("tools", "", reasoning="Need the weather.", tool_calls=[CALL]),
    api_record("empty content", "", reasoning="Only thinking here."),
    # the previous answer in this prompt's history: encoded as a completion first, then as a prompt run
    api_record("history", "Next answer.", history=[{"role": "user", "content": "Hi"},
                                                   {"role": "assistant", "content": "Paris is sunny."}]),
]


@pytest.fixture(scope="module")
def bundled(tmp_path_factory) -> list[dict]:
    folder = tmp_path_factory.mktemp("packed")
    records = []
    for name in ("sharegpt", "glaive"):
        convert_file(name, None, folder / f"{name}.jsonl", limit=150)
        records += [json.loads(line) for line in (folder / f"{name}.jsonl").read_bytes().splitlines()]
    return records


def rows_with(tok, records: list[dict], packed: bool) -> list[dict]:
    fmt, enc = get_format("kimi-k2.5", tok), PieceEncoder(tok, packed=packed)
    return [{**reconstruct_record(r, tok, fmt, encoder=enc).to_dict(), "line": k} for k, r in enumerate(records, 1)]


def test_packed_rows_equal_the_list_encoders_on_the_bundled_and_crafted_records(kimi, bundled):
    records = bundled + CRAFTED + CRAFTED  # twice: the second pass is served from the packed cache
    plain, packed = rows_with(kimi, records, False), rows_with(kimi, records, True)
    assert [as_lists(r) for r in packed] == plain
    assert all(isinstance(r[c], np.ndarray) and r[c].dtype == np.int32
               for r in packed if r["status"] == "ok" for c in ("prompt_ids", "completion_ids"))
    assert {"literal_marker"} <= {f for r in packed for f in r["flags"]}  # the marker case did reach the check


def test_the_file_jobs_table_from_packed_rows_equals_the_reference_from_lists(kimi, bundled):
    records = bundled[:200] + CRAFTED
    got = rows_table(rows_with(kimi, records, True))
    assert got.equals(reference_table(rows_with(kimi, records, False)))


def test_a_tokenizer_without_tiktoken_is_packed_from_its_lists(qwen3):
    """The non-Kimi path (an HF tokenizer): the same IDs, packed from the lists it encodes."""
    pieces = [("<|im_start|>", "special"), ("user\nHello there, Ünïcödé", "text"), ("<|im_end|>", "special")]
    plain, packed = PieceEncoder(qwen3), PieceEncoder(qwen3, packed=True)
    ids, marker = packed.encode_marked(pieces)
    assert (ids.tolist(), marker) == plain.encode_marked(pieces) and ids.dtype == np.int32


def test_bad_lines_give_the_same_error_rows_with_either_encoder(kimi):
    fmt, opts = get_format("kimi-k2.5", kimi), ReconstructOptions()
    lines = [b"{not json", b'{"id": "x"}', json.dumps(CRAFTED[0]).encode(), b'{"id": "s", "request": 1}']
    for packed in (False, True):
        enc = PieceEncoder(kimi, packed=packed)
        got = [as_lists(r) for k, raw in enumerate(lines, 1) for r in reconstruct_line(raw, k, kimi, fmt, opts, enc)]
        if not packed:
            want = got
    assert got == want and [r["status"] for r in got] == ["error", "error", "ok", "error"]


def test_logprob_ids_are_chosen_from_packed_text_ids_as_from_lists(kimi):
    fmt, enc = get_format("kimi-k2.5", kimi), PieceEncoder(kimi, packed=True)
    row = reconstruct_record(CRAFTED[0], kimi, fmt, encoder=enc)
    ids = row.completion_ids.tolist()
    entries = [{"token": kimi.token_bytes(i).decode("utf-8", "replace"), "bytes": list(kimi.token_bytes(i)),
                "logprob": -0.1} for i in ids[:-1]]  # the stop token left out, as servers do
    response = {"choices": [{"logprobs": {"content": entries}}]}
    spans = [Span(**s) for s in row.segments]
    got = prefer_logprob_ids(response, kimi, row.completion_ids, spans)
    assert got[0] == ids and got[2] == "logprobs" and got == prefer_logprob_ids(response, kimi, ids, spans)


def test_the_id_column_takes_int32_arrays_as_they_are_and_converts_anything_else():
    lists = [np.array([1, 2, 3], dtype=np.int32), [4, 5], np.array([6], dtype=np.int64), np.array([], dtype=np.int32)]
    want = pa.array([[1, 2, 3], [4, 5], [6], []], type=pa.list_(pa.int32()))
    assert int_list_array(lists, pa.int32()).equals(want)
    assert int_list_array(lists, pa.int64()).equals(want.cast(pa.list_(pa.int64())))
    with pytest.raises(OverflowError):
        int_list_array([np.array([2**31], dtype=np.int64)], pa.int32())


def test_without_tiktokens_token_buffer_the_public_numpy_call_gives_the_same_bytes(kimi):
    """The packed runs come from tiktoken's token buffer when it has one, else from ``encode_to_numpy``."""
    import copy
    from types import SimpleNamespace

    from kimi_eagle.chat.encoder import _packed_encoder

    texts = ["Paris is sunny.", "Ünïcödé — 日本語 🙂", "<|im_end|> as text", " " * 40 + "x"]
    fast = _packed_encoder(kimi, kimi.encoding.encode_ordinary)
    public_only = copy.copy(kimi)
    public_only._encoding = SimpleNamespace(encode_to_numpy=kimi.encoding.encode_to_numpy, _core_bpe=object())
    slow = _packed_encoder(public_only, kimi.encoding.encode_ordinary)
    for text in texts:
        want = np.array(kimi.encoding.encode_ordinary(text), dtype=np.int32).tobytes()
        assert fast(text) == slow(text) == want, text
