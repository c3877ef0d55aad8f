"""Hostile chat templates (a model folder is anyone's): bounded in steps, time and size in `generate`/`serve`
(``Engine.prompt_ids``) and `reconstruct --format hf-template` (``HFTemplateFormat``).

Each case is named after what it plants; each is refused with a message in bounded time and memory (tracemalloc
peak), and real templates render byte-identically with and without the bounds."""
from __future__ import annotations

import json
import re
import shutil
import time
import tracemalloc

import pytest
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kimi_eagle.assets import asset_path, stories_dir
from kimi_eagle.chat.formats import HFTemplateFormat
from kimi_eagle.chat.template_sandbox import TemplateLimitError, TemplateLimits, bounded_template
from kimi_eagle.engine.local import Engine, TemplateRefused, sandboxed_template
from kimi_eagle.records import RecordError

MESSAGES = [{"role": "user", "content": "Once upon a time"}]

# case -> (template, a part of the message it is refused with)
HOSTILE = {
    "nested_range_100000_loops_with_output": (
        "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}", "exceeded"),
    "nested_range_100000_loops_without_output": (
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "exceeded"),
    "three_nested_loops_over_a_set_range": (
        "{% set r = range(1000) %}{% for a in r %}{% for b in r %}{% for c in r %}{% endfor %}{% endfor %}{% endfor %}",
        "exceeded"),
    "nested_loops_over_a_long_string": (
        "{% set s = 'a' * 100000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}", "exceeded"),
    "loop_over_messages_repeated": ("{% for m in messages * 5000000 %}{% endfor %}", "items * "),
    "list_literal_doubling_then_printed": (
        "{% set ns = namespace(x=['ab']) %}{% for i in range(60) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ ns.x }}",
        "more than"),
    "list_literal_doubling_then_tojson": (
        "{% set ns = namespace(x=['ab']) %}{% for i in range(60) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}"
        "{{ ns.x|tojson }}", "more than"),
    "list_literal_doubling_then_joined": (
        "{% set ns = namespace(x=['ab']) %}{% for i in range(60) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}"
        "{{ ns.x ~ '' }}", "more than"),
    "shared_big_strings_times_8000000": ("{{ (['a' * 1000000] * 8000000)|tojson }}", "items * "),
    "string_times_50000000": ("{{ 'a' * 50000000 }}", "items * 50000000"),
    "number_times_string": ("{{ 50000000 * 'a' }}", "items * "),
    "list_times_50000000": ("{{ ([1] * 50000000)|length }}", "items * 50000000"),
    "power_tower": ("{{ 2 ** 100000000 }}", "too large a power"),
    "power_of_a_float": ("{{ 10.5 ** 100000 }}", "too large a power"),
    "center_to_a_billion": ("{{ 'x'|center(1000000000) }}", "past the size bound"),
    "indent_by_a_billion": ("{{ 'x\ny'|indent(1000000000) }}", "past the size bound"),
    "str_ljust_method": ("{{ 'x'.ljust(1000000000) }}", "past the size bound"),
    "str_zfill_method": ("{{ 'x'.zfill(1000000000) }}", "past the size bound"),
    "expandtabs_to_a_billion": ("{{ ('\\t' * 1000).expandtabs(1000000) }}", "expandtabs()"),
    "format_method_width": ("{{ '{:>999999999}'.format(1) }}", "format width"),
    "format_method_width_from_an_argument": ("{{ '{:>{w}}'.format(1, w=999999999) }}", "past the size bound"),
    "percent_format_width": ("{{ '%999999999d' % 1 }}", "format width"),
    "format_filter_width": ("{{ '%999999999d'|format(1) }}", "format width"),
    "tilde_doubling_in_a_loop": (
        "{% set ns = namespace(x='ab') %}{% for i in range(60) %}{% set ns.x = ns.x ~ ns.x %}{% endfor %}", "~ concatenation"),
    "plus_doubling_a_list": (
        "{% set ns = namespace(x=[1]) %}{% for i in range(60) %}{% set ns.x = ns.x + ns.x %}{% endfor %}", ""),
    "plus_doubling_a_string": (
        "{% set ns = namespace(x='ab') %}{% for i in range(60) %}{% set ns.x = ns.x + ns.x %}{% endfor %}", "concatenation"),
    "replace_filter_amplifies": ("{{ ('a' * 1000000)|replace('a', 'a' * 1000000) }}", "replace()"),
    "replace_method_amplifies": ("{{ ('a' * 1000000).replace('a', 'a' * 1000000) }}", "replace()"),
    "join_method_amplifies": ("{{ ('a' * 1000000).join(['b'] * 100000) }}", "join()"),
    "join_filter_amplifies": ("{{ (['b'] * 100000)|join('a' * 1000000) }}", "join()"),
    "output_of_9_million_characters": ("{% for i in range(90) %}{{ 'a' * 100000 }}{% endfor %}", "output exceeded"),
    "recursive_loop_fanning_out": ("{% for x in [1] recursive %}{{ loop(range(100000)) }}{% endfor %}", ""),
    "macro_calling_itself": ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "recursed too deeply"),
    "macro_fanning_out": ("{% macro f(n) %}{% for i in range(100) %}{{ f(n + 1) }}{% endfor %}{% endmacro %}{{ f(0) }}", ""),
    "tojson_of_a_huge_list": ("{{ ([1] * 7000000)|tojson }}", "items * "),
    "filter_chain_sum_of_range": ("{% for i in range(100000) %}{{ range(100000)|sum }}{% endfor %}", "exceeded"),
    "a_structure_of_a_million_items_printed": ("{{ (range(1000)|list) * 1000 }}", "more than"),
    "wordwrap_width_a_billion": ("{{ 'a b'|wordwrap(1000000000) }}", "past the size bound"),
    "truncate_to_a_billion": ("{{ 'a'|truncate(1000000000) }}", "past the size bound"),
}

