"""The API key inside a data field (#47): with OPENROUTER_API_KEY set, a key a provider or model name holds is
replaced by a marker wherever the kit writes it — convert's records, reconstruct's parquet and serving.json,
billing's page and summary.json/md/csv, the terminal — and the record is flagged `api_key_redacted`."""
import json
import uuid

import pandas as pd

from kimi_eagle.apps import cli
from kimi_eagle.assets import REPO_ROOT
from kimi_eagle.redact import KEY_FLAG, REDACTED

SECRET = f"sk-or-v1-{uuid.uuid4().hex}{uuid.uuid4().hex[:8]}"
EXAMPLE = REPO_ROOT / "docs" / "examples" / "openai_log.jsonl"


def leaky_log(tmp_path):
    """The example log with the key in one answer's provider name and another's model name."""
    items = [json.loads(line) for line in EXAMPLE.read_text(encoding="utf-8").splitlines()]
    for item, field, value in ((items[0], "provider", f"Moonshot {SECRET}"), (items[1], "model", SECRET[3:40])):
        (item.get("response") or item.get("completion"))[field] = value
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps(i) + "\n" for i in items))
    return path


def every_file(tmp_path):
    return b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and p.name != "log.jsonl")


def test_a_key_in_a_provider_or_model_name_is_written_nowhere(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OPENROUTER_API_KEY", SECRET)
    api, recon = tmp_path / "api.jsonl", tmp_path / "recon.parquet"
    assert cli.main(["convert", "--from", "openai", str(leaky_log(tmp_path)), "-o", str(api)]) == 0
    converted = [json.loads(line) for line in api.read_text().splitlines()]
    assert converted[0]["response"]["provider"] == REDACTED and converted[0]["key_redacted"] == ["response.provider"]
    assert converted[1]["response"]["model"] == REDACTED
    assert cli.main(["reconstruct", str(api), "-o", str(recon), "--no-progress"]) == 0
    assert cli.main(["reconstruct", str(leaky_log(tmp_path)), "-o", str(tmp_path / "direct.parquet"),
                     "--no-progress"]) == 0
    assert cli.main(["billing", str(recon), "-o", str(tmp_path / "billing")]) == 0
    rows = pd.read_parquet(recon)
    assert rows.provider.iloc[0] == REDACTED and KEY_FLAG in list(rows["flags"].iloc[0])
    assert KEY_FLAG in list(rows["flags"].iloc[1])
    printed = capsys.readouterr()
    for blob in (every_file(tmp_path), (printed.out + printed.err).encode()):
        assert SECRET[9:25].encode() not in blob and SECRET[-16:].encode() not in blob
    assert (tmp_path / "billing" / "summary.csv").exists() and f"provider {REDACTED} (dataset openai)" in printed.out
    summary = json.loads((tmp_path / "billing" / "summary.json").read_text())
    assert REDACTED in {g["provider"] for g in summary["by_provider"]}  # the serving choice's lines: the same groups


def test_without_a_key_set_provider_names_are_kept(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    api = tmp_path / "api.jsonl"
    assert cli.main(["convert", "--from", "openai", str(leaky_log(tmp_path)), "-o", str(api)]) == 0
    first = json.loads(api.read_text().splitlines()[0])
    assert first["response"]["provider"] == f"Moonshot {SECRET}" and "key_redacted" not in first
