"""``kimi-eagle audit``: one model served as several providers (precisions), greedy completions per provider and
repeat, every request accounted for, and comparisons by bytes against each other and a reference engine."""
import json
import re

import httpx
import pandas as pd
import pytest
import torch

from kimi_eagle.apps import cli
from kimi_eagle.apps.api.server import LocalServer, RequestError, route_provider
from kimi_eagle.apps.audit.compare import REFERENCE, Completion, compare_all, summarize
from kimi_eagle.apps.audit.report import (
    AUDIT_CHARTS,
    agreement_matrix_figure,
    divergence_steps,
    render_html,
    self_consistency_figure,
    write_audit_report,
)
from kimi_eagle.apps.audit.run import audit_request, read_prompts
from kimi_eagle.assets import stories_dir
from kimi_eagle.engine.local import Engine, SamplingParams
from kimi_eagle.engine.precision import parse_provider_table, quantize_int8_per_channel
from kimi_eagle.engine.prompts import distinct_story_prompts
from kimi_eagle.io import read_jsonl, write_jsonl

pytestmark = pytest.mark.timeout(300)


# ---- precision variants


def test_int8_per_channel_quantization_is_within_half_a_step_of_each_weight():
    w = torch.randn(16, 40, generator=torch.Generator().manual_seed(0))
    w[3] = 0  # an all-zero row gets scale 1
    q, scale = quantize_int8_per_channel(w)
    assert q.dtype == torch.int8 and q.abs().max() <= 127 and scale.shape == (16, 1) and scale[3] == 1
    assert torch.all((q.float() * scale - w).abs() <= scale / 2 + 1e-7)
    assert torch.equal(q.abs().amax(dim=1)[[0, 1, 2]], torch.tensor([127, 127, 127], dtype=torch.int8))


def test_precisions_change_the_weights_but_not_the_embeddings():
    fp32 = Engine.from_dir(stories_dir(), threads=1)
    int8 = Engine.from_dir(stories_dir(), threads=1, precision="int8")
    bf16 = Engine.from_dir(stories_dir(), threads=1, precision="bfloat16")
    name = "model.layers.0.self_attn.q_proj.weight"
    w32, w8 = fp32.model.state_dict()[name], int8.model.state_dict()[name]
    assert not torch.equal(w32, w8) and w8.dtype == torch.float32
    assert torch.equal(fp32.model.state_dict()["model.embed_tokens.weight"], int8.model.state_dict()["model.embed_tokens.weight"])
    assert bf16.model.state_dict()[name].dtype == torch.bfloat16 and bf16.precision == "bfloat16"
    ids = fp32.prompt_ids([{"role": "user", "content": "Once upon a time"}])
    assert len(bf16.generate(ids, SamplingParams(temperature=0, max_tokens=8)).output_ids) == 8


def test_provider_tables_are_parsed_strictly():
    assert parse_provider_table("fp32=float32, int8=int8") == {"fp32": "float32", "int8": "int8"}
    for bad in ("fp32", "a=float64", "a=int8,A=float32", ""):
        with pytest.raises(ValueError):
            parse_provider_table(bad)


# ---- OpenRouter routing over a provider table


@pytest.mark.parametrize("prefs,chosen", [
    (None, "fp32"),
    ({"only": ["int8"]}, "int8"),
    ({"only": ["INT8"], "allow_fallbacks": False}, "int8"),
    ({"order": ["bf16", "int8"]}, "bf16"),
    ({"ignore": ["fp32"]}, "bf16"),
    ({"order": ["nobody"]}, "fp32"),  # fallbacks allowed: the table's first
])
def test_routing_picks_the_provider_openrouter_would(prefs, chosen):
    body = {} if prefs is None else {"provider": prefs}
    assert route_provider(body, ["fp32", "bf16", "int8"]) == chosen


@pytest.mark.parametrize("prefs", [{"only": ["nobody"]}, {"order": ["nobody"], "allow_fallbacks": False},
                                   {"only": ["int8"], "ignore": ["int8"]}])
def test_routing_that_excludes_every_provider_is_a_404(prefs):
    with pytest.raises(RequestError) as e:
        route_provider({"provider": prefs}, ["fp32", "bf16", "int8"])
    assert e.value.status == 404


# ---- the audit's inputs and comparisons


