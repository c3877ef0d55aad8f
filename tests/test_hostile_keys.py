"""The API key in every form a server might echo it (issue 37): base64 at any alignment, hex, HTML entities, double
percent, provider masks and ``KEY[:20]...`` cuts, split between reasoning and content, between choices, across
logprob tokens and their bytes -- no run of 6 or more of the key's secret characters (the part after the public
``sk-or-v1-`` prefix) survives in any record, summary, stdout or stderr. The checker decodes with the standard
library (``base64``, ``html``, ``urllib.parse``), independently of the redactor."""
import base64
import binascii
import html
import json
import os
import re
import subprocess
import sys
import urllib.parse
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from upstream_sse import Upstream, answer

from kimi_eagle.apps.api.collect import CollectConfig, collect
from kimi_eagle.apps.api.redact import REDACTED, Redactor, split_key
from kimi_eagle.io import read_jsonl, write_jsonl

pytestmark = pytest.mark.timeout(180)
PREFIX = "sk-or-v1-"
SECRET = PREFIX + "Q7vX2" + uuid.uuid4().hex + "3hYd"  # mixed case, so hex and base64 views differ
PART = SECRET[len(PREFIX):]
GRAMS = {PART[i:i + 6] for i in range(len(PART) - 5)}
FAST = dict(concurrency=2, max_attempts=1, backoff_base=0.01, backoff_max=0.05, timeout=10, progress=False)


