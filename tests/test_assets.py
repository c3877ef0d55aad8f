"""The asset resolver: explicit path, then $KIMI_EAGLE_ASSETS, then ../shared/assets; clear errors."""
import shutil

import pytest

from kimi_eagle import assets
from kimi_eagle.assets import AssetError, asset_path, assets_root, candidate_roots, sha256_file
from kimi_eagle.tokenize.tokenizer import KimiTokenizer, TokenizerError


def test_search_order_is_explicit_then_env_then_shared(tmp_path, monkeypatch):
    monkeypatch.setenv(assets.ENV_VAR, str(tmp_path / "env"))
    roots = candidate_roots(tmp_path / "explicit")
    assert roots == [tmp_path / "explicit", tmp_path / "env", assets.REPO_ROOT.parent / "shared" / "assets"]


def test_env_var_wins_over_shared(tmp_path, monkeypatch):
    (tmp_path / "kimi").mkdir()
    monkeypatch.setenv(assets.ENV_VAR, str(tmp_path))
    assert asset_path("kimi") == tmp_path / "kimi"


def test_missing_asset_error_names_every_place_searched(tmp_path, monkeypatch):
    monkeypatch.setenv(assets.ENV_VAR, str(tmp_path / "env"))
    with pytest.raises(AssetError) as e:
        asset_path("kimi/nope.model", tmp_path / "explicit")
    msg = str(e.value)
    assert str(tmp_path / "explicit" / "kimi/nope.model") in msg
    assert str(tmp_path / "env" / "kimi/nope.model") in msg
    assert "shared" in msg


def test_no_root_at_all_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(assets, "REPO_ROOT", tmp_path / "repo")
    monkeypatch.delenv(assets.ENV_VAR, raising=False)
    with pytest.raises(AssetError, match="assets not found"):
        assets_root(tmp_path / "missing")


def test_shared_tiktoken_model_has_the_pinned_hash():
    assert sha256_file(asset_path("kimi/tiktoken.model")) == assets.KIMI_TIKTOKEN_SHA256


def test_a_tampered_tiktoken_model_is_rejected(tmp_path):
    src = asset_path("kimi")
    shutil.copy(src / "tokenizer_config.json", tmp_path)
    data = (src / "tiktoken.model").read_bytes()
    (tmp_path / "tiktoken.model").write_bytes(data[:-10])
    with pytest.raises(TokenizerError, match="sha256"):
        KimiTokenizer.from_dir(tmp_path)


def test_malformed_tokenizer_config_is_a_clear_error(tmp_path):
    src = asset_path("kimi")
    (tmp_path / "tiktoken.model").symlink_to(src / "tiktoken.model")
    (tmp_path / "tokenizer_config.json").write_text('{"added_tokens_decoder": {"x": {}}}')
    with pytest.raises(TokenizerError, match="malformed added_tokens_decoder"):
        KimiTokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="not valid JSON"):
        KimiTokenizer.from_dir(tmp_path)


def test_missing_tokenizer_dir_is_a_clear_error(tmp_path):
    with pytest.raises(AssetError, match="not found"):
        KimiTokenizer.from_dir(tmp_path / "nowhere")


def test_a_corrupt_ranks_line_names_the_file_and_line(tmp_path):
    src = asset_path("kimi")
    shutil.copy(src / "tokenizer_config.json", tmp_path)
    (tmp_path / "tiktoken.model").write_bytes(b"IQ== 0\nnot-base64!! 1\n")
    with pytest.raises(TokenizerError, match=r"tiktoken.model:2: not a 'base64 rank' line"):
        KimiTokenizer.from_dir(tmp_path, verify_sha256=False)
