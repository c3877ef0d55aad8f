"""Serving profiles are data files (kimi_eagle/serving/profiles/*.toml): every shipped file loads, the profiles are
the ones the code defined before they became files, aliases resolve, and every mistake in a file is refused
with one line naming the file."""
import json
import re
from dataclasses import fields

import pytest

from kimi_eagle.assets import REPO_ROOT
from kimi_eagle.serving.auto import CANDIDATES as CHOICE_CANDIDATES
from kimi_eagle.serving.profiles import (
    ALIASES,
    CANDIDATES,
    PROFILE_DIR,
    PROFILES,
    SERVING_CHOICES,
    ServingProfile,
    get_profile,
    load_profiles,
    read_profiles,
)

# The profiles as kimi_eagle/serving/request.py defined them in code before the files (its dict literals, with
# _MOONSHOT spelled out), under their new names; every other field is the ServingProfile default.
_MOONSHOT = dict(tool_declaration="ts", sort_tools=True, drop_none_keys=True)
BEFORE_FILES = {
    "template": {},
    "moonshot": _MOONSHOT,
    "vllm-legacy": dict(**_MOONSHOT, history_arguments="reserialise", empty_arguments="empty_object",
                        invalid_arguments="reject", nonobject_arguments="parsed", split_on="text",
                        finish_on_section="always", unterminated_call="drop", name_rule="last_dot", strip=True),
    "sglang-legacy": dict(**_MOONSHOT, history_arguments="reserialise", empty_arguments="reject",
                          invalid_arguments="reject", nonobject_arguments="reject", tool_part_join=" ", split_on="text",
                          finish_on_section="on_stop", unterminated_call="drop", id_chars="word_dot", args_object=True,
                          id_rule="sglang", strip=True, strip_reasoning=True),
}
METADATA = ("server", "version", "streaming")
# the fields added since (server versions read off their recorded answers: docs/servers.md); their defaults leave
# the profiles above as they were
SINCE = {"answer_rules": "legacy", "stream_profile": "", "part_join_roles": "tool", "empty_parts": "keep",
         "marker_text": "text"}
HEADER = '[header]\nserver = "S"\nversion = "1"\nsource = "read from here"\n'


def write(folder, **files):
    """``files``: ``{"stem": "TOML body"}`` (a header is prepended unless the body has one)."""
    for stem, body in files.items():
        (folder / f"{stem}.toml").write_text(body if "[header]" in body else HEADER + body)
    return folder


# --------------------------------------------------------------------------------------------
# The shipped files


def test_every_shipped_file_loads_and_defines_a_profile_or_an_alias():
    paths = sorted(PROFILE_DIR.glob("*.toml"))
    assert [p.name for p in paths] == ["moonshot.toml", "sglang-0.5.toml", "sglang-legacy.toml", "template.toml",
                                       "vllm-0.33.toml", "vllm-0.34.toml", "vllm-legacy.toml"]
    profiles, aliases = load_profiles()
    assert (profiles, aliases) == (PROFILES, ALIASES)
    for path in paths:  # a file is named after the server version it holds
        assert path.stem in profiles, path.name


def test_the_legacy_profiles_are_the_ones_the_code_defined_before_the_files():
    assert set(BEFORE_FILES) <= set(PROFILES)
    defaults = {f.name: f.default for f in fields(ServingProfile) if f.name != "name" and f.name not in METADATA}
    for name, set_in_code in BEFORE_FILES.items():
        p = PROFILES[name]
        expected = {**defaults, **set_in_code}
        assert {k: getattr(p, k) for k in expected} == expected, name
        assert p.name == name and p.spaces_between_special_tokens is False and p.streaming is False
        assert {k: getattr(p, k) for k in SINCE} == SINCE, name


def test_each_profile_carries_its_files_server_and_version():
    assert (PROFILES["vllm-legacy"].server, PROFILES["vllm-legacy"].version) == (
        "vLLM", "main snapshot, Dec 2026 (transcribed)")
    assert (PROFILES["sglang-legacy"].server, PROFILES["sglang-legacy"].version) == (
        "SGLang", "main snapshot, Dec 2026 (transcribed)")
    assert all(p.server and p.version for p in PROFILES.values())  # the header's, not the base's (moonshot)


def test_aliases_resolve_to_their_profiles():
    assert ALIASES == {"vllm": "vllm-0.34", "sglang": "sglang-0.5"}  # the short names are the newest versions
    assert get_profile("vllm") is PROFILES["vllm-0.34"] and get_profile("sglang") is PROFILES["sglang-0.5"]
    assert get_profile("vllm", spaces_between_special_tokens=False).name == "vllm-0.34"
    assert SERVING_CHOICES == (*PROFILES, "sglang", "vllm")
    with pytest.raises(ValueError, match=r"unknown serving profile 'vllm-0\.1'; known: .*\(aliases: "):
        get_profile("vllm-0.1")