def _views(text: str) -> list[str]:
    """``text`` and what the standard library decodes it to: percent (up to 3 times), HTML entities (twice), JSON
    and ``\\x`` escapes, and every base64 (4 alignments, either alphabet) and hex run (2 alignments) in it."""
    views = [text]
    for decode in (urllib.parse.unquote, html.unescape):
        v = text
        for _ in range(3):
            v = decode(v)
            views.append(v)
    def unescape(v: str) -> str:
        return re.sub(r"\\+(?:u([0-9a-fA-F]{4})|x([0-9a-fA-F]{2}))", lambda m: chr(int(m[1] or m[2], 16)), v)

    views.append(unescape(text))
    views.append(unescape(html.unescape(urllib.parse.unquote(text))))  # every form at once (mixed per character)
    for run in re.findall(r"[A-Za-z0-9+/_-]{8,}", text):
        for off in range(4):
            part = run[off:].replace("-", "+").replace("_", "/")
            try:
                views.append(base64.b64decode(part[:len(part) // 4 * 4]).decode("latin-1"))
            except binascii.Error:
                pass
    for run in re.findall(r"(?:[0-9a-fA-F]{2}[ :]?){6,}", text):
        digits = re.sub("[ :]", "", run)
        views += [bytes.fromhex(digits[o:o + (len(digits) - o) // 2 * 2]).decode("latin-1") for o in (0, 1)]
    return views


def leaks(text: str, masks: bool = True) -> list[str]:
    """Every 6-character run of the secret part found in any view of ``text``, and (``masks``) any mask of the key
    in it: a head or tail of the secret part beside ``***``/``...``/``…``/``•``, or the prefix and 2 secret
    characters."""
    found = sorted({g for v in _views(text) for g in GRAMS if g in v})
    if not masks:
        return found
    mask = r"(?:\*|•|\.\.|…)"
    heads = [m[1] for m in re.finditer(rf"(?<![A-Za-z0-9])([A-Za-z0-9]{{2,}})(?={mask})", text) if PART.startswith(m[1])]
    tails = [m[1] for m in re.finditer(rf"{mask}([A-Za-z0-9]{{2,}})(?![A-Za-z0-9])", text) if PART.endswith(m[1])]
    return found + [f"mask head {h}" for h in heads] + [f"mask tail {t}" for t in tails] + (
        [f"prefix and {PART[:2]}"] if PREFIX + PART[:2] in text else [])


ENCODINGS = {
    "base64": lambda k: base64.b64encode(k.encode()).decode(),
    "base64, offset 1": lambda k: base64.b64encode(b"B" + k.encode()).decode(),
    "base64, offset 2": lambda k: base64.b64encode(b"Be" + k.encode()).decode(),
    "base64 url-safe": lambda k: base64.urlsafe_b64encode(b"\xfb" + k.encode()).decode(),
    "hex": lambda k: k.encode().hex(),
    "HEX": lambda k: k.encode().hex().upper(),
    "hex, colons": lambda k: k.encode().hex(":"),
    "\\x escapes": lambda k: "".join(f"\\x{b:02x}" for b in k.encode()),
    "HTML decimal": lambda k: "".join(f"&#{ord(c)};" for c in k),
    "HTML hex": lambda k: "".join(f"&#x{ord(c):x};" for c in k),
    "HTML twice": lambda k: "".join(f"&amp;#{ord(c)};" for c in k),
    "percent twice": lambda k: urllib.parse.quote(urllib.parse.quote(k, safe=""), safe="").replace("-", "%252D"),
    "percent thrice": lambda k: "".join(f"%2525{b:02x}" for b in k.encode()),
    "mixed per character": lambda k: "".join((c, f"\\u{ord(c):04x}", f"%{ord(c):02X}", f"&#{ord(c)};")[i % 4]
                                             for i, c in enumerate(k)),
    "provider mask": lambda k: k[:len(PREFIX) + 5] + "***" + k[-4:],
    "provider mask, bullets": lambda k: k[:len(PREFIX) + 4] + "••••" + k[-4:],
    "KEY[:20]...": lambda k: k[:20] + "...",
    "...KEY[-5:]": lambda k: "..." + k[-5:],
    "KEY[10:30] mid-text": lambda k: "the key part " + k[10:30] + " was rejected",
}


def test_the_secret_part_is_the_key_after_its_public_prefix():
    assert split_key(SECRET) == (PREFIX, PART)
    assert split_key("sk-proj-" + "A" * 40) == ("sk-proj-", "A" * 40)
    assert split_key("sk-ant-api03-" + "b" * 40)[0] == "sk-ant-api03-"
    assert split_key("abcdef0123456789abcdef") == ("", "abcdef0123456789abcdef")  # no prefix: secret whole


@pytest.mark.parametrize("form", list(ENCODINGS))
def test_an_encoded_or_masked_key_is_redacted(form):
    text = f"auth failed for {ENCODINGS[form](SECRET)} (check it)"
    assert leaks(text), "the planted form must be found by the checker"  # the test can fail
    out = Redactor(SECRET)(text)
    assert leaks(out) == [] and REDACTED in out and out.endswith(" (check it)")


def test_ordinary_text_is_left_alone():
    text = ("Hex 0xdeadbeef, sha c0ffee1234abcd5678, base64 aGVsbG8gd29ybGQ=, a key looks like sk-or-v1-..., "
            "x***y, 1.5 ... done; &#233;t&eacute; %20 " + uuid.uuid4().hex)
    assert Redactor(SECRET)(text) == text


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(list(ENCODINGS)), st.integers(0, len(SECRET)), st.integers(0, len(SECRET)),
       st.text(max_size=20), st.text(max_size=20))
def test_any_slice_of_the_key_in_any_encoding_leaves_no_six_secret_characters(form, a, b, before, after):
    a, b = min(a, b), max(a, b)
    text = before + " " + ENCODINGS[form](SECRET[a:b]) + " " + after
    assert leaks(Redactor(SECRET)(text)) == [] or leaks(before + " " + after)  # (the noise alone can't hold it)


def _record(placements: dict[str, str]) -> dict:
    """An ok answer with pieces of the key placed in its reasoning, content, a second choice, logprob tokens."""
    full = answer()
    msg = full["choices"][0]["message"]
    msg["reasoning"] += placements.get("reasoning", "")
    msg["content"] = placements.get("content", "") + msg["content"]
    second = json.loads(json.dumps(full["choices"][0]))
    second["index"], second["message"]["content"] = 1, placements.get("choice1", "") + " end"
    full["choices"].append(second)
    tokens = [placements["tokens"][i:i + 3] for i in range(0, len(placements.get("tokens", "")), 3)]
    full["choices"][0]["logprobs"]["content"] += [{"token": t, "logprob": -0.1, "bytes": list(t.encode()),
                                                   "top_logprobs": [{"token": t, "logprob": -0.1}]} for t in tokens]
    return full


def _places(record: dict) -> list[str]:
    """The strings of ``record`` joined per place (what a reader of the record sees once pieces are put together)."""
    c0, c1 = record["choices"]
    lp = c0["logprobs"]["content"]
    return [c0["message"]["reasoning"] + c0["message"]["content"], c0["message"]["content"] + c1["message"]["content"],
            "".join(e["token"] for e in lp), bytes(b for e in lp for b in e["bytes"]).decode("latin-1"),
            "".join(e["top_logprobs"][0]["token"] for e in lp), json.dumps(record)]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, len(SECRET)), min_size=2, max_size=2), st.sampled_from(
    ["reasoning|content", "content|choice1", "tokens", "reasoning|content|choice1"]))
def test_a_key_split_across_fields_choices_and_tokens_is_found_in_the_assembled_record(cuts, where):
    places = where.split("|")
    if places == ["tokens"]:
        placements = {"tokens": SECRET}
    else:
        points = [0, *sorted(cuts)[:len(places) - 1], len(SECRET)]
        placements = {p: SECRET[points[i]:points[i + 1]] for i, p in enumerate(places)}
    planted = _record(placements)
    assert any(leaks(p) for p in _places(planted))  # the test can fail
    cleaned = Redactor(SECRET).record(planted)
    *joined, whole = _places(cleaned)
    assert [leaks(p, masks=False) for p in joined] == [[]] * 5 and leaks(whole) == []


def test_a_record_is_walked_without_recursion_and_keys_are_redacted_too():
    deep: list = [SECRET]
    for _ in range(5000):
        deep = [deep]
    out = Redactor(SECRET).record({SECRET: deep})
    assert list(out) == [REDACTED]
    inner = out[REDACTED]
    for _ in range(5000):
        inner = inner[0]
    assert inner == [REDACTED]


# ---- against a real upstream: records, summary, stdout, stderr


class Echoing(Upstream):
    """Echoes the key in the form the scenario names: in a 400 body (``echo:FORM``), in a 401 body (``mask-401``),
    or inside an ok answer split across places (``split:WHERE``)."""

    def reply(self, scenario: str, attempt: int, stream: bool):
        from starlette.responses import JSONResponse

        if scenario.startswith("echo:"):
            return JSONResponse({"error": {"code": 400, "message": f"bad key {ENCODINGS[scenario[5:]](self.secret)}"}},
                                status_code=400)
        if scenario == "mask-401":
            masked = ENCODINGS["provider mask"](self.secret)
            return JSONResponse({"error": {"code": 401, "message": f"Invalid API key {masked}"}}, status_code=401)
        if scenario.startswith("split:"):
            half = len(self.secret) // 2
            placements = {"reasoning|content": {"reasoning": self.secret[:half], "content": self.secret[half:]},
                          "content|choice1": {"content": self.secret[:half], "choice1": self.secret[half:]},
                          "tokens": {"tokens": self.secret}}[scenario[6:]]
            return JSONResponse(_record(placements))
        return super().reply(scenario, attempt, stream)


@pytest.fixture(scope="module")
def echoing():
    with Echoing(SECRET) as srv:
        yield srv


def _written(folder) -> str:
    return "".join(p.read_text("utf-8", "replace") for p in sorted(folder.rglob("*")) if p.is_file()
                   and "prompts" not in p.name)


def test_every_form_and_split_is_redacted_from_records_and_summary(echoing, tmp_path, capsys):
    scenarios = [f"echo:{f}" for f in ENCODINGS] + ["split:reasoning|content", "split:content|choice1", "split:tokens"]
    prompts = tmp_path / "prompts.jsonl"
    write_jsonl(prompts, [{"id": f"p{i}", "prompt": f"scenario:{s}"} for i, s in enumerate(scenarios)])
    summary = collect(prompts, tmp_path / "out.jsonl", CollectConfig(echoing.base_url, "m", **FAST), api_key=SECRET)
    records = {r.obj["id"]: r.obj for r in read_jsonl(tmp_path / "out.jsonl")}
    assert len(records) == len(scenarios) and summary["ok"] == 3 and summary["permanent"] == len(ENCODINGS)
    for i, s in enumerate(scenarios):
        rec = records[f"p{i}"]
        assert leaks(json.dumps(rec)) == [], s
        if s.startswith("split:"):
            assert [leaks(p, masks=False) for p in _places(rec["response"])] == [[]] * 6, s
    assert leaks(_written(tmp_path) + json.dumps(summary) + "".join(capsys.readouterr())) == []


def test_a_masked_key_in_a_401_body_reaches_no_output(echoing, tmp_path):
    write_jsonl(tmp_path / "prompts.jsonl", [{"id": "a", "prompt": "scenario:mask-401"}])
    env = {**os.environ, "OPENROUTER_API_KEY": SECRET}
    proc = subprocess.run([sys.executable, "-m", "kimi_eagle", "collect", str(tmp_path / "prompts.jsonl"), "-o",
                           str(tmp_path / "out.jsonl"), "--base-url", echoing.base_url, "--model", "m",
                           "--no-progress"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 3, proc.stderr  # a 401 stops the run
    summary = (tmp_path / "out.jsonl.summary.json").read_text()
    assert "HTTP 401" in summary and REDACTED in summary
    for where, text in (("stdout", proc.stdout), ("stderr", proc.stderr), ("summary", summary),
                        ("files", _written(tmp_path))):
        assert leaks(text) == [], where
