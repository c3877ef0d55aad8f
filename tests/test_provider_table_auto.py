"""``reconstruct --serving auto`` reads the provider table (issue 34): a record whose provider, model and month have an
explained entry is rendered with that entry's variant and profile; an unexplained entry is named, with its residual,
and its records are rendered with its best variant and flagged on each side it leaves unexplained, unless that variant
made no count equal (then they go to their group's own evidence); the evidence of a group is every billed record (or
a stated uniform sample). The recorded exchanges are read in place from the assets; tests that need them skip without them."""
import json
from collections import Counter

import pyarrow.parquet as pq
import pytest

from kimi_eagle.apps.cli import main
from kimi_eagle.chat.formats import get_format
from kimi_eagle.reconstruct.record import ReconstructOptions, reconstruct_record
from kimi_eagle.reconstruct.recorded import AGENT_DATASET, corpus_records, exchange_record
from kimi_eagle.serving.auto import choose_profiles, describe, sample_groups
from kimi_eagle.serving.calibration import billed
from kimi_eagle.serving.provider_table import TABLE_PATH, load_table, record_entry
from kimi_eagle.serving.variants import history_calls


@pytest.fixture(scope="module")
def records(exchanges):  # conftest.py: the recorded real exchanges
    return [r for r in (exchange_record(ex) for ex in exchanges) if "error" not in r]


@pytest.fixture(scope="module")
def both_corpora(records):
    """Every record the shipped table was calibrated on: the toy-tool exchanges and the agent traces."""
    return records + [r for r in corpus_records(AGENT_DATASET)[1] if "error" not in r]


def _prompt_offset(record, variant):
    """The count offsets of a variant: billed prompt = reconstructed prompt IDs + these (they are not tokens)."""
    request = record["request"]
    return (variant.prompt_offset + (variant.tool_turn_offset if request.get("tools") else 0)
            + variant.history_call_offset * history_calls(request.get("messages")))


def test_every_explained_entry_renders_its_records_prompts_at_the_billed_count(both_corpora, kimi):
    """The reconstruction itself (not the calibration's fast counter) reproduces each explained entry's in-sample
    prompt figure on the recorded corpus, and names the variant on every row."""
    options = ReconstructOptions(provider_table=str(TABLE_PATH))
    equal, compared, named = Counter(), Counter(), Counter()
    for r in both_corpora:
        entry = record_entry(r)
        if entry is None or entry.status != "explained":
            continue
        row = reconstruct_record(r, kimi, get_format(r["format"], kimi), options)
        key = (entry.provider, entry.model, entry.period, entry.deployment)
        compared[key] += 1
        equal[key] += billed(r, "prompt_tokens") == row.n_prompt_tokens + _prompt_offset(r, entry.variant)
        named[key] += row.serving_variant == entry.variant.describe() and row.serving == entry.variant.profile \
            or row.serving == f"{entry.variant.profile}-stream"
    entries = {(e.provider, e.model, e.period, e.deployment): e for e in load_table() if e.status == "explained"}
    assert set(compared) == set(entries)
    for key, entry in entries.items():
        assert (equal[key], compared[key]) == entry.figures["prompt"], key
        assert named[key] == compared[key], key


def test_without_the_table_the_rows_carry_no_variant(records, kimi):
    r = next(r for r in records if r["response"].get("provider") == "BaseTen")
    row = reconstruct_record(r, kimi, get_format(r["format"], kimi), ReconstructOptions())
    assert row.serving_variant is None and row.serving == "template"


def test_an_entry_whose_template_does_not_apply_to_the_format_is_not_used(records, kimi):
    """BaseTen's K2-0905 entry renders with the 0905 template; reconstructing as kimi-k2.5 cannot use it."""
    r = next(r for r in records if r["response"].get("provider") == "BaseTen")
    row = reconstruct_record(r, kimi, get_format("kimi-k2.5", kimi), ReconstructOptions(provider_table=str(TABLE_PATH)))
    assert row.serving_variant is None


@pytest.fixture(scope="module")
def k2_log(records, tmp_path_factory):
    path = tmp_path_factory.mktemp("k2") / "k2.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            if r["format"] == "kimi-k2-instruct":
                f.write(json.dumps({k: v for k, v in r.items() if k != "format"}) + "\n")
    return path


