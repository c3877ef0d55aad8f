"""The native renderers are byte-identical to the official jinja templates (the oracle).

The oracle renders ``assets/kimi/templates/*.jinja`` with jinja2 the way HF's ``apply_chat_template``
does: a sandboxed environment with ``trim_blocks``, ``lstrip_blocks``, ``loopcontrols`` and HF's
``tojson`` (no HTML escaping, no key sorting, non-ASCII kept), ``add_generation_prompt=True``.
(The K2 templates mutate lists, which HF's *immutable* sandbox refuses, so the oracle uses the
mutable sandbox; K2.5 is additionally checked against transformers' own renderer.)

Every assistant turn of all 300 glaive, 50 reasoning-tool-use and 2,000 ShareGPT conversations is
checked: the prompt, and the completion as the suffix the template renders for the message.
"""
from __future__ import annotations

import json
from functools import lru_cache

import jinja2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jinja2.sandbox import SandboxedEnvironment

from kimi_eagle.assets import asset_path
from kimi_eagle.chat.completion import CompletionOptions
from kimi_eagle.chat.formats import KimiK25, get_format, render
from kimi_eagle.chat.messages import normalise_messages
from kimi_eagle.reconstruct.convert import convert
from kimi_eagle.reconstruct.record import parse_turn, reconstruct_record
from kimi_eagle.tokenize.tokenizer import ids_to_bytes

TEMPLATES = {"kimi-k2.5": "kimi-k2.5", "kimi-k2.5-nothink": "kimi-k2.5", "kimi-k2-thinking": "kimi-k2-thinking",
             "kimi-k2-instruct": "kimi-k2-instruct"}


def hf_tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache
def template(name: str) -> jinja2.Template:
    env = SandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = hf_tojson
    return env.from_string(asset_path(f"kimi/templates/{name}.jinja").read_text(encoding="utf-8"))


def oracle(fmt_name: str, messages, tools, add_generation_prompt=True, **kw) -> str:
    if fmt_name == "kimi-k2.5-nothink":
        kw["thinking"] = False
    return template(TEMPLATES[fmt_name]).render(messages=messages, tools=tools,
                                                add_generation_prompt=add_generation_prompt, **kw)


def history_message(record) -> dict:
    """The generated message as the template sees it in history."""
    msg = record["response"]["choices"][0]["message"]
    out = {"role": "assistant", "content": msg.get("content")}
    if msg.get("reasoning"):
        out["reasoning_content"] = msg["reasoning"]
    if msg.get("tool_calls"):
        out["tool_calls"] = msg["tool_calls"]
    return out


@lru_cache
def dataset(name: str) -> list[dict]:
    return list(convert(name))


@lru_cache
def k25_preserving():
    return KimiK25(preserve_thinking=True)


def in_suffix_branch(fmt_name: str, messages, msg) -> bool:
    """Is ``msg``, appended to ``messages``, rendered by the template's suffix branch (reasoning kept)?"""
    if fmt_name == "kimi-k2.5":
        return bool(msg.get("tool_calls"))
    if fmt_name == "kimi-k2.5-nothink":  # history and suffix both render <think></think>
        return True
    if fmt_name == "kimi-k2-thinking":
        earlier = any(m["role"] == "assistant" and not m.get("tool_calls") for m in messages)
        return bool(msg.get("tool_calls")) or earlier
    # K2-Instruct writes its default system prompt only inside the message loop, so an empty
    # history gains one when the message is appended
    return bool(messages)


@pytest.mark.parametrize("fmt_name", list(TEMPLATES))
@pytest.mark.parametrize("source,n_convs,n_turns", [("glaive", 300, 957), ("reason-tool-use", 50, 112), ("sharegpt", 2000, 7541)])
def test_every_assistant_turn_matches_the_template(kimi, fmt_name, source, n_convs, n_turns):
    records = dataset(source)
    assert len(records) == n_turns and len({r["id"].rsplit(":", 1)[0] for r in records}) == n_convs
    assert not [r for r in records if "error" in r]
    fmt = get_format(fmt_name, kimi)
    checked_suffix = 0
    for record in records:
        messages = normalise_messages(record["request"]["messages"])
        tools = record["request"].get("tools")
        expected_prompt = oracle(fmt_name, messages, tools)
        assert render(fmt.prompt_pieces(messages, tools)) == expected_prompt, record["id"]
        # completion = the suffix the template renders for the message
        turn = parse_turn(record["response"])
        segments, _ = fmt.completion_segments(turn, messages, CompletionOptions())
        completion = "".join(s.text for s in segments)
        msg = history_message(record)
        if in_suffix_branch(fmt_name, messages, msg):
            full = oracle(fmt_name, messages + [msg], tools, add_generation_prompt=False)
            assert full == expected_prompt + completion, record["id"]
            checked_suffix += 1
        if fmt_name == "kimi-k2.5":  # with preserve_thinking every message is in the suffix branch
            prompt = render(k25_preserving().prompt_pieces(messages, tools))
            assert prompt == oracle(fmt_name, messages, tools, preserve_thinking=True), record["id"]
            assert prompt + completion == oracle(fmt_name, messages + [msg], tools, add_generation_prompt=False,
                                                 preserve_thinking=True), record["id"]
            checked_suffix += 1
    assert checked_suffix > 0