def test_auto_candidates_are_canonical_names_in_rank_order():
    assert CANDIDATES == CHOICE_CANDIDATES == ("template", "moonshot", "vllm-0.33", "vllm-0.33-nospace", "vllm-legacy",
                                               "sglang-0.5", "sglang-legacy")
    assert not any(PROFILES[n].streaming for n in CANDIDATES)  # a streamed record takes its profile's stream_profile


def test_the_cli_accepts_names_and_aliases(capsys):
    from kimi_eagle.apps.cli import main

    text = "r</think><|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{"
    answers = {}
    for serving in ("vllm", "vllm-0.34", "vllm-0.33", "vllm-legacy", "sglang", "sglang-0.5", "sglang-legacy"):
        assert main(["parse-completion", "--text", text, "--serving", serving]) == 0
        answers[serving] = capsys.readouterr().out
    assert answers["vllm"] == answers["vllm-0.34"] == answers["vllm-0.33"] != answers["vllm-legacy"]
    assert answers["sglang"] == answers["sglang-0.5"] != answers["sglang-legacy"]
    with pytest.raises(SystemExit):
        main(["parse-completion", "--text", text, "--serving", "auto"])  # auto: reconstruct only, as before


def test_the_docs_list_every_shipped_profile_and_alias():
    servers = (REPO_ROOT / "docs" / "servers.md").read_text()
    section = servers.split("## The profiles", 1)[1].split("\n## ", 1)[0]
    header = next(line for line in section.splitlines() if line.startswith("| convention |"))
    assert sorted(re.findall(r"\| `([^`]+)`", header)) == sorted(PROFILES)  # one column per profile
    for alias, name in ALIASES.items():
        assert f"`{name}` (alias `{alias}`)" in header
    reconstruct = (REPO_ROOT / "docs" / "reconstruct.md").read_text().split("## Serving profiles", 1)[1]
    for path in PROFILE_DIR.glob("*.toml"):
        assert f"`{path.name}`" in reconstruct, path.name


def test_a_profile_round_trips_through_the_resume_manifest():
    """``--serving auto`` stores each group's profile as its fields (ReconstructOptions.serving_by_group)."""
    p = get_profile("sglang")
    assert ServingProfile(**json.loads(json.dumps(p.to_dict()))) == p


# --------------------------------------------------------------------------------------------
# Inheritance, order


def test_base_inherits_fields_from_another_file_and_the_header_is_the_files_own(tmp_path):
    write(tmp_path, a='[[profiles]]\nname = "a"\ncandidate = 2\nsplit_on = "text"\nstrip = true\n',
          b='[header]\nserver = "B server"\nversion = "2"\nsource = "x"\nnotes = "n"\n'
            '[aliases]\nbee = "b-stream"\n'
            '[[profiles]]\nname = "b"\nbase = "a"\nstrip = false\ntool_part_join = " "\n'
            '[[profiles]]\nname = "b-stream"\nbase = "b"\nstreaming = true\ncandidate = 1\n')
    profiles, aliases = load_profiles(tmp_path)
    assert list(profiles) == ["b-stream", "a", "b"]  # candidates by rank, then the rest in file order
    b, stream = profiles["b"], profiles["b-stream"]
    assert (b.split_on, b.strip, b.tool_part_join, b.server, b.version) == ("text", False, " ", "B server", "2")
    assert (stream.split_on, stream.tool_part_join, stream.streaming) == ("text", " ", True)
    assert profiles["a"].tool_part_join is None and profiles["a"].server == "S"
    assert aliases == {"bee": "b-stream"} and read_profiles(tmp_path).candidates == ("b-stream", "a")


def test_aliases_may_be_an_inline_table_before_the_header(tmp_path):
    write(tmp_path, x='aliases = {v = "x"}\n' + HEADER + '[[profiles]]\nname = "x"\n')
    assert load_profiles(tmp_path)[1] == {"v": "x"}


# --------------------------------------------------------------------------------------------
# Mistakes: ValueError, one line, naming the file