ESCAPES = {  # the sandbox's own refusals, still in force
    "mro_subclasses": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "cycler_init_globals": "{{ cycler.__init__.__globals__.os }}",
    "append_to_messages": "{{ messages.append(1) }}",
    "mutating_a_dict": "{{ messages[0].update({'role': 'system'}) }}",
    "func_globals_of_a_filter": "{{ (messages|first).__class__.__init__.__globals__ }}",
}
QUIET = {  # unsafe lookups the sandbox answers with an empty undefined: nothing leaks
    "globals_of_a_macro": "{% macro m() %}{% endmacro %}[{{ m.__globals__ }}]",
    "format_attribute_escape": "[{{ '{0.__class__}'.format(1) }}]",
}


def _raise(message: str) -> None:
    raise TemplateError(message)


def _measured(fn):
    """``(exception or None, seconds, peak MiB of Python allocations)`` of ``fn()``."""
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        fn()
        error = None
    except Exception as e:  # noqa: BLE001 - the caller asserts the type
        error = e
    seconds = time.monotonic() - t0
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return error, seconds, peak


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_each_hostile_template_is_refused_in_bounded_time_and_memory(case):
    source, message = HOSTILE[case]
    template = bounded_template(source, _raise)
    error, seconds, peak = _measured(lambda: template.render(messages=MESSAGES))
    assert isinstance(error, TemplateLimitError), f"{case}: {error!r}"
    assert message in str(error) and str(error).startswith("chat template")
    assert seconds < 120 and peak < 200, f"{case}: {seconds:.1f} s, {peak:.0f} MiB"  # time: a hang guard


@pytest.mark.parametrize("case", sorted(ESCAPES))
def test_sandbox_escapes_stay_refused(case):
    with pytest.raises(SecurityError):
        bounded_template(ESCAPES[case], _raise).render(messages=MESSAGES)


@pytest.mark.parametrize("case", sorted(QUIET))
def test_unsafe_lookups_print_nothing(case):
    assert bounded_template(QUIET[case], _raise).render(messages=MESSAGES) == "[]"


