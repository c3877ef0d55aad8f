"""Hostile input to the engine side: planted templates and checkpoints run nothing, malformed requests get a JSON 4xx,
the admin routes need the key, an upstream that echoes the key never makes the collector show it, and collector
settings that would hang or crash are refused before any work.

Each parametrised case is one kind of bad input with its exact outcome; ``HOSTILE_KINDS`` counts them.
"""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
import torch

from kimi_eagle.apps import cli
from kimi_eagle.apps.api.collect import CollectConfig, collect
from kimi_eagle.apps.api.server import LocalServer
from kimi_eagle.assets import stories_dir
from kimi_eagle.io import read_jsonl, write_jsonl

pytestmark = pytest.mark.timeout(240)
KEY_ENV = "KIMI_EAGLE_HOSTILE_TEST_KEY"
SERVER_KEY = f"sk-local-{uuid.uuid4().hex}"
MARK = "__MARK__"  # replaced by a path in tmp: the file an attack would create

# ---- hostile chat templates (the model folder is the attacker): each would create MARK if it ran

TEMPLATE_ATTACKS = {
    "lipsum-globals-os-system": "{{ lipsum.__globals__['os'].system('touch __MARK__') }}",
    "cycler-init-globals-popen": "{{ cycler.__init__.__globals__.os.popen('touch __MARK__').read() }}",
    "joiner-init-globals": "{{ joiner.__init__.__globals__['os'].system('touch __MARK__') }}",
    "namespace-init-globals": "{{ namespace.__init__.__globals__['os'].system('touch __MARK__') }}",
    "str-class-mro-subclasses": "{{ ''.__class__.__mro__[1].__subclasses__() }}{{ 'touch __MARK__' }}",
    "self-template-globals": "{{ self.__init__.__globals__['os'].system('touch __MARK__') }}",
    "format-string-escape": "{{ '{0.__class__.__init__.__globals__}'.format(lipsum) }}",
    "mutate-messages": "{% set _ = messages.append({'role': 'x', 'content': 'touch __MARK__'}) %}",
    "huge-range": "{% for i in range(10**9) %}{% endfor %}",
}


def hostile_template(mark: Path) -> str:
    branches = "".join(f"{{% {'if' if i == 0 else 'elif'} messages[0]['content'] == '{name}' %}}{attack}"
                       for i, (name, attack) in enumerate(TEMPLATE_ATTACKS.items()))
    return (branches + "{% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}").replace(MARK, str(mark))


