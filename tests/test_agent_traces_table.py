"""docs/providers.md's agent-traces table (issue 44) is what ``kimi-eagle providers --recorded --corpus agent_traces``
prints: recomputed here, with its out-of-sample line (learned on some of the agent's tests, scored on the others)
and its residuals by provider and request size. Slow: the agent's 30 KB prompts are rendered under every variant."""
from __future__ import annotations

import pytest

from kimi_eagle.apps.commands.providers import calibrate_corpus
from kimi_eagle.assets import REPO_ROOT
from kimi_eagle.reconstruct.record import rebuild_under
from kimi_eagle.reconstruct.recorded import (
    AGENT_DATASET,
    AGENT_LEARN_TESTS,
    AGENT_SCORE_TESTS,
    CORPORA,
    corpus_records,
    source_test,
)
from kimi_eagle.serving.calibration import MIN_HELD_OUT, MIN_RECORDS, VariantCounts

pytestmark = [pytest.mark.slow, pytest.mark.calibration]  # ~20 min: `make test-calibration`, not `make test`


@pytest.fixture(scope="module")
def agent(kimi):
    exchanges, records = corpus_records(AGENT_DATASET)
    tests = {r["id"]: source_test(ex) for ex, r in zip(exchanges, records)}
    scored = (lambda r: tests.get(r["id"]) in AGENT_SCORE_TESTS)
    rows, text = calibrate_corpus(f"{AGENT_DATASET} ({CORPORA[AGENT_DATASET]})", records,
                                  VariantCounts(kimi, rebuild_under), scored, scored)
    return records, tests, rows, text


def test_the_agent_tests_split_in_two(agent):
    records, tests, _, _ = agent
    assert set(tests.values()) == set(AGENT_LEARN_TESTS) | set(AGENT_SCORE_TESTS)
    assert not set(AGENT_LEARN_TESTS) & set(AGENT_SCORE_TESTS) and len(records) == 407


def test_the_docs_show_the_agent_table_its_out_of_sample_line_and_residuals(agent):
    _, _, _, text = agent
    docs = (REPO_ROOT / "docs" / "providers.md").read_text().splitlines()
    printed = [line for line in text.splitlines()
               if line.startswith(("| ", "prompts", "completions", "held", "out of sample", "rule:"))]
    assert len(printed) > 30 and all(line in docs for line in printed), [line for line in printed if line not in docs]
    assert "407 record(s): 407 calibrated, 0 refused" in text  # nothing fails


def test_no_agent_entry_is_explained_on_thin_evidence(agent):
    _, _, rows, _ = agent
    for r in rows:
        if r["status"] == "explained":
            assert min(r["in_sample"][k].compared for k in ("prompt", "completion")) >= MIN_RECORDS
            assert min(r["held_out"][k].compared for k in ("prompt", "completion")) >= MIN_HELD_OUT
            assert not r["variant"].unnamed_offsets()
