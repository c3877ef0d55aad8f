"""The kit's prompts under a server's serving profile equal what the real server rendered, ID for ID.

``tests/data/servers/<server>-<version>.prompts.jsonl.gz`` (written by ``tools/server_vectors``: ``make
server-vectors``) holds a ``{"meta": ...}`` line, then one request per line with the server's answer:
``status`` and, for 200, the ``prompt_ids`` it rendered (vLLM: ``/v1/chat/completions/render``; SGLang: the
``input_ids`` its chat serving hands the engine). :func:`check_prompts` renders every request with the profile
(normalise, :func:`~kimi_eagle.serving.request.preprocess_request`, the K2.5 format,
:func:`~kimi_eagle.serving.request.served_prompt_pieces`, encode) and asks for equal IDs, or a RecordError where
the server refused the request, for every case not listed as an exception (``{case: reason}``).
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from kimi_eagle.assets import kimi_dir
from kimi_eagle.chat.encoder import PieceEncoder
from kimi_eagle.chat.formats import get_format
from kimi_eagle.records import RecordError
from kimi_eagle.serving.profiles import SERVING_CHOICES, get_profile
from kimi_eagle.serving.request import preprocess_request, prompt_pieces, serve_request, served_prompt_pieces
from kimi_eagle.tokenize.tokenizer import KimiTokenizer

SERVERS = Path(__file__).resolve().parent / "data" / "servers"
MIN_PROMPTS = 500

# case -> why the kit's prompt differs from the server's (none today)
VLLM_033_EXCEPTIONS: dict[str, str] = {}
SGLANG_05_EXCEPTIONS: dict[str, str] = {}


def read_vectors(path: Path) -> tuple[dict, list[dict]]:
    """The meta and the vectors of a ``*.prompts.jsonl.gz`` file."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    return lines[0]["meta"], lines[1:]


def render_ids(request: dict, profile_name: str, tok, cache: dict) -> list[int]:
    """The kit's prompt IDs of ``request`` under the profile (RecordError where the server refuses it)."""
    profile = get_profile(profile_name)
    key = (profile_name, profile.tool_declaration)
    if key not in cache:
        cache[key] = get_format("kimi-k2.5", tok, tool_declaration=profile.tool_declaration), PieceEncoder(tok)
    fmt, enc = cache[key]
    request, messages, tools = serve_request(request, profile)  # the server's refusals first, then its preprocessing
    pieces = served_prompt_pieces(prompt_pieces(fmt, messages, tools, request), profile, tok.special_id_by_text)
    return list(enc.encode(pieces))


def check_prompts(vectors_path: Path, profile_name: str, exceptions: dict[str, str], tok=None) -> dict[str, int]:
    """Every vector of ``vectors_path`` not in ``exceptions`` renders as the server did under ``profile_name``:
    equal ``prompt_ids`` for status 200, a RecordError for any other status (``tok``: the K2.5 tokenizer,
    loaded from the assets when not given). Returns counts by outcome."""
    if tok is None:
        tok = KimiTokenizer.from_dir(kimi_dir())
    _, vectors = read_vectors(vectors_path)
    cases = {v["case"] for v in vectors}
    assert not set(exceptions) - cases, f"exceptions for unknown cases: {sorted(set(exceptions) - cases)}"
    cache: dict = {}
    wrong: list[str] = []
    counts = {"equal": 0, "refused": 0, "excepted": 0}
    for v in vectors:
        case = v["case"]
        if case in exceptions:
            counts["excepted"] += 1
            continue
        try:
            ids, error = render_ids(v["request"], profile_name, tok, cache), None
        except RecordError as e:
            ids, error = None, str(e)
        if v["status"] != 200:
            if error is None:
                wrong.append(f"{case}: the server answered {v['status']} ({v.get('error', '')[:80]}), the kit rendered")
            else:
                counts["refused"] += 1
        elif error is not None:
            wrong.append(f"{case}: the kit refused the request the server rendered: {error[:120]}")
        elif ids != v["prompt_ids"]:
            at = next((i for i, (a, b) in enumerate(zip(ids, v["prompt_ids"])) if a != b),
                      min(len(ids), len(v["prompt_ids"])))
            wrong.append(f"{case}: first difference at token {at}: kit {_tokens(tok, ids, at)}, "
                         f"server {_tokens(tok, v['prompt_ids'], at)}")
        else:
            counts["equal"] += 1
    assert not wrong, f"{len(wrong)} of {len(vectors)} prompts differ under {profile_name}:\n" + "\n".join(wrong[:20])
    return counts


