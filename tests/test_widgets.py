"""Widget logic, headless: set widget values, assert the state and the rendered HTML."""
from __future__ import annotations

import html
import re

import pandas as pd
import pytest
from helpers import split_token

from kimi_eagle.apps.widgets.chips import CHIP_CSS, CURRENT, HUNK, PALETTE, PARTIAL, SPECIAL, chip, escaped
from kimi_eagle.apps.widgets.inspector import ALIGNED_CSS, SEMANTIC_BG, SPLIT, DiffInspector, aligned_html, parse_ids
from kimi_eagle.apps.widgets.playground import TokenizerPlayground
from kimi_eagle.assets import kimi_dir
from kimi_eagle.diff.classify import SUBCLASSES, VERDICTS, classify
from kimi_eagle.diff.simulate import load_source_records, run_benchmark, simulate_samples, write_samples


@pytest.fixture(scope="module")
def inspector(kimi, tmp_path_factory):
    out = tmp_path_factory.mktemp("sim")
    write_samples(simulate_samples(load_source_records(["glaive", "reason-tool-use"]), kimi, per_effect=2, seed=11), out)
    run_benchmark(out, kimi_dir())
    return DiffInspector.from_files(kimi, out / "diff", out / "engine.jsonl", out / "reconstructed.parquet")


def current_hunk(page):
    marks = re.findall(r'class="ke-col ke-h[^"]*ke-cur"[^>]*data-hunk="(\d+)"', page)
    assert len(marks) == 1, "exactly one hunk is marked current"
    return int(marks[0])


def test_opens_on_the_first_record_that_is_not_exact(inspector):
    ids = inspector.filtered_ids
    verdicts = inspector.records.set_index("id")["verdict"]
    assert len(ids) == 20 and verdicts[ids[0]] == "exact"  # the benchmark's first record has nothing to show
    assert inspector.current_id == next(i for i in ids if verdicts[i] != "exact")
    assert inspector.record_verdict.hunks and inspector.position.value.startswith("hunk 1/")
    assert "ke-aligned" in inspector.html.value


def test_the_widget_carries_a_static_snapshot_of_its_first_view(inspector, kimi):
    bundle = inspector.widget._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle  # live front ends render the widget
    snapshot = bundle["text/html"]  # static exports (nbconvert, batch HTML) show this instead of nothing
    assert "static snapshot" in snapshot and inspector.html.value in snapshot
    assert f"{len(inspector.filtered_ids)} records" in snapshot and inspector.position.value in snapshot
    pg = TokenizerPlayground(kimi, text="Hello <|im_end|>", ids="1, 2")
    snapshot = pg.widget._repr_mimebundle_()["text/html"]
    assert "<pre>Hello &lt;|im_end|&gt;</pre>" in snapshot and "<code>1, 2</code>" in snapshot and pg.html.value in snapshot


def test_long_hunks_wrap_inside_their_column(kimi):
    from kimi_eagle.apps.widgets.inspector import ALIGNED_CSS

    assert re.search(r"\.ke-col\.ke-h\{[^}]*max-width:100%", ALIGNED_CSS)
    assert re.search(r"\.ke-col\.ke-h \.ke-row\{[^}]*white-space:pre-wrap", ALIGNED_CSS)


def test_filters_narrow_the_record_list(inspector):
    inspector.verdict_filter.value = "semantic"
    assert set(inspector.records.set_index("id").loc[inspector.filtered_ids, "verdict"]) == {"semantic"}
    inspector.subclass_filter.value = "special_token"
    ids = inspector.filtered_ids
    assert len(ids) == 2 and all(i.endswith("#think_end_missing") for i in ids)
    assert inspector.current_id == ids[0]
    assert inspector.record_verdict.label == "special_token"
    page = inspector.html.value
    assert "label <b>special_token</b>" in page and "&lt;/think&gt;" in page
    inspector.dataset.value = "reason-tool-use"
    assert all(i.startswith("reason-tool-use:") for i in inspector.filtered_ids)
    inspector.verdict_filter.value = "exact"  # exact records have no special_token subclass
    assert inspector.filtered_ids == [] and inspector.current_id is None
    assert "no record matches" in inspector.html.value
    inspector.dataset.value = inspector.verdict_filter.value = inspector.subclass_filter.value = "(all)"
    assert len(inspector.filtered_ids) == 20


