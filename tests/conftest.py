"""Shared fixtures: the real tokenizers from the assets (loaded once per session)."""
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