def test_audit_requests_are_greedy_seeded_and_pinned():
    body = audit_request({"model": "m", "messages": [], "temperature": 1.0, "provider": {"order": ["x"]}}, "int8", 7, 32)
    assert body["temperature"] == 0 and body["seed"] == 7 and body["max_tokens"] == 32
    assert body["provider"] == {"only": ["int8"], "allow_fallbacks": False}
    assert audit_request({"model": "m", "messages": [], "max_tokens": 5}, "a", 0, 32)["max_tokens"] == 5


def test_every_prompt_line_is_kept_and_bad_ones_say_why(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": "a", "prompt": "x"}\nnot json\n{"id": "a", "prompt": "y"}\n{"id": "b"}\n'
                    '{"id": "c#r1", "prompt": "z"}\n{"prompt": "no id"}\n')
    rows = read_prompts(path, "m")
    assert [pid for pid, _, _ in rows] == ["a", "<line 2>", "a <line 3>", "b", "c#r1", "<line 6>"]
    assert [err is None for _, _, err in rows] == [True, False, False, False, False, True]
    assert "duplicate id 'a' (first at line 1)" in rows[2][2] and "messages" in rows[3][2] and "#r" in rows[4][2]


def test_comparisons_count_identical_prefix_and_divergent_completions(stories):
    a, b = stories.encode(" Lily saw a big red bird"), stories.encode(" Lily saw a big blue bird")
    done = lambda pid, prov, rep, ids: Completion(pid, prov, rep, "ok", ids=ids)
    completions = [done("p1", "x", 0, a), done("p1", "x", 1, a), done("p1", "y", 0, a), done("p1", "y", 1, b),
                   done("p2", "x", 0, a), done("p2", "x", 1, a), done("p2", "y", 0, b), done("p2", "y", 1, b),
                   Completion("p3", "x", 0, "error", "collect", "exhausted: 503"), done("p3", "x", 1, a),
                   done("p3", "y", 0, a[:3]), done("p3", "y", 1, a[:3])]
    reference = {"p1": Completion("p1", REFERENCE, 0, "ok", ids=a), "p2": Completion("p2", REFERENCE, 0, "ok", ids=a),
                 "p3": Completion("p3", REFERENCE, 0, "ok", ids=a)}
    pairs, hunks = compare_all(stories, completions, ["x", "y"], reference)
    assert len(pairs) == 3 * (1 + 2 + 2)  # per prompt: one provider pair, two vs reference, two repeat checks
    xy = {r["prompt_id"]: r for r in pairs if r["kind"] == "pair"}
    assert xy["p1"]["identical"] and not xy["p2"]["identical"] and xy["p3"]["status"] == "error"
    first = len(stories.encode(" Lily saw a big"))
    assert xy["p2"]["first_divergence"] == first and xy["p2"]["length_diff"] == len(b) - len(a)
    s = summarize(pairs, ["x", "y"], has_reference=True)
    assert (s["matrix"]["x"]["y"]["k"], s["matrix"]["x"]["y"]["n"]) == (1, 2)
    assert (s["matrix"]["y"]["y"]["k"], s["matrix"]["y"]["y"]["n"]) == (2, 3)  # p1's repeats differ
    assert (s["matrix"]["x"]["x"]["k"], s["matrix"]["x"]["x"]["n"]) == (2, 2)  # p3 has no repeat 0
    assert (s["matrix"][REFERENCE]["y"]["k"], s["matrix"][REFERENCE]["y"]["n"]) == (1, 3)
    assert s["divergence_ranking"][0]["provider"] == "y"
    assert {h["prompt_id"] for h in hunks} >= {"p2", "p3"}
    assert any(h["a_bytes"] == b" r" and h["b_bytes"] == b" blu" for h in hunks)  # the minimal byte hunk of red/blue


# ---- the audit's charts and page


