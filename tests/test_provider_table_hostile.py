"""Hostile provider tables and provider names (issues 47/48, with issue 44's evidence rule): duplicate entries, unreal
periods, unbounded counts, control characters and newlines written into the table, files that are no table, the API
key inside a provider or model name. No assets needed."""
import json
import os
import sys

import pytest

from kimi_eagle.serving.calibration import Side, evidence_status, group_key, key_in_data
from kimi_eagle.serving.provider_table import (
    MAX_BYTES,
    REDACTED,
    TableError,
    entry_flags,
    load_table,
    table_entry,
    write_table,
)
from kimi_eagle.serving.variants import Variant, declaration, html_escaped

ENTRY = """[[provider]]
provider = {provider}
model = "m"
period = {period}
status = "explained"
profile = {profile}
conventions = {{}}
records = {records}
prompt = [2, 2]
completion = [2, 2]
held_out_prompt = [1, 1]
held_out_completion = [1, 1]
prompt_residual = "-"
completion_residual = "-"
"""


def _entry(provider='"P"', period='"all"', profile='"template"', records="2"):
    return ENTRY.format(provider=provider, period=period, profile=profile, records=records)


def _refused(tmp_path, text, message):
    path = tmp_path / "t.toml"
    path.write_text(text)
    with pytest.raises(TableError) as caught:
        load_table(path)
    assert message in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


def test_two_entries_for_one_provider_model_and_period_are_refused(tmp_path):
    _refused(tmp_path, _entry() + "\n" + _entry(profile='"moonshot"'), "the same provider, model, period and deployment")
    path = tmp_path / "ok.toml"  # different periods are not duplicates
    path.write_text(_entry(period='"2025-09"') + "\n" + _entry(period='"2025-10..2026-03"', profile='"moonshot"'))
    assert [e.variant.profile for e in load_table(path)] == ["template", "moonshot"]


@pytest.mark.parametrize("period", ['"2025-13"', '"0000-00"', '"2026-03..2025-09"', '"2025-00"', '"9999-01"'])
def test_periods_are_real_months(tmp_path, period):
    _refused(tmp_path, _entry(period=period), "is not all, undated, YYYY-MM")


@pytest.mark.parametrize("records", ["-5", str(10**40), str(10**26)])
def test_counts_are_bounded_non_negative(tmp_path, records):
    _refused(tmp_path, _entry(records=records), "records")
    _refused(tmp_path, _entry().replace("prompt = [2, 2]", f"prompt = [2, {records}]"), "`prompt` is not")


@pytest.mark.parametrize("name", ["Bad\x7fname", "bell\x07", "esc\x1b[31m", "nl\nname", "c1\x85", "quote\"back\\slash"])
def test_a_provider_name_with_control_characters_round_trips(tmp_path, name):
    row = {"provider": name, "model": "m", "period": "all", "status": "thin", "variant": Variant(), "records": 2,
           "in_sample": {k: Side(2, 2, 0, 0, 0) for k in ("prompt", "completion")},
           "held_out": {k: Side(1, 1, 0, 0, 0) for k in ("prompt", "completion")}}
    path = write_table([row], tmp_path / "t.toml", "a log\nwith a newline [[provider]]")
    (entry,) = load_table(path)
    assert entry.provider == name and entry.status == "thin"
    header = [line for line in path.read_text().splitlines() if "Calibrated on" in line]
    assert len(header) == 1 and header[0].startswith("# ") and "\\x0a" in header[0]
    assert all(ord(c) >= 32 or c == "\n" for c in path.read_text())


