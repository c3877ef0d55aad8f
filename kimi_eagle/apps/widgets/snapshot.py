"""``SnapshotBox``: a widget box that also carries a static HTML snapshot of its view."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import ipywidgets as W


class SnapshotBox(W.VBox):
    """A VBox whose display also carries ``text/html``: a static snapshot of the view when it was displayed.

    A live front end renders the widget; a static export (nbconvert, the batch's HTML) has no widget state
    and falls back to the snapshot instead of an empty output."""

    def __init__(self, children: Sequence[W.Widget], snapshot: Callable[[], str], **kw: Any) -> None:
        super().__init__(list(children), **kw)
        self._snapshot = snapshot

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        data = super()._repr_mimebundle_(**kwargs) or {}
        data["text/html"] = ('<div class="ke-snapshot"><p style="color:#777;font-size:12px">static snapshot of the '
                             "widget's first view (interactive when the notebook runs)</p>" + self._snapshot() + "</div>")
        return data
