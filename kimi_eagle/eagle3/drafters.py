"""Every kit drafter by its checkpoint: :func:`load_any_drafter` reads a native DFlash or EAGLE-3 drafter by the
``format`` its class names (:attr:`~kimi_eagle.eagle3.drafter_base.Drafter.FORMAT`), and any EAGLE-3 checkpoint
:func:`~kimi_eagle.eagle3.model.load_drafter` reads (SGLang/vLLM exports, speculators)."""
from __future__ import annotations

from pathlib import Path

from kimi_eagle.eagle3.dflash import DFlashDrafter
from kimi_eagle.eagle3.drafter_base import Drafter, read_config_json
from kimi_eagle.eagle3.model import Eagle3Drafter, load_drafter

DRAFTER_CLASSES: tuple[type[Drafter], ...] = (Eagle3Drafter, DFlashDrafter)
NATIVE_FORMATS: dict[str, type[Drafter]] = {cls.FORMAT: cls for cls in DRAFTER_CLASSES}


def load_any_drafter(path: str | Path, target_dir: str | Path | None = None) -> Drafter:
    """A native kit drafter of any kind (by its ``config.json``'s ``format``), else anything
    :func:`~kimi_eagle.eagle3.model.load_drafter` reads; ``target_dir`` supplies embeddings an export lacks."""
    raw = read_config_json(Path(path) / "config.json", "drafter config")
    cls = NATIVE_FORMATS.get(raw.get("format"))
    if cls is not None:
        return cls.load_native(path, raw)
    return load_drafter(path, target_dir)