def test_a_table_file_that_is_no_table_is_one_line(tmp_path):
    _refused(tmp_path, "a = " + "[" * 5000 + "]" * 5000, "")
    if os.path.exists("/dev/zero"):
        with pytest.raises(TableError, match="not a regular file"):
            load_table("/dev/zero")
    with pytest.raises(TableError, match="not a regular file"):
        load_table(tmp_path)
    big = tmp_path / "big.toml"
    big.write_text("# x\n" * (MAX_BYTES // 4 + 10))
    with pytest.raises(TableError, match="byte limit"):
        load_table(big)


def test_the_api_key_never_reaches_the_table_or_stdout(tmp_path, monkeypatch):
    key = "sk-or-v1-" + "a1b2c3d4" * 6
    monkeypatch.setenv("OPENROUTER_API_KEY", key)
    record = {"id": "r", "request": {}, "response": {"provider": f"P {key}", "model": key}}
    assert key_in_data(record) and group_key(record) == (f"P {REDACTED}", REDACTED)
    row = {"provider": f"P {key}", "model": key, "period": "all", "status": "thin", "variant": Variant(), "records": 1,
           "in_sample": {k: Side(1, 1, 0, 0, 0) for k in ("prompt", "completion")},
           "held_out": {k: Side(0, 0, None, None, None) for k in ("prompt", "completion")}}
    text = write_table([row], tmp_path / "t.toml", f"log {key}").read_text()
    assert key not in text and REDACTED in text


def test_the_api_key_in_a_log_is_redacted_on_stdout(tmp_path, monkeypatch, capsys, kimi):
    from kimi_eagle.apps.cli import main

    key = "sk-or-v1-" + "f00d" * 12
    monkeypatch.setenv("OPENROUTER_API_KEY", key)
    rec = {"id": "r1", "format": "kimi-k2.5", "request": {"messages": [{"role": "user", "content": "hi"}]},
           "response": {"provider": f"evil {key}\x1b[2J", "model": "moonshotai/kimi-k2.5", "usage": {
               "prompt_tokens": 5, "completion_tokens": 2}, "choices": [
               {"message": {"role": "assistant", "content": "x"}, "finish_reason": "stop"}]}}
    log = tmp_path / "a.jsonl"
    log.write_text(json.dumps(rec) + "\n")
    table = tmp_path / "out\nnewline.toml"
    assert main(["providers", str(log), "-o", str(table)]) == 0
    out = capsys.readouterr().out
    assert key not in out and "\x1b" not in out and "api_key_in_data" in out
    assert key not in table.read_text() and len(load_table(table)) == 1


def test_the_evidence_rule():
    ok = {k: Side(12, 12, 0, 0, 0) for k in ("prompt", "completion")}
    held = {k: Side(5, 5, 0, 0, 0) for k in ("prompt", "completion")}
    assert evidence_status(ok, held, Variant()) == ("explained", [])
    status, reasons = evidence_status({**ok, "prompt": Side(1, 1, 0, 0, 0)}, held, Variant())
    assert status == "thin" and "prompt rests on 1 record(s) (< 10)" in reasons
    assert evidence_status(ok, held, Variant(prompt_offset=1))[0] == "thin"  # no mechanism named for +1
    assert evidence_status(ok, held, Variant(completion_offset=-1))[0] == "explained"  # eot-not-billed
    assert evidence_status(ok, {**held, "prompt": Side(1, 2, 0, -1, 0)}, Variant())[0] == "thin"
    assert evidence_status({**ok, "prompt": Side(5, 12, 1, 0, 9)}, held, Variant()) == ("unexplained", ["prompt"])


def test_thin_entries_flag_their_rows(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text(_entry().replace('"explained"', '"thin"'))
    entry = table_entry("P", "m", path=path)
    assert entry.status == "thin" and entry_flags(entry) == ["provider_table_thin"]


def test_jinja_tojson_escapes_what_transformers_does_not():
    tools = [{"type": "function", "function": {"name": "f", "description": "<tips> & 'x'"}}]
    text = declaration(tools, "json", "kimi-k2-instruct", "json", escape="html")
    assert "<" not in text and "\\u003ctips\\u003e \\u0026 \\u0027x\\u0027" in text
    assert html_escaped("plain") == "plain" and declaration(tools, "json", "kimi-k2-instruct", "json") == json.dumps(
        tools, ensure_ascii=False)
    if "jinja2" in sys.modules or __import__("importlib").util.find_spec("jinja2"):
        import jinja2  # the mechanism itself: Jinja's own tojson filter (which also sorts keys: schema = sorted)

        from kimi_eagle.serving.variants import SCHEMAS
        assert jinja2.Environment().from_string("{{ t | tojson }}").render(t=tools) == declaration(
            SCHEMAS["sorted"](tools), "json", "kimi-k2-instruct", "json", escape="html")
