"""`kimi-eagle probe`: special tokens, the marker trap, and the stop tokens engines really emit."""
import json
import subprocess
import sys

from kimi_eagle.assets import kimi_dir
from kimi_eagle.tokenize.probe import probe


def test_probe_reports_specials_roundtrip_and_plain_text_ids(kimi):
    report = probe(kimi, check_ids=[163533, 163586])
    by_text = {s.text: s for s in report.special_tokens}
    assert report.n_vocab == 163_840 and report.n_ranks == 163_584
    assert by_text["<|im_end|>"].id == 163586 and by_text["<|im_end|>"].roundtrip
    assert by_text["<|im_end|>"].plain_text_ids == kimi.encode("<|im_end|>")
    assert all(s.roundtrip for s in report.special_tokens)
    checked = {t.id: t for t in report.checked_ids}
    assert checked[163533].text == "chas" and not checked[163533].is_special
    assert checked[163586].is_special
    assert any("<|" in t.text for t in report.marker_like_tokens)


def test_probe_cli_json_with_engine_outputs(tmp_path):
    engine = tmp_path / "engine.jsonl"
    engine.write_text(
        "\n".join(
            [
                json.dumps({"id": "a", "output_ids": [1, 2, 163586]}),
                json.dumps({"id": "b", "output_ids": [5, 163607, 163586]}),
                json.dumps({"id": "c", "choices": [{"token_ids": [7, 163585]}], "prompt_token_ids": [1]}),
                "not json",
            ]
        )
    )
    out = subprocess.run(
        [sys.executable, "-m", "kimi_eagle", "probe", "--tokenizer", str(kimi_dir()), "--engine-outputs", str(engine), "--json"],
        capture_output=True, text=True, check=True,
    )
    report = json.loads(out.stdout)
    assert {"n_vocab", "n_ranks", "special_tokens"} <= report.keys()
    assert set(report["special_tokens"][0]) == {"id", "text", "hf_special", "roundtrip", "plain_text_ids"}
    eng = report["engine"]
    assert eng["n_records"] == 4 and eng["n_errors"] == 1
    assert eng["last_tokens"][0] == {"id": 163586, "text": "<|im_end|>", "count": 2}
    assert {r["id"] for r in eng["special_occurrences"]} == {163586, 163607, 163585}


def test_probe_cli_bad_tokenizer_dir_is_a_one_line_error(tmp_path):
    out = subprocess.run([sys.executable, "-m", "kimi_eagle", "probe", "--tokenizer", str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 2
    assert "no tiktoken.model or tokenizer.json" in out.stderr
    assert "Traceback" not in out.stderr
