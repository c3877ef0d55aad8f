"""Record verdicts and hunk subclasses on hand-built Kimi completions (real tokenizer, real IDs)."""
from __future__ import annotations

import json

import pytest
from helpers import ARGS, build, split_token, turn

from kimi_eagle.diff.classify import classify


@pytest.fixture
def recon(kimi):
    return build(kimi, turn())


def test_identical_ids_are_exact(kimi, recon):
    ids, segs = recon
    v = classify(kimi, list(ids), ids, segs)
    assert (v.verdict, v.label, v.hunks, v.token_delta) == ("exact", "exact", [], 0)


def test_a_sampled_split_is_bpe_split_with_non_canonical_engine_run(kimi, recon):
    ids, segs = recon
    k = next(i for i, t in enumerate(ids) if kimi.token_bytes(t) == b" weather")
    engine = split_token(kimi, ids, k)
    v = classify(kimi, engine, ids, segs)
    assert (v.verdict, v.label) == ("bpe_split", "bpe_split")
    assert v.token_delta == -1 and v.engine_canonical is False
    [h] = v.hunks
    assert (h.kind, h.segment, h.recon_canonical) == ("split", "reasoning", True)
    assert v.first_divergence == k


def test_a_canonical_engine_against_a_non_canonical_reconstruction(kimi, recon):
    ids, segs = recon
    k = next(i for i, t in enumerate(ids) if kimi.token_bytes(t) == b" weather")
    bad = split_token(kimi, ids, k)
    segs2 = [dict(s, tok_end=s["tok_end"] + 1) if s["kind"] == "reasoning" else s for s in segs]
    v = classify(kimi, ids, bad, segs2)
    assert v.label == "bpe_split" and v.engine_canonical is True and v.token_delta == 1


def test_whitespace_around_tool_args(kimi, recon):
    ids, segs = recon
    engine, _ = build(kimi, turn(args=" " + ARGS + "\n"))
    v = classify(kimi, engine, ids, segs)
    assert v.label == "whitespace"
    assert {h.subclass for h in v.hunks} == {"whitespace"}
    assert all("tool_args" in h.segment for h in v.hunks)


def test_missing_think_end_is_a_special_token_hunk(kimi, recon):
    ids, segs = recon
    engine, _ = build(kimi, turn(think_end=False))
    v = classify(kimi, engine, ids, segs)
    assert v.label == "special_token"
    [h] = v.hunks
    assert h.segment == "think_end" and h.hunk.a_end == h.hunk.a_start and h.hunk.b_end - h.hunk.b_start == 1


def test_rewritten_tool_id(kimi, recon):
    ids, segs = recon
    engine, _ = build(kimi, turn(tool_id="functions.get_weather:3"))
    v = classify(kimi, engine, ids, segs)
    assert v.label == "tool_call_id" and v.hunks[0].segment == "tool_id"


def test_reordered_json_args_parse_equal(kimi, recon):
    ids, segs = recon
    engine, _ = build(kimi, turn(args=json.dumps(dict(reversed(json.loads(ARGS).items())))))
    v = classify(kimi, engine, ids, segs)
    assert v.label == "tool_args_json_equal"


def test_different_json_args_are_other(kimi, recon):
    ids, segs = recon
    engine, _ = build(kimi, turn(args=ARGS.replace("Paris", "Lyon")))
    assert classify(kimi, engine, ids, segs).label == "other"


def test_truncated_reconstruction(kimi):
    engine, _ = build(kimi, turn(tool_id=None, content="Paris is sunny today, about twenty degrees."))
    recon, segs = build(kimi, turn(tool_id=None, content="Paris is sunny tod", im_end=False))
    v = classify(kimi, engine, recon, segs)
    assert v.label == "truncation"
    assert v.hunks[-1].hunk.a_end == len(engine) and v.hunks[-1].hunk.b_end == len(recon)


def test_truncated_engine(kimi):
    recon, segs = build(kimi, turn(tool_id=None, content="Paris is sunny today."))
    engine = recon[:-4]
    assert classify(kimi, engine, recon, segs).label == "truncation"


def test_a_missing_end_of_turn_alone_is_special_token_not_truncation(kimi, recon):
    ids, segs = recon
    assert classify(kimi, ids[:-1], ids, segs).label == "special_token"


def test_partial_utf8_shown_as_replacement_char(kimi):
    partial = kimi.encoding.encode_single_token(b"\xe4")
    engine = kimi.encode("Temperature: ") + [partial] + kimi.encode(" twenty")
    recon, segs = build(kimi, [("content", "Temperature: \ufffd twenty", False)])
    v = classify(kimi, engine, recon, segs)
    assert v.label == "replacement_char"


def test_replaced_content_word_is_other(kimi):
    engine, _ = build(kimi, turn(tool_id=None, content="It is sunny."))
    recon, segs = build(kimi, turn(tool_id=None, content="It is rainy."))
    v = classify(kimi, engine, recon, segs)
    assert (v.verdict, v.label) == ("semantic", "other") and v.hunks[0].segment == "content"


def test_literal_marker_text_against_a_special_token_is_special_token(kimi):
    text = "write <|im_end|> to stop"
    recon, segs = build(kimi, [("content", text, False)])
    engine = kimi.encode(text, allow_special=True)
    v = classify(kimi, engine, recon, segs)
    assert v.label == "special_token" and v.hunks[0].hunk.same_bytes


def test_literal_marker_text_as_ordinary_tokens_on_both_sides_is_exact(kimi):
    recon, segs = build(kimi, [("content", "write <|im_end|> to stop", False)])
    assert classify(kimi, list(recon), recon, segs).label == "exact"


def test_two_kinds_of_edit_make_a_mixed_record(kimi, recon):
    ids, segs = recon
    engine, _ = build(kimi, turn(think_end=False, tool_id="functions.get_weather:9"))
    v = classify(kimi, engine, ids, segs)
    assert v.verdict == "semantic" and v.label == "mixed"
    assert v.subclasses == ["special_token", "tool_call_id"]
