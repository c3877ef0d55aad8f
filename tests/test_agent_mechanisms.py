"""The named mechanisms found on the agent traces (issue 44), each checked two ways: what it does to a request or an
answer, spelled out on a small case, and that it makes the recorded billed counts of the providers it was found on
equal to the reconstruction, every record of the period, to the token. Nobody on the project wrote these records
(../shared/assets/data/real_api/kimi_agent_traces.jsonl: a coding agent's OpenRouter traffic)."""
from __future__ import annotations

import json

import pytest

from kimi_eagle.chat.formats import get_format
from kimi_eagle.reconstruct.record import rebuild_under
from kimi_eagle.reconstruct.recorded import AGENT_DATASET, corpus_records
from kimi_eagle.serving.calibration import VariantCounts, billed
from kimi_eagle.serving.periods import day_of
from kimi_eagle.serving.variants import Variant, declaration, split_extra, with_system_text

TOOLS = [{"type": "function", "function": {"name": "bash", "strict": False, "description": "Run <cmd> & 'quote'\u2028",
                                           "parameters": {"type": "object", "properties": {}}}}]


def test_go_escaping_writes_angle_brackets_and_ampersands_as_unicode_escapes_and_keeps_apostrophes():
    text = declaration(TOOLS, "json-compact", "kimi-k2-instruct", "json", escape="go")
    assert "\\u003ccmd\\u003e \\u0026 'quote'\\u2028" in text and "<" not in text and "&" not in text
    html = declaration(TOOLS, "json-compact", "kimi-k2-instruct", "json", escape="html")
    assert "\\u0027quote\\u0027" in html  # Jinja's HTML-safe tojson escapes the apostrophe too: go does not


def test_a_stripped_system_text_loses_its_surrounding_whitespace_and_nothing_else():
    messages = [{"role": "system", "content": "  rules\n\n\n\n\n"}, {"role": "user", "content": " hi \n"}]
    assert with_system_text(messages, "stripped") == [{"role": "system", "content": "rules"}, messages[1]]
    assert with_system_text(messages, "as-sent") == messages


def test_the_verbatim_history_ids_are_the_requests_own_where_the_template_numbers_its_own(kimi):
    messages = [{"role": "user", "content": "go"},
                {"role": "assistant", "content": None,
                 "tool_calls": [{"id": "bash:2", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "bash:2", "content": "ok"}]
    fmt = get_format("kimi-k2-instruct", kimi)
    numbered = "".join(t for t, _ in fmt.prompt_pieces(messages))
    assert "functions.bash:0" in numbered and "bash:2" not in numbered
    own = "".join(t for t, _ in type(fmt)(request_ids=True).prompt_pieces(messages))
    assert "## Return of bash:2" in own and "functions.bash" not in own


def test_a_call_id_without_its_prefix_counts_the_name_as_split_after_functions(kimi):
    assert split_extra(kimi, [{"id": "bash:0", "function": {"name": "bash"}}]) == 1  # ".b" + "ash" against "bash"
    assert split_extra(kimi, [{"id": "glob:0", "function": {"name": "glob"}}]) == 0  # ".glob" against "glob"
    assert split_extra(kimi, [{"id": "functions.bash:0", "function": {"name": "bash"}}]) == 0  # prefixed: as returned


# ---- the recorded evidence: every record of each period, exact -------------------------------------------------

OLD_SERVER = Variant(profile="moonshot", tools="json-compact", schema="no-strict", json_escape="go",
                     call_header="functions-split")
PERIODS = {  # provider -> [(first day, last day, variant)], both servers of Moonshot's K2-0905 weights
    "Moonshot AI": [("2025-10-01", "2025-11-11", OLD_SERVER),
                    ("2025-11-12", "2025-11-12", Variant(profile="moonshot", tools="ts", call_header="functions-split")),
                    ("2025-11-13", "2026-12-31", Variant(profile="moonshot", tools="ts", system_text="stripped",
                                                         call_header="functions-split"))],
    "Novita": [("2025-10-01", "2025-11-11", OLD_SERVER),
               ("2025-11-13", "2026-12-31", Variant(profile="moonshot", tools="ts", system_text="stripped",
                                                    call_header="functions-split"))],
}


@pytest.fixture(scope="module")
def agent_counts(kimi):
    _, records = corpus_records(AGENT_DATASET)
    return records, VariantCounts(kimi, rebuild_under)


@pytest.mark.parametrize("provider", sorted(PERIODS))
def test_moonshot_and_novita_are_explained_to_the_token_by_named_mechanisms_in_every_period(agent_counts, provider):
    records, counts = agent_counts
    seen = 0
    for first, last, variant in PERIODS[provider]:
        period = [r for r in records if (r.get("response") or {}).get("provider") == provider
                  and first <= day_of(r) <= last]
        assert period, (provider, first)
        for r in period:
            for kind, got in (("prompt", counts.prompt(r, variant)), ("completion", counts.completion_count(r, variant))):
                assert billed(r, f"{kind}_tokens") == got, (provider, day_of(r), kind, r["id"])
        seen += len(period)
    assert seen == sum((r.get("response") or {}).get("provider") == provider for r in records)


def test_the_old_servers_tool_declaration_matches_nine_tool_sets_that_the_kit_declares_otherwise(agent_counts):
    records, counts = agent_counts
    old = [r for r in records if (r.get("response") or {}).get("provider") in PERIODS and day_of(r) <= "2025-11-11"]
    tool_sets = {json.dumps(r["request"]["tools"]) for r in old}
    assert len(tool_sets) == 9  # the agent changed its tools nine times in those six weeks: one mechanism fits all
    plain = Variant(profile="moonshot", tools="json-compact")
    assert all(counts.prompt(r, plain) != billed(r, "prompt_tokens") for r in old)  # escaping and strict matter


def test_a_record_after_every_learned_period_is_scored_under_the_latest_one_by_date_not_by_spelling():
    from kimi_eagle.serving.calibration import row_for

    rows = [{"provider": "P", "model": "m", "period": p, "deployment": "any"}
            for p in ("2025-10..2025-10-12", "2025-10-13..2025-12")]  # "2025-10.." spells after "2025-10-1"
    record = {"response": {"provider": "P", "model": "m", "created": 1768830293}}  # 2026-01-19
    assert row_for(rows, record)["period"] == "2025-10-13..2025-12"