def test_reconstruct_auto_uses_the_table_and_names_what_it_does_not_explain(k2_log, tmp_path, capsys):
    out = tmp_path / "k2.parquet"
    assert main(["reconstruct", str(k2_log), "-o", str(out), "--format", "kimi-k2-instruct", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    evidence = json.loads((tmp_path / "k2.parquet.serving.json").read_text())
    assert evidence["provider_table"] == str(TABLE_PATH)
    uses = evidence["table"]
    first = uses[0]
    assert first["status"] == "unexplained"  # what nothing explains comes first, by name, with its residual
    assert f"provider {first['provider']} ({first['model']}, {first['period']}): UNEXPLAINED" in printed
    assert "residual" in printed
    deepinfra = [u for u in uses if u["provider"] == "DeepInfra"]
    assert sum(u["records"] for u in deepinfra) == 34 and {u["status"] for u in deepinfra} == {"unexplained"}
    main_entry = next(u for u in deepinfra if u["period"] == "2025-09")  # completions explained, not prompts
    assert main_entry["applied"] and main_entry["records"] == 32
    assert "provider DeepInfra (moonshotai/kimi-k2-0905, 2025-09): UNEXPLAINED prompt in the provider table" in printed
    assert "rows flagged provider_table_prompt_unexplained" in printed
    baseten = next(u for u in uses if u["provider"] == "BaseTen")
    assert baseten["applied"] and baseten["records"] == 23 and baseten["status"] == "explained"
    rows = pq.read_table(out).to_pylist()
    variants = Counter(r["serving_variant"] for r in rows if r["provider"] == "BaseTen")
    assert variants == {baseten["variant"]: 23}
    deep = [r for r in rows if r["provider"] == "DeepInfra"]
    main_rows = [r for r in deep if r["serving_variant"] == main_entry["variant"]]
    assert len(main_rows) == 32 and all("provider_table_prompt_unexplained" in r["flags"] for r in main_rows)
    # the two of 2026-03: an entry that explains neither side, yet made some counts equal, renders them flagged twice
    late = next(u for u in deepinfra if u["period"] != "2025-09")
    assert late["applied"] and late["records"] == 2 and late["figures"]["prompt"][0] > 0
    assert all(r["serving_variant"] == late["variant"] and {"provider_table_prompt_unexplained",
               "provider_table_completion_unexplained"} <= set(r["flags"]) for r in deep if r not in main_rows)
    assert "(the best rendering found, for neither side)" in printed
    assert sum(u["records"] for u in uses) == len(rows)  # every record is under one line


def test_an_entry_whose_variant_made_no_count_equal_leaves_its_records_to_their_group(k2_log, tmp_path, capsys):
    """With DeepInfra's figures lowered to no equal count in a copy of the table, its variant is no evidence at all:
    its records are not rendered by the table's variant (never a silent pick), their group's evidence decides."""
    text = TABLE_PATH.read_text(encoding="utf-8")
    start = text.index('provider = "DeepInfra"\nmodel = "moonshotai/kimi-k2-0905"\nperiod = "2025-09"')
    end = text.index("[[provider]]", start)
    table = tmp_path / "table.toml"
    assert "completion = [32, 32]" in text[start:end] and "\nprompt = [21, 32]" in text[start:end]
    table.write_text(text[:start] + text[start:end].replace("completion = [32, 32]", "completion = [0, 32]")
                     .replace("\nprompt = [21, 32]", "\nprompt = [0, 32]") + text[end:], encoding="utf-8")
    out = tmp_path / "k2.parquet"
    assert main(["reconstruct", str(k2_log), "-o", str(out), "--format", "kimi-k2-instruct", "--no-progress",
                 "--provider-table", str(table)]) == 0
    printed = capsys.readouterr().out
    assert "provider DeepInfra (moonshotai/kimi-k2-0905, 2025-09): UNEXPLAINED in the provider table" in printed
    assert "its group's own evidence decides" in printed
    deep = [r for r in pq.read_table(out).to_pylist() if r["provider"] == "DeepInfra"]
    assert len(deep) == 34 and sum(r["serving_variant"] is None and not r["count_conventions"] for r in deep) == 32


def test_provider_table_none_and_a_bad_table(k2_log, tmp_path, capsys):
    out = tmp_path / "none.parquet"
    assert main(["reconstruct", str(k2_log), "-o", str(out), "--format", "kimi-k2-instruct", "--no-progress",
                 "--provider-table", "none"]) == 0
    assert all(v is None for v in pq.read_table(out, columns=["serving_variant"]).column(0).to_pylist())
    bad = tmp_path / "bad.toml"
    bad.write_text(TABLE_PATH.read_text(encoding="utf-8").replace('profile = "template"', 'profile = "nope"', 1))
    code = main(["reconstruct", str(k2_log), "-o", str(tmp_path / "bad.parquet"), "--format", "kimi-k2-instruct",
                 "--provider-table", str(bad)])
    err = capsys.readouterr().err
    assert code == 2 and "unknown profile 'nope'" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def _billed_record(i, provider="P"):
    return {"id": f"r{i}", "request": {"messages": [{"role": "user", "content": f"hi {i}"}]},
            "response": {"provider": provider, "usage": {"prompt_tokens": 10}, "choices": [
                {"message": {"role": "assistant", "content": "x"}, "finish_reason": "stop"}]}}


def test_every_billed_record_is_evidence_up_to_the_sample_size(kimi):
    """No longer the first 64 of a group: 300 billed records are 300 compared (a record without a billed count is
    not evidence)."""
    records = [_billed_record(i) for i in range(300)] + [{"id": "x", "request": {}, "response": {"provider": "P"}}]
    (choice,) = choose_profiles(records, kimi, "kimi-k2.5")
    assert (choice["compared"], choice["billed_records"], choice["sampled"]) == (300, 300, 300)
    assert "uniform sample" not in describe(choice)


def test_a_large_group_is_a_stated_uniform_sample():
    records = [_billed_record(i) for i in range(2000)] + [_billed_record(i, "Q") for i in range(5)]
    groups = sample_groups(iter(records), 100)
    seen, sample = groups[("P", None)]
    assert (seen, len(sample)) == (2000, 100)
    positions = [int(r["id"][1:]) for r in sample]
    assert positions == sorted(positions)  # input order
    assert sum(p >= 1000 for p in positions) in range(30, 71)  # both halves of the file, not its head
    assert sample_groups(iter(reversed(records)), 100)[("P", None)][1] == sample[::-1]  # the same records, any order
    assert groups[("Q", None)][0] == 5 and len(groups[("Q", None)][1]) == 5
    choice = {"provider": "P", "dataset": None, "profile": "template", "prompt_matched": {"template": 90},
              "compared": 100, "billed_records": 2000, "sampled": 100, "no_evidence": None}
    assert describe(choice).endswith("(evidence: a uniform sample of 100 of 2,000 billed records)")


def test_the_billing_page_leads_with_what_nothing_explains_and_tables_every_provider(k2_log, tmp_path, capsys):
    """Issue 34's report: the billing page's first finding names the unexplained providers with their residuals, and
    its per-provider table lists every table entry met and every group, with the calibrated parity."""
    recon = tmp_path / "k2.parquet"
    assert main(["reconstruct", str(k2_log), "-o", str(recon), "--format", "kimi-k2-instruct", "--no-progress"]) == 0
    assert main(["billing", str(recon), "-o", str(tmp_path / "billing"), "--data", "real"]) in (0, 1)
    capsys.readouterr()
    summary = json.loads((tmp_path / "billing" / "summary.json").read_text())
    evidence = json.loads((tmp_path / "k2.parquet.serving.json").read_text())
    providers = summary["providers"]
    unexplained = [u for u in evidence["table"] if u["status"] == "unexplained"]
    assert [r["provider"] for r in providers[:len(unexplained)]] == [u["provider"] for u in unexplained]
    assert all(r["unexplained"] for r in providers[:len(unexplained)])
    assert not any(r["unexplained"] for r in providers[len(unexplained):])
    baseten = next(r for r in providers if r["provider"] == "BaseTen")
    # the entry's calibrated parity (both corpora: 41 records), and the 23 records of this log it rendered
    assert (baseten["prompt"], baseten["completion"], baseten["records"]) == ("41/41", "41/41", 23)
    page = (tmp_path / "billing" / "report.html").read_text()
    first = page.index("class='finding'") if "class='finding'" in page else page.index('class="finding"')
    assert "explain the billed counts by no known server variant" in page[first:first + 400]
    assert "DeepInfra" in page[first:first + 2000]
    assert "Per provider: serving variant, prompt and completion parity" in page


def test_notebook_02_on_real_records_shows_the_per_provider_table(k2_log, tmp_path):
    """Notebook 02 with ``simulate=False`` reconstructs real API records with ``--serving auto`` (the provider table
    first) and shows the per-provider table, unexplained providers first, before the billing tables."""
    import papermill as pm

    from kimi_eagle.assets import REPO_ROOT

    out = tmp_path / "nb02.ipynb"
    pm.execute_notebook(str(REPO_ROOT / "notebooks" / "02_bpe_diff_inspection.ipynb"), str(out), kernel_name="python3",
                        parameters=dict(simulate=False, api_path=str(k2_log), format_name="kimi-k2-instruct",
                                        sample_size=None, output_dir=str(tmp_path / "run")), progress_bar=False)
    cells = json.loads(out.read_text())["cells"]
    shown = [o for c in cells if c["cell_type"] == "code" and "Per provider" in "".join(c["source"])
             for o in c.get("outputs", [])]
    html_out = "".join("".join(o.get("data", {}).get("text/html", [])) for o in shown)
    assert "Per provider: serving variant and parity" in html_out
    table = html_out[html_out.index("<table"):]
    assert table.index("DeepInfra") < table.index("BaseTen")  # unexplained first
    printed = "".join("".join(o.get("text", [])) for c in cells if c["cell_type"] == "code" for o in c.get("outputs", []))
    assert "provider BaseTen (moonshotai/kimi-k2-0905, 2025-09..2025-11): provider table variant" in printed