def test_hunk_navigation_moves_and_wraps(inspector):
    inspector.subclass_filter.value = "tool_args_json_equal"
    rid = next(i for i in inspector.filtered_ids if inspector.record.value and
               (setattr(inspector.record, "value", i) or len(inspector.record_verdict.hunks) > 1))
    n = len(inspector.record_verdict.hunks)
    assert inspector.current_id == rid and inspector.hunk_index == 0
    assert current_hunk(inspector.html.value) == 0
    inspector.next_button.click()
    assert inspector.hunk_index == 1 and current_hunk(inspector.html.value) == 1
    assert f"hunk 2/{n}" in inspector.position.value
    inspector.prev_button.click()
    assert inspector.hunk_index == 0 and current_hunk(inspector.html.value) == 0
    inspector.prev_button.click()  # before the first hunk: the previous listed record with hunks, at its last hunk
    listed = [i for i in inspector.filtered_ids if inspector.records.set_index("id").loc[i, "verdict"] != "exact"]
    assert inspector.current_id == listed[listed.index(rid) - 1]
    m = len(inspector.record_verdict.hunks)
    assert inspector.hunk_index == m - 1 and current_hunk(inspector.html.value) == m - 1
    inspector.next_button.click()  # and back
    assert inspector.current_id == rid and inspector.hunk_index == 0
    inspector.subclass_filter.value = "(all)"


def test_next_hunk_on_a_records_last_hunk_moves_to_the_next_records_first_hunk(inspector):
    """#46: "next hunk ▶" did nothing on a record's last hunk (it wrapped to the same, only hunk). It moves to the
    next listed record with hunks, at its first hunk, and says so before the click; on the only hunk of the only
    record with hunks both buttons are disabled, with a note."""
    verdicts = inspector.records.set_index("id")["verdict"]
    listed = [i for i in inspector.filtered_ids if verdicts[i] != "exact"]
    assert len(listed) > 2
    for here, there in zip(listed, listed[1:]):
        inspector.record.value = here
        n = len(inspector.record_verdict.hunks)
        for _ in range(n - 1):
            inspector.next_button.click()
        assert inspector.current_id == here and inspector.hunk_index == n - 1
        assert "(next ▶ goes to the next record)" in inspector.position.value and not inspector.next_button.disabled
        inspector.next_button.click()
        assert inspector.current_id == there and inspector.hunk_index == 0
        assert current_hunk(inspector.html.value) == 0 and inspector.position.value.startswith("hunk 1/")
    inspector.dataset.value = "glaive"
    inspector.verdict_filter.value = "bpe_split"
    single = [i for i in inspector.filtered_ids if len(classify(inspector.tok, *map(list, inspector.sequences[i][:2]),
                                                               list(inspector.sequences[i][2])).hunks) == 1]
    inspector.dataset.value = inspector.verdict_filter.value = "(all)"
    assert single, "the benchmark has a record with one hunk"
    only = DiffInspector(inspector.tok, inspector.records[inspector.records["id"] == single[0]], inspector.sequences)
    assert only.position.value == "hunk 1/1: " + (only.record_verdict.hunks[0].subclass or only.record_verdict.hunks[0].kind) \
        + " (the only hunk of the listed records)"
    assert only.next_button.disabled and only.prev_button.disabled


def test_exact_records_show_no_hunks(inspector):
    inspector.verdict_filter.value = "exact"
    assert inspector.record_verdict.hunks == [] and inspector.position.value == "no hunks"
    assert inspector.next_button.disabled
    inspector.next_button.click()
    assert inspector.hunk_index is None
    inspector.verdict_filter.value = "(all)"