@pytest.mark.parametrize("source,stride", [("glaive", 1), ("reason-tool-use", 1), ("sharegpt", 4)])
def test_reconstructed_token_bytes_equal_the_template_bytes(kimi, source, stride):
    """The IDs themselves: prompt_ids spell the template's prompt, completion_ids its suffix, byte for byte.
    (Every turn's rendering is checked above; here every ``stride``-th turn is also encoded.)"""
    fmt = get_format("kimi-k2.5")
    for record in dataset(source)[::stride]:
        row = reconstruct_record(record, kimi, fmt)
        messages = normalise_messages(record["request"]["messages"])
        tools = record["request"].get("tools")
        assert ids_to_bytes(kimi, row.prompt_ids) == oracle("kimi-k2.5", messages, tools).encode(), record["id"]
        full = oracle("kimi-k2.5", messages + [history_message(record)], tools, add_generation_prompt=False,
                      preserve_thinking=True)
        prompt = render(k25_preserving().prompt_pieces(messages, tools))
        assert ids_to_bytes(kimi, row.completion_ids) == full[len(prompt):].encode(), record["id"]


def test_k25_matches_transformers_own_renderer():
    """Cross-check the oracle: transformers' render_jinja_template (HF's immutable sandbox) agrees."""
    pytest.importorskip("transformers")
    from transformers.utils.chat_template_utils import render_jinja_template

    text = asset_path("kimi/templates/kimi-k2.5.jinja").read_text(encoding="utf-8")
    fmt = get_format("kimi-k2.5")
    records = dataset("reason-tool-use") + dataset("glaive")[:150]
    for record in records:
        messages = normalise_messages(record["request"]["messages"])
        tools = record["request"].get("tools")
        hf = render_jinja_template([messages], tools=tools, chat_template=text, add_generation_prompt=True)
        hf = hf[0] if isinstance(hf, tuple) else hf
        hf = hf[0] if isinstance(hf, list) else hf
        assert render(fmt.prompt_pieces(messages, tools)) == hf, record["id"]


# ---------------------------------------------------------------------------------------------
# Random conversations, including the corners the datasets do not reach

words = st.lists(st.sampled_from(["a", " b", "\n", "  ", "é", "世", "<|im_end|>", "</think>", "{", "}", "\"", "None", ""]),
                 max_size=6).map("".join)
parts = st.lists(st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": words | st.none()}),
    st.fixed_dictionaries({"type": st.just("text")}),
    st.fixed_dictionaries({"type": st.sampled_from(["image", "image_url"]), "image_url": st.just({"url": "x"})}),
    st.fixed_dictionaries({"type": st.sampled_from(["video", "video_url"])}),
), max_size=3)
contents = st.one_of(words, st.none(), parts)
arguments = st.one_of(words, st.dictionaries(st.sampled_from(["a", "b", "ü"]), st.integers() | words, max_size=2))
tool_calls = st.lists(st.builds(lambda i, n, a: {"id": i, "type": "function", "function": {"name": n, "arguments": a}},
                                st.sampled_from(["call_1", "functions.f:0", "x"]), st.sampled_from(["f", "get_w"]), arguments),
                      min_size=1, max_size=2)


@st.composite
def message(draw):
    role = draw(st.sampled_from(["system", "user", "assistant", "tool", "developer"]))
    m = {"role": role, "content": draw(contents)}
    if draw(st.booleans()) and role != "assistant":
        m["name"] = draw(st.sampled_from(["bob", "", "get_w"]))
    if role == "assistant":
        if draw(st.booleans()):
            m["reasoning_content"] = draw(words)
        if draw(st.booleans()):
            m["tool_calls"] = draw(tool_calls)
    if role == "tool" and draw(st.booleans()):
        m["tool_call_id"] = draw(st.sampled_from(["call_1", "functions.f:0"]))
    return m


tools_st = st.one_of(st.none(), st.just([]), st.lists(st.fixed_dictionaries(
    {"type": st.just("function"), "function": st.fixed_dictionaries({"name": st.sampled_from(["f", "g"]),
                                                                      "description": words})}), min_size=1, max_size=2))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=st.lists(message(), max_size=6), tools=tools_st, fmt_name=st.sampled_from(list(TEMPLATES)))
def test_random_conversations_match_the_template(messages, tools, fmt_name):
    fmt = get_format(fmt_name)
    assert render(fmt.prompt_pieces(messages, tools)) == oracle(fmt_name, messages, tools)
    if fmt_name == "kimi-k2.5":
        assert render(k25_preserving().prompt_pieces(messages, tools)) == oracle(fmt_name, messages, tools,
                                                                                 preserve_thinking=True)
