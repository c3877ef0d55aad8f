"""The completion-parser playground (IDs or raw text in, the API message and its conventions out) and the
static HTML exports that show every widget's snapshot offline."""
from __future__ import annotations

import html
import json
import re
from pathlib import Path

import ipywidgets as W
import nbformat
import pytest

from kimi_eagle.apps.widgets.playground import FLAG_NOTES, CompletionPlayground, flag_note, read_completion
from kimi_eagle.apps.widgets.snapshot import WIDGET_STATE, WIDGET_VIEW, notebook_html, static_notebook
from kimi_eagle.chat import parse
from kimi_eagle.chat.parse import ParseOptions
from kimi_eagle.serving import answer
from kimi_eagle.serving.answer import parse_completion
from kimi_eagle.serving.profiles import PROFILES

CALL = ('<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}'
        "<|tool_call_end|>")
TOOL_TURN = f"I should look it up.</think><|tool_calls_section_begin|>{CALL}<|tool_calls_section_end|><|im_end|>"
CUT_IN_ARGS = 'Checking.</think><|tool_calls_section_begin|><|tool_call_begin|>get_weather:3<|tool_call_argument_begin|>{"city": "Pa'
CHROMIUM = Path("/usr/bin/chromium")


def error_line(pg: CompletionPlayground) -> str:
    """The view when it is an error: exactly one red paragraph, no traceback."""
    view = pg.html.value
    assert pg.parsed is None and pg.by_profile == {}
    assert view.count("<p") == 1 and 'color:#d32f2f' in view and "Traceback" not in view and "\n" not in view
    return re.sub(r"<[^>]+>", "", view)


def profile_row(view: str, name: str) -> str:
    row = re.search(rf"<tr><td><b>{name}</b>.*?</tr>", view)
    assert row, f"the profile table has a row for {name}"
    return row.group(0)


# --------------------------------------------------------------------------------------------
# the playground


def test_raw_text_and_its_ids_give_the_same_message(kimi):
    from_text = CompletionPlayground(kimi, text=TOOL_TURN)
    from_ids = CompletionPlayground(kimi, ids=json.dumps(kimi.encode(TOOL_TURN, allow_special=True)))
    guessed = CompletionPlayground(kimi, ids=TOOL_TURN)  # auto: not a list of numbers, so raw text
    assert (from_text.read_as, from_ids.read_as, guessed.read_as) == ("text", "IDs", "text")
    assert from_text.source_ids == from_ids.source_ids == guessed.source_ids
    assert from_text.parsed.to_dict() == from_ids.parsed.to_dict() == guessed.parsed.to_dict()
    # the text parser, which never sees token IDs, returns the same message: the markers became special tokens
    assert from_text.parsed.message() == parse_completion(TOOL_TURN).message()
    assert "raw text, encoded with specials allowed" in from_text.html.value and "(IDs)" in from_ids.html.value


