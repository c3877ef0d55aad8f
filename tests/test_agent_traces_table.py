"""docs/providers.md's agent-traces table (issue 44) is what ``kimi-eagle providers --recorded --corpus agent_traces``
prints: recomputed here, with its out-of-sample line (learned on some of the agent's tests, scored on the others)
and its residuals by provider and request size. Slow: the agent's 30 KB prompts are rendered under every variant."""
from __future__ import annotations

import pytest

from kimi_eagle.apps.commands.providers import calibrate_both, calibrate_corpus
from kimi_eagle.assets import REPO_ROOT
from kimi_eagle.reconstruct.record import rebuild_under
from kimi_eagle.reconstruct.recorded import (
    AGENT_DATASET,
    AGENT_LEARN_TESTS,
    AGENT_SCORE_TESTS,
    CORPORA,
    DATASET,
    corpus_records,
    source_test,
)
from kimi_eagle.serving.calibration import MIN_HELD_OUT, MIN_RECORDS, VariantCounts, totals
from kimi_eagle.serving.provider_table import load_table, table_items

pytestmark = [pytest.mark.slow, pytest.mark.calibration]  # ~20 min: `make test-calibration`, not `make test`


@pytest.fixture(scope="module")
def counts(kimi):
    return VariantCounts(kimi, rebuild_under)  # one cache for the agent's calibration and both corpora's


@pytest.fixture(scope="module")
def agent(counts):
    exchanges, records = corpus_records(AGENT_DATASET)
    tests = {r["id"]: source_test(ex) for ex, r in zip(exchanges, records)}
    scored = (lambda r: tests.get(r["id"]) in AGENT_SCORE_TESTS)
    rows, text = calibrate_corpus(f"{AGENT_DATASET} ({CORPORA[AGENT_DATASET]})", records, counts, scored, scored)
    return records, tests, rows, text, scored


@pytest.fixture(scope="module")
def both(agent, counts):
    """Both recorded corpora calibrated together: the shipped table (``kimi-eagle providers --recorded -o``)."""
    records, _, _, _, scored = agent
    return calibrate_both({DATASET: (corpus_records(DATASET)[1], None), AGENT_DATASET: (records, scored)}, counts)


def test_the_agent_tests_split_in_two(agent):
    records, tests, _, _, _ = agent
    assert set(tests.values()) == set(AGENT_LEARN_TESTS) | set(AGENT_SCORE_TESTS)
    assert not set(AGENT_LEARN_TESTS) & set(AGENT_SCORE_TESTS) and len(records) == 407


def test_the_docs_show_the_agent_table_its_out_of_sample_line_and_residuals(agent):
    _, _, _, text, _ = agent
    docs = (REPO_ROOT / "docs" / "providers.md").read_text().splitlines()
    printed = [line for line in text.splitlines()
               if line.startswith(("| ", "prompts", "completions", "held", "out of sample", "rule:"))]
    assert len(printed) > 30 and all(line in docs for line in printed), [line for line in printed if line not in docs]
    assert "407 record(s): 407 calibrated, 0 refused" in text  # nothing fails


def test_no_agent_entry_is_explained_on_thin_evidence(agent):
    _, _, rows, _, _ = agent
    for r in rows:
        if r["status"] == "explained":
            assert min(r["in_sample"][k].compared for k in ("prompt", "completion")) >= MIN_RECORDS
            assert min(r["held_out"][k].compared for k in ("prompt", "completion")) >= MIN_HELD_OUT
            assert not r["variant"].unnamed_offsets()


def test_the_shipped_table_is_the_calibration_of_both_corpora(both):
    rows, _ = both
    shipped = load_table()
    assert [(e.provider, e.model, e.period, e.deployment) for e in shipped] == [
        (r["provider"], r["model"], r["period"], r.get("deployment", "any")) for r in rows]
    for entry, item in zip(shipped, table_items(rows)):
        assert entry.variant.profile == item["profile"] and entry.variant.conventions() == item["conventions"]
        assert entry.figures == {k: tuple(item[k]) for k in entry.figures} and entry.status == item["status"]


def test_the_docs_show_the_shipped_table_and_its_out_of_sample_line(both):
    rows, text = both
    docs = (REPO_ROOT / "docs" / "providers.md").read_text().splitlines()
    printed = [line for line in text.splitlines()
               if line.startswith(("| ", "prompts", "completions", "held", "out of sample"))]
    assert len(printed) > 40 and all(line in docs for line in printed), [line for line in printed if line not in docs]
    t = totals(rows)
    assert t["prompt_tools"][0] >= 0.9 * t["prompt_tools"][1] and t["prompt_no_tools"][0] >= 0.98 * t["prompt_no_tools"][1]
    for r in rows:  # the evidence rule holds on the shipped table too
        if r["status"] == "explained":
            assert min(r["in_sample"][k].compared for k in ("prompt", "completion")) >= MIN_RECORDS
            assert min(r["held_out"][k].compared for k in ("prompt", "completion")) >= MIN_HELD_OUT