def small_audit(stories):
    """Pairs and summary of two providers and a reference over three prompts, one of them with a failed request."""
    a, b = stories.encode(" Lily saw a big red bird"), stories.encode(" Lily saw a big blue bird")
    done = lambda pid, prov, rep, ids: Completion(pid, prov, rep, "ok", ids=ids)  # noqa: E731
    completions = [done("p1", "x", 0, a), done("p1", "x", 1, a), done("p1", "y", 0, a), done("p1", "y", 1, b),
                   done("p2", "x", 0, a), done("p2", "x", 1, a), done("p2", "y", 0, b), done("p2", "y", 1, b),
                   Completion("p3", "x", 0, "error", "collect", "exhausted: 503"), done("p3", "x", 1, a),
                   done("p3", "y", 0, a[:3]), done("p3", "y", 1, a[:3])]
    reference = {pid: Completion(pid, REFERENCE, 0, "ok", ids=a) for pid in ("p1", "p2", "p3")}
    pairs, _ = compare_all(stories, completions, ["x", "y"], reference)
    summary = summarize(pairs, ["x", "y"], has_reference=True)
    summary.update(prompts=3, bad_prompts=0, repeats=2, requests=12, completions={"ok": 11, "error:collect": 1},
                   aborted=None, settings={"model": "stories260K", "max_tokens": 12})
    return pairs, summary


def test_the_agreement_heatmap_shows_the_identical_share_recounted_from_the_pairs(stories):
    pairs, summary = small_audit(stories)
    ax = agreement_matrix_figure(summary).axes[0]
    shown = ax.images[0].get_array()
    names = [t.get_text() for t in ax.get_xticklabels()]
    assert names == [REFERENCE, "x", "y"] and "[REAL data]" in ax.get_title()
    ok = [p for p in pairs if p["status"] == "ok"]
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            if a == b and a != REFERENCE:  # self-consistency: every repeat of a prompt identical to repeat 0
                rows = [p for p in ok if p["kind"] == "repeat" and p["a"] == a]
                prompts = {p["prompt_id"] for p in rows}
                k = sum(all(p["identical"] for p in rows if p["prompt_id"] == pid) for pid in prompts)
                n = len(prompts)
            else:
                rows = [p for p in ok if p["kind"] != "repeat" and {p["a"], p["b"]} == {a, b} and a != b]
                k, n = sum(p["identical"] for p in rows), len(rows)
            if n == 0:
                assert shown.mask[i, j]
            else:
                assert shown[i, j] == pytest.approx(k / n)
                assert f"{k}/{n}" in [t.get_text().split("\n")[1] for t in ax.texts if t.get_position() == (j, i)]
    bars = self_consistency_figure(summary).axes[0].patches
    assert [round(bar.get_height(), 6) for bar in bars] == [1.0, round(2 / 3, 6)]  # x: 2/2, y: p1's repeats differ


def test_the_divergence_curve_rises_by_one_prompt_at_each_first_difference():
    xs, ys = divergence_steps({"first_divergence": [4, 9], "n": 4}, 12)
    assert xs == [0, 4, 4, 9, 9, 12] and ys == [0, 0, 0.25, 0.25, 0.5, 0.5]


