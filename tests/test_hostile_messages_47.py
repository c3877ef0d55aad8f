"""Issue 47's unhelpful and still-coerced cases, each reproduced on a small hostile input: a file a user edits (a
profile, a provider table) with a byte-order mark, a missing profile folder, error messages that would echo a 2 MB key
or value, a request logged without its response, a complete logged stream with empty error fields, usage or usage
details given as a list, a provider that is not a string under ``--serving auto``, logprobs of the wrong shape, and a
``--provider-table`` given under a named profile. Every refusal is one short line naming the file and the field."""
import json

import pytest

from kimi_eagle.apps import cli
from kimi_eagle.reconstruct.convert import convert
from kimi_eagle.serving.profiles import load_profile_file, read_profiles
from kimi_eagle.serving.provider_table import TABLE_PATH, TableError, load_table

BOM = b"\xef\xbb\xbf"
BIG = "k" * 2_000_000  # a 2 MB key, name or value: what an error message must never echo whole
HUGE = BIG[:900_000]  # in a profile file, whose cap is 1 MiB
MAX_MESSAGE = 300  # a profile file's error (it names the file by its name)
MAX_TABLE_MESSAGE = 500  # a provider table's (it names the file by its path, and the keys or values known)
HEADER = '[header]\nserver = "vLLM"\nversion = "mine"\nsource = "my notes"\n'
REQUEST = {"model": "moonshotai/kimi-k2.5", "messages": [{"role": "user", "content": "What is the weather in Paris?"}]}


def answer(**extra):
    """An OpenRouter answer to :data:`REQUEST` (its counts are the Kimi tokenizer's), ``extra`` set on it."""
    response = {"id": "gen-1", "object": "chat.completion", "created": 1764600000, "model": "moonshotai/kimi-k2.5",
                "provider": "Moonshot AI",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "Paris is sunny.", "reasoning": "Briefly."}}],
                "usage": {"prompt_tokens": 15, "completion_tokens": 9, "completion_tokens_details": {"reasoning_tokens": 3}}}
    return {**response, **extra}


def write_jsonl(path, items):
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    return path


def reconstructed(tmp_path, items, *options):
    """The rows (by id) ``kimi-eagle reconstruct`` writes for ``items``."""
    import pyarrow.parquet as pq

    out = tmp_path / "out.parquet"
    assert cli.main(["reconstruct", str(write_jsonl(tmp_path / "in.jsonl", items)), "-o", str(out), "--no-progress",
                     *options]) in (0, 1)
    return {row["id"]: row for row in pq.read_table(out).to_pylist()}


def one_short_line(message: str, *names: str, limit: int = MAX_MESSAGE) -> None:
    assert len(message) <= limit and "\n" not in message, (len(message), message[:600])
    for name in names:
        assert name in message, message


# --------------------------------------------------------------------------------------------
# Files a user edits: a byte-order mark, a missing folder, huge keys and values


def test_a_profile_file_starting_with_a_byte_order_mark_is_read_past_it(tmp_path):
    path = tmp_path / "bom.toml"
    path.write_bytes(BOM + (HEADER + '[[profiles]]\nname = "bom-profile"\nbase = "vllm-0.34"\n').encode())
    # read, not registered (load_profile_file would add it to the process's profile registry for later tests)
    assert "bom-profile" in read_profiles(extra=(path,)).profiles  # was: "not TOML: Invalid statement (at line 1, column 1)"


def test_a_provider_table_starting_with_a_byte_order_mark_is_read_past_it(tmp_path):
    path = tmp_path / "table.toml"
    path.write_bytes(BOM + TABLE_PATH.read_bytes())
    assert load_table(path) == load_table(TABLE_PATH)  # was: "not TOML: Invalid statement (at line 1, column 1)"


