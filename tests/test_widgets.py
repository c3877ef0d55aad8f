"""Widget logic, headless: set widget values, assert the state and the rendered HTML."""
from __future__ import annotations

import re

import pytest
from helpers import split_token

from kimi_eagle.apps.widgets.inspector import DiffInspector, aligned_html, parse_ids
from kimi_eagle.apps.widgets.playground import TokenizerPlayground
from kimi_eagle.assets import kimi_dir
from kimi_eagle.diff.classify import classify
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
    inspector.prev_button.click()
    assert inspector.hunk_index == n - 1 and current_hunk(inspector.html.value) == n - 1
    inspector.subclass_filter.value = "(all)"


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
    page = aligned_html(kimi, v, 0, context=10)
    assert page.count('class="ke-col"') == 20 + 2  # 10 equal tokens each side of the hunk, plus two elisions
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


def test_parse_ids_accepts_lists_and_separators():
    assert parse_ids("[1, 2, 3]") == parse_ids("1,2 3") == parse_ids(" 1\n2,\t3 ") == [1, 2, 3]
    assert parse_ids("") == []
    with pytest.raises(ValueError):
        parse_ids("[1, 2")