def test_the_audit_page_embeds_its_three_charts_with_the_shared_stylesheet(stories, tmp_path):
    from kimi_eagle.apps.reports.toolkit import STYLESHEET

    _, summary = small_audit(stories)
    written = write_audit_report(summary, tmp_path)
    assert set(written) == {*AUDIT_CHARTS, "report"}
    for name in AUDIT_CHARTS:
        assert (tmp_path / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (tmp_path / "report.html").read_text()
    assert page.count("data:image/png;base64,") == len(AUDIT_CHARTS)
    assert re.findall(r"<style>(.*?)</style>", page, re.S) == ["\n" + STYLESHEET]
    assert "REAL data" in page and "left out" not in page and "<td class='tok'>2/3</td>" in page


# ---- end to end: one server, a provider table, a reference engine


def test_audit_accounts_for_every_request_and_fp32_agrees_with_its_own_engine(tmp_path, capsys):
    prompts = distinct_story_prompts(3) + [{"id": "broken", "messages": "not a list"}]
    write_jsonl(tmp_path / "prompts.jsonl", prompts)
    assert cli.main(["generate", str(tmp_path / "prompts.jsonl"), "-o", str(tmp_path / "ref.jsonl"), "--model",
                     str(stories_dir()), "--temperature", "0", "--max-tokens", "12"]) == 0
    with LocalServer(stories_dir(), tmp_path / "log.jsonl", "--providers", "fp32=float32,int8=int8") as srv:
        card = httpx.get(srv.base_url + "/models", timeout=10).json()["data"][0]
        assert card["providers"] == {"fp32": "float32", "int8": "int8"}
        args = ["audit", str(tmp_path / "prompts.jsonl"), "-o", str(tmp_path / "audit"), "--base-url", srv.base_url,
                "--model", "stories260K", "--providers", "fp32,int8", "--reference", str(tmp_path / "ref.jsonl"),
                "--repeats", "2", "--max-tokens", "12", "--tokenizer", str(stories_dir()), "--format", "plain",
                "--no-progress"]
        assert cli.main(args) == 0
        assert cli.main(args) == 0  # a rerun resumes: nothing is requested again
    log = [line.obj for line in read_jsonl(tmp_path / "log.jsonl")]
    assert len(log) == 3 * 2 * 2 and {(r["provider"], r["precision"]) for r in log} == {("fp32", "float32"), ("int8", "int8")}
    completions = pd.read_parquet(tmp_path / "audit" / "completions.parquet")
    providers = completions[completions.provider != REFERENCE]
    assert len(providers) == 4 * 2 * 2  # every prompt x provider x repeat, the broken line included
    assert set(providers[providers.prompt_id == "broken"].stage) == {"input"}
    assert (providers[providers.prompt_id != "broken"].status == "ok").all()
    summary = json.loads((tmp_path / "audit" / "summary.json").read_text())
    assert summary["matrix"][REFERENCE]["fp32"]["k"] == summary["matrix"][REFERENCE]["fp32"]["n"] == 3
    assert summary["matrix"]["fp32"]["fp32"]["rate"] == summary["matrix"]["int8"]["int8"]["rate"] == 1.0
    assert summary["completions"] == {"ok": 12, "error:input": 4}
    assert summary["settings"]["serving"] == "template"  # the profile the answers were reconstructed with
    for name in (*AUDIT_CHARTS, "report"):  # the charts and the page beside summary.json
        assert (tmp_path / "audit" / (f"{name}.png" if name != "report" else "report.html")).is_file()
    assert "reference" in capsys.readouterr().out
    # #35: stories260K at two precisions on 127.0.0.1 are stand-ins for providers, never "REAL data"
    assert summary["data"] == "stand-in: stories260K served locally"
    page = (tmp_path / "audit" / "report.html").read_text()
    assert "REAL data" not in page and "STAND-IN data: stories260K served locally" in page
    assert "<p class='data stand-in'>" in page


def test_a_local_audit_is_a_stand_in_everywhere_a_remote_one_is_real(stories):
    """#35: the page's banner, title and every chart say what the "providers" are."""
    _, summary = small_audit(stories)
    local = {**summary, "settings": {**summary["settings"], "base_url": "http://127.0.0.1:8000/v1"}}
    remote = {**summary, "settings": {**summary["settings"], "base_url": "https://openrouter.ai/api/v1"}}
    for s, tag in ((local, "[STAND-IN data: stories260K served locally]"), (remote, "[REAL data]")):
        for fig in (agreement_matrix_figure(s), self_consistency_figure(s)):
            assert fig.axes[0].get_title().replace("\n", " ").startswith(tag)
    page = render_html(local, {})
    assert "REAL data" not in page and "stand-in: stories260K served locally" in page.split("<h1>")[1].split("</h1>")[0]


def test_audit_options_refuse_what_a_user_gets_wrong_before_any_request(tmp_path):
    from kimi_eagle.apps.audit.run import AuditOptions

    base = dict(base_url="http://127.0.0.1:9/v1", model="m")
    for providers, repeats, reference, why in [((), 2, None, "--providers"), (("a", "A"), 2, None, "--providers"),
                                                ((REFERENCE,), 2, None, "--providers"), (("a",), 0, None, "--repeats"),
                                                (("a",), 2, tmp_path / "missing.jsonl", "--reference")]:
        with pytest.raises(ValueError, match=why):
            AuditOptions(**base, providers=providers, repeats=repeats, reference=reference).check()
    ok = AuditOptions(**base, providers=("a", "b"), serving="vllm")
    ok.check()
    assert ok.settings("tok")["serving"] == "vllm" and ok.settings("tok")["tokenizer"] == "tok"


def test_audit_takes_the_serving_profile_on_the_command_line():
    from kimi_eagle.apps.cli import build_parser

    argv = ["audit", "p.jsonl", "-o", "out", "--base-url", "http://x/v1", "--model", "m", "--providers", "a,b",
            "--serving", "sglang"]
    assert build_parser(argv).parse_args(argv).serving == "sglang"
