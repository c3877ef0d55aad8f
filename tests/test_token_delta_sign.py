"""One sign for the token delta everywhere (#35, finding 2): reconstructed − engine tokens, the same number for the
same record in records.parquet, hunks.parquet, the report's token-delta chart, the inspector and the playground."""
from __future__ import annotations

import html
import re

import pandas as pd
import pytest
from helpers import split_token

from kimi_eagle.apps.reports import diff_report
from kimi_eagle.apps.widgets.inspector import DiffInspector
from kimi_eagle.apps.widgets.playground import TokenizerPlayground
from kimi_eagle.assets import REPO_ROOT, kimi_dir
from kimi_eagle.diff.classify import TOKEN_DELTA_SIGN
from kimi_eagle.diff.run import read_diff, read_engine, read_reconstructed
from kimi_eagle.diff.simulate import load_source_records, run_benchmark, simulate_samples, write_samples


@pytest.fixture(scope="module")
def bench(kimi, tmp_path_factory):
    out = tmp_path_factory.mktemp("sign")
    write_samples(simulate_samples(load_source_records(["glaive", "reason-tool-use"]), kimi, per_effect=2, seed=11), out)
    run_benchmark(out, kimi_dir())
    return out


def test_the_sign_is_reconstructed_minus_engine_and_documented():
    assert TOKEN_DELTA_SIGN == "reconstructed − engine"
    docs = (REPO_ROOT / "docs" / "diff.md").read_text(encoding="utf-8")
    assert f"`token_delta` is {TOKEN_DELTA_SIGN}" in docs


def test_parquet_inspector_playground_and_chart_agree_on_the_same_record(kimi, bench):
    records, hunks = read_diff(bench / "diff").records, pd.read_parquet(bench / "diff" / "hunks.parquet")
    ok = records[records.status == "ok"]
    assert (ok.token_delta == ok.n_recon_tokens - ok.n_engine_tokens).all()  # the parquet: reconstructed − engine
    per_record = hunks.groupby("id").token_delta.sum()
    assert per_record.to_dict() == ok.set_index("id").token_delta[per_record.index].to_dict()
    engine = read_engine(bench / "engine.jsonl", kimi)
    recon = {str(r["id"]): r for r in read_reconstructed(bench / "reconstructed.parquet") if r.get("status") == "ok"}
    # a record whose reconstruction is shorter (a truncation), and whose IDs are what its text encodes to
    row = next(r for r in ok[ok.token_delta < 0].itertuples()
               if kimi.encode(kimi.decode(recon[r.id]["completion_ids"]), allow_special=True)
               == list(recon[r.id]["completion_ids"]))
    delta = int(row.token_delta)
    inspector = DiffInspector.from_files(kimi, bench / "diff", bench / "engine.jsonl", bench / "reconstructed.parquet")
    inspector.record.value = row.id
    assert f"token delta ({TOKEN_DELTA_SIGN}) {delta:+d}" in html.unescape(inspector.html.value)
    pg = TokenizerPlayground(kimi, text=kimi.decode(recon[row.id]["completion_ids"]),
                             ids=str(list(engine[row.id].output_ids)))
    assert pg.record_verdict.token_delta == delta
    assert re.search(rf"token delta \({TOKEN_DELTA_SIGN}[^)]*\) {delta:+d}<", html.unescape(pg.html.value))
    # the chart: one bar per delta, at the parquet's value (not its mirror image)
    ax = diff_report.chart_token_delta(records, "simulated").axes[0]
    assert TOKEN_DELTA_SIGN in ax.get_xlabel()
    drawn = {round(p.get_x() + p.get_width() / 2): int(p.get_height()) for p in ax.patches if p.get_height()}
    differing = ok[ok.verdict != "exact"].token_delta.clip(-20, 20).value_counts()
    assert drawn == {int(k): int(v) for k, v in differing.items()} and drawn.get(delta)


def test_a_pasted_split_token_is_one_more_engine_token_so_the_delta_is_minus_one(kimi):
    pg = TokenizerPlayground(kimi, text="Hello weather")
    k = next(i for i, t in enumerate(pg.encoded) if kimi.token_bytes(t) == b" weather")
    pg.ids.value = ", ".join(map(str, split_token(kimi, pg.encoded, k)))
    assert pg.record_verdict.token_delta == -1 and f"{TOKEN_DELTA_SIGN}: the text's encoding − pasted IDs) -1" in \
        html.unescape(pg.html.value)