def test_a_profile_folder_that_is_missing_or_no_folder_is_named_so(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.toml").write_text(HEADER)
    for name, says in (("missing", "no such folder"), ("file.toml", "not a folder"), ("empty", "no *.toml files")):
        with pytest.raises(ValueError) as caught:
            read_profiles(tmp_path / name)  # was "no *.toml files" for all three
        assert str(caught.value) == f"serving profile folder {tmp_path / name}: {says}"


PROFILE_BODIES = {
    "a huge unknown key": ('[[profiles]]\nname = "p"\n' + HUGE + " = 1\n", "profile p: unknown key"),
    "a huge top-level key": (HUGE + " = 1\n", "unknown key"),
    "a huge [header] key": (HUGE + ' = "x"\n[[profiles]]\nname = "p"\n', "[header]: unknown key"),
    "a huge invalid name": (f'[[profiles]]\nname = "{HUGE.upper()}"\n', "profiles[0]"),
    "a huge valid name with an unknown key": (f'[[profiles]]\nname = "{HUGE}"\nwhatever = 1\n', "unknown key 'whatever'"),
    "a huge base": (f'[[profiles]]\nname = "p"\nbase = "{HUGE}"\n', "profile p: unknown base"),
    "a huge alias target": (f'[aliases]\nal = "{HUGE}"\n[[profiles]]\nname = "p"\n', "alias al points to"),
    "a huge stream_profile": (f'[[profiles]]\nname = "p"\nstream_profile = "{HUGE}"\n', "stream_profile"),
    "a huge field value": (f'[[profiles]]\nname = "p"\nsplit_on = "{HUGE}"\n', "profile p: split_on ="),
}


@pytest.mark.parametrize("case", PROFILE_BODIES)
def test_a_profile_error_about_a_huge_key_name_or_value_is_one_short_line(tmp_path, case):
    body, field = PROFILE_BODIES[case]
    (tmp_path / "mine.toml").write_text(HEADER + body)
    with pytest.raises(ValueError) as caught:
        load_profile_file(tmp_path / "mine.toml")  # was up to 900,100 characters
    one_short_line(str(caught.value), "serving profile file mine.toml: ", field)


def _table_entry(**changes):
    entry = {"provider": '"P"', "model": '"m"', "period": '"all"', "status": '"explained"', "profile": '"template"',
             "conventions": "{}", "records": "2", "prompt": "[2, 2]", "completion": "[2, 2]",
             "held_out_prompt": "[1, 1]", "held_out_completion": "[1, 1]", "prompt_residual": '"-"',
             "completion_residual": '"-"', **changes}
    return "[[provider]]\n" + "".join(f"{k} = {v}\n" for k, v in entry.items())


TABLE_TEXTS = {
    "a huge unknown key": (_table_entry(**{BIG: "1"}), "provider entry 1: unknown key(s)"),
    "a huge status": (_table_entry(status=f'"{BIG}"'), "provider entry 1: status"),
    "a huge profile": (_table_entry(profile=f'"{BIG}"'), "provider entry 1: unknown profile"),
    "a huge period": (_table_entry(period=f'"{BIG}"'), "provider entry 1: period"),
    "a huge deployment": (_table_entry(deployment=f'"{BIG}"'), "provider entry 1: deployment"),
    "a huge convention": (_table_entry(conventions=f"{{ {BIG} = 1 }}"), "provider entry 1: conventions"),
    "a huge convention value": (_table_entry(conventions=f'{{ tools = "{BIG}" }}'), "provider entry 1: conventions"),
}


@pytest.mark.parametrize("case", TABLE_TEXTS)
def test_a_table_error_about_a_huge_key_or_value_is_one_short_line(tmp_path, case):
    text, field = TABLE_TEXTS[case]
    (tmp_path / "t.toml").write_text(text)
    with pytest.raises(TableError) as caught:
        load_table(tmp_path / "t.toml")  # was up to 2,000,250 characters
    one_short_line(str(caught.value), f"{tmp_path / 't.toml'}: ", field, limit=MAX_TABLE_MESSAGE)


# --------------------------------------------------------------------------------------------
# Records: a request without its response, a complete stream, usage as a list


def test_convert_of_a_request_logged_beside_a_number_says_so_in_english(tmp_path):
    path = write_jsonl(tmp_path / "log.jsonl", [{"request": REQUEST, "response": 5}])
    (record,) = convert("openai", path)
    assert "a request logged without its response (`response` is an int)" in record["error"]  # was "is a int"
    assert "missing field" not in record["error"]


def test_convert_of_a_logged_stream_whose_chunks_carry_empty_error_fields_is_an_ok_record(tmp_path):
    chunk = {"id": "c1", "object": "chat.completion.chunk", "model": "moonshotai/kimi-k2.5", "provider": "P"}
    lines = [REQUEST,
             {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hi"}}], "error": {}},
             {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
              "error": {"code": None, "message": None}}]
    (record,) = convert("openai-stream", write_jsonl(tmp_path / "chunks.jsonl", lines))
    assert "error" not in record, record["error"]  # never "stream carrying error None: None"
    assert record["response"]["choices"][0]["message"]["content"] == "Hi"


def test_providers_names_usage_given_as_a_list_in_every_logged_shape(tmp_path, capsys):
    usage = [answer()["usage"]]
    items = [{"id": "kit-shape", "request": REQUEST, "response": answer(usage=usage)},
             {**REQUEST, "response": answer(usage=usage)},  # the request's fields beside the response
             {"id": "completion-key", "request": REQUEST, "completion": answer(usage=usage)}]
    path = write_jsonl(tmp_path / "log.jsonl", items)
    assert cli.main(["providers", str(path)]) == 0
    err = capsys.readouterr().err
    for line in (1, 2, 3):  # was: calibrated as unbilled, "not an API record with a request", "no known chat format"
        assert f"left out: line {line}: usage is a list, not an object" in err, err


def test_reconstruct_keeps_a_logged_record_with_usage_as_a_list_and_says_why_it_is_unbilled(kimi, tmp_path):
    usage = [answer()["usage"]]
    rows = reconstructed(tmp_path, [{"id": "kit-shape", "request": REQUEST, "response": answer(usage=usage)},
                                    {**REQUEST, "response": answer(id="flat", usage=usage)},
                                    {"id": "completion-key", "request": REQUEST, "completion": answer(usage=usage)}],
                         "--serving", "template")
    for rid in ("kit-shape", "flat", "completion-key"):  # was: "record has no request object", "response is not ..."
        assert rows[rid]["status"] == "ok" and rows[rid]["billed_completion_tokens"] is None, rows[rid]["error"]
        assert rows[rid]["usage_error"] == "usage is a list, not an object"


@pytest.mark.parametrize("detail, value, unread", [
    ("completion_tokens_details", [{"reasoning_tokens": 3}], "billed_reasoning_tokens"),
    ("completion_tokens_details", "3", "billed_reasoning_tokens"),
    ("prompt_tokens_details", [{"cached_tokens": 4}], "billed_cached_tokens"),
])
def test_usage_details_that_are_not_objects_are_named_where_their_count_is_null(kimi, tmp_path, detail, value, unread):
    usage = {**answer()["usage"], detail: value}
    (row,) = reconstructed(tmp_path, [{"id": "r", "request": REQUEST, "response": answer(usage=usage)}],
                           "--serving", "template").values()
    assert row["status"] == "ok" and row[unread] is None and row["billed_completion_tokens"] == 9
    assert row["usage_error"] == f"usage.{detail} is a {type(value).__name__}, not an object"  # was None: silent


# --------------------------------------------------------------------------------------------
# --serving auto and the provider table


def _tool_record(kimi, rid, provider, serving="vllm-legacy", call_id="chatcmpl-tool-1"):
    """A record with tool history whose billed prompt count is ``serving``'s (by default vLLM's, its tool-call id
    vLLM 0.33's made-up one), so that ``--serving auto`` gives its provider that kind of profile."""
    from kimi_eagle.chat.encoder import PieceEncoder
    from kimi_eagle.chat.formats import get_format
    from kimi_eagle.serving.profiles import get_profile
    from kimi_eagle.serving.request import preprocess_request

    tools = [{"type": "function", "function": {"name": "get", "description": "d", "parameters": {
        "type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "integer"}}}}}]
    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "functions.get:0", "type": "function", "function": {"name": "get", "arguments": '{"a":1}'}}]},
                {"role": "tool", "tool_call_id": "functions.get:0", "content": "ok"}]
    profile = get_profile(serving)
    served, served_tools = preprocess_request(messages, tools, profile)
    fmt = get_format("kimi-k2.5", tool_declaration=profile.tool_declaration)
    n_prompt = len(PieceEncoder(kimi).encode(fmt.prompt_pieces(served, served_tools)))
    call = {"id": call_id, "type": "function", "function": {"name": "get", "arguments": "{}"}}
    return {"id": rid, "request": {"messages": messages, "tools": tools},
            "response": {"provider": provider, "usage": {"prompt_tokens": n_prompt, "completion_tokens": 5},
                         "choices": [{"finish_reason": "tool_calls",
                                      "message": {"role": "assistant", "content": None, "tool_calls": [call]}}]}}


def test_serving_auto_renders_a_record_whose_provider_is_not_a_string_with_the_providerless_group(kimi, tmp_path):
    records = [_tool_record(kimi, "template", "A", "template", "functions.get:1"), _tool_record(kimi, "vllm", "B"),
               _tool_record(kimi, "dict", {"name": "B"}), _tool_record(kimi, "list", ["B"]),
               _tool_record(kimi, "number", 5)]
    rows = reconstructed(tmp_path, records, "--serving", "auto", "--provider-table", "none")
    assert rows["template"]["serving"] == "template" and rows["vllm"]["serving"].startswith("vllm-")  # two groups
    for rid in ("dict", "list", "number"):  # was: "unexpected TypeError: unhashable type: 'dict'" (and 'list')
        assert rows[rid]["status"] == "ok" and rows[rid]["provider"] is None, rows[rid]["error"]


def test_a_broken_provider_table_is_refused_under_a_named_profile_too(tmp_path, capsys):
    table = tmp_path / "broken.toml"
    table.write_text("garbage [[[\n")
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": "r", "request": REQUEST, "response": answer()}])
    code = cli.main(["reconstruct", str(src), "-o", str(tmp_path / "out.parquet"), "--serving", "vllm",
                     "--provider-table", str(table), "--no-progress"])
    assert code == 2 and not (tmp_path / "out.parquet").exists()  # was: exit 0, the table silently ignored
    (line,) = capsys.readouterr().err.strip().splitlines()
    one_short_line(line, f"{table}: not TOML", limit=MAX_TABLE_MESSAGE)


def test_a_good_provider_table_under_a_named_profile_is_said_to_be_unused(kimi, tmp_path, capsys):
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": "r", "request": REQUEST, "response": answer()}])
    assert cli.main(["reconstruct", str(src), "-o", str(tmp_path / "out.parquet"), "--serving", "vllm",
                     "--provider-table", str(TABLE_PATH), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert f"warning: --provider-table {TABLE_PATH} is not used: only --serving auto reads it" in err


# --------------------------------------------------------------------------------------------
# Logprobs of the wrong shape


@pytest.mark.parametrize("logprobs", [
    [{"token": "Paris", "logprob": -0.1}],  # the entries themselves, not {"content": [...]}
    [],
    [[1, 2]],
    {"tokens": ["Paris"], "token_logprobs": [-0.1]},  # the legacy completions shape
    {"content": "Paris is sunny."},
    7,
])
def test_logprobs_of_the_wrong_shape_are_flagged_unreadable(kimi, tmp_path, logprobs):
    response = answer()
    response["choices"][0]["logprobs"] = logprobs
    (row,) = reconstructed(tmp_path, [{"id": "r", "request": REQUEST, "response": response}], "--serving", "template").values()
    assert row["status"] == "ok" and row["ids_source"] == "text"
    assert "logprobs_unreadable" in row["flags"]  # was: no flag for a list or the legacy shape


@pytest.mark.parametrize("logprobs", [None, {}, {"content": None, "refusal": None}, {"content": []}])
def test_no_logprobs_is_no_flag(kimi, tmp_path, logprobs):
    response = answer()
    response["choices"][0]["logprobs"] = logprobs
    (row,) = reconstructed(tmp_path, [{"id": "r", "request": REQUEST, "response": response}], "--serving", "template").values()
    assert row["status"] == "ok" and not [f for f in row["flags"] if f.startswith("logprobs_")]