def _tokens(tok, ids: list[int], at: int) -> list[str]:
    return [tok.decode([t]) for t in ids[at:at + 6]]


# the server versions present: every recorded prompts file, named <server>-<major>.<minor> as its profile
EXCEPTIONS_BY_VERSION = {"vllm-0.33": VLLM_033_EXCEPTIONS, "sglang-0.5": SGLANG_05_EXCEPTIONS}
SERVER_CASES = [
    pytest.param(path.name, path.name.split(".prompts")[0], tuple(path.name.split(".prompts")[0].split("-", 1)),
                 EXCEPTIONS_BY_VERSION.get(path.name.split(".prompts")[0], {}), id=path.name.split(".prompts")[0])
    for path in sorted(SERVERS.glob("*.prompts.jsonl.gz"))]


@pytest.mark.parametrize("file, profile_name, server, exceptions", SERVER_CASES)
def test_the_vectors_file_is_the_servers_and_large_enough(file, profile_name, server, exceptions):
    path = SERVERS / file
    if not path.exists():
        pytest.skip(f"{file} not recorded yet")
    meta, vectors = read_vectors(path)
    name, version = server
    assert meta["server"] == name and meta["version"].startswith(version + "."), meta
    assert len(vectors) >= MIN_PROMPTS
    assert len({v["case"] for v in vectors}) == len(vectors)
    assert all(v["status"] != 200 or isinstance(v.get("prompt_ids"), list) for v in vectors)


@pytest.mark.parametrize("file, profile_name, server, exceptions", SERVER_CASES)
def test_the_kit_renders_every_prompt_as_the_server_did(kimi, file, profile_name, server, exceptions):
    path = SERVERS / file
    if not path.exists():
        pytest.skip(f"{file} not recorded yet")
    if profile_name not in SERVING_CHOICES:
        pytest.skip(f"serving profile {profile_name} not defined yet")
    counts = check_prompts(path, profile_name, exceptions, kimi)
    assert counts["equal"] + counts["refused"] + counts["excepted"] == len(read_vectors(path)[1])
    assert counts["excepted"] == len(exceptions)


def test_vllm_033_joins_every_messages_text_parts_and_skips_empty_ones():
    """What vLLM 0.33's ``parse_chat_message_content`` makes of these messages (run on the installed server code,
    string content format): every role's text parts joined with a newline, empty and ``None`` texts skipped;
    a list with another part type is left to the template."""
    messages = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": ""},
                                             {"type": "text", "text": "b"}]},
                {"role": "tool", "tool_call_id": "t", "content": [{"type": "text", "text": "a"},
                                                                  {"type": "text", "text": None}]},
                {"role": "tool", "tool_call_id": "u", "content": []},
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    served, _ = preprocess_request(messages, None, get_profile("vllm-0.33"))
    assert [m["content"] for m in served] == ["a\nb", "a", "", messages[3]["content"]]
    legacy, _ = preprocess_request(messages, None, get_profile("vllm-legacy"))
    assert legacy == messages  # the legacy profiles keep the template's concatenation


def test_marker_text_special_splits_the_rendered_string_not_each_piece(kimi):
    from kimi_eagle.chat.completion import CONTENT, SPECIAL, TEXT

    pieces = [("<|im_user|>", SPECIAL), ("user", TEXT), ("<|im_middle|>", SPECIAL), ("a <|im_", CONTENT),
              ("end|> [EOS]b", CONTENT), ("<|im_end|>", SPECIAL)]
    special = get_profile("vllm-0.33")
    assert served_prompt_pieces(pieces, get_profile("vllm-legacy"), kimi.special_id_by_text) == pieces
    assert served_prompt_pieces(pieces, special, kimi.special_id_by_text) == [
        *pieces[:3], ("a ", CONTENT), ("<|im_end|>", SPECIAL), (" ", CONTENT), ("[EOS]", SPECIAL), ("b", CONTENT),
        pieces[-1]]
    text = "".join(t for t, _ in pieces)
    assert PieceEncoder(kimi).encode(served_prompt_pieces(pieces, special, kimi.special_id_by_text)) == kimi.encode(
        text, allow_special="all")
