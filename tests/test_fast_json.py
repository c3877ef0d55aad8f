"""``kimi_eagle.io.loads_exact``: orjson where it gives what ``json.loads`` gives, the standard library everywhere else.

Every check compares with the standard library itself: ``json.loads`` for the value or the error (type and
message), and ``parse_line`` run with orjson refusing everything (so only the standard path runs) for the
lines a JSONL reader yields. Values are compared strictly: types, float signs and spellings, key order.
"""
from __future__ import annotations

import json
import math

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_bad_input import CONVERT, ENGINE, RECONSTRUCT

import kimi_eagle.io as kio
from kimi_eagle.io import MAX_DEPTH, fast_loads, json_depth, loads_checked, loads_exact, parse_line
from kimi_eagle.reconstruct.record import strict_json


def canon(value):
    """``value`` as nested tuples in which equal means identical (bool vs int, -0.0 vs 0.0, key order, NaN)."""
    if isinstance(value, bool) or value is None:
        return ("c", value)
    if isinstance(value, float):
        return ("f", repr(value))
    if isinstance(value, (int, str)):
        return (type(value).__name__, value)
    if isinstance(value, list):
        return ("l", tuple(canon(v) for v in value))
    if isinstance(value, dict):
        return ("d", tuple((k, canon(v)) for k, v in value.items()))
    raise AssertionError(f"unexpected type {type(value)}")


def outcome(parse, *args, **kw):
    try:
        return ("value", canon(parse(*args, **kw)))
    except (ValueError, RecursionError) as e:
        return ("error", type(e).__name__, str(e))


def refuse_all(data):
    raise orjson.JSONDecodeError("refused by the test", "", 0)


def stdlib_parse_line(raw: bytes, lineno: int, monkeypatch) -> list:
    with monkeypatch.context() as m:
        m.setattr(kio.orjson, "loads", refuse_all)
        return parse_line(raw, lineno)


def line_key(lines):
    return [(ln.lineno, ln.error, canon(ln.obj), canon(ln.partial)) for ln in lines]


DEEP = b"[" * 1000 + b"]" * 1000
HOSTILE = [
    b'"\\ud800"', b'{"id": "\\udc00x"}', b'["\\ud83d\\ude00", "\\ud83d"]',  # lone and paired surrogates
    b"NaN", b'{"x": Infinity}', b"[-Infinity]", b"1e400", b"-1e400", b"1e-400", b"-0", b"-0.0", b"0e0",
    str(2**70).encode(), b'{"id": "big", "n": %d}' % 2**64, b'{"n": %d}' % (2**64 - 1), b'{"n": %d}' % -(2**63),
    b'{"n": %d}' % (-(2**63) - 1), b"1" * 5000, b"9007199254740993.0", b"2.2250738585072011e-308",
    b"0.1000000000000000055511151231257827", b"1.00000000000000011102230246251565404236316680908203125",
    b"[" * 101 + b"]" * 101, b"[" * 100 + b"]" * 100, b"[" * 1100 + b"]" * 1100, DEEP, b'{"x": ' + DEEP + b"}",
    b'{"a": 1, "b": 2, "a": 3}', b'{"a": {"z": 1}, "a": [2]}', b"\xef\xbb\xbf{}", b'{"x": "\xef\xbb\xbf"}',
    b'{"x": "\xff"}', b'{"id": "\xc3("}', b"\xed\xa0\x80", b'"\xed\xa0\x80"', b'"\xc0\xaf"', b'"\xf4\x90\x80\x80"',
    b'"\x01"', b'"\x7f"', b'"\\u0000"', b"\x0c{}", b"{}\x0c", b"{} {}", b'{"id": 1}\x1e{"id": 2}', b"[1,]",
    b'{"a":1,}', b"01", b"1.", b".5", b"+1", b"0x10", b"'a'", b"tru", b"true", b"null", b" \t1\r", b"", b"  ",
    b'{"\\u00e9": "\\u00e9", "\xc3\xa9": 1}', "\u2028\u2029".join(['"a"', '"b"']).encode(), b'"\xe2\x80\xa8"',
]
CORPUS = HOSTILE + [raw for _, raw, _ in RECONSTRUCT] + [raw for _, raw, _ in CONVERT] + [raw for _, raw, _, _ in ENGINE]


@pytest.mark.parametrize("k", range(len(CORPUS)))
def test_parse_line_on_hostile_lines_is_the_standard_librarys(k, monkeypatch):
    for raw in [CORPUS[k], *CORPUS[k].split(b"\n")]:  # the corpus's files may hold several lines
        assert line_key(parse_line(raw, 7)) == line_key(stdlib_parse_line(raw, 7, monkeypatch))