MISTAKES = [
    ("unknown key", {"x": '[[profiles]]\nname = "x"\nsplit_onn = "text"\n'},
     "x.toml: profile x: unknown key 'split_onn'"),
    ("header field in an entry", {"x": '[[profiles]]\nname = "x"\nserver = "vLLM"\n'},
     "x.toml: profile x: unknown key 'server' (set in [header])"),
    ("unknown top-level key", {"x": 'alias = {a = "x"}\n' + HEADER + '[[profiles]]\nname = "x"\n'},
     "x.toml: unknown key 'alias'; known: header, aliases, profiles"),
    ("unknown header key", {"x": '[header]\nserver = "S"\nversion = "1"\nsource = "s"\nauthor = "me"\n'},
     "x.toml: [header]: unknown key 'author'"),
    ("missing header", {"x": '[header]\nserver = "S"\nversion = "1"\n'}, "x.toml: [header]: no source"),
    ("string for a bool", {"x": '[[profiles]]\nname = "x"\nstrip = "true"\n'},
     "x.toml: profile x: strip = 'true' is a string, expected a boolean"),
    ("bool for a string", {"x": '[[profiles]]\nname = "x"\nsplit_on = true\n'},
     "x.toml: profile x: split_on = True is a boolean, expected a string"),
    ("int for the optional string", {"x": '[[profiles]]\nname = "x"\ntool_part_join = 1\n'},
     "x.toml: profile x: tool_part_join = 1 is an integer, expected a string"),
    ("bool for the detokenizer setting", {"x": '[[profiles]]\nname = "x"\nspaces_between_special_tokens = "no"\n'},
     "x.toml: profile x: spaces_between_special_tokens = 'no' is a string, expected a boolean"),
    ("value outside the choices", {"x": '[[profiles]]\nname = "x"\nsplit_on = "bytes"\n'},
     "x.toml: profile x: split_on = 'bytes'; known: ids, text"),
    ("candidate not a rank", {"x": '[[profiles]]\nname = "x"\ncandidate = true\n'},
     "x.toml: profile x: candidate = True is a boolean, expected a rank"),
    ("two candidates of one rank", {"x": '[[profiles]]\nname = "x"\ncandidate = 1\n[[profiles]]\nname = "y"\ncandidate = 1\n'},
     "x.toml: profile y: candidate = 1 is also x's rank"),
    ("duplicate name in one file", {"x": '[[profiles]]\nname = "x"\n[[profiles]]\nname = "x"\n'},
     "x.toml: profile x is defined twice (also in this file)"),
    ("duplicate name across files", {"a": '[[profiles]]\nname = "x"\n', "b": '[[profiles]]\nname = "x"\n'},
     "b.toml: profile x is defined twice (also in a.toml)"),
    ("entry without a name", {"x": '[[profiles]]\nstrip = true\n'}, "x.toml: profiles[0] has no name"),
    ("name not lowercase", {"x": '[[profiles]]\nname = "vLLM 0.33"\n'}, "x.toml: profiles[0] 'vLLM 0.33': names are"),
    ("reserved name", {"x": '[[profiles]]\nname = "auto"\n'}, "x.toml: profiles[0] 'auto' is reserved"),
    ("unknown base", {"x": '[[profiles]]\nname = "x"\nbase = "vllm"\n'},
     "x.toml: profile x: unknown base 'vllm'"),
    ("base cycle", {"a": '[[profiles]]\nname = "a"\nbase = "b"\n', "b": '[[profiles]]\nname = "b"\nbase = "a"\n'},
     "a.toml: profile a: base cycle a -> b -> a"),
    ("base of itself", {"x": '[[profiles]]\nname = "x"\nbase = "x"\n'}, "x.toml: profile x: base cycle x -> x"),
    ("alias to nothing", {"x": '[aliases]\nvllm = "vllm-0.33"\n[[profiles]]\nname = "x"\n'},
     "x.toml: alias vllm points to 'vllm-0.33', which is no profile"),
    ("alias shadowing a name", {"a": '[[profiles]]\nname = "vllm"\n', "b": '[aliases]\nvllm = "vllm"\n'},
     "b.toml: alias vllm is also a profile name (in a.toml)"),
    ("duplicate alias", {"a": '[aliases]\nv = "x"\n[[profiles]]\nname = "x"\n', "b": '[aliases]\nv = "x"\n'},
     "b.toml: alias v is defined twice (also in a.toml)"),
    ("not TOML", {"x": '[[profiles]]\nname = x\n'}, "x.toml: not TOML: "),
]


@pytest.mark.parametrize("files,message", [m[1:] for m in MISTAKES], ids=[m[0] for m in MISTAKES])
def test_a_mistake_in_a_file_is_one_line_naming_the_file(tmp_path, files, message):
    with pytest.raises(ValueError) as e:
        load_profiles(write(tmp_path, **files))
    text = str(e.value)
    assert text.startswith("serving profile file ") and "\n" not in text, text
    assert message in text, text


def test_an_empty_folder_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"serving profile folder .*: no \*\.toml files"):
        load_profiles(tmp_path)


def test_a_stream_profile_must_name_a_streaming_profile(tmp_path):
    write(tmp_path, a='[[profiles]]\nname = "a"\nstream_profile = "b"\n\n[[profiles]]\nname = "b"\n')
    with pytest.raises(ValueError, match=r"^serving profile file a\.toml: profile a: stream_profile 'b' is no "
                                         r"streaming profile$"):
        load_profiles(tmp_path)
    write(tmp_path, a='[[profiles]]\nname = "a"\nstream_profile = "b"\n\n[[profiles]]\nname = "b"\nstreaming = true\n')
    assert load_profiles(tmp_path)[0]["a"].stream_profile == "b"


def test_every_server_version_names_its_streaming_profile():
    for p in PROFILES.values():
        if p.answer_rules != "legacy" and not p.streaming:
            assert PROFILES[p.stream_profile].streaming and PROFILES[p.stream_profile].answer_rules == p.answer_rules
