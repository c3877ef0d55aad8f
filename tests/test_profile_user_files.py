"""A user's own profile file (``--serving PATH.toml``) is read and checked as the shipped ones are, together with
them; a path that is no profile file (a folder, a device, a dangling link, a link loop, a huge or deeply nested
file, a 5,000-long base chain) is one line naming the file, never a traceback or a hang."""
import os
import subprocess
import sys

import pytest

from kimi_eagle.serving.profiles import PROFILES, get_profile, load_profile_file, read_profiles

HEADER = '[header]\nserver = "vLLM"\nversion = "0.33.0 at my site"\nsource = "my notes"\n'


def test_a_user_profile_file_bases_on_a_shipped_profile_and_is_used_by_name(tmp_path):
    path = tmp_path / "my-vllm.toml"
    path.write_text(HEADER + '[[profiles]]\nname = "my-vllm"\nbase = "vllm-0.33"\nspaces_between_special_tokens = false\n')
    profile = get_profile(str(path))
    assert profile.name == "my-vllm" and profile.server == "vLLM" and profile.version == "0.33.0 at my site"
    assert profile.spaces_between_special_tokens is False
    assert profile.answer_rules == PROFILES["vllm-0.33"].answer_rules  # everything else from its base
    assert get_profile("my-vllm") is profile and get_profile(str(path)) is profile  # loaded once


@pytest.mark.parametrize("body, message", [
    ('[[profiles]]\nname = "vllm-0.33"\n', "defined twice"),
    ('[[profiles]]\nname = "x-unknown-base"\nbase = "nope"\n', "unknown base"),
    ('[[profiles]]\nname = "x-bad-field"\nsplit_on = "bytes"\n', "split_on"),
    ('[[profiles]]\nname = "x-bad-key"\nwhatever = 1\n', "whatever"),
])
def test_a_user_profile_file_with_a_mistake_is_one_line_naming_it(tmp_path, body, message):
    path = tmp_path / "mine.toml"
    path.write_text(HEADER + body)
    with pytest.raises(ValueError, match=f"serving profile file mine.toml: .*{message}"):
        load_profile_file(path)


def test_paths_that_are_no_profile_file_are_refused_in_one_line(tmp_path):
    (tmp_path / "folder.toml").mkdir()
    (tmp_path / "dangling.toml").symlink_to(tmp_path / "missing.toml")
    (tmp_path / "loop.toml").symlink_to(tmp_path / "loop.toml")
    (tmp_path / "huge.toml").write_bytes(b"#" * (2 << 20))
    (tmp_path / "deep.toml").write_text(HEADER + "x = " + "[" * 5000 + "]" * 5000 + "\n")
    cases = ["folder.toml", "dangling.toml", "loop.toml", "huge.toml", "deep.toml"]
    for name in cases:
        with pytest.raises(ValueError, match=f"serving profile file {name}: "):
            load_profile_file(tmp_path / name)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_a_device_is_refused_without_reading_it(tmp_path):
    (tmp_path / "zero.toml").symlink_to("/dev/zero")
    with pytest.raises(ValueError, match="not a regular file"):
        load_profile_file(tmp_path / "zero.toml")


def test_a_5000_long_base_chain_resolves_without_recursion(tmp_path):
    folder = tmp_path / "profiles"
    folder.mkdir()
    entries = ['[[profiles]]\nname = "p0"\nsplit_on = "text"\n']
    entries += [f'[[profiles]]\nname = "p{i}"\nbase = "p{i - 1}"\n' for i in range(1, 5000)]
    (folder / "chain.toml").write_text(HEADER + "".join(entries))
    assert read_profiles(folder).profiles["p4999"].split_on == "text"
    (folder / "chain.toml").write_text(HEADER + "".join(entries) + '[[profiles]]\nname = "q"\nbase = "q"\n')
    with pytest.raises(ValueError, match="base cycle"):
        read_profiles(folder)


def test_the_command_line_takes_a_profile_file_and_names_a_bad_one(tmp_path):
    good = tmp_path / "site.toml"
    good.write_text(HEADER + '[[profiles]]\nname = "site"\nbase = "sglang-0.5"\n')
    ids = "163607, 19180, 163586"  # </think> Hi <|im_end|>
    run = subprocess.run([sys.executable, "-m", "kimi_eagle", "parse-completion", "--ids", ids, "--serving", str(good)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("not toml [")
    run = subprocess.run([sys.executable, "-m", "kimi_eagle", "parse-completion", "--ids", ids, "--serving", str(bad)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and "serving profile file bad.toml: not TOML" in run.stderr
    assert "Traceback" not in run.stderr