@pytest.mark.parametrize("k", range(len(CORPUS)))
def test_loads_exact_on_hostile_text_is_json_loads(k):
    text = CORPUS[k].decode("utf-8", "replace")
    assert outcome(loads_exact, text) == outcome(json.loads, text)
    ok, value = fast_loads(CORPUS[k])
    if ok:  # the fast answer is only ever given for text json.loads reads to the same value, no deeper than MAX_DEPTH
        assert ("value", canon(value)) == outcome(json.loads, CORPUS[k].decode()) and json_depth(value) <= MAX_DEPTH
    assert outcome(loads_checked, text) == outcome(loads_checked_stdlib, text)


def loads_checked_stdlib(text):
    saved = kio.orjson.loads
    kio.orjson.loads = refuse_all
    try:
        return loads_checked(text)
    finally:
        kio.orjson.loads = saved


def test_the_traps_are_really_traps_for_orjson():
    """The cases the fallback exists for: orjson alone would answer differently (if orjson changes, this says so)."""
    assert isinstance(orjson.loads(str(2**64)), float)  # json.loads: an int
    for text in ['"\\ud800"', "NaN", "1e400"]:
        with pytest.raises(orjson.JSONDecodeError):
            orjson.loads(text)
    assert loads_exact(str(2**64)) == 2**64 and isinstance(loads_exact(str(2**64)), int)
    assert loads_exact('"\\ud800"') == "\ud800" and loads_exact('"\ud800"') == "\ud800"  # escaped and raw
    assert fast_loads('"\ud800"'.encode("utf-8", "surrogatepass")) == (False, None)
    assert fast_loads(b"[" * 101 + b"]" * 101) == (False, None) and fast_loads(b"[" * 100 + b"]" * 100)[0]
    assert fast_loads(b'{"a": [1, 2.5, "x"]}') == (True, {"a": [1, 2.5, "x"]})  # the fast path is really taken
    assert math.isnan(loads_exact("NaN")) and loads_exact("1e400") == math.inf


def test_strict_json_still_refuses_constants_and_takes_big_integers():
    assert not strict_json('{"a": NaN}') and not strict_json("[Infinity]") and not strict_json("[1,")
    assert strict_json('{"a": %d}' % 2**70) and strict_json('{"a": "\\ud800"}') and strict_json("{}")
    assert not strict_json("[" * 5000 + "]" * 5000)


# --------------------------------------------------------------------------------------------
# fuzzing: JSON written every way json.dumps writes it, and text that is mostly not JSON

scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**80), max_value=2**80)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
           | st.sampled_from(["\ud800", "\udfff", "\ud83d\ude00", "\u2028", "\x00", "\x7f", "\ufeff"]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=4), inner, max_size=4), max_leaves=25)
FAST = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(values, st.booleans(), st.sampled_from([None, 0, 2]), st.sampled_from([(",", ":"), (", ", ": ")]))
def test_fuzz_dumped_values_parse_as_json_loads(value, ascii_only, indent, separators):
    text = json.dumps(value, ensure_ascii=ascii_only, indent=indent, separators=separators)
    assert outcome(loads_exact, text) == outcome(json.loads, text)
    ok, fast = fast_loads(text.encode("utf-8", "surrogatepass"))
    assert not ok or ("value", canon(fast)) == outcome(json.loads, text)


JSONISH = st.text(alphabet=st.sampled_from(list('{}[]:,"\\ \t\r\n\x0c\x00-+.eE0123456789aflnrstuN\u00e9\ud800\u2028')), max_size=30)


@FAST
@given(JSONISH)
def test_fuzz_jsonish_text_gives_the_same_value_or_error(text):
    assert outcome(loads_exact, text) == outcome(json.loads, text)


@FAST
@given(st.binary(max_size=40) | JSONISH.map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_fuzz_raw_lines_parse_as_the_standard_path(raw):
    with pytest.MonkeyPatch.context() as mp:
        assert line_key(parse_line(raw, 3)) == line_key(stdlib_parse_line(raw, 3, mp))


digits = st.text(alphabet="0123456789", min_size=1, max_size=18)


@settings(max_examples=2000, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False) | st.floats(min_value=-1e-300, max_value=1e-300), st.integers(1, 18))
def test_fuzz_float_spellings_round_like_python(x, precision):
    for text in (repr(x), f"{x:.{precision}g}", f"{x:.{precision}e}", f"[{x:.{precision}f}]"[:40] + "]"):
        assert outcome(loads_exact, text) == outcome(json.loads, text)


@settings(max_examples=2000, deadline=None)
@given(st.sampled_from(["", "-"]), digits, digits, st.integers(-340, 320))
def test_fuzz_decimal_mantissas_round_like_python(sign, whole, frac, exp):
    text = f"{sign}{whole.lstrip('0') or '0'}.{frac}e{exp}"
    assert outcome(loads_exact, text) == outcome(json.loads, text)