def test_a_tool_call_completion_shows_its_tool_calls(kimi):
    pg = CompletionPlayground(kimi, text=TOOL_TURN)
    msg = pg.parsed.message()
    assert pg.parsed.finish_reason == "tool_calls" and msg["reasoning"] == "I should look it up." and msg["content"] is None
    assert msg["tool_calls"] == [{"id": "functions.get_weather:0", "type": "function",
                                  "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]
    shown = re.search(r'<pre class="ke-message">(.*?)</pre>', pg.html.value, re.S).group(1)
    assert json.loads(html.unescape(shown)) == {"finish_reason": "tool_calls", **msg}
    assert "<code>&lt;/think&gt;</code> closes the reasoning" in pg.html.value
    assert "tool call <code>functions.get_weather:0</code>: id style <b>kimi</b>" in pg.html.value


def test_a_length_cut_completion_shows_finish_reason_length(kimi):
    pg = CompletionPlayground(kimi, text=CUT_IN_ARGS)
    p = pg.parsed
    assert p.finish_reason == "length" and "truncated_in_tool_call" in p.flags
    assert p.tool_calls[0]["function"]["arguments"] == '{"city": "Pa'  # kept as far as written
    assert "cut by the length limit, finish_reason <b>length</b>" in pg.html.value
    assert f"flag <b>truncated_in_tool_call</b>: {html.escape(FLAG_NOTES['truncated_in_tool_call'])}" in pg.html.value


def test_the_profile_comparison_shows_each_servers_message(kimi):
    pg = CompletionPlayground(kimi, text=CUT_IN_ARGS + '"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>')
    assert set(pg.by_profile) == set(PROFILES)
    for name in PROFILES:  # each row is that server's own answer, parsed independently here
        expected = parse_completion(pg.source_ids, kimi, ParseOptions(serving=name))
        assert pg.by_profile[name].to_dict() == expected.to_dict()
        row = profile_row(pg.html.value, name)
        assert html.escape(json.dumps(expected.tool_calls, ensure_ascii=False)) in row
        assert html.escape(", ".join(expected.flags)) in row
    # SGLang renumbers the id the model wrote (get_weather:3); the others return it as written
    # (rows are named by profile name: vllm and sglang are aliases of vllm-0.33 and sglang-0.5)
    sglang = "sglang-0.5"
    for name in ("sglang-0.5", "sglang-0.5-stream", "sglang-legacy"):
        assert [c["id"] for c in pg.by_profile[name].tool_calls] == ["functions.get_weather:0"]
    vllms = ("template", "moonshot", "vllm-legacy", "vllm-0.33", "vllm-0.33-nospace")
    assert [c["id"] for p in vllms for c in pg.by_profile[p].tool_calls] == ["get_weather:3"] * 5
    assert "tool_id_renumbered" in profile_row(pg.html.value, sglang) and "background:#fff3e0" in profile_row(pg.html.value, sglang)
    # vLLM 0.33's detokenizer puts a space after the prompt's <think>; without it, vLLM answers as the template
    assert pg.by_profile["vllm-0.33"].reasoning == " " + pg.by_profile["template"].reasoning
    assert "same answer: template = moonshot = vllm-0.33-nospace = vllm-legacy" in pg.html.value
    pg.serving.value = sglang  # the message shown is the chosen server's
    assert pg.parsed is pg.by_profile[sglang] and "<b>sglang-0.5</b> returns" in pg.html.value
    # an alias chooses its profile
    assert CompletionPlayground(kimi, text=CUT_IN_ARGS, serving="sglang").serving.value == sglang


def test_servers_drop_a_call_cut_in_its_arguments(kimi):
    pg = CompletionPlayground(kimi, text=CUT_IN_ARGS)
    assert len(pg.by_profile["template"].tool_calls) == 1
    for name in ("vllm-legacy", "sglang-legacy"):
        assert pg.by_profile[name].tool_calls == [] and "dropped_by_server" in pg.by_profile[name].flags
    assert pg.by_profile["vllm-legacy"].finish_reason == "tool_calls"  # a tool section: tool_calls whatever the stop
    assert pg.by_profile["sglang-legacy"].finish_reason == "length"


def test_bad_ids_give_a_one_line_message_not_a_traceback(kimi):
    pg = CompletionPlayground(kimi, ids="1, 2")
    assert pg.parsed is not None
    for bad, reason in [("1.5, 2", "IDs must be integers"), ("[1.5, 2]", "1.5 is not"),
                        ("[5, 999999]", "999999 is outside the vocabulary"), ("-3", "-3 is outside the vocabulary"),
                        ("[1, 2", "not a JSON list")]:
        pg.ids.value = bad
        assert reason in error_line(pg), bad
    pg.mode.value = "IDs"  # forced: words are not IDs
    for bad, reason in [("[true]", "true is not"), ("1, two", "IDs must be integers")]:
        pg.ids.value = bad
        assert reason in error_line(pg), bad
    pg.mode.value = "text"  # the same input as text is a (cut) completion
    assert pg.parsed.finish_reason == "length" and pg.parsed.reasoning == "1, two"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        read_completion(kimi, str(kimi.n_vocab), "IDs")


def test_the_format_decides_where_the_completion_starts(kimi):
    pg = CompletionPlayground(kimi, text="Paris is sunny.<|im_end|>")
    assert pg.parsed.reasoning == "Paris is sunny." and pg.parsed.flags == ["reasoning_not_closed"]
    pg.format.value = "kimi-k2.5-nothink"
    assert pg.parsed.content == "Paris is sunny." and pg.parsed.reasoning is None and pg.parsed.finish_reason == "stop"
    assert "kimi-k2.5-nothink has no reasoning" in pg.html.value


def test_every_flag_the_parser_raises_has_a_note():
    import inspect

    calls = re.findall(r"flags\.append\((.*)\)", inspect.getsource(parse) + inspect.getsource(answer))  # every string each append can add
    raised = {name for call in calls for name in re.findall(r'f?"([a-z0-9_]+)', call)}
    assert {"no_think_end", "reasoning_not_closed", "invalid_utf8", "stray_marker"} <= raised
    assert raised <= set(FLAG_NOTES), f"flags without a note: {sorted(raised - set(FLAG_NOTES))}"
    assert flag_note("stray_marker:<think>") == FLAG_NOTES["stray_marker"]


def test_the_snapshot_is_in_the_mimebundle(kimi):
    pg = CompletionPlayground(kimi, text=TOOL_TURN)
    bundle = pg.widget._repr_mimebundle_()
    assert WIDGET_VIEW in bundle  # a live front end renders the widget
    snapshot = bundle["text/html"]
    assert pg.html.value in snapshot and "static snapshot" in snapshot
    assert f"<p>text: <code>{html.escape(TOOL_TURN)}</code></p>" in snapshot


# --------------------------------------------------------------------------------------------
# static HTML exports


def widget_notebook(kimi) -> nbformat.NotebookNode:
    """A notebook as papermill saves it: a SnapshotBox output (widget view + text/html) and the widget state."""
    pg = CompletionPlayground(kimi, text=TOOL_TURN)
    bundle = pg.widget._repr_mimebundle_()
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("pg.widget")
    cell.outputs = [nbformat.v4.new_output("display_data", data=bundle)]
    nb.cells = [cell]
    nb.metadata["widgets"] = {WIDGET_STATE: W.Widget.get_manager_state(drop_defaults=True)}
    return nb


def test_plain_nbconvert_hides_the_snapshot_behind_a_cdn_widget(kimi):
    """The problem: nbconvert prefers the widget view and loads its renderer from a CDN."""
    from nbconvert import HTMLExporter

    page, _ = HTMLExporter().from_notebook_node(widget_notebook(kimi))
    assert "static snapshot" not in page and f'type="{WIDGET_VIEW}"' in page
    assert re.search(r"https://[^'\"]*(unpkg|jsdelivr)[^'\"]*", page) and "html-manager" in page


def test_the_static_export_shows_the_snapshot_and_needs_no_widget_script(kimi, tmp_path):
    nb = widget_notebook(kimi)
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, str(path))
    page = notebook_html(path)
    assert "static snapshot" in page and "I should look it up." in page and "functions.get_weather:0" in page
    assert WIDGET_VIEW not in page and WIDGET_STATE not in page and "html-manager" not in page
    assert not re.search(r"https://[^'\"]*(unpkg|jsdelivr)", page)


def test_a_widget_without_a_snapshot_keeps_its_view_and_state(kimi):
    nb = widget_notebook(kimi)
    slider = nbformat.v4.new_code_cell("slider")
    slider.outputs = [nbformat.v4.new_output("display_data", data=W.IntSlider()._repr_mimebundle_())]
    nb.cells.append(slider)
    static_notebook(nb)
    assert "text/html" in nb.cells[0].outputs[0].data and WIDGET_VIEW not in nb.cells[0].outputs[0].data
    assert WIDGET_VIEW in nb.cells[1].outputs[0].data and WIDGET_STATE in nb.metadata.widgets


def test_the_batch_renders_its_html_pages_the_same_way(kimi, tmp_path):
    from kimi_eagle.apps.batch.run import render_html

    path = tmp_path / "run.ipynb"
    nbformat.write(widget_notebook(kimi), str(path))
    assert render_html(path).read_text() == notebook_html(path)


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium")
def test_the_exported_page_shows_the_snapshot_in_an_offline_browser(kimi, tmp_path):
    from nbconvert import HTMLExporter
    from playwright.sync_api import sync_playwright

    nb = widget_notebook(kimi)
    (tmp_path / "plain.html").write_text(HTMLExporter().from_notebook_node(nb)[0])
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, str(path))
    (tmp_path / "static.html").write_text(notebook_html(path))
    args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
            "--disable-component-update", "--disable-sync"]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=args)
        try:
            page = browser.new_context().new_page()
            page.route(re.compile(r"^https?://"), lambda route: route.abort())  # offline: every CDN request fails
            seen = {}
            for name in ("plain", "static"):
                page.goto((tmp_path / f"{name}.html").as_uri(), wait_until="load", timeout=30_000)
                text = page.get_by_text("I should look it up.", exact=False)
                seen[name] = text.count() > 0 and text.first.is_visible()
        finally:
            browser.close()
    assert seen == {"plain": False, "static": True}
