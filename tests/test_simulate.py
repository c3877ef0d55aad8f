"""The labelled benchmark: injected effects on real converted conversations, scored by the diff."""
from __future__ import annotations

import json

import pytest

from kimi_eagle.assets import kimi_dir
from kimi_eagle.diff.simulate import EFFECTS, load_source_records, run_benchmark, simulate_samples, write_samples
from kimi_eagle.diff.summary import confusion, precision_recall

PER_EFFECT = 4


@pytest.fixture(scope="module")
def benchmark(kimi, tmp_path_factory):
    out = tmp_path_factory.mktemp("sim")
    samples = simulate_samples(load_source_records(["glaive", "reason-tool-use"]), kimi, per_effect=PER_EFFECT, seed=3)
    write_samples(samples, out)
    return samples, run_benchmark(out, kimi_dir()), out


def test_every_effect_is_injected(benchmark):
    samples, _, out = benchmark
    counts = {e: sum(s.effect == e for s in samples) for e in EFFECTS}
    assert counts == {e: PER_EFFECT for e in EFFECTS}
    assert len({s.id for s in samples}) == len(samples)
    engine_lines = (out / "engine.jsonl").read_text().splitlines()
    api_lines = (out / "api.jsonl").read_text().splitlines()
    assert len(engine_lines) == len(api_lines) == len(samples)
    assert all(json.loads(line)["output_ids"] for line in engine_lines)


def test_classifier_reaches_precision_and_recall_one_for_every_class(benchmark):
    _, result, _ = benchmark
    assert (result.records["status"] == "ok").all()
    table = confusion(result.records)
    pr = precision_recall(table).set_index("class")
    assert set(pr.index) == set(EFFECTS.values())
    wrong = result.records[result.records["label"] != result.records["expected"]]
    assert wrong.empty, wrong[["id", "label", "expected", "subclasses"]].to_string()
    assert (pr["precision"] == 1.0).all() and (pr["recall"] == 1.0).all()


def test_injected_effects_really_change_the_ids(benchmark):
    samples, result, _ = benchmark
    recs = result.records.set_index("id")
    for s in samples:
        changed = recs.loc[s.id, "n_hunks"] > 0
        assert changed == (s.expected != "exact"), s.id


def test_literal_markers_are_flagged_and_exact(benchmark):
    _, result, _ = benchmark
    lit = result.records[result.records["id"].str.endswith("#literal_marker")]
    assert len(lit) == PER_EFFECT
    assert all("literal_marker" in list(f) for f in lit["flags"])
    assert (lit["verdict"] == "exact").all()


def test_billing_of_the_simulated_usage_is_fully_explained(benchmark):
    _, result, _ = benchmark
    r = result.records
    assert (r["billing_unexplained"] == 0).all() and (r["reasoning_unexplained"] == 0).all()
    trunc = r[r["expected"] == "truncation"]
    assert (trunc["billing_delta"] > 0).all() and (trunc["billing_delta"] == trunc["billing_explained"]).all()


def test_simulation_is_reproducible(kimi):
    records = load_source_records(["reason-tool-use"])
    a = simulate_samples(records, kimi, per_effect=1, seed=7, effects=["non_canonical_split", "partial_utf8"])
    b = simulate_samples(records, kimi, per_effect=1, seed=7, effects=["non_canonical_split", "partial_utf8"])
    assert [(s.id, s.engine_ids) for s in a] == [(s.id, s.engine_ids) for s in b]