def test_long_equal_runs_are_elided_around_hunks(kimi):
    ids = kimi.encode("word " * 300)
    k = 150
    v = classify(kimi, split_token(kimi, ids, k) or ids, ids)
    assert len(v.hunks) == 1
    for window in (False, True):  # one hunk: its window is the context around it
        page = aligned_html(kimi, v, 0, context=10, window=window)
        assert page.count('class="ke-col"') == 20  # 10 equal tokens each side of the hunk
        assert page.count('class="ke-col ke-gap"') == 2  # and the two elisions, counted
        assert f"…{k - 10} equal…" in page and f"…{len(ids) - k - 1 - 10} equal…" in page
    assert aligned_html(kimi, v, 0, context=-1).count('class="ke-col"') == len(ids) - 1


def test_playground_encodes_and_compares_pasted_ids(kimi):
    pg = TokenizerPlayground(kimi, text="Hello weather <|im_end|>")
    assert pg.encoded[-1] == 163586 and "ke-special" in pg.html.value
    pg.allow_special.value = False
    assert 163586 not in pg.encoded
    pg.allow_special.value = True
    k = next(i for i, t in enumerate(pg.encoded) if kimi.token_bytes(t) == b" weather")
    pg.ids.value = ", ".join(map(str, split_token(kimi, pg.encoded, k)))
    assert pg.record_verdict.verdict == "bpe_split" and "<b>bpe_split</b>" in pg.html.value
    pg.ids.value = str(pg.encoded)
    assert pg.record_verdict.verdict == "exact"
    assert "top row: pasted IDs · bottom row: the text&#x27;s encoding" in pg.html.value
    assert "engine IDs" not in pg.html.value
    pg.ids.value = "1, two, 3"
    assert pg.record_verdict is None and ">IDs must be integers" in pg.html.value
    assert "IDs: IDs" not in pg.html.value  # the reason is said once, without a repeated prefix
    pg.ids.value = "[5, 999999]"
    assert pg.record_verdict is None and "pasted IDs: position 1: 999999 is outside" in pg.html.value


def test_new_text_is_never_compared_with_the_previous_samples_ids(kimi):
    """#35: the notebook seeds the playground with a sample and its IDs; typing new text compared it against the
    sample's IDs. They belong to the sample: editing the text clears them and says so; IDs pasted for the new text
    are compared, and a later edit keeps them (the user pasted them on purpose)."""
    sample = "Hello weather"
    pg = TokenizerPlayground(kimi, text=sample, ids=str(kimi.encode(sample)))
    assert pg.record_verdict.verdict == "exact"
    pg.text.value = "A different sentence altogether."
    assert pg.record_verdict is None and pg.ids.value == ""
    assert "the sample&#x27;s IDs were cleared" in pg.html.value or "the sample's IDs were cleared" in pg.html.value
    pg.ids.value = str(kimi.encode("A different sentence altogether."))
    assert pg.record_verdict.verdict == "exact" and "were cleared" not in pg.html.value
    pg.text.value = "A different sentence altogether!"
    assert pg.ids.value and pg.record_verdict is not None and pg.record_verdict.verdict != "exact"
    pg.load("Rain today", str(kimi.encode("Rain today")))
    assert pg.text.value == "Rain today" and pg.record_verdict.verdict == "exact"


def test_parse_ids_accepts_lists_and_separators():
    assert parse_ids("[1, 2, 3]") == parse_ids("1,2 3") == parse_ids(" 1\n2,\t3 ") == [1, 2, 3]
    assert parse_ids("") == []
    with pytest.raises(ValueError):
        parse_ids("[1, 2")


# --------------------------------------------------------------------------------------------
# colours, legend, tooltips, filters, the window around the current hunk


