"""Shared fixtures: the real tokenizers and the recorded real exchanges from the assets (loaded once per session)."""
from __future__ import annotations

import pytest

from kimi_eagle.assets import asset_path, kimi_dir, stories_dir
from kimi_eagle.tokenize.tokenizer import HFTokenizer, KimiTokenizer


@pytest.fixture(scope="session")
def kimi() -> KimiTokenizer:
    return KimiTokenizer.from_dir(kimi_dir())


@pytest.fixture(scope="session")
def stories() -> HFTokenizer:
    return HFTokenizer.from_dir(stories_dir())


@pytest.fixture(scope="session")
def qwen3() -> HFTokenizer:
    return HFTokenizer.from_dir(asset_path("tokenizers/qwen3"))


@pytest.fixture(scope="session")
def exchanges() -> list:
    """The recorded real exchanges (assets/data/real_api, read in place); tests that need them skip without them."""
    from kimi_eagle.assets import AssetError
    from kimi_eagle.reconstruct.recorded import load_exchanges, recorded_path

    try:
        path = recorded_path()
    except AssetError as e:
        pytest.skip(f"the recorded exchanges are not in the assets (assets/data/real_api): {e}")
    return load_exchanges(path)
