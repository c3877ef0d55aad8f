"""Find the third-party assets (tokenizers, models, datasets) without copying or downloading them.

Search order: an explicit path, then ``$KIMI_EAGLE_ASSETS``, then ``../shared/assets`` beside the checkout.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

ENV_VAR = "KIMI_EAGLE_ASSETS"
KIMI_TIKTOKEN_SHA256 = "b6c497a7469b33ced9c38afb1ad6e47f03f5e5dc05f15930799210ec050c5103"
REPO_ROOT = Path(__file__).resolve().parent.parent


class AssetError(FileNotFoundError):
    """An asset could not be found or failed verification."""


def candidate_roots(explicit: str | os.PathLike | None = None) -> list[Path]:
    """The asset roots to search, in order."""
    roots: list[Path] = []
    if explicit is not None:
        roots.append(Path(explicit))
    if os.environ.get(ENV_VAR):
        roots.append(Path(os.environ[ENV_VAR]))
    roots.append(REPO_ROOT.parent / "shared" / "assets")
    return roots


def assets_root(explicit: str | os.PathLike | None = None) -> Path:
    """The first existing asset root; raises AssetError naming every place searched."""
    roots = candidate_roots(explicit)
    for root in roots:
        if root.is_dir():
            return root
    searched = "\n  ".join(str(r) for r in roots)
    raise AssetError(
        f"kimi-eagle assets not found. Searched:\n  {searched}\n"
        f"Pass a path, set ${ENV_VAR}, or place the assets at ../shared/assets beside the checkout."
    )


def asset_path(relative: str, explicit: str | os.PathLike | None = None) -> Path:
    """Resolve ``relative`` (e.g. ``"kimi/tiktoken.model"``) under the first root that has it."""
    roots = candidate_roots(explicit)
    for root in roots:
        path = root / relative
        if path.exists():
            return path
    assets_root(explicit)  # no asset root at all: say so, and where to put one
    searched = "\n  ".join(str(r / relative) for r in roots)
    raise AssetError(f"asset {relative!r} not found. Searched:\n  {searched}\nSet ${ENV_VAR} to the assets directory.")


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def kimi_dir(explicit: str | os.PathLike | None = None) -> Path:
    return asset_path("kimi", explicit)


def stories_dir(explicit: str | os.PathLike | None = None) -> Path:
    return asset_path("models/stories260K/hf", explicit)


def tokenizer_path(name: str | os.PathLike | None = None) -> Path:
    """A tokenizer directory: the Kimi tokenizer for ``None``/empty, ``name`` itself if it is a folder, else
    ``name`` as a path inside the assets (such as ``"models/stories260K/hf"``)."""
    if not name:
        return kimi_dir()
    return Path(name) if Path(name).is_dir() else asset_path(str(name))


def data_path(name: str, explicit: str | os.PathLike | None = None) -> Path:
    """A dataset by short name (``glaive``, ``reason-tool-use``, ``sharegpt``, ``alpaca``, ``fastchat``) or relative path."""
    return asset_path(DATASETS.get(name, f"data/{name}"), explicit)


DATASETS = {
    "glaive": "data/llamafactory/glaive_toolcall_en_demo.json",
    "reason-tool-use": "data/llamafactory/reason_tool_use_demo_50.jsonl",
    "sharegpt": "data/sharegpt_v3_first2000.jsonl",
    "alpaca": "data/llamafactory/alpaca_en_demo.json",
    "fastchat": "data/fastchat/dummy_conversation.json",
}