def far_hunks_inspector(tok, n_hunks: int = 10, gap: int = 60) -> DiffInspector:
    """An inspector over one record whose ``n_hunks`` hunks lie about ``gap`` tokens apart, alternately a
    split (same bytes) and a changed token (bytes differ). Used by tests/test_browser.py too."""
    recon = tok.encode("The quick brown fox jumps over the lazy dog. " * (n_hunks * gap // 10 + 10))
    engine, cat = list(recon), tok.encode(" cat")
    for n in reversed(range(n_hunks)):  # from the end, so the earlier positions stay put
        p = 20 + n * gap
        while len(tok.token_bytes(engine[p])) < 2 or engine[p] == cat[0]:
            p += 1
        engine = split_token(tok, engine, p) if n % 2 == 0 else engine[:p] + cat + engine[p + 1:]
    v = classify(tok, engine, recon)
    records = pd.DataFrame([{"id": "far-apart", "dataset": "synthetic", "status": "ok", "verdict": v.verdict,
                             "label": v.label, "subclasses": list(v.subclasses)}])
    return DiffInspector(tok, records, {"far-apart": (engine, recon, [])})


def css_rules(css: str) -> list[tuple[str, dict[str, str]]]:
    """``(selector, {property: value})`` for each rule of the ``<style>`` blocks in ``css``, in order."""
    css = re.sub(r"</?style>", "", css)
    return [(sel.strip(), dict(d.split(":", 1) for d in body.split(";") if ":" in d))
            for sel, body in re.findall(r"([^{}]+)\{([^}]*)\}", css)]


def computed(css: str, classes: set[str]) -> dict[str, str]:
    """The declarations that apply to an element with ``classes`` (compound class selectors only; the more
    classes a selector names, the later it applies; then the later rule; shorthands as written)."""
    matching = [(sel.count("."), k, body) for k, (sel, body) in enumerate(css_rules(css))
                if " " not in sel and set(sel.split(".")[1:]) <= classes]
    out: dict[str, str] = {}
    for _, _, body in sorted(matching):
        for prop, value in body.items():
            colour = re.findall(r"#[0-9a-f]{3,6}\b", value)
            if prop in ("border", "outline") and colour:  # shorthand: its colour is the longhand's
                out[f"{prop}-color"] = colour[0]
            out[prop] = value.replace("!important", "")
    return out


def current_classes(page: str) -> set[str]:
    return set(re.search(r'class="([^"]*ke-cur[^"]*)"', page).group(1).split())


def legend_swatches(page: str) -> dict[str, str]:
    """The legend's entries: key -> the inline styles of its swatches."""
    legend = re.search(r'<div class="ke-legend">.*?</div>', page, re.S).group(0)
    entries = (chunk.split('"', 1) for chunk in legend.split('data-legend="')[1:])
    return {key: " ".join(re.findall(r'class="ke-swatch" style="([^"]*)"', rest)) for key, rest in entries}


def colours(text: str) -> set[str]:
    return set(re.findall(r"#[0-9a-f]{3,6}\b", text))


def test_current_hunk_is_orange_whatever_its_kind(kimi):
    far = far_hunks_inspector(kimi, n_hunks=4)
    kinds = [h.kind for h in far.record_verdict.hunks]
    assert kinds == ["split", "semantic", "split", "semantic"]
    css = CHIP_CSS + ALIGNED_CSS
    for n in range(4):
        page = aligned_html(kimi, far.record_verdict, n)
        classes = current_classes(page)
        assert re.findall(r'class="[^"]*ke-cur[^"]*"[^>]*data-hunk="(\d+)"', page) == [str(n)]
        style = computed(css, classes)
        assert style["outline-color"] == CURRENT, f"current {kinds[n]} hunk outlined {style.get('outline-color')}"
        assert style["border-color"] == (SPLIT[0] if kinds[n] == "split" else HUNK)  # its kind stays visible
        others = re.findall(r'class="(ke-col ke-h[^"]*)"', page)
        assert len(others) == 4 and all("outline-color" not in computed(css, set(c.split())) for c in others
                                        if "ke-cur" not in c)


def test_legend_names_every_colour_drawn(kimi):
    ids = kimi.encode("Hello weather <|im_end|>", allow_special=True)
    partial = kimi.encoding.encode_single_token(b"\xe6")
    v = classify(kimi, [partial, *split_token(kimi, ids, 1)] + kimi.encode(" cat"), [partial, *ids] + kimi.encode(" dog"))
    assert [h.kind for h in v.hunks] == ["split", "semantic"]
    page = aligned_html(kimi, v, 1)
    assert "ke-partial" in page and "ke-special" in page
    legend = re.search(r'<div class="ke-legend">.*?</div>', page, re.S).group(0)
    drawn_css = [(sel, body) for sel, body in css_rules(page) if sel != ".ke-legend"]
    inline = re.sub(r"<style>.*?</style>", "", page.replace(legend, ""), flags=re.S)
    drawn = colours(" ".join(v for _, body in drawn_css for v in body.values())) | colours(inline)
    swatches = legend_swatches(page)
    shown = colours(" ".join(swatches.values()))
    assert drawn == shown, f"drawn but not in the legend: {drawn - shown}; in the legend only: {shown - drawn}"
    css = CHIP_CSS + ALIGNED_CSS
    assert CURRENT in swatches["current"] and computed(css, current_classes(page))["outline-color"] == CURRENT
    assert f"{HUNK};background:{SEMANTIC_BG}" in swatches["semantic"]
    assert computed(css, {"ke-col", "ke-h"})["border-color"] == HUNK
    assert computed(css, {"ke-col", "ke-h"})["background"] == SEMANTIC_BG
    assert f"{SPLIT[0]};background:{SPLIT[1]}" in swatches["split"]
    assert computed(css, {"ke-col", "ke-h", "ke-split"})["border-color"] == SPLIT[0]
    assert computed(css, {"ke-chip", "ke-partial"})["border-color"] == PARTIAL and PARTIAL in swatches["partial"]
    assert computed(css, {"ke-chip", "ke-special"})["background"] == SPECIAL[0] and SPECIAL[0] in swatches["special"]
    assert all(c in legend for c in PALETTE)
    assert "current hunk" in legend and "same bytes, other split" in legend and "bytes or specials differ" in legend


def titles(page: str) -> dict[int, str]:
    return {int(i): html.unescape(t) for t, i in re.findall(r'title="([^"]*)" data-id="(\d+)"', page)}


def test_tooltip_shows_text_and_bytes(kimi):
    tok_ids = kimi.encode("a\n\tb  c<|im_end|>", allow_special=True)
    partial = kimi.encoding.encode_single_token(b"\xe6")
    got = titles("".join(chip(kimi, t, k) for k, t in enumerate([*tok_ids, partial])))
    for k, t in enumerate([*tok_ids, partial]):
        b = kimi.token_bytes(t)
        lines = got[t].split("\n")
        assert len(lines) == 3 and lines[0].startswith(f"#{k} · id {t}") and lines[2] == f"bytes {b.hex(' ')}"
        text = b.decode("utf-8", errors="replace")
        assert lines[1].startswith(f"text “{escaped(text)}”")
        assert not re.search(r"[ \t\r\n]", lines[1][5:].split("”")[0])  # whitespace is made visible
    newline, tab_b, space = (next(t for t in tok_ids if kimi.token_bytes(t) == b) for b in (b"\n", b"\tb", b" "))
    assert "text “\\n”" in got[newline] and "text “\\tb”" in got[tab_b] and "text “␣”" in got[space]
    assert got[tok_ids[-1]].splitlines()[0].endswith("(special token)") and "text “<|im_end|>”" in got[tok_ids[-1]]
    assert got[partial].splitlines()[1] == "text “\ufffd” (partial UTF-8)" and got[partial].endswith("bytes e6")
    assert escaped("a b\n\t\r\\\u200b\xa0\x7f") == "a␣b\\n\\t\\r\\\\\\u200b\\xa0\\x7f"


def test_verdict_and_subclass_filters_combine(inspector):
    r = inspector.records
    has = lambda s: r["subclasses"].map(lambda x: s in list(x))  # noqa: E731
    for dataset in ("(all)", "glaive"):
        inspector.dataset.value = dataset
        in_dataset = r["dataset"] == dataset if dataset != "(all)" else r["dataset"].notna()
        for verdict in VERDICTS:
            inspector.verdict_filter.value = verdict
            rows = r[in_dataset & (r["verdict"] == verdict)]
            present = [s for s in SUBCLASSES if any(s in list(x) for x in rows["subclasses"])]
            # the subclass filter offers what is found under this dataset and verdict, with counts
            assert inspector.subclass_filter.options == (
                (f"all ({len(rows)})", "(all)"), *((f"{s} ({int(has(s)[rows.index].sum())})", s) for s in present))
            for sub in ["(all)", *present]:
                inspector.subclass_filter.value = sub
                expected = rows[has(sub)[rows.index]] if sub != "(all)" else rows
                assert [value for _, value in inspector.record.options] == expected["id"].tolist()
                assert inspector.current_id in expected["id"].tolist()  # never a stale record from before
                assert inspector.record_verdict.verdict == verdict
                assert sub == "(all)" or sub in inspector.record_verdict.subclasses
                assert f"<b>{html.escape(inspector.current_id)}</b>" in inspector.html.value
            inspector.subclass_filter.value = "(all)"
    # a subclass chosen first stays chosen (count 0) when a verdict without it is chosen: nothing matches
    inspector.dataset.value = "(all)"
    inspector.verdict_filter.value = "(all)"
    inspector.subclass_filter.value = "whitespace"
    assert ("bpe_split (0)", "bpe_split") in inspector.verdict_filter.options
    inspector.verdict_filter.value = "bpe_split"
    assert inspector.filtered_ids == [] and inspector.record.options == () and inspector.current_id is None
    assert ("whitespace (0)", "whitespace") in inspector.subclass_filter.options
    assert "no record matches the filters: verdict <b>bpe_split</b> and subclass <b>whitespace</b>" in inspector.html.value
    inspector.verdict_filter.value = inspector.subclass_filter.value = "(all)"
    assert len(inspector.filtered_ids) == 20 and inspector.subclass_filter.options[0] == ("all (20)", "(all)")


def test_next_hunk_brings_the_current_hunk_to_the_top_of_the_view(kimi):
    far = far_hunks_inspector(kimi)
    n = len(far.record_verdict.hunks)
    assert n == 10 and far.context.value == 40
    for k in range(n + 1):
        page = far.html.value
        assert far.hunk_index == k % n and current_hunk(page) == k % n
        view = page[page.index('<div class="ke-aligned">'):]
        before = view[:view.index("ke-cur")]
        # before the current hunk, whatever hunk it is: at most the context, one elision and the hunks it holds
        assert before.count('<div class="ke-col">') <= far.context.value
        assert before.count('<div class="ke-col ke-gap">') <= 1 and before.count('<div class="ke-col ke-h') <= 1
        assert page.index('<div class="ke-aligned">') < page.index('<table class="ke-meta">')  # the table after
        hidden_before = re.findall(r"…\d+ equal and hunks? (\d+)(?:–(\d+))?…", before)
        assert (k % n == 0 and not hidden_before) or hidden_before[0] in ((str(k % n), ""), ("1", str(k % n)))
        far.next_button.click()
    far.context.value = 200  # a wider window shows the neighbouring hunks too
    assert far.html.value.count('class="ke-col ke-h') >= 5


def test_pasted_ids_are_never_coerced():
    for bad in ("[1.5]", "[true]", "[1, \"2\"]", "1.5", "{\"a\": 1}"):
        with pytest.raises(ValueError):
            parse_ids(bad)