@pytest.fixture(scope="module")
def hostile_model(tmp_path_factory) -> tuple[Path, Path]:
    """stories260K's weights with a chat template that tries to run ``touch MARK`` (chosen by the first message)."""
    folder = tmp_path_factory.mktemp("hostile-model")
    mark = folder / "pwned"
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json"):
        (folder / name).symlink_to(stories_dir() / name)
    config = json.loads((stories_dir() / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": hostile_template(mark)}))
    return folder, mark


@pytest.fixture(scope="module")
def template_server(hostile_model, tmp_path_factory):
    folder, _ = hostile_model
    records = tmp_path_factory.mktemp("hostile-serve") / "engine.jsonl"
    with LocalServer(folder, records, "--chat-format", "hf-template", model_name="stories260K") as srv:
        srv.records_path = records
        yield srv


def chat(srv, content: str, record_id: str) -> httpx.Response:
    return httpx.post(srv.base_url + "/chat/completions", headers={"X-Record-Id": record_id}, timeout=60,
                      json={"model": "stories260K", "messages": [{"role": "user", "content": content}], "max_tokens": 4})


def logged_ids(path: Path) -> set[str]:
    return {line.obj["id"] for line in read_jsonl(path)} if path.exists() else set()


def test_the_sandboxed_template_still_renders_an_ordinary_chat(template_server, stories):
    r = chat(template_server, "Once upon a time", "benign")
    assert r.status_code == 200 and r.headers["x-chat-format"] == "hf-template"
    record = next(line.obj for line in read_jsonl(template_server.records_path) if line.obj["id"] == "benign")
    assert record["prompt_ids"] == stories.encode("Once upon a time")


@pytest.mark.parametrize("attack", list(TEMPLATE_ATTACKS))
def test_a_hostile_chat_template_runs_nothing_and_answers_a_json_500(template_server, hostile_model, attack):
    _, mark = hostile_model
    r = chat(template_server, attack, f"attack-{attack}")
    assert r.status_code == 500
    error = r.json()["error"]
    assert error["code"] == 500 and error["message"].startswith("chat template of stories260K:")
    assert not mark.exists(), "the template ran a shell command"
    assert f"attack-{attack}" not in logged_ids(template_server.records_path)
    assert httpx.get(template_server.base_url.removesuffix("/v1") + "/health", timeout=10).status_code == 200


# ---- hostile checkpoints (a planted OUT/checkpoint/last.pt): `kimi-eagle train --resume` refuses them


class RunsCode:
    """Unpickling this calls ``os.system('touch MARK')``."""

    def __init__(self, mark: Path) -> None:
        self.mark = mark

    def __reduce__(self):
        return os.system, (f"touch {self.mark}",)


def plant_torch_zip(path: Path, mark: Path) -> None:
    torch.save({"model": {}, "step": 1, "payload": RunsCode(mark)}, path)


def plant_legacy_pickle(path: Path, mark: Path) -> None:
    with open(path, "wb") as f:
        pickle.dump({"step": 1, "payload": RunsCode(mark)}, f, protocol=2)


@pytest.fixture(scope="module")
def hidden_dir(stories, tmp_path_factory):
    from kimi_eagle.eagle3.extract import extract
    from kimi_eagle.eagle3.hidden import Row, load_target

    target = load_target(stories_dir())
    rows = [Row(f"r{i}", [1] + stories.encode(text), [0] + [1] * len(stories.encode(text)))
            for i, text in enumerate(["Once upon a time there was a cat", "Lily saw a big red bird in the tree"])]
    out = tmp_path_factory.mktemp("hs")
    extract(stories_dir(), rows, out, dtype="bf16", shard_rows=4, model=target)
    return out


@pytest.mark.parametrize("plant", [plant_torch_zip, plant_legacy_pickle], ids=["torch-save-zip", "legacy-pickle"])
def test_train_resume_refuses_a_planted_checkpoint_that_would_run_code(hidden_dir, tmp_path, capsys, plant):
    out, mark = tmp_path / "train", tmp_path / "pwned"
    (out / "checkpoint").mkdir(parents=True)
    plant(out / "checkpoint" / "last.pt", mark)
    code = cli.main(["train", "--data", str(hidden_dir), "--target", str(stories_dir()), "-o", str(out),
                     "--steps", "2", "--batch-size", "1", "--draft-vocab-size", "64", "--resume", "--no-progress"])
    assert code == 2 and not mark.exists()
    assert "refused to load the checkpoint" in capsys.readouterr().err


def test_a_checkpoint_the_kit_wrote_still_resumes_with_weights_only(hidden_dir, tmp_path):
    args = ["train", "--data", str(hidden_dir), "--target", str(stories_dir()), "-o", str(tmp_path / "t"),
            "--steps", "3", "--batch-size", "1", "--draft-vocab-size", "64", "--no-progress", "--save-every", "1"]
    assert cli.main(args + ["--stop-after", "1"]) == 0
    assert cli.main(args + ["--resume"]) == 0
    assert torch.load(tmp_path / "t" / "checkpoint" / "last.pt", weights_only=True)["step"] == 3


# ---- malformed requests to `serve`: a JSON 4xx, nothing logged, the server stays up

MSG = [{"role": "user", "content": "Once upon a time"}]
OK = {"model": "stories260K", "messages": MSG, "max_tokens": 2}

MALFORMED = {  # kind -> (route, raw body bytes or a JSON value, expected status)
    "body-5000-deep-array": ("chat", b"[" * 5000 + b"]" * 5000, 400),
    "body-5000-deep-in-ignored-field": ("chat", json.dumps(OK)[:-1].encode() + b', "x": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400),
    "body-5000-deep-object": ("chat", b'{"a":' * 5000 + b"1" + b"}" * 5000, 400),
    "body-not-json": ("chat", b"{model: stories260K", 400),
    "body-invalid-utf8": ("chat", b'{"model": "stories260K", "messages": [{"role": "user", "content": "\xff\xfe"}]}', 400),
    "body-empty": ("chat", b"", 400),
    "body-a-list": ("chat", [OK], 400),
    "body-a-string": ("chat", "hello", 400),
    "lone-surrogate-chat-content": ("chat", b'{"model": "stories260K", "messages": [{"role": "user", "content": "a\\ud800b"}]}', 400),
    "lone-surrogate-prompt": ("text", b'{"model": "stories260K", "prompt": "\\udfff once"}', 400),
    "lone-surrogate-in-a-content-part": ("chat", b'{"model": "stories260K", "messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud83d"}]}]}', 400),
    "provider-only-a-number": ("chat", {**OK, "provider": {"only": 5}}, 400),
    "provider-only-list-of-numbers": ("chat", {**OK, "provider": {"only": [1, 2]}}, 400),
    "provider-order-a-string": ("chat", {**OK, "provider": {"order": "kimi-eagle-local"}}, 400),
    "provider-ignore-an-object": ("chat", {**OK, "provider": {"ignore": {"a": 1}}}, 400),
    "provider-a-string": ("chat", {**OK, "provider": "kimi-eagle-local"}, 400),
    "provider-allow-fallbacks-a-string": ("chat", {**OK, "provider": {"allow_fallbacks": "no"}}, 400),
    "messages-a-string": ("chat", {**OK, "messages": "hello"}, 400),
    "messages-list-of-numbers": ("chat", {**OK, "messages": [5]}, 400),
    "messages-missing": ("chat", {"model": "stories260K"}, 400),
    "content-a-number": ("chat", {**OK, "messages": [{"role": "user", "content": 5}]}, 400),
    "content-part-text-a-number": ("chat", {**OK, "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, 400),
    "model-an-object": ("chat", {**OK, "model": {"id": "stories260K"}}, 400),
    "model-missing": ("chat", {"messages": MSG}, 400),
    "temperature-a-string": ("chat", {**OK, "temperature": "hot"}, 400),
    "temperature-a-boolean": ("chat", {**OK, "temperature": True}, 400),
    "temperature-nan": ("chat", json.dumps({**OK, "temperature": float("nan")}).encode(), 400),
    "top-p-zero": ("chat", {**OK, "top_p": 0}, 400),
    "max-tokens-negative": ("chat", {**OK, "max_tokens": -1}, 400),
    "max-tokens-fractional": ("chat", {**OK, "max_tokens": 1.5}, 400),
    "seed-beyond-int64": ("chat", {**OK, "seed": 2**70}, 400),
    "seed-negative": ("chat", {**OK, "seed": -1}, 400),
    "seed-a-string": ("chat", {**OK, "seed": "1"}, 400),
    "n-two": ("chat", {**OK, "n": 2}, 400),
    "prompt-ids-negative": ("text", {"model": "stories260K", "prompt": [1, -5]}, 400),
    "prompt-ids-beyond-vocab": ("text", {"model": "stories260K", "prompt": [10**30]}, 400),
    "prompt-null": ("text", {"model": "stories260K", "prompt": None}, 400),
    "prompt-an-object": ("text", {"model": "stories260K", "prompt": {"text": "x"}}, 400),
}


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory):
    records = tmp_path_factory.mktemp("keyed-serve") / "engine.jsonl"
    env = {KEY_ENV: SERVER_KEY}
    with LocalServer(stories_dir(), records, "--admin", "--api-key-env", KEY_ENV, env=env) as srv:
        srv.records_path = records
        srv.root = srv.base_url.removesuffix("/v1")
        yield srv


def auth(key: str = SERVER_KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize("kind", list(MALFORMED))
def test_a_malformed_request_gets_a_json_4xx_and_logs_nothing(keyed_server, kind):
    route, body, status = MALFORMED[kind]
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    url = keyed_server.base_url + ("/chat/completions" if route == "chat" else "/completions")
    r = httpx.post(url, content=content, timeout=60,
                   headers={**auth(), "X-Record-Id": f"bad-{kind}", "Content-Type": "application/json"})
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == status and "Traceback" not in r.text
    assert f"bad-{kind}" not in logged_ids(keyed_server.records_path)


def test_the_keyed_server_still_serves_a_good_request(keyed_server):
    r = httpx.post(keyed_server.base_url + "/chat/completions", json=OK, headers={**auth(), "X-Record-Id": "good"},
                   timeout=60)
    assert r.status_code == 200 and "good" in logged_ids(keyed_server.records_path)


ADMIN_CALLS = {
    "stats-without-key": ("GET", "/admin/stats", None, None),
    "faults-read-without-key": ("GET", "/admin/faults", None, None),
    "faults-write-without-key": ("POST", "/admin/faults", None, {"rate_500": 1.0}),
    "faults-write-with-a-wrong-key": ("POST", "/admin/faults", "sk-wrong", {"rate_500": 1.0}),
    "chat-with-a-wrong-key": ("POST", "/v1/chat/completions", "sk-wrong", OK),
}


@pytest.mark.parametrize("call", list(ADMIN_CALLS))
def test_admin_and_generation_routes_need_the_key(keyed_server, call):
    method, path, key, payload = ADMIN_CALLS[call]
    headers = auth(key) if key else {}
    r = httpx.request(method, keyed_server.root + path, json=payload, headers=headers, timeout=30)
    assert r.status_code == 401 and r.json()["error"]["code"] == 401
    faults = httpx.get(keyed_server.root + "/admin/faults", headers=auth(), timeout=30)
    assert faults.status_code == 200 and faults.json()["rate_500"] == 0.0  # nothing was switched on


def test_admin_routes_answer_the_right_key(keyed_server):
    assert httpx.get(keyed_server.root + "/admin/stats", headers=auth(), timeout=30).json()["requests"] >= 1
    r = httpx.post(keyed_server.root + "/admin/faults", json=[1, 2], headers=auth(), timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == 400


# ---- an upstream that echoes the Authorization header: the key never shows


class EchoUpstream:
    """A real HTTP server (starlette + uvicorn in a thread) that answers every chat request with ``status`` and an
    error body quoting the request's Authorization header, as some broken gateways do."""

    def __init__(self, status: int) -> None:
        import socket

        import uvicorn
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        async def echo(request):
            message = f"invalid credentials: {request.headers.get('authorization')}"
            return JSONResponse({"error": {"code": status, "message": message}}, status_code=status)

        app = Starlette(routes=[Route("/v1/chat/completions", echo, methods=["POST"])])
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> "EchoUpstream":
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def every_file_bytes(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())


ECHO_CASES = {  # upstream status -> collect's exit code
    "echo-401-fatal": (401, 3),
    "echo-400-permanent": (400, 1),  # a stored error: the exit code says so
    "echo-503-exhausted": (503, 1),
}


@pytest.mark.parametrize("case", list(ECHO_CASES))
def test_collect_never_prints_an_echoed_key(tmp_path, case):
    status, exit_code = ECHO_CASES[case]
    secret = f"sk-or-v1-echo-{uuid.uuid4().hex}"
    write_jsonl(tmp_path / "prompts.jsonl", [{"id": f"p{i}", "prompt": "Once"} for i in range(3)])
    with EchoUpstream(status) as upstream:
        r = subprocess.run([sys.executable, "-m", "kimi_eagle", "collect", str(tmp_path / "prompts.jsonl"),
                            "-o", str(tmp_path / "out.jsonl"), "--base-url", upstream.base_url, "--model", "m",
                            "--max-attempts", "1", "--no-progress"],
                           env={**os.environ, "OPENROUTER_API_KEY": secret}, capture_output=True, timeout=120)
    assert r.returncode == exit_code, r.stderr
    assert b"invalid credentials" in r.stdout + r.stderr + every_file_bytes(tmp_path)  # the echo did happen
    assert secret.encode() not in r.stdout + r.stderr + every_file_bytes(tmp_path)


def test_collect_returns_no_echoed_key_in_its_summary(tmp_path, capsys):
    secret = f"sk-or-v1-echo-{uuid.uuid4().hex}"
    write_jsonl(tmp_path / "prompts.jsonl", [{"id": "p0", "prompt": "Once"}])
    with EchoUpstream(401) as upstream:
        summary = collect(tmp_path / "prompts.jsonl", tmp_path / "out.jsonl",
                          CollectConfig(upstream.base_url, "m", max_attempts=1, progress=True), api_key=secret)
    assert summary["aborted"].startswith("HTTP 401") and "[REDACTED]" in summary["aborted"]
    captured = capsys.readouterr()
    assert secret not in json.dumps(summary) + captured.out + captured.err


def test_the_collect_notebook_never_shows_an_echoed_key(tmp_path):
    from kimi_eagle.apps.batch.notebooks import NOTEBOOK_DIR, execute

    secret = f"sk-or-v1-echo-{uuid.uuid4().hex}"
    os.environ["OPENROUTER_API_KEY"] = secret  # the kernel inherits it, as it would a real key
    try:
        with EchoUpstream(401) as upstream:  # a 401's body is the run's stop reason, printed by the notebook
            executed = execute(NOTEBOOK_DIR / "00_collect.ipynb", tmp_path,
                               {"base_url": upstream.base_url, "model": "m", "limit": 2, "concurrency": 1})
    finally:
        del os.environ["OPENROUTER_API_KEY"]
    text = executed.read_text()
    assert "[REDACTED]" in text and secret not in text
    assert secret.encode() not in every_file_bytes(tmp_path)


# ---- collector settings that would hang or crash: refused before any work

BAD_COLLECT_ARGS = {
    "concurrency-zero": ["--concurrency", "0"],
    "concurrency-negative": ["--concurrency", "-3"],
    "max-attempts-zero": ["--max-attempts", "0"],
    "timeout-zero": ["--timeout", "0"],
    "timeout-nan": ["--timeout", "nan"],
    "backoff-negative": ["--backoff-base", "-1"],
    "limit-zero": ["--limit", "0"],
    "base-url-not-http": ["--base-url", "ftp://example.invalid/v1"],
}


@pytest.mark.parametrize("kind", list(BAD_COLLECT_ARGS))
def test_collect_refuses_bad_settings_before_any_work(tmp_path, capsys, kind):
    write_jsonl(tmp_path / "prompts.jsonl", [{"id": "p0", "prompt": "Once"}])
    args = ["collect", str(tmp_path / "prompts.jsonl"), "-o", str(tmp_path / "out.jsonl"),
            "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--no-progress", *BAD_COLLECT_ARGS[kind]]
    started = time.monotonic()
    try:
        code = cli.main(args)
    except SystemExit as stop:  # a bad numeric flag is argparse's usage error (exit 2)
        code = stop.code
    assert code == 2
    assert time.monotonic() - started < 120  # refused, not retried against the (closed) port for minutes
    assert "error:" in capsys.readouterr().err and not (tmp_path / "out.jsonl").exists()


def test_collect_refuses_a_directory_as_its_output(tmp_path, capsys):
    write_jsonl(tmp_path / "prompts.jsonl", [{"id": "p0", "prompt": "Once"}])
    (tmp_path / "out").mkdir()
    assert cli.main(["collect", str(tmp_path / "prompts.jsonl"), "-o", str(tmp_path / "out"),
                     "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--no-progress"]) == 2
    assert "must be a file" in capsys.readouterr().err and not any((tmp_path / "out").iterdir())


HOSTILE_KINDS = (len(TEMPLATE_ATTACKS) + 2 + len(MALFORMED) + len(ADMIN_CALLS) + len(ECHO_CASES) + 2
                 + len(BAD_COLLECT_ARGS) + 1)  # + summary, notebook; + directory output