def test_the_bounds_are_per_render_and_limits_are_the_templates_own():
    small = bounded_template("{% for i in range(50) %}{{ i }}{% endfor %}", _raise, TemplateLimits(steps=40))
    with pytest.raises(TemplateLimitError, match="40 steps"):
        small.render()
    ok = bounded_template("{% for i in range(50) %}.{% endfor %}", _raise)
    assert [ok.render() for _ in range(3)] == ["." * 50] * 3  # a fresh budget every render
    slow = bounded_template("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                            _raise, TemplateLimits(steps=10**12, seconds=0.5))
    error, seconds, _ = _measured(slow.render)
    assert isinstance(error, TemplateLimitError) and "0.5 s" in str(error) and seconds < 60


def _plain_sandbox(source: str):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals["raise_exception"] = _raise
    return env.from_string(source)


CONVERSATIONS = [
    [{"role": "user", "content": "Weather in Paris?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "<think>greet</think>Hello", "reasoning_content": "greet"},
     {"role": "user", "content": "Tools?"}],
    [{"role": "user", "content": "Call it"},
     {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "id": "functions.get:0",
                                                          "function": {"name": "get", "arguments": {"q": "x"}}}]},
     {"role": "tool", "tool_call_id": "functions.get:0", "content": "sunny"}],
]
TOOLS = [{"type": "function", "function": {"name": "get", "description": "d", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize("asset", ["tokenizers/qwen3", "tokenizers/deepseek-v3", "kimi/tokenizer_config.k2-instruct.json",
                                   "kimi/templates/kimi-k2.5.jinja"])
def test_real_templates_render_identically_with_the_bounds(asset):
    path = asset_path(asset)
    if path.suffix == ".jinja":
        source = path.read_text()
    else:
        config = path if path.suffix == ".json" else path / "tokenizer_config.json"
        source = json.loads(config.read_text())["chat_template"]
    for messages in CONVERSATIONS:
        for tools in (None, TOOLS):
            ctx = dict(messages=messages, tools=tools, add_generation_prompt=True, bos_token="<s>", eos_token="</s>",
                       preserve_thinking=False)
            assert bounded_template(source, _raise).render(**ctx) == _plain_sandbox(source).render(**ctx)


def _model_with_template(tmp_path, template: str):
    model = tmp_path / "model"
    shutil.copytree(stories_dir(), model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    return model


@pytest.mark.parametrize("case", ["nested_range_100000_loops_with_output", "string_times_50000000",
                                  "tilde_doubling_in_a_loop", "macro_calling_itself"])
def test_generate_and_serve_refuse_the_template_per_request(tmp_path, case):
    """``Engine.prompt_ids`` (what `generate` and every `serve` chat request call) answers TemplateRefused."""
    engine = Engine.from_dir(_model_with_template(tmp_path, HOSTILE[case][0]), chat_format="hf-template")
    error, seconds, peak = _measured(lambda: engine.prompt_ids(MESSAGES))
    assert isinstance(error, TemplateRefused) and "chat template of" in str(error), repr(error)
    assert seconds < 120 and peak < 200  # time: a hang guard


def test_generate_cli_writes_an_error_record_for_the_hostile_template(tmp_path, capsys):
    from kimi_eagle.apps.cli import main

    model = _model_with_template(tmp_path, HOSTILE["nested_range_100000_loops_with_output"][0])
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "messages": MESSAGES}) + "\n")
    out = tmp_path / "e.jsonl"
    t0 = time.monotonic()
    main(["generate", str(prompts), "-o", str(out), "--model-dir", str(model), "--format", "hf-template",
          "--max-tokens", "2"])
    assert time.monotonic() - t0 < 60  # a hang guard: the template's own 5 s limit ends it well before
    record = json.loads(out.read_text())
    # whichever of the template's limits fires first (its steps, or its 5 s on a slow or loaded machine) is a refusal:
    # the verdict must not depend on the machine's speed (issue 47)
    assert record["id"] == "a" and re.search(r"chat template exceeded (2000000 steps|5 s)", record["error"]), record


@pytest.mark.parametrize("case", ["nested_range_100000_loops_without_output", "string_times_50000000",
                                  "replace_method_amplifies", "output_of_9_million_characters"])
def test_reconstruct_hf_template_refuses_the_template_per_record(case):
    fmt = HFTemplateFormat(HOSTILE[case][0], ["<|im_end|>"], "<|im_end|>")
    error, seconds, peak = _measured(lambda: fmt.prompt_pieces(MESSAGES))
    assert isinstance(error, RecordError) and str(error).startswith("chat template"), repr(error)
    assert seconds < 120 and peak < 200  # time: a hang guard


def test_big_numbers_print_and_filter_as_before():
    assert bounded_template("{{ 10 ** 12 }} {{ 4999950000|string }} {{ range(100000)|sum }}", _raise).render() == (
        "1000000000000 4999950000 4999950000")


def test_the_engine_template_is_the_bounded_one():
    template = sandboxed_template("{{ 'a' * 50000000 }}")
    with pytest.raises(TemplateLimitError):
        template.render()
